//! The Prometheus series of the discovery service ([`XdsMetrics`]): discovery requests,
//! ACKs and NACKs per node, type and pod, open streams per node and ADS flavour, and
//! the push latency per type. No version label: cardinality stays bounded by nodes ×
//! types × pods, and a pod's series go with its last stream. [`StreamCounters`] keeps a
//! stream's handles on its series, so counting an event allocates nothing.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use marin3r_envoyconfig::resource::ResourceType;

use crate::events::{Api, StreamEvent};
use crate::node::NodeInfo;

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
    pod_stream_overlaps: Counter,
    push_latency: Family<PushLabels, Histogram, fn() -> Histogram>,
}

impl XdsMetrics {
    /// Registers the series (prometheus-client appends `_total` to counters):
    /// `marin3r_xdss_discovery_requests_total`, `marin3r_xdss_discovery_ack_total`,
    /// `marin3r_xdss_discovery_nack_total` {node_id, resource_type, pod_name},
    /// `marin3r_xdss_streams` {node_id, api}, `marin3r_xdss_pod_stream_overlaps_total`
    /// (no labels), and `marin3r_xdss_push_latency_seconds` {resource_type}.
    ///
    /// The `pod_name` label is upstream MARIN3R's (dashboards built on it keep working).
    /// Its value is what the client says in `node.metadata.pod_name` (at most 1 KiB,
    /// `node::check_node`), so a client holding the certificate can choose it; pod
    /// names are not secret. The number of series stays bounded by the open streams: a
    /// pod's series exist from its first stream's first event and are removed with its
    /// last stream, events before a stream names its node count under empty labels, and
    /// nothing else creates per-pod series.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            streams: Family::default(),
            pod_stream_overlaps: Counter::default(),
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
            "marin3r_xdss_pod_stream_overlaps",
            "ADS streams opened while another stream of the same node id and pod name was open",
            m.pod_stream_overlaps.clone(),
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

    /// [`record`](Self::record) for the events of one stream whose node is `node` (once
    /// learned), through the stream's handles in `counters`; events before the node is
    /// known, or of another node or pod (never the case on one stream), take the plain
    /// path. The ADS shell calls this for every request of every stream.
    pub fn record_stream(
        &self,
        node: Option<&NodeInfo>,
        counters: &mut StreamCounters,
        events: &[StreamEvent],
    ) {
        for e in events {
            match node {
                Some(n) if same_node(e, n) => self.record_cached(n, counters, e),
                _ => self.record(e),
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

    /// A stream opened while another stream of its pod was open.
    pub fn pod_stream_overlap(&self) {
        self.pod_stream_overlaps.inc();
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

/// One stream's handles on its Prometheus counters (see [`XdsMetrics::record_stream`]):
/// a few entries per stream, one per kind of event and type it has seen.
///
/// A handle stays the live series while its stream is open: a pod's series are only
/// dropped ([`XdsMetrics::remove_pod`]) when its last stream closes, under the stats
/// lock (`SharedStats::stream_closed`), so a stream opening concurrently cannot keep a
/// handle of a dropped one.
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
