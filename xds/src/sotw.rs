//! Sans-I/O state machine of one ADS **state-of-the-world** stream (ezbake style).
//!
//! The tonic shell owns one [`SotwStream`] per gRPC stream and only `select!`s between
//! "request arrived" ([`SotwStream::handle_request`]), "snapshot changed"
//! ([`SotwStream::handle_snapshot`]) and "timer due" ([`SotwStream::poll_timers`] at
//! [`SotwStream::next_timer`]), sending the returned responses in order and feeding the
//! returned [`StreamEvent`](crate::events::StreamEvent)s to [`crate::stats::SharedStats`]. The node is learned with
//! [`SotwStream::observe_node`] (the shell calls it first to know which snapshot to
//! pass); every call takes the node's current snapshot and converges the stream to it.
//!
//! Protocol decisions (see also the xDS protocol docs):
//! - **Node**: taken from the first request that carries one with a non-empty id (Envoy
//!   sets `set_node_on_first_message_only`); later nodes are ignored.
//! - **Initial request** of a type on this stream (no state yet, or an empty
//!   `response_nonce`): subscribe and **always** respond with the current resources,
//!   even when `version_info` already equals the current version. A restarted Envoy
//!   needs a response to finish warming, and answering a reconnect costs one message.
//! - **Subscription**: `"*"` in `resource_names` means wildcard for any type; an empty
//!   list means wildcard for the wildcard-capable types ([`supports_wildcard`]: CDS,
//!   LDS, SRDS) unless the stream already subscribed to explicit names of that type, in
//!   which case (as for every other type) it unsubscribes from everything. Explicit
//!   names select the existing resources among them.
//! - **Nonces** are a per-stream counter; every response carries `version_info` (the
//!   type's snapshot version) and a fresh nonce.
//! - **ACK** = request with the latest nonce of that type and no `error_detail`;
//!   **NACK** = same with `error_detail`. Only the first request carrying a nonce counts
//!   as its ACK/NACK (a later request with the same nonce is a subscription update).
//!   The reported version is the one sent with that nonce.
//! - **Stale nonce** (not the latest for the type): ignored entirely, names included;
//!   the client re-sends its full name list when it answers the latest response.
//! - **NACK backoff**: the rejected version is re-sent to this stream only after
//!   `nack_backoff_initial · 2^(n-1)` (capped at `nack_backoff_max`), n = consecutive
//!   NACKs of that version; a NEWER version is sent at once and resets the count, an
//!   ACK resets it too. A request that changes the subscription is answered at once
//!   even during a backoff: that is paced by the client (one response per change), so
//!   it cannot loop.
//! - **Names change** with the current nonce: respond immediately with the new set when
//!   it differs from the set of the last response (and is not empty).
//! - **Unsubscribe** (empty names for a non-wildcard type): nothing is sent for that
//!   type until it is subscribed again.
//! - **Snapshot change**: only subscribed types whose version differs from the version
//!   last sent are pushed. Responses produced by one call are ordered by
//!   [`ResourceType::ALL`] (cluster → endpoint → listener → route → others).
//! - **Too many names**: a request whose `resource_names` lists more than
//!   [`MAX_NAMES_PER_TYPE`](crate::tracking::MAX_NAMES_PER_TYPE) names (any type, served
//!   or not) is refused (`Outcome::refused`: the stream ends with `RESOURCE_EXHAUSTED`)
//!   and changes nothing.
//! - **Unknown type URLs** (types we do not serve): a request with an empty
//!   `response_nonce` is answered with an empty resource list (version
//!   [`EMPTY_VERSION`]) so Envoy does not wait for an initial fetch timeout; requests
//!   carrying a nonce (its ACK/NACK) are ignored, so there is no ping-pong. Requests
//!   without a type URL are ignored.

use std::collections::BTreeSet;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;

use crate::csds::{
    ClientView, ResourceLog, ViewInput, absent_config, nack_message, resource_config,
};
use crate::node::NodeInfo;
use crate::snapshot::{EMPTY_VERSION, Snapshot};
use crate::stream::{Outcome, Subscription, WILDCARD, supports_wildcard};
use crate::tracking::{AdsConfig, NackState, StreamNode, TypeMap, check_names, next_timer};
use marin3r_envoyconfig::resource::ResourceType;

/// Outcome of a [`SotwStream`] call.
pub type SotwOutcome = Outcome<DiscoveryResponse>;

/// A SotW subscription from `resource_names`, given the previous one (`None` on the
/// first request of the type).
fn subscription(
    t: ResourceType,
    names: &[String],
    previous: Option<&Subscription>,
) -> Subscription {
    let wildcard_star = names.iter().any(|n| n == WILDCARD);
    let explicit: BTreeSet<String> = names
        .iter()
        .filter(|n| n.as_str() != WILDCARD)
        .cloned()
        .collect();
    if wildcard_star {
        return Subscription {
            wildcard: true,
            names: explicit,
        };
    }
    if explicit.is_empty() {
        let legacy = supports_wildcard(t) && previous.is_none_or(|p| p.wildcard);
        return Subscription {
            wildcard: legacy,
            names: explicit,
        };
    }
    Subscription {
        wildcard: false,
        names: explicit,
    }
}

