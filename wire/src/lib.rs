//! Every wire fact of MARIN3R, defined once: what users, Kubernetes and Envoy see by name
//! (label, annotation and finalizer keys, Secret keys, default ports, mount paths and
//! images) and the Kubernetes rules on names and namespaces. The sidecar injector, the
//! discovery service, the operator, the CLI's flag defaults and the manifests tests all
//! import these, so a key or a default is never spelled twice.
//!
//! It has no dependencies (plain constants and pure functions), so every crate can take it.
#![forbid(unsafe_code)]

pub mod names;
pub mod quote;

pub use names::{
    DEFAULT_NAMESPACE, dns1035_label, dns1123_label, dns1123_subdomain, given_namespace,
    is_dns1123_subdomain, is_label_value, label_value, namespace_or, namespace_or_default,
    port_name,
};

/// The API group of EnvoyConfig, EnvoyConfigRevision (and the prefix of every MARIN3R
/// annotation and label).
pub const DOMAIN: &str = "marin3r.3scale.net";
/// The API group of the operator's resources (DiscoveryService,
/// DiscoveryServiceCertificate, EnvoyDeployment) and the prefix of its annotations.
pub const OPERATOR_GROUP: &str = "operator.marin3r.3scale.net";
/// The version of both API groups.
pub const API_VERSION: &str = "v1alpha1";

/// The label that opts a Pod into sidecar injection, with the value [`INJECTION_ENABLED`]
/// (the webhook's `objectSelector`; the discovery service watches these Pods).
pub const INJECTION_LABEL: &str = "marin3r.3scale.net/status";
/// The value of [`INJECTION_LABEL`] that enables injection.
pub const INJECTION_ENABLED: &str = "enabled";
/// The Pod annotation naming the Envoy node id (also the label of an
/// EnvoyConfigRevision's node id).
pub const NODE_ID_ANNOTATION: &str = "marin3r.3scale.net/node-id";
/// The Pod annotation in which the webhook records what it injected (idempotent
/// re-injection).
pub const SIDECAR_STATUS_ANNOTATION: &str = "marin3r.3scale.net/sidecar-status";
/// The label of an EnvoyConfigRevision's config version (the hash of its resources).
pub const CONFIG_VERSION_LABEL: &str = "marin3r.3scale.net/config-version";
/// The label of an EnvoyConfigRevision's Envoy API (`v3`).
pub const ENVOY_API_LABEL: &str = "marin3r.3scale.net/envoy-api";
/// The annotation recording when an EnvoyConfigRevision was last published (RFC 3339).
pub const APPLIED_AT_ANNOTATION: &str = "marin3r.3scale.net/applied-at";
/// The finalizer the discovery service puts on EnvoyConfigRevisions (upstream's name).
pub const REVISION_FINALIZER: &str = "finalizer.marin3r.3scale.net";
/// CA Secrets during a rotation: until when (RFC 3339) the retired CA is trusted.
pub const RETIRED_CA_UNTIL_ANNOTATION: &str = "operator.marin3r.3scale.net/retired-ca-until";
/// CA Secrets during a rotation: when (RFC 3339) the CA was last re-issued.
pub const RETIRED_CA_SINCE_ANNOTATION: &str = "operator.marin3r.3scale.net/retired-ca-since";

/// Envoy node metadata key (`node.metadata`) holding the Envoy pod's name: written by the
/// injected bootstrap, read by the discovery service (stats, CSDS) and `marin3r status`.
pub const POD_NAME_METADATA_KEY: &str = "pod_name";
/// Envoy node metadata key holding the Envoy pod's namespace (as [`POD_NAME_METADATA_KEY`]).
pub const POD_NAMESPACE_METADATA_KEY: &str = "pod_namespace";

/// The Kubernetes recommended labels (`app.kubernetes.io/*`) the operator puts on what
/// it generates, and the value that marks an object as the operator's.
pub mod app_labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The value of [`NAME`] on everything the operator generates.
    pub const MARIN3R: &str = "marin3r";
    /// The value of [`MANAGED_BY`] on everything the operator generates.
    pub const OPERATOR: &str = "marin3r-operator";
    /// The label selector `MANAGED_BY=OPERATOR` (the operator's Secret and Deployment
    /// watches).
    pub const MANAGED_BY_OPERATOR: &str = "app.kubernetes.io/managed-by=marin3r-operator";
}

