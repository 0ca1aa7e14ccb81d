//! The tunables ([`AdsConfig`]) and bookkeeping both ADS stream flavours ([`crate::sotw`], [`crate::delta`]) share,
//! sans-I/O: which node a stream serves ([`StreamNode`]), and how the ACKs and NACKs
//! of one type drive its NACK backoff ([`NackState`]).
//!
//! - The node is learned from the first request carrying one with a non-empty id;
//!   later nodes are ignored. Events of a stream that has not learned its node carry
//!   empty ids.
//! - An ACK ends the backoff of its type. A NACK of version `v` starts (or continues,
//!   if the previous NACK was of `v` too) a backoff of `initial · 2^(n-1)` (capped),
//!   n = consecutive NACKs of `v`: `v` is not re-sent before it expires. Sending `v`
//!   again consumes the pending retry; sending any other version ends the backoff.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::google::rpc::Status;

use crate::events::StreamEvent;
use crate::node::NodeInfo;
use marin3r_envoyconfig::resource::ResourceType;

/// Tunables of the ADS state machines (SotW and Delta).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdsConfig {
    /// Delay before re-sending a version after its first NACK (default 100 ms).
    pub nack_backoff_initial: Duration,
    /// Upper bound of the doubling delay (default 30 s).
    pub nack_backoff_max: Duration,
    /// `control_plane.identifier` put on every response (e.g. the pod name), if any.
    pub control_plane_id: Option<String>,
    /// A response the client has not taken within this long ends its stream (default
    /// 30 s): a client that stops reading must not pin the stream task, its buffered
    /// responses and its pod's subscription (which self-healing counts) forever.
    pub stream_send_timeout: Duration,
    /// On shutdown, once the last connection was told to close (a GOAWAY, its ADS
    /// streams ended), how long the server waits for clients to close their connections
    /// before it returns anyway (default 10 s).
    pub shutdown_grace: Duration,
    /// After its TLS handshake, a client must send the 24-byte HTTP/2 connection preface
    /// within this long (default 10 s), or its connection is closed: the HTTP/2 server
    /// itself waits for it forever, so a client that connects and stays silent would
    /// hold a connection (and its buffers) until it goes away.
    pub preface_timeout: Duration,
    /// On shutdown, after [`drain_delay`](Self::drain_delay), the open connections are
    /// closed (a GOAWAY, and their ADS streams end with `UNAVAILABLE`) spread evenly over
    /// this window ([`crate::drain::close_offset`]; default 5 s, `--drain-time`), so the
    /// Envoys reconnect to another replica a few at a time instead of in one burst; 0
    /// closes them all at once.
    pub drain_time: Duration,
    /// On shutdown, how long the server keeps serving fully (accepting connections and
    /// streams) before the drain window begins (default 5 s, `--drain-delay`): the time
    /// Kubernetes takes to remove the terminating pod's endpoint, so the Envoys the drain
    /// sends away reconnect to another replica. Skipped when no ADS stream is open, and
    /// over when the last one closes (nothing to redirect: a replica without Envoys exits
    /// at once; [`crate::drain::drain_delay`]).
    pub drain_delay: Duration,
    /// Each connection is closed like on shutdown (a GOAWAY, and its ADS streams end
    /// with `UNAVAILABLE`) once it is this old, ± 10 % jitter drawn per
    /// connection ([`crate::drain::jittered_age`]; default 30 min, Istio's,
    /// `--max-connection-age`), so the streams rebalance over the replicas after a
    /// rollout; zero disables it.
    pub max_connection_age: Duration,
    /// What one client can make the listener hold: connections, streams per connection,
    /// bytes of requests being received (per connection and overall), idle time
    /// ([`crate::limits`]).
    pub limits: crate::limits::ConnectionLimits,
}

impl Default for AdsConfig {
    fn default() -> Self {
        Self {
            nack_backoff_initial: Duration::from_millis(100),
            nack_backoff_max: Duration::from_secs(30),
            control_plane_id: None,
            stream_send_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            preface_timeout: Duration::from_secs(10),
            drain_time: Duration::from_secs(5),
            drain_delay: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(30 * 60),
            limits: crate::limits::ConnectionLimits::default(),
        }
    }
}

