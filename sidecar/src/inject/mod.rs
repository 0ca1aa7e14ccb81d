//! Pod mutation: decides whether a Pod (or a pod template) gets a sidecar, and what
//! injection adds and removes ([`Injection`]): the admission response's JSON patch and the
//! injected Pod are both built from those edits.
//!
//! The Pod is handled as raw JSON, not as a typed `k8s_openapi` Pod: a round trip through
//! typed structs would drop fields this build does not know (newer Kubernetes versions).
//! The patch names only the paths injection edits, so such fields are never touched.

mod apply;
mod conflicts;
mod edit;
mod patch;
mod plan;
mod pod;
mod status;
mod undo;

#[cfg(test)]
mod tests;

pub use edit::{Added, Injection};
pub use patch::InjectionPatch;
pub use plan::{
    DEFAULT_TERMINATION_GRACE_PERIOD, Mutation, Plan, SkipReason, mutate_pod, plan_pod, plan_pod_as,
};
pub use status::{ExtraVolumeMount, GracePeriodChange, PreStopChange, SidecarStatus};
