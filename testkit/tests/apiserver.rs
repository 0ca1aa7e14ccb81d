//! The fake API server driven by real kube-rs clients: CRUD and selectors, patches,
//! watches (kube-runtime's watcher and reflector), server-side apply ownership,
//! preconditions, the status subresource, finalizers, garbage collection, two lease
//! managers racing for a Lease, outages, faults, malformed requests, and the Pod
//! `portforward` subresource.
#![cfg(feature = "apiserver")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::core::{PartialObjectMeta, Status};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::LeaseManagerBuilder;
use marin3r_testkit::apiserver::{FakeApiServer, Fault, Outage, ResourceKind, Verb};
use marin3r_testkit::wait_until;
use serde_json::{Value, json};

const GROUP: &str = "marin3r.3scale.net";
const WITHIN: Duration = Duration::from_secs(10);

fn configmap(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "data": {"k": "v"}
    }))
    .unwrap()
}

/// Creates the ConfigMap `name` with `labels` through `api`.
async fn create(api: &Api<ConfigMap>, name: &str, labels: Value) -> ConfigMap {
    api.create(&PostParams::default(), &configmap(name, labels))
        .await
        .unwrap()
}

/// The Status of a failed request.
fn status<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names<K: kube::Resource>(objects: &[K]) -> Vec<String> {
    objects
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

/// The EnvoyConfig custom resource (status subresource), registered on `server`.
fn envoyconfigs(server: &FakeApiServer) -> Api<DynamicObject> {
    server.register(
        ResourceKind::new(GROUP, "v1alpha1", "envoyconfigs", "EnvoyConfig").with_status(),
    );
    let resource = ApiResource {
        group: GROUP.into(),
        version: "v1alpha1".into(),
        api_version: format!("{GROUP}/v1alpha1"),
        kind: "EnvoyConfig".into(),
        plural: "envoyconfigs".into(),
    };
    Api::namespaced_with(server.client(), "default", &resource)
}

fn envoyconfig(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "EnvoyConfig",
        "metadata": {"name": name}, "spec": spec
    })
}

fn apply(manager: &str) -> PatchParams {
    PatchParams::apply(manager)
}

type Events = BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>>;

/// A raw WATCH of `api`'s ConfigMaps from resourceVersion `rv`.
async fn watch(api: &Api<ConfigMap>, params: &WatchParams, rv: &str) -> Events {
    api.watch(params, rv).await.unwrap().boxed()
}

/// The next event (None once the watch ended), failing after a minute without one.
async fn next(events: &mut Events) -> Option<WatchEvent<ConfigMap>> {
    tokio::time::timeout(Duration::from_secs(60), events.try_next())
        .await
        .expect("no event within a minute")
        .unwrap()
}

/// The manager names of `object`'s managed fields owning `.spec.<field>`.
fn owners(object: &DynamicObject, field: &str) -> Vec<String> {
    object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            let fields = e.fields_v1.as_ref().map(|f| &f.0);
            fields.is_some_and(|f| f["f:spec"].get(format!("f:{field}")).is_some())
        })
        .map(|e| e.manager.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn objects_are_created_read_listed_and_deleted() {
    let server = FakeApiServer::new();
    let default: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "other");
    let all: Api<ConfigMap> = Api::all(server.client());
    let pp = PostParams::default();

    let a = create(&default, "a", json!({"app": "envoy"})).await;
    assert!(a.metadata.uid.is_some());
    assert!(a.metadata.creation_timestamp.is_some());
    assert_eq!(a.metadata.generation, Some(1));
    assert_eq!(
        a.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let duplicate = status(default.create(&pp, &configmap("a", json!({}))).await);
    assert_eq!(
        (duplicate.code, duplicate.reason.as_str()),
        (409, "AlreadyExists")
    );
    let mut generated = configmap("", json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let generated = default.create(&pp, &generated).await.unwrap();
    let generated_name = generated.metadata.name.clone().unwrap();
    assert!(generated_name.starts_with("gen-") && generated_name.len() == 9);
    create(&other, "b", json!({"app": "kuard"})).await;

    assert_eq!(default.get("a").await.unwrap().metadata.uid, a.metadata.uid);
    let missing = status(default.get("missing").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));

    let list = default.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&list.items), ["a", generated_name.as_str()]);
    assert_eq!(
        list.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let selections = [
        ("app=envoy", "", vec!["a"]),
        ("app==envoy", "", vec!["a"]),
        ("app!=envoy", "", vec![generated_name.as_str(), "b"]),
        ("app in (envoy, kuard)", "", vec!["a", "b"]),
        ("app notin (envoy)", "", vec![generated_name.as_str(), "b"]),
        ("app", "", vec!["a", "b"]),
        ("!app", "", vec![generated_name.as_str()]),
        ("", "metadata.name=b", vec!["b"]),
        (
            "",
            "metadata.namespace=default,metadata.name!=a",
            vec![generated_name.as_str()],
        ),
    ];
    for (labels, fields, expected) in selections {
        let lp = ListParams::default().labels(labels).fields(fields);
        let listed = all.list(&lp).await.unwrap();
        assert_eq!(
            names(&listed.items),
            expected,
            "labels {labels:?}, fields {fields:?}"
        );
    }

    default.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(default.get("a").await).code, 404);
    assert!(server.get("configmaps", "default", "a").is_none());
    assert!(server.get("configmaps", "other", "b").is_some());
    assert_eq!(server.list("configmaps").len(), 2);
}

