//! [`FakeApiServer`]: the shared state, the `tower::Service` every `kube::Client` made
//! from it talks to, outages, faults, the request log and the direct (client-less)
//! access tests use for setup and assertions.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::dispatch::{Reply, dispatch};
use super::error::ApiError;
use super::faults::{self, Fault, FaultAction};
use super::kinds::ResourceKind;
use super::log::{Mark, RequestRecord};
use super::portforward::{self, Forward};
use super::request::Call;
use super::store::Store;
use super::watch::{self, WatchSink};
use super::writes::{DeleteOptions, Target};

/// The body of every response (a watch streams it).
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// The error a client sees when the server refuses connections.
pub type ServiceError = Box<dyn std::error::Error + Send + Sync>;

/// How the server (or the network to it) fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outage {
    /// Requests are served.
    #[default]
    None,
    /// New requests are accepted and never answered; open watches go silent, for good
    /// (their connections are dead: clients must time out).
    Hang,
    /// New requests fail at once, as if the connection were refused; open watches end.
    Refuse,
}

/// Everything behind the lock.
#[derive(Default)]
struct State {
    store: Store,
    watches: Vec<WatchSink>,
    /// Watches open when the server hung: never served again.
    hung: Vec<WatchSink>,
    log: Vec<RequestRecord>,
    faults: Vec<Fault>,
    outage: Outage,
    /// Where `portforward` of (namespace, pod, port) leads.
    port_forwards: BTreeMap<(String, String, u16), SocketAddr>,
}

impl State {
    /// Hands the events of the last writes to the open watches.
    fn fan_out(&mut self) {
        let events = self.store.take_unsent();
        self.watches.retain(|w| !w.is_closed());
        self.hung.retain(|w| !w.is_closed());
        for event in &events {
            for watch in &self.watches {
                watch.offer(event);
            }
        }
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An in-memory Kubernetes API server shared by any number of clients.
///
/// Cloning gives another handle to the same server.
#[derive(Clone, Default)]
pub struct FakeApiServer {
    state: Shared,
}

impl FakeApiServer {
    /// A server with the built-in kinds ([`ResourceKind::builtins`]) and no objects.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `kind` too (e.g. a custom resource).
    pub fn register(&self, kind: ResourceKind) {
        lock(&self.state).store.kinds.register(kind);
    }

    /// A client of this server (default namespace `default`). Must be called inside a
    /// tokio runtime (the client spawns its buffer task). It has no liveness bound: under
    /// [`Outage::Hang`] its requests wait for ever. The processes' own client bounds every
    /// request (`marin3r_kube::client::bounded(server.service(), ns)`): tests of what a
    /// process does through a hang use that one.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The `tower::Service` clients talk to.
    pub fn service(&self) -> ApiService {
        ApiService {
            state: self.state.clone(),
        }
    }

    pub fn set_outage(&self, outage: Outage) {
        let mut state = lock(&self.state);
        state.outage = outage;
        match outage {
            Outage::None => {}
            Outage::Hang => {
                let open = std::mem::take(&mut state.watches);
                open.iter().for_each(WatchSink::hang);
                state.hung.extend(open);
            }
            Outage::Refuse => state.watches.clear(),
        }
    }

    pub fn outage(&self) -> Outage {
        lock(&self.state).outage
    }

    /// Stores `object` as it is, without a client (test setup): a create or a replace
    /// by `apiVersion`, `kind`, namespace (`default` if unset) and name. Keeps what the
    /// API would not let a client set (status, managed fields, uid if given); fills in
    /// uid, creationTimestamp and generation if missing. Watches see the change.
    pub fn put(&self, object: Value) -> Result<Value, ApiError> {
        let mut state = lock(&self.state);
        let stored = state.store.put(object, &now());
        state.fan_out();
        stored
    }

    /// The object `name` of `resource` (plural, or `plural.group` where several groups
    /// serve it) in `namespace` ("" for cluster-scoped kinds).
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let state = lock(&self.state);
        let kind = state.store.kinds.by_name(resource)?;
        state.store.get(kind, namespace, name).ok().cloned()
    }

    /// Every object of `resource`, ordered by namespace and name.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        let state = lock(&self.state);
        match state.store.kinds.by_name(resource) {
            Some(kind) => state.store.objects_of(kind, None).cloned().collect(),
            None => Vec::new(),
        }
    }

