//! Self-healing in local mode (design.md §4, walkthrough 2) against a real Envoy 1.40.
//!
//! The discovery service runs in-process (`marin3r_control_plane::serve_with` with a
//! `LocalBackend` and an explicit `--nack-threshold`, listeners on 127.0.0.1:0); Envoys are
//! child processes bootstrapped like `marin3r init-manager` does it, killed on drop. Every
//! wait polls with a deadline. Covered:
//! - a good config serves 200 and is `InSync`;
//! - walkthrough 2's broken update (listener moved to another port, inline route to a
//!   cluster that does not exist) is NACKed by Envoy, tainted, and rolled back within
//!   seconds: `/status` shows `Rollback`, desired = the new version, published = the
//!   previous one; Envoy keeps serving 200; the rejected version is no longer pushed;
//! - the next good config brings `InSync` back;
//! - `DELETE /status/revisions/…` of the tainted revision tries the same config again and
//!   it is tainted again only by fresh NACKs (the counts were reset);
//! - deleting the good revision leaves none untainted: `RollbackFailed`, and the last
//!   good snapshot keeps serving;
//! - two Envoys of one node where only one rejects (a relative CA file that exists only
//!   in one Envoy's working directory): no taint, still `InSync`.

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use marin3r_control_plane::local::LocalBackend;
use marin3r_control_plane::local::backend::EVALUATE_INTERVAL;
use marin3r_control_plane::status::EnvoyConfigReport;
use marin3r_envoyconfig::envoyconfig::CacheState;
use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::http::{Method, Request};
use marin3r_testkit::{free_port, wait_ok, wait_until};
use marin3r_tests::Must;
use marin3r_tests::configs::{
    UPSTREAM_TLS_TYPE, answering_listener, envoy_config, rejected_listener,
};
use marin3r_tests::xds::{
    CONVERGE, Envoy, Xds, get, init_tracing, localhost, metric_sum, pod_name, write_atomic,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// Configs.

/// A config Envoy accepts: `GET http://127.0.0.1:port/` answers 200 `body`.
fn good(node_id: &str, port: u16, body: &str) -> String {
    envoy_config(node_id, vec![answering_listener(port, body)])
}

/// Walkthrough 2's broken update: the listener moves to `port` and routes to a cluster
/// that does not exist (Envoy rejects the listener).
fn broken(node_id: &str, port: u16) -> String {
    envoy_config(node_id, vec![rejected_listener(port)])
}

// ---------------------------------------------------------------------------------------
// The discovery service and its status.

async fn start_xds(node_id: &str, file: String, nack_threshold: u64) -> Xds {
    init_tracing();
    Xds::start_with(&[(&format!("{node_id}.json"), file)], |dir| {
        LocalBackend::new(dir).with_nack_threshold(nack_threshold)
    })
    .await
    .must()
}

/// Waits until the EnvoyConfig of `node_id` is in `state`.
async fn wait_state(xds: &Xds, node_id: &str, state: CacheState) -> EnvoyConfigReport {
    wait_ok(format!("cacheState {state}"), CONVERGE, || async {
        let ec = xds.status_of(node_id).await?;
        if ec.cache_state == Some(state) {
            Ok(ec)
        } else {
            Err(format!("{:?}: {ec:?}", ec.cache_state))
        }
    })
    .await
}

async fn delete_revision(xds: &Xds, node_id: &str, version: &str) -> (u16, String) {
    let path = format!("/status/revisions/default/{node_id}/{version}");
    let r = Request::new(Method::DELETE, &path)
        .send(xds.metrics)
        .await
        .must();
    (r.status, r.body)
}

/// `marin3r_xdss_discovery_{kind}_total` of one pod for one resource type.
async fn counter(xds: &Xds, kind: &str, node_id: &str, pod: &str, resource_type: &str) -> f64 {
    let text = xds.metrics_text().await.must();
    metric_sum(
        &text,
        &format!("marin3r_xdss_discovery_{kind}_total"),
        &[
            ("node_id", node_id),
            ("resource_type", resource_type),
            ("pod_name", pod),
        ],
    )
}

async fn assert_serves(port: u16, body: &str) {
    let r = get(localhost(port), "/").await.must();
    assert_eq!((r.status, r.body.as_str()), (200, body));
}

// ---------------------------------------------------------------------------------------
// (a) (b) (c): a rejected config is tainted and rolled back; the next good one is InSync.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_every_envoy_rejects_is_rolled_back_and_the_next_good_one_is_in_sync() {
    let node = "e2e-sh-rollback";
    let threshold = 5;
    let (port, moved) = (free_port().unwrap(), free_port().unwrap());
    let xds = start_xds(node, good(node, port, "one\n"), threshold).await;
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw).must();
    envoy
        .wait_body(localhost(port), "one\n", CONVERGE)
        .await
        .must();
    let first = wait_state(&xds, node, CacheState::InSync).await;
    let v1 = first.desired_version.clone().unwrap();
    assert_eq!(first.published_version.as_deref(), Some(v1.as_str()));
    assert_eq!(first.envoy_api, "v3");

    // Walkthrough 2's broken update.
    let pod = pod_name(node);
    let acks_before = counter(&xds, "ack", node, &pod, "listener").await;
    write_atomic(&xds.file(&format!("{node}.json")), &broken(node, moved)).must();
    let written = Instant::now();
    let ec = wait_state(&xds, node, CacheState::Rollback).await;
    eprintln!(
        "broken config written → cacheState Rollback: {:?}",
        written.elapsed()
    );
    let v2 = ec.desired_version.clone().unwrap();
    assert_ne!(v2, v1);
    assert_eq!(ec.published_version.as_deref(), Some(v1.as_str()));
    let (old, new) = (&ec.revisions[0], &ec.revisions[1]);
    assert_eq!(
        (old.version.as_str(), old.published, old.tainted),
        (v1.as_str(), true, false)
    );
    assert_eq!(
        (new.version.as_str(), new.published, new.tainted),
        (v2.as_str(), false, true)
    );
    let reason = new.taint_reason.as_deref().unwrap();
    assert!(
        reason.contains("rejected listener version") && reason.contains("at least 5 times"),
        "{reason}"
    );
    assert!(
        reason.contains("does-not-exist"),
        "Envoy's message is kept: {reason}"
    );
    let out_of_sync = ec
        .conditions
        .iter()
        .find(|c| c.type_ == "CacheOutOfSync")
        .unwrap();
    assert_eq!(out_of_sync.status, "True");

    // Envoy still serves the previous config; the rejected listener never came up.
    envoy.check_running().must();
    assert_serves(port, "one\n").await;
    assert!(get(localhost(moved), "/").await.is_err());

    // Once rolled back, the previous version is pushed again and ACKed, and the rejected
    // version is no longer pushed: no more NACKs. The last is a negative, so a short
    // fixed window (two evaluation rounds).
    wait_ok("the ACK of the rolled-back version", CONVERGE, || async {
        let acks = counter(&xds, "ack", node, &pod, "listener").await;
        if acks > acks_before {
            Ok(())
        } else {
            Err(format!("{acks} ACKs"))
        }
    })
    .await;
    let nacks = counter(&xds, "nack", node, &pod, "listener").await;
    assert!(nacks >= threshold as f64, "{nacks} NACKs");
    tokio::time::sleep(EVALUATE_INTERVAL * 2).await;
    assert_eq!(
        counter(&xds, "nack", node, &pod, "listener").await,
        nacks,
        "NACKs continued after the rollback"
    );
    assert_eq!(
        xds.status_of(node).await.must().cache_state,
        Some(CacheState::Rollback)
    );

    // The next good config brings InSync back.
    write_atomic(
        &xds.file(&format!("{node}.json")),
        &good(node, port, "two\n"),
    )
    .must();
    envoy
        .wait_body(localhost(port), "two\n", CONVERGE)
        .await
        .must();
    let ec = wait_state(&xds, node, CacheState::InSync).await;
    let v3 = ec.desired_version.clone().unwrap();
    assert!(v3 != v1 && v3 != v2);
    assert_eq!(ec.published_version.as_deref(), Some(v3.as_str()));
    assert_eq!(ec.revisions.len(), 3);
    assert!(
        ec.conditions.iter().all(|c| c.status == "False"),
        "{:?}",
        ec.conditions
    );
    drop(envoy);
    xds.stop().await.must();
}

