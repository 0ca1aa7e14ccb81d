//! Kubernetes mode controllers against kube-rs' mock API server (no cluster needed):
//! every request the reconcilers make is asserted (method, path and query, body) and
//! answered with what the API server would return; the watch events that follow are
//! played into the reflector stores by hand.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fixtures;
mod kube_mock;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube_mock::*;
use marin3r_control_plane::kubernetes::{
    Lenient, reconcile_envoyconfig, reconcile_revision, rejected_revisions,
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
    let old =
        reconcile_revision_with_status(&mut world, &mut api, &revision_name(&spec(8080))).await;
    assert_eq!(old["status"]["published"], false);
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

#[tokio::test]
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
        marin3r_control_plane::kubernetes::secret_readers(&world.shared.revisions, &secret),
        [ObjectRef::new(&name).within("default")]
    );
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

#[tokio::test]
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
    world.put_slice(&scaled);
    let changed: k8s_openapi::api::discovery::v1::EndpointSlice =
        serde_json::from_value(scaled).unwrap();
    assert_eq!(
        marin3r_control_plane::kubernetes::slice_readers(&world.shared.revisions, &changed),
        [ObjectRef::new(&name).within("default")]
    );
    reconcile_revision_with_status(&mut world, &mut api, &name).await;
    assert_eq!(addresses(&world).len(), 3);
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
