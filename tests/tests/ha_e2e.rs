//! A discovery service with several replicas (`docs/ha.md` §7.2): three replicas in this
//! test process against one stateful fake API server, with real Envoy 1.40 processes
//! spread over them behind a TCP balancer standing in for the Service.
//!
//! - every Envoy rejects an update → exactly one taint and one rollback, statuses
//!   converge, traffic never fails;
//! - one Envoy accepts what the others reject → no taint;
//! - the leader dies mid-episode → a new leader finishes it within the Lease time + 5 s;
//! - a replica dies → its Envoys reconnect to the others and keep serving;
//! - every replica restarted one by one under traffic → no failed request, no duplicate
//!   revision, statuses converge;
//! - the API server refuses every request for 30 s → every replica keeps serving and
//!   stays ready; writes resume afterwards.
//!
//! The scenarios run one at a time (each is three replicas and three Envoys on the test
//! machine's cores).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::apiserver::Outage;
use marin3r_testkit::free_port;
use marin3r_testkit::wait::{POLL, poll_ok};
use marin3r_tests::Must as _;
use marin3r_tests::configs::{UPSTREAM_TLS_TYPE, answering_listener, rejected_listener, resource};
use marin3r_tests::ha::{Fleet, FleetOptions, Traffic, api_server};
use marin3r_tests::xds::{CONVERGE, Envoy, EnvoyExtras, XdsTarget, init_tracing, localhost};
use serde_json::{Value, json};

const NODE: &str = "kuard";

/// One scenario at a time (each test has its own runtime; tokio's mutex is not tied to
/// one).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A listener on `port` answering `body`.
fn good(port: u16, body: &str) -> Value {
    json!({"nodeID": NODE, "resources": [answering_listener(port, body)]})
}

/// Walkthrough 2's broken update: the listener routes to a cluster that does not exist
/// (every Envoy rejects it).
fn broken(port: u16) -> Value {
    json!({"nodeID": NODE, "resources": [rejected_listener(port)]})
}

/// `n` Envoys of [`NODE`] (pods `kuard-0`, …) dialing the fleet's Service, each in its
/// own working directory `dirs[i]` when given.
fn envoys(fleet: &Fleet, n: usize, dirs: &[&std::path::Path]) -> Vec<Envoy> {
    let target = XdsTarget {
        port: fleet.service().port(),
        certs_dir: fleet.certs_dir(),
    };
    (0..n)
        .map(|i| {
            Envoy::start_at(
                &target,
                NODE,
                &format!("{NODE}-{i}"),
                ApiType::Sotw,
                dirs.get(i).copied(),
                &EnvoyExtras::default(),
            )
            .must()
        })
        .collect()
}

/// Waits until each pod counted at least `n` `kind` (`ack`/`nack`) of `resource_type`.
async fn wait_counted(fleet: &Fleet, kind: &str, resource_type: &str, pods: &[String], n: f64) {
    let metric = format!("marin3r_xdss_discovery_{kind}_total");
    for pod in pods {
        poll_ok(
            format!("{pod}: {n} {kind}s of {resource_type}"),
            CONVERGE,
            POLL,
            || async {
                let got = fleet
                    .metric(
                        &metric,
                        &[
                            ("node_id", NODE),
                            ("pod_name", pod),
                            ("resource_type", resource_type),
                        ],
                    )
                    .await;
                if got >= n {
                    Ok(())
                } else {
                    Err(format!("{got}"))
                }
            },
        )
        .await
        .must();
    }
}

/// Waits until the live replicas have `n` streams of [`NODE`] between them.
async fn wait_streams(fleet: &Fleet, n: usize, what: &str) {
    poll_ok(what, CONVERGE, POLL, || async {
        let total: f64 = fleet.streams(NODE).await.values().sum();
        if total >= n as f64 {
            Ok(())
        } else {
            Err(format!("{total} streams"))
        }
    })
    .await
    .must();
}

/// Waits until every Envoy has the listener answering `body` (its admin config dump):
/// each one, not only the one the kernel picks for a request to the shared port.
async fn wait_every_envoy_serves(envoys: &[Envoy], body: &str) {
    let escaped = serde_json::to_string(body).unwrap();
    for envoy in envoys {
        let admin = envoy.admin;
        poll_ok(
            format!("{} serves {body:?}", envoy.node_id),
            CONVERGE,
            POLL,
            || {
                let escaped = escaped.clone();
                async move {
                    let dump =
                        marin3r_tests::xds::get(admin, "/config_dump?resource=dynamic_listeners")
                            .await?
                            .body;
                    if dump.contains(&escaped) {
                        Ok(())
                    } else {
                        Err(dump.chars().take(2500).collect::<String>())
                    }
                }
            },
        )
        .await
        .must();
    }
}

