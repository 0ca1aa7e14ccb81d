//! One scenario table of design.md §4, run through both backends with the same inputs:
//! local mode's engine, and the Kubernetes controllers against a stateful mock API server
//! (kube-rs' `tower-test` pattern: every request is answered as the API server would, and
//! what the controllers wrote is played back into the watch caches). After every step both
//! must show the same cache state, desired and published versions, tainted revisions,
//! `CacheOutOfSync` reason and served listener version.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fixtures;
mod kube_mock;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource as _;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube_mock::*;
use marin3r_control_plane::Context;
use marin3r_control_plane::kubernetes::{Lenient, reconcile_envoyconfig, reconcile_revision};
use marin3r_control_plane::local::backend::apply;
use marin3r_control_plane::local::{Engine, Manifests, Options};
use marin3r_envoyconfig::envoyconfig::{SecretData, parse_envoy_config};
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_envoyconfig::manifest::ManifestSecrets;
use marin3r_xds::{Api, NodeInfo, ResourceType, StreamEvent};
use serde_json::{Value, json};

const GROUP: &str = "/apis/marin3r.3scale.net/v1alpha1/namespaces/default";
const THRESHOLD: u64 = 3;
const PODS: [&str; 2] = ["pod-a", "pod-b"];

/// The fixture spec (a cluster, a listener on `port`), with `secret` a TLS secret from
/// the Secret `cert`; `bogus` adds an unknown field (the resources do not decode).
fn spec(port: u64, secret: bool, bogus: bool) -> Value {
    let mut spec = fixtures::spec(port);
    if bogus {
        spec["resources"][0]["value"]["bogus_field"] = json!(1);
    }
    if secret {
        spec["resources"].as_array_mut().unwrap().push(
            json!({"type": "secret", "generateFromTlsSecret": "cert", "blueprint": "tlsCertificate"}),
        );
    }
    spec
}

use fixtures::version_of as version;

/// One input of the scenario.
#[derive(Debug, Clone)]
enum Step {
    /// The EnvoyConfig `kuard` gets this spec.
    Apply(Value),
    /// Every pod NACKs the served listener version `THRESHOLD` times.
    RejectListener,
    /// The Secret `cert` is created (or changed) with this certificate text.
    PutSecret(&'static str),
    DeleteSecret,
    /// A user deletes the revision of this spec (`kubectl delete ecr`).
    DeleteRevision(Value),
}

/// What a user sees after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    cache_state: Option<String>,
    desired: Option<String>,
    published: Option<String>,
    tainted: BTreeSet<String>,
    out_of_sync_reason: Option<String>,
    served_listener: Option<String>,
}

fn served_listener(ctx: &Context) -> Option<String> {
    ctx.cache
        .get("kuard")
        .map(|s| s.version(ResourceType::Listener).to_string())
}

fn reject_listener(ctx: &Context) {
    let Some(listener) = served_listener(ctx) else {
        return;
    };
    for pod in PODS {
        let events: Vec<StreamEvent> = (0..THRESHOLD)
            .map(|_| StreamEvent::Nack {
                node_id: "kuard".into(),
                pod_name: pod.into(),
                resource_type: ResourceType::Listener,
                version: listener.clone(),
                message: "invalid listener".into(),
            })
            .collect();
        ctx.stats.record(&events);
    }
}

fn connect_pods(ctx: &Context) {
    for pod in PODS {
        ctx.stats.stream_opened(
            &NodeInfo {
                id: "kuard".into(),
                pod_name: pod.into(),
            },
            Api::Sotw,
        );
    }
}

// -- local mode -----------------------------------------------------------------------

struct Local {
    engine: Engine,
    ctx: Context,
    spec: Value,
    secret: Option<&'static str>,
    clock: u64,
}

impl Local {
    fn new() -> Self {
        let ctx = Context::new(marin3r_xds::SharedStats::new());
        connect_pods(&ctx);
        Self {
            engine: Engine::new(Options {
                nack_threshold: THRESHOLD,
                state_dir: None,
            }),
            ctx,
            spec: Value::Null,
            secret: None,
            clock: 0,
        }
    }

    fn now(&mut self) -> SystemTime {
        self.clock += 1;
        marin3r_testkit::unix_time(self.clock)
    }

