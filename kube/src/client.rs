//! The Kubernetes client of both processes, with a liveness bound on every request.
//!
//! An API server instance that vanishes behind a load balancer leaves its connections
//! open and silent: a request waits for an answer that never comes, a watch for events
//! that never come, and neither ever ends (kube-rs sets no read timeout). Every client a
//! process uses is therefore built here ([`try_default`], [`bounded`]) with the
//! [`LivenessLayer`]:
//!
//! - a request whose response head has not come within [`RESPONSE_TIMEOUT`] fails;
//! - a response body (a list, a watch) that sends nothing for [`SILENCE`] fails;
//! - every watch ([`crate::watch::watch`]) asks the server to end it after
//!   [`WATCH_TIMEOUT_SECONDS`] (it then sends a bookmark and ends, and the watcher
//!   resumes from that resourceVersion), so a live watch is never silent for
//!   [`SILENCE`]: a silent one is dead.
//!
//! A failed watch is retried by its watcher (from its last resourceVersion, or with a
//! re-list), a failed write by its caller. While a watch is not established — it went
//! silent, or its last attempt failed — its view is stale: the process logs a WARN once
//! (and an INFO when the watch is back), counts it in `marin3r_kube_watches_stale{resource}`
//! and every silent request in `marin3r_kube_silent_requests_total{resource}`
//! ([`register_metrics`]). Serving goes on from the last view; readiness is not
//! affected (an operator alerts on the gauge).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use kube::Client;
use kube::client::{Body, ClientBuilder};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::{Instant, Sleep};

/// The error type of the client's service stack.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a request may wait for its response head (a watch's comes at once).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a response body may send nothing before the connection counts as dead.
pub const SILENCE: Duration = Duration::from_secs(30);
/// The `timeoutSeconds` of every watch: the server ends it (after a bookmark) before
/// [`SILENCE`], so a live watch is never silent that long. Also below kube-runtime's own
/// idle bound (`timeoutSeconds` + 5 s), so the silence is seen here, and reported.
pub const WATCH_TIMEOUT_SECONDS: u32 = 26;

/// The in-cluster config, or the current kubeconfig context outside a cluster, with the
/// [`LivenessLayer`]: the client every long-running process uses.
pub async fn try_default() -> Result<Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&LivenessLayer)
        .build())
}

/// A client over `service` (e.g. a test API server) with the [`LivenessLayer`].
pub fn bounded<S, B>(service: S, default_namespace: &str) -> Client
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    ClientBuilder::new(service, default_namespace.to_string())
        .with_layer(&LivenessLayer)
        .build()
}

/// Bounds every request and response body (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct LivenessLayer;

impl<S> tower::Layer<S> for LivenessLayer {
    type Service = Liveness<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Liveness { inner }
    }
}

/// The service of [`LivenessLayer`].
#[derive(Debug, Clone)]
pub struct Liveness<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<Body>> for Liveness<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<B>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let call = Call::of(request.uri());
        let response = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(RESPONSE_TIMEOUT, response).await {
                Err(_) => Err(silent(call, RESPONSE_TIMEOUT)),
                Ok(Err(e)) => {
                    let e: BoxError = e.into();
                    WATCHES.stale(&call, &e.to_string());
                    Err(e)
                }
                Ok(Ok(response)) => {
                    if response.status().is_success() {
                        WATCHES.fresh(&call);
                    } else {
                        WATCHES.stale(&call, &format!("answered {}", response.status()));
                    }
                    Ok(response.map(|body| BoundedBody {
                        inner: Box::pin(body),
                        silence: Box::pin(tokio::time::sleep(SILENCE)),
                        call: Some(call),
                    }))
                }
            }
        })
    }
}

/// A response body that fails once it has sent nothing for [`SILENCE`].
pub struct BoundedBody<B> {
    inner: Pin<Box<B>>,
    silence: Pin<Box<Sleep>>,
    /// `None` once failed for silence (it then ends).
    call: Option<Call>,
}

impl<B> std::fmt::Debug for BoundedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedBody")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

impl<B> HttpBody for BoundedBody<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(call) = &this.call else {
            return Poll::Ready(None);
        };
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.silence.as_mut().reset(Instant::now() + SILENCE);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                WATCHES.stale(call, &e.to_string());
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.silence.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                match this.call.take() {
                    Some(call) => Poll::Ready(Some(Err(silent(call, SILENCE)))),
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.call.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a request is, for the liveness bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    /// The resource (plural) the path names.
    resource: String,
    /// The path (no query).
    path: String,
    /// For a watch: the path and selectors (what one watcher re-requests).
    watch: Option<String>,
}

impl Call {
    fn of(uri: &http::Uri) -> Self {
        let path = uri.path().to_string();
        let query: Vec<&str> = uri.query().unwrap_or_default().split('&').collect();
        let watch = query.iter().any(|p| *p == "watch=true" || *p == "watch=1");
        let selectors: Vec<&str> = query
            .iter()
            .copied()
            .filter(|p| p.starts_with("labelSelector=") || p.starts_with("fieldSelector="))
            .collect();
        Self {
            resource: resource_of(&path),
            watch: watch.then(|| format!("{path}?{}", selectors.join("&"))),
            path,
        }
    }
}

