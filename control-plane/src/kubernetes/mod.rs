//! Kubernetes mode (`discovery-service` without `--config-dir`, design.md §3–4):
//! EnvoyConfig and EnvoyConfigRevision custom resources, Secrets, EndpointSlices and Pods
//! watched in `WATCH_NAMESPACE` (all namespaces when empty), published into the xDS cache
//! with self-healing.
//!
//! Layout (sans-I/O core, thin shell):
//! - [`plan`]: pure decisions (which revision to create, move up, delete; the
//!   statuses), on top of the revision engine [`crate::revisions::Revisions`];
//! - [`group`]: one home per revision group: an EnvoyConfig's ordered revisions and the
//!   elected one ([`group::Group`], pure), kept by an index fed by the revision watch;
//! - [`publish`]: what a revision's reconcile publishes or taints, a pure function of
//!   its group, what is served, the resolver and a NACK view;
//! - [`controller`]: the two kube-runtime reconcilers carrying the plans out;
//! - [`writer`]: the one lease-gated writer every API write goes through;
//! - [`source`]: Secrets and EndpointSlices for [`marin3r_envoyconfig::envoyconfig::resolve`] from the
//!   watch caches (the EndpointSlices in their own index by namespace, [`SliceIndex`]);
//! - [`coalesce`]: status writes that follow endpoint churn, coalesced per EnvoyConfig;
//! - [`ha`]: several replicas (reports, the fleet, `ReplicasInSync`);
//! - `shared` (what the reconcilers share, the cache operations), `triggers` (what each
//!   watched change reconciles), `evaluate` (the periodic NACK and fleet judgement);
//! - this module: [`KubernetesBackend`], one watch cache per kind shared by both
//!   controllers, wiring the above together.
//!
//! Triggers: an EnvoyConfig change reconciles it; an EnvoyConfigRevision change
//! reconciles its EnvoyConfig and every revision of that EnvoyConfig (the elected one
//! may have changed); a Secret or EndpointSlice change reconciles the elected revision
//! of each EnvoyConfig that reads it ([`elected_readers`]; a slice by its old and its new
//! labels), and a re-list of either what changed while the watch was down (slices) or
//! every reader (Secrets); every [`DEFAULT_EVALUATE_INTERVAL`] the published revisions
//! are checked against the NACK statistics and a rejected one is reconciled (and
//! tainted), which makes the next revision the elected one (rollback). A deleted Pod's
//! NACK counts are forgotten.

pub mod coalesce;
pub mod controller;
mod evaluate;
pub mod group;
pub mod ha;
pub mod plan;
pub mod publish;
pub mod rbac;
mod shared;
pub mod source;
mod triggers;
pub mod writer;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

pub use controller::{
    Error, FIELD_MANAGER, error_policy, reconcile_envoyconfig, reconcile_revision,
};
pub use evaluate::rejected_revisions;
use evaluate::{evaluate_loop, requeue_when_leading};
pub use marin3r_kube::Lenient;
pub use marin3r_kube::rbac::{ApiAccess, DISCOVERY_SERVICE as RBAC, grants};
use marin3r_kube::watch::{drive, log_result, watch};
pub use shared::{Shared, forget_unclaimed_nodes, warm_start};
pub use source::{LabelSet, SliceIndex};
pub use triggers::{
    all_secret_readers, elected_readers, pod_watch_config, secret_readers, slice_readers,
};
use triggers::{changed, revision_event_targets, send_all, watch_pods};

use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;

/// How often published revisions are checked against the NACK statistics.
pub const DEFAULT_EVALUATE_INTERVAL: Duration = Duration::from_secs(1);
/// How long [`crate::Backend::start`] waits for the first list of every kind before
/// serving anyway (the controllers keep retrying in the background).
pub const DEFAULT_INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the wait for the first lists looks again (see `setup`).
const SYNC_RECHECK: Duration = Duration::from_millis(250);
/// Pods whose deletion clears NACK counts: the injected ones.
pub const POD_SELECTOR: (&str, &str) = (
    marin3r_wire::INJECTION_LABEL,
    marin3r_wire::INJECTION_ENABLED,
);
/// The pod annotation holding its node id.
pub const POD_NODE_ID_ANNOTATION: &str = marin3r_wire::NODE_ID_ANNOTATION;
/// Events a shared reflector buffers per subscriber.
const SHARED_BUFFER: usize = 1024;
/// Pending reconcile triggers per controller.
const TRIGGER_BUFFER: usize = 1024;

type ConfigRef = ObjectRef<Lenient<EnvoyConfig>>;
type RevisionRef = ObjectRef<Lenient<EnvoyConfigRevision>>;

