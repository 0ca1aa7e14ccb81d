//! Sans-I/O state machine of one ADS **incremental (delta)** stream; same shape as
//! [`crate::sotw::SotwStream`] (and the same [`AdsConfig`], [`Outcome`] and
//! [`StreamEvent`]s).
//!
//! The stream keeps, per type, the subscription and what the client is known to hold
//! (`name → version`, version = `version_string(resource.digest)`), and sends only the
//! difference to the snapshot: changed/added resources in `resources`, names the client
//! holds that are gone (or no longer subscribed through a wildcard) in
//! `removed_resources`. `system_version_info` is the type's snapshot version.
//!
//! Protocol decisions:
//! - **Initial request** = first request of a type on this stream. Subscription from
//!   `resource_names_subscribe`: `"*"` → wildcard (any type); empty → wildcard for the
//!   wildcard-capable types ([`supports_wildcard`]: CDS, LDS, SRDS), nothing otherwise.
//!   `initial_resource_versions` primes what the client holds (reconnect), so only
//!   resources whose version differs are sent, and names it holds that no longer
//!   exist are listed in `removed_resources`. The initial request is **always**
//!   answered, even when nothing differs (an empty response carrying the system
//!   version), so the client never waits for an initial fetch timeout.
//! - **Subscription changes** (`resource_names_subscribe` / `_unsubscribe`) are applied
//!   from every request, whatever its nonce: they are deltas, and Envoy sends them
//!   without a nonce, so dropping them would lose them for good. Newly subscribed
//!   names that do not exist are reported in `removed_resources` once (the delta way of
//!   saying "does not exist"). Unsubscribing `"*"` leaves the wildcard; unsubscribing a
//!   name still covered by the wildcard keeps it. A request that widens the
//!   subscription is answered at once, even during a NACK backoff (client-paced).
//! - **ACK/NACK**: Envoy answers every delta response, in order, so each response stays
//!   *in flight* until answered. A `response_nonce` naming an in-flight response is its
//!   ACK (no `error_detail`) or NACK (with it), reported with that response's system
//!   version; any other nonce is stale and produces no event. On a NACK the resources
//!   of the rejected response (unless re-sent since) are considered held by the client
//!   at an unknown version (Envoy's LDS and CDS apply the good resources of a rejected
//!   response), so they are sent again — after the backoff — and listed in
//!   `removed_resources` once the snapshot no longer has them.
//! - **NACK backoff**: as for SotW, the rejected version is re-sent only after
//!   `initial · 2^(n-1)` (capped); a newer type version is sent at once and resets it.
//! - **Snapshot change**: only the differences, only for subscribed types; a type whose
//!   version changed without any difference for this client (e.g. only unsubscribed
//!   resources changed) sends nothing. Responses of one call are in push order.
//! - **Too many names**: a request with a list of more than
//!   [`MAX_NAMES_PER_TYPE`](crate::tracking::MAX_NAMES_PER_TYPE) names, or after which a
//!   type would be subscribed to more than that many names (subscriptions accumulate over
//!   the stream), is refused (`Outcome::refused`: the stream ends with
//!   `RESOURCE_EXHAUSTED`) and changes nothing.
//! - **Work per request**: a type is diffed against the snapshot only when its
//!   subscription, what the client holds or its snapshot version changed since its last
//!   diff, so an ACK or a request of another type does not walk every subscribed name.
//! - **Unknown type URLs**: a request without nonce is answered with an empty response
//!   (version [`EMPTY_VERSION`]) listing the requested names as removed (they do not
//!   exist here) the first time the type is seen or when it subscribes names;
//!   requests with a nonce are ignored.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as DeltaResource,
};
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;

use crate::csds::{
    ClientView, ResourceLog, ViewInput, absent_config, nack_message, resource_config,
};
use crate::events::StreamEvent;
use crate::node::NodeInfo;
use crate::snapshot::{EMPTY_VERSION, Snapshot, TypeSnapshot};
use crate::stream::{Outcome, Subscription, WILDCARD, supports_wildcard};
use crate::tracking::{AdsConfig, NackState, StreamNode, TypeMap, check_names, next_timer};
use marin3r_envoyconfig::resource::{ResourceType, version_string};

/// Outcome of a [`DeltaStream`] call.
pub type DeltaOutcome = Outcome<DeltaDiscoveryResponse>;

/// Responses kept waiting for an ACK/NACK per type; beyond this the oldest are
/// forgotten (their answers then count as stale). Envoy answers every response, so
/// this only bounds memory against a misbehaving client.
const MAX_IN_FLIGHT: usize = 64;

/// Unknown type URLs remembered per stream (bounds memory; past it, an unknown type
/// is answered as if seen for the first time).
const MAX_UNKNOWN_TYPES: usize = 32;

/// Marker for "the client may hold this name, version unknown" (never a real
/// version, which is 16 hex digits).
const UNKNOWN_VERSION: &str = "";

/// A response waiting for its ACK/NACK.
#[derive(Debug, Clone)]
struct InFlight {
    nonce: String,
    version: String,
    /// Resources sent: name → digest.
    resources: BTreeMap<String, u64>,
    removed: BTreeSet<String>,
}

impl InFlight {
    /// Whether this response sends or removes `name`.
    fn carries(&self, name: &str) -> bool {
        self.resources.contains_key(name) || self.removed.contains(name)
    }
}

#[derive(Debug, Clone, Default)]
struct TypeState {
    subscription: Subscription,
    /// What the client holds: `Some(version)`, or `None` when we told it the name
    /// does not exist (kept for explicitly subscribed names only, so it is said once).
    client: BTreeMap<String, Option<String>>,
    in_flight: VecDeque<InFlight>,
    nack: NackState,
    /// An initial request came while the node was held ([`Snapshot::is_held`]): it is
    /// answered with the first published snapshot, even with an empty difference.
    owed: bool,
    /// The type version the client was last brought in line with, while neither the
    /// subscription nor what the client holds changed since: the difference to that
    /// version is empty, so a request of another type (or an ACK) does not diff this
    /// type again. A type version is the hash of its resources' names and digests, so
    /// the same version means the same resources.
    synced: Option<String>,
    /// Per resource: what the client runs, was sent, rejected (client status).
    log: ResourceLog,
}