// ---------------------------------------------------------------------------------------
// (e) (d): deleting the tainted revision retries it on fresh NACKs; deleting the good one
// leaves RollbackFailed with the last good snapshot still served.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_revisions_are_retried_on_fresh_nacks_and_rollback_failed_keeps_serving() {
    let node = "e2e-sh-delete";
    let threshold = 4;
    let (port, moved) = (free_port().unwrap(), free_port().unwrap());
    let xds = start_xds(node, good(node, port, "good\n"), threshold).await;
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw).must();
    envoy
        .wait_body(localhost(port), "good\n", CONVERGE)
        .await
        .must();
    write_atomic(&xds.file(&format!("{node}.json")), &broken(node, moved)).must();
    let ec = wait_state(&xds, node, CacheState::Rollback).await;
    let (good_v, bad_v) = (
        ec.published_version.clone().unwrap(),
        ec.desired_version.clone().unwrap(),
    );
    let first_created = ec.revisions[1].created_at.clone();
    let pod = pod_name(node);

    // Deleting the tainted revision: the folder still asks for that config, so it is
    // re-created untainted and tried again (in a later createdAt second)...
    let created: k8s_openapi::jiff::Timestamp = first_created.parse().unwrap();
    wait_until("a later createdAt second", Duration::from_secs(2), || {
        k8s_openapi::jiff::Timestamp::now().as_second() > created.as_second()
    })
    .await;
    let nacks_before = counter(&xds, "nack", node, &pod, "listener").await;
    let (code, body) = delete_revision(&xds, node, &bad_v).await;
    assert_eq!(code, 200, "{body}");
    let after: EnvoyConfigReport = serde_json::from_str(&body).unwrap();
    assert_eq!(after.cache_state, Some(CacheState::InSync), "{body}");
    assert_eq!(after.desired_version.as_deref(), Some(bad_v.as_str()));
    let retried = after.revisions.last().unwrap();
    assert!(!retried.tainted && retried.published, "{body}");
    assert!(retried.created_at > first_created, "{body}");

    // ...and tainted again only once Envoy NACKed it `threshold` more times: the old
    // counts were reset when it was published again.
    let ec = wait_state(&xds, node, CacheState::Rollback).await;
    let fresh = counter(&xds, "nack", node, &pod, "listener").await - nacks_before;
    eprintln!("NACKs between the retry and the new taint: {fresh}");
    assert!(
        fresh >= threshold as f64,
        "re-tainted after only {fresh} new NACKs"
    );
    assert_eq!(ec.published_version.as_deref(), Some(good_v.as_str()));
    assert!(ec.revisions.last().unwrap().tainted);
    assert_serves(port, "good\n").await;

    // Deleting the good revision leaves nothing untainted: RollbackFailed, and the cache
    // keeps the last good snapshot.
    let (code, body) = delete_revision(&xds, node, &good_v).await;
    assert_eq!(code, 200, "{body}");
    let ec: EnvoyConfigReport = serde_json::from_str(&body).unwrap();
    assert_eq!(ec.cache_state, Some(CacheState::RollbackFailed), "{body}");
    assert_eq!(ec.revisions.len(), 1);
    assert_eq!(
        ec.published_version.as_deref(),
        Some(good_v.as_str()),
        "the last good snapshot is still the one served"
    );
    let failed = ec
        .conditions
        .iter()
        .find(|c| c.type_ == "RollbackFailed")
        .unwrap();
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_str()),
        ("True", "AllRevisionsTainted")
    );
    // A negative (nothing wipes the last good snapshot), so a short fixed window: two
    // evaluation rounds.
    tokio::time::sleep(EVALUATE_INTERVAL * 2).await;
    envoy.check_running().must();
    assert_serves(port, "good\n").await;
    assert_eq!(
        xds.status_of(node).await.must().cache_state,
        Some(CacheState::RollbackFailed)
    );

    // Unknown revisions and EnvoyConfigs are 404s.
    assert_eq!(delete_revision(&xds, node, &good_v).await.0, 404);
    assert_eq!(delete_revision(&xds, "nope", &good_v).await.0, 404);

    // A good config recovers from RollbackFailed.
    write_atomic(
        &xds.file(&format!("{node}.json")),
        &good(node, port, "again\n"),
    )
    .must();
    envoy
        .wait_body(localhost(port), "again\n", CONVERGE)
        .await
        .must();
    wait_state(&xds, node, CacheState::InSync).await;
    drop(envoy);
    xds.stop().await.must();
}

