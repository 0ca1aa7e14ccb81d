//! Client status (CSDS, `envoy.service.status.v3.ClientStatusDiscoveryService`): per
//! connected Envoy, what this replica sent, what the Envoy ACKed and what it NACKed with
//! which message.
//!
//! - **What is tracked** ([`ResourceLog`], one per type in each stream state machine):
//!   per resource the version the Envoy ACKed (what it runs), when, and the digest of it;
//!   what the last unanswered response changes for it ([`Pending`]); the last NACK
//!   that concerns it. A digest, an `Arc<str>` version (shared by the resources of one
//!   ACKed SotW response) and an `Instant` per resource: nothing is copied per response.
//! - **Versions** are what Envoy's admin `/config_dump` shows per active dynamic
//!   resource. Delta: the resource's own version (`version_string(digest)`). SotW: the
//!   `version_info` of the ACKed response that last *changed* the resource; Envoy keeps
//!   the older version of a resource whose content did not change in a later response
//!   (it skips an unchanged cluster, listener or route configuration by hash). A NACK
//!   leaves the ACKed version in place and marks the resources the rejected response
//!   changed as NACKED (with Envoy's message, as the NACK statistics store it:
//!   [`crate::tracking::stored_nack_message`]), until a later ACK covers them.
//! - **Registry** ([`ClientStatusRegistry`]): a stream registers when its node is
//!   learned and is removed when its task ends, on every path ([`Registration`]'s
//!   `Drop`). The state machine is shared with the stream task behind a mutex, locked by
//!   the task for each of its calls and by a query briefly, to build that stream's view
//!   ([`ClientView`]): the registry lock is held only to copy the stream handles, and
//!   the matchers run without it (a query never delays a stream registering).
//! - **Bounds** on what a query makes the server do: at most [`MAX_STRING_MATCHERS`]
//!   string matchers of at most [`MAX_PATTERN_BYTES`] together (refused with
//!   `INVALID_ARGUMENT` naming the limit), each compared with node fields bounded by
//!   [`crate::node::check_node`]; at most [`MAX_CONCURRENT_QUERIES`] queries at once
//!   (the others wait); the answer bounded by [`MAX_ANSWER_BYTES`]. The request itself
//!   is bounded by the listener's message size, and `StreamClientStatus` answers its
//!   requests one at a time.
//! - **Queries** ([`fetch`]): `node_matchers` OR-ed (empty = every stream), see
//!   [`NodeFilter`]; one `ClientConfig` per open stream that sent its node, sorted by
//!   node id, pod name, stream id. The resource itself (`xds_config`) only for a
//!   targeted query (every matcher an exact node id) without `exclude_resource_contents`,
//!   never for a Secret, and with every field Envoy marks sensitive redacted as Envoy's
//!   `/config_dump` shows it (`[redacted]`: an inline TLS key of a listener or cluster). The encoded answer is bounded ([`MAX_ANSWER_BYTES`]),
//!   counted as it is built.
//!
//! Access: any client the ADS port accepts (same mTLS rules) may read the status of
//! every Envoy connected to this replica, never a Secret's contents; a replica answers
//! only for its own streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::path_segment::Segment;
use envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern as ValuePattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher};
use envoy_types::pb::google::protobuf::{Struct, Timestamp, Value, value::Kind};

use crate::events::Api;
use crate::snapshot::{Snapshot, SnapshotCache};
use crate::stats::StreamId;
use marin3r_envoyconfig::resource::{Resource, ResourceType, version_string};
use marin3r_wire::POD_NAME_METADATA_KEY;

use marin3r_wire::POD_NAMESPACE_METADATA_KEY;
/// Node metadata key, in a `ClientConfig`'s node, of the stream's API: `sotw` or
/// `delta` (envoy-types 0.7's `ClientConfig` has no `client_type` field).
pub const API_METADATA_KEY: &str = "marin3r_api";
/// Largest encoded answer: 4 MiB, gRPC's default receive limit of a client.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Most string matchers in one query (each `node_id` and each `node_metadatas` entry of
/// every `node_matchers` item counts): a query's matching work is matchers × streams,
/// so both factors are bounded (`marin3r status` sends one; a fleet tool a few).
pub const MAX_STRING_MATCHERS: usize = 64;
/// Most bytes of all the patterns of one query together (a pattern longer than a
/// node's fields, [`marin3r_wire::MAX_NODE_NAME_BYTES`], matches nothing but `contains`
/// still scans for it).
pub const MAX_PATTERN_BYTES: usize = 16 * 1024;
/// Queries answered at once by one replica; more wait their turn. A query runs on a
/// blocking thread and may read every stream's state machine: this bounds the CPU all
/// client status clients together take from serving Envoys.
pub const MAX_CONCURRENT_QUERIES: usize = 2;

/// A query refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsdsError {
    /// `field` of a node matcher uses what the server does not support.
    #[error("{field}: {rule}")]
    InvalidMatcher { field: String, rule: &'static str },
    /// The query's matchers are over a bound ([`MAX_STRING_MATCHERS`],
    /// [`MAX_PATTERN_BYTES`]).
    #[error(
        "node_matchers: {count} {what}, over the limit of {limit}: ask for fewer nodes per query (e.g. a node id prefix)"
    )]
    TooManyMatchers {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// The answer would be larger than [`MAX_ANSWER_BYTES`].
    #[error(
        "the status of the {matched} Envoys matched is over {size} bytes, over the limit of {limit} bytes: narrow node_matchers (e.g. a node id prefix)"
    )]
    TooLarge {
        matched: usize,
        size: usize,
        limit: usize,
    },
}

// ---------------------------------------------------------------------------------
// Per-resource tracking in the state machines.

/// The version of a resource the client ACKed: what it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acked {
    version: Arc<str>,
    digest: u64,
    at: Instant,
}

/// A NACK that concerns a resource.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Nacked {
    /// The rejected version.
    version: Arc<str>,
    /// Envoy's message, as stored ([`crate::tracking::stored_nack_message`]).
    message: Arc<str>,
    at: Instant,
}

/// What the last response not answered yet does to a resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Nothing in flight.
    #[default]
    Idle,
    /// Sent again with the digest the client runs.
    Unchanged,
    /// Sent with this digest.
    Update(u64),
    /// Sent as removed (SotW: left out of the type's full state).
    Removal,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResourceState {
    acked: Option<Acked>,
    pending: Pending,
    nacked: Option<Arc<Nacked>>,
}

impl ResourceState {
    /// Nothing ACKed, NACKed or in flight.
    fn is_empty(&self) -> bool {
        self.acked.is_none() && self.nacked.is_none() && self.pending == Pending::Idle
    }

    fn pending_for(&self, digest: u64) -> Pending {
        match &self.acked {
            Some(a) if a.digest == digest => Pending::Unchanged,
            _ => Pending::Update(digest),
        }
    }
}

/// The per-resource status of one type on one stream, sorted by name. A sorted `Vec`
/// grown to fit, not a `BTreeMap`: its first node holds 11 entries (≈ 1 KiB here) for
/// the one or two resources of a type most streams have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResourceLog(Vec<(String, ResourceState)>);

