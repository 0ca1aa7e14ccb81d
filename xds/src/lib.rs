//! The xDS server of MARIN3R: per-node snapshots ([`snapshot`]), the ADS stream state
//! machines for SotW ([`sotw`]) and Delta ([`delta`]) with ACK/NACK tracking and the
//! NACK backoff ([`tracking`]), and their tonic shell over mTLS ([`server`], [`grpc`]).
//!
//! What the streams report feeds the ACK/NACK statistics, one module per idea: the
//! node of a stream and the bounds on it ([`node`]), the events a stream reports
//! ([`events`]), their plain aggregation for the self-healing engine ([`acknack`]), the
//! Prometheus series ([`metrics`]), and the handle that feeds both under one lock
//! ([`stats`]). The client status service (CSDS: per open stream, per resource, what was
//! sent, ACKed and NACKed) reads the stream state machines through a registry
//! ([`csds`]) and is served next to ADS ([`grpc::CsdsServer`]).
//!
//! It serves resources to nodes and knows nothing about EnvoyConfigs: the control plane
//! (`marin3r-control-plane`) decides what each node gets and sets it in the
//! [`SnapshotCache`].
#![forbid(unsafe_code)]

pub mod acknack;
mod connection;
pub mod csds;
pub mod delta;
pub mod drain;
pub mod events;
pub mod grpc;
pub mod limits;
pub mod metrics;
pub mod node;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod sotw;
pub mod stats;
pub mod stream;
pub mod tracking;

pub use acknack::{AckNackStats, NodeNacks, PodCounts};
pub use csds::{ClientStatusRegistry, ClientView};
pub use delta::{DeltaOutcome, DeltaStream};
pub use drain::{SHUTTING_DOWN, close_offset};
pub use events::{Api, StreamEvent};
pub use marin3r_envoyconfig::{Resource, ResourceType};
pub use metrics::{StreamCounters, XdsMetrics};
pub use node::{MAX_NODE_METADATA_BYTES, NodeInfo, NodeTooLarge, check_node, log_prefix};
pub use snapshot::{DuplicateResource, EMPTY_VERSION, Snapshot, SnapshotCache, TypeSnapshot};
pub use sotw::{SotwOutcome, SotwStream};
pub use stats::SharedStats;
pub use stream::{Outcome, supports_wildcard};
pub use tracking::{AdsConfig, MAX_NAMES_PER_TYPE, TooManyNames};