// ---------------------------------------------------------------------------------------
// (f): partial rejection never taints.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_only_some_envoys_reject_is_not_tainted() {
    let node = "e2e-sh-partial";
    let threshold = 3;
    let cluster = |tls: bool| {
        let mut c = json!({
            "name": "upstream",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": "upstream",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                    "socket_address": {"address": "127.0.0.1", "port_value": 9}
                }}}]}],
            },
        });
        if tls {
            // A CA file by relative name: it resolves against each Envoy's working
            // directory, and exists only in one of them.
            c["transport_socket"] = json!({
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": UPSTREAM_TLS_TYPE,
                    "common_tls_context": {
                        "validation_context": {"trusted_ca": {"filename": "e2e-upstream-ca.pem"}},
                    },
                },
            });
        }
        envoy_config(node, vec![json!({"type": "cluster", "value": c})])
    };
    let xds = start_xds(node, cluster(false), threshold).await;
    let with_ca = tempfile::tempdir().unwrap();
    std::fs::write(
        with_ca.path().join("e2e-upstream-ca.pem"),
        &xds.bundle.ca.cert_pem,
    )
    .unwrap();
    let without_ca = tempfile::tempdir().unwrap();
    let (pod_a, pod_b) = ("e2e-sh-partial-a", "e2e-sh-partial-b");
    let mut envoy_a =
        Envoy::start_as(&xds, node, pod_a, ApiType::Sotw, Some(with_ca.path())).must();
    let mut envoy_b =
        Envoy::start_as(&xds, node, pod_b, ApiType::Sotw, Some(without_ca.path())).must();
    for pod in [pod_a, pod_b] {
        wait_ok(format!("{pod} ACKs the clusters"), CONVERGE, || async {
            let acks = counter(&xds, "ack", node, pod, "cluster").await;
            if acks >= 1.0 {
                Ok(())
            } else {
                Err(format!("{acks} ACKs"))
            }
        })
        .await;
    }
    assert_eq!(
        wait_state(&xds, node, CacheState::InSync)
            .await
            .revisions
            .len(),
        1
    );

    let acks_a = counter(&xds, "ack", node, pod_a, "cluster").await;
    write_atomic(&xds.file(&format!("{node}.json")), &cluster(true)).must();
    // Envoy A accepts the new cluster, Envoy B keeps rejecting it.
    wait_ok(
        format!("{pod_a} ACKs the TLS cluster"),
        CONVERGE,
        || async {
            let acks = counter(&xds, "ack", node, pod_a, "cluster").await;
            if acks > acks_a {
                Ok(())
            } else {
                Err(format!("{acks} ACKs"))
            }
        },
    )
    .await;
    wait_ok(
        format!("{pod_b} NACKs the TLS cluster {threshold} times"),
        CONVERGE,
        || async {
            let nacks = counter(&xds, "nack", node, pod_b, "cluster").await;
            if nacks >= threshold as f64 + 1.0 {
                Ok(())
            } else {
                Err(format!("{nacks} NACKs"))
            }
        },
    )
    .await;
    assert_eq!(counter(&xds, "nack", node, pod_a, "cluster").await, 0.0);
    // Two evaluation rounds later (a negative, so a fixed window): still InSync, nothing
    // tainted.
    tokio::time::sleep(EVALUATE_INTERVAL * 2).await;
    let ec = xds.status_of(node).await.must();
    assert_eq!(ec.cache_state, Some(CacheState::InSync), "{ec:?}");
    assert_eq!(ec.revisions.len(), 2);
    assert!(ec.revisions.iter().all(|r| !r.tainted), "{ec:?}");
    assert_eq!(ec.published_version, ec.desired_version);
    let log_b = std::fs::read_to_string(&envoy_b.log).unwrap();
    assert!(
        log_b.contains("e2e-upstream-ca.pem"),
        "Envoy B rejected the cluster for its missing CA file:\n{}",
        envoy_b.log_tail(40)
    );
    envoy_a.check_running().must();
    envoy_b.check_running().must();
    drop((envoy_a, envoy_b));
    xds.stop().await.must();
}
