//! Watching: the namespaces a process watches (`WATCH_NAMESPACE`), APIs scoped to them,
//! watch streams and controllers that retry with [`WatchBackoff`], and what every
//! controller does with a failed reconcile ([`error_policy`]) or a leftover result
//! ([`log_result`]), and the reconcile counters a process hands its controllers
//! ([`ReconcileMetrics`]).

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// `WATCH_NAMESPACE` as marin3r reads it: unset or empty is every namespace (an empty
/// list); otherwise a comma-separated list (trimmed, empty entries and duplicates
/// dropped).
pub fn watch_namespaces(value: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for ns in value.unwrap_or_default().split(',').map(str::trim) {
        if !ns.is_empty() && !out.iter().any(|n| n == ns) {
            out.push(ns.to_string());
        }
    }
    out
}

/// `K` in `namespace`, or in every namespace (`None`).
pub fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Watch retry delays: 0.8 s doubling up to 30 s, back to 0.8 s after two minutes
/// without a failure. Unlike kube-runtime's default, it ignores the reset a watcher's
/// `Init` event causes before every list attempt, which against an unreachable or
/// forbidding API server would retry every 0.8 s forever.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    last_failure: Option<Instant>,
}

impl WatchBackoff {
    const MIN: Duration = Duration::from_millis(800);
    const MAX: Duration = Duration::from_secs(30);
    const RESET_AFTER: Duration = Duration::from_secs(120);

    /// The delay before the next attempt after a failure at `now`.
    pub fn delay_at(&mut self, now: Instant) -> Duration {
        if self
            .last_failure
            .is_some_and(|t| now.saturating_duration_since(t) > Self::RESET_AFTER)
        {
            self.next = Self::MIN;
        }
        self.last_failure = Some(now);
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            next: Self::MIN,
            last_failure: None,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.delay_at(Instant::now()))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {}
}

/// The watch of `api` every reflector and controller input uses: retried with
/// [`WatchBackoff`]; the server ends each watch request after
/// [`crate::client::WATCH_TIMEOUT_SECONDS`] (the watcher resumes from its last
/// resourceVersion), so that with the client's liveness bound ([`crate::client`]) a
/// watch that goes silent is detected and re-established within
/// [`crate::client::SILENCE`].
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = config.timeout(crate::client::WATCH_TIMEOUT_SECONDS);
    watcher(api, config).backoff(WatchBackoff::default())
}

/// A controller of the objects of `api` (selected by `config`), watched with
/// [`WatchBackoff`] (kube-runtime's `Controller::new` watches without one).
pub fn controller<K>(api: Api<K>, config: watcher::Config) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let objects = watch(api, config).reflect(writer).applied_objects();
    Controller::for_stream(objects, reader)
}

/// The inputs of a [`controller`] beyond its own objects, watched with [`WatchBackoff`].
pub trait Inputs<K: Resource>: Sized {
    /// Reconciles the owner of each object of `api` that changes (a metadata-only
    /// watch: `scoped::<PartialObjectMeta<Child>>`).
    fn owns_objects<Child>(
        self,
        api: Api<PartialObjectMeta<Child>>,
        config: watcher::Config,
    ) -> Self
    where
        Child:
            Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static;

    /// Reconciles what `mapper` names for each object of `api` that changes.
    fn watches_objects<Other, I>(
        self,
        api: Api<Other>,
        config: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send;
}

impl<K> Inputs<K> for Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn owns_objects<Child>(
        self,
        api: Api<PartialObjectMeta<Child>>,
        config: watcher::Config,
    ) -> Self
    where
        Child:
            Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let children = watch(api, config).touched_objects();
        self.owns_stream(children)
    }

    fn watches_objects<Other, I>(
        self,
        api: Api<Other>,
        config: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_stream(watch(api, config).touched_objects(), mapper)
    }
}

/// How long a failed reconcile waits before it is retried (the controller adds its own
/// backoff for objects that keep failing).
pub const RETRY_FAILED: Duration = Duration::from_secs(10);