    /// Deletes as a client's DELETE would (finalizers hold the object, garbage
    /// collection follows).
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let mut state = lock(&self.state);
        let kind = state
            .store
            .kinds
            .by_name(resource)
            .cloned()
            .ok_or_else(|| ApiError::new(404, format!("no resource {resource:?} is registered")))?;
        let target = Target {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
            status: false,
        };
        let deleted = state
            .store
            .delete(&target, &DeleteOptions::default(), &now());
        state.fan_out();
        deleted.map(|(object, _)| object)
    }

    /// The resourceVersion of the last change.
    pub fn resource_version(&self) -> u64 {
        lock(&self.state).store.resource_version()
    }

    /// Keeps only the last `limit` events: watches from older resourceVersions get
    /// `410 Expired` (default: [`DEFAULT_HISTORY_LIMIT`](super::DEFAULT_HISTORY_LIMIT)).
    pub fn set_history_limit(&self, limit: usize) {
        lock(&self.state).store.set_history_limit(limit);
    }

    /// Forgets all events so far (an etcd compaction): a watch from any older
    /// resourceVersion gets `410 Expired`.
    pub fn compact(&self) {
        lock(&self.state).store.compact();
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.state).log.clone()
    }

    /// The current end of the request log.
    pub fn mark(&self) -> Mark {
        Mark(lock(&self.state).log.len())
    }

    /// The requests answered since `mark`.
    pub fn requests_since(&self, mark: Mark) -> Vec<RequestRecord> {
        lock(&self.state)
            .log
            .get(mark.0..)
            .unwrap_or_default()
            .to_vec()
    }

    /// How many write requests (create, update, patch, delete) were answered since
    /// `mark`, whatever their outcome.
    pub fn writes_since(&self, mark: Mark) -> usize {
        let state = lock(&self.state);
        let since = state.log.get(mark.0..).unwrap_or_default();
        since.iter().filter(|r| r.is_write()).count()
    }

    /// Adds a fault (the first fault matching a request applies).
    pub fn inject(&self, fault: Fault) {
        lock(&self.state).faults.push(fault);
    }

    pub fn clear_faults(&self) {
        lock(&self.state).faults.clear();
    }

    /// Sends a bookmark at the current resourceVersion to every open watch that
    /// allows them.
    pub fn send_bookmarks(&self) {
        let state = lock(&self.state);
        let rv = state.store.resource_version();
        state.watches.iter().for_each(|w| w.bookmark(rv));
    }

    /// Makes `portforward` of `port` on the Pod `namespace/pod` lead to `address` (the
    /// Pod's container, e.g. a server of the test on 127.0.0.1). The Pod object must exist
    /// for the request to be served; a port with no address gets an error on its
    /// channel, as an unreachable container does.
    pub fn forward_pod_port(&self, namespace: &str, pod: &str, port: u16, address: SocketAddr) {
        lock(&self.state)
            .port_forwards
            .insert((namespace.to_string(), pod.to_string(), port), address);
    }

    /// How many watches are open (and served).
    pub fn open_watches(&self) -> usize {
        let mut state = lock(&self.state);
        state.watches.retain(|w| !w.is_closed());
        state.watches.len()
    }
}

/// The `tower::Service` behind the clients of a [`FakeApiServer`].
#[derive(Clone)]
pub struct ApiService {
    state: Shared,
}

impl tower::Service<Request<kube::client::Body>> for ApiService {
    type Response = Response<ResponseBody>;
    type Error = ServiceError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        Box::pin(serve(self.state.clone(), request))
    }
}

/// Waits forever if the server hangs; fails if it refuses connections.
async fn gate(state: &Shared) -> Result<(), ServiceError> {
    let outage = lock(state).outage;
    match outage {
        Outage::None => Ok(()),
        Outage::Hang => std::future::pending().await,
        Outage::Refuse => Err(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused (FakeApiServer outage)",
        ))),
    }
}