impl ResourceLog {
    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&ResourceState> {
        self.position(name).ok().map(|i| &self.0[i].1)
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut ResourceState> {
        self.position(name).ok().map(|i| &mut self.0[i].1)
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    /// The client dropped `name` (unsubscribed).
    pub(crate) fn remove(&mut self, name: &str) {
        if let Ok(i) = self.position(name) {
            self.0.remove(i);
        }
    }

    /// Keeps the names `keep` selects (the client dropped the others).
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.0.retain(|(name, _)| keep(name));
    }

    /// Keeps the states `f` returns `true` for, after it changed them.
    fn retain_mut(&mut self, mut f: impl FnMut(&mut ResourceState) -> bool) {
        self.0.retain_mut(|(_, state)| f(state));
    }

    /// Applies `f` to the state of each name of `items` (a default one if absent), in
    /// one pass: new names are added with one sort, states `f` leaves empty dropped.
    fn update<'a, T>(
        &mut self,
        items: impl IntoIterator<Item = (&'a str, T)>,
        mut f: impl FnMut(&mut ResourceState, T),
    ) {
        let mut added = Vec::new();
        let mut emptied = false;
        for (name, item) in items {
            if let Some(state) = self.get_mut(name) {
                f(state, item);
                emptied |= state.is_empty();
            } else {
                let mut state = ResourceState::default();
                f(&mut state, item);
                if !state.is_empty() {
                    added.push((name.to_string(), state));
                }
            }
        }
        if emptied {
            self.0.retain(|(_, state)| !state.is_empty());
        }
        if !added.is_empty() {
            self.0.reserve_exact(added.len());
            self.0.append(&mut added);
            self.0.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }

    /// A SotW response with the type's full state `resources` was sent: what it changes
    /// per resource replaces what an earlier unanswered response changed.
    pub(crate) fn sent_sotw(&mut self, resources: &[&Resource]) {
        for (_, state) in &mut self.0 {
            state.pending = if state.acked.is_some() {
                Pending::Removal
            } else {
                Pending::Idle
            };
        }
        self.update(
            resources.iter().map(|r| (r.name.as_str(), r.digest)),
            |state, digest| state.pending = state.pending_for(digest),
        );
    }

    /// The client answered the last SotW response, of `version`: an ACK (`nack` is
    /// `None`) makes what it sent what the client runs; a NACK marks the resources it
    /// changed.
    pub(crate) fn answered_sotw(&mut self, version: &str, nack: Option<&str>, now: Instant) {
        match nack {
            None => {
                let version: Arc<str> = Arc::from(version);
                self.retain_mut(|state| {
                    let keep = match state.pending {
                        Pending::Update(digest) => {
                            state.acked = Some(Acked {
                                version: version.clone(),
                                digest,
                                at: now,
                            });
                            true
                        }
                        Pending::Unchanged => true,
                        Pending::Removal | Pending::Idle => false,
                    };
                    state.nacked = None;
                    state.pending = Pending::Idle;
                    keep
                });
            }
            Some(message) => {
                let nacked = Arc::new(Nacked {
                    version: Arc::from(version),
                    message: Arc::from(message),
                    at: now,
                });
                self.retain_mut(|state| {
                    if let Pending::Update(_) = state.pending {
                        state.nacked = Some(nacked.clone());
                    }
                    state.pending = Pending::Idle;
                    state.acked.is_some() || state.nacked.is_some()
                });
            }
        }
    }

    /// A Delta response sent `resources` and removed `removed`.
    pub(crate) fn sent_delta<'a>(
        &mut self,
        resources: &[&Resource],
        removed: impl IntoIterator<Item = &'a String>,
    ) {
        self.update(
            resources.iter().map(|r| (r.name.as_str(), r.digest)),
            |state, digest| state.pending = state.pending_for(digest),
        );
        for name in removed {
            if let Some(state) = self.get_mut(name) {
                state.pending = Pending::Removal;
            }
        }
    }

    /// The client answered a Delta response that sent `resources` (name → digest) and
    /// removed `removed`; `later(name)`: a newer unanswered response carries the name
    /// again (its pending change stays).
    pub(crate) fn answered_delta<'a>(
        &mut self,
        resources: impl IntoIterator<Item = (&'a String, &'a u64)>,
        removed: impl IntoIterator<Item = &'a String>,
        later: impl Fn(&str) -> bool,
        nack: Option<&str>,
        now: Instant,
    ) {
        let nack = nack.map(Arc::<str>::from);
        let items = resources
            .into_iter()
            .map(|(name, digest)| (name.as_str(), (later(name), *digest)));
        self.update(items, |state, (still_pending, digest)| {
            if !still_pending {
                state.pending = Pending::Idle;
            }
            let changed = state.acked.as_ref().is_none_or(|a| a.digest != digest);
            match &nack {
                None => {
                    if changed {
                        state.acked = Some(Acked {
                            version: Arc::from(version_string(digest)),
                            digest,
                            at: now,
                        });
                    }
                    state.nacked = None;
                }
                Some(message) if changed => {
                    state.nacked = Some(Arc::new(Nacked {
                        version: Arc::from(version_string(digest)),
                        message: message.clone(),
                        at: now,
                    }));
                }
                Some(_) => {}
            }
        });
        for name in removed {
            if later(name) {
                if nack.is_none()
                    && let Some(state) = self.get_mut(name)
                {
                    state.acked = None;
                    state.nacked = None;
                }
                continue;
            }
            match nack {
                None => self.remove(name),
                Some(_) => {
                    if let Some(state) = self.get_mut(name) {
                        state.pending = Pending::Idle;
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The view of one stream.

/// Wall time of the query with the `Instant` taken at the same moment: the state
/// machines keep `Instant`s, the answer carries wall-clock timestamps.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub system: SystemTime,
    pub instant: Instant,
}

impl Clock {
    pub fn now() -> Self {
        Self {
            system: SystemTime::now(),
            instant: Instant::now(),
        }
    }

    /// The wall time of `at`.
    pub fn timestamp(&self, at: Instant) -> Option<Timestamp> {
        let ago = self.instant.saturating_duration_since(at);
        let wall = self.system.checked_sub(ago)?;
        let since = wall.duration_since(SystemTime::UNIX_EPOCH).ok()?;
        Some(Timestamp {
            seconds: i64::try_from(since.as_secs()).ok()?,
            nanos: i32::try_from(since.subsec_nanos()).ok()?,
        })
    }
}

/// What a view needs besides the state machine: the query's clock, and the node's
/// current snapshot when the resources themselves are asked for.
#[derive(Debug, Clone, Copy)]
pub struct ViewInput<'a> {
    pub clock: Clock,
    pub contents: Option<&'a Snapshot>,
}

/// The message of a NACK event, as stored.
pub(crate) fn nack_message(event: &crate::events::StreamEvent) -> Option<&str> {
    match event {
        crate::events::StreamEvent::Nack { message, .. } => Some(message),
        _ => None,
    }
}

/// The status a resource has, as the pure rule of this module.
pub(crate) fn resource_config(
    t: ResourceType,
    name: &str,
    state: &ResourceState,
    input: &ViewInput<'_>,
) -> GenericXdsConfig {
    let client_status = if state.nacked.is_some() {
        ClientResourceStatus::Nacked
    } else if state.acked.is_some() {
        ClientResourceStatus::Acked
    } else {
        ClientResourceStatus::Requested
    };
    let config_status = match (state.pending, &state.nacked, &state.acked) {
        (Pending::Update(_) | Pending::Removal, _, _) => ConfigStatus::Stale,
        (_, Some(_), _) => ConfigStatus::Error,
        (_, None, Some(_)) => ConfigStatus::Synced,
        (_, None, None) => ConfigStatus::NotSent,
    };
    let xds_config = state.acked.as_ref().and_then(|a| {
        input
            .contents
            .filter(|_| t != ResourceType::Secret)
            .and_then(|s| s.resource(t, name))
            .filter(|r| r.digest == a.digest)
            .and_then(shown_content)
    });
    GenericXdsConfig {
        type_url: t.type_url().to_string(),
        name: name.to_string(),
        version_info: state
            .acked
            .as_ref()
            .map(|a| a.version.to_string())
            .unwrap_or_default(),
        xds_config,
        last_updated: state
            .acked
            .as_ref()
            .and_then(|a| input.clock.timestamp(a.at)),
        config_status: config_status as i32,
        client_status: client_status as i32,
        error_state: state.nacked.as_ref().map(|n| UpdateFailureState {
            failed_configuration: None,
            last_update_attempt: input.clock.timestamp(n.at),
            details: n.message.to_string(),
            version_info: n.version.to_string(),
        }),
        is_static_resource: false,
    }
}

/// A resource's content as an answer shows it: with what Envoy marks sensitive
/// redacted as its `/config_dump` does (`[redacted]`,
/// [`marin3r_envoyconfig::redact`]); no content when it cannot be read.
fn shown_content(r: &Resource) -> Option<envoy_types::pb::google::protobuf::Any> {
    let value =
        marin3r_envoyconfig::redact::redact_encoded(&r.body.type_url, &r.body.value).ok()?;
    Some(envoy_types::pb::google::protobuf::Any {
        type_url: r.body.type_url.clone(),
        value: value.into_owned(),
    })
}

/// A name the client subscribed to that it holds no status for: not answered yet
/// (`REQUESTED`, `NOT_SENT`), or answered as absent (`DOES_NOT_EXIST`; `SYNCED` once
/// that answer was answered, `STALE` before).
pub(crate) fn absent_config(
    t: ResourceType,
    name: &str,
    told_absent: Option<bool>,
) -> GenericXdsConfig {
    let (client_status, config_status) = match told_absent {
        None => (ClientResourceStatus::Requested, ConfigStatus::NotSent),
        Some(true) => (ClientResourceStatus::DoesNotExist, ConfigStatus::Synced),
        Some(false) => (ClientResourceStatus::DoesNotExist, ConfigStatus::Stale),
    };
    GenericXdsConfig {
        type_url: t.type_url().to_string(),
        name: name.to_string(),
        config_status: config_status as i32,
        client_status: client_status as i32,
        ..Default::default()
    }
}

/// A stream state machine as the client status service reads it.
pub trait ClientView: Send {
    /// One entry per resource the stream's client holds, was sent or subscribed to,
    /// in push order of the types, then by name.
    fn generic_xds_configs(&self, input: &ViewInput<'_>) -> Vec<GenericXdsConfig>;
}

// ---------------------------------------------------------------------------------
// The registry of open streams.

/// The node of a stream as a `ClientConfig` shows it (what the client sent, bounded by
/// [`crate::node::check_node`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientNode {
    pub id: String,
    pub cluster: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub user_agent_name: String,
    pub api: Option<Api>,
}

impl ClientNode {
    pub fn from_node(node: &Node, api: Api) -> Self {
        let meta = |key: &str| {
            crate::node::metadata_string(node, key)
                .unwrap_or_default()
                .to_string()
        };
        Self {
            id: node.id.clone(),
            cluster: node.cluster.clone(),
            pod_name: meta(POD_NAME_METADATA_KEY),
            pod_namespace: meta(POD_NAMESPACE_METADATA_KEY),
            user_agent_name: node.user_agent_name.clone(),
            api: Some(api),
        }
    }

    /// The `Node` of a `ClientConfig`: id, cluster, user agent, and as metadata the pod
    /// name and namespace (when the Envoy sent them) and [`API_METADATA_KEY`].
    pub fn to_node(&self) -> Node {
        let string = |s: &str| Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        let mut fields = std::collections::HashMap::new();
        if !self.pod_name.is_empty() {
            fields.insert(POD_NAME_METADATA_KEY.to_string(), string(&self.pod_name));
        }
        if !self.pod_namespace.is_empty() {
            fields.insert(
                POD_NAMESPACE_METADATA_KEY.to_string(),
                string(&self.pod_namespace),
            );
        }
        if let Some(api) = self.api {
            fields.insert(API_METADATA_KEY.to_string(), string(api.as_str()));
        }
        Node {
            id: self.id.clone(),
            cluster: self.cluster.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: self.user_agent_name.clone(),
            ..Default::default()
        }
    }
}

/// The state machine of a stream, shared by its task and the registry.
pub type SharedView = Arc<Mutex<dyn ClientView>>;

/// Locks a state machine; a poisoned lock (a panic in a call) still holds a usable
/// state for reading.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Entry {
    node: Arc<ClientNode>,
    view: SharedView,
}

/// A registered stream as a query sees it: handles only, cloned under the registry
/// lock (two reference counts), read without it.
type Handle = (StreamId, Arc<ClientNode>, SharedView);

/// The open ADS streams that sent their node, for the client status service.
#[derive(Clone, Default)]
pub struct ClientStatusRegistry(Arc<Mutex<HashMap<StreamId, Entry>>>);

impl std::fmt::Debug for ClientStatusRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientStatusRegistry")
            .field("streams", &self.len())
            .finish()
    }
}

/// A registered stream; dropping it removes the stream from the registry.
#[must_use = "the stream leaves the registry when this is dropped"]
pub struct Registration {
    registry: ClientStatusRegistry,
    id: StreamId,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.registry.0).remove(&self.id);
    }
}

