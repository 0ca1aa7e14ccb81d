//! kube-rs' mock API server pattern: `tower_test::mock::pair()` → `kube::Client`, and a
//! scenario that asserts each request (method, path and query, body) and answers with
//! real-shaped JSON. Tests await the scenario and the code under test together under a
//! timeout ([`run`]), so a missing request (or an unexpected extra one, which nobody
//! answers) fails the test instead of hanging it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
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
#[derive(Debug, Clone)]
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

/// A request as [`Received`] (its body parsed as JSON; `null` when empty).
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

/// A JSON answer with `status`.
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

/// The JSON form of an object.
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
