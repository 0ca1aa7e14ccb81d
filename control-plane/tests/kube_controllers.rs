//! Kubernetes mode controllers against kube-rs' mock API server (no cluster needed):
//! every request the reconcilers make is asserted (method, path and query, body) and
//! answered with what the API server would return; the watch events that follow are
//! played into the reflector stores by hand.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fixtures;
mod kube_mock;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube_mock::*;
use marin3r_control_plane::kubernetes::{
    Lenient, Shared, coalesce, reconcile_envoyconfig, reconcile_revision, rejected_revisions,
};
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_xds::{NodeInfo, ResourceType, StreamEvent};
use prost::Message as _;
use serde_json::{Value, json};

const REVISIONS: &str = "/apis/marin3r.3scale.net/v1alpha1/namespaces/default/envoyconfigrevisions";
const CONFIGS: &str = "/apis/marin3r.3scale.net/v1alpha1/namespaces/default/envoyconfigs";
const APPLY: &str = "?&force=true&fieldManager=marin3r";

use fixtures::{spec, version_of};

fn revision_name(spec: &Value) -> String {
    format!("kuard-v3-{}", version_of(spec))
}

/// Status apply on a revision: asserts the request shape and answers with the object.
async fn expect_revision_status(api: &mut ApiServer, current: &Value) -> Value {
    let name = current["metadata"]["name"].as_str().unwrap().to_string();
    let got = api
        .expect(
            "PATCH",
            &format!("{REVISIONS}/{name}/status{APPLY}"),
            200,
            |b| with_status(current, b),
        )
        .await;
    assert_eq!(got.content_type, "application/apply-patch+yaml");
    assert_eq!(got.body["apiVersion"], "marin3r.3scale.net/v1alpha1");
    assert_eq!(got.body["kind"], "EnvoyConfigRevision");
    with_status(current, &got.body)
}

async fn expect_config_status(api: &mut ApiServer, current: &Value) -> Value {
    let name = current["metadata"]["name"].as_str().unwrap().to_string();
    let got = api
        .expect(
            "PATCH",
            &format!("{CONFIGS}/{name}/status{APPLY}"),
            200,
            |b| with_status(current, b),
        )
        .await;
    assert_eq!(got.body["kind"], "EnvoyConfig");
    with_status(current, &got.body)
}

/// Reconciles an EnvoyConfig that has no revision yet: the revision is created.
async fn create_revision(
    world: &mut World,
    api: &mut ApiServer,
    ec: &Value,
    uid: &str,
) -> (Value, Value) {
    let obj = world.put_config(ec);
    let (result, (revision, status)) =
        run(reconcile_envoyconfig(obj, world.shared.clone()), async {
            let got = api
                .expect("POST", &format!("{REVISIONS}?"), 201, |b| created(b, uid))
                .await;
            let revision = created(&got.body, uid);
            let status = expect_config_status(api, ec).await;
            (revision, status)
        })
        .await;
    result.unwrap();
    world.put_revision(&revision);
    world.put_config(&status);
    (revision, status)
}

/// Reconciles a revision and expects exactly one status write.
async fn reconcile_revision_with_status(
    world: &mut World,
    api: &mut ApiServer,
    name: &str,
) -> Value {
    let obj = world.revision(name);
    let current = to_json(obj.valid().unwrap());
    let (result, updated) = run(
        reconcile_revision(obj, world.shared.clone()),
        expect_revision_status(api, &current),
    )
    .await;
    result.unwrap();
    world.put_revision(&updated);
    updated
}

/// Reconciles an EnvoyConfig and expects exactly one status write.
async fn reconcile_config_with_status(world: &mut World, api: &mut ApiServer, name: &str) -> Value {
    let obj = world.config(name);
    let current = to_json(obj.valid().unwrap());
    let (result, updated) = run(
        reconcile_envoyconfig(obj, world.shared.clone()),
        expect_config_status(api, &current),
    )
    .await;
    result.unwrap();
    world.put_config(&updated);
    updated
}

/// Reconciles and expects no request at all.
async fn reconcile_quietly<F: std::future::Future<Output = Result<A, E>>, A, E: std::fmt::Debug>(
    api: &mut ApiServer,
    f: F,
) -> A {
    let (result, ()) = run(f, async {}).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(50), api.0.next_request())
            .await
            .is_err(),
        "no request expected"
    );
    result.unwrap()
}

fn listener_version(world: &World) -> String {
    world
        .xds()
        .cache
        .get("kuard")
        .unwrap()
        .version(ResourceType::Listener)
        .to_string()
}

