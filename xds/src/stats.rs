//! What the ADS streams report (requests, ACKs, NACKs, stream lifecycle) and what the
//! self-healing engine asks about it (SPEC §4: a revision is tainted when **every**
//! subscribed pod NACKed its version at least N times).
//!
//! - [`StreamEvent`]s are produced by the sans-I/O stream state machines
//!   ([`crate::sotw`], [`crate::delta`]).
//! - [`AckNackStats`] is the plain, single-threaded aggregation:
//!   per `(node id, type, version)` → per pod `{acks, nacks, last_nack_message}`, plus the
//!   number of open streams per `(node id, pod)`.
//! - [`XdsMetrics`] are the Prometheus series (no version label: cardinality stays
//!   bounded by nodes × types × pods).
//! - [`SharedStats`] wraps both for the tonic shell and the revision engine
//!   (`Arc<Mutex<…>>` inside, cheap to clone).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use marin3r_envoyconfig::resource::ResourceType;

/// Node metadata key holding the Envoy pod's name (set by the injected bootstrap).
pub const POD_NAME_METADATA_KEY: &str = "pod_name";

/// The identity of the Envoy on a stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeInfo {
    /// `node.id`: selects the snapshot.
    pub id: String,
    /// `node.metadata.pod_name` (string); empty when absent, e.g. an Envoy outside
    /// Kubernetes. All such Envoys of one node count as one "pod" in the stats.
    pub pod_name: String,
}

impl NodeInfo {
    /// Reads id and pod name; `None` when the node has no id (the message is then
    /// treated as not carrying a node).
    pub fn from_node(node: &Node) -> Option<Self> {
        if node.id.is_empty() {
            return None;
        }
        let pod_name = Self::pod_name_of(node).unwrap_or_default().to_string();
        Some(Self {
            id: node.id.clone(),
            pod_name,
        })
    }

    /// `node.metadata.pod_name` when it is a string.
    pub fn pod_name_of(node: &Node) -> Option<&str> {
        node.metadata
            .as_ref()
            .and_then(|m| m.fields.get(POD_NAME_METADATA_KEY))
            .and_then(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.as_str()),
                _ => None,
            })
    }

    /// The `Node` an Envoy bootstrapped by `marin3r init-manager` sends: this id, and the
    /// pod name as metadata [`POD_NAME_METADATA_KEY`]. The inverse of [`Self::from_node`]
    /// (for ADS clients: tests, the benchmark swarm).
    pub fn to_node(&self) -> Node {
        let pod_name = Value {
            kind: Some(Kind::StringValue(self.pod_name.clone())),
        };
        Node {
            id: self.id.clone(),
            metadata: Some(Struct {
                fields: [(POD_NAME_METADATA_KEY.to_string(), pod_name)].into(),
            }),
            ..Default::default()
        }
    }
}

/// Which ADS flavour a stream speaks (label of the stream gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    Sotw,
    Delta,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Sotw => "sotw",
            Api::Delta => "delta",
        }
    }
}

/// Something a stream observed. Node id and pod name are empty if the stream has not
/// learned its node yet (a client that omits `node` on its first message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A discovery request arrived; `resource_type` is `None` for type URLs we do not
    /// serve.
    Request {
        node_id: String,
        pod_name: String,
        resource_type: Option<ResourceType>,
    },
    /// The client accepted `version` of `resource_type`.
    Ack {
        node_id: String,
        pod_name: String,
        resource_type: ResourceType,
        version: String,
    },
    /// The client rejected `version` (the version of the response it answers, not the
    /// `version_info` of the request, which is the last version it accepted).
    Nack {
        node_id: String,
        pod_name: String,
        resource_type: ResourceType,
        version: String,
        message: String,
    },
}

/// ACK/NACK counts of one pod for one `(node, type, version)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodCounts {
    pub acks: u64,
    pub nacks: u64,
    pub last_nack_message: Option<String>,
}

/// Longest NACK message kept per pod and version (a longer one keeps its first 4 KiB).
pub const MAX_NACK_MESSAGE_BYTES: usize = 4096;

/// Default number of versions remembered per `(node, type)`.
pub const DEFAULT_MAX_VERSIONS: usize = 32;

/// A pod name as stored in [`AckNackStats`]: one allocation per pod, shared by the
/// stream count and every version's counts of the pod.
type PodName = Arc<str>;

#[derive(Debug, Clone, Default)]
struct VersionLog {
    /// Versions in order of first event, oldest first (eviction order).
    order: VecDeque<String>,
    counts: HashMap<String, HashMap<PodName, PodCounts>>,
}

/// Plain aggregation of [`StreamEvent`]s and stream lifecycle.
///
/// Memory is bounded: per `(node, type)` only the `max_versions` most recently seen
/// versions are kept (self-healing decides within seconds of a push; older versions
/// are irrelevant).
///
/// Every stream's ACK goes through [`record`](Self::record) under the stats lock, so
/// it looks everything up by `&str` in hash maps and allocates only for a new node,
/// version or pod (with 10,000 pods per node, cloning the keys and walking `BTreeMap`s
/// of pod names was half of the ACK accounting's cost, measured with `perf`).
#[derive(Debug, Clone)]
pub struct AckNackStats {
    max_versions: usize,
    /// node id → type → versions.
    versions: HashMap<String, BTreeMap<ResourceType, VersionLog>>,
    /// Open streams per node and pod.
    streams: HashMap<String, HashMap<PodName, PodStreams>>,
    /// Pods whose last stream closed, and when (node → pod → instant): their counts are
    /// dropped [`GONE_POD_RETENTION`] later unless they come back.
    gone: HashMap<String, HashMap<PodName, Instant>>,
    /// The same closes in order (oldest first), for the sweep; an entry whose instant is
    /// no longer the pod's in `gone` (it came back, or closed again later) is skipped.
    gone_order: VecDeque<(Instant, String, PodName)>,
}

