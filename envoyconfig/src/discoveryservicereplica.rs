//! The `DiscoveryServiceReplica` custom resource (`marin3r.3scale.net/v1alpha1`, short
//! name `dsr`): what one replica of a discovery service with several replicas reports to
//! the others (`docs/ha.md`). Each replica writes its own object (named after its Pod,
//! owned by the Pod so that garbage collection removes it after a crash) with a
//! heartbeat and, per Envoy node it serves or has streams for, the digest the leader's
//! fleet-wide NACK judgement reads: which revision it serves, since when, the per-type
//! versions, how many pods are connected and the smallest NACK count of each version
//! over those pods.
//!
//! Only the replica itself writes its object; it is internal (like
//! EnvoyConfigRevision) and never edited by users.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longest NACK message a digest carries (characters).
pub const MAX_DIGEST_MESSAGE: usize = 256;

/// One replica of a discovery service.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "marin3r.3scale.net",
    version = "v1alpha1",
    kind = "DiscoveryServiceReplica",
    plural = "discoveryservicereplicas",
    namespaced,
    shortname = "dsr",
    status = "DiscoveryServiceReplicaStatus",
    derive = "PartialEq",
    doc = "DiscoveryServiceReplica is an internal resource: one replica of a discovery \
           service reports what it serves and what its Envoys rejected, so that the \
           leader can judge NACKs over every replica. Each replica writes its own; it \
           is removed with the replica's Pod.",
    printcolumn = r#"{"name": "Leader", "type": "boolean", "jsonPath": ".status.leader"}"#,
    printcolumn = r#"{"name": "Heartbeat", "type": "string", "format": "date-time", "jsonPath": ".status.heartbeat"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceReplicaSpec {
    /// The discovery service (its Service) this replica belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_service: Option<String>,
}

/// What a replica reports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceReplicaStatus {
    /// When the replica wrote this report (every write; at least every heartbeat
    /// interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<Time>,
    /// Incremented by every write of this replica.
    #[serde(default)]
    pub seq: u64,
    /// Whether the replica held the leader Lease when it wrote this report.
    #[serde(default)]
    pub leader: bool,
    /// One digest per node id, sorted by node id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeDigest>,
}

/// What one replica serves one Envoy node id, and how its Envoys answered.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDigest {
    /// The Envoy node id.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// The UID of the EnvoyConfigRevision the replica serves for the node (absent: the
    /// node is held, nothing published yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// That revision's `status.lastPublishedAt` as the replica saw it when serving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Time>,
    /// The served version of each resource type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, String>,
    /// Pods with an open stream for the node on this replica (exact at heartbeats; in
    /// between only its crossing of 0 is reported).
    #[serde(default)]
    pub pods: u64,
    /// Per type: the smallest NACK count of the served version over those pods,
    /// saturated at the NACK threshold (absent: 0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub min_nacks: BTreeMap<String, u64>,
    /// The last NACK message of one of those pods (at most [`MAX_DIGEST_MESSAGE`]
    /// characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Pods of the node with a stream on this replica that never answered anything (not
    /// counted in `minNacks`), sorted; at most one more than a taint reason names, so
    /// the leader's reason elides the rest as a single replica's does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub silent_pods: Vec<String>,
}
