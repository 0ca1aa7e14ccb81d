//! The MARIN3R operator (`marin3r operator`, OPERATOR.md): the DiscoveryService,
//! DiscoveryServiceCertificate and EnvoyDeployment controllers of
//! `operator.marin3r.3scale.net/v1alpha1` ([`marin3r_operator_api`]).
//!
//! Every object a controller writes is built by a pure generator (no I/O, unit-tested
//! and shown by `marin3r operator render`) and written with server-side apply under the
//! field manager [`FIELD_MANAGER`], with a controller owner reference to the object it
//! belongs to. Only the fields the operator owns are applied, so fields other managers
//! set (a `kubectl rollout restart` annotation, an HPA's replica count) are kept
//! (OPERATOR.md §1 \[R\], Q10).
//!
//! Layout: [`objects`] holds what every generated object shares (labels, owner
//! references); the generators and controllers are one module per kind.

pub mod apply;
pub mod certificate;
pub mod discovery_service;
pub mod discovery_service_controller;
pub mod envoy_deployment;
pub mod envoy_deployment_controller;
pub mod objects;
pub mod render;

/// Field manager of every server-side apply of the operator.
pub const FIELD_MANAGER: &str = "marin3r-operator";

/// The images the operator puts in what it generates when a resource does not name one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// The marin3r image: the discovery service, the init manager and the shutdown
    /// manager (`MARIN3R_IMAGE`, default this build's image).
    pub marin3r: String,
    /// Envoy of EnvoyDeployments without `spec.image`.
    pub envoy: String,
}

impl Default for Images {
    fn default() -> Self {
        Self {
            marin3r: marin3r_sidecar::annotations::DEFAULT_MARIN3R_IMAGE.to_string(),
            envoy: marin3r_operator_api::envoydeployment::DEFAULT_ENVOY_IMAGE.to_string(),
        }
    }
}