/// The keys of a `kubernetes.io/tls` Secret (and the file names of a Secret volume or of
/// `marin3r certs`' output): certificate chain, private key, CA bundle.
pub mod secret_keys {
    pub const TLS_CRT: &str = "tls.crt";
    pub const TLS_KEY: &str = "tls.key";
    pub const CA_CRT: &str = "ca.crt";
}

/// Where OLM v0 mounts a webhook's serving certificate (one Secret, mounted twice):
/// `apiserver.crt`/`apiserver.key` in [`APISERVER_CERT_DIR`], and `tls.crt`/`tls.key` in
/// [`WEBHOOK_CERT_DIR`] (controller-runtime's default directory).
pub mod olm {
    /// The certificate file name in [`APISERVER_CERT_DIR`].
    pub const APISERVER_CRT: &str = "apiserver.crt";
    /// The key file name in [`APISERVER_CERT_DIR`].
    pub const APISERVER_KEY: &str = "apiserver.key";
    /// OLM v0's mount of `apiserver.crt`/`apiserver.key` (and upstream MARIN3R's
    /// `--tls-dir` default).
    pub const APISERVER_CERT_DIR: &str = "/apiserver.local.config/certificates";
    /// OLM v0's mount of `tls.crt`/`tls.key` (controller-runtime's default).
    pub const WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
    /// The `(certificate, key)` file names a webhook serving directory may hold, in the
    /// order they are looked for: OLM v0's, then a `kubernetes.io/tls` Secret's.
    pub const SERVING_LAYOUTS: [(&str, &str); 2] = [
        (APISERVER_CRT, APISERVER_KEY),
        (super::secret_keys::TLS_CRT, super::secret_keys::TLS_KEY),
    ];
}

/// Default names of objects that two components must agree on.
pub mod object_names {
    /// The Secret of the sidecars' client certificate: the `client-certificate`
    /// annotation's default, and the Secret a DiscoveryService creates in its namespace.
    pub const SIDECAR_CLIENT_CERTIFICATE: &str = "envoy-sidecar-client-cert";

    /// The discovery service a sidecar talks to by default (`--default-discovery-service`,
    /// the `discovery-service.name` annotation's default) and the name the discovery
    /// service's replicas meet under by default (`--discovery-service-name`).
    pub const DEFAULT_DISCOVERY_SERVICE: &str = "discoveryservice";

    /// The Service (and Deployment, ServiceAccount, Role) of the discovery service
    /// `name`: `marin3r-<name>`, the host sidecars dial
    /// (`marin3r-<name>.<namespace>.svc`).
    pub fn discovery_service(name: &str) -> String {
        format!("marin3r-{name}")
    }

    /// The leader Lease of the replicas of the discovery service `name`, in its
    /// namespace: `marin3r-<name>-leader` (`--discovery-service-name`; the Role's
    /// `resourceNames`).
    pub fn discovery_service_lease(name: &str) -> String {
        format!("{}-leader", discovery_service(name))
    }

    /// The PriorityClass of the discovery service's pods (shipped by
    /// `manifests/default` and `manifests/operator`; the operator's default for
    /// `spec.podPriorityClass`).
    pub const DISCOVERY_SERVICE_PRIORITY_CLASS: &str = "marin3r-discovery-service";
}

/// The names of the admission webhooks (`webhooks[].name`), the same as upstream MARIN3R's:
/// the API server quotes them in every error (`admission webhook "…" denied the request`),
/// which upstream users' scripts and QE suites match (docs/migrating.md).
pub mod webhook_names {
    /// The Pod mutating webhook (sidecar injection).
    pub const SIDECAR_INJECTOR: &str = "sidecar-injector.marin3r.3scale.net";
    /// The EnvoyConfig validating webhook.
    pub const ENVOYCONFIG: &str = "envoyconfig.marin3r.3scale.net-v1alpha1";
    /// The EnvoyDeployment validating webhook.
    pub const ENVOYDEPLOYMENT: &str = "envoydeployment.operator.marin3r.3scale.net";
    /// The Pod webhook's `timeoutSeconds`: a Pod is never held longer than this.
    pub const SIDECAR_INJECTOR_TIMEOUT_SECONDS: i32 = 5;
}

