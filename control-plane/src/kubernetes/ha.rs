//! Several replicas in Kubernetes mode (`docs/ha.md`): the shell around
//! [`crate::fleet`]. Every replica serves; the one holding the Lease writes.
//!
//! - [`HaConfig`]: who this replica is, where the fleet meets (the discovery service's
//!   namespace: its Lease, its Service, the replicas' reports);
//! - [`Ha`]: what the reconcilers read — the [`Leadership`] every write is gated on,
//!   the reports of the other replicas and the Service's EndpointSlices (watched), the
//!   debounce of `ReplicasInSync`, the `marin3r_ha_*` metrics;
//! - [`report_loop`]: writes this replica's own `DiscoveryServiceReplica` when a
//!   decision-relevant digest changes (coalesced) and at every heartbeat;
//! - [`farewell`]: at shutdown, a final report, then the object is deleted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource as _, ResourceExt as _};
use marin3r_envoyconfig::discoveryservicereplica::{
    DiscoveryServiceReplica, DiscoveryServiceReplicaStatus, NodeDigest,
};
use marin3r_kube::Lenient;
use marin3r_kube::lease::{Leadership, LeaseSettings};
use marin3r_wire::app_labels;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::time::Instant;

use crate::fleet::{self, Fleet, Next, Report, Schedule, Served, Veto};

/// The field manager of a replica's writes to its own report.
pub const REPORT_FIELD_MANAGER: &str = "marin3r-replica";
/// How often the digests are recomputed and compared with what was written.
pub const REPORT_TICK: Duration = Duration::from_millis(250);
/// How long a `ReplicasInSync` lag must last before it is reported (an ordinary edit
/// takes every replica less than this, and costs no extra status write).
pub const REPLICAS_IN_SYNC_DEBOUNCE: Duration = Duration::from_secs(10);
/// How long each shutdown request (the final report, its deletion) may take.
pub const FAREWELL_TIMEOUT: Duration = Duration::from_secs(1);
/// Default Lease duration (seconds), and how long before expiry it is renewed.
pub const LEASE_DURATION_SECONDS: u64 = 15;
pub const LEASE_GRACE_SECONDS: u64 = 5;

/// Who this replica is and where the fleet meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaConfig {
    /// This replica: its Pod's name (the name of its report, its Lease identity).
    pub replica: String,
    /// Its Pod's UID: the report is owned by the Pod, so garbage collection removes it
    /// after a crash. Without it the report has no owner.
    pub pod_uid: Option<String>,
    /// The discovery service's namespace (Lease, reports, Service).
    pub namespace: String,
    /// The discovery service's Service: its EndpointSlices say which replicas to expect.
    pub service: String,
    /// The leader Lease.
    pub lease: LeaseSettings,
}

impl HaConfig {
    /// The settings of replica `replica` (pod `pod_uid`) of the discovery service named
    /// `discovery_service` in `namespace`: Service `marin3r-<name>`, Lease
    /// `marin3r-<name>-leader` (the names the operator and the manifests use), held for
    /// `lease_seconds`.
    pub fn new(
        discovery_service: &str,
        namespace: &str,
        replica: &str,
        pod_uid: Option<String>,
        lease_seconds: u64,
    ) -> Self {
        let service = marin3r_wire::object_names::discovery_service(discovery_service);
        Self {
            replica: replica.to_string(),
            pod_uid,
            namespace: namespace.to_string(),
            lease: LeaseSettings {
                namespace: namespace.to_string(),
                name: marin3r_wire::object_names::discovery_service_lease(discovery_service),
                identity: replica.to_string(),
                manager: "marin3r".to_string(),
                duration: lease_seconds.max(1),
                grace: (lease_seconds / 3).clamp(1, LEASE_GRACE_SECONDS),
            },
            service,
        }
    }
}

/// Labels of the per-replica metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VetoLabels {
    node_id: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IgnoredLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FleetLabels {
    node_id: String,
    state: String,
}

/// The `marin3r_ha_*` and `marin3r_fleet_*` series.
#[derive(Debug, Clone, Default)]
pub struct HaMetrics {
    leader: Gauge,
    report_age: Family<ReplicaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    vetoes: Family<VetoLabels, Counter>,
    fleet_envoys: Family<FleetLabels, Gauge>,
    reports_ignored: Family<IgnoredLabels, Gauge>,
}

impl HaMetrics {
    /// Registers the series in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "marin3r_ha_leader",
            "1 while this replica holds the leader Lease (and writes to the API server)",
            m.leader.clone(),
        );
        registry.register(
            "marin3r_ha_report_age_seconds",
            "Time since this replica saw each replica's report change (its own clock; the heartbeat's date is not read)",
            m.report_age.clone(),
        );
        registry.register(
            "marin3r_ha_vetoes",
            "Fleet NACK verdicts blocked by a missing, stale or lagging replica (per evaluation)",
            m.vetoes.clone(),
        );
        registry.register(
            "marin3r_ha_reports_ignored",
            "DiscoveryServiceReplica reports in the namespace that do not count (another discovery service's, not an endpoint of the Service, not owned by the endpoint's pod), per reason",
            m.reports_ignored.clone(),
        );
        registry.register(
            "marin3r_fleet_envoys",
            "Envoys of each node over every replica (leader's view): connected, and rejecting (on replicas whose every pod rejects)",
            m.fleet_envoys.clone(),
        );
        m
    }
}