#[tokio::test]
async fn envoyconfig_created_gets_an_owned_revision_that_is_published_and_in_sync() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    let ec = envoyconfig("kuard", spec(8080), None);
    let (revision, status) = create_revision(&mut world, &mut api, &ec, "uid-rev1").await;

    // The revision: named, labelled, owned, finalized, ordered.
    let version = version_of(&spec(8080));
    assert_eq!(revision["metadata"]["name"], revision_name(&spec(8080)));
    assert_eq!(revision["metadata"]["namespace"], "default");
    assert_eq!(
        revision["metadata"]["labels"],
        json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/config-version": version,
            "marin3r.3scale.net/envoy-api": "v3"
        })
    );
    assert_eq!(
        revision["metadata"]["ownerReferences"],
        json!([{
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig", "name": "kuard",
            "uid": "uid-kuard", "controller": true, "blockOwnerDeletion": true
        }])
    );
    assert_eq!(
        revision["metadata"]["finalizers"],
        json!(["finalizer.marin3r.3scale.net"])
    );
    assert!(revision["metadata"]["annotations"]["marin3r.3scale.net/applied-at"].is_string());
    assert_eq!(revision["spec"]["version"], version);
    assert_eq!(revision["spec"]["envoyAPI"], "v3");
    assert_eq!(revision["spec"]["resources"], spec(8080)["resources"]);

    // The first status: the desired version, not yet confirmed by the revision.
    let s = &status["status"];
    assert_eq!(s["cacheState"], "InSync");
    assert_eq!(s["desiredVersion"], version);
    assert!(
        s["publishedVersion"].is_null(),
        "publishedVersion is what is served: nothing yet"
    );
    assert_eq!(s["revisions"][0]["ref"]["name"], revision_name(&spec(8080)));
    assert_eq!(condition(s, "CacheOutOfSync")["reason"], "PublishPending");
    assert_eq!(condition(s, "RollbackFailed")["status"], "False");

    // The revision controller publishes it into the cache and says so.
    let published =
        reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(8080))).await;
    let rs = &published["status"];
    assert_eq!(rs["published"], true);
    assert!(rs["lastPublishedAt"].is_string());
    assert_eq!(condition(rs, "RevisionPublished")["status"], "True");
    assert_eq!(condition(rs, "ResourcesInSync")["status"], "True");
    let snapshot = world.xds().cache.get("kuard").expect("node published");
    assert_eq!(
        rs["providesVersions"]["listeners"],
        snapshot.version(ResourceType::Listener)
    );
    assert_eq!(
        rs["providesVersions"]["clusters"],
        snapshot.version(ResourceType::Cluster)
    );
    assert!(
        snapshot
            .resource(ResourceType::Runtime, "runtime")
            .is_some(),
        "default RTDS layer"
    );

    // The EnvoyConfig is now in sync.
    let status = reconcile_config_with_status(&mut world, &mut api, "kuard").await;
    assert_eq!(
        condition(&status["status"], "CacheOutOfSync")["status"],
        "False"
    );
    assert_eq!(
        condition(&status["status"], "CacheOutOfSync")["reason"],
        "DesiredVersionPublished"
    );

    // Converged: reconciling again writes nothing.
    reconcile_quietly(
        &mut api,
        reconcile_envoyconfig(world.config("kuard"), world.shared.clone()),
    )
    .await;
    reconcile_quietly(
        &mut api,
        reconcile_revision(
            world.revision(&revision_name(&spec(8080))),
            world.shared.clone(),
        ),
    )
    .await;
}

/// Brings `kuard` to a published, in-sync revision of `spec(8080)`.
async fn in_sync(world: &mut World, api: &mut ApiServer) {
    let ec = envoyconfig("kuard", spec(8080), None);
    create_revision(world, api, &ec, "uid-rev1").await;
    reconcile_revision_with_status(world, api, &revision_name(&spec(8080))).await;
    reconcile_config_with_status(world, api, "kuard").await;
}

/// Edits the spec of `kuard` to `spec(port)`: a second revision is created.
async fn change_spec(world: &mut World, api: &mut ApiServer, port: u64, uid: &str) -> Value {
    let mut ec = to_json(world.config("kuard").valid().unwrap());
    ec["spec"] = spec(port);
    ec["metadata"]["generation"] = json!(2);
    let (revision, status) = create_revision(world, api, &ec, uid).await;
    assert_eq!(revision["spec"]["version"], version_of(&spec(port)));
    status
}

#[tokio::test]
async fn spec_change_creates_a_new_revision_that_supersedes_the_old_one() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    in_sync(&mut world, &mut api).await;
    let old_listeners = listener_version(&world);

    let status = change_spec(&mut world, &mut api, 9090, "uid-rev2").await;
    let s = &status["status"];
    assert_eq!(s["desiredVersion"], version_of(&spec(9090)));
    assert_eq!(
        s["publishedVersion"],
        version_of(&spec(8080)),
        "still serving the old one until the new revision is published"
    );
    assert_eq!(condition(s, "CacheOutOfSync")["reason"], "PublishPending");
    assert_eq!(s["cacheState"], "InSync");
    let order: Vec<&str> = s["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["version"].as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        [version_of(&spec(8080)), version_of(&spec(9090))],
        "oldest first"
    );

    // The new revision is elected and served; the old one steps down.
    let new =
        reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(9090))).await;
    assert_eq!(new["status"]["published"], true);
    assert_ne!(listener_version(&world), old_listeners);
    // The old one is neither elected nor served: it steps down without resolving
    // anything (not even the elected spec), now and whenever a sibling's status
    // write reconciles it again.
    let resolved = world.shared.resolutions();
    let old =
        reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(8080))).await;
    assert_eq!(old["status"]["published"], false);
    reconcile_quietly(
        &mut api,
        reconcile_revision(
            world.revision(&revision_name(&spec(8080))),
            world.shared.clone(),
        ),
    )
    .await;
    assert_eq!(world.shared.resolutions(), resolved, "no resolution");
    reconcile_quietly(
        &mut api,
        reconcile_revision(
            world.revision(&revision_name(&spec(9090))),
            world.shared.clone(),
        ),
    )
    .await;
    assert_eq!(
        world.shared.resolutions(),
        resolved + 1,
        "the elected one resolves"
    );
    assert_eq!(
        condition(&old["status"], "RevisionPublished")["status"],
        "False"
    );
    assert_eq!(
        listener_version(&world),
        new["status"]["providesVersions"]["listeners"]
    );

    // Going back to the first spec moves its revision to the top (no new object).
    let mut ec = to_json(world.config("kuard").valid().unwrap());
    ec["spec"] = spec(8080);
    let obj = world.put_config(&ec);
    let name = revision_name(&spec(8080));
    let (result, touched) = run(reconcile_envoyconfig(obj, world.shared.clone()), async {
        let got = api
            .expect("PATCH", &format!("{REVISIONS}/{name}?"), 200, |_| {
                to_json(world.revision(&name).valid().unwrap())
            })
            .await;
        assert_eq!(got.content_type, "application/merge-patch+json");
        expect_config_status(&mut api, &ec).await;
        got
    })
    .await;
    result.unwrap();
    assert!(touched.body["metadata"]["annotations"]["marin3r.3scale.net/applied-at"].is_string());
}

/// Every pod of `kuard` NACKs `version` of listeners `n` times.
fn nack(world: &World, pods: &[&str], version: &str, n: usize) {
    for pod in pods {
        let node = NodeInfo {
            id: "kuard".into(),
            pod_name: pod.to_string(),
        };
        world
            .xds()
            .stats
            .stream_opened(&node, marin3r_xds::Api::Sotw);
        for _ in 0..n {
            world.xds().stats.record(&[StreamEvent::Nack {
                node_id: "kuard".into(),
                pod_name: pod.to_string(),
                resource_type: ResourceType::Listener,
                version: version.to_string(),
                message: "invalid listener".into(),
            }]);
        }
    }
}

