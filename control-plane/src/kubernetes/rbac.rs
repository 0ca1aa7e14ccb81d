//! [`RBAC`] (`marin3r_kube::rbac::DISCOVERY_SERVICE`): the Kubernetes API permissions
//! Kubernetes mode needs in the watched namespace, the single source of truth for the
//! discovery service's Role (`manifests/discovery-service/role.yaml`, compared with this
//! table both ways by the `marin3r-manifests` tests, and the Role the operator creates).
//!
//! The unit test below drives the backend's watches and both reconcilers through every
//! write they make against a recording mock API server and checks that the requests
//! need exactly these permissions: nothing missing, nothing extra.

pub use marin3r_kube::rbac::{ApiAccess, DISCOVERY_SERVICE as RBAC, grants};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use http::{Request, Response};
    use kube::client::Body;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher;
    use serde_json::{Value, json};

    use super::*;
    use crate::Backend as _;
    use crate::kubernetes::{
        KubernetesBackend, Lenient, Shared, reconcile_envoyconfig, reconcile_revision,
    };
    use crate::{Context, SharedStats};
    use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
    use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;

    /// (API group, resource[/subresource], verb).
    use marin3r_testkit::rbac::{Access, is_watch, parse};

    /// One request the mock API server received.
    #[derive(Debug, Clone)]
    struct Recorded {
        method: String,
        uri: String,
        body: Value,
    }

    type Log = Arc<Mutex<Vec<Recorded>>>;

    /// A mock API server that answers every request plausibly and records it: lists are
    /// empty, watches are held open, single reads are 404, writes echo an object.
    fn recording_client() -> (kube::Client, Log) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let log = Log::default();
        let recorded = log.clone();
        tokio::spawn(async move {
            let mut held_watches = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let uri = request.uri().to_string();
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                recorded.lock().unwrap().push(Recorded {
                    method: method.clone(),
                    uri: uri.clone(),
                    body: body.clone(),
                });
                let target = parse(&uri);
                let (status, answer) = match (method.as_str(), &target.name) {
                    ("GET", None) if is_watch(&uri) => {
                        held_watches.push(send);
                        continue;
                    }
                    ("GET", None) => (
                        200,
                        json!({"apiVersion": "v1", "kind": "List",
                               "metadata": {"resourceVersion": "1"}, "items": []}),
                    ),
                    ("GET", Some(_)) => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "reason": "NotFound", "code": 404}),
                    ),
                    ("POST", _) => (201, created(&body)),
                    (_, name) => (200, stub(&target.resource, name.as_deref())),
                };
                let response = Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap();
                send.send_response(response);
            }
        });
        (kube::Client::new(service, "default"), log)
    }

    fn accesses(r: &Recorded) -> Vec<Access> {
        marin3r_testkit::rbac::accesses(&r.method, &r.uri, &r.body)
    }

    /// What the API server answers to a create.
    fn created(body: &Value) -> Value {
        let mut obj = body.clone();
        let n = obj["metadata"]["name"].as_str().unwrap_or("x").to_string();
        obj["metadata"]["uid"] = json!(format!("uid-{n}"));
        obj["metadata"]["resourceVersion"] = json!("2");
        obj["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
        obj
    }

    /// A valid object of `resource` for answers whose content the code ignores.
    fn stub(resource: &str, name: Option<&str>) -> Value {
        let metadata = json!({"name": name.unwrap_or("x"), "namespace": "default"});
        match resource {
            "envoyconfigs" => json!({"apiVersion": "marin3r.3scale.net/v1alpha1",
                "kind": "EnvoyConfig", "metadata": metadata, "spec": {"nodeID": "kuard"}}),
            "envoyconfigrevisions" => json!({"apiVersion": "marin3r.3scale.net/v1alpha1",
                "kind": "EnvoyConfigRevision", "metadata": metadata,
                "spec": {"nodeID": "kuard", "version": "1"}}),
            other => panic!("no stub for {other}"),
        }
    }

    fn envoyconfig(port: u16) -> Value {
        json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
            "metadata": {"name": "kuard", "namespace": "default", "uid": "uid-kuard",
                         "generation": 1, "resourceVersion": "1",
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"nodeID": "kuard", "resources": [
                {"type": "cluster", "value": {"name": "kuard", "connect_timeout": "1s", "type": "STATIC"}},
                {"type": "listener", "value": {"name": "http",
                    "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}}}}
            ]}
        })
    }

    struct World {
        shared: Arc<Shared>,
        configs: Writer<Lenient<EnvoyConfig>>,
        revisions: Writer<Lenient<EnvoyConfigRevision>>,
        log: Log,
    }

    impl World {
        fn put_config(&mut self, doc: &Value) -> Arc<Lenient<EnvoyConfig>> {
            let obj: Lenient<EnvoyConfig> = serde_json::from_value(doc.clone()).unwrap();
            self.configs
                .apply_watcher_event(&watcher::Event::Apply(obj.clone()));
            Arc::new(obj)
        }

        fn put_revision(&mut self, doc: &Value) -> Arc<Lenient<EnvoyConfigRevision>> {
            let obj: Lenient<EnvoyConfigRevision> = serde_json::from_value(doc.clone()).unwrap();
            self.revisions
                .apply_watcher_event(&watcher::Event::Apply(obj.clone()));
            Arc::new(obj)
        }

        fn revision(&self, name: &str) -> Value {
            let obj = self
                .shared
                .revisions
                .get(&ObjectRef::new(name).within("default"))
                .unwrap();
            serde_json::to_value(obj.valid().unwrap()).unwrap()
        }

        /// Reconciles the EnvoyConfig with `port` and stores the revisions it created.
        async fn apply(&mut self, port: u16) -> Vec<String> {
            let seen = self.log.lock().unwrap().len();
            let obj = self.put_config(&envoyconfig(port));
            reconcile_envoyconfig(obj, self.shared.clone())
                .await
                .unwrap();
            let new: Vec<Recorded> = self.log.lock().unwrap()[seen..].to_vec();
            let mut names = Vec::new();
            for r in new.iter().filter(|r| r.method == "POST") {
                let revision = created(&r.body);
                names.push(revision["metadata"]["name"].as_str().unwrap().to_string());
                self.put_revision(&revision);
            }
            for r in new.iter().filter(|r| r.method == "DELETE") {
                let name = parse(&r.uri).name.unwrap();
                let gone: Lenient<EnvoyConfigRevision> =
                    serde_json::from_value(self.revision(&name)).unwrap();
                self.revisions
                    .apply_watcher_event(&watcher::Event::Delete(gone));
            }
            names
        }

        async fn reconcile_revision(&mut self, doc: &Value) {
            let obj = self.put_revision(doc);
            reconcile_revision(obj, self.shared.clone()).await.unwrap();
        }
    }

    /// Plays the backend's start and every write path of both reconcilers.
    async fn exercise_kubernetes_mode() -> Vec<Recorded> {
        let (client, log) = recording_client();
        let xds = Context::new(SharedStats::new());

        // The reflectors and the Pod watch: list, then watch, of every kind.
        let mut backend = KubernetesBackend::new(client.clone(), "default", 5)
            .with_initial_sync_timeout(Duration::from_secs(5));
        backend.start(&xds).await.unwrap();
        let watching = |log: &Log| {
            log.lock()
                .unwrap()
                .iter()
                .filter(|r| r.method == "GET" && is_watch(&r.uri))
                .map(|r| parse(&r.uri).resource)
                .collect::<BTreeSet<_>>()
                .len()
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while watching(&log) < 5 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the backend did not watch five kinds");
        drop(backend);

        // The reconcilers, on stores played by hand.
        let (config_store, configs) = reflector::store();
        let (revision_store, revisions) = reflector::store();
        let (secrets, _) = reflector::store();
        let (slices, _) = reflector::store();
        let shared = Arc::new(Shared::new(
            client,
            config_store,
            revision_store,
            secrets,
            slices,
            xds,
            5,
        ));
        let mut world = World {
            shared,
            configs,
            revisions,
            log: log.clone(),
        };
        // Create (with owner reference) and status.
        let first = world.apply(8000).await;
        assert_eq!(first.len(), 1);
        let first = world.revision(&first[0]);
        // Publish: revision status.
        world.reconcile_revision(&first).await;
        // Finalizer added.
        let mut bare = first.clone();
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("finalizers");
        world.reconcile_revision(&bare).await;
        // A second spec, then back to the first: the known revision is touched.
        assert_eq!(world.apply(8001).await.len(), 1);
        assert!(world.apply(8000).await.is_empty());
        world.put_revision(&first);
        // Retention: beyond MAX_REVISIONS the oldest (the first) are deleted.
        for port in 8002..8002 + crate::revisions::MAX_REVISIONS as u16 {
            world.apply(port).await;
        }
        // Finalizer of the deleted first revision: the owner is looked up, the
        // finalizer removed.
        let mut deleting = first;
        deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:10:00Z");
        world.reconcile_revision(&deleting).await;

        log.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn rbac_lists_exactly_what_kubernetes_mode_requests() {
        let requests = exercise_kubernetes_mode().await;
        for (method, what) in [
            ("POST", "create"),
            ("DELETE", "retention delete"),
            ("PATCH", "patch"),
        ] {
            assert!(
                requests.iter().any(|r| r.method == method),
                "the scenario never made a {what} request"
            );
        }
        let used: BTreeSet<Access> = requests.iter().flat_map(accesses).collect();
        let granted: BTreeSet<Access> = grants(RBAC);
        let missing: Vec<&Access> = used.difference(&granted).collect();
        let extra: Vec<&Access> = granted.difference(&used).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "RBAC table out of date\nmissing (requested, not in RBAC): {missing:?}\n\
             extra (in RBAC, never requested): {extra:?}"
        );
    }

    #[test]
    fn rbac_has_one_entry_per_resource_and_known_verbs() {
        let mut seen = BTreeSet::new();
        for a in RBAC {
            assert!(seen.insert((a.group, a.resource)), "duplicate {a:?}");
            assert!(!a.verbs.is_empty());
            for v in a.verbs {
                assert!(
                    [
                        "get",
                        "list",
                        "watch",
                        "create",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection"
                    ]
                    .contains(v),
                    "{v}"
                );
            }
        }
    }
}