/// A report's (uid, resourceVersion) as last seen, and since when (this replica's clock).
type Observed = ((String, String), Instant);

/// What the reconcilers read to act as one of several replicas.
#[derive(Debug)]
pub struct Ha {
    pub config: HaConfig,
    /// Checked right before every write.
    pub leadership: Leadership,
    /// The replicas' reports (the discovery service's namespace).
    pub reports: Store<Lenient<DiscoveryServiceReplica>>,
    /// The Service's EndpointSlices.
    pub endpoints: Store<EndpointSlice>,
    pub metrics: HaMetrics,
    /// Since when each node's replicas have not all served its elected revision
    /// (a node goes when it is in sync again, or no longer configured: [`Ha::retain_nodes`]).
    lagging_since: Mutex<HashMap<String, Instant>>,
    /// The nodes that have veto series (removed with [`Ha::retain_nodes`]).
    vetoed: Mutex<BTreeSet<String>>,
    /// The sequence number of this replica's last report write.
    seq: std::sync::atomic::AtomicU64,
    /// Per report: the (uid, resourceVersion) last seen and since when (this replica's
    /// clock): what its freshness is judged by.
    observed: Mutex<HashMap<String, Observed>>,
    /// The fleet as the last evaluation tick judged it ([`Ha::judged`]): what the
    /// reconciles it triggers read, so a tick's verdict is carried into them.
    tick: Mutex<Option<Arc<Fleet>>>,
}

impl Ha {
    pub fn new(
        config: HaConfig,
        leadership: Leadership,
        reports: Store<Lenient<DiscoveryServiceReplica>>,
        endpoints: Store<EndpointSlice>,
        metrics: HaMetrics,
    ) -> Self {
        Self {
            config,
            leadership,
            reports,
            endpoints,
            metrics,
            lagging_since: Mutex::default(),
            vetoed: Mutex::default(),
            seq: std::sync::atomic::AtomicU64::new(0),
            observed: Mutex::default(),
            tick: Mutex::default(),
        }
    }

    /// The sequence number of the next report write.
    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// The fleet as this replica sees it at `now`: every report in the store that is
    /// bound to this discovery service ([`fleet::expected::admit`]; the others are
    /// counted in `marin3r_ha_reports_ignored`), with `own` (this replica's live digests)
    /// instead of its own object, and the replicas with an endpoint.
    ///
    /// A report's age is the time since *this replica saw it change* (its
    /// resourceVersion), on this replica's monotonic clock — as client-go judges a Lease
    /// by `observedTime` — never its `heartbeat`, which another clock wrote: a replica
    /// whose clock runs behind does not look stale, one ahead (or a heartbeat dated
    /// 2099) does not look fresh for ever. Each [`Report::heartbeat`] is that instant of
    /// observation on this replica's clock.
    /// Keeps `fleet` as this tick's ([`Ha::this_tick`]) and returns it.
    pub fn judged(&self, fleet: Fleet) -> Arc<Fleet> {
        let fleet = Arc::new(fleet);
        *self.tick.lock().unwrap_or_else(PoisonError::into_inner) = Some(fleet.clone());
        fleet
    }

    /// The fleet as the last tick judged it; before the first tick, judged now from
    /// `own` (this replica's digests).
    pub fn this_tick(&self, own: impl FnOnce() -> Vec<NodeDigest>) -> Arc<Fleet> {
        let last = self
            .tick
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        last.unwrap_or_else(|| self.judged(self.fleet(own(), SystemTime::now())))
    }

