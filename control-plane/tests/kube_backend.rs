//! The whole Kubernetes backend (reflectors, both controllers, triggers, Pod watch)
//! against kube-rs' mock API server: a router answers the lists and watches of every
//! kind in `WATCH_NAMESPACE` and records each write; any other request fails the test.
//! Plus the real-cluster test (`#[ignore = "needs cluster"]`, see docs/kind.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fixtures;
mod kube_mock;

use marin3r_testkit::{wait_until, wait_until_async};
use std::time::Duration;

use kube::client::Body;
use kube_mock::*;
use marin3r_control_plane::kubernetes::KubernetesBackend;
use marin3r_control_plane::{Backend as _, Context};
use marin3r_xds::{NodeInfo, ResourceType, SharedStats, StreamEvent};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const GROUP: &str = "/apis/marin3r.3scale.net/v1alpha1/namespaces/default";

fn spec() -> Value {
    fixtures::spec(8080)
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "500"}, "items": items})
}

/// A published revision of `spec()` owned by the EnvoyConfig `kuard`.
fn revision() -> Value {
    let version = fixtures::version_of(&spec());
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigRevision",
        "metadata": {
            "name": format!("kuard-v3-{version}"), "namespace": "default", "uid": "uid-rev",
            "resourceVersion": "400", "generation": 1, "creationTimestamp": "2025-01-01T00:00:01Z",
            "finalizers": ["finalizer.marin3r.3scale.net"],
            "annotations": {"marin3r.3scale.net/applied-at": "2025-01-01T00:00:01.000000Z"},
            "labels": {"marin3r.3scale.net/node-id": "kuard", "marin3r.3scale.net/config-version": version, "marin3r.3scale.net/envoy-api": "v3"},
            "ownerReferences": [{"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig", "name": "kuard", "uid": "uid-kuard", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {"nodeID": "kuard", "version": version, "envoyAPI": "v3", "resources": spec()["resources"]},
        "status": {"published": true, "lastPublishedAt": "2025-01-01T00:00:02Z"}
    })
}

fn pod_meta(name: &str) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "501",
                      "labels": {"marin3r.3scale.net/status": "enabled"},
                      "annotations": {"marin3r.3scale.net/node-id": "kuard"}}
    })
}

/// Answers lists and watches; forwards every write to `writes`. The first Pod watch
/// delivers the deletion of `kuard-0`; other watches stay open.
async fn router(api: ApiServer, writes: mpsc::UnboundedSender<Received>) {
    gated_router(api, writes, tokio::sync::watch::channel(true).1).await;
}

/// [`router`], but lists are answered only once `gate` is `true`.
async fn gated_router(
    mut api: ApiServer,
    writes: mpsc::UnboundedSender<Received>,
    gate: tokio::sync::watch::Receiver<bool>,
) {
    let mut open_watches = Vec::new();
    let mut pod_watches = 0;
    while let Some((request, send)) = api.0.next_request().await {
        let got = read(request).await;
        let (path, query) = got.uri.split_once('?').unwrap_or((&got.uri, ""));
        let watch = query.contains("watch=true");
        let is_get = got.method == "GET";
        let reply = match (got.method.as_str(), path, watch) {
            ("GET", p, false) if p == format!("{GROUP}/envoyconfigs") => list(
                "EnvoyConfigList",
                vec![
                    envoyconfig("kuard", spec(), None),
                    envoyconfig("broken", json!({"nodeID": {"not": "a string"}}), None),
                ],
            ),
            ("GET", p, false) if p == format!("{GROUP}/envoyconfigrevisions") => {
                list("EnvoyConfigRevisionList", vec![revision()])
            }
            ("GET", "/api/v1/namespaces/default/secrets", false) => list("SecretList", vec![]),
            ("GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", false) => {
                list("EndpointSliceList", vec![])
            }
            ("GET", "/api/v1/namespaces/default/pods", false) => {
                assert!(
                    query.contains("labelSelector=marin3r.3scale.net%2Fstatus%3Denabled"),
                    "{query}"
                );
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                       "metadata": {"resourceVersion": "500"}, "items": [pod_meta("kuard-0")]})
            }
            ("GET", "/api/v1/namespaces/default/pods", true) if pod_watches == 0 => {
                pod_watches += 1;
                let event = json!({"type": "DELETED", "object": pod_meta("kuard-0")});
                let body = format!("{event}\n");
                send.send_response(
                    http::Response::builder()
                        .status(200)
                        .body(Body::from(body.into_bytes()))
                        .unwrap(),
                );
                continue;
            }
            ("GET", _, true) => {
                // A long poll that never delivers anything.
                open_watches.push(send);
                continue;
            }
            ("PATCH", p, false) if p.ends_with("/status") => {
                assert_eq!(query, "&force=true&fieldManager=marin3r");
                let doc = if p.contains("/envoyconfigs/") {
                    envoyconfig("kuard", spec(), None)
                } else {
                    revision()
                };
                let answer = with_status(&doc, &got.body);
                let _ = writes.send(got);
                answer
            }
            _ => panic!("unexpected request {} {}", got.method, got.uri),
        };
        if is_get && !watch && !*gate.borrow() {
            let mut gate = gate.clone();
            tokio::spawn(async move {
                let _ = gate.wait_for(|open| *open).await;
                send.send_response(json_response(200, &reply));
            });
            continue;
        }
        send.send_response(json_response(200, &reply));
    }
}