impl TypeState {
    /// Resources to send and names to remove so the client matches `ts`.
    fn diff<'a>(&self, ts: &'a TypeSnapshot) -> (Vec<&'a crate::Resource>, BTreeSet<String>) {
        let send = self
            .subscription
            .select(ts)
            .into_iter()
            .filter(|r| match self.client.get(&r.name) {
                Some(Some(v)) => *v != version_string(r.digest),
                _ => true,
            })
            .collect();
        let mut removed: BTreeSet<String> = self
            .client
            .iter()
            .filter(|(name, held)| {
                held.is_some() && !(self.subscription.covers(name) && ts.get(name).is_some())
            })
            .map(|(name, _)| name.clone())
            .collect();
        removed.extend(
            self.subscription
                .names
                .iter()
                .filter(|n| ts.get(n).is_none() && !self.client.contains_key(*n))
                .cloned(),
        );
        (send, removed)
    }
}

/// One ADS delta stream.
#[derive(Debug, Clone)]
pub struct DeltaStream {
    config: AdsConfig,
    node: StreamNode,
    types: TypeMap<TypeState>,
    unknown_types: BTreeSet<String>,
    last_nonce: u64,
    /// Types diffed against a snapshot, for tests of the work a request costs.
    #[cfg(test)]
    diffs: usize,
}

impl DeltaStream {
    pub fn new(config: AdsConfig) -> Self {
        Self {
            config,
            node: StreamNode::default(),
            types: TypeMap::default(),
            unknown_types: BTreeSet::new(),
            last_nonce: 0,
            #[cfg(test)]
            diffs: 0,
        }
    }

    /// The node learned so far.
    pub fn node(&self) -> Option<&NodeInfo> {
        self.node.get()
    }

    /// Learns the node from a request's `node` if not known yet (idempotent).
    pub fn observe_node(&mut self, node: Option<&Node>) -> Option<&NodeInfo> {
        self.node.observe(node)
    }