    pub fn fleet(&self, own: Vec<NodeDigest>, now: SystemTime) -> Fleet {
        let seen_now = Instant::now();
        let slices = self.endpoints.state();
        let pods =
            fleet::expected::endpoint_pods(slices.iter().map(AsRef::as_ref), &self.config.service);
        let mut ignored: BTreeMap<fleet::expected::Ignored, i64> = BTreeMap::new();
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        let mut reports: BTreeMap<String, Report> = BTreeMap::new();
        for r in self.reports.state().iter().filter_map(|r| r.valid().ok()) {
            if r.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if let Err(why) = fleet::expected::admit(r, &self.config.service, &pods) {
                *ignored.entry(why).or_default() += 1;
                continue;
            }
            let name = r.name_any();
            let version = (
                r.metadata.uid.clone().unwrap_or_default(),
                r.metadata.resource_version.clone().unwrap_or_default(),
            );
            let since = match observed.get(&name) {
                Some((seen, since)) if *seen == version => *since,
                _ => {
                    observed.insert(name.clone(), (version, seen_now));
                    seen_now
                }
            };
            let age = seen_now.saturating_duration_since(since);
            let status = r.status.clone().unwrap_or_default();
            reports.insert(
                name,
                Report::new(
                    Some(now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH)),
                    status.nodes,
                ),
            );
        }
        observed.retain(|name, _| reports.contains_key(name));
        drop(observed);
        for why in fleet::expected::Ignored::ALL {
            self.metrics
                .reports_ignored
                .get_or_create(&IgnoredLabels {
                    reason: why.as_str().to_string(),
                })
                .set(ignored.get(&why).copied().unwrap_or(0));
        }
        reports.insert(self.config.replica.clone(), Report::new(Some(now), own));
        Fleet {
            reports,
            endpoints: fleet::expected::replicas_with_endpoints(
                slices.iter().map(AsRef::as_ref),
                &self.config.service,
            ),
            now: Some(now),
        }
    }

    /// Counts the vetoes met by one evaluation.
    pub fn count_vetoes(&self, vetoes: &[(String, String, Veto)]) {
        if vetoes.is_empty() {
            return;
        }
        let mut vetoed = self.vetoed.lock().unwrap_or_else(PoisonError::into_inner);
        for (node_id, replica, why) in vetoes {
            if !vetoed.contains(node_id) {
                vetoed.insert(node_id.clone());
            }
            tracing::debug!(
                node_id,
                replica,
                reason = why.as_str(),
                "fleet verdict vetoed"
            );
            self.metrics
                .vetoes
                .get_or_create(&VetoLabels {
                    node_id: node_id.clone(),
                    reason: why.as_str().to_string(),
                })
                .inc();
        }
    }

    /// Forgets the nodes for which `claimed` is false (no live EnvoyConfig configures
    /// them any more): their lag and their veto series, so EnvoyConfigs created and
    /// deleted over time do not grow the replica's memory or `/metrics`.
    pub fn retain_nodes(&self, claimed: impl Fn(&str) -> bool) {
        (self
            .lagging_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
        .retain(|node, _| claimed(node));
        let mut vetoed = self.vetoed.lock().unwrap_or_else(PoisonError::into_inner);
        vetoed.retain(|node_id| {
            if claimed(node_id) {
                return true;
            }
            for why in Veto::ALL {
                self.metrics.vetoes.remove(&VetoLabels {
                    node_id: node_id.clone(),
                    reason: why.as_str().to_string(),
                });
            }
            false
        });
    }

    /// How many nodes the replica keeps a lag or veto series of (the bound's test).
    #[cfg(test)]
    fn nodes_kept(&self) -> usize {
        let lagging = self
            .lagging_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let vetoed = self.vetoed.lock().unwrap_or_else(PoisonError::into_inner);
        lagging
            .keys()
            .chain(vetoed.iter())
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Updates the gauges from `fleet` (the leader flag, report ages, Envoys per node).
    pub fn observe(&self, fleet: &Fleet, threshold: u64) {
        let now = fleet.now.unwrap_or(SystemTime::UNIX_EPOCH);
        self.metrics
            .leader
            .set(i64::from(self.leadership.is_current()));
        self.metrics.report_age.clear();
        for (replica, report) in &fleet.reports {
            if let Some(h) = report.heartbeat {
                let age = now.duration_since(h).unwrap_or_default().as_secs_f64();
                self.metrics
                    .report_age
                    .get_or_create(&ReplicaLabels {
                        replica: replica.clone(),
                    })
                    .set(age);
            }
        }
        self.metrics.fleet_envoys.clear();
        let mut per_node: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for report in fleet.reports.values().filter(|r| r.is_fresh(now)) {
            for d in report.nodes.values() {
                let entry = per_node.entry(d.node_id.as_str()).or_default();
                let pods = i64::try_from(d.pods).unwrap_or(i64::MAX);
                entry.0 += pods;
                if d.min_nacks.values().any(|n| *n >= threshold.max(1)) {
                    entry.1 += pods;
                }
            }
        }
        for (node_id, (connected, rejecting)) in per_node {
            for (state, n) in [("connected", connected), ("rejecting", rejecting)] {
                self.metrics
                    .fleet_envoys
                    .get_or_create(&FleetLabels {
                        node_id: node_id.to_string(),
                        state: state.to_string(),
                    })
                    .set(n);
            }
        }
    }

    /// `ReplicasInSync` for `node_id`, whose elected revision has `uid`, at `now`:
    /// `Some((in_sync, serving, expected))` to report, or `None` while a lag is younger
    /// than [`REPLICAS_IN_SYNC_DEBOUNCE`] (keep what the status says). Also returns when
    /// to look again (the end of the debounce).
    pub fn replicas_in_sync(
        &self,
        fleet: &Fleet,
        node_id: &str,
        uid: &str,
        now: Instant,
    ) -> (Option<(bool, usize, usize)>, Option<Duration>) {
        let (serving, expected) = serving(fleet, node_id, uid);
        let mut lagging = self
            .lagging_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if serving == expected {
            lagging.remove(node_id);
            return (Some((true, serving, expected)), None);
        }
        let since = *lagging.entry(node_id.to_string()).or_insert(now);
        let waited = now.saturating_duration_since(since);
        if waited >= REPLICAS_IN_SYNC_DEBOUNCE {
            (Some((false, serving, expected)), None)
        } else {
            (None, Some(REPLICAS_IN_SYNC_DEBOUNCE - waited))
        }
    }
}

/// The `ReplicasInSync` condition of a verdict of [`Ha::replicas_in_sync`] on the
/// elected revision `revision`: its status, reason and message ("2/3 replicas serve …").
pub fn replicas_in_sync_condition(
    (in_sync, serving, expected): (bool, usize, usize),
    revision: &str,
) -> (bool, &'static str, String) {
    let reason = if in_sync {
        "ReplicasInSync"
    } else {
        "ReplicaLagging"
    };
    (
        in_sync,
        reason,
        format!("{serving}/{expected} replicas serve {revision}"),
    )
}

/// How many of the expected replicas with a fresh report serve revision `uid` to
/// `node_id`, and how many replicas are expected.
pub fn serving(fleet: &Fleet, node_id: &str, uid: &str) -> (usize, usize) {
    let now = fleet.now.unwrap_or(SystemTime::UNIX_EPOCH);
    let expected = fleet.expected();
    let serving = expected
        .iter()
        .filter_map(|r| fleet.reports.get(*r))
        .filter(|r| r.is_fresh(now))
        .filter(|r| {
            r.nodes
                .get(node_id)
                .is_some_and(|d| d.revision.as_deref() == Some(uid))
        })
        .count();
    (serving, expected.len())
}

/// This replica's digests, sorted by node id: one per node it serves, and per node
/// some live EnvoyConfig configures (`claimed`) that it has streams for (held: not
/// loaded yet, a lagging replica the leader must hear of). A node id nobody configures
/// is never reported, however many streams clients open with made-up ids: no revision
/// of it can be judged, and the report stays bounded by the EnvoyConfigs
/// ([`fleet::report::bounded`] enforces [`fleet::report::MAX_REPORT_BYTES`] on top).
pub fn digests(
    served: &BTreeMap<String, Served>,
    stats: &marin3r_xds::SharedStats,
    threshold: u64,
    claimed: impl Fn(&str) -> bool,
) -> Vec<NodeDigest> {
    let nodes: BTreeSet<String> = served
        .keys()
        .cloned()
        .chain(
            stats
                .nodes_with_streams()
                .into_iter()
                .filter(|node| claimed(node)),
        )
        .collect();
    let digests = nodes
        .into_iter()
        .map(|node_id| {
            let s = served.get(&node_id);
            let versions = s.map(|s| s.versions.clone()).unwrap_or_default();
            let mut nacks = stats.node_nacks(&node_id, &versions, threshold);
            // The message of the type the leader will find rejected, as one replica
            // quotes it ([`crate::nacks::nack_verdict`]): the taint reasons agree.
            if let Some((t, version)) = most_rejected(&versions, &nacks.min_nacks) {
                nacks.message = crate::nacks::NackView::nack_message(stats, &node_id, t, version)
                    .or(nacks.message);
            }
            let silent = stats.silent_pods(&node_id);
            fleet::report::digest(&node_id, s, nacks, silent)
        })
        .collect();
    fleet::report::bounded(digests, fleet::report::MAX_REPORT_BYTES)
}

/// The served version whose smallest NACK count over the pods is the highest (the
/// first by type on a tie, the order [`crate::nacks::rejected`] looks in), if any was
/// NACKed.
fn most_rejected<'v>(
    versions: &'v BTreeMap<marin3r_envoyconfig::ResourceType, String>,
    min_nacks: &BTreeMap<marin3r_envoyconfig::ResourceType, u64>,
) -> Option<(marin3r_envoyconfig::ResourceType, &'v str)> {
    let mut best: Option<(marin3r_envoyconfig::ResourceType, &str, u64)> = None;
    for (t, v) in versions {
        let n = min_nacks.get(t).copied().unwrap_or(0);
        if n > 0 && best.is_none_or(|(_, _, m)| n > m) {
            best = Some((*t, v, n));
        }
    }
    best.map(|(t, v, _)| (t, v))
}

