//! The figures of a discovery service with several replicas (`--only ha`,
//! `docs/ha.md`): three replicas in Kubernetes mode against one stateful fake API
//! server ([`marin3r_tests::ha::Fleet`]) with the defaults of `marin3r
//! discovery-service`, and the ADS client swarm ([`crate::ads`]) as the Envoys:
//!
//! - [`taint`]: the time from the last NACK (and from the edit) to the taint, when every
//!   stream rejects an update;
//! - [`writes`]: API writes per edit and per second in the steady state at 100
//!   EnvoyConfigs × 1,000 pods;
//! - [`storm`]: 10,000 streams, one replica killed, the time until every stream is
//!   served again (the fleet in a child process: the swarm and the replicas need a
//!   descriptor per stream each);
//! - [`report`]: the report's section, and splicing it into an existing report.

pub mod report;
pub mod storm;
pub mod taint;
pub mod writes;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use marin3r_control_plane::kubernetes::DEFAULT_EVALUATE_INTERVAL;
use marin3r_control_plane::kubernetes::ha::LEASE_DURATION_SECONDS;
use marin3r_control_plane::revisions::DEFAULT_NACK_THRESHOLD;
use marin3r_tests::ha::{Fleet, FleetOptions, api_server};
use marin3r_xds::AdsConfig;
use serde_json::{Value, json};

use crate::ads::{Swarm, SwarmConfig};

/// Replicas of every HA figure (the manifests' default).
pub const REPLICAS: usize = 3;
/// How often the bench looks at the fake API server's objects.
pub const POLL: Duration = Duration::from_millis(5);
/// Bound of every wait for the fleet (a status, a taint, the streams).
pub const CONVERGE: Duration = Duration::from_secs(60);

/// The replicas' settings: what `marin3r discovery-service --leader-elect` runs with by
/// default (NACK threshold 5, Lease 15 s, evaluation every 1 s, drain 5 s + 5 s).
pub fn fleet_options() -> FleetOptions {
    let ads = AdsConfig::default();
    FleetOptions {
        threshold: DEFAULT_NACK_THRESHOLD,
        lease_seconds: LEASE_DURATION_SECONDS,
        drain_delay: ads.drain_delay,
        drain_time: ads.drain_time,
        evaluate_interval: DEFAULT_EVALUATE_INTERVAL,
    }
}

/// Starts [`REPLICAS`] replicas (and the balancer) as tasks of `servers`, and waits for
/// a leader.
pub async fn start_fleet(servers: &tokio::runtime::Handle) -> Result<Fleet> {
    let fleet = servers
        .spawn(async { Fleet::start(api_server(), REPLICAS, fleet_options()).await })
        .await?
        .map_err(|e| anyhow!(e))?;
    fleet.wait_leader(CONVERGE).await.map_err(|e| anyhow!(e))?;
    Ok(fleet)
}

/// Waits `run / runs` of the replicas' evaluation interval (timed from something that
/// happened on one of their ticks): the runs' edits fall at evenly spread phases of
/// the leader's 1 s evaluation, which a figure of one phase would hide.
pub async fn stagger(run: usize, runs: usize) {
    let interval = fleet_options().evaluate_interval;
    let phase = interval.mul_f64(run as f64 / runs.max(1) as f64);
    tokio::time::sleep(phase).await;
}

/// Creates an EnvoyConfig (revision 0) for each of `nodes` and waits until every
/// replica serves them all.
pub async fn publish(fleet: &Fleet, nodes: &[String]) -> Result<()> {
    for node in nodes {
        fleet
            .apply(node, spec(node, 0, false))
            .map_err(|e| anyhow!(e))?;
    }
    wait_all_settled(fleet, nodes).await
}

/// A fresh fleet serving `nodes` ([`publish`]) and a reconnecting swarm of `streams`
/// streams over them, through the balancer; runs `body` with both and when the swarm
/// started, then closes them (the servers first: their side keeps the TIME_WAIT).
pub async fn with_fleet_and_swarm<T>(
    servers: &tokio::runtime::Handle,
    nodes: &[String],
    streams: usize,
    body: impl AsyncFnOnce(&Fleet, &mut Swarm, Instant) -> Result<T>,
) -> Result<T> {
    let fleet = start_fleet(servers).await?;
    publish(&fleet, nodes).await?;
    let config = swarm_config(
        &fleet.bundle,
        vec![fleet.service()],
        nodes.to_vec(),
        streams,
    );
    let connecting = Instant::now();
    let mut swarm = Swarm::connect(&config)?;
    let result = body(&fleet, &mut swarm, connecting).await;
    drop(fleet);
    swarm.shutdown().await;
    result
}

/// The EnvoyConfig spec of `node_id` at `revision`: cluster `backend` (its endpoint's
/// port follows the revision) and listener `http` answering `revision <n>`; `broken`
/// routes the listener to a cluster that does not exist instead (every Envoy rejects
/// it; the cluster stays as it was).
pub fn spec(node_id: &str, revision: u32, broken: bool) -> Value {
    let port = 20000 + revision % 20000;
    let cluster = json!({
        "name": "backend",
        "connect_timeout": "1s",
        "type": "STATIC",
        "load_assignment": {
            "cluster_name": "backend",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}],
        },
    });
    let action = if broken {
        json!({"route": {"cluster": format!("does-not-exist-{revision}")}})
    } else {
        json!({"direct_response": {"status": 200, "body": {"inline_string": format!("revision {revision}\n")}}})
    };
    let listener = marin3r_tests::configs::http_listener("http", 8080, action, None);
    json!({
        "nodeID": node_id,
        "resources": [
            marin3r_tests::configs::resource("cluster", cluster),
            marin3r_tests::configs::resource("listener", listener),
        ],
    })
}

