//! Kubernetes mode (`discovery-service` without `--config-dir`, design.md §3–4):
//! EnvoyConfig and EnvoyConfigRevision custom resources, Secrets, EndpointSlices and Pods
//! watched in `WATCH_NAMESPACE` (all namespaces when empty), published into the xDS cache
//! with self-healing.
//!
//! Layout (sans-I/O core, thin shell):
//! - [`plan`]: pure decisions (which revision to create, move up, delete, publish; the
//!   statuses), on top of the revision engine [`crate::revisions::Revisions`];
//! - [`controller`]: the two kube-runtime reconcilers carrying the plans out;
//! - [`source`]: Secrets and EndpointSlices for [`marin3r_envoyconfig::envoyconfig::resolve`] from the
//!   watch caches (the EndpointSlices in their own index by namespace, [`SliceIndex`]);
//! - this module: [`KubernetesBackend`], one watch cache per kind shared by both
//!   controllers, the triggers between them, the periodic NACK check and the Pod watch.
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
pub mod ha;
pub mod plan;
pub mod rbac;
pub mod source;
pub mod writer;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

pub use controller::{
    Error, FIELD_MANAGER, Shared, error_policy, forget_unclaimed_nodes, reconcile_envoyconfig,
    reconcile_revision, warm_start,
};
pub use marin3r_kube::Lenient;
pub use marin3r_kube::rbac::{ApiAccess, DISCOVERY_SERVICE as RBAC, grants};
use marin3r_kube::watch::{drive, log_result, watch};
pub use source::{LabelSet, SliceIndex};

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
                reflector::reflector(revision_writer, watch(self.api(), wc.clone())),
                move |event| {
                    let targets = revision_event_targets(&shared.revisions, &event);
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
                            all_secret_readers(&shared.revisions)
                        }
                        _ => changed(&event)
                            .map(|s| secret_readers(&shared.revisions, s))
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
                    let targets = slice_readers(&shared.revisions, &changes);
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

/// The object of a live change (not of the initial list, which reconciles everything
/// anyway).
fn changed<K>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) => Some(o),
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => None,
    }
}

async fn send_all<T>(tx: mpsc::Sender<T>, items: Vec<T>) {
    for item in items {
        let _ = tx.send(item).await;
    }
}

/// For a revision change: its EnvoyConfig, and every revision of that EnvoyConfig.
fn revision_event_targets(
    revisions: &Store<Lenient<EnvoyConfigRevision>>,
    event: &watcher::Event<Lenient<EnvoyConfigRevision>>,
) -> Option<(ConfigRef, Vec<RevisionRef>)> {
    let changed = changed(event)?;
    let namespace = changed.namespace()?;
    let owner = plan::owner(changed.meta())?;
    let siblings = revisions
        .state()
        .iter()
        .filter(|r| {
            r.namespace().as_deref() == Some(namespace.as_str())
                && plan::owner(r.meta()).is_some_and(|o| o.uid == owner.uid)
        })
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect();
    Some((ObjectRef::new(&owner.name).within(&namespace), siblings))
}

/// The elected revision of every EnvoyConfig of `namespace` (`None`: of every
/// namespace) for which `reads` holds: what a Secret or EndpointSlice change reconciles.
/// Only the elected revision (the topmost untainted one) is resolved and served, so one
/// trigger per EnvoyConfig that reads the object is enough; its siblings follow through
/// the revision events its status write causes, if any. One pass over the revisions,
/// whatever the number of EnvoyConfigs that read the object.
pub fn elected_readers(
    revisions: &[Arc<Lenient<EnvoyConfigRevision>>],
    namespace: Option<&str>,
    reads: impl Fn(&EnvoyConfigRevision) -> bool,
) -> Vec<RevisionRef> {
    type Owner<'a> = (&'a str, &'a str);
    let mut by_owner: std::collections::BTreeMap<Owner<'_>, Vec<&EnvoyConfigRevision>> =
        std::collections::BTreeMap::new();
    for r in revisions.iter().filter_map(|r| r.valid().ok()) {
        let Some(ns) = r.metadata.namespace.as_deref() else {
            continue;
        };
        if namespace.is_some_and(|n| n != ns) {
            continue;
        }
        if let Some(uid) = plan::controller_uid(r) {
            by_owner.entry((ns, uid)).or_default().push(r);
        }
    }
    by_owner
        .into_iter()
        .filter_map(|((ns, uid), group)| {
            // The elected revision is one of the group: a group none of whose revisions
            // reads it is skipped before the election, which copies every spec of the
            // group (the churn benchmark's profile: electing every EnvoyConfig's
            // revisions on each slice event was 25 % of the discovery service's CPU).
            if !group.iter().any(|r| reads(r)) {
                return None;
            }
            let ordered = plan::siblings(group, uid);
            let elected = plan::elected(&ordered)?;
            reads(elected).then(|| ObjectRef::new(&elected.name_any()).within(ns))
        })
        .collect()
}

