//! kube-rs' mock API server pattern: `tower_test::mock::pair()` → `kube::Client`, and a
//! scenario that asserts each request (method, path and query, body) and answers with
//! real-shaped JSON. Tests await the scenario and the code under test together under a
//! timeout, so a missing request (or an unexpected extra one, which nobody answers)
//! fails the test instead of hanging it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use marin3r_control_plane::Context;
use marin3r_control_plane::kubernetes::{Lenient, Shared};
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_xds::SharedStats;
use serde_json::{Value, json};

pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// How long one scenario may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A mock API server handle and the client talking to it.
pub fn mock_client() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer(handle))
}

/// The scripted side of the mock.
pub struct ApiServer(pub Handle);

/// One received request.
#[derive(Debug)]
pub struct Received {
    pub method: String,
    /// Path and query, e.g. `/apis/…/envoyconfigs/kuard/status?&force=true&fieldManager=marin3r`.
    pub uri: String,
    pub content_type: String,
    pub body: Value,
}

impl ApiServer {
    /// Receives the next request, asserts its method and URI, answers `status` with
    /// `reply(body)` and returns what was received.
    pub async fn expect(
        &mut self,
        method: &str,
        uri: &str,
        status: u16,
        reply: impl FnOnce(&Value) -> Value,
    ) -> Received {
        let (request, send) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("expected {method} {uri}, but the client went away"));
        let received = read(request).await;
        assert_eq!(
            (received.method.as_str(), received.uri.as_str()),
            (method, uri),
            "unexpected request (body {})",
            received.body
        );
        let answer = reply(&received.body);
        send.send_response(json_response(status, &answer));
        received
    }
}

pub async fn read(request: Request<Body>) -> Received {
    let method = request.method().to_string();
    let uri = request.uri().to_string();
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Received {
        method,
        uri,
        content_type,
        body,
    }
}

pub fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

/// A `metav1.Status` failure, as the API server sends it.
pub fn status_failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

/// Runs the code under test and the scenario together, failing after [`TIMEOUT`].
pub async fn run<A, B>(test: A, scenario: B) -> (A::Output, B::Output)
where
    A: Future,
    B: Future,
{
    tokio::time::timeout(TIMEOUT, async { tokio::join!(test, scenario) })
        .await
        .expect(
            "scenario timed out: a request was missing, or an unexpected one was never answered",
        )
}

/// The watch caches, with their writers so a test can play the watch events.
pub struct World {
    pub shared: Arc<Shared>,
    pub configs: Writer<Lenient<EnvoyConfig>>,
    pub revisions: Writer<Lenient<EnvoyConfigRevision>>,
    pub secrets: Writer<Secret>,
    pub slices: Writer<EndpointSlice>,
}

impl World {
    pub fn new(client: Client, threshold: u64) -> Self {
        let (config_store, configs) = reflector::store();
        let (revision_store, revisions) = reflector::store();
        let (secret_store, secrets) = reflector::store();
        let (slice_store, slices) = reflector::store();
        let xds = Context::new(SharedStats::new());
        let shared = Arc::new(Shared::new(
            client,
            config_store,
            revision_store,
            secret_store,
            slice_store,
            xds,
            threshold,
        ));
        Self {
            shared,
            configs,
            revisions,
            secrets,
            slices,
        }
    }

    pub fn xds(&self) -> &Context {
        &self.shared.xds
    }

    /// Plays a watch event for an EnvoyConfig (JSON as the API server sends it).
    pub fn put_config(&mut self, doc: &Value) -> Arc<Lenient<EnvoyConfig>> {
        let obj: Lenient<EnvoyConfig> = serde_json::from_value(doc.clone()).unwrap();
        self.configs
            .apply_watcher_event(&watcher::Event::Apply(obj.clone()));
        Arc::new(obj)
    }

    pub fn put_revision(&mut self, doc: &Value) -> Arc<Lenient<EnvoyConfigRevision>> {
        let obj: Lenient<EnvoyConfigRevision> = serde_json::from_value(doc.clone()).unwrap();
        self.revisions
            .apply_watcher_event(&watcher::Event::Apply(obj.clone()));
        Arc::new(obj)
    }

    pub fn put_secret(&mut self, doc: &Value) {
        let obj: Secret = serde_json::from_value(doc.clone()).unwrap();
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(obj));
    }

    pub fn put_slice(&mut self, doc: &Value) {
        let obj: EndpointSlice = serde_json::from_value(doc.clone()).unwrap();
        self.slices.apply_watcher_event(&watcher::Event::Apply(obj));
    }

    pub fn revision(&self, name: &str) -> Arc<Lenient<EnvoyConfigRevision>> {
        self.shared
            .revisions
            .get(&reflector::ObjectRef::new(name).within("default"))
            .unwrap_or_else(|| panic!("revision {name} not in the cache"))
    }

    pub fn config(&self, name: &str) -> Arc<Lenient<EnvoyConfig>> {
        self.shared
            .configs
            .get(&reflector::ObjectRef::new(name).within("default"))
            .unwrap_or_else(|| panic!("EnvoyConfig {name} not in the cache"))
    }
}

/// An EnvoyConfig as the API server returns it.
pub fn envoyconfig(name: &str, spec: Value, status: Option<Value>) -> Value {
    let mut doc = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {
            "name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "generation": 1, "resourceVersion": "100",
            "creationTimestamp": "2025-01-01T00:00:00Z"
        },
        "spec": spec,
    });
    if let Some(status) = status {
        doc["status"] = status;
    }
    doc
}

/// What the API server answers to a create: the object with server-set metadata.
pub fn created(body: &Value, uid: &str) -> Value {
    let mut obj = body.clone();
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["resourceVersion"] = json!("200");
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:01Z");
    obj
}

/// What the API server answers to a status apply on `current`: the object with the
/// applied status.
pub fn with_status(current: &Value, body: &Value) -> Value {
    let mut obj = current.clone();
    obj["status"] = body["status"].clone();
    obj
}

/// The JSON form of a watched object.
pub fn to_json<K: serde::Serialize>(k: &K) -> Value {
    serde_json::to_value(k).unwrap()
}

/// The condition `type_` of a status body.
pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no condition {type_} in {status}"))
}