#[tokio::test]
async fn merge_strategic_and_json_patches() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&api, "a", json!({"app": "envoy"})).await;
    let pp = PatchParams::default();

    let merged = api
        .patch(
            "a",
            &pp,
            &Patch::Merge(json!({"data": {"k2": "v2", "k": null}})),
        )
        .await
        .unwrap();
    let data = merged.data.unwrap();
    assert_eq!(
        (data.get("k"), data.get("k2")),
        (None, Some(&"v2".to_string()))
    );

    let strategic = api
        .patch(
            "a",
            &pp,
            &Patch::Strategic(json!({"metadata": {"labels": {"app": null, "tier": "edge"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        strategic
            .metadata
            .labels
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        [("tier".to_string(), "edge".to_string())]
    );

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/k2", "value": "v2"},
        {"op": "add", "path": "/data/k3", "value": "v3"}
    ]))
    .unwrap();
    let patched = api.patch("a", &pp, &Patch::Json::<()>(ops)).await.unwrap();
    assert_eq!(
        patched.data.unwrap().get("k3").map(String::as_str),
        Some("v3")
    );
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/k2", "value": "other"}]))
            .unwrap();
    let failed = status(api.patch("a", &pp, &Patch::Json::<()>(failing)).await);
    assert_eq!((failed.code, failed.reason.as_str()), (422, "Invalid"));
    let missing = status(api.patch("missing", &pp, &Patch::Merge(json!({}))).await);
    assert_eq!(missing.code, 404);

    // Custom resources take no strategic merge patches, as CRDs.
    let ecs = envoyconfigs(&server);
    ecs.create(
        &PostParams::default(),
        &serde_json::from_value(envoyconfig("e", json!({"nodeID": "n"}))).unwrap(),
    )
    .await
    .unwrap();
    let refused = status(
        ecs.patch("e", &pp, &Patch::Strategic(json!({"spec": {}})))
            .await,
    );
    assert_eq!(refused.code, 415);
}

#[tokio::test]
async fn watcher_and_reflector_see_creates_updates_and_deletes() {
    let server = FakeApiServer::new();
    let writer: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let watched: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&writer, "before", json!({"app": "envoy"})).await;

    // One reflector lists then watches; one uses streaming lists (sendInitialEvents);
    // one only sees `app=envoy`.
    let mut stores = Vec::new();
    for config in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
        watcher::Config::default().labels("app=envoy"),
    ] {
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(watched.clone(), config));
        tokio::spawn(stream.for_each(|_| async {}));
        reader.wait_until_ready().await.unwrap();
        stores.push(reader);
    }
    let [listed, streamed, selected] = stores.as_slice() else {
        unreachable!()
    };
    let data = |store: &reflector::Store<ConfigMap>, name: &str| {
        store
            .get(&ObjectRef::new(name).within("default"))
            .and_then(|cm| cm.data.clone())
            .and_then(|d| d.get("k").cloned())
    };
    for store in [listed, streamed, selected] {
        assert_eq!(data(store, "before").as_deref(), Some("v"));
    }

    create(&writer, "new", json!({"app": "kuard"})).await;
    writer
        .patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "changed"}})),
        )
        .await
        .unwrap();
    writer
        .delete("new", &DeleteParams::default())
        .await
        .unwrap();
    create(&writer, "last", json!({"app": "envoy"})).await;
    for store in [listed, streamed] {
        wait_until("the reflector has every change", WITHIN, || {
            data(store, "before").as_deref() == Some("changed")
                && data(store, "new").is_none()
                && data(store, "last").is_some()
        })
        .await;
    }

    // An object leaving the selection is deleted from the selected store; coming back,
    // it is added again.
    wait_until("the selected store has `last`", WITHIN, || {
        data(selected, "last").is_some()
    })
    .await;
    for (app, selected_now) in [("other", false), ("envoy", true)] {
        let relabel = json!({"metadata": {"labels": {"app": app}}});
        writer
            .patch("before", &PatchParams::default(), &Patch::Merge(&relabel))
            .await
            .unwrap();
        let what = format!("`before` with app={app} in the selected store: {selected_now}");
        wait_until(what, WITHIN, || {
            data(selected, "before").is_some() == selected_now
        })
        .await;
    }
}