/// The elected revisions that read Secret `secret` (see [`elected_readers`]).
pub fn secret_readers(
    revisions: &Store<Lenient<EnvoyConfigRevision>>,
    secret: &Secret,
) -> Vec<RevisionRef> {
    let (Some(namespace), name) = (secret.namespace(), secret.name_any()) else {
        return Vec::new();
    };
    elected_readers(&revisions.state(), Some(&namespace), |r| {
        plan::referenced_secrets(&r.spec).contains(&name)
    })
}

/// The elected revisions that read any Secret: what a re-list of the Secrets
/// reconciles (a change made while the watch was down is not seen as an event).
pub fn all_secret_readers(revisions: &Store<Lenient<EnvoyConfigRevision>>) -> Vec<RevisionRef> {
    elected_readers(&revisions.state(), None, |r| {
        !plan::referenced_secrets(&r.spec).is_empty()
    })
}

/// The elected revisions whose `generateFromEndpointSlices` selects one of the label
/// sets `changes` (what [`SliceIndex::apply_watcher_event`] returns: a slice's old and
/// new labels) in its namespace (see [`elected_readers`]).
pub fn slice_readers(
    revisions: &Store<Lenient<EnvoyConfigRevision>>,
    changes: &[source::LabelSet],
) -> Vec<RevisionRef> {
    if changes.is_empty() {
        return Vec::new();
    }
    let all = revisions.state();
    let mut by_namespace: std::collections::BTreeMap<
        &str,
        Vec<&std::collections::BTreeMap<String, String>>,
    > = std::collections::BTreeMap::new();
    for (ns, labels) in changes {
        by_namespace.entry(ns.as_str()).or_default().push(labels);
    }
    by_namespace
        .into_iter()
        .flat_map(|(ns, label_sets)| {
            elected_readers(&all, Some(ns), |r| {
                label_sets
                    .iter()
                    .any(|labels| plan::uses_endpoint_slices(&r.spec, labels))
            })
        })
        .collect()
}

/// The Pod watch: metadata only (`PartialObjectMeta`), injected Pods only
/// ([`POD_SELECTOR`]), and no store is kept (only deletions are acted upon), so its memory
/// is one list page, whatever the number of Pods (`bench/examples/pod_watch.rs`).
pub fn pod_watch_config() -> watcher::Config {
    watcher::Config::default().labels(&plan::equality_selector(POD_SELECTOR.0, POD_SELECTOR.1))
}

/// Forgets the NACK counts of deleted injected pods (matched by name, the `pod_name` of
/// their Envoy's node metadata), so a new pod with the same name (StatefulSets) starts
/// clean.
async fn watch_pods(api: Api<PartialObjectMeta<Pod>>, xds: crate::Context) {
    let stream = watch(api, pod_watch_config());
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Delete(pod)) => {
                let name = pod.name_any();
                let nodes = match pod.annotations().get(POD_NODE_ID_ANNOTATION) {
                    Some(node) => vec![node.clone()],
                    None => xds.cache.node_ids(),
                };
                for node in nodes {
                    xds.stats.clear_pod(&node, &name);
                }
                tracing::debug!(pod = name, "pod deleted; NACK counts cleared");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(kind = "Pod", error = %e, "watch failed; retrying"),
        }
    }
}

/// Every `interval`: reconciles the published revisions that every pod of their node
/// rejected (the reconcile taints them); on every replica, forgets the nodes no live
/// EnvoyConfig claims any more; with several replicas, updates the fleet metrics and,
/// on the leader, reconciles the EnvoyConfigs whose `ReplicasInSync` must change.
async fn evaluate_loop(
    shared: Arc<Shared>,
    config_tx: mpsc::Sender<ConfigRef>,
    revision_tx: mpsc::Sender<RevisionRef>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !shared.xds.ready.is_synced() {
            // The stores are not complete yet: nothing can be judged or forgotten.
            continue;
        }
        forget_unclaimed_nodes(&shared);
        // With several replicas, the fleet as this tick sees it: judged, observed and
        // compared with the statuses once.
        let fleet = shared.ha.as_ref().map(|ha| {
            let fleet = ha.fleet(shared.digests(), std::time::SystemTime::now());
            (ha, ha.judged(fleet))
        });
        for target in rejected_revisions_in(&shared, fleet.as_ref().map(|(_, f)| &**f)) {
            let _ = revision_tx.send(target).await;
        }
        if let Some((ha, fleet)) = &fleet {
            ha.observe(fleet, shared.nack_threshold);
            if shared.writer.leads() {
                for target in replicas_in_sync_changes(&shared, ha, fleet) {
                    let _ = config_tx.send(target).await;
                }
            }
        }
    }
}

