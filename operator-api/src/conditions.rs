//! Condition types and reasons of the operator's statuses (operator-design.md §8 Q1, Q11,
//! decisions marked R).
//! Upstream writes no conditions; these are the names the Rust controllers use, kept
//! here so that controllers, `render` and tests spell them the same way.

/// The object's children are applied and available.
pub const READY: &str = "Ready";

/// Reason: `spec.discoveryServiceRef` names no DiscoveryService in the namespace.
pub const REASON_DISCOVERY_SERVICE_NOT_FOUND: &str = "DiscoveryServiceNotFound";
/// Reason: `spec.envoyConfigRef` names no EnvoyConfig in the namespace.
pub const REASON_ENVOY_CONFIG_NOT_FOUND: &str = "EnvoyConfigNotFound";
/// Reason: the client certificate is not issued (or not valid) yet.
pub const REASON_CERTIFICATE_NOT_READY: &str = "CertificateNotReady";
/// Reason: the Deployment has fewer available replicas than desired.
pub const REASON_DEPLOYMENT_UNAVAILABLE: &str = "DeploymentUnavailable";
/// Reason: another (older) DiscoveryService already serves the namespace.
pub const REASON_DUPLICATE_DISCOVERY_SERVICE: &str = "DuplicateDiscoveryService";
/// Reason: `validate()` rejected the spec.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