async fn serve(
    state: Shared,
    request: Request<kube::client::Body>,
) -> Result<Response<ResponseBody>, ServiceError> {
    gate(&state).await?;
    let (parts, body) = request.into_parts();
    let body = body.collect_bytes().await?;
    let call = Call::parse(&parts, body);
    let fault = {
        let mut state = lock(&state);
        faults::take(&mut state.faults, &call.record)
    };
    if let Some(FaultAction::Delay(delay)) = &fault {
        tokio::time::sleep(*delay).await;
        gate(&state).await?;
    }
    if fault.is_none() && is_portforward(&call) {
        return serve_portforward(&state, call, &parts.headers).await;
    }
    let mut state = lock(&state);
    let reply = match fault {
        Some(FaultAction::Fail(error)) => Reply::from(error),
        _ => dispatch(&mut state.store, &call, &now()).unwrap_or_else(Reply::from),
    };
    let (code, body) = match reply {
        Reply::Json(code, value) => (
            code,
            Full::new(Bytes::from(value.to_string())).boxed_unsync(),
        ),
        Reply::Watch(start) => {
            let (sink, stream) = watch::open(start);
            state.watches.extend(sink);
            (200, StreamBody::new(stream).boxed_unsync())
        }
    };
    state.fan_out();
    let mut record = call.record;
    record.code = code;
    state.log.push(record);
    drop(state);
    json_response(code, body)
}

fn json_response(code: u16, body: ResponseBody) -> Result<Response<ResponseBody>, ServiceError> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(Into::into)
}

/// `GET /api/v1/namespaces/<ns>/pods/<name>/portforward`.
fn is_portforward(call: &Call) -> bool {
    call.path.as_ref().is_some_and(|p| {
        p.group.is_empty()
            && p.plural == "pods"
            && p.subresource.as_deref() == Some("portforward")
            && p.namespace.is_some()
    })
}

/// The Pod `portforward` subresource ([`portforward`]): the Pod must exist, the request
/// must be a websocket upgrade naming its ports.
async fn serve_portforward(
    state: &Shared,
    mut call: Call,
    headers: &http::HeaderMap,
) -> Result<Response<ResponseBody>, ServiceError> {
    let namespace = call.record.namespace.clone().unwrap_or_default();
    let pod = call.record.name.clone().unwrap_or_default();
    let found = {
        let state = lock(state);
        let forwards = |ports: Vec<u16>| {
            ports
                .into_iter()
                .map(|port| Forward {
                    port,
                    target: state
                        .port_forwards
                        .get(&(namespace.clone(), pod.clone(), port))
                        .copied(),
                })
                .collect::<Vec<_>>()
        };
        state
            .store
            .kinds
            .by_name("pods")
            .ok_or_else(|| ApiError::new(404, "pods are not served"))
            .and_then(|kind| state.store.get(kind, &namespace, &pod).map(|_| ()))
            .and_then(|()| portforward::ports(call.param("ports")))
            .and_then(|ports| portforward::upgrade_key(headers).map(|key| (key, forwards(ports))))
    };
    let answer = match found {
        Ok((key, forwards)) => portforward::open(headers, key, forwards)
            .await
            .map(|head| Response::from_parts(head, Full::new(Bytes::new()).boxed_unsync())),
        Err(error) => json_response(
            error.code,
            Full::new(Bytes::from(error.to_status().to_string())).boxed_unsync(),
        ),
    };
    call.record.code = answer
        .as_ref()
        .map_or(0, |response| response.status().as_u16());
    lock(state).log.push(call.record);
    answer
}

/// The time now, as the API server writes timestamps (RFC 3339, whole seconds, UTC).
fn now() -> String {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_in_whole_seconds() {
        let now = now();
        assert_eq!(
            (now.len(), now.get(10..11), now.get(19..)),
            (20, Some("T"), Some("Z"))
        );
    }
}
