//! The node of a stream: who the Envoy is ([`NodeInfo`]: `node.id`, and the pod name in
//! `node.metadata`), how large a node the server accepts ([`check_node`]), and how much
//! of a value a client chose the server keeps or logs ([`log_prefix`]).

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

use marin3r_wire::{POD_NAME_METADATA_KEY, POD_NAMESPACE_METADATA_KEY};

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
        metadata_string(node, POD_NAME_METADATA_KEY)
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

/// `node.metadata.<key>` when it is a string.
pub fn metadata_string<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .as_ref()
        .and_then(|m| m.fields.get(key))
        .and_then(|v| match &v.kind {
            Some(Kind::StringValue(s)) => Some(s.as_str()),
            _ => None,
        })
}

use marin3r_wire::MAX_NODE_NAME_BYTES;
/// Largest encoded `node.metadata` accepted, in bytes: the injected bootstrap sets a
/// few short keys (the pod name); 64 KiB allows rich metadata from other bootstraps and
/// still bounds every request that carries the node (Envoy sends it on each request by
/// default).
pub const MAX_NODE_METADATA_BYTES: usize = 64 * 1024;

/// Why a stream's node is refused: `field` is `size` bytes, over `limit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {size} bytes, over the limit of {limit} bytes")]
pub struct NodeTooLarge {
    pub field: &'static str,
    pub size: usize,
    pub limit: usize,
}

/// Checks the parts of a node the server keeps, counts, labels metrics with or logs
/// against [`MAX_NODE_NAME_BYTES`] and [`MAX_NODE_METADATA_BYTES`] (the metadata first:
/// it bounds the pod name's cost before the pod name is looked at).
pub fn check_node(node: &Node) -> Result<(), NodeTooLarge> {
    use prost::Message as _;
    let over = |field, size, limit| (size > limit).then_some(NodeTooLarge { field, size, limit });
    let metadata = node.metadata.as_ref().map_or(0, |m| m.encoded_len());
    let pod_name = NodeInfo::pod_name_of(node).map_or(0, str::len);
    let pod_namespace = metadata_string(node, POD_NAMESPACE_METADATA_KEY).map_or(0, str::len);
    let refused = over("node.metadata", metadata, MAX_NODE_METADATA_BYTES)
        .or_else(|| over("node.id", node.id.len(), MAX_NODE_NAME_BYTES))
        .or_else(|| over("node.cluster", node.cluster.len(), MAX_NODE_NAME_BYTES))
        .or_else(|| {
            over(
                "node.user_agent_name",
                node.user_agent_name.len(),
                MAX_NODE_NAME_BYTES,
            )
        })
        .or_else(|| over("node.metadata.pod_name", pod_name, MAX_NODE_NAME_BYTES))
        .or_else(|| {
            over(
                "node.metadata.pod_namespace",
                pod_namespace,
                MAX_NODE_NAME_BYTES,
            )
        });
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// At most the first `max` bytes of `s` (cut at a character boundary), for log lines
/// about values a client chose.
pub fn log_prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The `Node` of the Envoy of pod `pod` serving node `id`.
    pub(crate) fn envoy(id: &str, pod: &str) -> Node {
        NodeInfo {
            id: id.into(),
            pod_name: pod.into(),
        }
        .to_node()
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
    fn nodes_over_the_limits_are_refused_naming_the_field() {
        use envoy_types::pb::google::protobuf::{Value, value::Kind};
        let ok = envoy("n1", "pod-a");
        assert_eq!(check_node(&ok), Ok(()));
        let at_limit = Node {
            id: "i".repeat(MAX_NODE_NAME_BYTES),
            cluster: "c".repeat(MAX_NODE_NAME_BYTES),
            ..envoy("", &"p".repeat(MAX_NODE_NAME_BYTES))
        };
        assert_eq!(check_node(&at_limit), Ok(()));
        let refused = |node: Node| check_node(&node).unwrap_err();
        let e = refused(Node {
            id: "i".repeat(8 << 20),
            ..ok.clone()
        });
        assert_eq!(
            e,
            NodeTooLarge {
                field: "node.id",
                size: 8 << 20,
                limit: 1024
            }
        );
        assert_eq!(
            e.to_string(),
            "node.id is 8388608 bytes, over the limit of 1024 bytes"
        );
        assert_eq!(
            refused(Node {
                cluster: "c".repeat(MAX_NODE_NAME_BYTES + 1),
                ..ok.clone()
            })
            .field,
            "node.cluster"
        );
        assert_eq!(
            refused(envoy("n1", &"p".repeat(MAX_NODE_NAME_BYTES + 1))).field,
            "node.metadata.pod_name"
        );
        // What a client status query matches and answers with is bounded too.
        assert_eq!(
            refused(Node {
                user_agent_name: "u".repeat(MAX_NODE_NAME_BYTES + 1),
                ..ok.clone()
            })
            .field,
            "node.user_agent_name"
        );
        let mut namespaced = ok.clone();
        if let Some(m) = namespaced.metadata.as_mut() {
            m.fields.insert(
                POD_NAMESPACE_METADATA_KEY.into(),
                Value {
                    kind: Some(Kind::StringValue("n".repeat(MAX_NODE_NAME_BYTES + 1))),
                },
            );
        }
        assert_eq!(refused(namespaced).field, "node.metadata.pod_namespace");
        let mut big = ok.clone();
        if let Some(m) = big.metadata.as_mut() {
            m.fields.insert(
                "blob".into(),
                Value {
                    kind: Some(Kind::StringValue("x".repeat(MAX_NODE_METADATA_BYTES))),
                },
            );
        }
        let e = refused(big);
        assert_eq!(
            (e.field, e.limit),
            ("node.metadata", MAX_NODE_METADATA_BYTES)
        );
        assert!(e.size > MAX_NODE_METADATA_BYTES);
    }

    #[test]
    fn log_prefixes_are_bounded_and_cut_at_characters() {
        assert_eq!(log_prefix("abc", 64), "abc");
        assert_eq!(log_prefix(&"x".repeat(10_000), 64).len(), 64);
        assert_eq!(log_prefix("ééé", 3), "é", "never inside a character");
    }
}