impl AdsConfig {
    /// Delay after the `consecutive`-th consecutive NACK (1-based) of a version:
    /// `initial · 2^(consecutive-1)`, capped at `max`.
    pub fn nack_backoff(&self, consecutive: u32) -> Duration {
        let factor = 1u32
            .checked_shl(consecutive.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.nack_backoff_initial
            .saturating_mul(factor)
            .min(self.nack_backoff_max)
    }

    pub(crate) fn control_plane(&self) -> Option<ControlPlane> {
        self.control_plane_id.as_ref().map(|id| ControlPlane {
            identifier: id.clone(),
        })
    }
}

/// Most resource names one stream may subscribe to per type, and the most names one
/// request may carry in a list of them (`resource_names`, `resource_names_subscribe`,
/// `resource_names_unsubscribe`, `initial_resource_versions`). Envoy subscribes by name
/// only to what its own config references (routes of its listeners, endpoints of its
/// EDS clusters, secrets of its TLS contexts): hundreds, a few thousand for the largest
/// gateways. Without a bound, one Delta stream subscribing 750,000 names that do not
/// exist grew the server by over 200 MB and made every later request of the stream
/// cost ~95 ms of CPU (the stream's state is diffed against the snapshot). A request
/// that would go over it is refused with `RESOURCE_EXHAUSTED` naming the limit, before
/// anything of it is stored; the stream ends.
pub const MAX_NAMES_PER_TYPE: usize = 10_000;

/// A request refused by the name limit: `field` lists `names` names for `resource_type`,
/// over [`MAX_NAMES_PER_TYPE`] (`limit`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field} of {resource_type}: {names} resource names, over the limit of {limit} per type per stream"
)]
pub struct TooManyNames {
    pub field: &'static str,
    /// The type's name, `unknown` for a type URL we do not serve.
    pub resource_type: &'static str,
    pub names: usize,
    pub limit: usize,
}

/// The one check of [`MAX_NAMES_PER_TYPE`]: `names` names for `t` (`None`: a type URL
/// we do not serve) in `field`, whether a request's list or what a stream would be
/// subscribed to after the request.
pub(crate) fn check_names(
    field: &'static str,
    t: Option<ResourceType>,
    names: usize,
) -> Result<(), TooManyNames> {
    if names <= MAX_NAMES_PER_TYPE {
        return Ok(());
    }
    Err(TooManyNames {
        field,
        resource_type: t.map_or("unknown", ResourceType::as_str),
        names,
        limit: MAX_NAMES_PER_TYPE,
    })
}

/// A NACK message as the server keeps and shows it (the ACK/NACK statistics, the
/// client status service, `/status`, a taint reason, a log): Envoy's message may quote
/// the rejected config, so key material in it is redacted first (one rule with the
/// decoder's errors: `marin3r_envoyconfig::pem::redact_pem`), then the first
/// [`MAX_NACK_MESSAGE_BYTES`](crate::acknack::MAX_NACK_MESSAGE_BYTES) are kept (cut at a
/// character boundary): what a client can make the server hold per NACK stays small.
pub fn stored_nack_message(message: &str) -> String {
    let redacted = marin3r_envoyconfig::pem::redact_pem(message);
    crate::node::log_prefix(&redacted, crate::acknack::MAX_NACK_MESSAGE_BYTES).to_string()
}

/// The node of one stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamNode(Option<NodeInfo>);

impl StreamNode {
    /// Learns the node from a request's `node` if it is not known yet (idempotent).
    pub(crate) fn observe(&mut self, node: Option<&Node>) -> Option<&NodeInfo> {
        if self.0.is_none() {
            self.0 = node.and_then(NodeInfo::from_node);
        }
        self.0.as_ref()
    }

    pub(crate) fn get(&self) -> Option<&NodeInfo> {
        self.0.as_ref()
    }

    /// `(node id, pod name)` for events; empty while the node is unknown.
    fn ids(&self) -> (String, String) {
        self.0
            .as_ref()
            .map(|n| (n.id.clone(), n.pod_name.clone()))
            .unwrap_or_default()
    }

    /// The event for a request of `t` (`None`: a type URL we do not serve).
    pub(crate) fn request(&self, t: Option<ResourceType>) -> StreamEvent {
        let (node_id, pod_name) = self.ids();
        StreamEvent::Request {
            node_id,
            pod_name,
            resource_type: t,
        }
    }
}

/// Consecutive-NACK backoff of one type on one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Backoff {
    /// The rejected version.
    version: String,
    /// Consecutive NACKs of that version.
    consecutive: u32,
    /// When the rejected version may be re-sent; `None` once re-sent (waiting for the
    /// client's answer) or superseded.
    retry_at: Option<Instant>,
}

/// The NACK backoff state of one type on one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NackState(Option<Backoff>);

impl NackState {
    /// The client answered the response that carried `version` of `t`: an ACK when
    /// `error` is `None`, else a NACK. Updates the backoff and returns the event.
    pub(crate) fn answer(
        &mut self,
        node: &StreamNode,
        t: ResourceType,
        version: String,
        error: Option<&Status>,
        now: Instant,
        config: &AdsConfig,
    ) -> StreamEvent {
        let (node_id, pod_name) = node.ids();
        let Some(status) = error else {
            self.0 = None;
            return StreamEvent::Ack {
                node_id,
                pod_name,
                resource_type: t,
                version,
            };
        };
        let consecutive = match &self.0 {
            Some(b) if b.version == version => b.consecutive.saturating_add(1),
            _ => 1,
        };
        self.0 = Some(Backoff {
            version: version.clone(),
            consecutive,
            retry_at: Some(now + config.nack_backoff(consecutive)),
        });
        StreamEvent::Nack {
            node_id,
            pod_name,
            resource_type: t,
            version,
            message: stored_nack_message(&status.message),
        }
    }