    /// Types with a non-empty subscription, in push order.
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
        req: DeltaDiscoveryRequest,
        snapshot: &Snapshot,
        now: Instant,
    ) -> DeltaOutcome {
        self.observe_node(req.node.as_ref());
        let mut out = DeltaOutcome::default();
        if req.type_url.is_empty() {
            return out;
        }
        let t = ResourceType::from_type_url(&req.type_url);
        if let Err(refused) = self.check_names(t, &req) {
            return DeltaOutcome::refused(refused);
        }
        let Some(t) = t else {
            out.events.push(self.node.request(None));
            out.responses = self.converge(snapshot, now, None);
            if !snapshot.is_held()
                && let Some(r) = self.unknown_type(req)
            {
                out.responses.push(r);
            }
            return out;
        };
        out.events.push(self.node.request(Some(t)));

        let force = match self.types.get_mut(&t) {
            None => {
                let mut state = TypeState::default();
                let subscribe = &req.resource_names_subscribe;
                state.subscription.wildcard = subscribe.iter().any(|n| n == WILDCARD)
                    || (subscribe.is_empty() && supports_wildcard(t));
                apply_changes(&mut state, &req);
                for (name, version) in req.initial_resource_versions {
                    if state.subscription.covers(&name) {
                        state.client.insert(name, Some(version));
                    }
                }
                self.types.insert(t, state);
                Some(Force::Always)
            }
            Some(state) => {
                if !req.response_nonce.is_empty()
                    && let Some(event) = answer(state, &req, t, &self.node, now, &self.config)
                {
                    out.events.push(event);
                }
                if !req.resource_names_subscribe.is_empty()
                    || !req.resource_names_unsubscribe.is_empty()
                {
                    state.synced = None;
                }
                apply_changes(state, &req).then_some(Force::IfDiff)
            }
        };
        out.responses = self.converge(snapshot, now, force.map(|f| (t, f)));
        out
    }

    /// Sends the differences of subscribed types to `snapshot`.
    pub fn handle_snapshot(&mut self, snapshot: &Snapshot, now: Instant) -> DeltaOutcome {
        DeltaOutcome {
            responses: self.converge(snapshot, now, None),
            ..DeltaOutcome::default()
        }
    }

    /// Re-sends rejected resources whose backoff expired at `now`.
    pub fn poll_timers(&mut self, snapshot: &Snapshot, now: Instant) -> DeltaOutcome {
        self.handle_snapshot(snapshot, now)
    }

    /// The earliest NACK backoff deadline, if any.
    pub fn next_timer(&self) -> Option<Instant> {
        next_timer(self.types.values().map(|s| &s.nack))
    }

    /// [`MAX_NAMES_PER_TYPE`](crate::tracking::MAX_NAMES_PER_TYPE) for a request of
    /// `t`: each list it carries, and the names the type would be subscribed to after
    /// it (subscriptions accumulate over a stream's requests). Work proportional to the
    /// request; nothing is changed.
    fn check_names(
        &self,
        t: Option<ResourceType>,
        req: &DeltaDiscoveryRequest,
    ) -> Result<(), crate::tracking::TooManyNames> {
        let subscribe = &req.resource_names_subscribe;
        check_names("resource_names_subscribe", t, subscribe.len())?;
        check_names(
            "resource_names_unsubscribe",
            t,
            req.resource_names_unsubscribe.len(),
        )?;
        check_names(
            "initial_resource_versions",
            t,
            req.initial_resource_versions.len(),
        )?;
        let Some(names) = t
            .and_then(|t| self.types.get(&t))
            .map(|s| &s.subscription.names)
        else {
            return Ok(());
        };
        if subscribe.is_empty() {
            return Ok(());
        }
        // As `apply_changes` applies them: the subscriptions, then the unsubscriptions.
        let added: BTreeSet<&str> = subscribe
            .iter()
            .map(String::as_str)
            .filter(|n| *n != WILDCARD && !names.contains(*n))
            .collect();
        let dropped = req
            .resource_names_unsubscribe
            .iter()
            .map(String::as_str)
            .filter(|n| names.contains(*n) || added.contains(n))
            .collect::<BTreeSet<&str>>()
            .len();
        let after = (names.len() + added.len()).saturating_sub(dropped);
        check_names("resource_names_subscribe", t, after)
    }

    fn next_nonce(&mut self) -> String {
        self.last_nonce += 1;
        self.last_nonce.to_string()
    }

    fn unknown_type(&mut self, req: DeltaDiscoveryRequest) -> Option<DeltaDiscoveryResponse> {
        if !req.response_nonce.is_empty() {
            return None;
        }
        let first_time = !self.unknown_types.contains(&req.type_url);
        if first_time && self.unknown_types.len() < MAX_UNKNOWN_TYPES {
            self.unknown_types.insert(req.type_url.clone());
        }
        let removed: BTreeSet<String> = req
            .resource_names_subscribe
            .into_iter()
            .filter(|n| n != WILDCARD)
            .collect();
        if !first_time && removed.is_empty() {
            return None;
        }
        Some(DeltaDiscoveryResponse {
            system_version_info: EMPTY_VERSION.to_string(),
            type_url: req.type_url,
            removed_resources: removed.into_iter().collect(),
            nonce: self.next_nonce(),
            control_plane: self.config.control_plane(),
            ..Default::default()
        })
    }

    /// Brings every subscribed type in line with `snapshot`, one response per type at
    /// most, in push order.
    fn converge(
        &mut self,
        snapshot: &Snapshot,
        now: Instant,
        force: Option<(ResourceType, Force)>,
    ) -> Vec<DeltaDiscoveryResponse> {
        let mut responses = Vec::new();
        if snapshot.is_held() {
            // The node has no published snapshot: answer nothing (never "everything you
            // hold is removed"); an initial request is owed its answer.
            if let Some((t, Force::Always)) = force
                && let Some(state) = self.types.get_mut(&t)
            {
                state.owed = true;
            }
            return responses;
        }
        for t in ResourceType::ALL {
            let Some(state) = self.types.get(&t) else {
                continue;
            };
            let forced = force
                .filter(|(ft, _)| *ft == t)
                .map(|(_, f)| f)
                .or(state.owed.then_some(Force::Always));
            let ts = snapshot.get(t);
            if forced.is_none() && state.nack.holds(ts.version(), now) {
                continue;
            }
            if forced != Some(Force::Always) && state.synced.as_deref() == Some(ts.version()) {
                // Nothing changed on either side since the last diff.
                continue;
            }
            #[cfg(test)]
            {
                self.diffs += 1;
            }
            let (send, removed) = state.diff(ts);
            if send.is_empty() && removed.is_empty() && forced != Some(Force::Always) {
                if let Some(state) = self.types.get_mut(&t) {
                    state.synced = Some(ts.version().to_string());
                }
                continue;
            }
            let nonce = self.next_nonce();
            let Some(state) = self.types.get_mut(&t) else {
                continue;
            };
            state.owed = false;
            state.synced = Some(ts.version().to_string());
            state.nack.on_sent(ts.version());
            state.log.sent_delta(&send, &removed);
            let mut resources = Vec::with_capacity(send.len());
            for r in &send {
                let version = version_string(r.digest);
                state.client.insert(r.name.clone(), Some(version.clone()));
                resources.push(DeltaResource {
                    name: r.name.clone(),
                    version,
                    resource: Some(crate::snapshot::wire_any(r)),
                    ..Default::default()
                });
            }
            for name in &removed {
                if state.subscription.names.contains(name) {
                    state.client.insert(name.clone(), None);
                } else {
                    state.client.remove(name);
                }
            }
            state.in_flight.push_back(InFlight {
                nonce: nonce.clone(),
                version: ts.version().to_string(),
                resources: send.iter().map(|r| (r.name.clone(), r.digest)).collect(),
                removed: removed.clone(),
            });
            while state.in_flight.len() > MAX_IN_FLIGHT {
                state.in_flight.pop_front();
            }
            responses.push(DeltaDiscoveryResponse {
                system_version_info: ts.version().to_string(),
                resources,
                type_url: t.type_url().to_string(),
                removed_resources: removed.into_iter().collect(),
                removed_resource_names: Vec::new(),
                nonce,
                control_plane: self.config.control_plane(),
                resource_errors: Vec::new(),
            });
        }
        responses
    }
}

/// Why a type is answered regardless of its NACK backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Force {
    /// Initial request: answer even with an empty difference.
    Always,
    /// Widened subscription: answer if there is any difference.
    IfDiff,
}

/// Applies `resource_names_subscribe`/`_unsubscribe`; returns whether the subscription
/// widened (something new may need to be sent).
fn apply_changes(state: &mut TypeState, req: &DeltaDiscoveryRequest) -> bool {
    let mut widened = false;
    for name in &req.resource_names_subscribe {
        if name == WILDCARD {
            widened |= !std::mem::replace(&mut state.subscription.wildcard, true);
        } else {
            widened |= state.subscription.names.insert(name.clone());
        }
    }
    for name in &req.resource_names_unsubscribe {
        if name == WILDCARD {
            state.subscription.wildcard = false;
            let names = &state.subscription.names;
            state.client.retain(|n, _| names.contains(n));
            state.log.retain(|n| names.contains(n));
        } else {
            state.subscription.names.remove(name);
            if !state.subscription.wildcard {
                state.client.remove(name);
                state.log.remove(name);
            }
        }
    }
    widened
}