#[tokio::test]
async fn metadata_watches_and_lists_get_partial_object_metadata() {
    let server = FakeApiServer::new();
    let secrets: Api<Secret> = Api::namespaced(server.client(), "default");
    let metadata: Api<PartialObjectMeta<Secret>> = Api::namespaced(server.client(), "default");
    let mut events = watcher(metadata.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "tls", "labels": {"app": "envoy"}},
        "stringData": {"tls.crt": "x"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let seen = tokio::time::timeout(WITHIN, events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(seen.metadata.name.as_deref(), Some("tls"));
    let listed = metadata.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&listed.items), ["tls"]);
    let one = metadata.get("tls").await.unwrap();
    assert_eq!(
        one.types.map(|t| t.kind).as_deref(),
        Some("PartialObjectMetadata")
    );
}

#[tokio::test]
async fn apply_conflicts_on_fields_another_manager_owns_unless_forced() {
    let server = FakeApiServer::new();
    let api = envoyconfigs(&server);
    let spec = |node: &str| envoyconfig("ec", json!({"nodeID": node, "envoyAPI": "v3"}));

    // An apply creates the object; the applier owns what it applied.
    let created = api
        .patch("ec", &apply("manager-a"), &Patch::Apply(spec("n1")))
        .await
        .unwrap();
    assert_eq!(owners(&created, "nodeID"), ["manager-a"]);
    assert_eq!(
        created.metadata.managed_fields.as_ref().unwrap()[0]
            .operation
            .as_deref(),
        Some("Apply")
    );

    // Another manager setting a field to another value conflicts; the same value is
    // shared ownership.
    let conflict = status(
        api.patch("ec", &apply("manager-b"), &Patch::Apply(spec("n2")))
            .await,
    );
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert!(
        conflict.message.contains("\"manager-a\"") && conflict.message.contains(".spec.nodeID"),
        "{}",
        conflict.message
    );
    let shared = api
        .patch("ec", &apply("manager-b"), &Patch::Apply(spec("n1")))
        .await
        .unwrap();
    assert_eq!(owners(&shared, "nodeID"), ["manager-a", "manager-b"]);

    // Force takes the field over.
    let forced = api
        .patch(
            "ec",
            &apply("manager-b").force(),
            &Patch::Apply(envoyconfig("ec", json!({"nodeID": "n2"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["nodeID"], "n2");
    assert_eq!(owners(&forced, "nodeID"), ["manager-b"]);
    let back = status(
        api.patch("ec", &apply("manager-a"), &Patch::Apply(spec("n1")))
            .await,
    );
    assert!(back.message.contains("\"manager-b\""), "{}", back.message);

    // A field its only applier stops applying is removed.
    let dropped = api
        .patch(
            "ec",
            &apply("manager-a"),
            &Patch::Apply(envoyconfig("ec", json!({"serialization": "json"}))),
        )
        .await
        .unwrap();
    assert_eq!(
        dropped.data["spec"],
        json!({"nodeID": "n2", "serialization": "json"})
    );

    // An update takes the fields it changes: the applier now conflicts with it.
    let update = PatchParams {
        field_manager: Some("manager-c".into()),
        ..Default::default()
    };
    api.patch(
        "ec",
        &update,
        &Patch::Merge(json!({"spec": {"serialization": "b64"}})),
    )
    .await
    .unwrap();
    let with_update = status(
        api.patch(
            "ec",
            &apply("manager-a"),
            &Patch::Apply(envoyconfig("ec", json!({"serialization": "json"}))),
        )
        .await,
    );
    assert!(
        with_update.message.contains("\"manager-c\""),
        "{}",
        with_update.message
    );
}

#[tokio::test]
async fn writes_with_a_stale_resource_version_conflict() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let stale = create(&api, "a", json!({})).await;
    let stale_rv = stale.metadata.resource_version.clone().unwrap();
    let pp = PatchParams::default();
    let changed = api
        .patch("a", &pp, &Patch::Merge(json!({"data": {"k": "new"}})))
        .await
        .unwrap();

    let replaced = status(api.replace("a", &PostParams::default(), &stale).await);
    assert_eq!((replaced.code, replaced.reason.as_str()), (409, "Conflict"));
    let rv_patch = json!({"metadata": {"resourceVersion": stale_rv}, "data": {"k": "x"}});
    let merged = status(api.patch("a", &pp, &Patch::Merge(&rv_patch)).await);
    assert_eq!(merged.code, 409);
    let applied_rv = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "a", "resourceVersion": stale_rv}, "data": {"k": "x"}
    });
    let applied = status(
        api.patch("a", &apply("m"), &Patch::Apply(&applied_rv))
            .await,
    );
    assert_eq!(applied.code, 409);

    // With the current version the same writes pass.
    let mut current = changed.clone();
    current.data = Some([("k".to_string(), "replaced".to_string())].into());
    let replaced = api
        .replace("a", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        changed.metadata.resource_version
    );

    // A write that changes nothing stores nothing.
    let rv = server.resource_version();
    api.patch("a", &pp, &Patch::Merge(json!({"data": {"k": "replaced"}})))
        .await
        .unwrap();
    assert_eq!(server.resource_version(), rv);
}