    /// Whether a push of `version` must wait at `now` (it is the rejected version and
    /// its backoff has not expired).
    pub(crate) fn holds(&self, version: &str, now: Instant) -> bool {
        self.0
            .as_ref()
            .is_some_and(|b| b.version == version && b.retry_at.is_some_and(|at| at > now))
    }

    /// Whether the rejected `version` is due for its re-send at `now`.
    pub(crate) fn retry_due(&self, version: &str, now: Instant) -> bool {
        self.0
            .as_ref()
            .is_some_and(|b| b.version == version && b.retry_at.is_some_and(|at| at <= now))
    }

    /// Records that `version` was just sent: a different version ends the backoff, the
    /// same one consumes the pending retry.
    pub(crate) fn on_sent(&mut self, version: &str) {
        match &mut self.0 {
            Some(b) if b.version == version => b.retry_at = None,
            _ => self.0 = None,
        }
    }

    /// When the pending re-send is due, if one is.
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.0.as_ref().and_then(|b| b.retry_at)
    }
}

/// The earliest pending re-send among `states`.
pub(crate) fn next_timer<'a>(states: impl IntoIterator<Item = &'a NackState>) -> Option<Instant> {
    states.into_iter().filter_map(NackState::retry_at).min()
}

/// Per-type state of one stream: a map keyed by [`ResourceType`] in push order, stored
/// as a sorted `Vec` of the types the stream uses. A `BTreeMap` allocates a node for 11
/// entries on the first insert (≈ 1.8 KiB per idle stream here, `valgrind --tool=massif`);
/// a stream uses 2 to 6 types.
#[derive(Debug, Clone)]
pub(crate) struct TypeMap<V>(Vec<(ResourceType, V)>);