#[tokio::test]
async fn version_rejected_by_every_pod_is_tainted_and_the_envoyconfig_rolls_back() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    in_sync(&mut world, &mut api).await;
    let good_listeners = listener_version(&world);
    change_spec(&mut world, &mut api, 9090, "uid-rev2").await;
    reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(9090))).await;
    reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(8080))).await;
    let bad_listeners = listener_version(&world);

    // One pod rejecting is not enough; the periodic check finds nothing.
    nack(&world, &["kuard-0"], &bad_listeners, 5);
    nack(&world, &["kuard-1"], &bad_listeners, 4);
    assert!(
        rejected_revisions(&world.shared).is_empty(),
        "partial rejection never taints"
    );
    // Every pod at the threshold: the check reconciles the revision, which taints it.
    nack(&world, &["kuard-1"], &bad_listeners, 1);
    let bad = revision_name(&spec(9090));
    assert_eq!(
        rejected_revisions(&world.shared),
        [ObjectRef::new(&bad).within("default")]
    );
    // The taint is fenced: written only on the revision as it was judged (its
    // resourceVersion), so a replica that led on an older view gets 409 instead.
    let judged = to_json(world.revision(&bad).valid().unwrap());
    let (result, got) = run(
        reconcile_revision(world.revision(&bad), world.shared.clone()),
        api.expect(
            "PATCH",
            &format!("{REVISIONS}/{bad}/status{APPLY}"),
            409,
            |_| status_failure(409, "Conflict", "the object has been modified"),
        ),
    )
    .await;
    assert_eq!(
        got.body["metadata"]["resourceVersion"],
        judged["metadata"]["resourceVersion"]
    );
    assert_eq!(got.body["status"]["tainted"], true);
    assert_eq!(
        result.unwrap(),
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(1)),
        "a conflict is looked at again, not an error"
    );
    let tainted = reconcile_revision_with_status(&mut world, &mut api, &bad).await;
    let ts = &tainted["status"];
    assert_eq!(ts["tainted"], true);
    assert_eq!(ts["published"], false);
    assert_eq!(
        condition(ts, "RevisionTainted")["reason"],
        "RejectedByEnvoy"
    );
    assert!(
        condition(ts, "RevisionTainted")["message"]
            .as_str()
            .unwrap()
            .contains(&bad_listeners)
    );
    assert!(rejected_revisions(&world.shared).is_empty());

    // The EnvoyConfig rolls back to the previous revision …
    let status = reconcile_config_with_status(&mut world, &mut api, "kuard").await;
    let s = &status["status"];
    assert_eq!(s["cacheState"], "Rollback");
    assert_eq!(s["desiredVersion"], version_of(&spec(9090)));
    assert_eq!(s["publishedVersion"], version_of(&spec(8080)));
    assert_eq!(condition(s, "CacheOutOfSync")["status"], "True");
    assert_eq!(
        condition(s, "CacheOutOfSync")["reason"],
        "CantPublishDesiredVersion"
    );

    // … which the revision controller serves again.
    let good =
        reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(8080))).await;
    assert_eq!(good["status"]["published"], true);
    assert_eq!(listener_version(&world), good_listeners);

    // The tainted revision stays out, whatever triggers it.
    reconcile_quietly(
        &mut api,
        reconcile_revision(world.revision(&bad), world.shared.clone()),
    )
    .await;
    assert_eq!(listener_version(&world), good_listeners);
}

#[tokio::test]
async fn undecodable_resources_taint_the_revision() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    in_sync(&mut world, &mut api).await;
    let good_listeners = listener_version(&world);
    let mut ec = to_json(world.config("kuard").valid().unwrap());
    let bad_spec = json!({"nodeID": "kuard", "resources": [{"type": "listener", "value": {"name": "x", "bogus": true}}]});
    ec["spec"] = bad_spec.clone();
    let obj = world.put_config(&ec);
    let (result, revision) = run(reconcile_envoyconfig(obj, world.shared.clone()), async {
        let got = api
            .expect("POST", &format!("{REVISIONS}?"), 201, |b| {
                created(b, "uid-bad")
            })
            .await;
        expect_config_status(&mut api, &ec).await;
        created(&got.body, "uid-bad")
    })
    .await;
    result.unwrap();
    world.put_revision(&revision);
    let name = revision["metadata"]["name"].as_str().unwrap().to_string();
    let tainted = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    let c = condition(&tainted["status"], "RevisionTainted");
    assert_eq!(c["reason"], "ResourcesFailedToDecode");
    assert!(c["message"].as_str().unwrap().contains("bogus"), "{c}");
    assert_eq!(
        listener_version(&world),
        good_listeners,
        "the last good config keeps being served"
    );
    let status = reconcile_config_with_status(&mut world, &mut api, "kuard").await;
    assert_eq!(status["status"]["cacheState"], "Rollback");
}

/// A TLS Secret with one of two throwaway certificate/key pairs (`"CERT-1"`,
/// `"CERT-2"`): Envoy, and so the decoder, refuses data that is not PEM.
fn tls_secret(name: &str, cert: &str) -> Value {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let (crt, key) = marin3r_testkit::tls::PEM_PAIRS[if cert == "CERT-1" { 0 } else { 1 }];
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "7"},
        "data": {"tls.crt": b64(crt), "tls.key": b64(key)}
    })
}

