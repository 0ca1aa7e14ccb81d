//! The MARIN3R operator API, `operator.marin3r.3scale.net/v1alpha1` (OPERATOR.md §2):
//! [`DiscoveryService`], [`DiscoveryServiceCertificate`] and [`EnvoyDeployment`].
//!
//! - Every upstream field name is accepted (camelCase JSON, including the misspelt
//!   `pkiConfg`); optional where upstream is optional, required where its CRD requires.
//! - Defaults are not persisted (except the DSC's, through
//!   [`DiscoveryServiceCertificateSpec::with_defaults`]); getter methods compute them, as
//!   upstream's do. Images the operator chooses (`MARIN3R_IMAGE`) are passed in by the
//!   caller: this crate reads no environment.
//! - The CRD schemas carry the checks upstream made in a webhook (CEL rules) plus port
//!   ranges; `validate()` on each spec reports the same rules, and a few more, as a list of
//!   [`FieldError`]s with JSON paths (for the EnvoyDeployment webhook and
//!   `marin3r operator render`).
//!
//! The CustomResourceDefinitions are generated from these types by `marin3r-manifests`
//! ([`crds`]).
#![forbid(unsafe_code)]

pub mod discoveryservice;
pub mod discoveryservicecertificate;
pub mod duration;
pub mod envoydeployment;
mod schema;
pub mod validate;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;

pub use discoveryservice::{DiscoveryService, DiscoveryServiceSpec, DiscoveryServiceStatus};
pub use discoveryservicecertificate::{
    DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec, DiscoveryServiceCertificateStatus,
};
pub use duration::parse_go_duration;
pub use envoydeployment::{EnvoyDeployment, EnvoyDeploymentSpec, EnvoyDeploymentStatus};
pub use validate::{FieldError, Rule};

/// The API group of the operator's resources.
pub const GROUP: &str = "operator.marin3r.3scale.net";
/// The only version of the API.
pub const VERSION: &str = "v1alpha1";

/// Errors of this crate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A Go duration string that does not parse (or is negative).
    #[error("{field}: invalid duration {value:?}: {reason}")]
    Duration {
        /// JSON path of the field, e.g. `spec.duration`.
        field: String,
        /// The value found.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A port outside 1–65535.
    #[error("{field}: port {value} is outside 1-65535")]
    Port {
        /// JSON path of the field, e.g. `spec.adminPort`.
        field: String,
        /// The value found.
        value: i64,
    },
    /// A spec that breaks one or more rules (every problem, in field order).
    #[error("{}", validate::join(.0))]
    Invalid(Vec<FieldError>),
}

/// The three CustomResourceDefinitions of the operator API, in a stable order:
/// DiscoveryService, DiscoveryServiceCertificate, EnvoyDeployment.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        DiscoveryService::crd(),
        DiscoveryServiceCertificate::crd(),
        EnvoyDeployment::crd(),
    ]
}

/// `value` if set, else `default`: every image getter (`spec.image`,
/// `initManager.image`, `shutdownManager.image`) defaults this way. The operator passes
/// its own image (`MARIN3R_IMAGE`, or the image it was built for) as `default`.
pub fn image_or<'a>(value: Option<&'a str>, default: &'a str) -> &'a str {
    value.filter(|s| !s.is_empty()).unwrap_or(default)
}

/// A port field as `u16`, or [`Error::Port`] naming the field (schema and
/// `validate()` keep it in 1–65535; this guards objects that bypassed both).
pub(crate) fn port(field: &str, value: i32) -> Result<u16, Error> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Error::Port {
            field: field.to_string(),
            value: i64::from(value),
        })
}