/// The Kubernetes config source as a [`crate::Backend`].
pub struct KubernetesBackend {
    client: Client,
    namespace: Option<String>,
    nack_threshold: u64,
    evaluate_interval: Duration,
    initial_sync_timeout: Duration,
    /// One of several replicas (`--leader-elect`).
    ha: Option<ha::HaConfig>,
    /// The `marin3r_ha_*` series (registered with the process's metrics).
    ha_metrics: ha::HaMetrics,
    /// The `controller_runtime_reconcile*` series (registered with the process's metrics).
    reconciles: marin3r_kube::watch::ReconcileMetrics,
    running: Option<Running>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesBackend")
            .field("namespace", &self.namespace)
            .field("nack_threshold", &self.nack_threshold)
            .field("evaluate_interval", &self.evaluate_interval)
            .finish_non_exhaustive()
    }
}

/// Watches started by `start`, handed to `run`.
struct Running {
    shared: Arc<Shared>,
    /// Subscribers of the shared stores (always `Some` with `store_shared`; without one
    /// a controller falls back to its own watch).
    configs: Option<ReflectHandle<Lenient<EnvoyConfig>>>,
    revisions: Option<ReflectHandle<Lenient<EnvoyConfigRevision>>>,
    config_triggers: mpsc::Receiver<ConfigRef>,
    revision_triggers: mpsc::Receiver<RevisionRef>,
    tasks: Tasks,
    /// Several replicas: stops the leader election (releasing the Lease if held); the
    /// task is aborted if the backend is dropped without stopping (a crash stops
    /// renewing the Lease).
    election: Option<(tokio::sync::oneshot::Sender<()>, Tasks)>,
}

/// Background tasks, aborted when dropped.
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

impl KubernetesBackend {
    /// Watches `namespace` (`""`: every namespace) through `client`; a revision is
    /// tainted after `nack_threshold` NACKs from every pod of its node.
    pub fn new(client: Client, namespace: impl Into<String>, nack_threshold: u64) -> Self {
        let namespace = namespace.into();
        Self {
            client,
            namespace: (!namespace.is_empty()).then_some(namespace),
            nack_threshold,
            evaluate_interval: DEFAULT_EVALUATE_INTERVAL,
            initial_sync_timeout: DEFAULT_INITIAL_SYNC_TIMEOUT,
            ha: None,
            ha_metrics: ha::HaMetrics::default(),
            reconciles: marin3r_kube::watch::ReconcileMetrics::default(),
            running: None,
        }
    }

    /// Runs as one of several replicas (`docs/ha.md`): serves like every replica, writes
    /// to the API server only while it holds the Lease of `config`, reports its digests
    /// and judges NACKs over the fleet when it leads.
    pub fn with_ha(mut self, config: ha::HaConfig) -> Self {
        self.ha = Some(config);
        self
    }

    /// [`KubernetesBackend::new`] with the in-cluster config, or the current kubeconfig
    /// context outside a cluster (the client bounds every request:
    /// [`marin3r_kube::client`]).
    pub async fn try_default(
        namespace: impl Into<String>,
        nack_threshold: u64,
    ) -> Result<Self, kube::Error> {
        Ok(Self::new(
            marin3r_kube::client::try_default().await?,
            namespace,
            nack_threshold,
        ))
    }

    /// Changes how often published revisions are checked against the NACK statistics.
    pub fn with_evaluate_interval(mut self, interval: Duration) -> Self {
        self.evaluate_interval = interval;
        self
    }