#[tokio::test(start_paused = true)]
async fn secret_change_is_republished_without_any_envoyconfig_change() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    world.put_secret(&tls_secret("kuard-tls", "CERT-1"));
    let spec = json!({"nodeID": "kuard", "resources": [{"type": "secret", "generateFromTlsSecret": "kuard-tls"}]});
    let ec = envoyconfig("kuard", spec.clone(), None);
    let (revision, _) = create_revision(&mut world, &mut api, &ec, "uid-rev1").await;
    let name = revision["metadata"]["name"].as_str().unwrap().to_string();
    let first = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    let v1 = world
        .xds()
        .cache
        .get("kuard")
        .unwrap()
        .version(ResourceType::Secret)
        .to_string();
    assert_eq!(first["status"]["providesVersions"]["secrets"], v1);

    // cert-manager renews the certificate: the revision reading it is re-published.
    let renewed = tls_secret("kuard-tls", "CERT-2");
    world.put_secret(&renewed);
    let secret: Secret = serde_json::from_value(renewed).unwrap();
    assert_eq!(
        marin3r_control_plane::kubernetes::secret_readers(&world.shared.groups, &secret),
        [ObjectRef::new(&name).within("default")]
    );
    // Served at once; its status write waits for the window of the first one
    // (re-publications are coalesced), then carries the last version.
    let deferred = reconcile_quietly(
        &mut api,
        reconcile_revision(world.revision(&name), world.shared.clone()),
    )
    .await;
    assert_ne!(
        world
            .xds()
            .cache
            .get("kuard")
            .unwrap()
            .version(ResourceType::Secret),
        v1,
        "served before the status is written"
    );
    assert_eq!(
        deferred,
        kube::runtime::controller::Action::requeue(coalesce::STATUS_WINDOW),
        "looked at again when the window closes"
    );
    tokio::time::advance(coalesce::STATUS_WINDOW).await;
    let second = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    let v2 = world
        .xds()
        .cache
        .get("kuard")
        .unwrap()
        .version(ResourceType::Secret)
        .to_string();
    assert_ne!(v1, v2, "new certificate, new version");
    assert_eq!(second["status"]["providesVersions"]["secrets"], v2);
    assert_eq!(
        second["status"]["lastPublishedAt"],
        first["status"]["lastPublishedAt"]
    );

    // The Secret disappears: the node keeps the last good config; the revision waits.
    world
        .secrets
        .apply_watcher_event(&watcher::Event::Delete(secret));
    let waiting = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    let c = condition(&waiting["status"], "ResourcesInSync");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("DependenciesNotReady"))
    );
    assert!(c["message"].as_str().unwrap().contains("kuard-tls"));
    assert_eq!(
        waiting["status"]["tainted"],
        Value::Null,
        "a missing Secret never taints"
    );
    assert_eq!(
        world
            .xds()
            .cache
            .get("kuard")
            .unwrap()
            .version(ResourceType::Secret),
        v2
    );
    let status = reconcile_config_with_status(&mut world, &mut api, "kuard").await;
    assert_eq!(
        condition(&status["status"], "CacheOutOfSync")["reason"],
        "ResourcesOutOfSync"
    );
}

/// The NACKs are judged against the versions served, not the status, whose
/// re-publications are coalesced: a renewed Secret every pod rejects is tainted before
/// its `providesVersions` is written.
#[tokio::test(start_paused = true)]
async fn a_republication_is_judged_before_its_status_is_written() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    world.put_secret(&tls_secret("kuard-tls", "CERT-1"));
    let spec = json!({"nodeID": "kuard", "resources": [{"type": "secret", "generateFromTlsSecret": "kuard-tls"}]});
    let ec = envoyconfig("kuard", spec, None);
    let (revision, _) = create_revision(&mut world, &mut api, &ec, "uid-rev1").await;
    let name = revision["metadata"]["name"].as_str().unwrap().to_string();
    let first = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    world.put_secret(&tls_secret("kuard-tls", "CERT-2"));
    reconcile_quietly(
        &mut api,
        reconcile_revision(world.revision(&name), world.shared.clone()),
    )
    .await;
    let served = world
        .xds()
        .cache
        .get("kuard")
        .unwrap()
        .version(ResourceType::Secret)
        .to_string();
    assert_ne!(first["status"]["providesVersions"]["secrets"], served);
    for pod in ["kuard-0", "kuard-1"] {
        let node = NodeInfo {
            id: "kuard".into(),
            pod_name: pod.to_string(),
        };
        let stats = &world.xds().stats;
        stats.stream_opened(&node, marin3r_xds::Api::Sotw);
        for _ in 0..5 {
            stats.record(&[StreamEvent::Nack {
                node_id: "kuard".into(),
                pod_name: pod.to_string(),
                resource_type: ResourceType::Secret,
                version: served.clone(),
                message: "bad certificate".into(),
            }]);
        }
    }
    assert_eq!(
        rejected_revisions(&world.shared),
        [ObjectRef::new(&name).within("default")],
        "judged against what is served"
    );
    // The taint is written at once (not coalesced), within the window.
    let tainted = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    assert_eq!(tainted["status"]["tainted"], true);
    assert!(
        condition(&tainted["status"], "RevisionTainted")["message"]
            .as_str()
            .unwrap()
            .contains(&served)
    );
}

#[tokio::test(start_paused = true)]
async fn endpoint_slices_become_a_cluster_load_assignment() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    let slice = |name: &str, ips: &[&str]| {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "kuard"}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}})).collect::<Vec<_>>()
        })
    };
    world.put_slice(&slice("kuard-abc", &["10.0.0.1", "10.0.0.2"]));
    let spec = json!({"nodeID": "kuard", "resources": [{"type": "endpoint", "generateFromEndpointSlices": {
        "clusterName": "kuard", "targetPort": "http",
        "selector": {"matchLabels": {"kubernetes.io/service-name": "kuard"}}
    }}]});
    let (revision, _) = create_revision(
        &mut world,
        &mut api,
        &envoyconfig("kuard", spec, None),
        "uid-rev1",
    )
    .await;
    let name = revision["metadata"]["name"].as_str().unwrap().to_string();
    reconcile_revision_with_status(&mut world, &mut api, &name).await;

    let addresses = |world: &World| -> Vec<(String, u32)> {
        let snapshot = world.xds().cache.get("kuard").unwrap();
        let resource = snapshot
            .resource(ResourceType::Endpoint, "kuard")
            .expect("ClusterLoadAssignment kuard");
        let cla = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
            resource.body.value.as_slice(),
        )
        .unwrap();
        assert_eq!(cla.cluster_name, "kuard");
        cla.endpoints[0]
            .lb_endpoints
            .iter()
            .map(|e| {
                let Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    panic!("endpoint expected")
                };
                let Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(sa)) =
                    ep.address.as_ref().and_then(|a| a.address.as_ref())
                else {
                    panic!("socket address expected")
                };
                let Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                    panic!("port expected")
                };
                (sa.address.clone(), port)
            })
            .collect()
    };
    assert_eq!(
        addresses(&world),
        [
            ("10.0.0.1".to_string(), 8080),
            ("10.0.0.2".to_string(), 8080)
        ]
    );

    // A pod is added behind the Service: the slice changes and the revision follows.
    let scaled = slice("kuard-abc", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let changed = world.put_slice(&scaled);
    assert_eq!(
        marin3r_control_plane::kubernetes::slice_readers(&world.shared.groups, &changed),
        [ObjectRef::new(&name).within("default")]
    );
    // Past the window of the first status write (re-publications are coalesced).
    tokio::time::advance(coalesce::STATUS_WINDOW).await;
    reconcile_revision_with_status(&mut world, &mut api, &name).await;
    assert_eq!(addresses(&world).len(), 3);
}