    fn manifests(&self) -> Manifests {
        let configs = if self.spec.is_null() {
            Vec::new()
        } else {
            vec![
                parse_envoy_config(&json!({
                    "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                    "metadata": {"name": "kuard", "namespace": "default"},
                    "spec": self.spec,
                }))
                .unwrap(),
            ]
        };
        let secrets = self
            .secret
            .map(|cert| {
                vec![(
                    Some("default".to_string()),
                    "cert".to_string(),
                    SecretData {
                        type_: "kubernetes.io/tls".into(),
                        data: BTreeMap::from([
                            ("tls.crt".to_string(), pem(cert).0.to_vec()),
                            ("tls.key".to_string(), pem(cert).1.to_vec()),
                        ]),
                    },
                )]
            })
            .unwrap_or_default();
        Manifests {
            configs: configs.into_iter().map(std::sync::Arc::new).collect(),
            secrets: ManifestSecrets(secrets),
            ..Manifests::default()
        }
    }

    fn step(&mut self, step: &Step) {
        let now = self.now();
        match step {
            Step::Apply(spec) => self.spec = spec.clone(),
            Step::RejectListener => {
                reject_listener(&self.ctx);
                let effects = self.engine.evaluate(&self.ctx.stats, now);
                apply(&mut self.engine, effects, &self.ctx);
                return;
            }
            Step::PutSecret(cert) => self.secret = Some(cert),
            Step::DeleteSecret => self.secret = None,
            Step::DeleteRevision(spec) => {
                let (_, effects) = self
                    .engine
                    .remove_revision("default", "kuard", &version(spec), &self.ctx.stats, now)
                    .unwrap();
                apply(&mut self.engine, effects, &self.ctx);
                return;
            }
        }
        let manifests = self.manifests();
        let effects = self.engine.reconcile(&manifests, &self.ctx.stats, now);
        apply(&mut self.engine, effects, &self.ctx);
    }

    fn observe(&self) -> Observed {
        let report = self.engine.report();
        let ec = &report.envoy_configs[0];
        Observed {
            cache_state: ec.cache_state.map(|s| s.to_string()),
            desired: ec.desired_version.clone(),
            published: ec.published_version.clone(),
            tainted: ec
                .revisions
                .iter()
                .filter(|r| r.tainted)
                .map(|r| r.version.clone())
                .collect(),
            out_of_sync_reason: ec
                .conditions
                .iter()
                .find(|c| c.type_ == "CacheOutOfSync")
                .map(|c| c.reason.clone()),
            served_listener: served_listener(&self.ctx),
        }
    }
}

// -- Kubernetes mode ------------------------------------------------------------------

/// The objects the mock API server holds, by (kind plural, name).
type Objects = Arc<Mutex<BTreeMap<(String, String), Value>>>;

/// Answers the controllers' requests like the API server: creates, status applies,
/// merge patches (with finalizer semantics) and deletes change `objects`.
async fn api_server(mut api: ApiServer, objects: Objects) {
    let mut uid = 0;
    while let Some((request, send)) = api.0.next_request().await {
        let got = read(request).await;
        let (path, _) = got.uri.split_once('?').unwrap_or((&got.uri, ""));
        let rest = path
            .strip_prefix(&format!("{GROUP}/"))
            .unwrap_or_else(|| panic!("unexpected request {} {}", got.method, got.uri));
        let parts: Vec<&str> = rest.split('/').collect();
        let mut objects = objects.lock().unwrap();
        let (status, reply) = match (got.method.as_str(), parts.as_slice()) {
            ("POST", [kind]) => {
                uid += 1;
                let obj = created(&got.body, &format!("uid-{kind}-{uid}"));
                let name = obj["metadata"]["name"].as_str().unwrap().to_string();
                match objects.entry((kind.to_string(), name)) {
                    std::collections::btree_map::Entry::Occupied(_) => {
                        (409, status_failure(409, "AlreadyExists", "already exists"))
                    }
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(obj.clone());
                        (201, obj)
                    }
                }
            }
            ("PATCH", [kind, name, "status"]) => {
                let key = (kind.to_string(), name.to_string());
                let obj = with_status(&objects[&key], &got.body);
                objects.insert(key, obj.clone());
                (200, obj)
            }
            ("PATCH", [kind, name]) => {
                let key = (kind.to_string(), name.to_string());
                let mut obj = objects[&key].clone();
                merge(&mut obj, &got.body);
                let finalizers_left = obj["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if obj["metadata"]["deletionTimestamp"].is_string() && !finalizers_left {
                    objects.remove(&key);
                } else {
                    objects.insert(key, obj.clone());
                }
                (200, obj)
            }
            ("DELETE", [kind, name]) => {
                let key = (kind.to_string(), name.to_string());
                match objects.get_mut(&key) {
                    Some(obj) => {
                        let has_finalizers = obj["metadata"]["finalizers"]
                            .as_array()
                            .is_some_and(|f| !f.is_empty());
                        let answer = obj.clone();
                        if has_finalizers {
                            obj["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:10:00Z");
                        } else {
                            objects.remove(&key);
                        }
                        (200, answer)
                    }
                    None => (404, status_failure(404, "NotFound", "not found")),
                }
            }
            ("GET", [kind, name]) => match objects.get(&(kind.to_string(), name.to_string())) {
                Some(obj) => (200, obj.clone()),
                None => (404, status_failure(404, "NotFound", "not found")),
            },
            _ => panic!("unexpected request {} {}", got.method, got.uri),
        };
        send.send_response(json_response(status, &reply));
    }
}