#[tokio::test]
async fn not_ready_until_the_first_lists_are_answered_and_loaded() {
    let (client, api) = mock_client();
    let (writes_tx, _writes) = mpsc::unbounded_channel();
    let (gate, gated) = tokio::sync::watch::channel(false);
    let router = tokio::spawn(gated_router(api, writes_tx, gated));
    let ctx = Context::new(SharedStats::new());
    let mut backend = KubernetesBackend::new(client, "default", 5)
        .with_evaluate_interval(Duration::from_millis(20))
        .with_initial_sync_timeout(Duration::from_millis(200));
    // The lists do not come: `start` gives up waiting and serves, not ready.
    tokio::time::timeout(TIMEOUT, backend.start(&ctx))
        .await
        .unwrap()
        .unwrap();
    assert!(!ctx.ready.is_synced());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(backend.run(
        ctx.clone(),
        Box::pin(async move {
            let _ = stop_rx.await;
        }),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !ctx.ready.is_synced(),
        "still not ready while the lists are held"
    );
    assert!(ctx.cache.get("kuard").is_none());

    // The API server answers: the published revision is loaded, then ready.
    gate.send(true).unwrap();
    tokio::time::timeout(TIMEOUT, ctx.ready.synced())
        .await
        .unwrap();
    assert!(
        ctx.cache.get("kuard").is_some(),
        "the published revision is served when ready is set"
    );
    stop_tx.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, run).await.unwrap().unwrap();
    router.abort();
}