/// The last response sent for a type.
#[derive(Debug, Clone)]
struct Sent {
    nonce: String,
    version: String,
    /// The subscription the response was computed for.
    subscription: Subscription,
    /// Whether the client already answered this nonce (ACK/NACK counted once).
    answered: bool,
}

#[derive(Debug, Clone, Default)]
struct TypeState {
    subscription: Subscription,
    sent: Option<Sent>,
    nack: NackState,
    /// Per resource: what the client runs, was sent, rejected (client status).
    log: ResourceLog,
}

/// One ADS state-of-the-world stream.
#[derive(Debug, Clone)]
pub struct SotwStream {
    config: AdsConfig,
    node: StreamNode,
    types: TypeMap<TypeState>,
    last_nonce: u64,
}

impl SotwStream {
    pub fn new(config: AdsConfig) -> Self {
        Self {
            config,
            node: StreamNode::default(),
            types: TypeMap::default(),
            last_nonce: 0,
        }
    }

    /// The node learned so far.
    pub fn node(&self) -> Option<&NodeInfo> {
        self.node.get()
    }

    /// Learns the node from a request's `node` if it is not known yet (idempotent).
    /// The shell calls it before [`handle_request`](Self::handle_request) to pick the
    /// snapshot; `handle_request` calls it too.
    pub fn observe_node(&mut self, node: Option<&Node>) -> Option<&NodeInfo> {
        self.node.observe(node)
    }

    /// Types this stream is subscribed to (non-empty subscription), in push order.
    pub fn subscribed_types(&self) -> Vec<ResourceType> {
        self.types
            .iter()
            .filter(|(_, s)| !s.subscription.is_empty())
            .map(|(t, _)| *t)
            .collect()
    }

    /// Handles one request of the client.
    pub fn handle_request(
        &mut self,
        req: DiscoveryRequest,
        snapshot: &Snapshot,
        now: Instant,
    ) -> SotwOutcome {
        self.observe_node(req.node.as_ref());
        let mut out = SotwOutcome::default();
        if req.type_url.is_empty() {
            return out;
        }
        let t = ResourceType::from_type_url(&req.type_url);
        // A SotW request replaces the type's names: bounding the list bounds the stream.
        if let Err(refused) = check_names("resource_names", t, req.resource_names.len()) {
            return SotwOutcome::refused(refused);
        }
        let Some(t) = t else {
            out.events.push(self.node.request(None));
            out.responses = self.converge(snapshot, now, None);
            if req.response_nonce.is_empty() && !snapshot.is_held() {
                let nonce = self.next_nonce();
                out.responses.push(DiscoveryResponse {
                    version_info: EMPTY_VERSION.to_string(),
                    type_url: req.type_url,
                    nonce,
                    control_plane: self.config.control_plane(),
                    ..Default::default()
                });
            }
            return out;
        };
        out.events.push(self.node.request(Some(t)));

        let respond_now = match self.types.get_mut(&t) {
            Some(state) if !req.response_nonce.is_empty() && state.sent.is_some() => {
                let Some(sent) = state.sent.as_mut() else {
                    return out;
                };
                if req.response_nonce != sent.nonce {
                    // Stale: the client has not seen our latest response yet.
                    None
                } else {
                    if !sent.answered {
                        sent.answered = true;
                        let event = state.nack.answer(
                            &self.node,
                            t,
                            sent.version.clone(),
                            req.error_detail.as_ref(),
                            now,
                            &self.config,
                        );
                        state
                            .log
                            .answered_sotw(&sent.version, nack_message(&event), now);
                        out.events.push(event);
                    }
                    let requested = subscription(t, &req.resource_names, Some(&state.subscription));
                    if requested.is_empty() {
                        // Unsubscribed: the client dropped what it held, so subscribing
                        // again to the very same names must be answered.
                        sent.subscription = Subscription::default();
                        state.log = ResourceLog::default();
                    }
                    let changed = requested != sent.subscription && !requested.is_empty();
                    state.subscription = requested;
                    changed.then_some(t)
                }
            }
            Some(state) => {
                // Empty nonce on a known type: the client (re)starts the subscription.
                state.subscription =
                    subscription(t, &req.resource_names, Some(&state.subscription));
                Some(t)
            }
            None => {
                // First request of the type on this stream (a nonce from an earlier
                // stream is meaningless here).
                let subscription = subscription(t, &req.resource_names, None);
                self.types.insert(
                    t,
                    TypeState {
                        subscription,
                        sent: None,
                        nack: NackState::default(),
                        log: ResourceLog::default(),
                    },
                );
                Some(t)
            }
        };
        out.responses = self.converge(snapshot, now, respond_now);
        out
    }

