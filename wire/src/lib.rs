//! Every wire fact of MARIN3R, defined once: what users, Kubernetes and Envoy see by name
//! (label, annotation and finalizer keys, Secret keys, default ports, mount paths and
//! images) and the Kubernetes rules on names and namespaces. The sidecar injector, the
//! discovery service, the operator, the CLI's flag defaults and the manifests tests all
//! import these, so a key or a default is never spelled twice.
//!
//! It has no dependencies (plain constants and pure functions), so every crate can take it.
#![forbid(unsafe_code)]

pub mod names;

pub use names::{
    DEFAULT_NAMESPACE, dns1123_label, dns1123_subdomain, is_dns1123_subdomain, is_label_value,
    namespace_or_default, port_name,
};

/// The API group of EnvoyConfig, EnvoyConfigRevision (and the prefix of every MARIN3R
/// annotation and label).
pub const DOMAIN: &str = "marin3r.3scale.net";

/// The label that opts a Pod into sidecar injection, with the value [`INJECTION_ENABLED`]
/// (the webhook's `objectSelector`; the discovery service watches these Pods).
pub const INJECTION_LABEL: &str = "marin3r.3scale.net/status";
/// The value of [`INJECTION_LABEL`] that enables injection.
pub const INJECTION_ENABLED: &str = "enabled";
/// The Pod annotation naming the Envoy node id (also the label of an
/// EnvoyConfigRevision's node id).
pub const NODE_ID_ANNOTATION: &str = "marin3r.3scale.net/node-id";
/// The finalizer the discovery service puts on EnvoyConfigRevisions (upstream's name).
pub const REVISION_FINALIZER: &str = "finalizer.marin3r.3scale.net";

/// The keys of a `kubernetes.io/tls` Secret (and the file names of a Secret volume or of
/// `marin3r certs`' output): certificate chain, private key, CA bundle.
pub mod secret_keys {
    pub const TLS_CRT: &str = "tls.crt";
    pub const TLS_KEY: &str = "tls.key";
    pub const CA_CRT: &str = "ca.crt";
}

/// Default ports.
pub mod ports {
    /// The discovery service's gRPC (xDS) port (`--xdss-port`, the Service port).
    pub const XDSS: u16 = 18000;
    /// Envoy's admin port in injected and operator-generated Envoys.
    pub const ENVOY_ADMIN: u16 = 9901;
    /// The shutdown manager's HTTP port.
    pub const SHUTDOWN_MANAGER: u16 = 8090;
}

/// Where injected and operator-generated containers mount their volumes.
pub mod paths {
    /// The Envoy client certificate (a `kubernetes.io/tls` Secret volume).
    pub const ENVOY_TLS_CLIENT: &str = "/etc/envoy/tls/client";
    /// The bootstrap written by the init manager (an emptyDir).
    pub const ENVOY_BOOTSTRAP: &str = "/etc/envoy/bootstrap";
    /// The bootstrap file in [`ENVOY_BOOTSTRAP`].
    pub const ENVOY_BOOTSTRAP_FILE: &str = "/etc/envoy/bootstrap/config.json";
}

/// Default images.
pub mod images {
    /// Envoy (`--default-envoy-image`, EnvoyDeployments without `spec.image`).
    pub const ENVOY: &str = "envoyproxy/envoy:v1.40.0";
    /// The marin3r image: discovery service, init manager, shutdown manager
    /// (`--marin3r-image`).
    pub const MARIN3R: &str = "quay.io/marin3r-rs/marin3r:v0.1.0";
}

/// The Envoy API version every EnvoyConfig uses (`envoyAPI`, the
/// `envoy-api-version` annotation).
pub const ENVOY_API_V3: &str = "v3";

/// An error with its sources, `: `-separated, on one line: how marin3r writes an error
/// into a log field or a status message (never key material: errors name files and
/// fields, not contents).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}