impl ClientStatusRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers stream `id` of `node` until the returned guard is dropped.
    pub fn register(&self, id: StreamId, node: ClientNode, view: SharedView) -> Registration {
        let node = Arc::new(node);
        lock(&self.0).insert(id, Entry { node, view });
        Registration {
            registry: self.clone(),
            id,
        }
    }

    /// Streams registered.
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The streams `keep` selects, sorted by node id, pod name, stream id. The lock is
    /// held only to copy the handles of every stream; `keep` runs without it, so a
    /// query's matching never delays a stream registering or leaving.
    fn matching(&self, mut keep: impl FnMut(&ClientNode) -> bool) -> Vec<Handle> {
        let all: Vec<Handle> = lock(&self.0)
            .iter()
            .map(|(id, e)| (*id, e.node.clone(), e.view.clone()))
            .collect();
        let mut found: Vec<Handle> = all.into_iter().filter(|(_, n, _)| keep(n)).collect();
        found.sort_by(|a, b| {
            (a.1.id.as_str(), a.1.pod_name.as_str(), a.0).cmp(&(
                b.1.id.as_str(),
                b.1.pod_name.as_str(),
                b.0,
            ))
        });
        found
    }
}

// ---------------------------------------------------------------------------------
// Node matchers.

#[derive(Debug, Clone, PartialEq, Eq)]
enum StrKind {
    Exact,
    Prefix,
    Suffix,
    Contains,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct StrMatch {
    kind: StrKind,
    /// Lowercased (ASCII) when `ignore_case`.
    pattern: String,
    ignore_case: bool,
}

impl StrMatch {
    fn compile(m: &StringMatcher, field: &str) -> Result<Self, CsdsError> {
        let invalid = |rule| CsdsError::InvalidMatcher {
            field: field.to_string(),
            rule,
        };
        let (kind, pattern) = match &m.match_pattern {
            Some(MatchPattern::Exact(p)) => (StrKind::Exact, p),
            Some(MatchPattern::Prefix(p)) => (StrKind::Prefix, p),
            Some(MatchPattern::Suffix(p)) => (StrKind::Suffix, p),
            Some(MatchPattern::Contains(p)) => (StrKind::Contains, p),
            Some(MatchPattern::SafeRegex(_)) => {
                return Err(CsdsError::InvalidMatcher {
                    field: format!("{field}.safe_regex"),
                    rule: "not supported: use exact, prefix, suffix or contains",
                });
            }
            Some(MatchPattern::Custom(_)) => {
                return Err(CsdsError::InvalidMatcher {
                    field: format!("{field}.custom"),
                    rule: "not supported: use exact, prefix, suffix or contains",
                });
            }
            None => {
                return Err(invalid(
                    "no match pattern: set exact, prefix, suffix or contains",
                ));
            }
        };
        Ok(Self {
            kind,
            pattern: if m.ignore_case {
                pattern.to_ascii_lowercase()
            } else {
                pattern.clone()
            },
            ignore_case: m.ignore_case,
        })
    }