/// A replica that does not lead writes nothing, whatever the write: every write of the
/// reconcilers goes through the one writer, whose gate skips it. A follower over the
/// leader's caches reconciles an edited EnvoyConfig (create, status), a revision
/// without the finalizer (patch), one without a status (status apply) and a malformed
/// one being deleted (patch): not one request. The writer's every kind of write is
/// skipped too, and reported so.
#[tokio::test]
async fn a_replica_that_does_not_lead_writes_nothing_through_the_one_writer() {
    use marin3r_control_plane::kubernetes::writer::Written;
    let (client, mut api) = mock_client();
    let mut world = World::new(client.clone(), 5);
    in_sync(&mut world, &mut api).await;
    let follower = Arc::new(
        Shared::new(
            client,
            world.shared.configs.clone(),
            world.shared.revisions.clone(),
            world.shared.secrets.clone(),
            marin3r_control_plane::kubernetes::SliceIndex::new(),
            marin3r_control_plane::Context::new(marin3r_xds::SharedStats::new()),
            5,
        )
        .with_groups(world.shared.groups.clone())
        .with_leadership(marin3r_kube::lease::Leadership::new(Duration::from_secs(
            15,
        ))),
    );
    assert!(!follower.writer.leads());

    // An edit: the leader would create a revision and write the status.
    let mut ec = to_json(world.config("kuard").valid().unwrap());
    ec["spec"] = spec(9090);
    ec["metadata"]["generation"] = json!(2);
    let obj = world.put_config(&ec);
    reconcile_quietly(&mut api, reconcile_envoyconfig(obj, follower.clone())).await;

    let name = revision_name(&spec(8080));
    let published = to_json(world.revision(&name).valid().unwrap());
    // No status: the leader would apply one (the follower serves it all the same).
    let mut bare = published.clone();
    bare.as_object_mut().unwrap().remove("status");
    let obj = world.put_revision(&bare);
    reconcile_quietly(&mut api, reconcile_revision(obj, follower.clone())).await;
    assert!(
        follower.xds.cache.get("kuard").is_some(),
        "a follower serves"
    );
    // No finalizer: the leader would add it.
    let mut unfinalized = published.clone();
    unfinalized["metadata"]["finalizers"] = json!([]);
    let obj = world.put_revision(&unfinalized);
    reconcile_quietly(&mut api, reconcile_revision(obj, follower.clone())).await;
    // Malformed and being deleted: the leader would remove its finalizer.
    let mut malformed = published.clone();
    malformed["spec"]["nodeID"] = json!(["not", "a", "string"]);
    malformed["metadata"]["deletionTimestamp"] = json!("2025-01-02T00:00:00Z");
    let obj = world.put_revision(&malformed);
    assert!(matches!(obj.as_ref(), Lenient::Malformed { .. }));
    reconcile_quietly(&mut api, reconcile_revision(obj, follower.clone())).await;

    // The writer itself: every kind of write is skipped and reported so.
    let w = &follower.writer;
    let revision: EnvoyConfigRevision = serde_json::from_value(published).unwrap();
    let written = reconcile_quietly(&mut api, async {
        Ok::<_, kube::Error>([
            w.create("default", &revision).await?,
            w.merge_patch::<EnvoyConfigRevision>("default", &name, &json!({}))
                .await?,
            w.delete::<EnvoyConfigRevision>("default", &name).await?,
            w.apply_status::<EnvoyConfigRevision>("default", &name, None, &json!({}))
                .await?,
        ])
    })
    .await;
    assert_eq!(written, [Written::Skipped; 4]);
}

#[tokio::test]
async fn malformed_envoyconfig_is_logged_and_skipped() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    let bad = envoyconfig("broken", json!({"nodeID": ["not", "a", "string"]}), None);
    let obj = world.put_config(&bad);
    assert!(matches!(obj.as_ref(), Lenient::Malformed { .. }));
    reconcile_quietly(&mut api, reconcile_envoyconfig(obj, world.shared.clone())).await;
    // The other EnvoyConfigs are reconciled as usual.
    create_revision(
        &mut world,
        &mut api,
        &envoyconfig("kuard", spec(8080), None),
        "uid-rev1",
    )
    .await;
    reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(8080))).await;
    assert!(world.xds().cache.get("kuard").is_some());
}

#[tokio::test]
async fn a_list_with_a_malformed_envoyconfig_still_fills_the_cache() {
    use futures::StreamExt as _;
    let (client, mut api) = mock_client();
    let list = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigList",
        "metadata": {"resourceVersion": "300"},
        "items": [
            envoyconfig("broken", json!({"nodeID": 1}), None),
            envoyconfig("kuard", spec(8080), None),
        ]
    });
    let api_configs: kube::Api<Lenient<EnvoyConfig>> = kube::Api::namespaced(client, "default");
    // Init, two InitApply and InitDone; the watch that would follow is not awaited.
    let events = watcher(api_configs, watcher::Config::default())
        .take(4)
        .collect::<Vec<_>>();
    let (events, _) = run(
        events,
        api.expect("GET", &format!("{CONFIGS}?&limit=500"), 200, |_| {
            list.clone()
        }),
    )
    .await;
    let names: Vec<String> = events
        .into_iter()
        .filter_map(|e| match e.unwrap() {
            watcher::Event::InitApply(o) => Some(match o {
                Lenient::Valid(ec) => format!("valid {}", ec.metadata.name.unwrap()),
                Lenient::Malformed { metadata, .. } => {
                    format!("malformed {}", metadata.name.unwrap())
                }
            }),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["malformed broken", "valid kuard"]);
}