/// Handles the nonce of a non-initial request: ACK/NACK of an in-flight response, or
/// nothing for a stale one.
fn answer(
    state: &mut TypeState,
    req: &DeltaDiscoveryRequest,
    t: ResourceType,
    node: &StreamNode,
    now: Instant,
    config: &AdsConfig,
) -> Option<StreamEvent> {
    let pos = state
        .in_flight
        .iter()
        .position(|f| f.nonce == req.response_nonce)?;
    // Envoy answers in order: anything older than the answered response is settled.
    let answered: Vec<InFlight> = state.in_flight.drain(..=pos).collect();
    let entry = answered.into_iter().last()?;
    let event = state.nack.answer(
        node,
        t,
        entry.version,
        req.error_detail.as_ref(),
        now,
        config,
    );
    // Whether a newer in-flight response carries `name` again (sent or removed).
    let later = |name: &str| state.in_flight.iter().any(|f| f.carries(name));
    state.log.answered_delta(
        &entry.resources,
        &entry.removed,
        later,
        nack_message(&event),
        now,
    );
    if req.error_detail.is_none() {
        return Some(event);
    }
    // The rejected changes may or may not have been applied (Envoy's LDS and CDS apply
    // the good resources of a rejected response and NACK the rest): unless a newer
    // in-flight response carries the same names again, the client may hold them at an
    // unknown version, so they are sent again, and removed if the snapshot drops them.
    let resend: Vec<String> = entry
        .resources
        .keys()
        .filter(|n| !later(n))
        .cloned()
        .collect();
    let reremove: Vec<String> = entry
        .removed
        .iter()
        .filter(|n| !later(n))
        .cloned()
        .collect();
    for name in resend.into_iter().chain(reremove) {
        state.client.insert(name, Some(UNKNOWN_VERSION.to_string()));
    }
    state.synced = None;
    Some(event)
}

