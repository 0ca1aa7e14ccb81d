//! Kubernetes mode's EndpointSlice path end to end against the stateful fake API server
//! (`marin3r_testkit::apiserver`): the slice watch, its index, the triggers and the
//! reconcile that republishes the generated ClusterLoadAssignment. The endpoints served
//! follow a slice that moves to another Service (its old labels still reconcile the
//! EnvoyConfig that read it), a deleted slice, and changes made while the watch was down
//! (seen by the re-list, not as events).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use marin3r_control_plane::kubernetes::KubernetesBackend;
use marin3r_control_plane::{Backend as _, Context};
use marin3r_testkit::apiserver::{FakeApiServer, Fault, Outage, ResourceKind, Verb};
use marin3r_wire::DOMAIN;
use marin3r_xds::{ResourceType, SharedStats};
use prost::Message as _;
use serde_json::{Value, json};

fn api_server() -> FakeApiServer {
    let api = FakeApiServer::new();
    for (plural, kind) in [
        ("envoyconfigs", "EnvoyConfig"),
        ("envoyconfigrevisions", "EnvoyConfigRevision"),
    ] {
        api.register(ResourceKind::new(DOMAIN, "v1alpha1", plural, kind).with_status());
    }
    api
}

fn slice(name: &str, app: &str, ips: &[&str]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>()
    })
}