/// Default ports.
pub mod ports {
    /// The discovery service's gRPC (xDS) port (`--xdss-port`, the Service port).
    pub const XDSS: u16 = 18000;
    /// The name of that port on the discovery service's container and Service (the
    /// Service's `targetPort`; `marin3r status` port-forwards to it).
    pub const XDSS_NAME: &str = "discovery";
    /// Envoy's admin port in injected and operator-generated Envoys.
    pub const ENVOY_ADMIN: u16 = 9901;
    /// The shutdown manager's HTTP port.
    pub const SHUTDOWN_MANAGER: u16 = 8090;
    /// The discovery service's and the operator's `/metrics` (`--metrics-bind-address`,
    /// a DiscoveryService's `metricsPort`).
    pub const METRICS: u16 = 8383;
    /// The discovery service's and the operator's `/healthz` and `/readyz`
    /// (`--health-probe-bind-address`, a DiscoveryService's `probePort`).
    pub const PROBES: u16 = 8384;
}

/// HTTP paths one component serves and another calls.
pub mod http_paths {
    /// Liveness: the process is up.
    pub const HEALTHZ: &str = "/healthz";
    /// Readiness (discovery service, operator, webhook).
    pub const READYZ: &str = "/readyz";
    /// The shutdown manager starts draining Envoy (an app container's preStop hook).
    pub const DRAIN: &str = "/drain";
    /// The shutdown manager blocks until Envoy drained (Envoy's preStop hook).
    pub const SHUTDOWN: &str = "/shutdown";
}

/// Where injected and operator-generated containers mount their volumes, and Envoy's
/// default files.
pub mod paths {
    /// The Envoy client certificate (a `kubernetes.io/tls` Secret volume).
    pub const ENVOY_TLS_CLIENT: &str = "/etc/envoy/tls/client";
    /// The bootstrap written by the init manager (an emptyDir).
    pub const ENVOY_BOOTSTRAP: &str = "/etc/envoy/bootstrap";
    /// The bootstrap file in [`ENVOY_BOOTSTRAP`].
    pub const ENVOY_BOOTSTRAP_FILE: &str = "/etc/envoy/bootstrap/config.json";
    /// Envoy's admin access log (`admin.access-log-path`, `--admin-access-log-path`, an
    /// EnvoyDeployment's `adminAccessLogPath`).
    pub const ENVOY_ADMIN_ACCESS_LOG: &str = "/dev/null";
    /// The discovery service's server certificate (`--server-certificate-path`, the
    /// Secret volume of an operator-generated discovery service).
    pub const DISCOVERY_SERVICE_SERVER_CERT: &str = "/etc/marin3r/tls/server";
    /// The CA the discovery service checks client certificates against
    /// (`--ca-certificate-path`).
    pub const DISCOVERY_SERVICE_CA: &str = "/etc/marin3r/tls/ca";
}

/// OpenShift's SecurityContextConstraints annotations marin3r reads (design.md §1.3,
/// docs/operator.md): who admitted a Pod, and the UIDs of a Namespace.
pub mod openshift {
    /// On a Pod: the SCC that admitted it (SCC admission runs before mutating webhooks).
    pub const SCC_ANNOTATION: &str = "openshift.io/scc";
    /// On a Namespace: its UIDs, `<start>/<size>` (`1000680000/10000`); restricted-v2
    /// admits only a `runAsUser` in that range and fills in its start.
    pub const UID_RANGE_ANNOTATION: &str = "openshift.io/sa.scc.uid-range";
    /// On a Pod: the pod seccomp profile SCC admission writes next to the field.
    pub const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
    /// On a Pod: a container's seccomp profile (then the container name).
    pub const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str =
        "container.seccomp.security.alpha.kubernetes.io/";