    /// `value` as is, `lowered` its ASCII lowercase (for `ignore_case`).
    fn matches(&self, value: &str, lowered: &str) -> bool {
        let value = if self.ignore_case { lowered } else { value };
        let p = self.pattern.as_str();
        match self.kind {
            StrKind::Exact => value == p,
            StrKind::Prefix => value.starts_with(p),
            StrKind::Suffix => value.ends_with(p),
            StrKind::Contains => value.contains(p),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetaKey {
    PodName,
    PodNamespace,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct CompiledMatcher {
    node_id: Option<StrMatch>,
    metadata: Vec<(MetaKey, StrMatch)>,
}

/// A node's matched fields, each with its ASCII lowercase (made once per node, only
/// when a matcher ignores case).
struct Fields<'a> {
    id: (&'a str, std::borrow::Cow<'a, str>),
    pod_name: (&'a str, std::borrow::Cow<'a, str>),
    pod_namespace: (&'a str, std::borrow::Cow<'a, str>),
}

impl<'a> Fields<'a> {
    fn of(node: &'a ClientNode, lower: bool) -> Self {
        let pair = |s: &'a str| {
            let lowered = if lower {
                std::borrow::Cow::Owned(s.to_ascii_lowercase())
            } else {
                std::borrow::Cow::Borrowed(s)
            };
            (s, lowered)
        };
        Self {
            id: pair(&node.id),
            pod_name: pair(&node.pod_name),
            pod_namespace: pair(&node.pod_namespace),
        }
    }
}

impl CompiledMatcher {
    fn matches(&self, node: &Fields<'_>) -> bool {
        let test = |m: &StrMatch, (value, lowered): &(&str, std::borrow::Cow<'_, str>)| {
            m.matches(value, lowered)
        };
        self.node_id.as_ref().is_none_or(|m| test(m, &node.id))
            && self.metadata.iter().all(|(key, m)| match key {
                MetaKey::PodName => test(m, &node.pod_name),
                MetaKey::PodNamespace => test(m, &node.pod_namespace),
            })
    }

    fn is_exact_node_id(&self) -> bool {
        self.node_id
            .as_ref()
            .is_some_and(|m| m.kind == StrKind::Exact)
    }
}

/// A query's `node_matchers`, checked: OR of the matchers (none: every stream); within
/// one, `node_id` and every `node_metadatas` entry must match. `node_id` takes an
/// exact, prefix, suffix or contains `StringMatcher` (`ignore_case` honoured, ASCII);
/// `node_metadatas` takes a single-key path, `pod_name` or `pod_namespace`, and a
/// string value matcher. Anything else (`safe_regex`, other paths or value matchers)
/// is refused naming the field; so is a query over [`MAX_STRING_MATCHERS`] or
/// [`MAX_PATTERN_BYTES`] (checked before anything is compiled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFilter {
    matchers: Vec<CompiledMatcher>,
    /// Some matcher ignores case.
    lower: bool,
}

/// The bounds of [`NodeFilter::compile`], on the request as received.
fn check_bounds(matchers: &[NodeMatcher]) -> Result<(), CsdsError> {
    let over = |what, count, limit| {
        (count > limit).then_some(CsdsError::TooManyMatchers { what, count, limit })
    };
    // Counted first: the walk below is then bounded.
    let count = matchers.iter().fold(0usize, |n, m| {
        n.saturating_add(usize::from(m.node_id.is_some()))
            .saturating_add(m.node_metadatas.len())
    });
    if let Some(e) = over("string matchers", count, MAX_STRING_MATCHERS) {
        return Err(e);
    }
    let pattern_len = |m: &StringMatcher| match &m.match_pattern {
        Some(
            MatchPattern::Exact(p)
            | MatchPattern::Prefix(p)
            | MatchPattern::Suffix(p)
            | MatchPattern::Contains(p),
        ) => p.len(),
        _ => 0,
    };
    let bytes = matchers.iter().fold(0usize, |n, m| {
        let id = m.node_id.as_ref().map_or(0, pattern_len);
        let meta = m.node_metadatas.iter().fold(0usize, |k, sm| {
            let v = match sm.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
                Some(ValuePattern::StringMatch(s)) => pattern_len(s),
                _ => 0,
            };
            let path = sm
                .path
                .iter()
                .map(|seg| match &seg.segment {
                    Some(Segment::Key(k)) => k.len(),
                    None => 0,
                })
                .fold(0usize, usize::saturating_add);
            k.saturating_add(v).saturating_add(path)
        });
        n.saturating_add(id).saturating_add(meta)
    });
    match over("bytes of patterns", bytes, MAX_PATTERN_BYTES) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl NodeFilter {
    pub fn compile(matchers: &[NodeMatcher]) -> Result<Self, CsdsError> {
        check_bounds(matchers)?;
        let mut out = Vec::with_capacity(matchers.len());
        for (i, m) in matchers.iter().enumerate() {
            let base = format!("node_matchers[{i}]");
            let node_id = m
                .node_id
                .as_ref()
                .map(|s| StrMatch::compile(s, &format!("{base}.node_id")))
                .transpose()?;
            let mut metadata = Vec::with_capacity(m.node_metadatas.len());
            for (j, sm) in m.node_metadatas.iter().enumerate() {
                let field = format!("{base}.node_metadatas[{j}]");
                let invalid_path = || CsdsError::InvalidMatcher {
                    field: format!("{field}.path"),
                    rule: "must be a single key, pod_name or pod_namespace",
                };
                let key = match sm.path.as_slice() {
                    [seg] => match &seg.segment {
                        Some(Segment::Key(k)) if k == POD_NAME_METADATA_KEY => MetaKey::PodName,
                        Some(Segment::Key(k)) if k == POD_NAMESPACE_METADATA_KEY => {
                            MetaKey::PodNamespace
                        }
                        _ => return Err(invalid_path()),
                    },
                    _ => return Err(invalid_path()),
                };
                let value = match sm.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
                    Some(ValuePattern::StringMatch(s)) => {
                        StrMatch::compile(s, &format!("{field}.value.string_match"))?
                    }
                    _ => {
                        return Err(CsdsError::InvalidMatcher {
                            field: format!("{field}.value"),
                            rule: "must be a string_match",
                        });
                    }
                };
                metadata.push((key, value));
            }
            out.push(CompiledMatcher { node_id, metadata });
        }
        let lower = out.iter().any(|m| {
            m.node_id.as_ref().is_some_and(|s| s.ignore_case)
                || m.metadata.iter().any(|(_, s)| s.ignore_case)
        });
        Ok(Self {
            matchers: out,
            lower,
        })
    }

    pub fn matches(&self, node: &ClientNode) -> bool {
        if self.matchers.is_empty() {
            return true;
        }
        let fields = Fields::of(node, self.lower);
        self.matchers.iter().any(|m| m.matches(&fields))
    }

    /// A targeted query: at least one matcher, each an exact node id.
    pub fn is_targeted(&self) -> bool {
        !self.matchers.is_empty() && self.matchers.iter().all(CompiledMatcher::is_exact_node_id)
    }
}

// ---------------------------------------------------------------------------------
// The query.

/// The answer to `req` at `clock`, within `limit` encoded bytes ([`MAX_ANSWER_BYTES`] in
/// the service): the matchers are bounded ([`MAX_STRING_MATCHERS`],
/// [`MAX_PATTERN_BYTES`]); the registry is locked only to copy the stream handles
/// (matching runs without it), each
/// stream's state machine only while its view is built; the answer's encoded size is
/// counted as it grows and the query stops once it is over the limit.
pub fn fetch(
    registry: &ClientStatusRegistry,
    cache: &SnapshotCache,
    req: &ClientStatusRequest,
    clock: Clock,
    limit: usize,
) -> Result<ClientStatusResponse, CsdsError> {
    let filter = NodeFilter::compile(&req.node_matchers)?;
    let with_contents = !req.exclude_resource_contents && filter.is_targeted();
    let streams = registry.matching(|node| filter.matches(node));
    let matched = streams.len();
    let mut config = Vec::with_capacity(matched);
    let mut size = 0usize;
    for (_, node, view) in streams {
        let snapshot = with_contents.then(|| cache.get(&node.id)).flatten();
        let input = ViewInput {
            clock,
            contents: snapshot.as_deref(),
        };
        let generic_xds_configs = lock(&view).generic_xds_configs(&input);
        let cc = ClientConfig {
            node: Some(node.to_node()),
            generic_xds_configs,
            ..Default::default()
        };
        size = size.saturating_add(prost::encoding::message::encoded_len(1, &cc));
        if size > limit {
            return Err(CsdsError::TooLarge {
                matched,
                size,
                limit,
            });
        }
        config.push(cc);
    }
    Ok(ClientStatusResponse { config })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::DeltaStream;
    use crate::node::NodeInfo;
    use crate::snapshot::tests::snap;
    use crate::sotw::{AdsConfig, SotwStream};
    use ResourceType::*;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::PathSegment;
    use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StructMatcher, ValueMatcher};
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use prost::Message as _;
    use std::time::Duration;

    fn envoy_node(id: &str, pod: &str) -> Node {
        NodeInfo {
            id: id.into(),
            pod_name: pod.into(),
        }
        .to_node()
    }

    fn clock(at: Instant) -> Clock {
        Clock {
            system: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
            instant: at,
        }
    }

