//! The xDS server of MARIN3R: per-node snapshots ([`snapshot`]), the ADS stream state
//! machines for SotW ([`sotw`]) and Delta ([`delta`]) with ACK/NACK tracking and the
//! NACK backoff ([`tracking`]), the ACK/NACK statistics and metrics ([`stats`]), and
//! their tonic shell over mTLS ([`server`], [`grpc`]).
//!
//! It serves resources to nodes and knows nothing about EnvoyConfigs: the control plane
//! (`marin3r-control-plane`) decides what each node gets and sets it in the
//! [`SnapshotCache`].
#![forbid(unsafe_code)]

pub mod delta;
pub mod drain;
pub mod grpc;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod sotw;
pub mod stats;
pub mod tracking;

pub use delta::{DeltaOutcome, DeltaStream};
pub use drain::{SHUTTING_DOWN, close_offset};
pub use marin3r_envoyconfig::{Resource, ResourceType};
pub use snapshot::{DuplicateResource, EMPTY_VERSION, Snapshot, SnapshotCache, TypeSnapshot};
pub use sotw::{AdsConfig, Outcome, SotwOutcome, SotwStream, supports_wildcard};
pub use stats::{
    AckNackStats, Api, NodeInfo, PodCounts, SharedStats, StreamCounters, StreamEvent, XdsMetrics,
};
pub use tracking::{
    MAX_NODE_METADATA_BYTES, MAX_NODE_NAME_BYTES, NodeTooLarge, check_node, log_prefix,
};