    /// The first UID of a uid-range annotation value (`<start>/<size>` or
    /// `<start>-<end>`, as OpenShift writes and parses it), if it is one and not 0.
    pub fn uid_range_start(value: &str) -> Option<i64> {
        let value = value.trim();
        let (start, rest) = value.split_once('/').or_else(|| value.split_once('-'))?;
        let start: i64 = start.trim().parse().ok()?;
        let rest: i64 = rest.trim().parse().ok()?;
        let valid = if value.contains('/') {
            rest >= 1
        } else {
            rest >= start
        };
        (start > 0 && valid).then_some(start)
    }
}

/// Default images.
pub mod images {
    /// Envoy (`--default-envoy-image`, EnvoyDeployments without `spec.image`).
    pub const ENVOY: &str = "envoyproxy/envoy:v1.40.0";
    /// The marin3r image: discovery service, init manager, shutdown manager
    /// (`--marin3r-image`).
    pub const MARIN3R: &str = "quay.io/marin3r-rs/marin3r:v0.1.0";
    /// The OLM bundle image of this version (`scripts/olm-images`, the catalog's
    /// `olm.bundle`).
    pub const OLM_BUNDLE: &str = "quay.io/marin3r-rs/marin3r-bundle:v0.1.0";
    /// The OLM catalog image of this version (the CatalogSource and ClusterCatalog of
    /// `manifests/olm/`).
    pub const OLM_CATALOG: &str = "quay.io/marin3r-rs/marin3r-catalog:v0.1.0";
}

/// Largest `node.id`, `node.cluster` and `node.metadata.pod_name` the discovery service
/// accepts, in bytes (it refuses a stream over it). Kubernetes names are at most 253
/// characters and a node id is one (or a few joined), so 1 KiB leaves room for any real id
/// while bounding what one stream can make the server store, label metrics with, and log.
/// Injection refuses a `node-id` or `cluster-id` annotation over it up front.
pub const MAX_NODE_NAME_BYTES: usize = 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_range_gives_its_first_uid() {
        use openshift::uid_range_start;
        assert_eq!(uid_range_start("1000680000/10000"), Some(1_000_680_000));
        assert_eq!(uid_range_start(" 2000-2999 "), Some(2000));
        for bad in ["", "1000680000", "x/10", "10/0", "0/10000", "5-4", "-1/10"] {
            assert_eq!(uid_range_start(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn keys_are_under_their_group() {
        for key in [
            INJECTION_LABEL,
            NODE_ID_ANNOTATION,
            SIDECAR_STATUS_ANNOTATION,
            CONFIG_VERSION_LABEL,
            ENVOY_API_LABEL,
            APPLIED_AT_ANNOTATION,
        ] {
            assert!(key.starts_with(&format!("{DOMAIN}/")), "{key}");
        }
        for key in [RETIRED_CA_UNTIL_ANNOTATION, RETIRED_CA_SINCE_ANNOTATION] {
            assert!(key.starts_with(&format!("{OPERATOR_GROUP}/")), "{key}");
        }
        assert_eq!(OPERATOR_GROUP, format!("operator.{DOMAIN}"));
        assert_eq!(REVISION_FINALIZER, format!("finalizer.{DOMAIN}"));
    }

    #[test]
    fn the_managed_by_selector_is_the_label_and_its_value() {
        use app_labels::*;
        assert_eq!(MANAGED_BY_OPERATOR, format!("{MANAGED_BY}={OPERATOR}"));
    }

    #[test]
    fn the_bootstrap_file_is_in_the_bootstrap_volume() {
        assert_eq!(
            paths::ENVOY_BOOTSTRAP_FILE,
            format!("{}/config.json", paths::ENVOY_BOOTSTRAP)
        );
    }

    #[test]
    fn error_chain_joins_the_sources() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("reading tls.crt")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("permission denied"));
        assert_eq!(error_chain(&e), "reading tls.crt: permission denied");
    }
}