/// Retry policy of every controller: log (with the error's source), retry in
/// [`RETRY_FAILED`].
pub fn error_policy<K, E, C>(obj: Arc<K>, error: &E, _: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    E: std::error::Error,
{
    let meta = obj.meta();
    tracing::warn!(
        kind = %K::kind(&()),
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        name = meta.name.as_deref().unwrap_or_default(),
        error = %error,
        source = ?error.source().map(ToString::to_string),
        "reconcile failed; retrying"
    );
    Action::requeue(RETRY_FAILED)
}

/// Labels of [`ReconcileMetrics`]' reconciles.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

/// Labels of [`ReconcileMetrics`]' errors.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

type Counters<L> =
    prometheus_client::metrics::family::Family<L, prometheus_client::metrics::counter::Counter>;

/// The reconcile counters of one process: created and registered by the process
/// ([`ReconcileMetrics::register`]) and handed to every controller it runs, which counts
/// each result through [`log_result`]. A value, not a static: several processes in one
/// test (the in-process HA replicas) each count their own.
#[derive(Debug, Clone, Default)]
pub struct ReconcileMetrics {
    /// Reconciles run, per controller and result (`success`, `error`).
    reconciles: Counters<ReconcileLabels>,
    /// Reconciles that returned an error, per controller.
    errors: Counters<ControllerLabels>,
}

/// What one controller result counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    /// The reconciler returned an action.
    Success,
    /// The reconciler returned an error (retried by [`error_policy`]).
    Error,
    /// No reconcile ran (the object was gone from the store, a queue or runner error).
    NotRun,
}

impl ReconcileResult {
    /// The result of one item of `Controller::run`'s stream.
    pub fn of<T, E1, E2>(result: &Result<T, kube::runtime::controller::Error<E1, E2>>) -> Self {
        use kube::runtime::controller::Error;
        match result {
            Ok(_) => Self::Success,
            Err(Error::ReconcilerFailed(..)) => Self::Error,
            Err(_) => Self::NotRun,
        }
    }

    /// The `result` label (`None`: not counted).
    pub fn label(self) -> Option<&'static str> {
        match self {
            Self::Success => Some("success"),
            Self::Error => Some("error"),
            Self::NotRun => None,
        }
    }
}

impl ReconcileMetrics {
    /// Registers the counters with `registry`, under the names controller-runtime (and
    /// so upstream MARIN3R's operator and discovery service) gives them:
    /// `controller_runtime_reconcile_total{controller, result}` and
    /// `controller_runtime_reconcile_errors_total{controller}`; `controller` is the kind
    /// in lower case (`envoyconfig`, `discoveryservice`, ...), as controller-runtime
    /// names it.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles run, per controller and result (success, error)",
            self.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that returned an error, per controller",
            self.errors.clone(),
        );
    }

    /// Counts one reconcile of controller `kind`.
    pub fn count(&self, kind: &str, result: ReconcileResult) {
        let Some(label) = result.label() else {
            return;
        };
        let controller = kind.to_ascii_lowercase();
        // Every result and the error counter exist from a controller's first reconcile on
        // (zeros rather than gaps for dashboards and `rate`).
        for l in ["success", "error"] {
            let counter = self.reconciles.get_or_create(&ReconcileLabels {
                controller: controller.clone(),
                result: l.to_string(),
            });
            if l == label {
                counter.inc();
            }
        }
        let errors = self.errors.get_or_create(&ControllerLabels { controller });
        if result == ReconcileResult::Error {
            errors.inc();
        }
    }
}

/// Controller results: every reconcile is counted in `metrics`
/// ([`ReconcileMetrics::count`]); failed ones are logged by [`error_policy`]; what is
/// left (e.g. a trigger for an object deleted meanwhile) is debug noise. Done at once; the
/// ready future makes it the body of the controller stream's `for_each`.
pub fn log_result<T, E1, E2>(
    metrics: &ReconcileMetrics,
    kind: &'static str,
    result: Result<T, kube::runtime::controller::Error<E1, E2>>,
) -> std::future::Ready<()>
where
    E1: std::error::Error,
    E2: std::error::Error,
{
    let counted = ReconcileResult::of(&result);
    metrics.count(kind, counted);
    if let Err(e) = result
        && counted == ReconcileResult::NotRun
    {
        tracing::debug!(kind, error = %e, "reconcile not run");
    }
    std::future::ready(())
}

/// Runs `controller` (a controller's stream built with `graceful_shutdown_on(shutdown)`,
/// consumed, e.g. with [`log_result`]) until it ends; but a `shutdown` that comes before
/// `store` (the controller's own store) is ready ends it at once.
///
/// kube-runtime starts no reconcile before the controller's store is ready (the first
/// list of its objects is in), and its graceful shutdown waits for that too: against an
/// API server that accepts requests but never answers, a shutdown would never end. With
/// the store not ready no reconcile has started, so there is nothing to wait for. Once
/// it is ready, the graceful shutdown waits for the reconciles in flight, as it should.
pub async fn run_until_shutdown<K>(
    controller: impl std::future::Future<Output = ()>,
    store: &reflector::Store<K>,
    shutdown: impl std::future::Future<Output = ()>,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    use futures::FutureExt as _;
    use futures::future::Either;
    let controller = std::pin::pin!(controller);
    let shutdown = std::pin::pin!(shutdown);
    if let Either::Right(((), controller)) = futures::future::select(controller, shutdown).await {
        // Polled once: ready now, or not before the controller is dropped.
        if store.wait_until_ready().now_or_never().is_some() {
            controller.await;
        } else {
            tracing::debug!(
                kind = %K::kind(&()),
                "shutdown before the first list: no reconcile to wait for"
            );
        }
    }
}