#[tokio::test]
async fn the_status_subresource_separates_status_from_the_rest() {
    let server = FakeApiServer::new();
    let api = envoyconfigs(&server);
    let mut body = envoyconfig("ec", json!({"nodeID": "n1"}));
    body["status"] = json!({"cacheState": "ignored on create"});
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.data.get("status"), None);
    assert_eq!(created.metadata.generation, Some(1));

    let pp = PatchParams::default();
    let both = json!({"spec": {"nodeID": "n2"}, "status": {"cacheState": "InSync"}});
    let status_write = api
        .patch_status("ec", &pp, &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(status_write.data["spec"]["nodeID"], "n1");
    assert_eq!(status_write.data["status"]["cacheState"], "InSync");
    assert_eq!(status_write.metadata.generation, Some(1));

    let main = json!({"spec": {"nodeID": "n2"}, "status": {"cacheState": "Lost"}});
    let main_write = api.patch("ec", &pp, &Patch::Merge(&main)).await.unwrap();
    assert_eq!(main_write.data["spec"]["nodeID"], "n2");
    assert_eq!(main_write.data["status"]["cacheState"], "InSync");
    assert_eq!(main_write.metadata.generation, Some(2));

    let labels = json!({"metadata": {"labels": {"a": "b"}}});
    let labelled = api.patch("ec", &pp, &Patch::Merge(&labels)).await.unwrap();
    assert_eq!(labelled.metadata.generation, Some(2));

    let status_apply = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "EnvoyConfig",
        "metadata": {"name": "ec"}, "status": {"cacheState": "Applied"}
    });
    // The merge patch above made its (unnamed) manager own `.status.cacheState`.
    let conflict = status(
        api.patch_status("ec", &apply("status-writer"), &Patch::Apply(&status_apply))
            .await,
    );
    assert_eq!(conflict.code, 409);
    let applied = api
        .patch_status(
            "ec",
            &apply("status-writer").force(),
            &Patch::Apply(&status_apply),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["status"]["cacheState"], "Applied");
    let entry = applied
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.manager.as_deref() == Some("status-writer"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));

    // Kinds without the subresource have no /status.
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "a", json!({})).await;
    assert_eq!(
        status(cms.patch_status("a", &pp, &Patch::Merge(json!({}))).await).code,
        404
    );
}