    /// Pushes the subscribed types whose version changed since they were last sent.
    pub fn handle_snapshot(&mut self, snapshot: &Snapshot, now: Instant) -> SotwOutcome {
        SotwOutcome {
            responses: self.converge(snapshot, now, None),
            ..SotwOutcome::default()
        }
    }

    /// Re-sends rejected versions whose backoff expired at `now`.
    pub fn poll_timers(&mut self, snapshot: &Snapshot, now: Instant) -> SotwOutcome {
        self.handle_snapshot(snapshot, now)
    }

    /// The earliest NACK backoff deadline, if any.
    pub fn next_timer(&self) -> Option<Instant> {
        next_timer(self.types.values().map(|s| &s.nack))
    }

    fn next_nonce(&mut self) -> String {
        self.last_nonce += 1;
        self.last_nonce.to_string()
    }

    /// Brings every subscribed type in line with `snapshot` (one response per type at
    /// most, in push order); `force` is answered even if its version is unchanged.
    fn converge(
        &mut self,
        snapshot: &Snapshot,
        now: Instant,
        force: Option<ResourceType>,
    ) -> Vec<DiscoveryResponse> {
        let mut responses = Vec::new();
        if snapshot.is_held() {
            // The node has no published snapshot: answer nothing, keep the requests'
            // state; the first published snapshot is converged to.
            return responses;
        }
        for t in ResourceType::ALL {
            let Some(state) = self.types.get(&t) else {
                continue;
            };
            let ts = snapshot.get(t);
            let send = force == Some(t)
                || (!state.subscription.is_empty()
                    && match &state.sent {
                        None => true,
                        Some(sent) => {
                            sent.version != ts.version()
                                || state.nack.retry_due(ts.version(), now)
                                // Names changed while the node was held.
                                || sent.subscription != state.subscription
                        }
                    });
            if !send {
                continue;
            }
            let nonce = self.next_nonce();
            let Some(state) = self.types.get_mut(&t) else {
                continue;
            };
            state.nack.on_sent(ts.version());
            let selected = state.subscription.select(ts);
            state.log.sent_sotw(&selected);
            let resources = selected
                .into_iter()
                .map(crate::snapshot::wire_any)
                .collect();
            state.sent = Some(Sent {
                nonce: nonce.clone(),
                version: ts.version().to_string(),
                subscription: state.subscription.clone(),
                answered: false,
            });
            responses.push(DiscoveryResponse {
                version_info: ts.version().to_string(),
                resources,
                canary: false,
                type_url: t.type_url().to_string(),
                nonce,
                control_plane: self.config.control_plane(),
                resource_errors: Vec::new(),
            });
        }
        responses
    }
}