/// RFC 7386 JSON merge patch (what the controllers send for metadata changes).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

struct Kubernetes {
    world: World,
    objects: Objects,
    _server: tokio::task::JoinHandle<()>,
}

impl Kubernetes {
    fn new() -> Self {
        let (client, api) = mock_client();
        let objects = Objects::default();
        let server = tokio::spawn(api_server(api, objects.clone()));
        let world = World::new(client, THRESHOLD);
        connect_pods(world.xds());
        Self {
            world,
            objects,
            _server: server,
        }
    }

    /// Plays the API server's objects into the watch caches (Apply for what exists,
    /// Delete for what is gone).
    fn sync_caches(&mut self) {
        let objects = self.objects.lock().unwrap().clone();
        for ((kind, _), obj) in &objects {
            match kind.as_str() {
                "envoyconfigs" => {
                    self.world.put_config(obj);
                }
                "envoyconfigrevisions" => {
                    self.world.put_revision(obj);
                }
                other => panic!("unexpected kind {other}"),
            }
        }
        for cached in self.world.shared.revisions.state() {
            let name = cached.meta().name.clone().unwrap_or_default();
            if !objects.contains_key(&("envoyconfigrevisions".to_string(), name)) {
                self.world
                    .feed_revision(&watcher::Event::Delete((*cached).clone()));
            }
        }
    }

    /// What the API server holds, to detect when the controllers have settled.
    fn fingerprint(&self) -> String {
        let objects = self.objects.lock().unwrap();
        let served = served_listener(self.world.xds());
        format!("{objects:?}{served:?}")
    }

    /// Runs both reconcilers over every object until nothing changes any more (what
    /// the watch triggers do in a cluster).
    async fn settle(&mut self) {
        for _ in 0..20 {
            let before = self.fingerprint();
            self.sync_caches();
            let _ = reconcile_envoyconfig(self.world.config("kuard"), self.world.shared.clone())
                .await
                .unwrap();
            self.sync_caches();
            let names: Vec<String> = self
                .world
                .shared
                .revisions
                .state()
                .iter()
                .map(|r| r.meta().name.clone().unwrap_or_default())
                .collect();
            for name in names {
                let Some(obj) =
                    self.world.shared.revisions.get(
                        &ObjectRef::<Lenient<EnvoyConfigRevision>>::new(&name).within("default"),
                    )
                else {
                    continue;
                };
                let _ = reconcile_revision(obj, self.world.shared.clone())
                    .await
                    .unwrap();
                self.sync_caches();
            }
            if self.fingerprint() == before {
                return;
            }
        }
        panic!("the controllers did not settle in 20 rounds");
    }

    fn secret(cert: &str) -> Value {
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let (crt, key) = pem(cert);
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "cert", "namespace": "default"},
            "data": {"tls.crt": b64(crt), "tls.key": b64(key)}
        })
    }

    async fn step(&mut self, step: &Step) {
        match step {
            Step::Apply(spec) => {
                let mut objects = self.objects.lock().unwrap();
                let key = ("envoyconfigs".to_string(), "kuard".to_string());
                let mut ec = objects
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| envoyconfig("kuard", spec.clone(), None));
                ec["spec"] = spec.clone();
                objects.insert(key, ec);
            }
            Step::RejectListener => reject_listener(self.world.xds()),
            Step::PutSecret(cert) => self.world.put_secret(&Self::secret(cert)),
            Step::DeleteSecret => {
                let secret: Secret = serde_json::from_value(Self::secret("")).unwrap();
                self.world
                    .secrets
                    .apply_watcher_event(&watcher::Event::Delete(secret));
            }
            Step::DeleteRevision(spec) => {
                let name = format!("kuard-v3-{}", version(spec));
                let mut objects = self.objects.lock().unwrap();
                let obj = objects
                    .get_mut(&("envoyconfigrevisions".to_string(), name))
                    .expect("revision to delete");
                obj["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:10:00Z");
            }
        }
        self.settle().await;
    }

    fn observe(&self) -> Observed {
        let objects = self.objects.lock().unwrap();
        let status = &objects[&("envoyconfigs".to_string(), "kuard".to_string())]["status"];
        let text = |v: &Value| v.as_str().map(str::to_string);
        Observed {
            cache_state: text(&status["cacheState"]),
            desired: text(&status["desiredVersion"]),
            published: text(&status["publishedVersion"]),
            tainted: objects
                .iter()
                .filter(|((kind, _), o)| {
                    kind == "envoyconfigrevisions" && o["status"]["tainted"] == true
                })
                .map(|(_, o)| o["spec"]["version"].as_str().unwrap().to_string())
                .collect(),
            out_of_sync_reason: status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "CacheOutOfSync"))
                .and_then(|c| text(&c["reason"])),
            served_listener: served_listener(self.world.xds()),
        }
    }
}