/// Writes this replica's report whenever [`Schedule`] says so, until dropped. A write
/// that fails is retried (1 s, doubling to [`fleet::HEARTBEAT`]).
pub async fn report_loop(client: Client, ha: Arc<Ha>, live: impl Fn() -> Vec<NodeDigest>) {
    let api: Api<DiscoveryServiceReplica> = Api::namespaced(client, &ha.config.namespace);
    let mut schedule = Schedule::default();
    let mut created = false;
    let mut backoff = Duration::from_secs(1);
    loop {
        let nodes = live();
        let leader = ha.leadership.is_current();
        let now = Instant::now();
        match schedule.next(now, &nodes, leader) {
            Next::Wait(until) => {
                tokio::time::sleep_until(until.min(now + REPORT_TICK)).await;
                continue;
            }
            Next::Write => {}
        }
        let result = write_report(
            &api,
            &ha.config,
            &mut created,
            ha.next_seq(),
            leader,
            &nodes,
        )
        .await;
        match result {
            Ok(()) => {
                backoff = Duration::from_secs(1);
                schedule.written(now, nodes, leader);
            }
            Err(e) => {
                tracing::warn!(
                    replica = ha.config.replica,
                    error = %e,
                    "cannot write this replica's report; retrying"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(fleet::HEARTBEAT);
            }
        }
    }
}

/// The report object (without status): named after the replica's Pod, owned by it.
fn report_object(config: &HaConfig) -> serde_json::Value {
    let owners: Vec<OwnerReference> = config
        .pod_uid
        .iter()
        .map(|uid| OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: config.replica.clone(),
            uid: uid.clone(),
            ..OwnerReference::default()
        })
        .collect();
    json!({
        "apiVersion": DiscoveryServiceReplica::api_version(&()),
        "kind": DiscoveryServiceReplica::kind(&()),
        "metadata": {
            "name": config.replica,
            "namespace": config.namespace,
            "labels": {app_labels::NAME: app_labels::MARIN3R, app_labels::COMPONENT: "discoveryservice"},
            "ownerReferences": owners,
        },
        "spec": {"discoveryService": config.service},
    })
}

