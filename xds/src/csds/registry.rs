//! The registry of open streams that sent their node: registered while the stream
//! lives ([`Registration`]), read by a query without holding its lock while matching.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

use crate::events::Api;
use crate::stats::StreamId;
use marin3r_wire::{POD_NAME_METADATA_KEY, POD_NAMESPACE_METADATA_KEY};

use super::view::ClientView;

/// Node metadata key, in a `ClientConfig`'s node, of the stream's API: `sotw` or
/// `delta` (envoy-types 0.7's `ClientConfig` has no `client_type` field).
pub const API_METADATA_KEY: &str = "marin3r_api";

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

pub(super) struct Entry {
    node: Arc<ClientNode>,
    view: SharedView,
}

/// A registered stream as a query sees it: handles only, cloned under the registry
/// lock (two reference counts), read without it.
type Handle = (StreamId, Arc<ClientNode>, SharedView);

/// The open ADS streams that sent their node, for the client status service.
#[derive(Clone, Default)]
pub struct ClientStatusRegistry(pub(super) Arc<Mutex<HashMap<StreamId, Entry>>>);

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
    pub(super) fn matching(&self, mut keep: impl FnMut(&ClientNode) -> bool) -> Vec<Handle> {
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