/// A pod with an open stream: how many, since when, and whether it ever answered.
#[derive(Debug, Clone, Copy)]
struct PodStreams {
    open: usize,
    since: Instant,
    /// It ACKed or NACKed something on the node at least once.
    answered: bool,
}

/// A pod that has had a stream for this long without ever ACKing or NACKing anything no
/// longer counts as "subscribed" for the taint test: a client that subscribes and never
/// answers (a stuck Envoy, or anything holding the shared client certificate) cannot
/// block self-healing for the node. Real Envoys answer every push within milliseconds.
pub const SILENT_POD_GRACE: Duration = Duration::from_secs(10);

/// How long the ACK/NACK counts of a pod outlive its last stream. Only subscribed pods
/// count for the taint test, so the counts of a pod that is gone matter only if it comes
/// back (a stream that flapped: Envoy reconnects within its 2 s backoff cap); after this
/// long they are dropped, so pods (and pod names a client makes up) seen over time do
/// not grow the stats (Kubernetes mode also drops them when the Pod is deleted).
pub const GONE_POD_RETENTION: Duration = Duration::from_secs(300);

impl Default for AckNackStats {
    fn default() -> Self {
        Self::with_max_versions(DEFAULT_MAX_VERSIONS)
    }
}

impl AckNackStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps at most `max_versions` (at least 1) versions per `(node, type)`.
    pub fn with_max_versions(max_versions: usize) -> Self {
        Self {
            max_versions: max_versions.max(1),
            versions: HashMap::new(),
            streams: HashMap::new(),
            gone: HashMap::new(),
            gone_order: VecDeque::new(),
        }
    }

    /// Folds one event in (requests are ignored here; they only feed metrics).
    pub fn record(&mut self, event: &StreamEvent) {
        let (node_id, pod_name, t, version, nack) = match event {
            StreamEvent::Request { .. } => return,
            StreamEvent::Ack {
                node_id,
                pod_name,
                resource_type,
                version,
            } => (node_id, pod_name, *resource_type, version, None),
            StreamEvent::Nack {
                node_id,
                pod_name,
                resource_type,
                version,
                message,
            } => (node_id, pod_name, *resource_type, version, Some(message)),
        };
        if let Some(pod) = self
            .streams
            .get_mut(node_id.as_str())
            .and_then(|pods| pods.get_mut(pod_name.as_str()))
        {
            pod.answered = true;
        }
        if !self.versions.contains_key(node_id.as_str()) {
            self.versions.insert(node_id.clone(), BTreeMap::new());
        }
        let Some(logs) = self.versions.get_mut(node_id.as_str()) else {
            return;
        };
        let log = logs.entry(t).or_default();
        if !log.counts.contains_key(version.as_str()) {
            log.order.push_back(version.clone());
            while log.order.len() > self.max_versions {
                if let Some(old) = log.order.pop_front() {
                    log.counts.remove(&old);
                }
            }
            log.counts.insert(version.clone(), HashMap::new());
        }
        let Some(pods) = log.counts.get_mut(version.as_str()) else {
            return;
        };
        let c = match pods.get_mut(pod_name.as_str()) {
            Some(c) => c,
            None => {
                // Share the name with the pod's stream count when it has one.
                let name = self
                    .streams
                    .get(node_id.as_str())
                    .and_then(|p| p.get_key_value(pod_name.as_str()))
                    .map_or_else(|| PodName::from(pod_name.as_str()), |(k, _)| k.clone());
                pods.entry(name).or_default()
            }
        };
        match nack {
            None => c.acks += 1,
            Some(message) => {
                c.nacks += 1;
                // Envoy's NACK messages name the offending field; a bounded prefix
                // keeps what a client can make the server hold per pod and version small.
                let kept = crate::tracking::log_prefix(message, MAX_NACK_MESSAGE_BYTES);
                if c.last_nack_message.as_deref() != Some(kept) {
                    c.last_nack_message = Some(kept.to_string());
                }
            }
        }
    }

    fn pod_counts(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
    ) -> Option<&HashMap<PodName, PodCounts>> {
        self.versions
            .get(node_id)
            .and_then(|logs| logs.get(&t))
            .and_then(|log| log.counts.get(version))
    }

    /// Per-pod counts for one version (empty if unknown).
    pub fn counts(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
    ) -> BTreeMap<String, PodCounts> {
        self.pod_counts(node_id, t, version)
            .map(|pods| {
                pods.iter()
                    .map(|(p, c)| (p.to_string(), c.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// NACKs per pod for one version (pods without NACKs are omitted). Includes pods
    /// that have since disconnected; intersect with [`pods_for_node`](Self::pods_for_node).
    pub fn nacks(&self, node_id: &str, t: ResourceType, version: &str) -> BTreeMap<String, u64> {
        self.pod_counts(node_id, t, version)
            .map(|pods| {
                pods.iter()
                    .filter(|(_, c)| c.nacks > 0)
                    .map(|(p, c)| (p.to_string(), c.nacks))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// ACKs per pod for one version (pods without ACKs are omitted).
    pub fn acks(&self, node_id: &str, t: ResourceType, version: &str) -> BTreeMap<String, u64> {
        self.pod_counts(node_id, t, version)
            .map(|pods| {
                pods.iter()
                    .filter(|(_, c)| c.acks > 0)
                    .map(|(p, c)| (p.to_string(), c.acks))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The SPEC §4 taint test for one type version: there is at least one subscribed
    /// pod and every subscribed pod NACKed `version` at least `threshold` times. Pods
    /// that never answered anything within [`SILENT_POD_GRACE`] of their first stream
    /// (at `now`) do not count.
    pub fn rejected_by_all_pods(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        threshold: u64,
        now: Instant,
    ) -> bool {
        // Looked up in place, without copying the pod names or the counts: this runs for
        // every type of every published revision every 250 ms under the stats lock, and
        // with 10,000 streams the copies took a quarter of the discovery service's CPU
        // and held up the streams' ACK accounting (BENCHMARKS.md).
        let Some(pods) = self.streams.get(node_id).filter(|p| !p.is_empty()) else {
            return false;
        };
        let counts = self.pod_counts(node_id, t, version);
        let mut judged = pods
            .iter()
            .filter(|(_, s)| {
                s.answered || now.saturating_duration_since(s.since) < SILENT_POD_GRACE
            })
            .peekable();
        judged.peek().is_some()
            && judged.all(|(p, _)| {
                counts
                    .and_then(|c| c.get(p))
                    .is_some_and(|c| c.nacks > 0 && c.nacks >= threshold)
            })
    }

    /// Pods of the node with an open stream that never answered anything within
    /// [`SILENT_POD_GRACE`] (at `now`): they do not count for the taint test.
    pub fn silent_pods(&self, node_id: &str, now: Instant) -> BTreeSet<String> {
        self.streams
            .get(node_id)
            .map(|pods| {
                pods.iter()
                    .filter(|(_, s)| {
                        !s.answered && now.saturating_duration_since(s.since) >= SILENT_POD_GRACE
                    })
                    .map(|(p, _)| p.to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A stream of `pod` for `node_id` started (after its node was learned) at `now`.
    pub fn stream_opened(&mut self, node_id: &str, pod_name: &str, now: Instant) {
        self.forget_gone_pods(now);
        if let Some(pods) = self.gone.get_mut(node_id) {
            pods.remove(pod_name);
            if pods.is_empty() {
                self.gone.remove(node_id);
            }
        }
        if !self.streams.contains_key(node_id) {
            self.streams.insert(node_id.to_string(), HashMap::new());
        }
        let Some(pods) = self.streams.get_mut(node_id) else {
            return;
        };
        match pods.get_mut(pod_name) {
            Some(s) => s.open += 1,
            None => {
                pods.insert(
                    PodName::from(pod_name),
                    PodStreams {
                        open: 1,
                        since: now,
                        answered: false,
                    },
                );
            }
        }
    }

    /// A stream of `pod` ended at `now`. Returns the number of streams the pod still
    /// has; at 0 the pod's ACK/NACK counts are dropped [`GONE_POD_RETENTION`] later
    /// unless a stream of it opens again meanwhile.
    pub fn stream_closed(&mut self, node_id: &str, pod_name: &str, now: Instant) -> usize {
        self.forget_gone_pods(now);
        let Some(pods) = self.streams.get_mut(node_id) else {
            return 0;
        };
        let Some((name, s)) = pods.get_key_value(pod_name) else {
            return 0;
        };
        let (name, left) = (name.clone(), s.open.saturating_sub(1));
        if left == 0 {
            pods.remove(pod_name);
            if pods.is_empty() {
                self.streams.remove(node_id);
            }
            self.gone
                .entry(node_id.to_string())
                .or_default()
                .insert(name.clone(), now);
            self.gone_order.push_back((now, node_id.to_string(), name));
        } else if let Some(s) = pods.get_mut(pod_name) {
            s.open = left;
        }
        left
    }

    /// Drops the counts of pods whose last stream closed [`GONE_POD_RETENTION`] or more
    /// before `now` and that have not come back.
    fn forget_gone_pods(&mut self, now: Instant) {
        while let Some((closed, _, _)) = self.gone_order.front() {
            if now.saturating_duration_since(*closed) < GONE_POD_RETENTION {
                break;
            }
            let Some((closed, node_id, pod)) = self.gone_order.pop_front() else {
                break;
            };
            let Some(pods) = self.gone.get_mut(&node_id) else {
                continue;
            };
            if pods.get(&pod) != Some(&closed) {
                continue;
            }
            pods.remove(&pod);
            if pods.is_empty() {
                self.gone.remove(&node_id);
            }
            self.clear_pod(&node_id, &pod);
        }
    }

    /// Pods whose ACK/NACK counts are kept although they have no stream (see
    /// [`GONE_POD_RETENTION`]), for tests and status pages.
    pub fn gone_pods(&self) -> usize {
        self.gone.values().map(HashMap::len).sum()
    }

    /// Pods with at least one open stream for the node.
    pub fn pods_for_node(&self, node_id: &str) -> BTreeSet<String> {
        self.streams
            .get(node_id)
            .map(|p| p.keys().map(|k| k.to_string()).collect())
            .unwrap_or_default()
    }

    /// Open streams per pod for the node.
    pub fn streams_for_node(&self, node_id: &str) -> BTreeMap<String, usize> {
        self.streams
            .get(node_id)
            .map(|p| p.iter().map(|(k, s)| (k.to_string(), s.open)).collect())
            .unwrap_or_default()
    }

    /// Forgets every ACK/NACK count of a pod for the node (stream counts untouched).
    pub fn clear_pod(&mut self, node_id: &str, pod_name: &str) {
        if let Some(logs) = self.versions.get_mut(node_id) {
            for log in logs.values_mut() {
                for pods in log.counts.values_mut() {
                    pods.remove(pod_name);
                }
            }
        }
    }

    /// Forgets every count of a node (e.g. its EnvoyConfig was deleted).
    pub fn clear_node(&mut self, node_id: &str) {
        self.versions.remove(node_id);
        self.gone.remove(node_id);
    }

    /// Forgets the counts of one version: a revision that is published again (after its
    /// tainted twin was deleted) is judged on fresh NACKs only.
    pub fn reset_version(&mut self, node_id: &str, t: ResourceType, version: &str) {
        if let Some(log) = self
            .versions
            .get_mut(node_id)
            .and_then(|logs| logs.get_mut(&t))
        {
            log.counts.remove(version);
            log.order.retain(|v| v != version);
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiscoveryLabels {
    node_id: String,
    resource_type: String,
    pod_name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    node_id: String,
    api: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PushLabels {
    resource_type: String,
}

/// Buckets of the push latency histogram: 50 µs … 5 s (a push is normally sub-ms).
pub const PUSH_LATENCY_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];

fn push_histogram() -> Histogram {
    Histogram::new(PUSH_LATENCY_BUCKETS)
}

/// Label value for requests of type URLs we do not serve (bounded cardinality).
const UNKNOWN_TYPE: &str = "unknown";

/// Prometheus series of the discovery service.
#[derive(Debug, Clone)]
pub struct XdsMetrics {
    requests: Family<DiscoveryLabels, Counter>,
    acks: Family<DiscoveryLabels, Counter>,
    nacks: Family<DiscoveryLabels, Counter>,
    streams: Family<StreamLabels, Gauge>,
    push_latency: Family<PushLabels, Histogram, fn() -> Histogram>,
}

impl XdsMetrics {
    /// Registers the series (prometheus-client appends `_total` to counters):
    /// `marin3r_xdss_discovery_requests_total`, `marin3r_xdss_discovery_ack_total`,
    /// `marin3r_xdss_discovery_nack_total` {node_id, resource_type, pod_name},
    /// `marin3r_xdss_streams` {node_id, api}, and
    /// `marin3r_xdss_push_latency_seconds` {resource_type}.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            streams: Family::default(),
            push_latency: Family::new_with_constructor(push_histogram),
        };
        registry.register(
            "marin3r_xdss_discovery_requests",
            "Discovery requests received, per node, resource type and pod",
            m.requests.clone(),
        );
        registry.register(
            "marin3r_xdss_discovery_ack",
            "Responses accepted (ACK) by Envoy, per node, resource type and pod",
            m.acks.clone(),
        );
        registry.register(
            "marin3r_xdss_discovery_nack",
            "Responses rejected (NACK) by Envoy, per node, resource type and pod",
            m.nacks.clone(),
        );
        registry.register(
            "marin3r_xdss_streams",
            "Open ADS streams, per node and API flavour",
            m.streams.clone(),
        );
        registry.register(
            "marin3r_xdss_push_latency_seconds",
            "Time from a snapshot being set to the response being produced, per resource type",
            m.push_latency.clone(),
        );
        m
    }

    fn labels(node_id: &str, t: Option<ResourceType>, pod_name: &str) -> DiscoveryLabels {
        DiscoveryLabels {
            node_id: node_id.to_string(),
            resource_type: t.map_or(UNKNOWN_TYPE, ResourceType::as_str).to_string(),
            pod_name: pod_name.to_string(),
        }
    }

    /// Counts one event.
    pub fn record(&self, event: &StreamEvent) {
        match event {
            StreamEvent::Request {
                node_id,
                pod_name,
                resource_type,
            } => {
                self.requests
                    .get_or_create(&Self::labels(node_id, *resource_type, pod_name))
                    .inc();
            }
            StreamEvent::Ack {
                node_id,
                pod_name,
                resource_type,
                ..
            } => {
                self.acks
                    .get_or_create(&Self::labels(node_id, Some(*resource_type), pod_name))
                    .inc();
            }
            StreamEvent::Nack {
                node_id,
                pod_name,
                resource_type,
                ..
            } => {
                self.nacks
                    .get_or_create(&Self::labels(node_id, Some(*resource_type), pod_name))
                    .inc();
            }
        }
    }

    /// [`record`](Self::record) for an event of the stream whose node is `node`, through
    /// the stream's cached counter handles (no label allocation and no family lookup
    /// after a stream's first event of each kind and type).
    fn record_cached(&self, node: &NodeInfo, counters: &mut StreamCounters, event: &StreamEvent) {
        let (kind, t, family) = match event {
            StreamEvent::Request { resource_type, .. } => {
                (CounterKind::Request, *resource_type, &self.requests)
            }
            StreamEvent::Ack { resource_type, .. } => {
                (CounterKind::Ack, Some(*resource_type), &self.acks)
            }
            StreamEvent::Nack { resource_type, .. } => {
                (CounterKind::Nack, Some(*resource_type), &self.nacks)
            }
        };
        let cached = counters
            .handles
            .iter()
            .find(|(k, ct, _)| *k == kind && *ct == t)
            .map(|(_, _, c)| c);
        match cached {
            Some(counter) => {
                counter.inc();
            }
            None => {
                let counter = family
                    .get_or_create(&Self::labels(&node.id, t, &node.pod_name))
                    .clone();
                counter.inc();
                counters.handles.push((kind, t, counter));
            }
        }
    }

    fn stream_labels(node_id: &str, api: Api) -> StreamLabels {
        StreamLabels {
            node_id: node_id.to_string(),
            api: api.as_str().to_string(),
        }
    }

    pub fn stream_opened(&self, node_id: &str, api: Api) {
        self.streams
            .get_or_create(&Self::stream_labels(node_id, api))
            .inc();
    }

    /// One stream of the node and API fewer; the series is removed with the node's last
    /// stream of that API, so node ids seen over time do not grow `/metrics`. Callers
    /// serialise opens and closes (the stats lock) so the removal cannot race an open.
    pub fn stream_closed(&self, node_id: &str, api: Api) {
        let labels = Self::stream_labels(node_id, api);
        let before = self.streams.get_or_create(&labels).dec();
        if before <= 1 {
            self.streams.remove(&labels);
        }
    }

    /// Observes the time between a snapshot's publication and a push of `t`.
    pub fn observe_push_latency(&self, t: ResourceType, latency: Duration) {
        self.push_latency
            .get_or_create(&PushLabels {
                resource_type: t.as_str().to_string(),
            })
            .observe(latency.as_secs_f64());
    }

    /// Drops the per-pod series of a pod that has no stream any more, so pod churn
    /// does not grow the series set forever (a returning pod restarts from zero,
    /// which Prometheus handles as a counter reset).
    pub fn remove_pod(&self, node_id: &str, pod_name: &str) {
        let types = ResourceType::ALL.into_iter().map(Some).chain([None]);
        for t in types {
            let labels = Self::labels(node_id, t, pod_name);
            self.requests.remove(&labels);
            self.acks.remove(&labels);
            self.nacks.remove(&labels);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CounterKind {
    Request,
    Ack,
    Nack,
}

/// One stream's handles on its Prometheus counters (see [`SharedStats::record_stream`]):
/// a few entries per stream, one per kind of event and type it has seen.
///
/// A handle stays the live series while its stream is open: a pod's series are only
/// dropped when its last stream closes ([`SharedStats::stream_closed`], under the
/// stats lock, so a stream opening concurrently cannot keep a handle of a dropped one).
#[derive(Debug, Default)]
pub struct StreamCounters {
    handles: Vec<(CounterKind, Option<ResourceType>, Counter)>,
}

fn same_node(event: &StreamEvent, node: &NodeInfo) -> bool {
    let (node_id, pod_name) = match event {
        StreamEvent::Request {
            node_id, pod_name, ..
        }
        | StreamEvent::Ack {
            node_id, pod_name, ..
        }
        | StreamEvent::Nack {
            node_id, pod_name, ..
        } => (node_id, pod_name),
    };
    *node_id == node.id && *pod_name == node.pod_name
}

/// Thread-safe stats shared by the ADS shell (writer) and the self-healing engine
/// (reader), optionally feeding [`XdsMetrics`]. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct SharedStats {
    inner: Arc<Mutex<AckNackStats>>,
    metrics: Option<XdsMetrics>,
}

impl SharedStats {
    /// Stats without Prometheus series.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stats that also update `metrics`.
    pub fn with_metrics(metrics: XdsMetrics) -> Self {
        Self {
            inner: Arc::default(),
            metrics: Some(metrics),
        }
    }

    fn lock(&self) -> MutexGuard<'_, AckNackStats> {
        // Every mutation leaves the maps consistent, so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Folds the events of one state machine outcome in.
    pub fn record(&self, events: &[StreamEvent]) {
        if events.is_empty() {
            return;
        }
        if let Some(m) = &self.metrics {
            events.iter().for_each(|e| m.record(e));
        }
        let mut s = self.lock();
        events.iter().for_each(|e| s.record(e));
    }

    /// [`record`](Self::record) for the events of one stream whose node is `node` (once
    /// learned), keeping the stream's counter handles in `counters`: the ADS shell calls
    /// this for every request of every stream, so it must not allocate label sets.
    pub fn record_stream(
        &self,
        node: Option<&NodeInfo>,
        counters: &mut StreamCounters,
        events: &[StreamEvent],
    ) {
        if events.is_empty() {
            return;
        }
        if let Some(m) = &self.metrics {
            for e in events {
                match node {
                    Some(n) if same_node(e, n) => m.record_cached(n, counters, e),
                    _ => m.record(e),
                }
            }
        }
        let mut s = self.lock();
        events.iter().for_each(|e| s.record(e));
    }

    /// A stream learned its node: counts it for the pod and the stream gauge.
    pub fn stream_opened(&self, node: &NodeInfo, api: Api) {
        let mut s = self.lock();
        s.stream_opened(&node.id, &node.pod_name, Instant::now());
        if let Some(m) = &self.metrics {
            // Under the lock, like the removal in `stream_closed`.
            m.stream_opened(&node.id, api);
        }
        drop(s);
    }

    /// A stream that had learned its node ended. When it was the pod's last stream,
    /// the pod's per-pod Prometheus series are dropped (its ACK/NACK stats stay until
    /// [`clear_pod`](Self::clear_pod), or [`GONE_POD_RETENTION`] if it does not come
    /// back); the node's stream gauge goes with its last stream.
    pub fn stream_closed(&self, node: &NodeInfo, api: Api) {
        let mut s = self.lock();
        let left = s.stream_closed(&node.id, &node.pod_name, Instant::now());
        if let Some(m) = &self.metrics {
            m.stream_closed(&node.id, api);
            if left == 0 {
                // Under the lock: a stream of the pod that opens meanwhile must not
                // cache handles of the series dropped here (see `StreamCounters`).
                m.remove_pod(&node.id, &node.pod_name);
            }
        }
        drop(s);
    }

    /// See [`XdsMetrics::observe_push_latency`]; a no-op without metrics.
    pub fn observe_push_latency(&self, t: ResourceType, latency: Duration) {
        if let Some(m) = &self.metrics {
            m.observe_push_latency(t, latency);
        }
    }

    pub fn counts(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
    ) -> BTreeMap<String, PodCounts> {
        self.lock().counts(node_id, t, version)
    }

    pub fn nacks(&self, node_id: &str, t: ResourceType, version: &str) -> BTreeMap<String, u64> {
        self.lock().nacks(node_id, t, version)
    }

    pub fn acks(&self, node_id: &str, t: ResourceType, version: &str) -> BTreeMap<String, u64> {
        self.lock().acks(node_id, t, version)
    }

    pub fn rejected_by_all_pods(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        threshold: u64,
    ) -> bool {
        self.lock()
            .rejected_by_all_pods(node_id, t, version, threshold, Instant::now())
    }

    /// Pods of the node that never answered anything (see [`SILENT_POD_GRACE`]).
    pub fn silent_pods(&self, node_id: &str) -> BTreeSet<String> {
        self.lock().silent_pods(node_id, Instant::now())
    }

    pub fn pods_for_node(&self, node_id: &str) -> BTreeSet<String> {
        self.lock().pods_for_node(node_id)
    }

    pub fn clear_pod(&self, node_id: &str, pod_name: &str) {
        self.lock().clear_pod(node_id, pod_name);
    }

    pub fn clear_node(&self, node_id: &str) {
        self.lock().clear_node(node_id);
    }

    pub fn reset_version(&self, node_id: &str, t: ResourceType, version: &str) {
        self.lock().reset_version(node_id, t, version);
    }

    /// A copy of the whole aggregation (for status pages and tests).
    pub fn snapshot(&self) -> AckNackStats {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ResourceType::*;
    use envoy_types::pb::google::protobuf::{Struct, Value};

    fn ack(pod: &str, t: ResourceType, v: &str) -> StreamEvent {
        StreamEvent::Ack {
            node_id: "n".into(),
            pod_name: pod.into(),
            resource_type: t,
            version: v.into(),
        }
    }

    fn nack(pod: &str, t: ResourceType, v: &str, msg: &str) -> StreamEvent {
        StreamEvent::Nack {
            node_id: "n".into(),
            pod_name: pod.into(),
            resource_type: t,
            version: v.into(),
            message: msg.into(),
        }
    }

    #[test]
    fn node_info_reads_pod_name() {
        let mut node = Node {
            id: "n1".into(),
            ..Default::default()
        };
        assert_eq!(
            NodeInfo::from_node(&node),
            Some(NodeInfo {
                id: "n1".into(),
                pod_name: String::new()
            })
        );
        node.metadata = Some(Struct {
            fields: [(
                "pod_name".to_string(),
                Value {
                    kind: Some(Kind::StringValue("envoy-abc".into())),
                },
            )]
            .into(),
        });
        assert_eq!(NodeInfo::from_node(&node).unwrap().pod_name, "envoy-abc");
        node.metadata = Some(Struct {
            fields: [(
                "pod_name".to_string(),
                Value {
                    kind: Some(Kind::NumberValue(1.0)),
                },
            )]
            .into(),
        });
        assert_eq!(NodeInfo::from_node(&node).unwrap().pod_name, "");
        assert_eq!(NodeInfo::from_node(&Node::default()), None);
    }

    #[test]
    fn to_node_is_the_inverse_of_from_node() {
        let info = NodeInfo {
            id: "n1".into(),
            pod_name: "envoy-abc".into(),
        };
        let node = info.to_node();
        assert_eq!(node.id, "n1");
        assert!(
            node.metadata
                .as_ref()
                .unwrap()
                .fields
                .contains_key("pod_name")
        );
        assert_eq!(NodeInfo::from_node(&node), Some(info));
    }

    #[test]
    fn aggregates_per_version_and_pod() {
        let mut s = AckNackStats::new();
        for e in [
            ack("p1", Listener, "v1"),
            ack("p2", Listener, "v1"),
            nack("p1", Listener, "v2", "bad listener"),
            nack("p1", Listener, "v2", "bad listener again"),
            nack("p2", Listener, "v2", "bad"),
            nack("p2", Cluster, "v2", "other type"),
            StreamEvent::Request {
                node_id: "n".into(),
                pod_name: "p1".into(),
                resource_type: None,
            },
        ] {
            s.record(&e);
        }
        assert_eq!(
            s.acks("n", Listener, "v1"),
            [("p1".into(), 1), ("p2".into(), 1)].into()
        );
        assert!(s.nacks("n", Listener, "v1").is_empty());
        assert_eq!(
            s.nacks("n", Listener, "v2"),
            [("p1".into(), 2), ("p2".into(), 1)].into()
        );
        assert_eq!(s.nacks("n", Cluster, "v2"), [("p2".into(), 1)].into());
        assert!(s.nacks("other", Listener, "v2").is_empty());
        let c = s.counts("n", Listener, "v2");
        assert_eq!(
            c["p1"].last_nack_message.as_deref(),
            Some("bad listener again")
        );

        s.clear_pod("n", "p1");
        assert_eq!(s.nacks("n", Listener, "v2"), [("p2".into(), 1)].into());
        s.clear_node("n");
        assert!(s.nacks("n", Listener, "v2").is_empty());
    }

    #[test]
    fn streams_and_taint_test() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        assert!(
            !s.rejected_by_all_pods("n", Route, "v", 1, t0),
            "no pods: never rejected by all"
        );
        s.stream_opened("n", "p1", t0);
        s.stream_opened("n", "p1", t0);
        s.stream_opened("n", "p2", t0);
        assert_eq!(
            s.pods_for_node("n"),
            ["p1".to_string(), "p2".to_string()].into()
        );
        assert_eq!(s.streams_for_node("n")["p1"], 2);
        for _ in 0..5 {
            s.record(&nack("p1", Route, "v", "x"));
        }
        assert!(
            !s.rejected_by_all_pods("n", Route, "v", 5, t0),
            "partial rejection"
        );
        for _ in 0..4 {
            s.record(&nack("p2", Route, "v", "x"));
        }
        assert!(!s.rejected_by_all_pods("n", Route, "v", 5, t0));
        assert!(s.rejected_by_all_pods("n", Route, "v", 4, t0));
        // p2 leaves: only p1 is subscribed, and it rejected 5 times.
        assert_eq!(s.stream_closed("n", "p2", t0), 0);
        assert!(s.rejected_by_all_pods("n", Route, "v", 5, t0));
        assert_eq!(s.stream_closed("n", "p1", t0), 1);
        assert_eq!(s.stream_closed("n", "p1", t0), 0);
        assert_eq!(s.stream_closed("n", "p1", t0), 0, "extra close is harmless");
        assert!(s.pods_for_node("n").is_empty());
    }

    #[test]
    fn a_pod_that_never_answers_stops_counting_after_the_grace_period() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        s.stream_opened("n", "envoy", t0);
        s.stream_opened("n", "silent", t0);
        for _ in 0..5 {
            s.record(&nack("envoy", Route, "v", "bad route"));
        }
        let later = |d: Duration| t0 + d;
        assert!(
            !s.rejected_by_all_pods("n", Route, "v", 5, later(Duration::from_secs(1))),
            "a silent pod counts while it may still answer"
        );
        assert!(s.silent_pods("n", later(Duration::from_secs(1))).is_empty());
        assert!(
            s.rejected_by_all_pods("n", Route, "v", 5, later(SILENT_POD_GRACE)),
            "a pod that never answered anything no longer blocks self-healing"
        );
        assert_eq!(
            s.silent_pods("n", later(SILENT_POD_GRACE)),
            ["silent".to_string()].into()
        );
        // A pod that answered something (here an ACK of another version) keeps counting.
        s.record(&ack("silent", Route, "v0"));
        assert!(!s.rejected_by_all_pods("n", Route, "v", 5, later(SILENT_POD_GRACE * 3)));
        // Only silent pods: nobody is judged, nothing is rejected by all.
        let mut only_silent = AckNackStats::new();
        only_silent.stream_opened("m", "silent", t0);
        assert!(!only_silent.rejected_by_all_pods("m", Route, "v", 1, later(SILENT_POD_GRACE)));
    }

    #[test]
    fn nack_messages_are_kept_bounded() {
        let mut s = AckNackStats::new();
        s.record(&nack("p", Cluster, "v", &"é".repeat(1 << 20)));
        let kept = s.counts("n", Cluster, "v")["p"]
            .last_nack_message
            .clone()
            .unwrap();
        assert_eq!(kept.len(), MAX_NACK_MESSAGE_BYTES);
        s.record(&nack("p", Cluster, "v", "short"));
        assert_eq!(
            s.counts("n", Cluster, "v")["p"]
                .last_nack_message
                .as_deref(),
            Some("short")
        );
    }

    #[test]
    fn versions_are_bounded() {
        let mut s = AckNackStats::with_max_versions(2);
        s.record(&ack("p", Cluster, "v1"));
        s.record(&ack("p", Cluster, "v2"));
        s.record(&ack("p", Cluster, "v2"));
        s.record(&ack("p", Listener, "v1"));
        s.record(&ack("p", Cluster, "v3"));
        assert!(s.acks("n", Cluster, "v1").is_empty(), "oldest evicted");
        assert_eq!(s.acks("n", Cluster, "v2")["p"], 2);
        assert_eq!(s.acks("n", Cluster, "v3")["p"], 1);
        assert_eq!(
            s.acks("n", Listener, "v1")["p"],
            1,
            "per-type logs are independent"
        );
    }

    #[test]
    fn prometheus_series() {
        let mut registry = Registry::default();
        let stats = SharedStats::with_metrics(XdsMetrics::register(&mut registry));
        let node = NodeInfo {
            id: "n".into(),
            pod_name: "p1".into(),
        };
        stats.stream_opened(&node, Api::Sotw);
        stats.record(&[
            StreamEvent::Request {
                node_id: "n".into(),
                pod_name: "p1".into(),
                resource_type: Some(Cluster),
            },
            StreamEvent::Request {
                node_id: "n".into(),
                pod_name: "p1".into(),
                resource_type: None,
            },
            ack("p1", Cluster, "v1"),
            nack("p1", Cluster, "v2", "boom"),
        ]);
        stats.observe_push_latency(Cluster, Duration::from_micros(300));
        assert_eq!(stats.nacks("n", Cluster, "v2")["p1"], 1);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for needle in [
            r#"marin3r_xdss_discovery_requests_total{node_id="n",resource_type="cluster",pod_name="p1"} 1"#,
            r#"marin3r_xdss_discovery_requests_total{node_id="n",resource_type="unknown",pod_name="p1"} 1"#,
            r#"marin3r_xdss_discovery_ack_total{node_id="n",resource_type="cluster",pod_name="p1"} 1"#,
            r#"marin3r_xdss_discovery_nack_total{node_id="n",resource_type="cluster",pod_name="p1"} 1"#,
            r#"marin3r_xdss_streams{node_id="n",api="sotw"} 1"#,
            r#"marin3r_xdss_push_latency_seconds_bucket{le="0.0005",resource_type="cluster"} 1"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(!text.contains("v2"), "no version label");

        stats.stream_closed(&node, Api::Sotw);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            !text.contains(r#"node_id="n",api="sotw""#),
            "the stream gauge of a node without streams is removed:\n{text}"
        );
        assert!(
            !text.contains(r#"pod_name="p1""#),
            "series of a gone pod are dropped:\n{text}"
        );
        // The ACK/NACK stats survive for the self-healing engine.
        assert_eq!(stats.nacks("n", Cluster, "v2")["p1"], 1);
        assert!(stats.pods_for_node("n").is_empty());
    }

    #[test]
    fn stream_counters_feed_the_same_series() {
        let mut registry = Registry::default();
        let stats = SharedStats::with_metrics(XdsMetrics::register(&mut registry));
        let node = NodeInfo {
            id: "n".into(),
            pod_name: "p1".into(),
        };
        let request = |t| StreamEvent::Request {
            node_id: "n".into(),
            pod_name: "p1".into(),
            resource_type: t,
        };
        let encode = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        for round in 1..=2 {
            stats.stream_opened(&node, Api::Sotw);
            let mut counters = StreamCounters::default();
            // Before the node is known, events go through the plain path.
            stats.record_stream(None, &mut counters, &[request(Some(Listener))]);
            for _ in 0..3 {
                stats.record_stream(
                    Some(&node),
                    &mut counters,
                    &[request(Some(Cluster)), ack("p1", Cluster, "v1")],
                );
            }
            stats.record_stream(
                Some(&node),
                &mut counters,
                &[request(None), nack("p1", Cluster, "v2", "boom")],
            );
            // An event of another pod (never the case on one stream) is not miscounted.
            stats.record_stream(Some(&node), &mut counters, &[ack("p2", Cluster, "v1")]);
            let text = encode();
            for needle in [
                r#"marin3r_xdss_discovery_requests_total{node_id="n",resource_type="cluster",pod_name="p1"} 3"#,
                r#"marin3r_xdss_discovery_requests_total{node_id="n",resource_type="listener",pod_name="p1"} 1"#,
                r#"marin3r_xdss_discovery_requests_total{node_id="n",resource_type="unknown",pod_name="p1"} 1"#,
                r#"marin3r_xdss_discovery_ack_total{node_id="n",resource_type="cluster",pod_name="p1"} 3"#,
                r#"marin3r_xdss_discovery_nack_total{node_id="n",resource_type="cluster",pod_name="p1"} 1"#,
            ] {
                assert!(
                    text.contains(needle),
                    "round {round}: missing {needle} in\n{text}"
                );
            }
            // p2 has no stream, so its series are never dropped.
            let p2 = format!(
                r#"marin3r_xdss_discovery_ack_total{{node_id="n",resource_type="cluster",pod_name="p2"}} {round}"#
            );
            assert!(text.contains(&p2), "round {round}: missing {p2} in\n{text}");
            assert_eq!(stats.acks("n", Cluster, "v1")["p1"], 3 * round);
            // The pod's last stream closes: its series go, and the next stream (round 2)
            // starts them afresh with new handles.
            stats.stream_closed(&node, Api::Sotw);
            assert!(!encode().contains(r#"pod_name="p1""#));
        }
    }

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn per_node_series_go_with_the_last_stream() {
        let mut registry = Registry::default();
        let stats = SharedStats::with_metrics(XdsMetrics::register(&mut registry));
        let nodes: Vec<NodeInfo> = (0..50)
            .map(|i| NodeInfo {
                id: format!("node-{i}"),
                pod_name: format!("pod-{i}"),
            })
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            let api = if i % 2 == 0 { Api::Sotw } else { Api::Delta };
            stats.stream_opened(n, api);
            let mut counters = StreamCounters::default();
            stats.record_stream(
                Some(n),
                &mut counters,
                &[StreamEvent::Request {
                    node_id: n.id.clone(),
                    pod_name: n.pod_name.clone(),
                    resource_type: Some(Cluster),
                }],
            );
        }
        let text = encode(&registry);
        assert!(text.contains(r#"marin3r_xdss_streams{node_id="node-49",api="delta"} 1"#));
        // A node with two streams (two pods, two APIs) keeps its series until the last.
        let twice = NodeInfo {
            id: "twice".into(),
            pod_name: "a".into(),
        };
        let other_pod = NodeInfo {
            id: "twice".into(),
            pod_name: "b".into(),
        };
        stats.stream_opened(&twice, Api::Sotw);
        stats.stream_opened(&other_pod, Api::Sotw);
        stats.stream_opened(&other_pod, Api::Delta);
        for (i, n) in nodes.iter().enumerate() {
            let api = if i % 2 == 0 { Api::Sotw } else { Api::Delta };
            stats.stream_closed(n, api);
        }
        let text = encode(&registry);
        assert!(
            !text.contains("node-"),
            "no series of a node without streams:\n{text}"
        );
        stats.stream_closed(&twice, Api::Sotw);
        let text = encode(&registry);
        assert!(
            text.contains(r#"marin3r_xdss_streams{node_id="twice",api="sotw"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"marin3r_xdss_streams{node_id="twice",api="delta"} 1"#),
            "{text}"
        );
        stats.stream_closed(&other_pod, Api::Sotw);
        let text = encode(&registry);
        assert!(!text.contains(r#"node_id="twice",api="sotw""#), "{text}");
        assert!(
            text.contains(r#"marin3r_xdss_streams{node_id="twice",api="delta"} 1"#),
            "{text}"
        );
        stats.stream_closed(&other_pod, Api::Delta);
        assert!(!encode(&registry).contains("twice"));
        // A node that comes back gets its series again, from 1.
        stats.stream_opened(&twice, Api::Sotw);
        assert!(
            encode(&registry).contains(r#"marin3r_xdss_streams{node_id="twice",api="sotw"} 1"#)
        );
    }

    #[test]
    fn counts_of_a_gone_pod_are_dropped_after_the_retention_unless_it_comes_back() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // 100 made-up pods connect, ACK, leave.
        for i in 0..100 {
            let pod = format!("p{i}");
            s.stream_opened("n", &pod, t0);
            s.record(&ack(&pod, Cluster, "v1"));
            assert_eq!(s.stream_closed("n", &pod, at(1)), 0);
        }
        // "back" flaps: gone at 1 s, back at 2 s, gone again at 200 s.
        s.stream_opened("n", "back", t0);
        s.record(&nack("back", Cluster, "v1", "bad"));
        s.stream_closed("n", "back", at(1));
        s.stream_opened("n", "back", at(2));
        // "stays" keeps its stream.
        s.stream_opened("n", "stays", t0);
        s.record(&nack("stays", Cluster, "v1", "bad"));
        assert_eq!(s.gone_pods(), 100);
        assert_eq!(
            s.acks("n", Cluster, "v1").len(),
            100,
            "kept within the retention"
        );
        s.stream_closed("n", "back", at(200));

        // Retention over for the first closes: only their counts go.
        s.stream_opened("n", "trigger", at(1) + GONE_POD_RETENTION);
        assert!(s.acks("n", Cluster, "v1").is_empty(), "gone pods dropped");
        assert_eq!(
            s.nacks("n", Cluster, "v1"),
            [("back".to_string(), 1), ("stays".to_string(), 1)].into(),
            "a pod that came back and left later keeps its counts; a connected pod too"
        );
        assert_eq!(s.gone_pods(), 1);
        s.stream_closed("n", "trigger", at(201) + GONE_POD_RETENTION);
        assert_eq!(
            s.nacks("n", Cluster, "v1"),
            [("stays".to_string(), 1)].into()
        );
        // Bounded: everything that left is forgotten; the self-healing view is intact.
        assert_eq!(
            s.gone_pods(),
            1,
            "only 'trigger' (closed just now) is remembered"
        );
        assert!(s.rejected_by_all_pods("n", Cluster, "v1", 1, at(202) + GONE_POD_RETENTION));
    }
}
