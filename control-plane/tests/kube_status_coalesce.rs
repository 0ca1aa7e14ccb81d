//! Status writes do not follow endpoint churn ([`marin3r_control_plane::kubernetes::coalesce`]):
//! 50 EndpointSlice writes per second for 10 s, read by 3 EnvoyConfigs,
//! on tokio's paused clock against the fake API server. The snapshot served follows every
//! slice write at once; the `providesVersions` status writes are coalesced per
//! EnvoyConfig (one at once, then at most one per window, the last value always
//! written), so the API writes per slice write stay under 0.2 (3.00 before: one status
//! write per reading EnvoyConfig per slice write).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use marin3r_control_plane::kubernetes::KubernetesBackend;
use marin3r_control_plane::{Backend as _, Context};
use marin3r_testkit::apiserver::{FakeApiServer, Mark, RequestRecord, ResourceKind, Verb};
use marin3r_xds::{ResourceType, SharedStats};
use serde_json::{Value, json};

const GROUP: &str = "marin3r.3scale.net";
const READERS: [&str; 3] = ["a", "b", "c"];

fn api_server() -> FakeApiServer {
    let api = FakeApiServer::new();
    for (plural, kind) in [
        ("envoyconfigs", "EnvoyConfig"),
        ("envoyconfigrevisions", "EnvoyConfigRevision"),
    ] {
        api.register(ResourceKind::new(GROUP, "v1alpha1", plural, kind).with_status());
    }
    api
}

fn slice(i: usize) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "kuard-a", "namespace": "default", "labels": {"app": "kuard"}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [format!("10.0.{}.{}", i / 250, i % 250 + 1)], "conditions": {"ready": true}}]
    })
}

fn envoyconfig(node: &str) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "EnvoyConfig",
        "metadata": {"name": node, "namespace": "default"},
        "spec": {"nodeID": node, "resources": [{"type": "endpoint", "generateFromEndpointSlices": {
            "clusterName": "kuard", "targetPort": "http",
            "selector": {"matchLabels": {"app": "kuard"}}
        }}]},
    })
}

fn served(ctx: &Context, node: &str) -> Option<String> {
    ctx.cache
        .get(node)
        .map(|s| s.version(ResourceType::Endpoint).to_string())
}

/// The endpoint version in the status of `node`'s published revision.
fn status_version(api: &FakeApiServer, node: &str) -> Option<String> {
    api.list("envoyconfigrevisions")
        .into_iter()
        .filter(|r| r["spec"]["nodeID"] == node && r["status"]["published"] == true)
        .find_map(|r| {
            r["status"]["providesVersions"]["endpoints"]
                .as_str()
                .map(str::to_string)
        })
}

fn status_writes(api: &FakeApiServer, mark: Mark) -> Vec<RequestRecord> {
    api.requests_since(mark)
        .into_iter()
        .filter(|r| {
            r.verb == Some(Verb::Patch)
                && r.resource == "envoyconfigrevisions"
                && r.subresource.as_deref() == Some("status")
        })
        .collect()
}

/// Runs the backend until `until` is true (polled every 10 ms of paused time), at most
/// `bound` of paused time.
async fn settle(bound: Duration, until: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    while tokio::time::Instant::now() < deadline {
        if until() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until()
}

#[tokio::test(start_paused = true)]
async fn status_writes_are_coalesced_under_endpoint_churn_and_converge_to_the_last_version() {
    let api = api_server();
    api.put(slice(0)).unwrap();
    for node in READERS {
        api.put(envoyconfig(node)).unwrap();
    }
    let ctx = Context::new(SharedStats::new());
    let mut backend = KubernetesBackend::new(api.client(), "default", 3)
        .with_evaluate_interval(Duration::from_millis(100));
    backend.start(&ctx).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(backend.run(
        ctx.clone(),
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    let converged = |api: &FakeApiServer, ctx: &Context| {
        READERS.iter().all(|node| {
            let served = served(ctx, node);
            served.is_some() && served == status_version(api, node)
        })
    };
    assert!(
        settle(Duration::from_secs(30), || converged(&api, &ctx)).await,
        "the three EnvoyConfigs published"
    );
    // Past any window the first publication opened.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let mark = api.mark();
    let (rate, seconds) = (50, 10);
    let slice_writes = rate * seconds;
    let mut lagged = 0;
    for i in 1..=slice_writes {
        api.put(slice(i)).unwrap();
        tokio::time::sleep(Duration::from_millis(1000 / rate as u64)).await;
        // The snapshot follows every slice write at once (within the 20 ms between two).
        let want = format!("10.0.{}.{}", i / 250, i % 250 + 1);
        for node in READERS {
            let snapshot = ctx.cache.get(node).unwrap();
            let body = &snapshot
                .resource(ResourceType::Endpoint, "kuard")
                .unwrap()
                .body
                .value;
            if !String::from_utf8_lossy(body).contains(&want) {
                lagged += 1;
            }
        }
    }
    assert_eq!(lagged, 0, "every slice write served before the next one");
    let during = status_writes(&api, mark).len();
    // The trailing writes: the status converges to the version served last.
    assert!(
        settle(Duration::from_secs(30), || converged(&api, &ctx)).await,
        "the status shows the last version served"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(converged(&api, &ctx));
    let writes = api.writes_since(mark);
    let status = status_writes(&api, mark).len();
    let per_slice_write = writes as f64 / slice_writes as f64;
    println!(
        "{slice_writes} slice writes, {} readers: {writes} API writes ({status} status, {during} during the churn), {per_slice_write:.3} per slice write",
        READERS.len()
    );
    assert!(
        per_slice_write <= 0.2,
        "{per_slice_write:.3} API writes per slice write"
    );
    let _ = stop.send(());
    run.await.unwrap();
}