#[tokio::test]
async fn deleting_the_envoyconfig_forgets_the_node_once_its_revision_is_finalized() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    in_sync(&mut world, &mut api).await;
    let name = revision_name(&spec(8080));
    // The EnvoyConfig is gone; the garbage collector deletes the revision, whose
    // finalizer drops the node from the cache.
    let ec = world.config("kuard");
    world
        .configs
        .apply_watcher_event(&watcher::Event::Delete(ec.as_ref().clone()));
    let mut revision = to_json(world.revision(&name).valid().unwrap());
    revision["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:10:00Z");
    let obj = world.put_revision(&revision);
    let (result, ()) = run(reconcile_revision(obj, world.shared.clone()), async {
        api.expect("GET", &format!("{CONFIGS}/kuard"), 404, |_| {
            status_failure(404, "NotFound", "envoyconfigs \"kuard\" not found")
        })
        .await;
        let got = api
            .expect("PATCH", &format!("{REVISIONS}/{name}?"), 200, |_| {
                revision.clone()
            })
            .await;
        assert_eq!(got.content_type, "application/merge-patch+json");
        assert_eq!(
            got.body,
            json!({"metadata": {"resourceVersion": "200", "finalizers": []}})
        );
    })
    .await;
    result.unwrap();
    assert!(world.xds().cache.get("kuard").is_none(), "node forgotten");
}

#[tokio::test]
async fn a_revision_without_the_finalizer_gets_it_first() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    let ec = envoyconfig("kuard", spec(8080), None);
    let (mut revision, _) = create_revision(&mut world, &mut api, &ec, "uid-rev1").await;
    revision["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("finalizers");
    let obj = world.put_revision(&revision);
    let name = revision_name(&spec(8080));
    let (result, ()) = run(reconcile_revision(obj, world.shared.clone()), async {
        let got = api.expect("PATCH", &format!("{REVISIONS}/{name}?"), 200, |_| revision.clone()).await;
        assert_eq!(
            got.body,
            json!({"metadata": {"resourceVersion": "200", "finalizers": ["finalizer.marin3r.3scale.net"]}})
        );
    })
    .await;
    result.unwrap();
    assert!(
        world.xds().cache.get("kuard").is_none(),
        "published only once finalized"
    );
}

#[tokio::test]
async fn a_second_envoyconfig_for_the_same_node_is_refused() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    in_sync(&mut world, &mut api).await;
    let served = listener_version(&world);
    // "kuard" sorts before "zeta": the older claim stays.
    let (revision, _) = create_revision(
        &mut world,
        &mut api,
        &envoyconfig("zeta", spec(7070), None),
        "uid-zeta-rev",
    )
    .await;
    let name = revision["metadata"]["name"].as_str().unwrap().to_string();
    let refused = reconcile_revision_with_status(&mut world, &mut api, &name).await;
    let c = condition(&refused["status"], "ResourcesInSync");
    assert_eq!(c["reason"], "NodeIDConflict");
    assert!(c["message"].as_str().unwrap().contains("default/kuard"));
    assert_eq!(listener_version(&world), served);
    let _: &EnvoyConfigRevision = world.revision(&name).valid().unwrap();
}

// ------------------------------------------------------------------- EndpointSlice churn

/// An EnvoyConfig generating the endpoints of cluster `node` from the slices labelled
/// `app=<app>`.
fn eds_spec(node: &str, app: &str) -> Value {
    json!({"nodeID": node, "resources": [{"type": "endpoint", "generateFromEndpointSlices": {
        "clusterName": node, "targetPort": "http",
        "selector": {"matchLabels": {"app": app}}
    }}]})
}

/// An EndpointSlice as the API server sends it.
fn endpoint_slice(name: &str, labels: Value, annotations: Value, rv: &str, ips: &[&str]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": "default", "labels": labels,
            "annotations": annotations, "resourceVersion": rv},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>()
    })
}

/// Revision `i` (the higher, the newer) of EnvoyConfig `ec`, reading the slices `app=<app>`.
fn eds_revision(ec: &str, i: usize, app: &str) -> Value {
    let mut spec = eds_spec(ec, app);
    spec["version"] = json!(format!("v{i}"));
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigRevision",
        "metadata": {
            "name": format!("{ec}-r{i}"), "namespace": "default", "uid": format!("{ec}-r{i}"),
            "creationTimestamp": format!("2025-01-01T00:00:{i:02}Z"),
            "ownerReferences": [{"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                "name": ec, "uid": format!("uid-{ec}"), "controller": true}]
        },
        "spec": spec
    })
}

/// One EndpointSlice event reconciles one revision per EnvoyConfig whose selector
/// matches its old or new labels (the elected one, the only one resolved), not every
/// revision of every such EnvoyConfig, and nothing of the others: 100 EnvoyConfigs of 5
/// revisions each, 10 reading the slice.
#[tokio::test]
async fn a_slice_event_reconciles_the_elected_revision_of_each_reader_only() {
    let (client, _api) = mock_client();
    let mut world = World::new(client, 5);
    for e in 0..100 {
        let ec = format!("ec-{e}");
        let app = if e % 10 == 0 {
            "kuard".to_string()
        } else {
            format!("app-{e}")
        };
        for i in 0..5 {
            world.put_revision(&eds_revision(&ec, i, &app));
        }
    }
    let changes = world.put_slice(&endpoint_slice(
        "kuard-a",
        json!({"app": "kuard"}),
        json!({}),
        "1",
        &["10.0.0.1"],
    ));
    let targets = marin3r_control_plane::kubernetes::slice_readers(&world.shared.groups, &changes);
    let mut names: Vec<String> = targets.iter().map(|r| r.name.clone()).collect();
    names.sort();
    let expected: Vec<String> = (0..10).map(|e| format!("ec-{}-r4", e * 10)).collect();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(
        names, expected_sorted,
        "one trigger per reading EnvoyConfig: its elected revision"
    );

    // The slice moves to another Service: the readers of the old labels drop its
    // endpoints, the readers of the new ones get them.
    let changes = world.put_slice(&endpoint_slice(
        "kuard-a",
        json!({"app": "app-55"}),
        json!({}),
        "2",
        &["10.0.0.1"],
    ));
    let targets = marin3r_control_plane::kubernetes::slice_readers(&world.shared.groups, &changes);
    assert_eq!(targets.len(), 11);
    assert!(targets.iter().any(|r| r.name == "ec-55-r4"));
}

