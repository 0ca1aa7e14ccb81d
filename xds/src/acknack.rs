//! The ACK/NACK aggregation the self-healing engine asks (design.md §4: a revision is
//! tainted when **every** subscribed pod NACKed its version at least N times).
//! [`AckNackStats`] is plain and single-threaded: it folds [`StreamEvent`]s in, per
//! `(node id, type, version)` → per pod [`PodCounts`] `{acks, nacks, last_nack_message}`,
//! and counts the open streams per `(node id, pod)`. A pod is every stream claiming its
//! `(node id, pod name)`: an ACK of a version on any of them means the pod accepted it
//! ([`PodCounts::counted_nacks`]), so a second stream claiming a real Envoy's pod name
//! cannot forge that pod's rejection, and two streams of one pod open at once are
//! reported ([`Opened::overlaps`]). Its memory is bounded: the last
//! [`DEFAULT_MAX_VERSIONS`] versions per `(node, type)`, NACK messages cut at
//! [`MAX_NACK_MESSAGE_BYTES`], the counts of a pod without streams dropped after
//! [`GONE_POD_RETENTION`]; pods that never answer stop counting after [`SILENT_POD_GRACE`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use marin3r_envoyconfig::resource::ResourceType;

use crate::events::StreamEvent;
use crate::node::log_prefix;

/// ACK/NACK counts of one pod for one `(node, type, version)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodCounts {
    pub acks: u64,
    pub nacks: u64,
    pub last_nack_message: Option<String>,
}

impl PodCounts {
    /// The NACKs that count for the taint test: none once the pod ACKed the version on
    /// any of its streams. The one rule for "this pod rejects this version", used by the
    /// single-process taint test and by the digest each replica reports for the
    /// fleet-wide judgement ([`AckNackStats::min_nacks`]).
    ///
    /// Every stream that names a pod counts as that pod, and the pod name is only what
    /// the client says (`node.metadata.pod_name`): a second stream holding the client
    /// certificate could claim a real Envoy's pod and NACK what the Envoy ACKed. A real
    /// Envoy never ACKs a version it rejects, so an ACK wins: a forger cannot make an
    /// accepted version look rejected (it can still hold up a taint, which it could
    /// already do with a pod name of its own that never NACKs). This also covers
    /// Envoy's reconnect, whose old stream may still be open when the new one starts.
    pub fn counted_nacks(&self) -> u64 {
        if self.acks > 0 { 0 } else { self.nacks }
    }
}

/// Identifies one stream in [`AckNackStats`] (in log lines: `stream_id`), handed out by
/// [`AckNackStats::stream_opened`] in opening order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What [`AckNackStats::stream_opened`] tells about a new stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The new stream's id (give it back to [`AckNackStats::stream_closed`]).
    pub stream: StreamId,
    /// Another stream of the same pod (node id and pod name) that is still open, if
    /// any: two Envoys (or something else holding the client certificate) claim one
    /// pod, or an Envoy reconnected before its old stream was seen to close.
    pub overlaps: Option<StreamId>,
}

/// How the judged pods of one node answered the versions it is served
/// ([`AckNackStats::node_nacks`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeNacks {
    /// Pods with an open stream that count for the taint test (not silent).
    pub pods: u64,
    /// Per type: the smallest NACK count of its version over those pods, saturated at
    /// the threshold (0 without pods).
    pub min_nacks: BTreeMap<ResourceType, u64>,
    /// The last NACK message of one of those pods for one of the versions.
    pub message: Option<String>,
}

/// What [`AckNackStats`] holds per pod ([`AckNackStats::footprint`]); the per-version
/// logs themselves are bounded apart ([`DEFAULT_MAX_VERSIONS`] per node and type, the
/// node's entry going with [`AckNackStats::clear_node`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    /// Nodes with per-version logs (the logs themselves are bounded per node).
    pub nodes: usize,
    /// `(node, type, version, pod)` count entries.
    pub counts: usize,
    /// Pods with an open stream.
    pub open_pods: usize,
    /// Pods whose counts outlive their last stream ([`GONE_POD_RETENTION`]).
    pub gone_pods: usize,
    /// Closes waiting for the retention sweep (a pod that flaps leaves one per close,
    /// dropped [`GONE_POD_RETENTION`] after it).
    pub gone_order: usize,
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
    /// The id of the next stream opened.
    next_stream: u64,
    /// Streams opened while another stream of their pod was open
    /// ([`Opened::overlaps`]), ever.
    overlaps: u64,
}

