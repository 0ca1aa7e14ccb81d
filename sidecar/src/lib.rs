//! The pure sidecar toolkit: MARIN3R pod annotations → validated [`SidecarConfig`] →
//! Envoy sidecar containers, init container, volumes and pod changes; plus the Envoy
//! bootstrap that `marin3r init-manager` writes. No sockets, no async runtime.
#![forbid(unsafe_code)]

pub mod annotations;
pub mod bootstrap;
pub mod extra_volumes;
pub mod generate;
pub mod host_ports;
pub mod inject;
pub mod run_as;
pub mod validate;
pub mod workload;

pub use annotations::{AnnotationError, AnnotationErrors, Defaults, SidecarConfig};
pub use inject::{
    Added, Injection, InjectionPatch, Mutation, Plan, SkipReason, mutate_pod, plan_pod, plan_pod_as,
};
pub use run_as::RunAs;

/// Errors of the sidecar toolkit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One or more annotations are invalid; all of them are listed.
    #[error("{0}")]
    Annotations(AnnotationErrors),
    /// The Pod (or workload) itself is malformed.
    #[error("invalid pod: {field}: {message}")]
    InvalidPod { field: String, message: String },
    /// A workload kind `marin3r inject` does not know.
    #[error(
        "unsupported kind {}: expected Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob",
        marin3r_wire::quote::quoted(kind)
    )]
    UnsupportedKind { kind: String },
    /// Serialising a generated object failed.
    #[error("cannot serialise generated object")]
    Serialize(#[source] serde_json::Error),
}