impl<V> Default for TypeMap<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V> TypeMap<V> {
    fn position(&self, t: ResourceType) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(&t))
    }

    pub(crate) fn get(&self, t: &ResourceType) -> Option<&V> {
        self.position(*t).ok().map(|i| &self.0[i].1)
    }

    pub(crate) fn get_mut(&mut self, t: &ResourceType) -> Option<&mut V> {
        self.position(*t).ok().map(|i| &mut self.0[i].1)
    }

    /// Inserts or replaces the value of `t`.
    pub(crate) fn insert(&mut self, t: ResourceType, v: V) {
        match self.position(t) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => {
                // Grow one at a time: the set of types of a stream is small and settles.
                self.0.reserve_exact(1);
                self.0.insert(i, (t, v));
            }
        }
    }

    /// Entries in push order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ResourceType, &V)> {
        self.0.iter().map(|(t, v)| (t, v))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::tests::envoy;
    use std::time::Duration;

    fn config() -> AdsConfig {
        AdsConfig {
            nack_backoff_initial: Duration::from_millis(100),
            nack_backoff_max: Duration::from_millis(350),
            ..AdsConfig::default()
        }
    }

    fn rejected(msg: &str) -> Status {
        Status {
            code: 3,
            message: msg.into(),
            details: vec![],
        }
    }

    #[test]
    fn type_map_keeps_push_order() {
        use ResourceType::*;
        let mut m = TypeMap::default();
        assert_eq!(m.get(&Cluster), None);
        for (t, v) in [(Route, 1), (Cluster, 2), (Secret, 3), (Listener, 4)] {
            m.insert(t, v);
        }
        m.insert(Route, 5);
        if let Some(v) = m.get_mut(&Cluster) {
            *v += 10;
        }
        assert_eq!(
            m.iter().map(|(t, v)| (*t, *v)).collect::<Vec<_>>(),
            [(Cluster, 12), (Listener, 4), (Route, 5), (Secret, 3)]
        );
        assert_eq!(m.values().copied().collect::<Vec<_>>(), [12, 4, 5, 3]);
        assert_eq!(m.get(&Endpoint), None);
        assert_eq!(m.get(&Secret), Some(&3));
    }

    #[test]
    fn the_first_node_with_an_id_sticks() {
        let mut node = StreamNode::default();
        assert_eq!(node.observe(None), None);
        assert_eq!(
            node.observe(Some(&Node::default())),
            None,
            "no id: not a node"
        );
        assert_eq!(
            node.request(Some(ResourceType::Cluster)),
            StreamEvent::Request {
                node_id: String::new(),
                pod_name: String::new(),
                resource_type: Some(ResourceType::Cluster),
            }
        );
        let learned = node.observe(Some(&envoy("n1", "pod-a"))).cloned();
        assert_eq!(
            learned,
            Some(NodeInfo {
                id: "n1".into(),
                pod_name: "pod-a".into()
            })
        );
        assert_eq!(node.observe(Some(&envoy("n2", "pod-b"))).cloned(), learned);
        assert_eq!(node.observe(None).cloned(), learned);
        assert_eq!(node.get().cloned(), learned);
        assert_eq!(
            node.request(None),
            StreamEvent::Request {
                node_id: "n1".into(),
                pod_name: "pod-a".into(),
                resource_type: None,
            }
        );
    }

    #[test]
    fn nacks_back_off_exponentially_and_acks_reset() {
        let config = config();
        let mut node = StreamNode::default();
        node.observe(Some(&envoy("n1", "pod-a")));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut nack = NackState::default();
        assert_eq!(nack.retry_at(), None);
        assert!(!nack.holds("v1", t0));
        let reject = |nack: &mut NackState, version: &str| {
            nack.answer(
                &node,
                ResourceType::Listener,
                version.into(),
                Some(&rejected("bad")),
                t0,
                &config,
            )
        };

        let event = reject(&mut nack, "v1");
        assert_eq!(
            event,
            StreamEvent::Nack {
                node_id: "n1".into(),
                pod_name: "pod-a".into(),
                resource_type: ResourceType::Listener,
                version: "v1".into(),
                message: "bad".into(),
            }
        );
        assert_eq!(nack.retry_at(), Some(t0 + ms(100)));
        assert!(nack.holds("v1", t0 + ms(99)));
        assert!(!nack.holds("v2", t0), "a newer version is not held");
        assert!(!nack.retry_due("v1", t0 + ms(99)));
        assert!(nack.retry_due("v1", t0 + ms(100)));
        assert!(!nack.holds("v1", t0 + ms(100)));

        // Re-sent: the retry is consumed, the count kept.
        nack.on_sent("v1");
        assert_eq!(nack.retry_at(), None);
        assert!(!nack.retry_due("v1", t0 + ms(1000)));
        reject(&mut nack, "v1");
        assert_eq!(nack.retry_at(), Some(t0 + ms(200)), "second NACK doubles");
        nack.on_sent("v1");
        reject(&mut nack, "v1");
        assert_eq!(nack.retry_at(), Some(t0 + ms(350)), "capped");

        // A NACK of another version starts over.
        reject(&mut nack, "v2");
        assert_eq!(nack.retry_at(), Some(t0 + ms(100)));

        // An ACK ends it.
        let event = nack.answer(
            &node,
            ResourceType::Listener,
            "v2".into(),
            None,
            t0,
            &config,
        );
        assert_eq!(
            event,
            StreamEvent::Ack {
                node_id: "n1".into(),
                pod_name: "pod-a".into(),
                resource_type: ResourceType::Listener,
                version: "v2".into(),
            }
        );
        assert_eq!(nack, NackState::default());
    }

    #[test]
    fn a_nack_message_never_carries_key_material() {
        let config = config();
        let mut node = StreamNode::default();
        node.observe(Some(&envoy("n1", "pod-a")));
        let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7".repeat(3);
        let message = format!(
            "Proto constraint validation failed: private_key {{ inline_string: \"-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----\" }}"
        );
        let event = NackState::default().answer(
            &node,
            ResourceType::Secret,
            "v1".into(),
            Some(&rejected(&message)),
            Instant::now(),
            &config,
        );
        let StreamEvent::Nack { message: kept, .. } = event else {
            panic!("a NACK");
        };
        assert!(!kept.contains(&body[..40]), "{kept}");
        assert!(
            kept.starts_with("Proto constraint validation failed"),
            "{kept}"
        );
    }

    #[test]
    fn sending_another_version_ends_the_backoff() {
        let config = config();
        let node = StreamNode::default();
        let t0 = Instant::now();
        let mut a = NackState::default();
        a.answer(
            &node,
            ResourceType::Cluster,
            "v1".into(),
            Some(&rejected("x")),
            t0,
            &config,
        );
        let mut b = NackState::default();
        b.answer(
            &node,
            ResourceType::Route,
            "r1".into(),
            Some(&rejected("y")),
            t0 + Duration::from_millis(10),
            &config,
        );
        assert_eq!(next_timer([&a, &b]), Some(t0 + Duration::from_millis(100)));
        a.on_sent("v2");
        assert_eq!(a, NackState::default());
        assert_eq!(next_timer([&a, &b]), Some(t0 + Duration::from_millis(110)));
        assert_eq!(next_timer([&a]), None);
    }
}