/// Replaces the spec of EnvoyConfig `name` (creates it if missing) as a client's update
/// of the spec does: the status, a subresource, stays as it is and the generation
/// grows. (`Fleet::apply` stores the object as given, which drops the status.) Straight
/// into the store: not in the request log.
pub fn edit_spec(fleet: &Fleet, name: &str, spec: Value) -> Result<()> {
    let Some(mut ec) = fleet.envoyconfig(name) else {
        return fleet.apply(name, spec).map_err(|e| anyhow!(e));
    };
    ec["spec"] = spec;
    if let Some(meta) = ec["metadata"].as_object_mut() {
        // Recomputed by the store (the spec changed).
        meta.remove("generation");
    }
    fleet
        .api
        .put(ec)
        .map(|_| ())
        .map_err(|e| anyhow!("edit EnvoyConfig {name}: {e:?}"))
}

/// The node ids of `n` EnvoyConfigs (named as their node).
pub fn node_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("ha-{i:03}")).collect()
}

/// A reconnecting swarm of `streams` streams over `node_ids`, dialing `targets` with the
/// fleet's client certificate.
pub fn swarm_config(
    bundle: &marin3r_certs::Bundle,
    targets: Vec<SocketAddr>,
    node_ids: Vec<String>,
    streams: usize,
) -> SwarmConfig {
    SwarmConfig {
        targets,
        ca_pem: bundle.ca.cert_pem.clone(),
        client_cert_pem: bundle.client.cert_pem.clone(),
        client_key_pem: bundle.client.key_pem.clone(),
        node_ids,
        streams,
        connect_parallelism: 64,
        reconnect: true,
        eds: Default::default(),
        api: Default::default(),
    }
}

/// The condition `type_` of an EnvoyConfig status.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether an EnvoyConfig status says: its desired version (other than `before`) is
/// published, `InSync`, and every replica serves it (`ReplicasInSync` True naming its
/// revision).
pub fn settled(status: &Value, before: Option<&str>) -> bool {
    let desired = status["desiredVersion"].as_str().unwrap_or_default();
    !desired.is_empty()
        && Some(desired) != before
        && status["publishedVersion"].as_str() == Some(desired)
        && status["cacheState"] == "InSync"
        && condition(status, "ReplicasInSync").is_some_and(|c| {
            c["status"] == "True" && c["message"].as_str().is_some_and(|m| m.contains(desired))
        })
}

/// Whether an EnvoyConfig status says: rolled back, and every replica serves the
/// revision it went back to.
pub fn rolled_back(status: &Value) -> bool {
    status["cacheState"] == "Rollback"
        && condition(status, "ReplicasInSync").is_some_and(|c| c["status"] == "True")
}

/// Polls the status of EnvoyConfig `name` every [`POLL`] until `done` accepts it;
/// returns when that was seen.
pub async fn wait_status(
    fleet: &Fleet,
    name: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<Instant> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let status = fleet
            .envoyconfig(name)
            .map(|ec| ec["status"].clone())
            .unwrap_or_default();
        if done(&status) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{name}: {what}: timed out; status {status}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The desired version an EnvoyConfig status names.
pub fn desired_version(fleet: &Fleet, name: &str) -> Option<String> {
    fleet
        .envoyconfig(name)
        .and_then(|ec| ec["status"]["desiredVersion"].as_str().map(str::to_string))
}

/// Waits until every EnvoyConfig of `names` is [`settled`].
pub async fn wait_all_settled(fleet: &Fleet, names: &[String]) -> Result<()> {
    for name in names {
        wait_status(fleet, name, "InSync on every replica", |s| settled(s, None)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_runs_with_the_command_line_defaults() {
        let o = fleet_options();
        assert_eq!((o.threshold, o.lease_seconds), (5, 15));
        assert_eq!(o.evaluate_interval, Duration::from_secs(1));
    }

    #[test]
    fn settled_needs_every_replica_on_the_new_revision() {
        let status = |state: &str, desired: &str, published: &str, in_sync: &str, msg: &str| {
            json!({"cacheState": state, "desiredVersion": desired, "publishedVersion": published,
                   "conditions": [{"type": "ReplicasInSync", "status": in_sync, "message": msg}]})
        };
        let ok = status("InSync", "b", "b", "True", "3/3 replicas serve n-v3-b");
        assert!(settled(&ok, Some("a")));
        assert!(
            !settled(&ok, Some("b")),
            "still the version before the edit"
        );
        assert!(!settled(
            &status("InSync", "b", "a", "True", "3/3 replicas serve n-v3-b"),
            None
        ));
        assert!(!settled(
            &status("InSync", "b", "b", "True", "3/3 replicas serve n-v3-a"),
            None
        ));
        assert!(!settled(
            &status("InSync", "b", "b", "False", "2/3 replicas serve n-v3-b"),
            None
        ));
        assert!(rolled_back(&status(
            "Rollback",
            "b",
            "a",
            "True",
            "3/3 replicas serve n-v3-a"
        )));
    }
}