impl ClientView for DeltaStream {
    fn generic_xds_configs(&self, input: &ViewInput<'_>) -> Vec<GenericXdsConfig> {
        let mut out = Vec::new();
        for (t, state) in self.types.iter() {
            let told_absent = |name: &str| matches!(state.client.get(name), Some(None));
            let names: BTreeSet<&str> = state
                .log
                .names()
                .chain(state.subscription.names.iter().map(String::as_str))
                .chain(
                    state
                        .client
                        .keys()
                        .map(String::as_str)
                        .filter(|n| told_absent(n)),
                )
                .collect();
            for name in names {
                out.push(match state.log.get(name) {
                    Some(rs) => resource_config(*t, name, rs, input),
                    None => absent_config(
                        *t,
                        name,
                        told_absent(name)
                            .then(|| !state.in_flight.iter().any(|f| f.removed.contains(name))),
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
    use crate::snapshot::tests::{res, snap};
    use ResourceType::*;
    use envoy_types::pb::envoy::config::listener::v3::Listener as ListenerPb;
    use envoy_types::pb::google::rpc::Status;
    use prost::Message;
    use prost_types::Any;
    use std::time::Duration;

    impl DeltaStream {
        /// What the client is believed to hold for `t`: name → resource version.
        fn client_versions(&self, t: ResourceType) -> BTreeMap<String, String> {
            self.types
                .get(&t)
                .map(|s| {
                    s.client
                        .iter()
                        .filter_map(|(n, v)| v.clone().map(|v| (n.clone(), v)))
                        .collect()
                })
                .unwrap_or_default()
        }
    }

    fn node() -> Node {
        Node {
            id: "node1".into(),
            ..Default::default()
        }
    }

    fn req(t: ResourceType, sub: &[&str], unsub: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: t.type_url().into(),
            resource_names_subscribe: sub.iter().map(|n| n.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn first(t: ResourceType, sub: &[&str]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: Some(node()),
            ..req(t, sub, &[], "")
        }
    }

    fn ack(r: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        }
    }

    fn nack(r: &DeltaDiscoveryResponse, msg: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            error_detail: Some(Status {
                code: 3,
                message: msg.into(),
                details: vec![],
            }),
            ..ack(r)
        }
    }

    fn sent(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    fn removed(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.removed_resources.iter().map(String::as_str).collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn v(s: &Snapshot, t: ResourceType, name: &str) -> String {
        version_string(s.resource(t, name).unwrap().digest)
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn subscribe(t: ResourceType, names: Vec<String>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: t.type_url().into(),
            resource_names_subscribe: names,
            ..Default::default()
        }
    }

    fn subscribed(st: &DeltaStream, t: ResourceType) -> usize {
        st.types.get(&t).map_or(0, |s| s.subscription.names.len())
    }

    #[test]
    fn subscriptions_over_the_limit_are_refused_before_anything_is_stored() {
        use crate::tracking::MAX_NAMES_PER_TYPE as MAX;
        let s0 = snap(&[(Endpoint, "e", "1")]);
        let t0 = Instant::now();
        let mut st = DeltaStream::new(AdsConfig::default());
        let out = st.handle_request(first(Endpoint, &["e"]), &s0, t0);
        assert_eq!(out.refused, None);
        // Subscriptions accumulate: four requests of a quarter of the limit each fill it
        // (with "e" already there, the last one is one name over).
        for i in 0..3 {
            let out = st.handle_request(
                subscribe(Endpoint, names(&format!("{i}-"), MAX / 4)),
                &s0,
                t0,
            );
            assert_eq!(out.refused, None, "request {i}");
        }
        assert_eq!(subscribed(&st, Endpoint), 1 + 3 * (MAX / 4));
        let out = st.handle_request(subscribe(Endpoint, names("3-", MAX / 4)), &s0, t0);
        let refused = out.refused.expect("over the limit");
        assert_eq!(
            refused.to_string(),
            format!(
                "resource_names_subscribe of endpoint: {} resource names, over the limit of {MAX} per type per stream",
                MAX + 1
            )
        );
        assert!(out.responses.is_empty() && out.events.is_empty());
        assert_eq!(
            subscribed(&st, Endpoint),
            1 + 3 * (MAX / 4),
            "nothing stored"
        );
        // Names already subscribed, "*", and names unsubscribed in the same request do
        // not count.
        let mut again = subscribe(Endpoint, names("0-", MAX / 4));
        again.resource_names_subscribe.push(WILDCARD.into());
        assert_eq!(st.handle_request(again, &s0, t0).refused, None);
        let mut swap = subscribe(Endpoint, names("3-", MAX / 4));
        swap.resource_names_unsubscribe = names("2-", MAX / 4);
        assert_eq!(st.handle_request(swap, &s0, t0).refused, None);
        assert_eq!(subscribed(&st, Endpoint), 1 + 3 * (MAX / 4));

        // Every list of a request is bounded on its own, for every type, known or not,
        // on the first request of a type too.
        let mut fresh = DeltaStream::new(AdsConfig::default());
        let too_many = names("x", MAX + 1);
        let mut initial = first(Cluster, &[]);
        initial.initial_resource_versions = too_many
            .iter()
            .map(|n| (n.clone(), "v".to_string()))
            .collect();
        let mut unsubscribe = req(Route, &[], &[], "");
        unsubscribe.resource_names_unsubscribe = too_many.clone();
        let mut unknown = subscribe(Route, too_many.clone());
        unknown.type_url = "type.googleapis.com/foo.Bar".into();
        for (request, field, t) in [
            (
                subscribe(Secret, too_many.clone()),
                "resource_names_subscribe",
                "secret",
            ),
            (initial, "initial_resource_versions", "cluster"),
            (unsubscribe, "resource_names_unsubscribe", "route"),
            (unknown, "resource_names_subscribe", "unknown"),
        ] {
            let refused = fresh.handle_request(request, &s0, t0).refused;
            assert_eq!(
                refused.map(|r| (r.field, r.resource_type, r.names)),
                Some((field, t, MAX + 1))
            );
        }
        assert!(fresh.types.iter().next().is_none(), "no type state kept");
        assert!(fresh.unknown_types.is_empty());
        // At the limit is fine.
        let out = fresh.handle_request(subscribe(Secret, names("s", MAX)), &s0, t0);
        assert_eq!(out.refused, None);
        assert_eq!(
            removed(&out.responses[0]).len(),
            MAX,
            "all said not to exist"
        );
    }

    #[test]
    fn a_request_of_one_type_does_not_diff_the_others() {
        use crate::tracking::MAX_NAMES_PER_TYPE as MAX;
        let s0 = snap(&[(Cluster, "c", "1"), (Endpoint, "e", "1")]);
        let t0 = Instant::now();
        let mut st = DeltaStream::new(AdsConfig::default());
        let out = st.handle_request(first(Cluster, &[]), &s0, t0);
        let cds = out.responses[0].clone();
        let out = st.handle_request(subscribe(Endpoint, names("e", MAX)), &s0, t0);
        assert_eq!(out.responses.len(), 1);
        let eds = out.responses[0].clone();
        let diffs = st.diffs;
        // ACKs and requests of clusters, a snapshot with the same versions: the full
        // endpoint subscription is not looked at again.
        st.handle_request(ack(&cds), &s0, t0);
        st.handle_request(ack(&eds), &s0, t0);
        for _ in 0..10 {
            assert!(
                st.handle_request(req(Cluster, &[], &[], ""), &s0, t0)
                    .responses
                    .is_empty()
            );
        }
        assert!(st.handle_snapshot(&s0, t0).responses.is_empty());
        assert_eq!(st.diffs, diffs, "no type was diffed again");
        // A change of the endpoints' subscription diffs that type once.
        let out = st.handle_request(req(Endpoint, &[], &["e1"], ""), &s0, t0);
        assert!(out.responses.is_empty());
        assert_eq!(st.diffs, diffs + 1);
        // A new snapshot version of a type diffs that type, and is sent.
        let s1 = snap(&[(Cluster, "c", "2"), (Endpoint, "e", "1")]);
        let out = st.handle_snapshot(&s1, t0);
        assert_eq!(sent(&out.responses[0]), ["c"]);
        assert_eq!(st.diffs, diffs + 2);
        // A NACK marks what the client holds as unknown: re-sent after the backoff.
        let out = st.handle_request(nack(&out.responses[0], "bad"), &s1, t0);
        assert!(out.responses.is_empty());
        let out = st.poll_timers(&s1, t0 + ms(100));
        assert_eq!(sent(&out.responses[0]), ["c"]);
    }

    #[test]
    fn initial_wildcard_and_explicit() {
        let s0 = snap(&[
            (Cluster, "c1", "1"),
            (Cluster, "c2", "1"),
            (Endpoint, "c1", "1"),
            (Route, "r", "1"),
        ]);
        // (type, subscribe, expected resources, expected removed)
        type Case<'a> = (ResourceType, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case<'_>] = &[
            (Cluster, &[], &["c1", "c2"], &[]),
            (Cluster, &["*"], &["c1", "c2"], &[]),
            (Cluster, &["c2"], &["c2"], &[]),
            (Endpoint, &["c1", "c9"], &["c1"], &["c9"]),
            (Endpoint, &[], &[], &[]),
            (Route, &["*"], &["r"], &[]),
            (Listener, &[], &[], &[]),
        ];
        for (t, sub, exp, exp_removed) in cases {
            let mut st = DeltaStream::new(AdsConfig::default());
            let out = st.handle_request(first(*t, sub), &s0, Instant::now());
            assert_eq!(
                out.responses.len(),
                1,
                "{t} {sub:?}: initial is always answered"
            );
            let r = &out.responses[0];
            assert_eq!(sent(r), *exp, "{t} {sub:?}");
            assert_eq!(removed(r), *exp_removed, "{t} {sub:?}");
            assert_eq!(r.system_version_info, s0.version(*t));
            for dr in &r.resources {
                assert_eq!(dr.version, v(&s0, *t, &dr.name));
                assert_eq!(dr.resource.as_ref().unwrap().type_url, t.type_url());
            }
        }
    }

    #[test]
    fn ack_nack_and_changes() {
        let s0 = snap(&[
            (Cluster, "c1", "1"),
            (Cluster, "c2", "1"),
            (Cluster, "c3", "1"),
        ]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        let r = st
            .handle_request(first(Cluster, &[]), &s0, now)
            .responses
            .remove(0);
        let out = st.handle_request(ack(&r), &s0, now);
        assert!(out.responses.is_empty());
        assert_eq!(
            out.events[1],
            StreamEvent::Ack {
                node_id: "node1".into(),
                pod_name: String::new(),
                resource_type: Cluster,
                version: s0.version(Cluster).into()
            }
        );
        // Snapshot change: only the changed, added and removed names.
        let s1 = snap(&[
            (Cluster, "c1", "1"),
            (Cluster, "c2", "2"),
            (Cluster, "c4", "1"),
        ]);
        let r = st.handle_snapshot(&s1, now).responses.remove(0);
        assert_eq!(sent(&r), ["c2", "c4"]);
        assert_eq!(removed(&r), ["c3"]);
        assert_eq!(r.system_version_info, s1.version(Cluster));
        assert!(st.handle_snapshot(&s1, now).responses.is_empty());
        // A stale nonce (already answered) is no event.
        let out = st.handle_request(ack(&r), &s1, now);
        assert!(matches!(out.events[1], StreamEvent::Ack { .. }));
        let out = st.handle_request(ack(&r), &s1, now);
        assert_eq!(out.events.len(), 1);
        let out = st.handle_request(req(Cluster, &[], &[], "999"), &s1, now);
        assert_eq!(out.events.len(), 1);
        assert!(out.responses.is_empty());
        assert_eq!(
            st.client_versions(Cluster),
            [
                ("c1", v(&s1, Cluster, "c1")),
                ("c2", v(&s1, Cluster, "c2")),
                ("c4", v(&s1, Cluster, "c4"))
            ]
            .map(|(n, v)| (n.to_string(), v))
            .into()
        );
    }

    #[test]
    fn reconnect_with_initial_resource_versions() {
        let s0 = snap(&[
            (Listener, "l1", "1"),
            (Listener, "l2", "1"),
            (Listener, "l3", "1"),
        ]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let mut r = first(Listener, &[]);
        r.initial_resource_versions = [
            ("l1".to_string(), v(&s0, Listener, "l1")), // up to date
            ("l2".to_string(), "0000000000000000".to_string()), // outdated
            ("gone".to_string(), "0000000000000001".to_string()), // deleted meanwhile
        ]
        .into();
        let out = st.handle_request(r, &s0, Instant::now());
        let r = &out.responses[0];
        assert_eq!(sent(r), ["l2", "l3"]);
        assert_eq!(removed(r), ["gone"]);

        // Everything up to date: still answered, with nothing in it.
        let mut st = DeltaStream::new(AdsConfig::default());
        let mut r = first(Listener, &["*"]);
        r.initial_resource_versions = ["l1", "l2", "l3"]
            .map(|n| (n.to_string(), v(&s0, Listener, n)))
            .into();
        let out = st.handle_request(r, &s0, Instant::now());
        assert_eq!(out.responses.len(), 1);
        assert!(
            out.responses[0].resources.is_empty() && out.responses[0].removed_resources.is_empty()
        );
        assert_eq!(out.responses[0].system_version_info, s0.version(Listener));
    }

    #[test]
    fn subscribe_unsubscribe() {
        let s0 = snap(&[(Endpoint, "a", "1"), (Endpoint, "b", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        let r = st
            .handle_request(first(Endpoint, &["a"]), &s0, now)
            .responses
            .remove(0);
        assert_eq!(sent(&r), ["a"]);
        // Envoy sends subscription changes without a nonce; answered at once.
        let out = st.handle_request(req(Endpoint, &["b", "zz"], &[], ""), &s0, now);
        assert_eq!(sent(&out.responses[0]), ["b"]);
        assert_eq!(
            removed(&out.responses[0]),
            ["zz"],
            "does-not-exist, said once"
        );
        // Unsubscribe: nothing to send; later changes of it are not pushed.
        let out = st.handle_request(req(Endpoint, &[], &["a"], ""), &s0, now);
        assert!(out.responses.is_empty());
        let s1 = snap(&[(Endpoint, "a", "2"), (Endpoint, "b", "1")]);
        assert!(st.handle_snapshot(&s1, now).responses.is_empty());
        // The missing one appears: pushed.
        let s2 = snap(&[
            (Endpoint, "a", "2"),
            (Endpoint, "b", "1"),
            (Endpoint, "zz", "1"),
        ]);
        assert_eq!(sent(&st.handle_snapshot(&s2, now).responses[0]), ["zz"]);
        // Re-subscribe: sent again (the client forgot it).
        let out = st.handle_request(req(Endpoint, &["a"], &[], ""), &s2, now);
        assert_eq!(sent(&out.responses[0]), ["a"]);
        // Removing b from the snapshot: removed.
        let s3 = snap(&[(Endpoint, "a", "2"), (Endpoint, "zz", "1")]);
        assert_eq!(removed(&st.handle_snapshot(&s3, now).responses[0]), ["b"]);
        assert_eq!(st.subscribed_types(), vec![Endpoint]);
    }

    #[test]
    fn wildcard_unsubscribe() {
        let s0 = snap(&[(Cluster, "a", "1"), (Cluster, "b", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        st.handle_request(first(Cluster, &["*", "a"]), &s0, now);
        // Unsubscribing a name still covered by the wildcard changes nothing.
        assert!(
            st.handle_request(req(Cluster, &[], &["a"], ""), &s0, now)
                .responses
                .is_empty()
        );
        assert_eq!(st.client_versions(Cluster).len(), 2);
        // Leaving the wildcard keeps only explicit names (none left).
        st.handle_request(req(Cluster, &[], &["*"], ""), &s0, now);
        assert!(st.client_versions(Cluster).is_empty());
        assert!(st.subscribed_types().is_empty());
        let s1 = snap(&[(Cluster, "a", "2")]);
        assert!(st.handle_snapshot(&s1, now).responses.is_empty());
    }

    #[test]
    fn nack_backoff_resends_rejected_resources() {
        let s0 = snap(&[(Listener, "good", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let t0 = Instant::now();
        let r = st
            .handle_request(first(Listener, &[]), &s0, t0)
            .responses
            .remove(0);
        st.handle_request(ack(&r), &s0, t0);

        let s1 = snap(&[(Listener, "good", "1"), (Listener, "bad", "1")]);
        let mut r = st.handle_snapshot(&s1, t0).responses.remove(0);
        assert_eq!(sent(&r), ["bad"]);
        let mut now = t0;
        for delay in [100u64, 200, 400, 800] {
            let out = st.handle_request(nack(&r, "bad listener"), &s1, now);
            assert!(out.responses.is_empty());
            assert_eq!(
                out.events[1],
                StreamEvent::Nack {
                    node_id: "node1".into(),
                    pod_name: String::new(),
                    resource_type: Listener,
                    version: s1.version(Listener).into(),
                    message: "bad listener".into()
                }
            );
            assert_eq!(st.next_timer(), Some(now + ms(delay)));
            assert!(
                st.handle_snapshot(&s1, now + ms(delay - 1))
                    .responses
                    .is_empty()
            );
            assert!(
                st.poll_timers(&s1, now + ms(delay - 1))
                    .responses
                    .is_empty()
            );
            now += ms(delay);
            r = st.poll_timers(&s1, now).responses.remove(0);
            assert_eq!(sent(&r), ["bad"], "only the rejected resource again");
            assert!(st.poll_timers(&s1, now + ms(60_000)).responses.is_empty());
        }
        // A fixed version goes out at once, backoff reset.
        st.handle_request(nack(&r, "x"), &s1, now);
        let s2 = snap(&[(Listener, "good", "1"), (Listener, "bad", "2")]);
        let out = st.handle_snapshot(&s2, now);
        assert_eq!(sent(&out.responses[0]), ["bad"]);
        assert_eq!(st.next_timer(), None);
        let out = st.handle_request(nack(&out.responses[0], "x"), &s2, now);
        assert!(out.responses.is_empty());
        assert_eq!(st.next_timer(), Some(now + ms(100)));
    }

    /// Envoy's LDS applies the good listeners of a rejected response (the NACK names
    /// the bad ones): a rejected name may be held, so dropping it from the snapshot
    /// removes it (found serving the corpus to a real Envoy: the good listeners of a
    /// rejected response stayed on Envoy for good).
    #[test]
    fn names_of_a_rejected_response_are_removed_when_dropped() {
        let s0 = snap(&[]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        let r = st
            .handle_request(first(Listener, &[]), &s0, now)
            .responses
            .remove(0);
        st.handle_request(ack(&r), &s0, now);
        let s1 = snap(&[(Listener, "good", "1"), (Listener, "bad", "1")]);
        let r = st.handle_snapshot(&s1, now).responses.remove(0);
        assert_eq!(sent(&r), ["bad", "good"]);
        st.handle_request(nack(&r, "bad: rejected"), &s1, now);
        let out = st.handle_snapshot(&s0, now);
        assert_eq!(out.responses.len(), 1, "the removal goes out at once");
        assert_eq!(removed(&out.responses[0]), ["bad", "good"]);
        assert!(out.responses[0].resources.is_empty());
    }

    #[test]
    fn nack_of_removal_resends_removal() {
        let s0 = snap(&[(Cluster, "a", "1"), (Cluster, "b", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        let r = st
            .handle_request(first(Cluster, &[]), &s0, now)
            .responses
            .remove(0);
        st.handle_request(ack(&r), &s0, now);
        let s1 = snap(&[(Cluster, "a", "1")]);
        let r = st.handle_snapshot(&s1, now).responses.remove(0);
        assert_eq!(removed(&r), ["b"]);
        st.handle_request(nack(&r, "cannot remove"), &s1, now);
        let r = st.poll_timers(&s1, now + ms(100)).responses.remove(0);
        assert_eq!(removed(&r), ["b"]);
        assert!(r.resources.is_empty());
    }

    #[test]
    fn in_flight_answers_in_order() {
        // Two pushes before any answer: each gets its own ACK/NACK.
        let s0 = snap(&[(Cluster, "a", "1")]);
        let s1 = snap(&[(Cluster, "a", "2")]);
        let s2 = snap(&[(Cluster, "a", "2"), (Cluster, "b", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        let r0 = st
            .handle_request(first(Cluster, &[]), &s0, now)
            .responses
            .remove(0);
        let r1 = st.handle_snapshot(&s1, now).responses.remove(0);
        let r2 = st.handle_snapshot(&s2, now).responses.remove(0);
        assert_eq!(sent(&r2), ["b"]);
        let e = st.handle_request(ack(&r0), &s2, now).events;
        assert!(
            matches!(&e[1], StreamEvent::Ack { version, .. } if *version == r0.system_version_info)
        );
        // r1's "a" was not re-sent since, so it must go out again; r1's version is no
        // longer the current one (s2 is), so at once, without backoff.
        let out = st.handle_request(nack(&r1, "x"), &s2, now);
        assert!(
            matches!(&out.events[1], StreamEvent::Nack { version, .. } if *version == r1.system_version_info)
        );
        assert_eq!(sent(&out.responses[0]), ["a"]);
        assert_eq!(out.responses[0].system_version_info, s2.version(Cluster));
        assert_eq!(st.next_timer(), None);
        let out = st.handle_request(ack(&r2), &s2, now);
        assert!(out.responses.is_empty());
        assert!(
            matches!(&out.events[1], StreamEvent::Ack { version, .. } if *version == r2.system_version_info)
        );
        // r0 is settled: its nonce is stale now.
        assert_eq!(st.handle_request(ack(&r0), &s2, now).events.len(), 1);
    }

    #[test]
    fn multi_type_push_order() {
        let s0 = snap(&[]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        for (i, t) in [Route, Listener, Secret, Endpoint, Cluster]
            .into_iter()
            .enumerate()
        {
            let r = if i == 0 {
                first(t, &["*"])
            } else {
                req(t, &["*"], &[], "")
            };
            let r = st.handle_request(r, &s0, now).responses.remove(0);
            st.handle_request(ack(&r), &s0, now);
        }
        let s1 = snap(&[
            (Secret, "s", "1"),
            (Route, "r", "1"),
            (Listener, "l", "1"),
            (Cluster, "c", "1"),
            (Endpoint, "c", "1"),
        ]);
        let out = st.handle_snapshot(&s1, now);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            order,
            [Cluster, Endpoint, Listener, Route, Secret].map(ResourceType::type_url)
        );
        let s2 = snap(&[
            (Secret, "s", "2"),
            (Route, "r", "1"),
            (Listener, "l", "1"),
            (Cluster, "c", "2"),
            (Endpoint, "c", "1"),
        ]);
        let order: Vec<String> = st
            .handle_snapshot(&s2, now)
            .responses
            .into_iter()
            .map(|r| r.type_url)
            .collect();
        assert_eq!(order, [Cluster, Secret].map(|t| t.type_url().to_string()));
    }

    #[test]
    fn a_node_without_a_published_snapshot_is_held_then_answered() {
        let held = Snapshot::placeholder();
        let mut st = DeltaStream::new(AdsConfig::default());
        let t0 = Instant::now();
        st.observe_node(Some(&node()));
        // Reconnecting with what it holds: nothing is answered (never "removed").
        let mut reconnect = first(Cluster, &["*"]);
        reconnect.initial_resource_versions =
            std::collections::HashMap::from([("c1".to_string(), "x".to_string())]);
        assert!(st.handle_request(reconnect, &held, t0).responses.is_empty());
        assert!(
            st.handle_request(first(Secret, &["s"]), &held, t0)
                .responses
                .is_empty()
        );
        // The first published snapshot answers both initial requests, even the one
        // with nothing to send (its initial fetch must complete).
        let s1 = snap(&[(Cluster, "c1", "1")]);
        let out = st.handle_snapshot(&s1, t0);
        let types: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(types, [Cluster.type_url(), Secret.type_url()]);
        assert_eq!(sent(&out.responses[0]), ["c1"]);
        assert!(removed(&out.responses[0]).is_empty());
        assert_eq!(removed(&out.responses[1]), ["s"]);
        // Held again: nothing, not even removals.
        assert!(st.handle_snapshot(&held, t0).responses.is_empty());
    }

    #[test]
    fn unknown_type() {
        let s0 = snap(&[(Cluster, "c", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let now = Instant::now();
        let url = "type.googleapis.com/envoy.extensions.Unknown";
        let r = DeltaDiscoveryRequest {
            node: Some(node()),
            type_url: url.into(),
            resource_names_subscribe: vec!["x".into()],
            ..Default::default()
        };
        let out = st.handle_request(r, &s0, now);
        assert_eq!(out.responses.len(), 1);
        assert_eq!(out.responses[0].removed_resources, ["x"]);
        assert_eq!(out.responses[0].system_version_info, EMPTY_VERSION);
        assert_eq!(
            out.events,
            vec![StreamEvent::Request {
                node_id: "node1".into(),
                pod_name: String::new(),
                resource_type: None
            }]
        );
        let ackr = DeltaDiscoveryRequest {
            type_url: url.into(),
            response_nonce: out.responses[0].nonce.clone(),
            ..Default::default()
        };
        assert!(st.handle_request(ackr, &s0, now).responses.is_empty());
        let again = DeltaDiscoveryRequest {
            type_url: url.into(),
            ..Default::default()
        };
        assert!(
            st.handle_request(again, &s0, now).responses.is_empty(),
            "seen, nothing new"
        );
        let more = DeltaDiscoveryRequest {
            type_url: url.into(),
            resource_names_subscribe: vec!["y".into()],
            ..Default::default()
        };
        assert_eq!(
            st.handle_request(more, &s0, now).responses[0].removed_resources,
            ["y"]
        );
    }

    #[test]
    fn real_listener_body() {
        let l = ListenerPb {
            name: "http".into(),
            ..Default::default()
        };
        let s0 = Snapshot::new(vec![crate::Resource {
            body: Any {
                type_url: Listener.type_url().into(),
                value: l.encode_to_vec(),
            },
            ..res(Listener, "http", "x")
        }])
        .unwrap();
        let mut st = DeltaStream::new(AdsConfig::default());
        let out = st.handle_request(first(Listener, &[]), &s0, Instant::now());
        let body = out.responses[0].resources[0].resource.as_ref().unwrap();
        assert_eq!(
            ListenerPb::decode(body.value.as_slice()).unwrap().name,
            "http"
        );
    }
}