/// The addresses of the ClusterLoadAssignment `kuard` served to node `kuard`.
fn served(ctx: &Context) -> Option<Vec<String>> {
    use envoy_types::pb::envoy::config::core::v3::address::Address;
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    let snapshot = ctx.cache.get("kuard")?;
    let resource = snapshot.resource(ResourceType::Endpoint, "kuard")?;
    let cla = ClusterLoadAssignment::decode(resource.body.value.as_slice()).ok()?;
    Some(
        cla.endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .filter_map(|e| match &e.host_identifier {
                Some(HostIdentifier::Endpoint(ep)) => {
                    match ep.address.as_ref()?.address.as_ref()? {
                        Address::SocketAddress(sa) => Some(sa.address.clone()),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect(),
    )
}

async fn wait_served(ctx: &Context, want: &[&str], what: &str) {
    let want: Vec<String> = want.iter().map(ToString::to_string).collect();
    marin3r_testkit::wait::poll_ok(
        what,
        Duration::from_secs(30),
        marin3r_testkit::wait::POLL,
        || {
            let got = served(ctx);
            let want = want.clone();
            async move {
                if got.as_ref() == Some(&want) {
                    Ok(())
                } else {
                    Err(format!("served {got:?}, want {want:?}"))
                }
            }
        },
    )
    .await
    .unwrap();
}

/// The watches end; `changes` are made meanwhile and the history is compacted, so the
/// watches resume with 410 Expired and re-list. Listing `resource` fails until the
/// revisions were listed and watched again (and reconciled, with `resource` as it
/// was): only the re-list of `resource` can tell what changed. Returns with that list
/// still failing; the caller clears the faults.
async fn down_then_relisted(api: &FakeApiServer, resource: &str, changes: impl FnOnce()) {
    let mark = api.mark();
    api.inject(Fault::fail(500).verb(Verb::List).resource(resource));
    api.set_outage(Outage::Refuse);
    changes();
    api.compact();
    api.set_outage(Outage::None);
    marin3r_testkit::wait::poll_ok(
        "the revisions listed and watched again",
        Duration::from_secs(30),
        marin3r_testkit::wait::POLL,
        || {
            let requests = api.requests_since(mark);
            let of = |verb| {
                move |r: &marin3r_testkit::apiserver::RequestRecord| {
                    r.verb == Some(verb) && r.resource == "envoyconfigrevisions"
                }
            };
            let again = requests
                .iter()
                .position(of(Verb::List))
                .is_some_and(|i| requests[i..].iter().any(of(Verb::Watch)));
            async move { if again { Ok(()) } else { Err("not yet") } }
        },
    )
    .await
    .unwrap();
    // Ordering only: the revisions' reconciles run before `resource` is listed.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Runs the backend on `api` until the returned sender is dropped or fired.
async fn start(
    api: &FakeApiServer,
) -> (
    Context,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let ctx = Context::new(SharedStats::new());
    let mut backend = KubernetesBackend::new(api.client(), "default", 3)
        .with_evaluate_interval(Duration::from_millis(100));
    backend.start(&ctx).await.unwrap();
    assert!(ctx.ready.is_synced(), "ready once the first lists are in");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(backend.run(
        ctx.clone(),
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    (ctx, stop, run)
}

fn tls_secret(pair: usize) -> Value {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let (crt, key) = marin3r_testkit::tls::PEM_PAIRS[pair];
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "kuard-tls", "namespace": "default"},
        "data": {"tls.crt": b64(crt), "tls.key": b64(key)}
    })
}

/// A Secret renewed while the watch was down is served once the Secrets are listed
/// again (no event tells it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_changed_while_the_watch_was_down_is_served_after_the_relist() {
    let api = api_server();
    api.put(tls_secret(0)).unwrap();
    api.put(json!({
        "apiVersion": format!("{DOMAIN}/v1alpha1"), "kind": "EnvoyConfig",
        "metadata": {"name": "kuard", "namespace": "default"},
        "spec": {"nodeID": "kuard", "resources": [{"type": "secret", "generateFromTlsSecret": "kuard-tls"}]},
    }))
    .unwrap();
    let (ctx, stop, run) = start(&api).await;
    let version = |ctx: &Context| {
        ctx.cache
            .get("kuard")
            .map(|s| s.version(ResourceType::Secret).to_string())
    };
    let first = marin3r_testkit::wait::poll_ok(
        "published",
        Duration::from_secs(30),
        marin3r_testkit::wait::POLL,
        || {
            let v = version(&ctx);
            async move { v.ok_or("not yet") }
        },
    )
    .await
    .unwrap();
    down_then_relisted(&api, "secrets", || {
        api.put(tls_secret(1)).unwrap();
    })
    .await;
    assert_eq!(version(&ctx).as_ref(), Some(&first));
    api.clear_faults();
    marin3r_testkit::wait::poll_ok(
        "the renewed Secret served",
        Duration::from_secs(30),
        marin3r_testkit::wait::POLL,
        || {
            let v = version(&ctx);
            let first = first.clone();
            async move {
                if v.is_some_and(|v| v != first) {
                    Ok(())
                } else {
                    Err("the old Secret")
                }
            }
        },
    )
    .await
    .unwrap();
    let _ = stop.send(());
    run.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_endpoints_follow_relabels_deletions_and_changes_made_while_the_watch_was_down() {
    let api = api_server();
    for s in [
        slice("kuard-a", "kuard", &["10.0.0.1"]),
        slice("kuard-b", "kuard", &["10.0.0.2"]),
        slice("other-a", "other", &["10.1.0.1"]),
    ] {
        api.put(s).unwrap();
    }
    api.put(json!({
        "apiVersion": format!("{DOMAIN}/v1alpha1"), "kind": "EnvoyConfig",
        "metadata": {"name": "kuard", "namespace": "default"},
        "spec": {"nodeID": "kuard", "resources": [{"type": "endpoint", "generateFromEndpointSlices": {
            "clusterName": "kuard", "targetPort": "http",
            "selector": {"matchLabels": {"app": "kuard"}}
        }}]},
    }))
    .unwrap();
    let (ctx, stop, run) = start(&api).await;
    wait_served(
        &ctx,
        &["10.0.0.1", "10.0.0.2"],
        "published from both slices",
    )
    .await;

    // kuard-b moves to another Service: its event carries the new labels only.
    api.put(slice("kuard-b", "other", &["10.0.0.2"])).unwrap();
    wait_served(&ctx, &["10.0.0.1"], "the moved slice's endpoints dropped").await;
    api.put(slice("kuard-c", "kuard", &["10.0.0.3"])).unwrap();
    wait_served(&ctx, &["10.0.0.1", "10.0.0.3"], "a new slice added").await;
    api.delete("endpointslices", "default", "kuard-a").unwrap();
    wait_served(&ctx, &["10.0.0.3"], "a deleted slice's endpoints dropped").await;

    // While the watches are down a slice moves back and one goes.
    down_then_relisted(&api, "endpointslices", || {
        api.put(slice("kuard-b", "kuard", &["10.0.0.2"])).unwrap();
        api.delete("endpointslices", "default", "kuard-c").unwrap();
    })
    .await;
    assert_eq!(served(&ctx).unwrap(), ["10.0.0.3"]);
    api.clear_faults();
    wait_served(
        &ctx,
        &["10.0.0.2"],
        "the changes made while the watch was down",
    )
    .await;

    let _ = stop.send(());
    run.await.unwrap();
}