/// The resource (plural) an API path names: `/api/v1/namespaces/ns/pods/p` → `pods`,
/// `/apis/g/v/leases` → `leases`.
fn resource_of(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        _ => return "other".to_string(),
    };
    let plural = match rest {
        ["namespaces", _, plural, ..] => plural,
        [plural, ..] => plural,
        [] => "other",
    };
    plural.to_string()
}

/// Fails `call` for silence: counted, logged, its watch (if one) stale.
fn silent(call: Call, after: Duration) -> BoxError {
    SILENT
        .get_or_create(&ResourceLabels {
            resource: call.resource.clone(),
        })
        .inc();
    let why = format!("the API server sent nothing for {} s", after.as_secs());
    if call.watch.is_none() {
        tracing::warn!(
            resource = call.resource,
            path = call.path,
            "{why}; the request failed (retried by its caller)"
        );
    }
    WATCHES.stale(&call, &why);
    Box::new(crate::Error::Silent {
        path: call.path,
        after,
    })
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

/// Requests failed for silence, per resource.
static SILENT: LazyLock<Family<ResourceLabels, Counter>> = LazyLock::new(Family::default);
/// The stale watches of the process.
static WATCHES: LazyLock<StaleWatches> = LazyLock::new(StaleWatches::default);

/// The watches whose last attempt failed or went silent, since when; and the gauge
/// that counts them per resource.
#[derive(Default)]
struct StaleWatches {
    since: Mutex<HashMap<String, Instant>>,
    gauge: Family<ResourceLabels, Gauge>,
}

impl StaleWatches {
    fn gauge(&self, call: &Call) -> Gauge {
        self.gauge
            .get_or_create(&ResourceLabels {
                resource: call.resource.clone(),
            })
            .clone()
    }

    /// `call`'s watch (if it is one) failed or went silent.
    fn stale(&self, call: &Call, why: &str) {
        let Some(key) = &call.watch else {
            return;
        };
        let gauge = self.gauge(call);
        let mut since = self.since.lock().unwrap_or_else(PoisonError::into_inner);
        if since.contains_key(key) {
            return;
        }
        since.insert(key.clone(), Instant::now());
        gauge.inc();
        tracing::warn!(
            resource = call.resource,
            watch = key,
            reason = why,
            "watch lost: this view of {} is stale until it is re-established (serving goes on)",
            call.resource
        );
    }

    /// `call`'s watch (if it is one) was answered: established again.
    fn fresh(&self, call: &Call) {
        let Some(key) = &call.watch else {
            return;
        };
        let gauge = self.gauge(call);
        let removed = self
            .since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        if let Some(since) = removed {
            gauge.dec();
            tracing::info!(
                resource = call.resource,
                watch = key,
                stale_seconds = since.elapsed().as_secs_f64(),
                "watch re-established"
            );
        }
    }

    fn is_stale(&self, resource: &str) -> bool {
        self.since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .any(|k| resource_of(k.split('?').next().unwrap_or_default()) == resource)
    }
}

/// Whether a watch of `resource` (plural) of this process is stale now.
pub fn watch_is_stale(resource: &str) -> bool {
    WATCHES.is_stale(resource)
}

/// Registers the liveness series: `marin3r_kube_watches_stale{resource}` (watches not
/// established now: gone silent or failing) and
/// `marin3r_kube_silent_requests_total{resource}` (requests failed for silence).
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    registry.register(
        "marin3r_kube_watches_stale",
        "Watches of the API server not established now (gone silent or failing): the process serves from a stale view of the resource",
        WATCHES.gauge.clone(),
    );
    registry.register(
        "marin3r_kube_silent_requests",
        "API requests failed because the API server sent nothing in time (no response head in 10 s, or no byte of the body for 30 s)",
        SILENT.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_resource() {
        for (path, resource) in [
            ("/api/v1/namespaces/ns/pods/p", "pods"),
            ("/api/v1/pods", "pods"),
            ("/api/v1/namespaces/ns", "namespaces"),
            (
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "leases",
            ),
            (
                "/apis/marin3r.3scale.net/v1alpha1/envoyconfigs",
                "envoyconfigs",
            ),
            ("/version", "other"),
        ] {
            assert_eq!(resource_of(path), resource, "{path}");
        }
    }

    #[test]
    fn a_watch_is_known_by_its_path_and_selectors() {
        let uri: http::Uri =
            "/api/v1/pods?watch=true&labelSelector=a%3Db&resourceVersion=5&timeoutSeconds=26"
                .parse()
                .unwrap();
        let call = Call::of(&uri);
        assert_eq!(call.resource, "pods");
        assert_eq!(
            call.watch.as_deref(),
            Some("/api/v1/pods?labelSelector=a%3Db")
        );
        let list: http::Uri = "/api/v1/pods?labelSelector=a%3Db".parse().unwrap();
        assert_eq!(Call::of(&list).watch, None);
    }
}