/// Drives a reflector stream, logging watch errors (the watcher retries with backoff)
/// and calling `on_event` for every event after the store applied it.
pub async fn drive<K, S, F, Fut>(kind: &'static str, stream: S, on_event: F)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: Fn(watcher::Event<K>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => on_event(event).await,
            Err(e) => tracing::warn!(kind, error = %e, "watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    #[tokio::test]
    async fn every_reconcile_is_counted_by_controller_and_result() {
        use kube::runtime::controller::Error;
        use kube::runtime::reflector::ObjectRef;
        type Item = Result<(), Error<std::io::Error, std::io::Error>>;
        let object =
            || Box::new(ObjectRef::<k8s_openapi::api::core::v1::ConfigMap>::new("a").erase());
        let ok: Item = Ok(());
        let failed: Item = Err(Error::ReconcilerFailed(
            std::io::Error::other("no"),
            object(),
        ));
        let gone: Item = Err(Error::ObjectNotFound(object()));
        let queue: Item = Err(Error::QueueError(std::io::Error::other("watch")));
        assert_eq!(ReconcileResult::of(&ok), ReconcileResult::Success);
        assert_eq!(ReconcileResult::of(&failed), ReconcileResult::Error);
        assert_eq!(ReconcileResult::of(&gone), ReconcileResult::NotRun);
        assert_eq!(ReconcileResult::of(&queue), ReconcileResult::NotRun);

        let metrics = ReconcileMetrics::default();
        for item in [ok, failed, gone, queue] {
            log_result(&metrics, "WatchUnitTest", item).await;
        }
        let text = encoded(&metrics);
        for line in [
            "controller_runtime_reconcile_total{controller=\"watchunittest\",result=\"success\"} 1",
            "controller_runtime_reconcile_total{controller=\"watchunittest\",result=\"error\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"watchunittest\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // A controller that never failed shows zero errors.
        metrics.count("WatchUnitTestOk", ReconcileResult::Success);
        let text = encoded(&metrics);
        for line in [
            "controller_runtime_reconcile_total{controller=\"watchunittestok\",result=\"error\"} 0",
            "controller_runtime_reconcile_errors_total{controller=\"watchunittestok\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    /// `metrics` registered alone, as Prometheus text.
    fn encoded(metrics: &ReconcileMetrics) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    /// Two processes in one test (the in-process HA replicas) count apart: the same
    /// controller's reconciles in one value are not seen in the other.
    #[test]
    fn two_values_count_apart() {
        let (one, other) = (ReconcileMetrics::default(), ReconcileMetrics::default());
        one.count("EnvoyConfig", ReconcileResult::Error);
        one.count("EnvoyConfig", ReconcileResult::Success);
        other.count("EnvoyConfig", ReconcileResult::Success);
        let (one, other) = (encoded(&one), encoded(&other));
        for (text, line) in [
            (
                &one,
                "controller_runtime_reconcile_errors_total{controller=\"envoyconfig\"} 1",
            ),
            (
                &other,
                "controller_runtime_reconcile_errors_total{controller=\"envoyconfig\"} 0",
            ),
            (
                &other,
                "controller_runtime_reconcile_total{controller=\"envoyconfig\",result=\"success\"} 1",
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // A clone is the same counters (what every controller of a process is handed).
        let metrics = ReconcileMetrics::default();
        metrics.clone().count("EnvoyConfig", ReconcileResult::Error);
        assert!(encoded(&metrics).lines().any(
            |l| l == "controller_runtime_reconcile_errors_total{controller=\"envoyconfig\"} 1"
        ));
    }

    #[test]
    fn watch_namespace_is_every_namespace_or_a_list() {
        assert!(watch_namespaces(None).is_empty());
        assert!(watch_namespaces(Some("")).is_empty());
        assert!(watch_namespaces(Some(" , ")).is_empty());
        assert_eq!(watch_namespaces(Some("a")), ["a"]);
        assert_eq!(watch_namespaces(Some(" a, b ,a,,c")), ["a", "b", "c"]);
    }

    #[test]
    fn watch_backoff_grows_ignores_resets_and_recovers_after_quiet() {
        let mut b = WatchBackoff::default();
        let t0 = Instant::now();
        let secs = |d: Duration| d.as_secs_f64();
        let mut delays = Vec::new();
        for i in 0..8 {
            b.reset(); // what every watcher `Init` event does
            delays.push(secs(b.delay_at(t0 + Duration::from_secs(i))));
        }
        assert_eq!(delays, [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]);
        assert_eq!(secs(b.delay_at(t0 + Duration::from_secs(200))), 0.8);
    }
}