#[tokio::test]
async fn finalizers_hold_a_deletion_until_the_last_is_removed() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut held = configmap("held", json!({}));
    held.metadata.finalizers = Some(vec!["test/one".into(), "test/two".into()]);
    let created = api.create(&PostParams::default(), &held).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let mut events = watch(&api, &WatchParams::default(), &rv).await;

    let deleting = api
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(0));
    assert!(api.get("held").await.is_ok());
    let pp = PatchParams::default();
    let one_left = json!({"metadata": {"finalizers": ["test/two"]}});
    api.patch("held", &pp, &Patch::Merge(&one_left))
        .await
        .unwrap();
    assert!(api.get("held").await.is_ok());
    let none_left = json!({"metadata": {"finalizers": null}});
    api.patch("held", &pp, &Patch::Merge(&none_left))
        .await
        .unwrap();
    assert_eq!(status(api.get("held").await).code, 404);

    let mut kinds = Vec::new();
    for _ in 0..3 {
        kinds.push(match next(&mut events).await {
            Some(WatchEvent::Modified(_)) => "MODIFIED",
            Some(WatchEvent::Deleted(_)) => "DELETED",
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(kinds, ["MODIFIED", "MODIFIED", "DELETED"]);

    // Without finalizers, a deletion is immediate.
    create(&api, "free", json!({})).await;
    api.delete("free", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(api.get("free").await).code, 404);
}

#[tokio::test]
async fn objects_whose_owners_are_all_gone_are_collected() {
    let server = FakeApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let pp = PostParams::default();
    let create = |name: &str, owners: Vec<&str>, finalizers: Vec<&str>| {
        let mut cm = configmap(name, json!({}));
        let refs: Vec<Value> = owners
            .iter()
            .map(|uid| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": uid}))
            .collect();
        cm.metadata.owner_references = Some(serde_json::from_value(json!(refs)).unwrap());
        cm.metadata.finalizers = Some(finalizers.into_iter().map(String::from).collect());
        let cms = cms.clone();
        let pp = pp.clone();
        async move { cms.create(&pp, &cm).await.unwrap().metadata.uid.unwrap() }
    };
    let owner = create("owner", vec![], vec![]).await;
    let other = create("other", vec![], vec![]).await;
    let child = create("child", vec![&owner], vec![]).await;
    create("grandchild", vec![&child], vec![]).await;
    create("held", vec![&owner], vec!["test/hold"]).await;
    create("two-owners", vec![&owner, &other], vec![]).await;
    create("unowned", vec![], vec![]).await;

    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    let left = names(&cms.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(left, ["held", "other", "two-owners", "unowned"]);
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    // Orphaning keeps the dependents and drops their reference to the owner.
    let parent = create("parent", vec![], vec![]).await;
    create("kept", vec![&parent], vec![]).await;
    cms.delete("parent", &DeleteParams::orphan()).await.unwrap();
    let kept = cms.get("kept").await.unwrap();
    assert_eq!(kept.metadata.owner_references, None);
}

#[test]
fn the_collection_sees_owner_references_added_or_dropped_by_updates() {
    // Garbage collection looks only at objects with owner references and looks their
    // owners up by uid: both indexes must follow updates, not only creations.
    let server = FakeApiServer::new();
    let cm = |name: &str, owners: &[&str]| {
        let refs: Vec<Value> = owners
            .iter()
            .map(|uid| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": uid}))
            .collect();
        let mut o = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "namespace": "default"}});
        if !refs.is_empty() {
            o["metadata"]["ownerReferences"] = json!(refs);
        }
        o
    };
    let uid = |o: Value| o["metadata"]["uid"].as_str().unwrap().to_string();
    let owner = uid(server.put(cm("owner", &[])).unwrap());
    server.put(cm("adopted", &[])).unwrap();
    server.put(cm("adopted", &[&owner])).unwrap();
    server.put(cm("released", &[&owner])).unwrap();
    server.put(cm("released", &[])).unwrap();
    // An owner replaced under the same name by an object with another uid: its old
    // uid is gone, and the next collection takes its dependents.
    let mut replaced = json!({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "first", "namespace": "default", "uid": "uid-1"}});
    server.put(replaced.clone()).unwrap();
    server.put(cm("of-first", &["uid-1"])).unwrap();
    replaced["metadata"]["uid"] = json!("uid-2");
    server.put(replaced).unwrap();

    server.delete("configmaps", "default", "owner").unwrap();
    let left: Vec<String> = server
        .list("configmaps")
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, ["first", "released"]);
}