impl ClientView for SotwStream {
    fn generic_xds_configs(&self, input: &ViewInput<'_>) -> Vec<GenericXdsConfig> {
        let mut out = Vec::new();
        for (t, state) in self.types.iter() {
            let names: BTreeSet<&str> = state
                .log
                .names()
                .chain(state.subscription.names.iter().map(String::as_str))
                .collect();
            for name in names {
                out.push(match state.log.get(name) {
                    Some(rs) => resource_config(*t, name, rs, input),
                    None => absent_config(
                        *t,
                        name,
                        state
                            .sent
                            .as_ref()
                            .filter(|s| s.subscription.covers(name))
                            .map(|s| s.answered),
                    ),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::StreamEvent;
    use crate::snapshot::tests::{res, snap};
    use ResourceType::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster as ClusterPb;
    use envoy_types::pb::envoy::config::listener::v3::Listener as ListenerPb;
    use envoy_types::pb::google::rpc::Status;
    use prost::Message;
    use prost_types::Any;
    use std::time::Duration;

    impl SotwStream {
        /// The version of `t` last sent on this stream.
        fn sent_version(&self, t: ResourceType) -> Option<&str> {
            self.types
                .get(&t)
                .and_then(|s| s.sent.as_ref())
                .map(|s| s.version.as_str())
        }
    }

    fn node() -> Node {
        crate::NodeInfo {
            id: "node1".into(),
            pod_name: "pod-a".into(),
        }
        .to_node()
    }

    fn req(t: ResourceType, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: t.type_url().into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn first(t: ResourceType, names: &[&str]) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(node()),
            ..req(t, names, "", "")
        }
    }

    fn nack_req(t: ResourceType, names: &[&str], nonce: &str, msg: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            error_detail: Some(Status {
                code: 3,
                message: msg.into(),
                details: vec![],
            }),
            ..req(t, names, "", nonce)
        }
    }

    fn names(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| String::from_utf8_lossy(&a.value).into_owned())
            .collect()
    }

    fn stream() -> SotwStream {
        SotwStream::new(AdsConfig::default())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Resources whose body is the name, so responses are easy to read.
    fn snap_named(items: &[(ResourceType, &str, &str)]) -> Snapshot {
        Snapshot::new(
            items
                .iter()
                .map(|(k, n, c)| crate::Resource {
                    body: Any {
                        type_url: k.type_url().into(),
                        value: n.as_bytes().to_vec(),
                    },
                    ..res(*k, n, c)
                })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn a_node_without_a_published_snapshot_is_held_not_emptied() {
        let held = Snapshot::placeholder();
        let mut st = stream();
        let t0 = Instant::now();
        // A reconnecting Envoy asks for everything: nothing is answered while its node
        // has no published snapshot (never an empty CDS/LDS that would drop its config).
        assert!(
            st.handle_request(first(Cluster, &[]), &held, t0)
                .responses
                .is_empty()
        );
        assert!(
            st.handle_request(req(Listener, &[], "", ""), &held, t0)
                .responses
                .is_empty()
        );
        let unknown = DiscoveryRequest {
            type_url: "type.googleapis.com/foo.Bar".into(),
            ..Default::default()
        };
        assert!(st.handle_request(unknown, &held, t0).responses.is_empty());
        assert!(st.poll_timers(&held, t0).responses.is_empty());
        // Published: both requested types are answered at once, in push order.
        let s1 = snap_named(&[(Cluster, "c1", "1"), (Listener, "l1", "1")]);
        let out = st.handle_snapshot(&s1, t0);
        let types: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(types, [Cluster.type_url(), Listener.type_url()]);
        // Held again (its EnvoyConfig was removed): nothing is pushed, the Envoy keeps
        // what it has; published again with the same content: nothing to send either.
        assert!(st.handle_snapshot(&held, t0).responses.is_empty());
        assert!(st.handle_snapshot(&s1, t0).responses.is_empty());
    }

    #[test]
    fn resource_names_over_the_limit_are_refused_before_anything_is_stored() {
        use crate::tracking::MAX_NAMES_PER_TYPE as MAX;
        let s0 = snap_named(&[(Route, "r1", "1")]);
        let t0 = Instant::now();
        let many = |n: usize| -> Vec<String> { (0..n).map(|i| format!("r{i}")).collect() };
        let mut st = stream();
        let mut over = first(Route, &[]);
        over.resource_names = many(MAX + 1);
        let out = st.handle_request(over.clone(), &s0, t0);
        assert_eq!(
            out.refused.map(|r| r.to_string()).as_deref(),
            Some(
                format!(
                    "resource_names of route: {} resource names, over the limit of {MAX} per type per stream",
                    MAX + 1
                )
                .as_str()
            )
        );
        assert!(out.responses.is_empty() && out.events.is_empty());
        assert!(st.subscribed_types().is_empty(), "nothing stored");
        // Types we do not serve too.
        over.type_url = "type.googleapis.com/foo.Bar".into();
        assert_eq!(
            st.handle_request(over, &s0, t0)
                .refused
                .map(|r| r.resource_type),
            Some("unknown")
        );
        // At the limit: served; a later request over it is refused and the last good
        // subscription is kept.
        let mut at = first(Route, &[]);
        at.resource_names = many(MAX);
        let out = st.handle_request(at, &s0, t0);
        assert_eq!(out.refused, None);
        assert_eq!(names(&out.responses[0]), ["r1"]);
        let mut later = req(
            Route,
            &[],
            &out.responses[0].version_info,
            &out.responses[0].nonce,
        );
        later.resource_names = many(MAX + 1);
        assert!(st.handle_request(later, &s0, t0).refused.is_some());
        assert_eq!(
            st.types.get(&Route).map(|s| s.subscription.names.len()),
            Some(MAX)
        );
    }

    #[test]
    fn initial_request_ack_and_node() {
        let s0 = snap_named(&[(Cluster, "c1", "1"), (Cluster, "c2", "1")]);
        let mut st = stream();
        let t0 = Instant::now();
        assert_eq!(st.observe_node(Some(&node())).unwrap().pod_name, "pod-a");
        let out = st.handle_request(first(Cluster, &[]), &s0, t0);
        assert_eq!(out.responses.len(), 1);
        let r = &out.responses[0];
        assert_eq!(r.type_url, Cluster.type_url());
        assert_eq!(r.version_info, s0.version(Cluster));
        assert_eq!(names(r), ["c1", "c2"]);
        assert_eq!(
            out.events,
            vec![StreamEvent::Request {
                node_id: "node1".into(),
                pod_name: "pod-a".into(),
                resource_type: Some(Cluster)
            }]
        );

        // Later requests carry no node: the first one stays.
        let ack = st.handle_request(req(Cluster, &[], &r.version_info, &r.nonce), &s0, t0);
        assert!(ack.responses.is_empty());
        assert_eq!(
            ack.events[1],
            StreamEvent::Ack {
                node_id: "node1".into(),
                pod_name: "pod-a".into(),
                resource_type: Cluster,
                version: s0.version(Cluster).into()
            }
        );
        // The same nonce again is not a second ACK (and names are unchanged).
        let again = st.handle_request(req(Cluster, &[], &r.version_info, &r.nonce), &s0, t0);
        assert!(again.responses.is_empty());
        assert_eq!(again.events.len(), 1, "only the Request event");
        assert_eq!(st.subscribed_types(), vec![Cluster]);
        assert_eq!(st.sent_version(Cluster), Some(s0.version(Cluster)));
    }

    #[test]
    fn nonces_are_unique_per_stream() {
        let s0 = snap(&[(Cluster, "c", "1"), (Listener, "l", "1")]);
        let mut st = stream();
        let t0 = Instant::now();
        let a = st.handle_request(first(Cluster, &[]), &s0, t0).responses;
        let b = st
            .handle_request(req(Listener, &[], "", ""), &s0, t0)
            .responses;
        assert_ne!(a[0].nonce, b[0].nonce);
    }

    #[test]
    fn wildcard_vs_explicit_names() {
        let s0 = snap_named(&[
            (Cluster, "c1", "1"),
            (Cluster, "c2", "1"),
            (Route, "r1", "1"),
            (Route, "r2", "1"),
            (Secret, "s1", "1"),
        ]);
        // (type, requested names, expected resources)
        let cases: &[(ResourceType, &[&str], &[&str])] = &[
            (Cluster, &[], &["c1", "c2"]),
            (Cluster, &["*"], &["c1", "c2"]),
            (Cluster, &["c2"], &["c2"]),
            (Route, &["r2", "missing"], &["r2"]),
            (Route, &["*"], &["r1", "r2"]),
            // Not a wildcard type: empty means nothing, but the first request is
            // still answered.
            (Route, &[], &[]),
            (Secret, &["s1"], &["s1"]),
            (Listener, &[], &[]),
        ];
        for (t, req_names, expected) in cases {
            let mut st = stream();
            let out = st.handle_request(first(*t, req_names), &s0, Instant::now());
            assert_eq!(out.responses.len(), 1, "{t} {req_names:?}");
            assert_eq!(names(&out.responses[0]), *expected, "{t} {req_names:?}");
            assert_eq!(out.responses[0].version_info, s0.version(*t));
        }
    }

    #[test]
    fn nack_backoff_schedule() {
        let s0 = snap(&[(Listener, "l", "bad")]);
        let mut st = stream();
        let t0 = Instant::now();
        let r = st
            .handle_request(first(Listener, &[]), &s0, t0)
            .responses
            .remove(0);
        let v = r.version_info.clone();

        // Five consecutive NACKs: the re-send comes 100, 200, 400, 800, 1600 ms later.
        let mut nonce = r.nonce;
        let mut now = t0;
        for (i, delay) in [100u64, 200, 400, 800, 1600].into_iter().enumerate() {
            let out = st.handle_request(
                nack_req(Listener, &[], &nonce, "invalid listener"),
                &s0,
                now,
            );
            assert!(
                out.responses.is_empty(),
                "NACK #{i} is never answered at once"
            );
            assert_eq!(
                out.events[1],
                StreamEvent::Nack {
                    node_id: "node1".into(),
                    pod_name: "pod-a".into(),
                    resource_type: Listener,
                    version: v.clone(),
                    message: "invalid listener".into()
                }
            );
            assert_eq!(st.next_timer(), Some(now + ms(delay)));
            // Nothing before the deadline, whatever wakes the stream up.
            assert!(
                st.poll_timers(&s0, now + ms(delay - 1))
                    .responses
                    .is_empty()
            );
            assert!(
                st.handle_snapshot(&s0, now + ms(delay - 1))
                    .responses
                    .is_empty()
            );
            now += ms(delay);
            let out = st.poll_timers(&s0, now);
            assert_eq!(out.responses.len(), 1, "re-sent at the deadline");
            assert_eq!(out.responses[0].version_info, v);
            assert_eq!(st.next_timer(), None, "re-sent: waiting for the answer");
            assert!(
                st.poll_timers(&s0, now + ms(10_000)).responses.is_empty(),
                "only once"
            );
            nonce = out.responses[0].nonce.clone();
        }
        assert!(
            now - t0 < Duration::from_secs(4),
            "5 NACKs within a few seconds"
        );

        // A newer version goes out at once and resets the backoff.
        let s1 = snap(&[(Listener, "l", "good")]);
        st.handle_request(nack_req(Listener, &[], &nonce, "x"), &s0, now);
        let out = st.handle_snapshot(&s1, now);
        assert_eq!(out.responses.len(), 1);
        assert_eq!(out.responses[0].version_info, s1.version(Listener));
        assert_eq!(st.next_timer(), None);
        let out = st.handle_request(
            nack_req(Listener, &[], &out.responses[0].nonce, "x"),
            &s1,
            now,
        );
        assert!(out.responses.is_empty());
        assert_eq!(
            st.next_timer(),
            Some(now + ms(100)),
            "count restarted for the new version"
        );
    }

    #[test]
    fn nack_backoff_is_capped() {
        let cfg = AdsConfig::default();
        let delays: Vec<u64> = (1..=12)
            .map(|n| cfg.nack_backoff(n).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [
                100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000
            ]
        );
        assert_eq!(cfg.nack_backoff(u32::MAX), Duration::from_secs(30));
        assert_eq!(cfg.nack_backoff(0), ms(100));

        // Through the state machine, with a small custom cap.
        let mut st = SotwStream::new(AdsConfig {
            nack_backoff_max: ms(250),
            ..AdsConfig::default()
        });
        let s0 = snap(&[(Cluster, "c", "bad")]);
        let mut now = Instant::now();
        let mut nonce = st.handle_request(first(Cluster, &[]), &s0, now).responses[0]
            .nonce
            .clone();
        for delay in [100, 200, 250, 250] {
            st.handle_request(nack_req(Cluster, &[], &nonce, "x"), &s0, now);
            assert_eq!(st.next_timer(), Some(now + ms(delay)));
            now += ms(delay);
            nonce = st.poll_timers(&s0, now).responses[0].nonce.clone();
        }
    }

    #[test]
    fn ack_resets_backoff() {
        let s0 = snap(&[(Cluster, "c", "1")]);
        let mut st = stream();
        let now = Instant::now();
        let n1 = st.handle_request(first(Cluster, &[]), &s0, now).responses[0]
            .nonce
            .clone();
        st.handle_request(nack_req(Cluster, &[], &n1, "flaky"), &s0, now);
        let n2 = st.poll_timers(&s0, now + ms(100)).responses[0]
            .nonce
            .clone();
        let out = st.handle_request(
            req(Cluster, &[], s0.version(Cluster), &n2),
            &s0,
            now + ms(100),
        );
        assert!(matches!(out.events[1], StreamEvent::Ack { .. }));
        // A later NACK of a new version starts from 100 ms again.
        let s1 = snap(&[(Cluster, "c", "2")]);
        let n3 = st.handle_snapshot(&s1, now + ms(200)).responses[0]
            .nonce
            .clone();
        st.handle_request(nack_req(Cluster, &[], &n3, "x"), &s1, now + ms(200));
        assert_eq!(st.next_timer(), Some(now + ms(300)));
    }

    #[test]
    fn stale_nonce_is_ignored() {
        let s0 = snap_named(&[(Route, "r1", "1"), (Route, "r2", "1")]);
        let s1 = snap_named(&[(Route, "r1", "2"), (Route, "r2", "1")]);
        let mut st = stream();
        let now = Instant::now();
        let old = st
            .handle_request(first(Route, &["r1"]), &s0, now)
            .responses
            .remove(0);
        let new = st.handle_snapshot(&s1, now).responses.remove(0);
        // ACK, NACK or names change with the old nonce: no response, no ACK/NACK event.
        for stale in [
            req(Route, &["r1"], &old.version_info, &old.nonce),
            nack_req(Route, &["r1"], &old.nonce, "x"),
            req(Route, &["r1", "r2"], &old.version_info, &old.nonce),
            req(Route, &["r1"], "", "unknown-nonce"),
        ] {
            let out = st.handle_request(stale, &s1, now);
            assert!(out.responses.is_empty());
            assert_eq!(out.events.len(), 1, "only the Request event");
        }
        assert_eq!(st.next_timer(), None);
        let out = st.handle_request(req(Route, &["r1"], &new.version_info, &new.nonce), &s1, now);
        assert!(out.responses.is_empty());
        assert!(
            matches!(&out.events[1], StreamEvent::Ack { version, .. } if *version == new.version_info)
        );
    }

    #[test]
    fn resource_names_change_and_unsubscribe() {
        let s0 = snap_named(&[(Route, "r1", "1"), (Route, "r2", "1")]);
        let mut st = stream();
        let now = Instant::now();
        let r = st
            .handle_request(first(Route, &["r1"]), &s0, now)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r1"]);
        // ACK that also adds a route name: answered at once with the new set.
        let out = st.handle_request(
            req(Route, &["r1", "r2"], &r.version_info, &r.nonce),
            &s0,
            now,
        );
        assert!(matches!(out.events[1], StreamEvent::Ack { .. }));
        assert_eq!(out.responses.len(), 1);
        assert_eq!(names(&out.responses[0]), ["r1", "r2"]);
        let r = out.responses[0].clone();
        // ACK of that, then a request with the same nonce adding a name that does not
        // exist: the set differs, so it is answered (with what exists).
        st.handle_request(
            req(Route, &["r1", "r2"], &r.version_info, &r.nonce),
            &s0,
            now,
        );
        let out = st.handle_request(
            req(Route, &["r1", "r2", "r3"], &r.version_info, &r.nonce),
            &s0,
            now,
        );
        assert_eq!(out.events.len(), 1, "not a second ACK");
        assert_eq!(names(&out.responses[0]), ["r1", "r2"]);
        let r = out.responses[0].clone();
        st.handle_request(
            req(Route, &["r1", "r2", "r3"], &r.version_info, &r.nonce),
            &s0,
            now,
        );

        // Unsubscribe everything: no response, and no pushes afterwards.
        let out = st.handle_request(req(Route, &[], &r.version_info, &r.nonce), &s0, now);
        assert!(out.responses.is_empty());
        assert!(st.subscribed_types().is_empty());
        let s1 = snap_named(&[(Route, "r1", "2")]);
        assert!(st.handle_snapshot(&s1, now).responses.is_empty());
        // Subscribing again is answered at once.
        let out = st.handle_request(req(Route, &["r1"], &r.version_info, &r.nonce), &s1, now);
        assert_eq!(names(&out.responses[0]), ["r1"]);
        assert_eq!(out.responses[0].version_info, s1.version(Route));
        // Unsubscribe and subscribe again to the same name: answered again.
        let r = out.responses[0].clone();
        st.handle_request(req(Route, &["r1"], &r.version_info, &r.nonce), &s1, now);
        assert!(
            st.handle_request(req(Route, &[], &r.version_info, &r.nonce), &s1, now)
                .responses
                .is_empty()
        );
        let out = st.handle_request(req(Route, &["r1"], &r.version_info, &r.nonce), &s1, now);
        assert_eq!(names(&out.responses[0]), ["r1"]);
    }

    #[test]
    fn wildcard_type_stays_wildcard_on_empty_names() {
        let s0 = snap_named(&[(Listener, "l1", "1")]);
        let mut st = stream();
        let now = Instant::now();
        let r = st
            .handle_request(first(Listener, &[]), &s0, now)
            .responses
            .remove(0);
        st.handle_request(req(Listener, &[], &r.version_info, &r.nonce), &s0, now);
        let s1 = snap_named(&[(Listener, "l1", "1"), (Listener, "l2", "1")]);
        let out = st.handle_snapshot(&s1, now);
        assert_eq!(names(&out.responses[0]), ["l1", "l2"]);
    }

    #[test]
    fn reconnect_with_known_version_is_answered() {
        let s0 = snap(&[(Cluster, "c", "1"), (Listener, "l", "1")]);
        let mut st = stream();
        let now = Instant::now();
        // A brand-new stream whose first request says "I already have this version"
        // and carries a nonce of the previous stream.
        let out = st.handle_request(
            DiscoveryRequest {
                node: Some(node()),
                ..req(Cluster, &[], s0.version(Cluster), "41")
            },
            &s0,
            now,
        );
        assert_eq!(out.responses.len(), 1);
        assert_eq!(out.responses[0].version_info, s0.version(Cluster));
        assert_eq!(out.events.len(), 1, "not an ACK");
        // Its ACK produces nothing more.
        let r = &out.responses[0];
        assert!(
            st.handle_request(req(Cluster, &[], &r.version_info, &r.nonce), &s0, now)
                .responses
                .is_empty()
        );
        // An empty nonce on a known type restarts the subscription: answered again.
        let out = st.handle_request(req(Cluster, &[], s0.version(Cluster), ""), &s0, now);
        assert_eq!(out.responses.len(), 1);
    }

    #[test]
    fn multi_type_push_is_ordered_and_only_changed_types() {
        let s0 = snap(&[
            (Cluster, "c", "1"),
            (Endpoint, "c", "1"),
            (Listener, "l", "1"),
            (Route, "r", "1"),
            (Secret, "s", "1"),
            (Runtime, "rt", "1"),
        ]);
        let mut st = stream();
        let now = Instant::now();
        // Subscribe in Envoy's usual, non-push order.
        for (i, (t, n)) in [
            (Secret, "s"),
            (Listener, ""),
            (Route, "r"),
            (Runtime, "rt"),
            (Endpoint, "c"),
            (Cluster, ""),
        ]
        .into_iter()
        .enumerate()
        {
            let names: Vec<&str> = if n.is_empty() { vec![] } else { vec![n] };
            let r = if i == 0 {
                first(t, &names)
            } else {
                req(t, &names, "", "")
            };
            let out = st.handle_request(r, &s0, now);
            let ack = &out.responses[0];
            st.handle_request(req(t, &names, &ack.version_info, &ack.nonce), &s0, now);
        }
        // Everything changes: pushed in push order.
        let s1 = snap(&[
            (Cluster, "c", "2"),
            (Endpoint, "c", "2"),
            (Listener, "l", "2"),
            (Route, "r", "2"),
            (Secret, "s", "2"),
            (Runtime, "rt", "2"),
        ]);
        let out = st.handle_snapshot(&s1, now);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            order,
            [
                Cluster.type_url(),
                Endpoint.type_url(),
                Listener.type_url(),
                Route.type_url(),
                Secret.type_url(),
                Runtime.type_url()
            ]
        );
        // Only the route and the secret change: only they are pushed.
        let s2 = snap(&[
            (Cluster, "c", "2"),
            (Endpoint, "c", "2"),
            (Listener, "l", "2"),
            (Route, "r", "3"),
            (Secret, "s", "3"),
            (Runtime, "rt", "2"),
        ]);
        let out = st.handle_snapshot(&s2, now);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(order, [Route.type_url(), Secret.type_url()]);
        // Same snapshot again: nothing.
        assert!(st.handle_snapshot(&s2, now).responses.is_empty());
        // Types nobody subscribed to are never pushed.
        let s3 = snap(&[(Cluster, "c", "2"), (ExtensionConfig, "e", "1")]);
        let out = st.handle_snapshot(&s3, now);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            order,
            [
                Endpoint.type_url(),
                Listener.type_url(),
                Route.type_url(),
                Secret.type_url(),
                Runtime.type_url()
            ]
        );
        assert!(
            out.responses
                .iter()
                .all(|r| r.resources.is_empty() || r.type_url == Cluster.type_url())
        );
    }

    #[test]
    fn request_also_converges_other_types() {
        // The shell may read a newer snapshot at request time than the one it last
        // pushed: the call pushes the other changed types too, still in push order.
        let s0 = snap(&[(Cluster, "c", "1")]);
        let s1 = snap(&[(Cluster, "c", "2"), (Listener, "l", "1")]);
        let mut st = stream();
        let now = Instant::now();
        let r = st
            .handle_request(first(Cluster, &[]), &s0, now)
            .responses
            .remove(0);
        st.handle_request(req(Cluster, &[], &r.version_info, &r.nonce), &s0, now);
        let out = st.handle_request(req(Listener, &[], "", ""), &s1, now);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(order, [Cluster.type_url(), Listener.type_url()]);
    }

    #[test]
    fn unknown_type_gets_an_empty_response_once() {
        let s0 = snap(&[(Cluster, "c", "1")]);
        let mut st = stream();
        let now = Instant::now();
        let url = "type.googleapis.com/envoy.config.core.v3.Unknown";
        let r = DiscoveryRequest {
            node: Some(node()),
            type_url: url.into(),
            resource_names: vec!["x".into()],
            ..Default::default()
        };
        let out = st.handle_request(r.clone(), &s0, now);
        assert_eq!(out.responses.len(), 1);
        assert_eq!(out.responses[0].type_url, url);
        assert!(out.responses[0].resources.is_empty());
        assert_eq!(out.responses[0].version_info, EMPTY_VERSION);
        assert_eq!(
            out.events,
            vec![StreamEvent::Request {
                node_id: "node1".into(),
                pod_name: "pod-a".into(),
                resource_type: None
            }]
        );
        // Its ACK is not answered (no ping-pong), and no ACK event exists for it.
        let ack = DiscoveryRequest {
            response_nonce: out.responses[0].nonce.clone(),
            ..r
        };
        let out = st.handle_request(ack, &s0, now);
        assert!(out.responses.is_empty());
        assert_eq!(out.events.len(), 1);
        // No type URL at all: ignored.
        assert!(
            st.handle_request(DiscoveryRequest::default(), &s0, now)
                .is_empty()
        );
    }

    #[test]
    fn real_envoy_messages_round_trip() {
        let cluster = ClusterPb {
            name: "backend".into(),
            ..Default::default()
        };
        let listener = ListenerPb {
            name: "http".into(),
            ..Default::default()
        };
        let body = |t: ResourceType, bytes: Vec<u8>| Any {
            type_url: t.type_url().into(),
            value: bytes,
        };
        let s0 = Snapshot::new(vec![
            crate::Resource {
                kind: Cluster,
                name: "backend".into(),
                body: body(Cluster, cluster.encode_to_vec()),
                digest: 1,
            },
            crate::Resource {
                kind: Listener,
                name: "http".into(),
                body: body(Listener, listener.encode_to_vec()),
                digest: 2,
            },
        ])
        .unwrap();
        let mut st = stream();
        let out = st.handle_request(first(Cluster, &[]), &s0, Instant::now());
        let decoded = ClusterPb::decode(out.responses[0].resources[0].value.as_slice()).unwrap();
        assert_eq!(decoded.name, "backend");
        assert_eq!(out.responses[0].resources[0].type_url, Cluster.type_url());
    }

    #[test]
    fn control_plane_identifier_and_missing_node() {
        let s0 = snap(&[(Cluster, "c", "1")]);
        let mut st = SotwStream::new(AdsConfig {
            control_plane_id: Some("marin3r-0".into()),
            ..Default::default()
        });
        // No node on the first message: events carry empty ids, the node is learned
        // from the next message that has one.
        let out = st.handle_request(req(Cluster, &[], "", ""), &s0, Instant::now());
        assert_eq!(
            out.responses[0].control_plane.as_ref().unwrap().identifier,
            "marin3r-0"
        );
        assert_eq!(
            out.events[0],
            StreamEvent::Request {
                node_id: String::new(),
                pod_name: String::new(),
                resource_type: Some(Cluster)
            }
        );
        assert!(st.node().is_none());
        st.handle_request(first(Listener, &[]), &s0, Instant::now());
        assert_eq!(st.node().unwrap().id, "node1");
    }
}