async fn write_report(
    api: &Api<DiscoveryServiceReplica>,
    config: &HaConfig,
    created: &mut bool,
    seq: u64,
    leader: bool,
    nodes: &[NodeDigest],
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(REPORT_FIELD_MANAGER).force();
    if !*created {
        api.patch(
            &config.replica,
            &params,
            &Patch::Apply(report_object(config)),
        )
        .await?;
        *created = true;
    }
    let status = DiscoveryServiceReplicaStatus {
        heartbeat: Some(marin3r_kube::time::time(SystemTime::now())),
        seq,
        leader,
        nodes: nodes.to_vec(),
    };
    match marin3r_kube::apply::apply_status(api, &config.replica, &status, REPORT_FIELD_MANAGER)
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if marin3r_kube::is_status(&e, 404) => {
            // Deleted meanwhile (by hand, or by garbage collection): create it again.
            *created = false;
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// At shutdown: writes a last report (every stream is closed by now) and deletes it,
/// both within [`FAREWELL_TIMEOUT`] (the report is removed with the Pod anyway).
pub async fn farewell(client: Client, ha: &Ha, nodes: Vec<NodeDigest>) {
    let namespace = &ha.config.namespace;
    let api: Api<DiscoveryServiceReplica> = Api::namespaced(client.clone(), namespace);
    let replica = &ha.config.replica;
    let steps = async {
        let mut created = true;
        if let Err(e) =
            write_report(&api, &ha.config, &mut created, ha.next_seq(), false, &nodes).await
        {
            tracing::debug!(replica, error = %e, "final report not written");
        }
        match marin3r_kube::apply::delete_if_exists::<DiscoveryServiceReplica>(
            &client, namespace, replica,
        )
        .await
        {
            Ok(true) => tracing::info!(replica, "replica report deleted"),
            Ok(false) => {}
            Err(e) => tracing::warn!(replica, error = %e, "cannot delete the replica report"),
        }
    };
    if tokio::time::timeout(FAREWELL_TIMEOUT, steps).await.is_err() {
        tracing::warn!(
            replica,
            "the API server did not answer; the report is removed with the Pod"
        );
    }
}

/// The served map shared by the reconcilers and the report loop.
#[derive(Debug, Default)]
pub struct ServedNodes(Mutex<BTreeMap<String, Served>>);

impl ServedNodes {
    /// What is served now.
    pub fn snapshot(&self) -> BTreeMap<String, Served> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `node_id` is now served `served`; returns what it was served before.
    pub fn set(&self, node_id: &str, served: Served) -> Option<Served> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(node_id.to_string(), served)
    }

    /// `node_id` is no longer served.
    pub fn remove(&self, node_id: &str) -> Option<Served> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(node_id)
    }

    /// What `node_id` is served.
    pub fn get(&self, node_id: &str) -> Option<Served> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(node_id)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet_serving(revisions: &[&str]) -> Fleet {
        let now = marin3r_testkit::unix_time(1_800_000_000);
        Fleet {
            reports: revisions
                .iter()
                .enumerate()
                .map(|(i, uid)| {
                    let digest = NodeDigest {
                        node_id: "kuard".into(),
                        revision: Some((*uid).into()),
                        pods: 1,
                        ..NodeDigest::default()
                    };
                    (format!("ds-{i}"), Report::new(Some(now), [digest]))
                })
                .collect(),
            endpoints: (0..revisions.len()).map(|i| format!("ds-{i}")).collect(),
            now: Some(now),
        }
    }

    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;
    use marin3r_envoyconfig::ResourceType;

    use crate::fleet::FRESHNESS;

    const SERVICE: &str = "marin3r-d";

    /// The Service's EndpointSlice with `pods` (name, uid), all ready.
    fn endpoints(pods: &[(&str, &str)]) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "marin3r-d-abc", "namespace": "ns",
                         "labels": {fleet::expected::SERVICE_NAME_LABEL: SERVICE}},
            "addressType": "IPv4",
            "endpoints": pods.iter().map(|(name, uid)| json!({
                "addresses": ["10.0.0.1"], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": name, "uid": uid}
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    /// Node `kuard` served revision `uid-r` (listener `v1`) to `pods` pods, each of which
    /// NACKed it `nacks` times.
    fn kuard(revision: &str, pods: u64, nacks: u64) -> serde_json::Value {
        json!({"nodeID": "kuard", "revision": revision, "versions": {"listener": "v1"},
               "pods": pods, "minNacks": {"listener": nacks}})
    }

    /// A report named `name`, of `service`, owned by pod `owner_uid`, dated `heartbeat`,
    /// at resourceVersion `rv`.
    fn report(
        name: &str,
        service: &str,
        owner_uid: &str,
        heartbeat: &str,
        rv: &str,
        nodes: serde_json::Value,
    ) -> Lenient<DiscoveryServiceReplica> {
        serde_json::from_value(json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "DiscoveryServiceReplica",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-report-{name}"),
                         "resourceVersion": rv,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": owner_uid}]},
            "spec": {"discoveryService": service},
            "status": {"heartbeat": heartbeat, "seq": 1, "nodes": nodes},
        }))
        .unwrap()
    }

    /// This replica (`ds-0`), with the reports in `reports` and the endpoints `pods`.
    fn ha_seeing(
        pods: &[(&str, &str)],
    ) -> (
        Ha,
        Writer<Lenient<DiscoveryServiceReplica>>,
        Writer<EndpointSlice>,
    ) {
        let (reports, report_writer) = kube::runtime::reflector::store();
        let (slices, mut slice_writer) = kube::runtime::reflector::store();
        slice_writer.apply_watcher_event(&watcher::Event::Apply(endpoints(pods)));
        let ha = Ha::new(
            HaConfig::new("d", "ns", "ds-0", Some("uid-0".into()), 15),
            Leadership::always(),
            reports,
            slices,
            HaMetrics::default(),
        );
        (ha, report_writer, slice_writer)
    }

    fn verdict(ha: &Ha) -> fleet::Verdict {
        let judged = fleet::Judged {
            uid: "uid-r".into(),
            epoch: None,
        };
        ha.fleet(Vec::new(), SystemTime::now()).verdict(
            "kuard",
            &judged,
            ResourceType::Listener,
            "v1",
            3,
        )
    }

    fn vetoed(by: &str, why: Veto) -> fleet::Verdict {
        fleet::Verdict::Vetoed(BTreeMap::from([(by.to_string(), why)]))
    }

    /// Finding: one replica 40 s behind, and the leader found its reports stale and
    /// vetoed every taint; a heartbeat dated 2099 stayed fresh for ever. A report is
    /// fresh for FRESHNESS after this replica *saw it change*, whatever its date.
    #[tokio::test(start_paused = true)]
    async fn a_report_is_fresh_from_when_it_was_seen_to_change_never_by_its_date() {
        let now = k8s_openapi::jiff::Timestamp::now();
        let secs = k8s_openapi::jiff::SignedDuration::from_secs;
        for heartbeat in [
            (now - secs(40)).to_string(),
            (now + secs(40)).to_string(),
            "2099-01-01T00:00:00Z".to_string(),
        ] {
            let (ha, mut reports, _slices) = ha_seeing(&[("ds-0", "uid-0"), ("ds-1", "uid-1")]);
            let seen = |rv: &str| {
                report(
                    "ds-1",
                    SERVICE,
                    "uid-1",
                    &heartbeat,
                    rv,
                    json!([kuard("uid-r", 2, 3)]),
                )
            };
            reports.apply_watcher_event(&watcher::Event::Apply(seen("1")));
            assert_eq!(
                verdict(&ha),
                fleet::Verdict::Rejected,
                "{heartbeat}: just seen"
            );
            tokio::time::sleep(FRESHNESS).await;
            assert_eq!(verdict(&ha), fleet::Verdict::Rejected, "{heartbeat}: 30 s");
            // No change for longer: stale, however it is dated.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(
                verdict(&ha),
                vetoed("ds-1", Veto::Stale),
                "{heartbeat}: unchanged for 31 s"
            );
            let at = SystemTime::now();
            let fleet = ha.fleet(Vec::new(), at);
            let age = at
                .duration_since(fleet.reports["ds-1"].heartbeat.unwrap())
                .unwrap();
            assert_eq!(age, FRESHNESS + Duration::from_secs(1), "the age shown");
            // Written again (the same date: a frozen clock still heartbeats): fresh.
            reports.apply_watcher_event(&watcher::Event::Apply(seen("2")));
            assert_eq!(
                verdict(&ha),
                fleet::Verdict::Rejected,
                "{heartbeat}: seen to change"
            );
        }
    }

    /// Finding: a report of another discovery service, or a forged one, claiming a pod of
    /// the node, counted: it vetoed the taint (for good with a heartbeat dated 2099).
    /// Only reports bound to this discovery service count; the rest is counted aside.
    #[tokio::test(start_paused = true)]
    async fn reports_of_another_discovery_service_or_forged_ones_do_not_veto() {
        let (ha, mut reports, _slices) = ha_seeing(&[("ds-0", "uid-0"), ("ds-1", "uid-1")]);
        let mut registry = Registry::default();
        let ha = Ha {
            metrics: HaMetrics::register(&mut registry),
            ..ha
        };
        let forever = "2099-01-01T00:00:00Z";
        for r in [
            // Ours: every pod rejects.
            report(
                "ds-1",
                SERVICE,
                "uid-1",
                forever,
                "1",
                json!([kuard("uid-r", 2, 3)]),
            ),
            // Another discovery service's replica in the same namespace, lagging.
            report(
                "other-0",
                "marin3r-other",
                "uid-o",
                forever,
                "2",
                json!([kuard("uid-old", 1, 0)]),
            ),
            // Forged: names our Service, is no endpoint of it.
            report(
                "forged",
                SERVICE,
                "uid-f",
                forever,
                "3",
                json!([kuard("uid-old", 1, 0)]),
            ),
        ] {
            reports.apply_watcher_event(&watcher::Event::Apply(r));
        }
        assert_eq!(verdict(&ha), fleet::Verdict::Rejected);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "marin3r_ha_reports_ignored{reason=\"other_discovery_service\"} 1",
            "marin3r_ha_reports_ignored{reason=\"not_an_endpoint\"} 1",
            "marin3r_ha_reports_ignored{reason=\"not_owned_by_the_pod\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    /// Finding: every node id with a stream became a digest: 2,000 streams with 800-byte
    /// made-up node ids made a 1.58 MiB report (etcd refuses > 1.5 MiB). Only configured
    /// nodes are reported; the report stays far below its bound.
    #[test]
    fn made_up_node_ids_do_not_grow_the_report() {
        let stats = marin3r_xds::SharedStats::new();
        for i in 0..2_000 {
            let node = marin3r_xds::NodeInfo {
                id: format!("{i:x>800}"),
                pod_name: format!("pod-{i}"),
            };
            stats.stream_opened(&node, marin3r_xds::Api::Sotw);
        }
        let kuard = marin3r_xds::NodeInfo {
            id: "kuard".into(),
            pod_name: "kuard-1".into(),
        };
        stats.stream_opened(&kuard, marin3r_xds::Api::Sotw);
        let held = marin3r_xds::NodeInfo {
            id: "held".into(),
            pod_name: "held-1".into(),
        };
        stats.stream_opened(&held, marin3r_xds::Api::Sotw);
        let served = BTreeMap::from([(
            "kuard".to_string(),
            Served {
                uid: "uid-r".into(),
                name: "kuard-v3-1".into(),
                version: "1".into(),
                epoch: None,
                versions: BTreeMap::from([(ResourceType::Listener, "v1".to_string())]),
            },
        )]);
        let claimed = ["kuard", "held"];
        let nodes = digests(&served, &stats, 3, |n| claimed.contains(&n));
        let ids: Vec<&str> = nodes.iter().map(|d| d.node_id.as_str()).collect();
        assert_eq!(
            ids,
            ["held", "kuard"],
            "served and configured-but-held nodes only"
        );
        let status = DiscoveryServiceReplicaStatus {
            heartbeat: None,
            seq: 1,
            leader: false,
            nodes,
        };
        let bytes = serde_json::to_vec(&status).unwrap().len();
        assert!(bytes < 1024, "{bytes} B");
        const { assert!(fleet::MAX_REPORT_BYTES * 3 <= 1_572_864) };
    }

    /// Replica `ds-0` of discovery service `d`, always leading, with empty report and
    /// endpoint stores.
    fn leading_replica(metrics: HaMetrics) -> Ha {
        Ha::new(
            HaConfig::new("d", "ns", "ds-0", None, 15),
            Leadership::always(),
            kube::runtime::reflector::store().0,
            kube::runtime::reflector::store().0,
            metrics,
        )
    }

    /// The fleet is judged once per tick: the reconciles the tick triggers read the
    /// tick's fleet, without judging it again (before the first tick, they judge it once).
    #[test]
    fn the_reconciles_read_the_fleet_of_the_tick() {
        let ha = leading_replica(HaMetrics::default());
        let judged_now = std::cell::Cell::new(0);
        let own = || {
            judged_now.set(judged_now.get() + 1);
            Vec::new()
        };
        let first = ha.this_tick(own);
        assert_eq!(judged_now.get(), 1, "no tick yet: judged once");
        assert!(Arc::ptr_eq(&first, &ha.this_tick(own)));
        let tick = ha.judged(fleet_serving(&["new", "new"]));
        let read = ha.this_tick(own);
        assert!(Arc::ptr_eq(&tick, &read));
        assert_eq!(judged_now.get(), 1, "the tick's fleet is not judged again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lag_is_reported_only_once_it_lasted_the_debounce() {
        let ha = leading_replica(HaMetrics::default());
        let t0 = Instant::now();
        let lagging = fleet_serving(&["new", "new", "old"]);
        let in_sync = fleet_serving(&["new", "new", "new"]);
        assert_eq!(
            ha.replicas_in_sync(&in_sync, "kuard", "new", t0),
            (Some((true, 3, 3)), None)
        );
        // An ordinary edit: one replica catches up within the debounce, nothing written.
        assert_eq!(
            ha.replicas_in_sync(&lagging, "kuard", "new", t0),
            (None, Some(REPLICAS_IN_SYNC_DEBOUNCE))
        );
        let later = t0 + Duration::from_secs(4);
        assert_eq!(
            ha.replicas_in_sync(&lagging, "kuard", "new", later),
            (
                None,
                Some(REPLICAS_IN_SYNC_DEBOUNCE - Duration::from_secs(4))
            )
        );
        assert_eq!(
            ha.replicas_in_sync(&in_sync, "kuard", "new", later),
            (Some((true, 3, 3)), None),
            "caught up: the lag is forgotten"
        );
        // A lag that lasts is reported.
        let since = t0 + Duration::from_secs(5);
        assert_eq!(ha.replicas_in_sync(&lagging, "kuard", "new", since).0, None);
        assert_eq!(
            ha.replicas_in_sync(&lagging, "kuard", "new", since + REPLICAS_IN_SYNC_DEBOUNCE),
            (Some((false, 2, 3)), None)
        );
    }

    /// 1,000 EnvoyConfigs (nodes) created, lagging and vetoed, then deleted: the lags
    /// and the veto series go with them.
    #[tokio::test(start_paused = true)]
    async fn deleted_nodes_leave_no_lag_and_no_veto_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        let ha = leading_replica(HaMetrics::register(&mut registry));
        let text = |registry: &prometheus_client::registry::Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        let t0 = Instant::now();
        let lagging = fleet_serving(&["new", "old"]);
        ha.replicas_in_sync(&lagging, "kuard", "new", t0);
        ha.count_vetoes(&[("kuard".into(), "ds-1".into(), Veto::Lagging)]);
        let baseline = (ha.nodes_kept(), text(&registry));
        for i in 0..1_000 {
            let node = format!("node-{i}");
            ha.replicas_in_sync(&lagging, &node, "new", t0);
            ha.count_vetoes(&[
                (node.clone(), "ds-1".into(), Veto::Lagging),
                (node, "ds-2".into(), Veto::Missing),
            ]);
        }
        assert_eq!(ha.nodes_kept(), 1_001);
        ha.retain_nodes(|node| node == "kuard");
        assert_eq!((ha.nodes_kept(), text(&registry)), baseline);
    }

    #[test]
    fn names_follow_the_discovery_service() {
        let c = HaConfig::new(
            "instance",
            "ns",
            "marin3r-instance-abc",
            Some("uid".into()),
            15,
        );
        assert_eq!(c.service, "marin3r-instance");
        assert_eq!(c.lease.name, "marin3r-instance-leader");
        assert_eq!((c.lease.duration, c.lease.grace), (15, 5));
        let short = HaConfig::new("d", "ns", "p", None, 3);
        assert_eq!((short.lease.duration, short.lease.grace), (3, 1));
        let object = report_object(&c);
        assert_eq!(object["metadata"]["ownerReferences"][0]["kind"], "Pod");
        assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "uid");
        assert_eq!(
            report_object(&short)["metadata"]["ownerReferences"],
            serde_json::json!([])
        );
    }

    /// One taint-reason rule for one replica and several: the same NACKs give the
    /// same reason whether one replica judges its own streams or the leader judges the
    /// fleet's reports (the rejected type's message, one length bound, the pods that
    /// never answered named and elided alike).
    #[tokio::test(start_paused = true)]
    async fn one_replica_and_several_give_the_same_taint_reason() {
        use crate::fleet::{FleetView, Judged};
        use crate::nacks::{MAX_NACK_MESSAGE, nack_verdict};
        use marin3r_xds::{NodeInfo, SharedStats, StreamEvent};
        const N: u64 = 3;
        let long = "x".repeat(MAX_NACK_MESSAGE * 3);
        // NACKs: pod, type, count, message.
        type Nacks<'a> = Vec<(&'a str, ResourceType, u64, &'a str)>;
        let cases: [(&str, Nacks<'_>); 3] = [
            (
                "every pod rejects the listeners",
                vec![
                    ("kuard-0", ResourceType::Listener, N, "bad listener"),
                    ("kuard-1", ResourceType::Listener, N, "bad listener"),
                ],
            ),
            (
                "another type's NACK is not quoted",
                vec![
                    ("kuard-0", ResourceType::Cluster, 1, "one bad cluster"),
                    ("kuard-0", ResourceType::Listener, N, "bad listener"),
                    ("kuard-1", ResourceType::Listener, N, "bad listener"),
                ],
            ),
            (
                "a long message is bounded the same",
                vec![
                    ("kuard-0", ResourceType::Listener, N, long.as_str()),
                    ("kuard-1", ResourceType::Listener, N, long.as_str()),
                ],
            ),
        ];
        let versions = BTreeMap::from([
            (ResourceType::Cluster, "C2".to_string()),
            (ResourceType::Listener, "L2".to_string()),
        ]);
        let epoch = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        ));
        for (case, nacks) in cases {
            let stats = SharedStats::new();
            for pod in ["kuard-0", "kuard-1"] {
                let node = NodeInfo {
                    id: "kuard".into(),
                    pod_name: pod.into(),
                };
                stats.stream_opened(&node, marin3r_xds::Api::Sotw);
            }
            // Pods that subscribe and never answer: not counted, named in the reason.
            for i in 0..crate::nacks::MAX_SILENT_PODS + 2 {
                let node = NodeInfo {
                    id: "kuard".into(),
                    pod_name: format!("quiet-{i:02}"),
                };
                stats.stream_opened(&node, marin3r_xds::Api::Sotw);
            }
            tokio::time::advance(marin3r_xds::stats::SILENT_POD_GRACE + Duration::from_secs(1))
                .await;
            for (pod, t, n, message) in &nacks {
                for _ in 0..*n {
                    stats.record(&[StreamEvent::Nack {
                        node_id: "kuard".into(),
                        pod_name: (*pod).into(),
                        resource_type: *t,
                        version: versions[t].clone(),
                        message: (*message).into(),
                    }]);
                }
            }
            let one = nack_verdict("kuard", "v2", &versions, &stats, N).expect(case);

            let served = BTreeMap::from([(
                "kuard".to_string(),
                Served {
                    uid: "uid-r2".into(),
                    name: "kuard-v2".into(),
                    version: "v2".into(),
                    epoch: epoch.clone(),
                    versions: versions.clone(),
                },
            )]);
            let now = marin3r_testkit::unix_time(1_800_000_000);
            let fleet = Fleet {
                reports: BTreeMap::from([(
                    "ds-0".to_string(),
                    Report::new(Some(now), digests(&served, &stats, N, |_| true)),
                )]),
                endpoints: BTreeSet::from(["ds-0".to_string()]),
                now: Some(now),
            };
            let judged = Judged {
                uid: "uid-r2".into(),
                epoch: epoch.clone(),
            };
            let view = FleetView::new(&fleet, judged);
            let several = nack_verdict("kuard", "v2", &versions, &view, N).expect(case);
            assert_eq!(one, several, "{case}");
            assert!(
                one.reason.contains("never answered: quiet-00, ") && one.reason.ends_with(", …"),
                "{case}: {}",
                one.reason
            );
            assert!(!one.reason.contains("quiet-10"), "{case}: {}", one.reason);
            assert!(!one.reason.contains("cluster"), "{case}: {}", one.reason);
            assert!(
                one.reason.chars().count()
                    < MAX_NACK_MESSAGE + 200 + 15 * crate::nacks::MAX_SILENT_PODS,
                "{case}: {}",
                one.reason.len()
            );
        }
    }
}