#[tokio::test]
async fn two_lease_managers_elect_one_leader_and_hand_over() {
    let server = FakeApiServer::new();
    // Both replicas read the free Lease before either lock lands: the second apply of
    // `spec.holderIdentity` must conflict.
    server.inject(
        Fault::delay(Duration::from_millis(200))
            .verb(Verb::Patch)
            .resource("leases")
            .times(2),
    );
    let manager = |identity: &str| {
        LeaseManagerBuilder::new(server.client(), "leader")
            .with_namespace("default")
            .with_identity(identity)
            .with_duration(2)
            .with_grace(1)
            .build()
    };
    let (a, b) = tokio::join!(manager("a"), manager("b"));
    let (rx_a, task_a) = a.unwrap().watch().await;
    let (rx_b, task_b) = b.unwrap().watch().await;

    wait_until("a leader", WITHIN, || *rx_a.borrow() || *rx_b.borrow()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < deadline {
        assert!(!(*rx_a.borrow() && *rx_b.borrow()), "two leaders");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let conflicts = server
        .requests()
        .iter()
        .filter(|r| r.content_type == "application/apply-patch+yaml" && r.code == 409)
        .count();
    assert!(conflicts >= 1, "the racing apply did not conflict");

    let (leader, follower, mut follower_rx, leader_task) = if *rx_a.borrow() {
        drop(rx_a);
        ("a", "b", rx_b, task_a)
    } else {
        drop(rx_b);
        ("b", "a", rx_a, task_b)
    };
    let holder = || {
        let lease: Lease =
            serde_json::from_value(server.get("leases", "default", "leader").unwrap()).unwrap();
        lease.spec.and_then(|s| s.holder_identity)
    };
    // The leader's receiver is gone: it releases the lock and stops.
    leader_task.await.unwrap().unwrap();
    assert_ne!(holder().as_deref(), Some(leader));
    tokio::time::timeout(WITHIN, async {
        while !*follower_rx.borrow_and_update() {
            follower_rx.changed().await.unwrap();
        }
    })
    .await
    .expect("the follower took over");
    assert_eq!(holder().as_deref(), Some(follower));
}

#[tokio::test(start_paused = true)]
async fn a_hung_server_never_answers_and_recovers() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&api, "a", json!({})).await;
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api.clone(), watcher::Config::default()));
    tokio::spawn(stream.default_backoff().for_each(|_| async {}));
    reader.wait_until_ready().await.unwrap();
    let rv = server.resource_version().to_string();
    let mut old_watch = watch(&api, &WatchParams::default(), &rv).await;

    server.set_outage(Outage::Hang);
    let hung = tokio::time::timeout(Duration::from_secs(60), api.get("a")).await;
    assert!(hung.is_err(), "a request to a hung server was answered");
    server
        .put(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}}))
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(60), old_watch.next())
            .await
            .is_err(),
        "an open watch spoke during the outage"
    );

    server.set_outage(Outage::None);
    assert!(api.get("b").await.is_ok());
    // The watch open during the hang stays dead, past its own timeout.
    assert!(
        tokio::time::timeout(Duration::from_secs(600), old_watch.next())
            .await
            .is_err()
    );
    // The reflector's watcher gives up on its dead watch after its idle timeout and
    // catches up.
    wait_until("the reflector caught up", Duration::from_secs(900), || {
        reader.get(&ObjectRef::new("b").within("default")).is_some()
    })
    .await;
}

#[tokio::test]
async fn a_refusing_server_fails_requests_and_ends_watches() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut events = watch(&api, &WatchParams::default(), "0").await;
    server.set_outage(Outage::Refuse);
    assert!(matches!(api.get("a").await, Err(kube::Error::Service(_))));
    let ended = next(&mut events).await;
    assert!(ended.is_none(), "the watch did not end: {ended:?}");
    server.set_outage(Outage::None);
    create(&api, "a", json!({})).await;
}

