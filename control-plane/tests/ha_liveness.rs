//! Finding 1 of round 4, reproduced on the discovery service itself: two replicas
//! (`--leader-elect`) against the stateful fake API server, which hangs for 20 s
//! (`Outage::Hang`: open watches go silent without a close, requests are never
//! answered). Before the liveness bound an EnvoyConfig edit made afterwards reached no
//! replica (400 s observed) and the leader never wrote again. Now every watch of the
//! discovery service — EnvoyConfigs, revisions, Secrets, EndpointSlices, Pods, reports,
//! the Service's EndpointSlices, the Lease — and every request is bounded
//! (`marin3r_kube::client`), so the edit is served by both replicas and the leader
//! writes its revision within the bound. Tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use marin3r_control_plane::kubernetes::KubernetesBackend;
use marin3r_control_plane::kubernetes::ha::HaConfig;
use marin3r_control_plane::{Backend as _, Context};
use marin3r_kube::client::{RESPONSE_TIMEOUT, SILENCE};
use marin3r_testkit::apiserver::{FakeApiServer, Outage, ResourceKind};
use marin3r_testkit::wait::wait_until;
use marin3r_wire::DOMAIN;
use marin3r_xds::{ResourceType, SharedStats};
use serde_json::{Value, json};
use tokio::time::Instant;

fn api_server() -> FakeApiServer {
    let api = FakeApiServer::new();
    for (plural, kind) in [
        ("envoyconfigs", "EnvoyConfig"),
        ("envoyconfigrevisions", "EnvoyConfigRevision"),
        ("discoveryservicereplicas", "DiscoveryServiceReplica"),
    ] {
        api.register(ResourceKind::new(DOMAIN, "v1alpha1", plural, kind).with_status());
    }
    api
}

fn envoyconfig(timeout: &str) -> Value {
    json!({
        "apiVersion": format!("{DOMAIN}/v1alpha1"), "kind": "EnvoyConfig",
        "metadata": {"name": "kuard", "namespace": "default"},
        "spec": {"nodeID": "kuard", "resources": [{"type": "cluster", "value": {
            "name": "kuard", "connect_timeout": timeout, "type": "STATIC"
        }}]},
    })
}

/// Starts replica `name` (its Pod `uid`) on a bounded client of `api`.
async fn replica(
    api: &FakeApiServer,
    name: &str,
    uid: &str,
) -> (Context, tokio::sync::oneshot::Sender<()>) {
    let ctx = Context::new(SharedStats::new());
    let client = marin3r_kube::client::bounded(api.service(), "default");
    let mut backend = KubernetesBackend::new(client, "default", 3)
        .with_evaluate_interval(Duration::from_millis(250))
        .with_ha(HaConfig::new(
            "ds",
            "default",
            name,
            Some(uid.to_string()),
            15,
        ));
    backend.start(&ctx).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(backend.run(
        ctx.clone(),
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    (ctx, stop)
}

fn cluster_version(ctx: &Context) -> Option<String> {
    ctx.cache
        .get("kuard")
        .map(|s| s.version(ResourceType::Cluster).to_string())
}

fn revisions(api: &FakeApiServer) -> usize {
    api.list("envoyconfigrevisions").len()
}

async fn until(what: &str, bound: Duration, check: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    wait_until(what, bound, check).await;
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn after_a_20_s_hang_an_edit_is_served_by_every_replica_and_the_leader_writes_again() {
    let api = api_server();
    let mut pods = Vec::new();
    for name in ["ds-0", "ds-1"] {
        let pod = api
            .put(json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": "default"}}))
            .unwrap();
        pods.push((name, pod["metadata"]["uid"].as_str().unwrap().to_string()));
    }
    api.put(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "marin3r-ds-abc", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "marin3r-ds"}},
        "endpoints": pods.iter().map(|(name, uid)| json!({
            "addresses": ["10.0.0.1"], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": name, "namespace": "default", "uid": uid}
        })).collect::<Vec<_>>(),
    }))
    .unwrap();
    api.put(envoyconfig("1s")).unwrap();
    let mut replicas = Vec::new();
    for (name, uid) in &pods {
        replicas.push(replica(&api, name, uid).await);
    }
    until("both replicas serve kuard", Duration::from_secs(30), || {
        replicas
            .iter()
            .all(|(ctx, _)| cluster_version(ctx).is_some())
    })
    .await;
    let first = cluster_version(&replicas[0].0).unwrap();
    assert_eq!(revisions(&api), 1);

    api.set_outage(Outage::Hang);
    tokio::time::sleep(Duration::from_secs(20)).await;
    api.set_outage(Outage::None);
    api.put(envoyconfig("2s")).unwrap();
    // Watches silent since the hang began are failed SILENCE after their last byte;
    // requests sent during the hang RESPONSE_TIMEOUT after they were sent.
    let bound = SILENCE + RESPONSE_TIMEOUT;
    let back = Instant::now();
    until("both replicas serve the edit", bound, || {
        replicas
            .iter()
            .all(|(ctx, _)| cluster_version(ctx).is_some_and(|v| v != first))
    })
    .await;
    let served = back.elapsed();
    until("the leader wrote the new revision", bound, || {
        revisions(&api) == 2
    })
    .await;
    let written = back.elapsed();
    eprintln!(
        "after a 20 s hang: the edit served by both replicas in {served:?}, the leader's revision written in {written:?}"
    );
    for (_, stop) in replicas {
        let _ = stop.send(());
    }
}

/// The class: every watch the discovery service (several replicas) holds open before a
/// hang is open again within the bound after it — whichever resource, selector or
/// namespace.
#[tokio::test(start_paused = true)]
async fn every_watch_of_the_discovery_service_is_re_established_after_a_hang() {
    let api = api_server();
    let pod = api
        .put(json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "ds-0", "namespace": "default"}}))
        .unwrap();
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    api.put(envoyconfig("1s")).unwrap();
    let start = api.mark();
    let (_ctx, stop) = replica(&api, "ds-0", &uid).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let watches = |since| -> std::collections::BTreeSet<String> {
        api.requests_since(since)
            .iter()
            .filter(|r| r.code == 200)
            .filter_map(|r| r.watch_key())
            .collect()
    };
    let open = watches(start);
    // EnvoyConfigs, revisions, Secrets, EndpointSlices (all and the Service's), Pods,
    // reports, the Lease.
    assert!(open.len() >= 8, "{open:#?}");
    api.set_outage(Outage::Hang);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let back = api.mark();
    api.set_outage(Outage::None);
    tokio::time::sleep(SILENCE + RESPONSE_TIMEOUT).await;
    let again = watches(back);
    let missing: Vec<&String> = open.difference(&again).collect();
    assert!(missing.is_empty(), "not watched again: {missing:#?}");
    eprintln!(
        "{} watches re-established after the hang: {open:#?}",
        open.len()
    );
    let _ = stop.send(());
}