/// The ADS side of one Envoy of `node` subscribed to EDS `node` over SotW and Delta:
/// what the ADS shell does (`marin3r_xds::service`), without the transport: each
/// notification of the cache is handed to the state machines, the responses are counted
/// and ACKed.
struct Envoy {
    rx: tokio::sync::watch::Receiver<std::sync::Arc<marin3r_xds::Snapshot>>,
    sotw: marin3r_xds::SotwStream,
    delta: marin3r_xds::DeltaStream,
}

impl Envoy {
    fn connect(world: &World, node: &str) -> Self {
        use envoy_types::pb::envoy::config::core::v3::Node;
        use envoy_types::pb::envoy::service::discovery::v3::{
            DeltaDiscoveryRequest, DiscoveryRequest,
        };
        let mut envoy = Self {
            rx: world.xds().cache.subscribe(node),
            sotw: marin3r_xds::SotwStream::new(marin3r_xds::AdsConfig::default()),
            delta: marin3r_xds::DeltaStream::new(marin3r_xds::AdsConfig::default()),
        };
        let snapshot = envoy.rx.borrow_and_update().clone();
        assert!(!snapshot.is_held(), "{node} is published");
        let node = Node {
            id: node.to_string(),
            ..Node::default()
        };
        let type_url = ResourceType::Endpoint.type_url().to_string();
        let now = std::time::Instant::now();
        let sotw = envoy.sotw.handle_request(
            DiscoveryRequest {
                node: Some(node.clone()),
                type_url: type_url.clone(),
                resource_names: vec![node.id.clone()],
                ..DiscoveryRequest::default()
            },
            &snapshot,
            now,
        );
        let delta = envoy.delta.handle_request(
            DeltaDiscoveryRequest {
                node: Some(node.clone()),
                type_url,
                resource_names_subscribe: vec![node.id.clone()],
                ..DeltaDiscoveryRequest::default()
            },
            &snapshot,
            now,
        );
        assert_eq!((sotw.responses.len(), delta.responses.len()), (1, 1));
        envoy.ack(&snapshot, sotw.responses, delta.responses);
        envoy
    }

    fn ack(
        &mut self,
        snapshot: &marin3r_xds::Snapshot,
        sotw: Vec<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
        delta: Vec<envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse>,
    ) {
        use envoy_types::pb::envoy::service::discovery::v3::{
            DeltaDiscoveryRequest, DiscoveryRequest,
        };
        let now = std::time::Instant::now();
        for r in sotw {
            let node = self.sotw.node().map(|n| n.id.clone()).unwrap_or_default();
            let ack = DiscoveryRequest {
                version_info: r.version_info.clone(),
                response_nonce: r.nonce.clone(),
                type_url: r.type_url.clone(),
                resource_names: vec![node],
                ..DiscoveryRequest::default()
            };
            assert!(
                self.sotw
                    .handle_request(ack, snapshot, now)
                    .responses
                    .is_empty()
            );
        }
        for r in delta {
            let ack = DeltaDiscoveryRequest {
                response_nonce: r.nonce.clone(),
                type_url: r.type_url.clone(),
                ..DeltaDiscoveryRequest::default()
            };
            assert!(
                self.delta
                    .handle_request(ack, snapshot, now)
                    .responses
                    .is_empty()
            );
        }
    }

    /// The responses its two streams receive for what the cache notified since the last
    /// call (ACKed).
    fn received(&mut self) -> usize {
        if !self.rx.has_changed().unwrap_or(false) {
            return 0;
        }
        let snapshot = self.rx.borrow_and_update().clone();
        let now = std::time::Instant::now();
        let sotw = self.sotw.handle_snapshot(&snapshot, now).responses;
        let delta = self.delta.handle_snapshot(&snapshot, now).responses;
        let n = sotw.len() + delta.len();
        self.ack(&snapshot, sotw, delta);
        n
    }
}