#[tokio::test]
async fn watches_from_a_forgotten_resource_version_get_410_expired() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first = create(&api, "a", json!({})).await;
    let first_rv = first.metadata.resource_version.unwrap();
    create(&api, "b", json!({})).await;

    // Kept history: the events after `first_rv` are replayed.
    let all = WatchParams::default();
    let added = next(&mut watch(&api, &all, &first_rv).await).await;
    assert!(
        matches!(added, Some(WatchEvent::Added(cm)) if cm.metadata.name.as_deref() == Some("b"))
    );

    server.compact();
    let mut expired = watch(&api, &all, &first_rv).await;
    match next(&mut expired).await {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    assert!(next(&mut expired).await.is_none());

    // A watch from the current version works, and so does a watcher starting over.
    let current = server.resource_version().to_string();
    let mut live = watch(&api, &all, &current).await;
    create(&api, "c", json!({})).await;
    assert!(matches!(next(&mut live).await, Some(WatchEvent::Added(_))));
    let objects: Vec<ConfigMap> = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .take(3)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(names(&objects), ["a", "b", "c"]);

    // A history limit expires older versions the same way: only the last event is
    // kept.
    server.set_history_limit(1);
    let rv = server.resource_version();
    let watch_from = async |from: u64| next(&mut watch(&api, &all, &from.to_string()).await).await;
    assert!(matches!(watch_from(rv - 2).await, Some(WatchEvent::Error(s)) if s.code == 410));
    assert!(matches!(
        watch_from(rv - 1).await,
        Some(WatchEvent::Added(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn watches_end_at_their_timeout_after_a_bookmark() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let selected = WatchParams::default().labels("app=envoy").timeout(30);
    let started = tokio::time::Instant::now();
    let mut events = watch(&api, &selected, "0").await;
    assert_eq!(server.open_watches(), 1);

    // An object outside the selection sends nothing, but bookmarks move past it.
    create(&api, "other", json!({"app": "kuard"})).await;
    server.send_bookmarks();
    let rv = server.resource_version().to_string();
    assert!(
        matches!(next(&mut events).await, Some(WatchEvent::Bookmark(b)) if b.metadata.resource_version == rv)
    );
    create(&api, "seen", json!({"app": "envoy"})).await;
    assert!(matches!(
        next(&mut events).await,
        Some(WatchEvent::Added(_))
    ));
    create(&api, "later", json!({"app": "kuard"})).await;
    let rv = server.resource_version().to_string();
    assert!(
        matches!(next(&mut events).await, Some(WatchEvent::Bookmark(b)) if b.metadata.resource_version == rv)
    );
    assert!(next(&mut events).await.is_none());
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    drop(events);
    assert_eq!(server.open_watches(), 0);

    // Without bookmarks, the watch just ends.
    let quiet = WatchParams::default().disable_bookmarks().timeout(5);
    assert!(next(&mut watch(&api, &quiet, &rv).await).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn faults_fail_or_delay_requests_and_the_log_counts_writes() {
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&api, "a", json!({})).await;
    server.inject(
        Fault::fail(500)
            .verb(Verb::Patch)
            .resource("configmaps")
            .times(2),
    );
    let pp = PatchParams::default();
    let patch = Patch::Merge(json!({"data": {"k": "new"}}));
    for _ in 0..2 {
        let failed = status(api.patch("a", &pp, &patch).await);
        assert_eq!(
            (failed.code, failed.reason.as_str()),
            (500, "InternalError")
        );
    }
    api.patch("a", &pp, &patch).await.unwrap();

    server.inject(
        Fault::delay(Duration::from_secs(5))
            .verb(Verb::Get)
            .times(1),
    );
    let started = tokio::time::Instant::now();
    api.get("a").await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(5));

    let mark = server.mark();
    let fm = PatchParams::apply("writer");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}});
    api.patch("b", &fm, &Patch::Apply(&applied)).await.unwrap();
    api.get("b").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(server.writes_since(mark), 2);
    let since = server.requests_since(mark);
    let verbs: Vec<_> = since.iter().map(|r| r.verb.unwrap()).collect();
    assert_eq!(verbs, [Verb::Patch, Verb::Get, Verb::List, Verb::Delete]);
    assert_eq!(since[0].field_manager.as_deref(), Some("writer"));
    assert_eq!(
        (
            since[0].resource.as_str(),
            since[0].name.as_deref(),
            since[0].code
        ),
        ("configmaps", Some("b"), 201)
    );
}

#[tokio::test]
async fn malformed_requests_get_a_status_not_a_panic() {
    let server = FakeApiServer::new();
    let client = server.client();
    let send = |method: &str, uri: &str, content_type: &str, body: &str| {
        let request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(kube::client::Body::from(body.as_bytes().to_vec()))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.send(request).await.unwrap();
            let code = response.status().as_u16();
            let bytes = response.into_body().collect_bytes().await.unwrap();
            let status: Value = serde_json::from_slice(&bytes).unwrap();
            (code, status)
        }
    };
    let json = "application/json";
    let cms = "/api/v1/namespaces/default/configmaps";
    let merge = "application/merge-patch+json";
    send("POST", cms, json, r#"{"metadata":{"name":"a"}}"#).await;
    let cases = [
        ("POST", cms.to_string(), json, "{not json", 400),
        ("POST", cms.to_string(), json, "[1, 2]", 400),
        ("POST", cms.to_string(), json, r#"{"metadata": 7}"#, 400),
        (
            "POST",
            cms.to_string(),
            json,
            r#"{"metadata":{"name":"Bad_Name"}}"#,
            422,
        ),
        ("POST", cms.to_string(), json, r#"{"metadata":{}}"#, 422),
        (
            "POST",
            cms.to_string(),
            json,
            r#"{"kind":"Secret","metadata":{"name":"x"}}"#,
            400,
        ),
        ("GET", format!("{cms}?labelSelector=a+in+b"), json, "", 400),
        (
            "GET",
            format!("{cms}?fieldSelector=spec.x%3Dy"),
            json,
            "",
            400,
        ),
        ("GET", format!("{cms}?labelSelector=%zz"), json, "", 400),
        (
            "GET",
            format!("{cms}?watch=true&resourceVersion=abc"),
            json,
            "",
            400,
        ),
        (
            "GET",
            format!("{cms}?watch=true&timeoutSeconds=x"),
            json,
            "",
            400,
        ),
        ("GET", "/apis/nope.io/v1/things".to_string(), json, "", 404),
        ("GET", "/api/v1/configmaps/a".to_string(), json, "", 404),
        ("GET", "/nonsense".to_string(), json, "", 404),
        ("GET", format!("{cms}/a/scale"), json, "", 404),
        ("GET", format!("{cms}/a/status"), json, "", 404),
        ("PATCH", format!("{cms}/a"), "text/plain", "{}", 415),
        ("PATCH", format!("{cms}/a"), merge, "", 400),
        ("PATCH", format!("{cms}/a"), merge, "7", 400),
        (
            "PATCH",
            format!("{cms}/a"),
            "application/json-patch+json",
            "{}",
            400,
        ),
        (
            "PATCH",
            format!("{cms}/a"),
            "application/apply-patch+yaml",
            "{}",
            400,
        ),
        (
            "PATCH",
            format!("{cms}/a"),
            "application/apply-patch+yaml",
            r#"{"apiVersion":"v1","kind":"ConfigMap"}"#,
            400,
        ),
        (
            "PUT",
            format!("{cms}/a"),
            json,
            r#"{"metadata":{"name":"b"}}"#,
            400,
        ),
        ("DELETE", format!("{cms}/a"), json, "{oops", 400),
        ("POST", format!("{cms}/a"), json, "{}", 404),
        ("OPTIONS", cms.to_string(), json, "", 405),
    ];
    for (method, uri, content_type, body, code) in cases {
        let (answered, status) = send(method, &uri, content_type, body).await;
        assert_eq!(answered, code, "{method} {uri} {body}: {status}");
        assert_eq!(status["kind"], "Status", "{method} {uri}");
        assert_eq!(status["code"], code, "{method} {uri}");
    }
    // The server still serves.
    let (code, cm) = send("GET", &format!("{cms}/a"), json, "").await;
    assert_eq!((code, cm["kind"].as_str()), (200, Some("ConfigMap")));
}

#[tokio::test]
async fn portforward_bridges_a_pods_port_to_the_registered_address() {
    use k8s_openapi::api::core::v1::Pod;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = FakeApiServer::new();
    server
        .put(json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}}))
        .unwrap();
    // The "container": answers what it reads, upper-cased, then closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4];
        socket.read_exact(&mut buf).await.unwrap();
        socket.write_all(&buf.to_ascii_uppercase()).await.unwrap();
    });
    server.forward_pod_port("default", "web", 8080, address);
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");

    let mut forwarder = pods.portforward("web", &[8080]).await.unwrap();
    let mut stream = forwarder.take_stream(8080).unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WITHIN, stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, b"PING");
    let record = server
        .requests()
        .into_iter()
        .find(|r| r.subresource.as_deref() == Some("portforward"))
        .unwrap();
    assert_eq!((record.name.as_deref(), record.code), (Some("web"), 101));

    // A port that leads nowhere: the error channel says so and the stream ends.
    let mut forwarder = pods.portforward("web", &[9090]).await.unwrap();
    let error = forwarder.take_error(9090).unwrap();
    let mut stream = forwarder.take_stream(9090).unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WITHIN, stream.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let error = tokio::time::timeout(WITHIN, error).await.unwrap().unwrap();
    assert!(
        error.starts_with("error forwarding port 9090 to pod"),
        "{error}"
    );

    // No such Pod: 404, as for any missing object.
    match pods.portforward("gone", &[8080]).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
        other => panic!("expected 404, got {:?}", other.map(|_| ())),
    }
}
