//! The MARIN3R operator (`marin3r operator`, OPERATOR.md): the DiscoveryService,
//! DiscoveryServiceCertificate and EnvoyDeployment controllers of
//! `operator.marin3r.3scale.net/v1alpha1` ([`marin3r_operator_api`]).
//!
//! Every object a controller writes is built by a pure generator (no I/O, unit-tested
//! and shown by `marin3r operator render`) and written with server-side apply under the
//! field manager [`FIELD_MANAGER`], with a controller owner reference to the object it
//! belongs to. Only the fields the operator owns are applied, so fields other managers
//! set (a `kubectl rollout restart` annotation, an HPA's replica count) are kept
//! (OPERATOR.md §1 [R], Q10).
//!
//! Layout: [`objects`] holds what every generated object shares (labels, owner
//! references); the generators and controllers are one module per kind.

pub mod certificate;
pub mod objects;

/// Field manager of every server-side apply of the operator.
pub const FIELD_MANAGER: &str = "marin3r-operator";