/// The published, untainted revisions whose served versions every pod rejected: the
/// verdict alone ([`crate::nacks::rejected`]); the reconcile it triggers derives the
/// taint and its reason once, in [`crate::publisher::decide`]. With several replicas,
/// only the leader judges, over the fleet ([`crate::fleet::FleetView`]).
pub fn rejected_revisions(shared: &Shared) -> Vec<RevisionRef> {
    let fleet = shared
        .ha
        .as_ref()
        .map(|ha| ha.fleet(shared.digests(), std::time::SystemTime::now()));
    rejected_revisions_in(shared, fleet.as_ref())
}

/// [`rejected_revisions`] with several replicas judged over `fleet` (`None`: a single
/// replica, which judges its own streams).
fn rejected_revisions_in(shared: &Shared, fleet: Option<&crate::fleet::Fleet>) -> Vec<RevisionRef> {
    let fleet = match (&shared.ha, fleet) {
        (None, _) => None,
        // Only the leader judges, and only over the fleet.
        (Some(_), _) if !shared.writer.leads() => return Vec::new(),
        (Some(ha), Some(fleet)) => Some((ha, fleet)),
        (Some(_), None) => return Vec::new(),
    };
    shared
        .revisions
        .state()
        .iter()
        .filter_map(|r| r.valid().ok())
        .filter_map(|r| {
            let status = r.status.as_ref()?;
            if !status.is_published() || status.is_tainted() {
                return None;
            }
            let versions = controller::served_versions(shared, r)?;
            match &fleet {
                None => crate::nacks::rejected(
                    &r.spec.node_id,
                    &versions,
                    &shared.xds.stats,
                    shared.nack_threshold,
                ),
                Some((ha, fleet)) => {
                    let judged = crate::fleet::Judged::of(r)?;
                    let view = crate::fleet::FleetView::new(fleet, judged);
                    let verdict = crate::nacks::rejected(
                        &r.spec.node_id,
                        &versions,
                        &view,
                        shared.nack_threshold,
                    );
                    ha.count_vetoes(&view.into_vetoes());
                    verdict
                }
            }?;
            Some(ObjectRef::new(&r.name_any()).within(&r.namespace()?))
        })
        .collect()
}

/// The EnvoyConfigs whose `ReplicasInSync` condition no longer says what the fleet
/// does (past the debounce).
fn replicas_in_sync_changes(
    shared: &Shared,
    ha: &ha::Ha,
    fleet: &crate::fleet::Fleet,
) -> Vec<ConfigRef> {
    let now = tokio::time::Instant::now();
    shared
        .configs
        .state()
        .iter()
        .filter_map(|c| c.valid().ok())
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|ec| {
            let namespace = ec.namespace()?;
            let (verdict, _) = controller::replicas_in_sync_verdict(shared, ha, fleet, ec, now)?;
            let (in_sync, _, message) = verdict?;
            let current = ec.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == plan::REPLICAS_IN_SYNC)
            });
            // The count changes too ("2/2" → "3/3" after a replica joined).
            let same =
                current.is_some_and(|c| (c.status == "True") == in_sync && c.message == message);
            (!same).then(|| ObjectRef::new(&ec.name_any()).within(&namespace))
        })
        .collect()
}

/// When this replica becomes the leader, reconciles every EnvoyConfig and revision:
/// their statuses are recomputed and what the previous leader left is finished.
async fn requeue_when_leading(
    shared: Arc<Shared>,
    mut leading: tokio::sync::watch::Receiver<bool>,
    config_tx: mpsc::Sender<ConfigRef>,
    revision_tx: mpsc::Sender<RevisionRef>,
) {
    while leading.changed().await.is_ok() {
        if !*leading.borrow_and_update() {
            continue;
        }
        let configs: Vec<ConfigRef> = shared
            .configs
            .state()
            .iter()
            .map(|c| ObjectRef::from_obj(c.as_ref()))
            .collect();
        let revisions: Vec<RevisionRef> = shared
            .revisions
            .state()
            .iter()
            .map(|r| ObjectRef::from_obj(r.as_ref()))
            .collect();
        tracing::info!(
            envoyconfigs = configs.len(),
            revisions = revisions.len(),
            "leading: reconciling everything"
        );
        send_all(config_tx.clone(), configs).await;
        send_all(revision_tx.clone(), revisions).await;
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