    fn view<V: ClientView>(v: &V, now: Instant) -> Vec<GenericXdsConfig> {
        v.generic_xds_configs(&ViewInput {
            clock: clock(now),
            contents: None,
        })
    }

    fn one<'a>(gs: &'a [GenericXdsConfig], name: &str) -> &'a GenericXdsConfig {
        gs.iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no {name} in {gs:?}"))
    }

    fn statuses(g: &GenericXdsConfig) -> (ClientResourceStatus, ConfigStatus) {
        (
            ClientResourceStatus::try_from(g.client_status).unwrap(),
            ConfigStatus::try_from(g.config_status).unwrap(),
        )
    }

    fn sotw_req(t: ResourceType, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(envoy_node("n1", "pod-a")),
            type_url: t.type_url().into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn nack(mut req: DiscoveryRequest, msg: &str) -> DiscoveryRequest {
        req.error_detail = Some(RpcStatus {
            code: 3,
            message: msg.into(),
            details: vec![],
        });
        req
    }

    fn first_response(out: crate::SotwOutcome) -> DiscoveryResponse {
        out.responses.into_iter().next().unwrap()
    }

    #[test]
    fn sotw_ack_nack_and_rollback_per_resource() {
        let t0 = Instant::now();
        let s1 = snap(&[(Listener, "a", "1"), (Listener, "b", "1")]);
        let mut st = SotwStream::new(AdsConfig::default());
        let r1 = first_response(st.handle_request(sotw_req(Listener, &[], ""), &s1, t0));
        // Sent, not answered: REQUESTED and STALE, no version yet.
        let g = view(&st, t0);
        assert_eq!(
            statuses(one(&g, "a")),
            (ClientResourceStatus::Requested, ConfigStatus::Stale)
        );
        assert_eq!(one(&g, "a").version_info, "");
        let t1 = t0 + Duration::from_secs(1);
        st.handle_request(sotw_req(Listener, &[], &r1.nonce), &s1, t1);
        let g = view(&st, t1);
        for name in ["a", "b"] {
            assert_eq!(
                statuses(one(&g, name)),
                (ClientResourceStatus::Acked, ConfigStatus::Synced)
            );
            assert_eq!(one(&g, name).version_info, r1.version_info);
            assert_eq!(
                one(&g, name).last_updated,
                clock(t1).timestamp(t1),
                "when it was ACKed"
            );
        }
        // Only b changes: b is STALE until answered; then a keeps the older version
        // (as Envoy shows it), b has the new one.
        let s2 = snap(&[(Listener, "a", "1"), (Listener, "b", "2")]);
        let t2 = t1 + Duration::from_secs(1);
        let r2 = first_response(st.handle_snapshot(&s2, t2));
        let g = view(&st, t2);
        assert_eq!(
            statuses(one(&g, "a")),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
        assert_eq!(
            statuses(one(&g, "b")),
            (ClientResourceStatus::Acked, ConfigStatus::Stale)
        );
        st.handle_request(sotw_req(Listener, &[], &r2.nonce), &s2, t2);
        let g = view(&st, t2);
        assert_eq!(one(&g, "a").version_info, r1.version_info);
        assert_eq!(one(&g, "a").last_updated, clock(t2).timestamp(t1));
        assert_eq!(one(&g, "b").version_info, r2.version_info);

        // b changes again and is rejected: NACKED / ERROR with Envoy's message, the
        // rejected version and the time; the version stays the ACKed one; a is not
        // concerned.
        let s3 = snap(&[(Listener, "a", "1"), (Listener, "b", "3")]);
        let t3 = t2 + Duration::from_secs(1);
        let r3 = first_response(st.handle_snapshot(&s3, t3));
        st.handle_request(
            nack(sotw_req(Listener, &[], &r3.nonce), "b: unknown cluster 'x'"),
            &s3,
            t3,
        );
        let g = view(&st, t3);
        let b = one(&g, "b");
        assert_eq!(
            statuses(b),
            (ClientResourceStatus::Nacked, ConfigStatus::Error)
        );
        assert_eq!(b.version_info, r2.version_info);
        assert_eq!(
            b.error_state,
            Some(UpdateFailureState {
                failed_configuration: None,
                last_update_attempt: clock(t3).timestamp(t3),
                details: "b: unknown cluster 'x'".into(),
                version_info: r3.version_info.clone(),
            })
        );
        assert_eq!(
            statuses(one(&g, "a")),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );

        // Rolled back to s2: the re-sent b (the digest it runs) is ACKed: no error.
        let t4 = t3 + Duration::from_secs(1);
        let r4 = first_response(st.handle_snapshot(&s2, t4));
        st.handle_request(sotw_req(Listener, &[], &r4.nonce), &s2, t4);
        let g = view(&st, t4);
        let b = one(&g, "b");
        assert_eq!(
            statuses(b),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
        assert_eq!(b.error_state, None);
        assert_eq!(b.version_info, r2.version_info, "unchanged since r2");

        // a is removed from the snapshot: gone once the client ACKs.
        let s5 = snap(&[(Listener, "b", "2")]);
        let r5 = first_response(st.handle_snapshot(&s5, t4));
        assert_eq!(
            statuses(one(&view(&st, t4), "a")),
            (ClientResourceStatus::Acked, ConfigStatus::Stale)
        );
        st.handle_request(sotw_req(Listener, &[], &r5.nonce), &s5, t4);
        let g = view(&st, t4);
        assert_eq!(g.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn sotw_names_not_served_are_requested_then_do_not_exist() {
        let t0 = Instant::now();
        let held = Snapshot::placeholder();
        let mut st = SotwStream::new(AdsConfig::default());
        st.handle_request(sotw_req(Route, &["r1", "r9"], ""), &held, t0);
        let g = view(&st, t0);
        assert_eq!(
            statuses(one(&g, "r9")),
            (ClientResourceStatus::Requested, ConfigStatus::NotSent)
        );
        let s1 = snap(&[(Route, "r1", "1")]);
        let r = first_response(st.handle_snapshot(&s1, t0));
        st.handle_request(sotw_req(Route, &["r1", "r9"], &r.nonce), &s1, t0);
        let g = view(&st, t0);
        assert_eq!(
            statuses(one(&g, "r9")),
            (ClientResourceStatus::DoesNotExist, ConfigStatus::Synced)
        );
        assert_eq!(
            statuses(one(&g, "r1")),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
    }

    fn delta_req(t: ResourceType, sub: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: Some(envoy_node("n1", "pod-a")),
            type_url: t.type_url().into(),
            resource_names_subscribe: sub.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn delta_first(out: crate::DeltaOutcome) -> DeltaDiscoveryResponse {
        out.responses.into_iter().next().unwrap()
    }

    #[test]
    fn delta_versions_are_per_resource_and_removals_disappear() {
        let t0 = Instant::now();
        let s1 = snap(&[(Cluster, "c1", "1"), (Cluster, "c2", "1")]);
        let mut st = DeltaStream::new(AdsConfig::default());
        let r1 = delta_first(st.handle_request(delta_req(Cluster, &[], ""), &s1, t0));
        st.handle_request(delta_req(Cluster, &[], &r1.nonce), &s1, t0);
        let g = view(&st, t0);
        for name in ["c1", "c2"] {
            let sent = r1.resources.iter().find(|r| r.name == name).unwrap();
            assert_eq!(one(&g, name).version_info, sent.version);
            assert_eq!(
                statuses(one(&g, name)),
                (ClientResourceStatus::Acked, ConfigStatus::Synced)
            );
        }
        // c2 removed, c1 changed and rejected: c2 STALE until the answer; c1 NACKED
        // with its rejected resource version, keeps its ACKed one.
        let s2 = snap(&[(Cluster, "c1", "2")]);
        let r2 = delta_first(st.handle_snapshot(&s2, t0));
        assert_eq!(
            statuses(one(&view(&st, t0), "c2")),
            (ClientResourceStatus::Acked, ConfigStatus::Stale)
        );
        let mut rejected = delta_req(Cluster, &[], &r2.nonce);
        rejected.error_detail = Some(RpcStatus {
            code: 3,
            message: "bad c1".into(),
            details: vec![],
        });
        st.handle_request(rejected, &s2, t0);
        let g = view(&st, t0);
        let c1 = one(&g, "c1");
        assert_eq!(
            statuses(c1),
            (ClientResourceStatus::Nacked, ConfigStatus::Error)
        );
        assert_eq!(c1.version_info, r1.resources[0].version);
        assert_eq!(
            c1.error_state.as_ref().map(|e| e.version_info.as_str()),
            Some(r2.resources[0].version.as_str())
        );
        // The re-send after the backoff is ACKed: c1 at its new version, c2 gone.
        let r3 = delta_first(st.poll_timers(&s2, t0 + Duration::from_secs(1)));
        st.handle_request(delta_req(Cluster, &[], &r3.nonce), &s2, t0);
        let g = view(&st, t0);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(
            statuses(&g[0]),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
        assert_eq!(g[0].version_info, r2.resources[0].version);
        assert_eq!(g[0].error_state, None);
    }

    #[test]
    fn a_nack_message_is_redacted_and_bounded_as_the_stats_store_it() {
        let t0 = Instant::now();
        let s1 = snap(&[(Secret, "s", "1")]);
        let mut st = SotwStream::new(AdsConfig::default());
        let r1 = first_response(st.handle_request(sotw_req(Secret, &["s"], ""), &s1, t0));
        let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7".repeat(3);
        let message = format!(
            "private_key: \"-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----\" {}",
            "no such cluster; ".repeat(1_000)
        );
        st.handle_request(nack(sotw_req(Secret, &["s"], &r1.nonce), &message), &s1, t0);
        let g = view(&st, t0);
        let details = &one(&g, "s").error_state.as_ref().unwrap().details;
        assert_eq!(details, &crate::tracking::stored_nack_message(&message));
        assert!(!details.contains(&body[..40]));
        assert_eq!(details.len(), crate::acknack::MAX_NACK_MESSAGE_BYTES);
    }

    // -- matchers --------------------------------------------------------------------

    fn string(p: MatchPattern, ignore_case: bool) -> StringMatcher {
        StringMatcher {
            match_pattern: Some(p),
            ignore_case,
        }
    }

    fn by_id(p: MatchPattern, ignore_case: bool) -> NodeMatcher {
        NodeMatcher {
            node_id: Some(string(p, ignore_case)),
            node_metadatas: vec![],
        }
    }

    fn by_meta(key: &str, p: MatchPattern) -> NodeMatcher {
        NodeMatcher {
            node_id: None,
            node_metadatas: vec![StructMatcher {
                path: vec![PathSegment {
                    segment: Some(Segment::Key(key.into())),
                }],
                value: Some(ValueMatcher {
                    match_pattern: Some(ValuePattern::StringMatch(string(p, false))),
                }),
            }],
        }
    }

    fn client(id: &str, pod: &str, ns: &str) -> ClientNode {
        ClientNode {
            id: id.into(),
            pod_name: pod.into(),
            pod_namespace: ns.into(),
            ..Default::default()
        }
    }

    #[test]
    fn node_matchers_select_by_id_and_pod_and_refuse_what_is_not_supported() {
        use MatchPattern::*;
        let gw = client("gateway-eu", "gw-0", "prod");
        let other = client("Sidecar-1", "app-0", "dev");
        let f = |ms: Vec<NodeMatcher>| NodeFilter::compile(&ms).unwrap();
        assert!(f(vec![]).matches(&gw) && f(vec![]).matches(&other));
        assert!(!f(vec![]).is_targeted());
        for (m, gw_in, other_in) in [
            (by_id(Exact("gateway-eu".into()), false), true, false),
            (by_id(Exact("GATEWAY-EU".into()), false), false, false),
            (by_id(Exact("GATEWAY-EU".into()), true), true, false),
            (by_id(Prefix("gateway".into()), false), true, false),
            (by_id(Prefix("sidecar".into()), true), false, true),
            (by_id(Suffix("-eu".into()), false), true, false),
            (by_id(Contains("car".into()), false), false, true),
            (by_meta("pod_name", Prefix("gw-".into())), true, false),
            (by_meta("pod_namespace", Exact("dev".into())), false, true),
        ] {
            let filter = f(vec![m.clone()]);
            assert_eq!(
                (filter.matches(&gw), filter.matches(&other)),
                (gw_in, other_in),
                "{m:?}"
            );
        }
        // OR of matchers; AND within one.
        let either = f(vec![
            by_id(Exact("gateway-eu".into()), false),
            by_id(Exact("Sidecar-1".into()), false),
        ]);
        assert!(either.matches(&gw) && either.matches(&other));
        assert!(either.is_targeted());
        let mut both = by_id(Prefix("gateway".into()), false);
        both.node_metadatas = by_meta("pod_namespace", Exact("dev".into())).node_metadatas;
        assert!(!f(vec![both]).matches(&gw));
        assert!(!f(vec![by_id(Prefix("g".into()), false)]).is_targeted());

        let refused = |m: NodeMatcher| NodeFilter::compile(&[by_id(Exact("x".into()), false), m]);
        assert_eq!(
            refused(by_id(SafeRegex(RegexMatcher::default()), false))
                .unwrap_err()
                .to_string(),
            "node_matchers[1].node_id.safe_regex: not supported: use exact, prefix, suffix or contains"
        );
        assert_eq!(
            refused(by_meta("labels", Exact("x".into())))
                .unwrap_err()
                .to_string(),
            "node_matchers[1].node_metadatas[0].path: must be a single key, pod_name or pod_namespace"
        );
        let mut bool_value = by_meta("pod_name", Exact("x".into()));
        bool_value.node_metadatas[0].value = Some(ValueMatcher {
            match_pattern: Some(ValuePattern::BoolMatch(true)),
        });
        assert_eq!(
            refused(bool_value).unwrap_err().to_string(),
            "node_matchers[1].node_metadatas[0].value: must be a string_match"
        );
    }

    // -- the query -------------------------------------------------------------------

    /// A registry with an ACKed SotW stream per `(node, pod)` serving `snapshot`.
    fn registry_with(
        streams: &[(&str, &str)],
        snapshot: &Snapshot,
        cache: &SnapshotCache,
    ) -> (ClientStatusRegistry, Vec<Registration>) {
        let registry = ClientStatusRegistry::new();
        let mut guards = Vec::new();
        let t0 = Instant::now();
        for (i, (id, pod)) in streams.iter().enumerate() {
            cache.set(id, snapshot.clone());
            let mut st = SotwStream::new(AdsConfig::default());
            for t in [Cluster, Listener, Secret] {
                let mut req = sotw_req(t, if t == Secret { &["s"] } else { &[] }, "");
                req.node = Some(envoy_node(id, pod));
                if let Some(r) = st
                    .handle_request(req.clone(), snapshot, t0)
                    .responses
                    .first()
                {
                    req.response_nonce = r.nonce.clone();
                    st.handle_request(req, snapshot, t0);
                }
            }
            let view: SharedView = Arc::new(Mutex::new(st));
            let node = ClientNode::from_node(&envoy_node(id, pod), Api::Sotw);
            guards.push(registry.register(StreamId(i as u64), node, view));
        }
        (registry, guards)
    }

    /// A P-256 key made for these tests.
    const KEY_LINE: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQggn38lrYNOeHoEtpZ";

    fn decoded(kind: ResourceType, yaml: &str) -> Resource {
        marin3r_envoyconfig::decode_str(kind, yaml, marin3r_envoyconfig::Serialization::Yaml)
            .unwrap()
    }

    /// Cluster `c`, listener `l` whose TLS key is inline, Secret `s`.
    fn snapshot() -> Snapshot {
        let cluster = decoded(Cluster, "name: c\nconnect_timeout: 1s\n");
        let listener = decoded(
            Listener,
            &format!(
                r#"name: l
address: {{socket_address: {{address: 0.0.0.0, port_value: 8443}}}}
filter_chains:
- filters:
  - name: tcp
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
      stat_prefix: tcp
      cluster: c
  transport_socket:
    name: envoy.transport_sockets.tls
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
      common_tls_context:
        tls_certificates:
        - certificate_chain: {{filename: /etc/envoy/tls.crt}}
          private_key:
            inline_string: |
              -----BEGIN PRIVATE KEY-----
              {KEY_LINE}
              ORKmMC83m2eEU9DfhbkhlULqagShRANCAAQV7LtfEZpm4h6J5eSnfG4suXaOJeUM
              zAiGOwxEXf3x0jOlarx5NMg8ABmkpPRrUSZFzLcjJarpeSoU2gYDPgob
              -----END PRIVATE KEY-----
"#
            ),
        );
        let mut resources = vec![cluster, listener];
        resources.push(crate::snapshot::tests::res(Secret, "s", "KEY-MATERIAL"));
        Snapshot::new(resources).unwrap()
    }

    #[test]
    fn contents_only_for_targeted_queries_and_never_for_secrets() {
        let cache = SnapshotCache::new();
        let (registry, _guards) = registry_with(
            &[("b", "pod-1"), ("a", "pod-2"), ("a", "pod-1")],
            &snapshot(),
            &cache,
        );
        let q = |matchers: Vec<NodeMatcher>, exclude: bool| {
            fetch(
                &registry,
                &cache,
                &ClientStatusRequest {
                    node_matchers: matchers,
                    exclude_resource_contents: exclude,
                    ..Default::default()
                },
                Clock::now(),
                MAX_ANSWER_BYTES,
            )
            .unwrap()
        };
        let all = q(vec![], false);
        // Sorted by node id, then pod name.
        let order: Vec<(String, String)> = all
            .config
            .iter()
            .map(|cc| {
                let n = cc.node.as_ref().unwrap();
                let pod = match n.metadata.as_ref().unwrap().fields[POD_NAME_METADATA_KEY]
                    .kind
                    .as_ref()
                {
                    Some(Kind::StringValue(s)) => s.clone(),
                    _ => String::new(),
                };
                (n.id.clone(), pod)
            })
            .collect();
        assert_eq!(
            order,
            [
                ("a".to_string(), "pod-1".to_string()),
                ("a".into(), "pod-2".into()),
                ("b".into(), "pod-1".into())
            ]
        );
        // (name, the content as Envoy's config dump shows it)
        let contents = |r: &ClientStatusResponse| -> Vec<(String, String)> {
            r.config
                .iter()
                .flat_map(|cc| &cc.generic_xds_configs)
                .filter_map(|g| {
                    g.xds_config.as_ref().map(|a| {
                        let kind = ResourceType::from_type_url(&a.type_url).unwrap();
                        let shown = Resource {
                            kind,
                            name: g.name.clone(),
                            body: prost_types::Any {
                                type_url: a.type_url.clone(),
                                value: a.value.clone(),
                            },
                            digest: 0,
                        };
                        let json = marin3r_envoyconfig::decode::to_json(&shown).unwrap();
                        (g.name.clone(), json.to_string())
                    })
                })
                .collect()
        };
        assert!(contents(&all).is_empty(), "fleet-wide: no contents");
        let exact_a = by_id(MatchPattern::Exact("a".into()), false);
        let targeted = q(vec![exact_a.clone()], false);
        assert_eq!(targeted.config.len(), 2);
        let shown = contents(&targeted);
        assert_eq!(
            shown.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["c", "l", "c", "l"],
            "never the Secret"
        );
        assert_eq!(shown[0].1, r#"{"connectTimeout":"1s","name":"c"}"#);
        // The inline key of the listener shows as Envoy's config dump shows it.
        let listener = &shown[1].1;
        assert!(
            listener.contains(r#""privateKey":{"inlineString":"[redacted]"}"#),
            "{listener}"
        );
        assert!(listener.contains("/etc/envoy/tls.crt"), "{listener}");
        let encoded = String::from_utf8_lossy(&targeted.encode_to_vec()).into_owned();
        for needle in [KEY_LINE, "PRIVATE KEY"] {
            assert!(!encoded.contains(needle), "{needle} in the answer");
        }
        // The Secret is listed with its name and version only.
        let s = one(&targeted.config[0].generic_xds_configs, "s");
        assert_eq!(
            statuses(s),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
        assert!(s.xds_config.is_none() && !s.version_info.is_empty());
        assert!(!String::from_utf8_lossy(&targeted.encode_to_vec()).contains("KEY-MATERIAL"));
        assert!(contents(&q(vec![exact_a], true)).is_empty(), "excluded");
        assert!(
            contents(&q(
                vec![by_id(MatchPattern::Prefix("a".into()), false)],
                false
            ))
            .is_empty(),
            "a prefix is not targeted"
        );
        // The node and API of each stream.
        let n = all.config[0].node.as_ref().unwrap();
        assert!(matches!(
            n.metadata.as_ref().unwrap().fields[API_METADATA_KEY].kind.as_ref(),
            Some(Kind::StringValue(s)) if s == "sotw"
        ));
    }

    #[test]
    fn an_answer_over_the_limit_is_refused_before_it_is_all_built() {
        let cache = SnapshotCache::new();
        let streams: Vec<(String, String)> = (0..50)
            .map(|i| (format!("node-{i:02}"), "pod".to_string()))
            .collect();
        let refs: Vec<(&str, &str)> = streams
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let (registry, _guards) = registry_with(&refs, &snapshot(), &cache);
        let req = ClientStatusRequest::default();
        let full = fetch(&registry, &cache, &req, Clock::now(), MAX_ANSWER_BYTES).unwrap();
        let size = full.encoded_len();
        assert_eq!(
            fetch(&registry, &cache, &req, Clock::now(), size).map(|r| r.config.len()),
            Ok(50),
            "at the limit"
        );
        let err = fetch(&registry, &cache, &req, Clock::now(), size / 2).unwrap_err();
        let CsdsError::TooLarge {
            matched,
            size: counted,
            limit,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((*matched, *limit), (50, size / 2));
        // It stopped at the first stream over the limit.
        assert!(
            *counted > size / 2 && *counted < size / 2 + size / 50 + 1,
            "{counted}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "the status of the 50 Envoys matched is over {counted} bytes, over the limit of {} bytes: narrow node_matchers (e.g. a node id prefix)",
                size / 2
            )
        );
    }

    fn contains_id(p: &str) -> NodeMatcher {
        by_id(MatchPattern::Contains(p.into()), false)
    }

    #[test]
    fn a_query_over_the_matcher_bounds_is_refused_naming_the_limit() {
        let cache = SnapshotCache::new();
        let (registry, _guards) = registry_with(&[("a", "p1")], &snapshot(), &cache);
        let query = |node_matchers: Vec<NodeMatcher>| {
            fetch(
                &registry,
                &cache,
                &ClientStatusRequest {
                    node_matchers,
                    ..Default::default()
                },
                Clock::now(),
                MAX_ANSWER_BYTES,
            )
        };
        // At the bounds: answered.
        let mut at_count: Vec<NodeMatcher> = (0..MAX_STRING_MATCHERS - 1)
            .map(|i| contains_id(&format!("x{i}")))
            .collect();
        at_count.push(contains_id("a"));
        assert_eq!(query(at_count.clone()).map(|r| r.config.len()), Ok(1));
        let mut at_bytes = by_meta("pod_name", MatchPattern::Contains("p".repeat(100)));
        at_bytes.node_id = Some(string(
            MatchPattern::Prefix("a".repeat(MAX_PATTERN_BYTES - 100 - "pod_name".len())),
            false,
        ));
        assert_eq!(query(vec![at_bytes.clone()]).map(|r| r.config.len()), Ok(0));

        // One over: refused, naming the limit; node_metadatas count too.
        let mut over_count = at_count;
        over_count[0]
            .node_metadatas
            .push(by_meta("pod_name", MatchPattern::Exact("p1".into())).node_metadatas[0].clone());
        let err = query(over_count).unwrap_err();
        assert_eq!(
            err,
            CsdsError::TooManyMatchers {
                what: "string matchers",
                count: MAX_STRING_MATCHERS + 1,
                limit: MAX_STRING_MATCHERS
            }
        );
        assert_eq!(
            err.to_string(),
            format!(
                "node_matchers: {} string matchers, over the limit of {MAX_STRING_MATCHERS}: ask for fewer nodes per query (e.g. a node id prefix)",
                MAX_STRING_MATCHERS + 1
            )
        );
        let mut over_bytes = at_bytes;
        over_bytes.node_metadatas[0].value = Some(ValueMatcher {
            match_pattern: Some(ValuePattern::StringMatch(string(
                MatchPattern::Contains("p".repeat(101)),
                false,
            ))),
        });
        assert_eq!(
            query(vec![over_bytes]).unwrap_err(),
            CsdsError::TooManyMatchers {
                what: "bytes of patterns",
                count: MAX_PATTERN_BYTES + 1,
                limit: MAX_PATTERN_BYTES
            }
        );
        // The query of the report: 200,000 `contains` matchers (2.4 MB).
        let flood: Vec<NodeMatcher> = (0..200_000)
            .map(|i| contains_id(&format!("zz{i:06}")))
            .collect();
        assert!(matches!(
            query(flood),
            Err(CsdsError::TooManyMatchers { count: 200_000, .. })
        ));
    }

    #[test]
    fn matchers_run_without_the_registry_lock_a_stream_registers_meanwhile() {
        let cache = SnapshotCache::new();
        let (registry, _guards) = registry_with(&[("a", "p1"), ("b", "p2")], &snapshot(), &cache);
        let mut registered = Vec::new();
        let found = registry.matching(|node| {
            // While the query matches, the registry is free: a new Envoy's stream
            // registers at once instead of waiting for the query.
            assert!(
                registry.0.try_lock().is_ok(),
                "the registry is locked while matching {}",
                node.id
            );
            if registered.is_empty() {
                let view: SharedView = Arc::new(Mutex::new(SotwStream::new(AdsConfig::default())));
                registered.push(registry.register(
                    StreamId(99),
                    ClientNode::from_node(&envoy_node("new", "p3"), Api::Sotw),
                    view,
                ));
            }
            true
        });
        assert_eq!(found.len(), 2, "the streams of when the query started");
        assert_eq!(registry.len(), 3, "the new stream registered");
        // And a query through `fetch` sees it next time.
        let all = fetch(
            &registry,
            &cache,
            &ClientStatusRequest::default(),
            Clock::now(),
            MAX_ANSWER_BYTES,
        )
        .unwrap();
        assert_eq!(all.config.len(), 3);
    }

    #[test]
    fn a_stream_leaves_the_registry_when_its_registration_drops() {
        let cache = SnapshotCache::new();
        let (registry, mut guards) =
            registry_with(&[("a", "p1"), ("b", "p2")], &snapshot(), &cache);
        assert_eq!(registry.len(), 2);
        drop(guards.remove(0));
        assert_eq!(registry.len(), 1);
        let left = fetch(
            &registry,
            &cache,
            &ClientStatusRequest::default(),
            Clock::now(),
            MAX_ANSWER_BYTES,
        )
        .unwrap();
        assert_eq!(left.config[0].node.as_ref().unwrap().id, "b");
        drop(guards);
        assert!(registry.is_empty());
    }

    #[test]
    fn timestamps_are_wall_time_of_the_instants() {
        let now = Instant::now();
        let c = clock(now);
        assert_eq!(
            c.timestamp(now - Duration::from_millis(1500)),
            Some(Timestamp {
                seconds: 999_998,
                nanos: 500_000_000
            })
        );
        assert_eq!(
            c.timestamp(now + Duration::from_secs(5)),
            c.timestamp(now),
            "no future"
        );
    }
}

/// The encoded size of a fleet-wide answer, for BENCHMARKS.md:
/// `cargo test -p marin3r-xds --lib --release csds::size -- --ignored --nocapture`.
#[cfg(test)]
mod size {
    use super::*;
    use crate::sotw::{AdsConfig, SotwStream};
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use marin3r_envoyconfig::resource::fnv1a64;
    use prost::Message as _;

    /// `streams` SotW streams of node `swarm` (the benchmark's swarm: pod `swarm-N`, one
    /// cluster and one listener, both ACKed).
    fn fleet(streams: usize) -> (ClientStatusRegistry, Vec<Registration>, SnapshotCache) {
        let resource = |kind: ResourceType, name: &str| Resource {
            kind,
            name: name.to_string(),
            body: prost_types::Any {
                type_url: kind.type_url().to_string(),
                value: vec![0; 200],
            },
            digest: fnv1a64(name.as_bytes()),
        };
        let snapshot = Snapshot::new(vec![
            resource(ResourceType::Cluster, "backend"),
            resource(ResourceType::Listener, "http"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let cache = SnapshotCache::new();
        cache.set("swarm", snapshot.clone());
        let registry = ClientStatusRegistry::new();
        let now = Instant::now();
        let guards = (0..streams)
            .map(|i| {
                let node = crate::NodeInfo {
                    id: "swarm".into(),
                    pod_name: format!("swarm-{i}"),
                }
                .to_node();
                let mut st = SotwStream::new(AdsConfig::default());
                for t in [ResourceType::Cluster, ResourceType::Listener] {
                    let mut req = DiscoveryRequest {
                        node: Some(node.clone()),
                        type_url: t.type_url().into(),
                        ..Default::default()
                    };
                    let nonce = st.handle_request(req.clone(), &snapshot, now).responses[0]
                        .nonce
                        .clone();
                    req.response_nonce = nonce;
                    st.handle_request(req, &snapshot, now);
                }
                let view: SharedView = Arc::new(Mutex::new(st));
                registry.register(
                    StreamId(i as u64),
                    ClientNode::from_node(&node, Api::Sotw),
                    view,
                )
            })
            .collect();
        (registry, guards, cache)
    }

    /// CPU of one query with `matchers` `contains` node id matchers (none matches) over
    /// `streams` streams with 1 KiB node ids, as the report's attack sent it
    /// (`MATCHERS=200000 STREAMS=500`):
    /// `MATCHERS=… STREAMS=… cargo test -p marin3r-xds --lib csds::size::matcher_cpu -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints a figure for the report"]
    fn matcher_cpu() {
        use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher};
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let (matchers, streams) = (env("MATCHERS", 200_000), env("STREAMS", 500));
        let registry = ClientStatusRegistry::new();
        let cache = SnapshotCache::new();
        let _guards: Vec<Registration> = (0..streams)
            .map(|i| {
                let view: SharedView = Arc::new(Mutex::new(SotwStream::new(AdsConfig::default())));
                registry.register(
                    StreamId(i as u64),
                    ClientNode {
                        id: format!("{i:08}-{}", "n".repeat(1000)),
                        pod_name: format!("swarm-{i}"),
                        ..Default::default()
                    },
                    view,
                )
            })
            .collect();
        // The attack's 12-byte patterns; within the bounds, the longest allowed.
        let pattern_len = if matchers > MAX_STRING_MATCHERS {
            12
        } else {
            MAX_PATTERN_BYTES / matchers.max(1)
        };
        let req = ClientStatusRequest {
            node_matchers: (0..matchers)
                .map(|i| NodeMatcher {
                    node_id: Some(StringMatcher {
                        match_pattern: Some(MatchPattern::Contains(format!(
                            "{:z>width$}",
                            i,
                            width = pattern_len
                        ))),
                        ignore_case: false,
                    }),
                    node_metadatas: vec![],
                })
                .collect(),
            ..Default::default()
        };
        let size = req.encoded_len();
        let started = Instant::now();
        let answer = fetch(&registry, &cache, &req, Clock::now(), MAX_ANSWER_BYTES);
        println!(
            "{matchers} contains matchers ({size} bytes) over {streams} streams: {:?}, {}",
            started.elapsed(),
            match answer {
                Ok(a) => format!("{} matched", a.config.len()),
                Err(e) => format!("refused: {e}"),
            }
        );
    }

    #[test]
    #[ignore = "prints a figure for BENCHMARKS.md"]
    fn fleet_wide_answer_size() {
        for streams in [1_000, 10_000] {
            let (registry, _guards, cache) = fleet(streams);
            let started = Instant::now();
            let answer = fetch(
                &registry,
                &cache,
                &ClientStatusRequest::default(),
                Clock::now(),
                usize::MAX,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let built = started.elapsed();
            let size = answer.encoded_len();
            println!(
                "{streams} streams (one cluster, one listener each): fleet-wide answer {size} bytes ({:.0} bytes per stream), built in {built:?}; within the {MAX_ANSWER_BYTES}-byte limit: {}",
                size as f64 / streams as f64,
                size <= MAX_ANSWER_BYTES
            );
        }
    }
}