/// A pod with an open stream: which ones, since when, and whether it ever answered.
#[derive(Debug, Clone)]
struct PodStreams {
    /// The first of its open streams; `others` are the rest (empty, so no allocation,
    /// for the usual pod with one stream).
    first: StreamId,
    others: Vec<StreamId>,
    since: Instant,
    /// It ACKed or NACKed something on the node at least once.
    answered: bool,
}

impl PodStreams {
    fn open(&self) -> usize {
        1 + self.others.len()
    }

    /// The most recently opened of its streams.
    fn newest(&self) -> StreamId {
        self.others.last().copied().unwrap_or(self.first)
    }

    /// Forgets `stream` (the pod itself is removed by the caller on [`Closed::Last`]).
    fn close(&mut self, stream: StreamId) -> Closed {
        if self.first == stream {
            if self.others.is_empty() {
                return Closed::Last;
            }
            self.first = self.others.remove(0);
        } else if let Some(i) = self.others.iter().position(|s| *s == stream) {
            self.others.remove(i);
        } else {
            return Closed::Unknown;
        }
        if self.others.is_empty() {
            self.others = Vec::new();
        }
        Closed::Others
    }
}

/// What [`PodStreams::close`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// It was the pod's last stream.
    Last,
    /// Other streams of the pod are still open.
    Others,
    /// Not a stream of the pod.
    Unknown,
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
            next_stream: 0,
            overlaps: 0,
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
                let kept = log_prefix(message, MAX_NACK_MESSAGE_BYTES);
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
        self.nonzero_per_pod(node_id, t, version, |c| c.nacks)
    }

    /// ACKs per pod for one version (pods without ACKs are omitted).
    pub fn acks(&self, node_id: &str, t: ResourceType, version: &str) -> BTreeMap<String, u64> {
        self.nonzero_per_pod(node_id, t, version, |c| c.acks)
    }

    /// `count` of each pod for one version, pods where it is 0 omitted.
    fn nonzero_per_pod(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        count: impl Fn(&PodCounts) -> u64,
    ) -> BTreeMap<String, u64> {
        self.pod_counts(node_id, t, version)
            .map(|pods| {
                pods.iter()
                    .map(|(p, c)| (p, count(c)))
                    .filter(|(_, n)| *n > 0)
                    .map(|(p, n)| (p.to_string(), n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The design.md §4 taint test for one type version: there is at least one subscribed
    /// pod and every subscribed pod NACKed `version` at least `threshold` (at least 1)
    /// times. Pods that never answered anything within [`SILENT_POD_GRACE`] of their
    /// first stream (at `now`) do not count. The same as [`min_nacks`](Self::min_nacks)
    /// being at least `threshold`.
    pub fn rejected_by_all_pods(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        threshold: u64,
        now: Instant,
    ) -> bool {
        self.min_nacks(node_id, t, version, now)
            .is_some_and(|min| min >= threshold.max(1))
    }

    /// The smallest NACK count of `version` of `t` over the pods the taint test judges
    /// (an open stream for the node, not silent at `now`); `None` without such a pod.
    /// The one rule behind [`rejected_by_all_pods`](Self::rejected_by_all_pods) and
    /// [`node_nacks`](Self::node_nacks).
    pub fn min_nacks(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        now: Instant,
    ) -> Option<u64> {
        // Looked up in place, without copying the pod names or the counts: this runs for
        // every type of every published revision every 250 ms under the stats lock, and
        // with 10,000 streams the copies took a quarter of the discovery service's CPU
        // and held up the streams' ACK accounting (BENCHMARKS.md).
        let counts = self.pod_counts(node_id, t, version);
        self.judged_pods(node_id, now)
            .map(|p| {
                counts
                    .and_then(|c| c.get(p))
                    .map_or(0, PodCounts::counted_nacks)
            })
            .min()
    }

    /// The pods of `node_id` the taint test judges at `now`: an open stream, and an
    /// answer (or a stream younger than [`SILENT_POD_GRACE`]).
    fn judged_pods<'a>(&'a self, node_id: &str, now: Instant) -> impl Iterator<Item = &'a PodName> {
        self.streams.get(node_id).into_iter().flat_map(move |pods| {
            pods.iter()
                .filter(move |(_, s)| {
                    s.answered || now.saturating_duration_since(s.since) < SILENT_POD_GRACE
                })
                .map(|(p, _)| p)
        })
    }

    /// How the judged pods of `node_id` answered `versions` (what one replica of a
    /// discovery service with several replicas reports for the fleet-wide judgement):
    /// how many pods are judged, per type the smallest NACK count saturated at
    /// `threshold` (at least 1), and the last NACK message of a judged pod for one of the
    /// versions.
    pub fn node_nacks(
        &self,
        node_id: &str,
        versions: &BTreeMap<ResourceType, String>,
        threshold: u64,
        now: Instant,
    ) -> NodeNacks {
        let pods = self.judged_pods(node_id, now).count() as u64;
        let saturation = threshold.max(1);
        let mut out = NodeNacks {
            pods,
            ..NodeNacks::default()
        };
        for (t, version) in versions {
            let min = self.min_nacks(node_id, *t, version, now).unwrap_or(0);
            out.min_nacks.insert(*t, min.min(saturation));
            if out.message.is_none()
                && let Some(counts) = self.pod_counts(node_id, *t, version)
            {
                out.message = self.judged_pods(node_id, now).find_map(|p| {
                    counts
                        .get(p)
                        .filter(|c| c.counted_nacks() > 0)
                        .and_then(|c| c.last_nack_message.clone())
                });
            }
        }
        out
    }

    /// The nodes with at least one open stream.
    pub fn nodes_with_streams(&self) -> impl Iterator<Item = &str> {
        self.streams
            .iter()
            .filter(|(_, pods)| !pods.is_empty())
            .map(|(node, _)| node.as_str())
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
    /// Returns its id, and another open stream of the same pod if there is one (the
    /// caller reports it: see [`Opened::overlaps`]).
    pub fn stream_opened(&mut self, node_id: &str, pod_name: &str, now: Instant) -> Opened {
        self.forget_gone_pods(now);
        let stream = StreamId(self.next_stream);
        self.next_stream = self.next_stream.wrapping_add(1);
        if let Some(pods) = self.gone.get_mut(node_id) {
            pods.remove(pod_name);
            if pods.is_empty() {
                self.gone.remove(node_id);
            }
        }
        if !self.streams.contains_key(node_id) {
            self.streams.insert(node_id.to_string(), HashMap::new());
        }
        let mut overlaps = None;
        if let Some(pods) = self.streams.get_mut(node_id) {
            match pods.get_mut(pod_name) {
                Some(s) => {
                    overlaps = Some(s.newest());
                    s.others.push(stream);
                }
                None => {
                    pods.insert(
                        PodName::from(pod_name),
                        PodStreams {
                            first: stream,
                            others: Vec::new(),
                            since: now,
                            answered: false,
                        },
                    );
                }
            }
        }
        if overlaps.is_some() {
            self.overlaps = self.overlaps.saturating_add(1);
        }
        Opened { stream, overlaps }
    }

    /// The stream `stream` of `pod` ended at `now`. Returns the number of streams the
    /// pod still has; at 0 the pod's ACK/NACK counts are dropped [`GONE_POD_RETENTION`]
    /// later unless a stream of it opens again meanwhile. The counts of a pod are the
    /// pod's, whichever of its streams answered: when the stream that ACKed a version
    /// closes and another stream of the pod stays, the ACK still stands for the pod.
    pub fn stream_closed(
        &mut self,
        node_id: &str,
        pod_name: &str,
        stream: StreamId,
        now: Instant,
    ) -> usize {
        self.forget_gone_pods(now);
        let Some(pods) = self.streams.get_mut(node_id) else {
            return 0;
        };
        let Some(s) = pods.get_mut(pod_name) else {
            return 0;
        };
        match s.close(stream) {
            Closed::Others | Closed::Unknown => s.open(),
            Closed::Last => {
                let Some((name, _)) = pods.remove_entry(pod_name) else {
                    return 0;
                };
                if pods.is_empty() {
                    self.streams.remove(node_id);
                }
                self.gone
                    .entry(node_id.to_string())
                    .or_default()
                    .insert(name.clone(), now);
                self.gone_order.push_back((now, node_id.to_string(), name));
                0
            }
        }
    }

    /// Streams opened while another stream of their pod was open, since the start
    /// (see [`Opened::overlaps`]).
    #[cfg(test)]
    fn overlapping_streams(&self) -> u64 {
        self.overlaps
    }

    /// Drops the counts of pods whose last stream closed [`GONE_POD_RETENTION`] or more
    /// before `now` and that have not come back. Runs on every stream open and close,
    /// and [`crate::stats::SharedStats`] runs it on every access, so the counts of pods
    /// that left go after the retention even when no stream opens or closes any more.
    /// Amortised O(1) when nothing is due (one look at the oldest close).
    pub fn forget_gone_pods(&mut self, now: Instant) {
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
            self.clear_counts(&node_id, &pod);
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
            .map(|p| p.iter().map(|(k, s)| (k.to_string(), s.open())).collect())
            .unwrap_or_default()
    }

    /// Forgets every ACK/NACK count of a pod for the node, and that it left (its Pod was
    /// deleted: nothing of it is kept until [`GONE_POD_RETENTION`]); its open streams,
    /// if any, are untouched.
    pub fn clear_pod(&mut self, node_id: &str, pod_name: &str) {
        self.clear_counts(node_id, pod_name);
        if let Some(pods) = self.gone.get_mut(node_id) {
            pods.remove(pod_name);
            if pods.is_empty() {
                self.gone.remove(node_id);
            }
        }
    }

    fn clear_counts(&mut self, node_id: &str, pod_name: &str) {
        if let Some(logs) = self.versions.get_mut(node_id) {
            for log in logs.values_mut() {
                for pods in log.counts.values_mut() {
                    pods.remove(pod_name);
                }
            }
        }
    }

    /// How much the aggregation holds per pod and stream (see [`Footprint`]): what pod
    /// and stream churn must bring back to its baseline.
    pub fn footprint(&self) -> Footprint {
        let counts = self
            .versions
            .values()
            .flat_map(BTreeMap::values)
            .flat_map(|log| log.counts.values())
            .map(HashMap::len)
            .sum();
        Footprint {
            nodes: self.versions.len(),
            counts,
            open_pods: self.streams.values().map(HashMap::len).sum(),
            gone_pods: self.gone_pods(),
            gone_order: self.gone_order.len(),
        }
    }

    /// Forgets every count of a node (e.g. its EnvoyConfig was deleted), and the closes
    /// of its pods waiting for the retention sweep (a rare, whole-node event: one pass).
    pub fn clear_node(&mut self, node_id: &str) {
        self.versions.remove(node_id);
        if self.gone.remove(node_id).is_some() {
            self.gone_order.retain(|(_, n, _)| n != node_id);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::{ack, nack};
    use ResourceType::*;

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
        let a = s.stream_opened("n", "p1", t0).stream;
        let b = s.stream_opened("n", "p1", t0).stream;
        let c = s.stream_opened("n", "p2", t0).stream;
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
        assert_eq!(s.stream_closed("n", "p2", c, t0), 0);
        assert!(s.rejected_by_all_pods("n", Route, "v", 5, t0));
        assert_eq!(s.stream_closed("n", "p1", a, t0), 1);
        assert_eq!(
            s.stream_closed("n", "p1", a, t0),
            1,
            "closing twice is harmless"
        );
        assert_eq!(s.stream_closed("n", "p1", b, t0), 0);
        assert_eq!(
            s.stream_closed("n", "p1", b, t0),
            0,
            "extra close is harmless"
        );
        assert!(s.pods_for_node("n").is_empty());
    }

    #[test]
    fn a_forged_nack_stream_next_to_an_acking_stream_of_the_same_pod_is_not_a_rejection() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        // The real Envoy of pod "envoy" ACKs v; a second stream claims the same pod.
        let honest = s.stream_opened("n", "envoy", t0);
        assert_eq!(honest.overlaps, None);
        s.record(&ack("envoy", Listener, "v"));
        let forger = s.stream_opened("n", "envoy", t0);
        assert_eq!(
            forger.overlaps,
            Some(honest.stream),
            "two live streams of one pod are reported, naming the other"
        );
        assert_eq!(s.overlapping_streams(), 1);
        assert_eq!(s.streams_for_node("n")["envoy"], 2);
        for _ in 0..10 {
            s.record(&nack("envoy", Listener, "v", "forged"));
        }
        assert!(
            !s.rejected_by_all_pods("n", Listener, "v", 5, t0),
            "a pod that ACKed v on any stream does not reject v"
        );
        let versions = BTreeMap::from([(Listener, "v".to_string())]);
        let digest = s.node_nacks("n", &versions, 5, t0);
        assert_eq!(
            (digest.pods, digest.min_nacks[&Listener], digest.message),
            (1, 0, None),
            "the digest a replica reports for the fleet applies the same rule"
        );
        // A version the pod rejected on every stream it answered on still counts.
        for _ in 0..5 {
            s.record(&nack("envoy", Listener, "bad", "invalid listener"));
        }
        assert!(s.rejected_by_all_pods("n", Listener, "bad", 5, t0));

        // The honest stream closes; the forger stays. The ACK is the pod's: v stays
        // accepted as long as the pod's counts are kept (while it has a stream, and
        // GONE_POD_RETENTION after). A version served after that is judged on the
        // streams left: alone, the forger is the pod (as any client holding the
        // certificate is, with a pod name of its own, when no Envoy is connected).
        assert_eq!(s.stream_closed("n", "envoy", honest.stream, t0), 1);
        for _ in 0..10 {
            s.record(&nack("envoy", Listener, "v", "forged"));
        }
        assert!(!s.rejected_by_all_pods("n", Listener, "v", 5, t0));
        for _ in 0..5 {
            s.record(&nack("envoy", Listener, "v2", "forged"));
        }
        assert!(s.rejected_by_all_pods("n", Listener, "v2", 5, t0));
    }

    #[test]
    fn a_reconnect_after_the_old_stream_closed_is_not_an_overlap() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        let old = s.stream_opened("n", "envoy", t0);
        assert_eq!(s.stream_closed("n", "envoy", old.stream, t0), 0);
        let new = s.stream_opened("n", "envoy", t0);
        assert_eq!(new.overlaps, None);
        assert_ne!(new.stream, old.stream, "ids are not reused");
        // Envoy's reconnect seen before its old stream closed: reported, and harmless
        // (the counts are the pod's either way).
        let third = s.stream_opened("n", "envoy", t0);
        assert_eq!(third.overlaps, Some(new.stream));
        let fourth = s.stream_opened("n", "envoy", t0);
        assert_eq!(
            fourth.overlaps,
            Some(third.stream),
            "names the newest other"
        );
        assert_eq!(s.stream_closed("n", "envoy", third.stream, t0), 2);
        assert_eq!(s.stream_closed("n", "envoy", new.stream, t0), 1);
        assert_eq!(s.streams_for_node("n")["envoy"], 1);
        assert_eq!(s.overlapping_streams(), 2);
        // Another pod of the node, or the same pod name on another node, is no overlap.
        assert_eq!(s.stream_opened("n", "other", t0).overlaps, None);
        assert_eq!(s.stream_opened("m", "envoy", t0).overlaps, None);
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
    fn counts_of_a_gone_pod_are_dropped_after_the_retention_unless_it_comes_back() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // 100 made-up pods connect, ACK, leave.
        for i in 0..100 {
            let pod = format!("p{i}");
            let id = s.stream_opened("n", &pod, t0).stream;
            s.record(&ack(&pod, Cluster, "v1"));
            assert_eq!(s.stream_closed("n", &pod, id, at(1)), 0);
        }
        // "back" flaps: gone at 1 s, back at 2 s, gone again at 200 s.
        let back = s.stream_opened("n", "back", t0).stream;
        s.record(&nack("back", Cluster, "v1", "bad"));
        s.stream_closed("n", "back", back, at(1));
        let back = s.stream_opened("n", "back", at(2)).stream;
        // "stays" keeps its stream.
        s.stream_opened("n", "stays", t0);
        s.record(&nack("stays", Cluster, "v1", "bad"));
        assert_eq!(s.gone_pods(), 100);
        assert_eq!(
            s.acks("n", Cluster, "v1").len(),
            100,
            "kept within the retention"
        );
        s.stream_closed("n", "back", back, at(200));

        // Retention over for the first closes: only their counts go.
        let trigger = s
            .stream_opened("n", "trigger", at(1) + GONE_POD_RETENTION)
            .stream;
        assert!(s.acks("n", Cluster, "v1").is_empty(), "gone pods dropped");
        assert_eq!(
            s.nacks("n", Cluster, "v1"),
            [("back".to_string(), 1), ("stays".to_string(), 1)].into(),
            "a pod that came back and left later keeps its counts; a connected pod too"
        );
        assert_eq!(s.gone_pods(), 1);
        s.stream_closed("n", "trigger", trigger, at(201) + GONE_POD_RETENTION);
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

    #[test]
    fn a_deleted_pod_is_forgotten_at_once() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        let id = s.stream_opened("n", "p", t0).stream;
        s.record(&nack("p", Cluster, "v", "bad"));
        s.stream_closed("n", "p", id, t0);
        assert_eq!((s.footprint().gone_pods, s.footprint().counts), (1, 1));
        // Its Pod is deleted (the Pod watch): nothing of it stays for the retention.
        s.clear_pod("n", "p");
        assert_eq!(
            s.footprint(),
            Footprint {
                nodes: 1,
                gone_order: 1,
                ..Footprint::default()
            }
        );
        // The close waiting for the sweep goes with it (and clears nothing else).
        let other = s.stream_opened("n", "q", t0).stream;
        s.record(&nack("q", Cluster, "v", "bad"));
        s.forget_gone_pods(t0 + GONE_POD_RETENTION);
        assert_eq!(
            s.footprint(),
            Footprint {
                nodes: 1,
                counts: 1,
                open_pods: 1,
                ..Footprint::default()
            }
        );
        // The node is no longer configured: nothing of it stays, at once.
        s.stream_closed("n", "q", other, t0 + GONE_POD_RETENTION);
        s.clear_node("n");
        assert_eq!(s.footprint(), Footprint::default());
    }

    #[test]
    fn node_nacks_report_the_smallest_count_saturated_with_a_message() {
        let mut s = AckNackStats::new();
        let t0 = Instant::now();
        let versions = BTreeMap::from([(Route, "v".to_string()), (Cluster, "c".to_string())]);
        assert_eq!(
            s.node_nacks("n", &versions, 3, t0),
            NodeNacks {
                pods: 0,
                min_nacks: BTreeMap::from([(Route, 0), (Cluster, 0)]),
                message: None,
            }
        );
        s.stream_opened("n", "p1", t0);
        s.stream_opened("n", "p2", t0);
        for _ in 0..7 {
            s.record(&nack("p1", Route, "v", "bad route"));
        }
        s.record(&nack("p2", Route, "v", "bad route"));
        s.record(&ack("p1", Cluster, "c"));
        let got = s.node_nacks("n", &versions, 3, t0);
        assert_eq!(got.pods, 2);
        assert_eq!(got.min_nacks, BTreeMap::from([(Route, 1), (Cluster, 0)]));
        assert_eq!(got.message.as_deref(), Some("bad route"));
        for _ in 0..9 {
            s.record(&nack("p2", Route, "v", "bad route"));
        }
        assert_eq!(
            s.node_nacks("n", &versions, 3, t0).min_nacks[&Route],
            3,
            "saturated at the threshold"
        );
    }

    proptest::proptest! {
        /// The digest a replica reports says "rejected" exactly when the single-process
        /// taint test does: pods > 0 and the smallest count at least the threshold.
        #[test]
        fn node_nacks_agree_with_the_taint_test(
            nacks in proptest::collection::vec((0usize..4, 0u64..6), 0..24),
            open in proptest::collection::vec(proptest::bool::ANY, 4),
            silent_for in 0u64..30,
            threshold in 0u64..6,
        ) {
            let mut s = AckNackStats::new();
            let t0 = Instant::now();
            let pods = ["p0", "p1", "p2", "p3"];
            for (i, pod) in pods.iter().enumerate() {
                if open[i] {
                    s.stream_opened("n", pod, t0);
                }
            }
            for (pod, n) in &nacks {
                for _ in 0..*n {
                    s.record(&nack(pods[*pod], Route, "v", "x"));
                }
            }
            let now = t0 + Duration::from_secs(silent_for);
            let versions = BTreeMap::from([(Route, "v".to_string())]);
            let digest = s.node_nacks("n", &versions, threshold, now);
            let rejected = digest.pods > 0 && digest.min_nacks[&Route] >= threshold.max(1);
            proptest::prop_assert_eq!(rejected, s.rejected_by_all_pods("n", Route, "v", threshold, now));
        }
    }
}