fn pods(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{NODE}-{i}")).collect()
}

/// The EnvoyConfig's status once `check` accepts it.
async fn wait_status(fleet: &Fleet, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    poll_ok(what, CONVERGE, POLL, || async {
        let ec = fleet.envoyconfig(NODE).ok_or("no EnvoyConfig")?;
        if check(&ec["status"]) {
            Ok(ec["status"].clone())
        } else {
            Err(ec["status"].to_string())
        }
    })
    .await
    .must()
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn tainted(fleet: &Fleet) -> Vec<Value> {
    fleet
        .revisions()
        .into_iter()
        .filter(|r| r["status"]["tainted"] == true)
        .collect()
}

/// A fleet of three with Envoys connected, serving `good(port, "v1")`.
async fn serving_fleet(
    options: FleetOptions,
    dirs: &[&std::path::Path],
) -> (Fleet, Vec<Envoy>, u16) {
    init_tracing();
    let fleet = Fleet::start(api_server(), 3, options).await.must();
    fleet.wait_leader(CONVERGE).await.must();
    let port = free_port().unwrap();
    fleet.apply(NODE, good(port, "v1\n")).must();
    let mut envoys = envoys(&fleet, 3, dirs);
    if dirs.is_empty() {
        envoys[0]
            .wait_body(localhost(port), "v1\n", CONVERGE)
            .await
            .must();
    }
    wait_counted(&fleet, "ack", "listener", &pods(3), 1.0).await;
    let spread = fleet.streams(NODE).await;
    assert!(
        spread.values().filter(|n| **n > 0.0).count() >= 2,
        "the Envoys are spread over the replicas: {spread:?}"
    );
    (fleet, envoys, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_envoy_rejecting_gives_one_taint_and_one_rollback_over_three_replicas() {
    let _serial = SERIAL.lock().await;
    let (fleet, _envoys, port) = serving_fleet(FleetOptions::default(), &[]).await;
    let in_sync = wait_status(&fleet, "InSync, every replica serving", |s| {
        s["cacheState"] == "InSync"
            && condition(s, "ReplicasInSync").is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert!(
        condition(&in_sync, "ReplicasInSync").unwrap()["message"]
            .as_str()
            .unwrap()
            .starts_with("3/3 replicas serve"),
        "{in_sync}"
    );
    let traffic = Traffic::start(port, vec!["v1\n".into()]);

    fleet.apply(NODE, broken(port)).must();
    let rolled_back = wait_status(&fleet, "Rollback, the previous version served", |s| {
        s["cacheState"] == "Rollback" && s["desiredVersion"] != s["publishedVersion"]
    })
    .await;
    let taints = tainted(&fleet);
    assert_eq!(taints.len(), 1, "one taint: {taints:?}");
    let reason = condition(&taints[0]["status"], "RevisionTainted").unwrap()["message"].to_string();
    assert!(
        reason.contains("every Envoy of node kuard rejected listener"),
        "{reason}"
    );
    assert_eq!(fleet.revisions().len(), 2, "one revision per spec");
    assert_ne!(
        rolled_back["desiredVersion"],
        rolled_back["publishedVersion"]
    );

    // The rollback reaches every replica and every Envoy keeps serving v1.
    wait_status(&fleet, "every replica serves the rollback", |s| {
        condition(s, "ReplicasInSync").is_some_and(|c| c["status"] == "True")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(tainted(&fleet).len(), 1, "still one taint");
    // The self-healing series (summed over the replicas): the leader counts the taint it
    // wrote and shows the EnvoyConfig's cacheState and ReplicasInSync; every replica
    // counts the rollback it served.
    let node = [("node_id", NODE)];
    let taint = [("node_id", NODE), ("reason", "RejectedByEnvoy")];
    assert_eq!(
        fleet
            .metric("marin3r_envoyconfig_revisions_tainted_total", &taint)
            .await,
        1.0
    );
    assert!(
        fleet
            .metric("marin3r_envoyconfig_rollbacks_total", &node)
            .await
            >= 1.0
    );
    let state = |s| [("node_id", NODE), ("state", s)];
    assert_eq!(
        fleet
            .metric("marin3r_envoyconfig_cache_state", &state("Rollback"))
            .await,
        1.0
    );
    assert_eq!(
        fleet
            .metric("marin3r_envoyconfig_cache_state", &state("InSync"))
            .await,
        0.0
    );
    assert_eq!(
        fleet.metric("marin3r_ha_replicas_in_sync", &node).await,
        1.0
    );
    let report = traffic.stop_all_served().await.must();
    assert!(report.ok > 10, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_one_envoy_accepts_is_never_tainted() {
    let _serial = SERIAL.lock().await;
    // A cluster whose CA file (a relative name) exists only in Envoy 0's directory:
    // Envoy 0 accepts it, Envoys 1 and 2 reject it.
    let with_ca = tempfile::tempdir().unwrap();
    let (without_1, without_2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [with_ca.path(), without_1.path(), without_2.path()];
    let (fleet, _envoys, port) = serving_fleet(FleetOptions::default(), &dirs).await;
    std::fs::write(with_ca.path().join("ca.pem"), &fleet.bundle.ca.cert_pem).unwrap();
    let cluster = json!({
        "name": "upstream", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]},
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": UPSTREAM_TLS_TYPE,
            "common_tls_context": {"validation_context": {"trusted_ca": {"filename": "ca.pem"}}}}},
    });
    let mut spec = good(port, "v1\n");
    spec["resources"]
        .as_array_mut()
        .unwrap()
        .push(resource("cluster", cluster));
    fleet.apply(NODE, spec).must();
    let threshold = fleet.options.threshold as f64;
    wait_counted(&fleet, "ack", "cluster", &pods(1), 1.0).await;
    wait_counted(&fleet, "nack", "cluster", &pods(3)[1..], threshold + 1.0).await;
    // Several evaluations later: still nothing tainted, the update stays published.
    tokio::time::sleep(fleet.options.evaluate_interval * 4).await;
    assert!(tainted(&fleet).is_empty(), "partial rejection never taints");
    let status = fleet.envoyconfig(NODE).unwrap()["status"].clone();
    assert_eq!(status["cacheState"], "InSync", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_finishes_the_episode_the_dead_leader_left() {
    let _serial = SERIAL.lock().await;
    // Four NACKs take Envoy's backoff ~1.5 s: the leader dies before it can judge.
    let options = FleetOptions {
        threshold: 4,
        ..FleetOptions::default()
    };
    let lease = Duration::from_secs(options.lease_seconds);
    let (mut fleet, _envoys, port) = serving_fleet(options, &[]).await;
    let leader = fleet.wait_leader(CONVERGE).await.must();

    fleet.apply(NODE, broken(port)).must();
    // The leader created the broken revision and published it: the episode has begun.
    poll_ok(
        "the broken revision is published",
        CONVERGE,
        POLL,
        || async {
            let desired =
                fleet.envoyconfig(NODE).ok_or("no EnvoyConfig")?["status"]["desiredVersion"]
                    .clone();
            let published = fleet
                .revisions()
                .iter()
                .any(|r| r["status"]["published"] == true && r["spec"]["version"] == desired);
            if published {
                Ok(())
            } else {
                Err(format!(
                    "desired {desired}; revisions {:?}",
                    fleet
                        .revisions()
                        .iter()
                        .map(|r| (r["spec"]["version"].clone(), r["status"].clone()))
                        .collect::<Vec<_>>()
                ))
            }
        },
    )
    .await
    .must();
    assert!(
        tainted(&fleet).is_empty(),
        "not judged yet when the leader dies"
    );
    let killed = Instant::now();
    fleet.kill_replica(&leader).must();

    poll_ok(
        "the broken revision is tainted",
        lease + Duration::from_secs(5),
        POLL,
        || async {
            if tainted(&fleet).len() == 1 {
                Ok(())
            } else {
                Err("not tainted")
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e} within the Lease time + 5 s of the leader's death"));
    let took = killed.elapsed();
    let new_leader = fleet.wait_leader(CONVERGE).await.must();
    assert_ne!(new_leader, leader);
    wait_status(&fleet, "Rollback", |s| s["cacheState"] == "Rollback").await;
    eprintln!("tainted {took:?} after the leader's death (lease {lease:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_s_envoys_reconnect_to_the_others_and_keep_serving() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, envoys, port) = serving_fleet(FleetOptions::default(), &[]).await;
    let leader = fleet.wait_leader(CONVERGE).await.must();
    let traffic = Traffic::start(port, vec!["v1\n".into(), "v2\n".into()]);
    let streams = fleet.streams(NODE).await;
    let victim = streams
        .iter()
        .find(|(name, n)| **n > 0.0 && **name != leader)
        .map(|(name, _)| name.clone())
        .expect("a replica other than the leader has an Envoy");
    fleet.kill_replica(&victim).must();
    wait_streams(&fleet, 3, "every Envoy is back on a live replica").await;
    // They are served: an edit reaches all of them.
    fleet.apply(NODE, good(port, "v2\n")).must();
    wait_every_envoy_serves(&envoys, "v2\n").await;
    wait_status(&fleet, "InSync with v2", |s| {
        s["cacheState"] == "InSync" && s["desiredVersion"] == s["publishedVersion"]
    })
    .await;
    traffic.stop_all_served().await.must();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_restarted_one_by_one_under_traffic() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, envoys, port) = serving_fleet(FleetOptions::default(), &[]).await;
    let traffic = Traffic::start(port, vec!["v1\n".into(), "v2\n".into()]);
    let old: Vec<String> = fleet.replicas.keys().cloned().collect();
    for name in &old {
        // maxSurge 1, maxUnavailable 0: the new one is ready before the old one goes.
        fleet.add_replica().await.must();
        fleet.stop_replica(name).await.must();
    }
    assert!(old.iter().all(|n| !fleet.replicas.contains_key(n)));
    fleet.wait_leader(CONVERGE).await.must();
    wait_streams(&fleet, 3, "every Envoy on a new replica").await;
    fleet.apply(NODE, good(port, "v2\n")).must();
    wait_every_envoy_serves(&envoys, "v2\n").await;
    let status = wait_status(&fleet, "InSync with v2 on every replica", |s| {
        s["cacheState"] == "InSync"
            && s["desiredVersion"] == s["publishedVersion"]
            && condition(s, "ReplicasInSync").is_some_and(|c| c["status"] == "True")
    })
    .await;
    traffic.stop_all_served().await.must();
    // One revision per spec, none twice; the old replicas' reports are gone.
    let mut versions: Vec<String> = fleet
        .revisions()
        .iter()
        .map(|r| r["spec"]["version"].as_str().unwrap().to_string())
        .collect();
    let all = versions.len();
    versions.dedup();
    assert_eq!((all, versions.len()), (2, 2), "{status}");
    let reports: Vec<String> = fleet
        .reports()
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        reports.iter().all(|r| fleet.replicas.contains_key(r)),
        "{reports:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_of_30_s_keeps_every_replica_serving_and_ready() {
    let _serial = SERIAL.lock().await;
    let (fleet, _envoys, port) = serving_fleet(FleetOptions::default(), &[]).await;
    let traffic = Traffic::start(port, vec!["v1\n".into(), "v2\n".into()]);
    fleet.api.set_outage(Outage::Refuse);
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(30) {
        fleet
            .all_ready()
            .await
            .unwrap_or_else(|e| panic!("during the outage: {e}"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fleet.api.set_outage(Outage::None);
    traffic.stop_all_served().await.must();
    // Writes resume: an edit after the outage is served (the watches come back with
    // their backoff, at most 30 s).
    fleet.apply(NODE, good(port, "v2\n")).must();
    poll_ok(
        "v2 after the outage",
        Duration::from_secs(60),
        POLL,
        || async {
            let r = marin3r_tests::xds::get(localhost(port), "/").await?;
            if r.body == "v2\n" {
                Ok(())
            } else {
                Err(r.body)
            }
        },
    )
    .await
    .must();
}

/// Round 4, finding 1: the API server hangs for 20 s (open watches go silent without a
/// close, as when an API server instance vanishes behind a load balancer; requests are
/// never answered). Every replica keeps serving and stays ready; afterwards an edit is
/// served to every Envoy within the liveness bound (before it, none was in 400 s: the
/// watches and the leader's requests hung for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_hang_of_20_s_is_survived_and_an_edit_afterwards_is_served() {
    let _serial = SERIAL.lock().await;
    let (fleet, envoys, port) = serving_fleet(FleetOptions::default(), &[]).await;
    fleet.api.set_outage(Outage::Hang);
    let hang = Instant::now();
    while hang.elapsed() < Duration::from_secs(20) {
        fleet
            .all_ready()
            .await
            .unwrap_or_else(|e| panic!("during the hang: {e}"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fleet.api.set_outage(Outage::None);
    fleet.apply(NODE, good(port, "v2\n")).must();
    let back = Instant::now();
    // Silent watches are failed 30 s after their last byte (≤ 10 s from now), requests
    // sent during the hang 10 s after they were sent.
    let bound = marin3r_kube::client::SILENCE + marin3r_kube::client::RESPONSE_TIMEOUT;
    wait_every_envoy_serves(&envoys, "v2\n").await;
    let served = back.elapsed();
    assert!(served <= bound, "served {served:?} after the hang");
    eprintln!("after a 20 s hang: every Envoy served the edit {served:?} later");
}