#[tokio::test]
async fn one_scenario_table_through_both_backends() {
    let a = spec(8080, true, false);
    let b = spec(8081, true, false);
    let c = spec(8082, true, false);
    let broken = spec(8083, false, true);
    // (step, expected cache state, published spec, tainted specs, CacheOutOfSync reason)
    type Row<'a> = (Step, &'a str, Option<&'a Value>, Vec<&'a Value>, &'a str);
    let table: Vec<Row<'_>> = vec![
        (Step::PutSecret("cert-1"), "", None, vec![], ""),
        (
            Step::Apply(a.clone()),
            "InSync",
            Some(&a),
            vec![],
            "DesiredVersionPublished",
        ),
        (
            Step::Apply(b.clone()),
            "InSync",
            Some(&b),
            vec![],
            "DesiredVersionPublished",
        ),
        // Every Envoy rejects b: tainted, rolled back to a.
        (
            Step::RejectListener,
            "Rollback",
            Some(&a),
            vec![&b],
            "CantPublishDesiredVersion",
        ),
        // The Secret goes away: a wait, never a taint; a keeps being served.
        (
            Step::DeleteSecret,
            "Rollback",
            Some(&a),
            vec![&b],
            "CantPublishDesiredVersion",
        ),
        (
            Step::Apply(c.clone()),
            "InSync",
            Some(&a),
            vec![&b],
            "ResourcesOutOfSync",
        ),
        // It comes back: c is published at once.
        (
            Step::PutSecret("cert-2"),
            "InSync",
            Some(&c),
            vec![&b],
            "DesiredVersionPublished",
        ),
        // Resources that do not decode: tainted on the way, c keeps being served.
        (
            Step::Apply(broken.clone()),
            "Rollback",
            Some(&c),
            vec![&b, &broken],
            "CantPublishDesiredVersion",
        ),
        // Re-applying the tainted b: it stays tainted.
        (
            Step::Apply(b.clone()),
            "Rollback",
            Some(&c),
            vec![&b, &broken],
            "CantPublishDesiredVersion",
        ),
        // Deleting the tainted b lets it be tried again, judged on fresh NACKs only.
        (
            Step::DeleteRevision(b.clone()),
            "InSync",
            Some(&b),
            vec![&broken],
            "DesiredVersionPublished",
        ),
        (
            Step::RejectListener,
            "Rollback",
            Some(&c),
            vec![&b, &broken],
            "CantPublishDesiredVersion",
        ),
    ];

    let mut local = Local::new();
    let mut kube = Kubernetes::new();
    for (i, (step, state, published, tainted, reason)) in table.into_iter().enumerate() {
        local.step(&step);
        if local.spec.is_null() {
            // No EnvoyConfig yet: nothing to observe.
            kube.world.put_secret(&Kubernetes::secret("cert-1"));
            continue;
        }
        kube.step(&step).await;
        let (l, k) = (local.observe(), kube.observe());
        let case = format!("step {i} {step:?}");
        assert_eq!(l, k, "{case}: local (left) and Kubernetes (right) disagree");
        assert_eq!(l.cache_state.as_deref(), Some(state), "{case}");
        assert_eq!(l.published, published.map(version), "{case}");
        assert_eq!(
            l.tainted,
            tainted.into_iter().map(version).collect::<BTreeSet<_>>(),
            "{case}"
        );
        assert_eq!(l.out_of_sync_reason.as_deref(), Some(reason), "{case}");
        assert!(l.served_listener.is_some(), "{case}: the node is served");
    }
}

/// The Secret `cert`'s data for a certificate name of the table (`cert-1`, `cert-2`): one
/// of two throwaway certificate/key pairs (Envoy, and so the decoder, refuses data that
/// is not PEM).
fn pem(cert: &str) -> (&'static [u8], &'static [u8]) {
    marin3r_testkit::tls::PEM_PAIRS[if cert == "cert-1" { 0 } else { 1 }]
}