    /// Changes how long `start` waits for the first lists.
    pub fn with_initial_sync_timeout(mut self, timeout: Duration) -> Self {
        self.initial_sync_timeout = timeout;
        self
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Starts the reflectors and background loops, waits for the first lists (bounded)
    /// and loads the published revisions into the cache.
    async fn setup(&self, ctx: &crate::Context) -> Running {
        let (configs, config_writer) = reflector::store_shared(SHARED_BUFFER);
        let (revisions, revision_writer) = reflector::store_shared(SHARED_BUFFER);
        let (secrets, secret_writer) = reflector::store();
        let config_sub = config_writer.subscribe();
        let revision_sub = revision_writer.subscribe();
        let (config_tx, config_triggers) = mpsc::channel(TRIGGER_BUFFER);
        let (revision_tx, revision_triggers) = mpsc::channel(TRIGGER_BUFFER);
        let mut shared = Shared::new(
            self.client.clone(),
            configs.clone(),
            revisions.clone(),
            secrets.clone(),
            source::SliceIndex::new(),
            ctx.clone(),
            self.nack_threshold,
        );
        let wc = watcher::Config::default();
        let mut tasks = Tasks::default();
        let mut election = None;
        let mut fleet_stores = None;
        if let Some(config) = &self.ha {
            let (reports, report_writer) = reflector::store();
            let (endpoints, endpoint_writer) = reflector::store();
            tasks.0.push(tokio::spawn(drive(
                "DiscoveryServiceReplica",
                reflector::reflector(
                    report_writer,
                    watch(
                        Api::namespaced(self.client.clone(), &config.namespace),
                        wc.clone(),
                    ),
                ),
                |_| async {},
            )));
            let own_slices = watcher::Config::default().labels(&plan::equality_selector(
                crate::fleet::expected::SERVICE_NAME_LABEL,
                &config.service,
            ));
            tasks.0.push(tokio::spawn(drive(
                "EndpointSlice",
                reflector::reflector(
                    endpoint_writer,
                    watch(
                        Api::namespaced(self.client.clone(), &config.namespace),
                        own_slices,
                    ),
                ),
                |_| async {},
            )));
            let leadership = marin3r_kube::lease::Leadership::new(config.lease.write_window());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let elect = tokio::spawn({
                let (client, settings, leadership) = (
                    self.client.clone(),
                    config.lease.clone(),
                    leadership.clone(),
                );
                async move {
                    let shutdown = async move {
                        let _ = stopped.await;
                    };
                    if let Err(e) =
                        marin3r_kube::lease::elect(client, settings, leadership, shutdown).await
                    {
                        tracing::error!(error = %e, "leader election failed; this replica serves but never writes");
                    }
                }
            });
            election = Some((stop, Tasks(vec![elect])));
            fleet_stores = Some((reports.clone(), endpoints.clone()));
            shared = shared.with_ha(Arc::new(ha::Ha::new(
                config.clone(),
                leadership,
                reports,
                endpoints,
                self.ha_metrics.clone(),
            )));
        }
        let shared = Arc::new(shared);
        if let Some(ha) = shared.ha.clone() {
            let shared = shared.clone();
            let client = self.client.clone();
            tasks.0.push(tokio::spawn(async move {
                ha::report_loop(client, ha, move || shared.digests()).await;
            }));
        }
        tasks.0.push(tokio::spawn(drive(
            "EnvoyConfig",
            reflector::reflector(config_writer, watch(self.api(), wc.clone())),
            |_| async {},
        )));
        {
            let shared = shared.clone();
            let revision_tx = revision_tx.clone();
            let config_tx = config_tx.clone();
            tasks.0.push(tokio::spawn(drive(
                "EnvoyConfigRevision",
                // The group index first, then the watch cache (whose subscribers start
                // the reconciles): a reconcile always finds the new member's group.
                reflector::reflector(
                    revision_writer,
                    watch(self.api(), wc.clone()).inspect_ok({
                        let groups = shared.groups.clone();
                        move |event| groups.apply(event)
                    }),
                ),
                move |event| {
                    let targets = revision_event_targets(&shared.groups, &event);
                    let (config_tx, revision_tx) = (config_tx.clone(), revision_tx.clone());
                    async move {
                        if let Some((owner, siblings)) = targets {
                            let _ = config_tx.send(owner).await;
                            for s in siblings {
                                let _ = revision_tx.send(s).await;
                            }
                        }
                    }
                },
            )));
        }
        {
            let shared = shared.clone();
            let revision_tx = revision_tx.clone();
            // A re-list after the first: a change made while the watch was down shows
            // as no event, so every reader is reconciled (rare; bounded by the EnvoyConfigs).
            let listed = Arc::new(std::sync::atomic::AtomicBool::new(false));
            tasks.0.push(tokio::spawn(drive(
                "Secret",
                reflector::reflector(secret_writer, watch(self.api::<Secret>(), wc.clone())),
                move |event| {
                    let targets = match &event {
                        watcher::Event::InitDone
                            if listed.swap(true, std::sync::atomic::Ordering::Relaxed) =>
                        {
                            all_secret_readers(&shared.groups)
                        }
                        _ => changed(&event)
                            .map(|s| secret_readers(&shared.groups, s))
                            .unwrap_or_default(),
                    };
                    send_all(revision_tx.clone(), targets)
                },
            )));
        }
        {
            let shared = shared.clone();
            let revision_tx = revision_tx.clone();
            tasks.0.push(tokio::spawn(drive(
                "EndpointSlice",
                watch(self.api::<EndpointSlice>(), wc.clone()),
                move |event| {
                    let changes = shared.slices.apply_watcher_event(&event);
                    let targets = slice_readers(&shared.groups, &changes);
                    send_all(revision_tx.clone(), targets)
                },
            )));
        }
        tasks.0.push(tokio::spawn(watch_pods(
            self.api::<PartialObjectMeta<Pod>>(),
            ctx.clone(),
        )));
        if let Some(ha) = shared.ha.clone() {
            tasks.0.push(tokio::spawn(requeue_when_leading(
                shared.clone(),
                ha.leadership.subscribe(),
                config_tx.clone(),
                revision_tx.clone(),
            )));
        }
        tasks.0.push(tokio::spawn(evaluate_loop(
            shared.clone(),
            config_tx,
            revision_tx,
            self.evaluate_interval,
        )));

        // The first lists of every kind, then the published revisions loaded: ready.
        let sync = {
            let (configs, revisions, secrets) =
                (configs.clone(), revisions.clone(), secrets.clone());
            let shared = shared.clone();
            let ready = ctx.ready.clone();
            let namespace = self.namespace.clone();
            let fleet_stores = fleet_stores.clone();
            move || async move {
                let lists = || async {
                    let _ = configs.wait_until_ready().await;
                    let _ = revisions.wait_until_ready().await;
                    let _ = secrets.wait_until_ready().await;
                    shared.slices.wait_until_ready().await;
                    if let Some((reports, endpoints)) = &fleet_stores {
                        let _ = reports.wait_until_ready().await;
                        let _ = endpoints.wait_until_ready().await;
                    }
                };
                // kube-runtime's `wait_until_ready` wakes only the task that polled it
                // last (one waker per store), and the controllers wait on the same
                // stores: a waiter that is not woken asks again.
                while tokio::time::timeout(SYNC_RECHECK, lists()).await.is_err() {}
                let loaded = warm_start(&shared);
                tracing::info!(
                    namespace = namespace.as_deref().unwrap_or("<all>"),
                    nodes = loaded,
                    "Kubernetes mode: caches synced"
                );
                ready.set_synced();
            }
        };
        if tokio::time::timeout(self.initial_sync_timeout, sync.clone()())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?self.initial_sync_timeout,
                "Kubernetes mode: the first lists did not complete in time (are the CRDs installed and is RBAC granted?); serving (not ready) anyway, retrying in the background"
            );
            // Ready once they do (the held streams are answered as revisions publish).
            tasks.0.push(tokio::spawn(sync()));
        }
        Running {
            shared,
            configs: config_sub,
            revisions: revision_sub,
            config_triggers,
            revision_triggers,
            tasks,
            election,
        }
    }
}

