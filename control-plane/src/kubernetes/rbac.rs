//! [`RBAC`] (`marin3r_kube::rbac::DISCOVERY_SERVICE`): the Kubernetes API permissions
//! Kubernetes mode needs in the watched namespace, and [`RBAC_HA`]
//! (`DISCOVERY_SERVICE_HA`): what one of several replicas (`--leader-elect`) needs on
//! top, the Lease restricted to `marin3r-<name>-leader` by `resourceNames`. They are the
//! single source of truth for the discovery service's Role
//! (`manifests/discovery-service/role.yaml`, compared with these tables both ways by the
//! `marin3r-manifests` tests, and the Role the operator creates).
//!
//! The unit tests below drive the backend's watches and both reconcilers through every
//! write they make, and a backend with several replicas through its election, its
//! report and its shutdown, against a recording mock API server, and check that the
//! requests need exactly these permissions, on exactly the objects the rules name:
//! nothing missing, nothing extra.

pub use marin3r_kube::rbac::{
    ApiAccess, DISCOVERY_SERVICE as RBAC, DISCOVERY_SERVICE_HA as RBAC_HA, grants,
};

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
    use crate::kubernetes::ha::HaConfig;
    use crate::kubernetes::{
        KubernetesBackend, Lenient, Shared, reconcile_envoyconfig, reconcile_revision,
    };
    use crate::{Context, SharedStats};
    use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
    use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
    use marin3r_kube::rbac::{NamedAccess, allowing, named_grants};

    /// (API group, resource[/subresource], verb).
    use marin3r_testkit::rbac::{Access, is_watch, parse};

    /// One request the mock API server received.
    #[derive(Debug, Clone)]
    struct Recorded {
        method: String,
        uri: String,
        body: Value,
        /// A server-side apply that created the object: the API server authorizes it as
        /// a `create` too.
        creates: bool,
    }

    type Log = Arc<Mutex<Vec<Recorded>>>;

    /// A mock API server that answers every request plausibly and records it: lists are
    /// empty, watches are held open; objects created (POST, or a server-side apply of an
    /// object it does not hold) are kept, read back and patched (merged); a read of
    /// anything else is 404, other writes echo a stub.
    fn recording_client() -> (kube::Client, Log) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let log = Log::default();
        let recorded = log.clone();
        tokio::spawn(async move {
            let mut held_watches = Vec::new();
            let mut objects: std::collections::BTreeMap<(String, String), Value> =
                std::collections::BTreeMap::new();
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let uri = request.uri().to_string();
                let apply = request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|c| c == "application/apply-patch+yaml");
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let target = parse(&uri);
                let key = target
                    .name
                    .clone()
                    .map(|name| (target.resource.clone(), name));
                let held = key.as_ref().and_then(|k| objects.get_mut(k));
                let creates =
                    method == "PATCH" && apply && held.is_none() && target.subresource.is_none();
                let recorded_now = Recorded {
                    method: method.clone(),
                    uri: uri.clone(),
                    body: body.clone(),
                    creates,
                };
                if method == "GET" && target.name.is_none() && is_watch(&uri) {
                    recorded.lock().unwrap().push(recorded_now);
                    held_watches.push(send);
                    continue;
                }
                let (status, answer) = match (method.as_str(), held) {
                    ("GET", _) if target.name.is_none() => (
                        200,
                        json!({"apiVersion": "v1", "kind": "List",
                               "metadata": {"resourceVersion": "1"}, "items": []}),
                    ),
                    ("GET", Some(obj)) => (200, obj.clone()),
                    ("GET", None) => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "reason": "NotFound", "code": 404}),
                    ),
                    ("POST", _) => {
                        let obj = created(&body);
                        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
                        objects.insert((target.resource.clone(), name), obj.clone());
                        (201, obj)
                    }
                    ("PATCH", Some(obj)) => {
                        // A JSON merge patch: enough for the Lease's apply and strategic
                        // merge patches, which set and clear scalars.
                        json_patch::merge(obj, &body);
                        (200, obj.clone())
                    }
                    ("PATCH", None) if creates => {
                        let obj = created(&body);
                        objects.insert(key.clone().unwrap(), obj.clone());
                        (201, obj)
                    }
                    ("DELETE", Some(_)) => (200, objects.remove(&key.clone().unwrap()).unwrap()),
                    (_, None) => (200, stub(&target.resource, target.name.as_deref())),
                    (m, Some(_)) => panic!("unexpected {m} {uri}"),
                };
                recorded.lock().unwrap().push(recorded_now);
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
        let mut out = marin3r_testkit::rbac::accesses(&r.method, &r.uri, &r.body);
        if r.creates {
            let t = parse(&r.uri);
            out.push((t.group, t.resource, "create".to_string()));
        }
        out
    }

    /// The object a request addresses, as RBAC matches `resourceNames`: the name in its
    /// path, or for a list or watch the value of a `metadata.name=` field selector.
    fn object_name(r: &Recorded) -> Option<String> {
        if let Some(name) = parse(&r.uri).name {
            return Some(name);
        }
        let query = r.uri.split_once('?')?.1;
        let selector = query
            .split('&')
            .find_map(|p| p.strip_prefix("fieldSelector="))?;
        let selector = percent_decode(selector);
        selector
            .split(',')
            .find_map(|term| term.strip_prefix("metadata.name="))
            .map(str::to_string)
    }

    fn percent_decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).unwrap()
    }

    /// Checks `requests` against the grants of `tables` for the discovery service
    /// `discoveryservice`: every request is allowed (on the object it addresses), and
    /// every grant allows one of them.
    fn check_exactly<'a>(requests: &[Recorded], tables: impl IntoIterator<Item = &'a ApiAccess>) {
        let granted = named_grants(tables, "discoveryservice");
        let mut used: BTreeSet<NamedAccess> = BTreeSet::new();
        let mut missing: BTreeSet<NamedAccess> = BTreeSet::new();
        for r in requests {
            let name = object_name(r);
            for (i, (group, resource, verb)) in accesses(r).into_iter().enumerate() {
                // The owner's finalizers (after the request's own access) are not the
                // object the request names.
                let name = if i == 0 { name.as_deref() } else { None };
                match allowing(&granted, (&group, &resource, &verb), name) {
                    Some(grant) => {
                        used.insert(grant.clone());
                    }
                    None => {
                        missing.insert((group, resource, verb, name.map(str::to_string)));
                    }
                }
            }
        }
        let extra: Vec<&NamedAccess> = granted.difference(&used).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "RBAC table out of date\nmissing (requested, not allowed): {missing:?}\n\
             extra (granted, never requested): {extra:?}"
        );
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
            self.feed(&watcher::Event::Apply(obj.clone()));
            Arc::new(obj)
        }

        /// A revision watch event: the group index, then the cache (as the backend).
        fn feed(&mut self, event: &watcher::Event<Lenient<EnvoyConfigRevision>>) {
            self.shared.groups.apply(event);
            self.revisions.apply_watcher_event(event);
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
                self.feed(&watcher::Event::Delete(gone));
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
        let shared = Arc::new(Shared::new(
            client,
            config_store,
            revision_store,
            secrets,
            crate::kubernetes::SliceIndex::new(),
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

    /// One of several replicas (`--leader-elect`) from start to shutdown: the watches
    /// (its reports' and its Service's EndpointSlices too), the election (the Lease
    /// created held, watched) until it leads, its report written, then at
    /// shutdown its last report, its deletion and the Lease's release.
    async fn exercise_several_replicas() -> Vec<Recorded> {
        let (client, log) = recording_client();
        let xds = Context::new(SharedStats::new());
        let config = HaConfig::new(
            "discoveryservice",
            "default",
            "ds-0",
            Some("uid".into()),
            15,
        );
        let lease = config.lease.name.clone();
        let mut backend = KubernetesBackend::new(client, "default", 5)
            .with_initial_sync_timeout(Duration::from_secs(5))
            .with_ha(config);
        backend.start(&xds).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(backend.run(
            xds,
            Box::pin(async move {
                let _ = stopped.await;
            }),
        ));
        let seen =
            |log: &Log, what: &dyn Fn(&Recorded) -> bool| log.lock().unwrap().iter().any(what);
        // The Lease created held (it was missing), or taken with a patch.
        let leading = |r: &Recorded| {
            ((r.method == "PATCH" && r.uri.contains(&format!("/leases/{lease}")))
                || (r.method == "POST" && r.uri.contains("/leases")))
                && r.body["spec"]["holderIdentity"] == "ds-0"
        };
        let reported = |r: &Recorded| {
            r.method == "PATCH" && r.uri.contains("/discoveryservicereplicas/ds-0/status")
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while !(seen(&log, &leading) && seen(&log, &reported)) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the replica did not take the Lease and write its report");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("the backend did not stop")
            .unwrap();
        let requests = log.lock().unwrap().clone();
        // The scenario went through every HA request kind.
        let any = |method: &str, path: &str| {
            requests
                .iter()
                .any(|r| r.method == method && r.uri.contains(path))
        };
        assert!(any("POST", "/leases"), "the Lease was never created");
        assert!(
            requests
                .iter()
                .any(|r| is_watch(&r.uri) && object_name(r).as_deref() == Some(lease.as_str())),
            "the Lease was never watched by name"
        );
        assert!(
            requests.iter().any(|r| r.creates),
            "the report was never created by an apply"
        );
        assert!(
            any("DELETE", "/discoveryservicereplicas/ds-0"),
            "no farewell"
        );
        assert!(
            requests.iter().any(|r| is_watch(&r.uri)
                && r.uri.contains("/endpointslices")
                && percent_decode(&r.uri)
                    .contains("kubernetes.io/service-name=marin3r-discoveryservice")),
            "the Service's EndpointSlices were never watched"
        );
        requests
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
        check_exactly(&requests, RBAC);
    }

    #[tokio::test]
    async fn rbac_ha_lists_exactly_what_several_replicas_request() {
        // Every request of the single process (the leader makes them all), plus the
        // election and the reports.
        let mut requests = exercise_kubernetes_mode().await;
        requests.extend(exercise_several_replicas().await);
        check_exactly(&requests, marin3r_kube::rbac::discovery_service(true));
    }

    #[test]
    fn rbac_has_one_entry_per_resource_and_known_verbs() {
        let mut seen = BTreeSet::new();
        for a in marin3r_kube::rbac::discovery_service(true) {
            assert!(
                seen.insert((a.group, a.resource, a.names)),
                "duplicate {a:?}"
            );
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