#[tokio::test]
async fn backend_warm_starts_reconciles_and_forgets_deleted_pods() {
    let (client, api) = mock_client();
    let (writes_tx, mut writes) = mpsc::unbounded_channel();
    let router = tokio::spawn(router(api, writes_tx));
    let ctx = Context::new(SharedStats::new());
    // kuard-0 NACKed some version earlier.
    let pod = NodeInfo {
        id: "kuard".into(),
        pod_name: "kuard-0".into(),
    };
    ctx.stats.stream_opened(&pod, marin3r_xds::Api::Sotw);
    ctx.stats.record(&[StreamEvent::Nack {
        node_id: "kuard".into(),
        pod_name: "kuard-0".into(),
        resource_type: ResourceType::Listener,
        version: "old".into(),
        message: "rejected".into(),
    }]);

    let mut backend = KubernetesBackend::new(client, "default", 5)
        .with_evaluate_interval(Duration::from_millis(20))
        .with_initial_sync_timeout(Duration::from_secs(5));
    tokio::time::timeout(TIMEOUT, backend.start(&ctx))
        .await
        .unwrap()
        .unwrap();
    assert!(
        ctx.cache.get("kuard").is_some(),
        "the published revision is served before the first stream is accepted"
    );
    assert!(ctx.ready.is_synced(), "lists synced in time: ready");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(backend.run(
        ctx.clone(),
        Box::pin(async move {
            let _ = stop_rx.await;
        }),
    ));

    // The EnvoyConfig gets its status (the malformed one is skipped), the revision
    // reports its conditions.
    let mut seen = Vec::new();
    while !(seen
        .iter()
        .any(|w: &Received| w.uri.contains("/envoyconfigs/kuard/"))
        && seen
            .iter()
            .any(|w| w.uri.contains("/envoyconfigrevisions/")))
    {
        let write = tokio::time::timeout(TIMEOUT, writes.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            !write.uri.contains("broken"),
            "malformed EnvoyConfig skipped"
        );
        seen.push(write);
    }
    let ec_status = seen
        .iter()
        .rev()
        .find(|w| w.uri.contains("/envoyconfigs/kuard/"))
        .unwrap();
    assert_eq!(ec_status.body["status"]["cacheState"], "InSync");
    let rev_status = seen
        .iter()
        .rev()
        .find(|w| w.uri.contains("/envoyconfigrevisions/"))
        .unwrap();
    assert_eq!(
        condition(&rev_status.body["status"], "RevisionPublished")["status"],
        "True"
    );

    // The Pod watch reported kuard-0 deleted: its NACK counts are gone.
    wait_until("the pod's NACK counts to be cleared", TIMEOUT, || {
        ctx.stats
            .nacks("kuard", ResourceType::Listener, "old")
            .is_empty()
    })
    .await;

    stop_tx.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, run).await.unwrap().unwrap();
    router.abort();
}

/// Against a real cluster (docs/kind.md): the CRDs must be installed and the current
/// kubeconfig context must point at it. In namespace `marin3r-it` (created if missing):
/// creates an EnvoyConfig, waits until its revision is published and its status is
/// InSync, then deletes it and waits until the node is forgotten.
#[tokio::test]
#[ignore = "needs cluster"]
async fn real_cluster_envoyconfig_becomes_in_sync() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{DeleteParams, PostParams};
    use marin3r_envoyconfig::envoyconfig::{CacheState, EnvoyConfig};
    const NS: &str = "marin3r-it";
    const NODE: &str = "marin3r-rs-it";
    let client = kube::Client::try_default().await.unwrap();
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("cannot create namespace {NS}: {e}"),
    }
    let ctx = Context::new(SharedStats::new());
    let mut backend = KubernetesBackend::new(client.clone(), NS, 5);
    backend.start(&ctx).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(backend.run(
        ctx.clone(),
        Box::pin(async move {
            let _ = stop_rx.await;
        }),
    ));
    let configs: kube::Api<EnvoyConfig> = kube::Api::namespaced(client, NS);
    let mut spec = spec();
    spec["nodeID"] = json!(NODE);
    let ec: EnvoyConfig = serde_json::from_value(json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
        "metadata": {"name": "it"}, "spec": spec
    }))
    .unwrap();
    let _ = configs.delete("it", &DeleteParams::default()).await;
    wait_until_async(
        "the previous run's EnvoyConfig to go",
        Duration::from_secs(60),
        || async { configs.get_opt("it").await.unwrap().is_none() },
    )
    .await;
    configs.create(&PostParams::default(), &ec).await.unwrap();
    wait_until_async(
        "the EnvoyConfig to be InSync",
        Duration::from_secs(60),
        || async {
            let status = configs.get("it").await.unwrap().status.unwrap_or_default();
            status.cache_state == Some(CacheState::InSync)
                && status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "CacheOutOfSync" && c.status == "False")
        },
    )
    .await;
    assert!(ctx.cache.get(NODE).is_some());
    configs
        .delete("it", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the node to be forgotten", Duration::from_secs(60), || {
        ctx.cache.get(NODE).is_none()
    })
    .await;
    stop_tx.send(()).unwrap();
    run.await.unwrap();
}
