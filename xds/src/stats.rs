//! The ACK/NACK statistics shared by the ADS shell (writer) and the self-healing engine
//! (reader): [`SharedStats`] folds the [`StreamEvent`]s of every stream into the
//! [`AckNackStats`] aggregation and, optionally, the [`XdsMetrics`] series, under one
//! lock (`Arc<Mutex<…>>` inside, cheap to clone).
//!
//! Its parts live in their own modules: [`crate::node`] (who is on a stream),
//! [`crate::events`] (what a stream reports), [`crate::acknack`] (the aggregation) and
//! [`crate::metrics`] (the Prometheus series). They are re-exported here, so
//! `marin3r_xds::stats::…` paths keep working.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use marin3r_envoyconfig::resource::ResourceType;

pub use crate::acknack::{
    AckNackStats, DEFAULT_MAX_VERSIONS, Footprint, GONE_POD_RETENTION, MAX_NACK_MESSAGE_BYTES,
    NodeNacks, Opened, PodCounts, SILENT_POD_GRACE, StreamId,
};
pub use crate::events::{Api, StreamEvent};
pub use crate::metrics::{PUSH_LATENCY_BUCKETS, StreamCounters, XdsMetrics};
pub use crate::node::NodeInfo;

/// The clock of the stats: tokio's (the wall clock, unless a test paused it).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
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

    /// The aggregation, with the counts of pods gone for [`GONE_POD_RETENTION`]
    /// dropped first: the periodic readers (the self-healing evaluation) sweep them even
    /// when no stream opens or closes any more.
    fn lock(&self) -> MutexGuard<'_, AckNackStats> {
        // Every mutation leaves the maps consistent, so a poisoned lock is usable.
        let mut s = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        s.forget_gone_pods(now());
        s
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
            m.record_stream(node, counters, events);
        }
        let mut s = self.lock();
        events.iter().for_each(|e| s.record(e));
    }

    /// A stream learned its node: counts it for the pod and the stream gauge, and
    /// returns its id (for [`stream_closed`](Self::stream_closed) and log lines). A
    /// stream of a pod that has another stream open is reported: a WARN naming the
    /// node, the pod and both stream ids, and `marin3r_xdss_pod_stream_overlaps_total`.
    pub fn stream_opened(&self, node: &NodeInfo, api: Api) -> StreamId {
        let mut s = self.lock();
        let opened = s.stream_opened(&node.id, &node.pod_name, now());
        if let Some(m) = &self.metrics {
            // Under the lock, like the removal in `stream_closed`.
            m.stream_opened(&node.id, api);
            if opened.overlaps.is_some() {
                m.pod_stream_overlap();
            }
        }
        drop(s);
        if let Some(other) = opened.overlaps {
            // Node id and pod name are bounded by `check_node`.
            tracing::warn!(
                node_id = %node.id,
                pod_name = %node.pod_name,
                stream_id = %opened.stream,
                other_stream_id = %other,
                api = api.as_str(),
                "two live ADS streams claim one pod (an Envoy reconnecting before its old stream closed, or another client using its name); an ACK on either counts for the pod"
            );
        }
        opened.stream
    }

    /// A stream that had learned its node ended. When it was the pod's last stream,
    /// the pod's per-pod Prometheus series are dropped (its ACK/NACK stats stay until
    /// [`clear_pod`](Self::clear_pod), or [`GONE_POD_RETENTION`] if it does not come
    /// back); the node's stream gauge goes with its last stream.
    pub fn stream_closed(&self, node: &NodeInfo, api: Api, stream: StreamId) {
        let mut s = self.lock();
        let left = s.stream_closed(&node.id, &node.pod_name, stream, now());
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
            .rejected_by_all_pods(node_id, t, version, threshold, now())
    }

    /// How the judged pods of `node_id` answered `versions` (see
    /// [`AckNackStats::node_nacks`]).
    pub fn node_nacks(
        &self,
        node_id: &str,
        versions: &BTreeMap<ResourceType, String>,
        threshold: u64,
    ) -> NodeNacks {
        self.lock().node_nacks(node_id, versions, threshold, now())
    }

    /// The nodes with at least one open stream.
    pub fn nodes_with_streams(&self) -> Vec<String> {
        self.lock()
            .nodes_with_streams()
            .map(str::to_string)
            .collect()
    }

    /// Pods of the node that never answered anything (see [`SILENT_POD_GRACE`]).
    pub fn silent_pods(&self, node_id: &str) -> BTreeSet<String> {
        self.lock().silent_pods(node_id, now())
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
    use crate::events::tests::{ack, nack};
    use ResourceType::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn prometheus_series() {
        let mut registry = Registry::default();
        let stats = SharedStats::with_metrics(XdsMetrics::register(&mut registry));
        let node = NodeInfo {
            id: "n".into(),
            pod_name: "p1".into(),
        };
        let id = stats.stream_opened(&node, Api::Sotw);
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

        stats.stream_closed(&node, Api::Sotw, id);
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
            let id = stats.stream_opened(&node, Api::Sotw);
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
            stats.stream_closed(&node, Api::Sotw, id);
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
        let mut ids = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let api = if i % 2 == 0 { Api::Sotw } else { Api::Delta };
            ids.push(stats.stream_opened(n, api));
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
        let twice_id = stats.stream_opened(&twice, Api::Sotw);
        let other_sotw = stats.stream_opened(&other_pod, Api::Sotw);
        let other_delta = stats.stream_opened(&other_pod, Api::Delta);
        for (i, (n, id)) in nodes.iter().zip(ids).enumerate() {
            let api = if i % 2 == 0 { Api::Sotw } else { Api::Delta };
            stats.stream_closed(n, api, id);
        }
        let text = encode(&registry);
        assert!(
            !text.contains("node-"),
            "no series of a node without streams:\n{text}"
        );
        stats.stream_closed(&twice, Api::Sotw, twice_id);
        let text = encode(&registry);
        assert!(
            text.contains(r#"marin3r_xdss_streams{node_id="twice",api="sotw"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"marin3r_xdss_streams{node_id="twice",api="delta"} 1"#),
            "{text}"
        );
        stats.stream_closed(&other_pod, Api::Sotw, other_sotw);
        let text = encode(&registry);
        assert!(!text.contains(r#"node_id="twice",api="sotw""#), "{text}");
        assert!(
            text.contains(r#"marin3r_xdss_streams{node_id="twice",api="delta"} 1"#),
            "{text}"
        );
        stats.stream_closed(&other_pod, Api::Delta, other_delta);
        assert!(!encode(&registry).contains("twice"));
        // A node that comes back gets its series again, from 1.
        stats.stream_opened(&twice, Api::Sotw);
        assert!(
            encode(&registry).contains(r#"marin3r_xdss_streams{node_id="twice",api="sotw"} 1"#)
        );
        // other_pod had two streams open at once (one per API): reported once.
        assert!(encode(&registry).contains("marin3r_xdss_pod_stream_overlaps_total 1"));
    }

    /// 10,000 pods connect, answer and leave (half SotW, half Delta) while one pod
    /// stays: `/metrics` is back to its text at once, and the ACK/NACK aggregation to its
    /// footprint once [`GONE_POD_RETENTION`] has passed, with no stream opening or
    /// closing after the churn (a read sweeps).
    #[tokio::test(start_paused = true)]
    async fn pod_churn_returns_the_stats_and_metrics_to_their_baseline() {
        let mut registry = Registry::default();
        let stats = SharedStats::with_metrics(XdsMetrics::register(&mut registry));
        let stays = NodeInfo {
            id: "n".into(),
            pod_name: "stays".into(),
        };
        stats.stream_opened(&stays, Api::Sotw);
        let mut counters = StreamCounters::default();
        stats.record_stream(Some(&stays), &mut counters, &[ack("stays", Cluster, "v1")]);
        let baseline_text = encode(&registry);
        let baseline = stats.snapshot().footprint();
        for i in 0..10_000 {
            let pod = format!("pod-{i}");
            let node = NodeInfo {
                id: "n".into(),
                pod_name: pod.clone(),
            };
            let api = if i % 2 == 0 { Api::Sotw } else { Api::Delta };
            let id = stats.stream_opened(&node, api);
            let mut counters = StreamCounters::default();
            let request = StreamEvent::Request {
                node_id: "n".into(),
                pod_name: pod.clone(),
                resource_type: Some(Cluster),
            };
            let events = [
                request,
                ack(&pod, Cluster, "v1"),
                nack(&pod, Listener, "v1", "bad"),
            ];
            stats.record_stream(Some(&node), &mut counters, &events);
            stats.stream_closed(&node, api, id);
        }
        assert_eq!(
            encode(&registry),
            baseline_text,
            "no series of a closed stream"
        );
        let kept = stats.snapshot().footprint();
        assert_eq!(
            (kept.gone_pods, kept.counts),
            (10_000, 20_001),
            "within the retention the counts are kept (an Envoy reconnecting finds them)"
        );
        tokio::time::advance(GONE_POD_RETENTION).await;
        assert!(stats.nodes_with_streams().contains(&"n".to_string()));
        assert_eq!(stats.snapshot().footprint(), baseline);
        assert_eq!(
            stats.acks("n", Cluster, "v1").len(),
            1,
            "the pod that stayed"
        );
    }
}