impl crate::Backend for KubernetesBackend {
    async fn start(&mut self, ctx: &crate::Context) -> Result<(), crate::Error> {
        self.running = Some(self.setup(ctx).await);
        Ok(())
    }

    async fn run(mut self, ctx: crate::Context, shutdown: crate::Shutdown) {
        let running = match self.running.take() {
            Some(running) => running,
            None => self.setup(&ctx).await,
        };
        let Running {
            shared,
            configs,
            revisions,
            config_triggers,
            revision_triggers,
            tasks,
            election,
        } = running;
        let config_controller = match configs {
            Some(sub) => Controller::for_shared_stream(sub, shared.configs.clone()),
            None => Controller::new(self.api(), watcher::Config::default()),
        };
        let config_controller = config_controller
            .reconcile_on(ReceiverStream::new(config_triggers))
            .run(reconcile_envoyconfig, error_policy, shared.clone())
            .for_each(|r| log_result(&self.reconciles, "EnvoyConfig", r));
        let revision_controller = match revisions {
            Some(sub) => Controller::for_shared_stream(sub, shared.revisions.clone()),
            None => Controller::new(self.api(), watcher::Config::default()),
        };
        let revision_controller = revision_controller
            .reconcile_on(ReceiverStream::new(revision_triggers))
            .run(reconcile_revision, error_policy, shared.clone())
            .for_each(|r| log_result(&self.reconciles, "EnvoyConfigRevision", r));
        tokio::select! {
            () = shutdown => {}
            _ = futures::future::join(config_controller, revision_controller) => {}
        }
        drop(tasks);
        // Every stream is closed by now: a last report, the report deleted, the Lease
        // released — side by side, each bounded, so an API server that does not answer
        // delays the exit by at most a second.
        let farewell = async {
            if let Some(ha) = &shared.ha {
                ha::farewell(self.client.clone(), ha, shared.digests()).await;
            }
        };
        let release = async {
            if let Some((stop, mut elect)) = election {
                let _ = stop.send(());
                let bound = marin3r_kube::lease::RELEASE_TIMEOUT + Duration::from_millis(200);
                let stopped = futures::future::join_all(elect.0.iter_mut());
                if tokio::time::timeout(bound, stopped).await.is_err() {
                    tracing::warn!("leader election did not stop in time");
                }
            }
        };
        futures::future::join(farewell, release).await;
    }

    fn register_metrics(&mut self, registry: &mut prometheus_client::registry::Registry) {
        self.reconciles.register(registry);
        if self.ha.is_some() {
            self.ha_metrics = ha::HaMetrics::register(registry);
        }
    }
}