/// An EndpointSlice update that leaves the generated ClusterLoadAssignment as it was
/// (an annotation, a label no selector reads, a resourceVersion bump, the endpoints
/// reordered or rebalanced between the slices of the Service) sends nothing to any
/// stream and writes nothing; a real change sends exactly one EDS response per stream
/// of the affected node and nothing to the others.
#[tokio::test(start_paused = true)]
async fn slice_updates_that_change_no_endpoint_push_nothing() {
    let (client, mut api) = mock_client();
    let mut world = World::new(client, 5);
    let kuard = |ann: Value, extra: Value, rv: &str, a: &[&str], b: &[&str]| {
        let mut labels = json!({"app": "kuard"});
        for (k, v) in extra.as_object().unwrap() {
            labels[k] = v.clone();
        }
        [
            endpoint_slice("kuard-a", labels.clone(), ann.clone(), rv, a),
            endpoint_slice("kuard-b", labels, ann, rv, b),
        ]
    };
    for s in kuard(
        json!({}),
        json!({}),
        "1",
        &["10.0.0.1", "10.0.0.2"],
        &["10.0.0.3"],
    ) {
        world.put_slice(&s);
    }
    world.put_slice(&endpoint_slice(
        "other-a",
        json!({"app": "other"}),
        json!({}),
        "1",
        &["10.1.0.1"],
    ));
    let mut names = Vec::new();
    for (ec, app, uid) in [
        ("kuard", "kuard", "uid-rev-kuard"),
        ("other", "other", "uid-rev-other"),
    ] {
        let (revision, _) = create_revision(
            &mut world,
            &mut api,
            &envoyconfig(ec, eds_spec(ec, app), None),
            uid,
        )
        .await;
        let name = revision["metadata"]["name"].as_str().unwrap().to_string();
        reconcile_revision_with_status(&mut world, &mut api, &name).await;
        names.push(name);
    }
    let mut envoys = [
        Envoy::connect(&world, "kuard"),
        Envoy::connect(&world, "other"),
    ];

    let no_ops = [
        (
            "an annotation",
            kuard(
                json!({"note": "x"}),
                json!({}),
                "2",
                &["10.0.0.1", "10.0.0.2"],
                &["10.0.0.3"],
            ),
        ),
        (
            "a label no selector reads",
            kuard(
                json!({"note": "x"}),
                json!({"tier": "web"}),
                "3",
                &["10.0.0.1", "10.0.0.2"],
                &["10.0.0.3"],
            ),
        ),
        (
            "a resourceVersion bump",
            kuard(
                json!({"note": "x"}),
                json!({"tier": "web"}),
                "4",
                &["10.0.0.1", "10.0.0.2"],
                &["10.0.0.3"],
            ),
        ),
        (
            "endpoints reordered",
            kuard(
                json!({"note": "x"}),
                json!({"tier": "web"}),
                "5",
                &["10.0.0.2", "10.0.0.1"],
                &["10.0.0.3"],
            ),
        ),
        (
            "endpoints rebalanced between slices",
            kuard(
                json!({"note": "x"}),
                json!({"tier": "web"}),
                "6",
                &["10.0.0.3", "10.0.0.1"],
                &["10.0.0.2"],
            ),
        ),
    ];
    for (what, slices) in no_ops {
        let mut targets = Vec::new();
        for s in &slices {
            let changes = world.put_slice(s);
            targets.extend(marin3r_control_plane::kubernetes::slice_readers(
                &world.shared.groups,
                &changes,
            ));
        }
        targets.dedup();
        assert_eq!(
            targets,
            [ObjectRef::new(&names[0]).within("default")],
            "{what}: only the reader is reconciled"
        );
        for t in targets {
            reconcile_quietly(
                &mut api,
                reconcile_revision(world.revision(&t.name), world.shared.clone()),
            )
            .await;
        }
        let received: Vec<usize> = envoys.iter_mut().map(Envoy::received).collect();
        assert_eq!(received, [0, 0], "{what}: nothing is pushed");
    }

    // A pod added behind the Service: one EDS response per stream of kuard (SotW, Delta).
    world.put_slice(&endpoint_slice(
        "kuard-b",
        json!({"app": "kuard", "tier": "web"}),
        json!({"note": "x"}),
        "7",
        &["10.0.0.2", "10.0.0.4"],
    ));
    // Past the window of the first status write (re-publications are coalesced).
    tokio::time::advance(coalesce::STATUS_WINDOW).await;
    reconcile_revision_with_status(&mut world, &mut api, &names[0]).await;
    let received: Vec<usize> = envoys.iter_mut().map(Envoy::received).collect();
    assert_eq!(received, [2, 0]);
}

/// 100 EnvoyConfigs created, published and served to an Envoy that answers and leaves,
/// then deleted: once the nodes no live EnvoyConfig claims are forgotten (every
/// evaluation tick, on every replica), nothing of them is kept: no snapshot, nothing
/// served, no ACK/NACK count, no `/metrics` series.
#[tokio::test]
async fn envoyconfig_churn_leaves_nothing_behind() {
    use marin3r_xds::{Api, SharedStats, XdsMetrics};
    use prometheus_client::registry::Registry;
    let mut registry = Registry::default();
    let mut xds = marin3r_control_plane::Context::new(SharedStats::with_metrics(
        XdsMetrics::register(&mut registry),
    ));
    xds.revisions = marin3r_control_plane::metrics::RevisionMetrics::register(&mut registry);
    let (client, mut api) = mock_client();
    let mut world = World::with_context(client, 5, xds);
    let text = |registry: &Registry| {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    };
    let baseline = (text(&registry), world.xds().stats.snapshot().footprint());
    let mut names = Vec::new();
    for i in 0..100 {
        let ec = format!("ec-{i}");
        let doc = envoyconfig(&ec, eds_spec(&ec, &ec), None);
        let (revision, _) =
            create_revision(&mut world, &mut api, &doc, &format!("uid-rev-{i}")).await;
        let name = revision["metadata"]["name"].as_str().unwrap().to_string();
        reconcile_revision_with_status(&mut world, &mut api, &name).await;
        names.push(name);
        let version = world
            .xds()
            .cache
            .get(&ec)
            .unwrap()
            .version(ResourceType::Endpoint)
            .to_string();
        let node = NodeInfo {
            id: ec.clone(),
            pod_name: format!("pod-{i}"),
        };
        let stats = &world.xds().stats;
        let id = stats.stream_opened(&node, Api::Sotw);
        stats.record(&[
            StreamEvent::Ack {
                node_id: ec.clone(),
                pod_name: node.pod_name.clone(),
                resource_type: ResourceType::Endpoint,
                version,
            },
            StreamEvent::Nack {
                node_id: ec.clone(),
                pod_name: node.pod_name.clone(),
                resource_type: ResourceType::Cluster,
                version: "v0".into(),
                message: "bad".into(),
            },
        ]);
        stats.stream_closed(&node, Api::Sotw, id);
    }
    assert_eq!(world.xds().cache.node_ids().len(), 100);
    assert_ne!(text(&registry), baseline.0);
    // Deleted: the EnvoyConfigs, and their revisions (garbage collected).
    for (i, name) in names.iter().enumerate() {
        let ec = world.config(&format!("ec-{i}"));
        world
            .configs
            .apply_watcher_event(&watcher::Event::Delete(ec.as_ref().clone()));
        let revision = world.revision(name);
        world.feed_revision(&watcher::Event::Delete(revision.as_ref().clone()));
    }
    marin3r_control_plane::kubernetes::forget_unclaimed_nodes(&world.shared);
    assert!(world.xds().cache.node_ids().is_empty());
    assert!(world.shared.served.snapshot().is_empty());
    assert_eq!(
        (text(&registry), world.xds().stats.snapshot().footprint()),
        baseline
    );
}
