//! DiscoveryService (operator-design.md §2.1): one discovery service (xDS server) per
//! namespace, with its private PKI.
//!
//! Every object name derives from the DiscoveryService name through the getters here
//! (`marin3r-<ds>`, `marin3r-ca-cert-<ds>`, `marin3r-server-cert-<ds>`), the one helper the
//! DiscoveryService and EnvoyDeployment controllers and the webhook share
//! (operator-design.md §8 Q2/Q3). `pkiConfg.*.secretName` and `serviceConfig.*` are
//! accepted for compatibility and ignored; [`DiscoveryService::ignored_fields`] lists the
//! ones a user set, so a controller can warn about them.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::api::core::v1::{PodSecurityContext, ResourceRequirements, SecurityContext};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::core::object::{HasSpec, HasStatus};
use kube::{CustomResourceExt, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::validate::{Errors, FieldError, Rule, certificate_lifetime};

pub use generated::DiscoveryServiceSpec;

/// Default `pkiConfg.rootCertificateAuthority.duration` (3 years).
pub const DEFAULT_CA_DURATION: &str = "26280h";
/// Default `pkiConfg.serverCertificate.duration` (90 days).
pub const DEFAULT_SERVER_CERTIFICATE_DURATION: &str = "2160h";
/// Prefix of the CA DSC and Secret names.
pub const CA_CERTIFICATE_PREFIX: &str = "marin3r-ca-cert";
/// Prefix of the CA common name.
pub const CA_COMMON_NAME_PREFIX: &str = "marin3r-ca";
/// Prefix of the server certificate DSC and Secret names.
pub const SERVER_CERTIFICATE_PREFIX: &str = "marin3r-server-cert";
/// Prefix of the server certificate common name.
pub const SERVER_COMMON_NAME_PREFIX: &str = "marin3r-server";
/// The values `serviceConfig.type` accepts.
pub const SERVICE_TYPES: [&str; 3] = ["ClusterIP", "LoadBalancer", "Headless"];
/// Default `replicas`: several replicas behind the Service, one leader writing
/// (`docs/ha.md`).
pub const DEFAULT_REPLICAS: i32 = 3;

mod generated {
    use super::*;

    /// Desired state of a DiscoveryService. Only one instance per namespace is supported.
    #[derive(
        kube::CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "operator.marin3r.3scale.net",
        version = "v1alpha1",
        kind = "DiscoveryService",
        root = "DiscoveryServiceCrd",
        plural = "discoveryservices",
        namespaced,
        status = "DiscoveryServiceStatus",
        derive = "PartialEq",
        doc = "DiscoveryService runs the MARIN3R discovery service (xDS server) of a namespace, \
               with its certificates. Only one instance per namespace is supported.",
        printcolumn = r#"{"name": "Ready", "type": "integer", "jsonPath": ".status.deploymentStatus.readyReplicas"}"#,
        printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub struct DiscoveryServiceSpec {
        /// Image of the discovery service (default: the operator's marin3r image).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub image: Option<String>,
        /// Debug logging (`--log-level=debug`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub debug: Option<bool>,
        /// Compute resources of the discovery service container.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub resources: Option<ResourceRequirements>,
        /// Certificate lifetimes (the field name is upstream's, misspelt). The secret
        /// names are ignored: names always derive from the DiscoveryService name.
        #[serde(rename = "pkiConfg", default, skip_serializing_if = "Option::is_none")]
        pub pki_config: Option<PkiConfig>,
        /// Port of the xDS server (default 18000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::port")]
        pub xds_server_port: Option<i32>,
        /// Port of the metrics endpoint (default 8383).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::port")]
        pub metrics_port: Option<i32>,
        /// Port of the health probes (default 8384).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::port")]
        pub probe_port: Option<i32>,
        /// DEPRECATED, ignored: the Service is always `marin3r-<name>`, type ClusterIP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub service_config: Option<ServiceConfig>,
        /// PriorityClass of the discovery service pods (default
        /// `marin3r-discovery-service`, installed with the operator; `""`: none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pod_priority_class: Option<String>,
        /// Replicas of the discovery service (default 3, at least 1). With more than
        /// one, every replica serves xDS and the one holding the Lease
        /// `marin3r-<name>-leader` writes to the API server; 1 runs a single replica
        /// without a Lease.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1))]
        pub replicas: Option<i32>,
        /// Pod-level securityContext fields set over the generated ones on the
        /// discovery service pods (`runAsNonRoot: true`, `seccompProfile:
        /// RuntimeDefault`, no user: the image's numeric `USER 65532`, or what
        /// OpenShift's SCC assigns). Each field given replaces the generated one; the
        /// others stay. For a policy that needs something else, e.g. `fsGroup` or a
        /// fixed `runAsUser` under a custom OpenShift SCC.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pod_security_context: Option<PodSecurityContext>,
        /// Container-level securityContext fields set over the generated ones on the
        /// discovery service container (`runAsNonRoot`, no privilege escalation,
        /// `drop: [ALL]`, `readOnlyRootFilesystem`, `seccompProfile: RuntimeDefault`).
        /// Each field given replaces the generated one; the others stay.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub security_context: Option<SecurityContext>,
    }
}

/// `pkiConfg`: both certificates must be given when it is set.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PkiConfig {
    /// The CA certificate.
    pub root_certificate_authority: PkiCertificateOptions,
    /// The discovery service's server certificate.
    pub server_certificate: PkiCertificateOptions,
}

/// Options of one certificate of the discovery service's PKI.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PkiCertificateOptions {
    /// IGNORED (upstream compatibility): the Secret is always named after the
    /// DiscoveryService.
    pub secret_name: String,
    /// Validity as a Go duration, e.g. `2160h`.
    #[schemars(schema_with = "crate::schema::go_duration")]
    pub duration: String,
}

/// DEPRECATED `serviceConfig`, accepted and ignored.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceConfig {
    /// Ignored: the Service is `marin3r-<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Ignored: the Service is ClusterIP. One of ClusterIP, LoadBalancer, Headless.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// Observed state of a DiscoveryService.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceStatus {
    /// Name of the discovery service Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_name: Option<String>,
    /// A copy of the Deployment's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_status: Option<DeploymentStatus>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and friends (e.g. `Ready=False`, reason `DuplicateDiscoveryService`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A DiscoveryService. The object type is written out (rather than derived) so that a
/// manifest without `spec`, as in upstream's README, decodes with the default spec.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DiscoveryService {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The desired state (`{}` when absent).
    #[serde(default)]
    pub spec: DiscoveryServiceSpec,
    /// The observed state.
    #[serde(default)]
    pub status: Option<DiscoveryServiceStatus>,
}

impl Serialize for DiscoveryService {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut obj = ser.serialize_struct("DiscoveryService", 5)?;
        obj.serialize_field("apiVersion", &Self::api_version(&()))?;
        obj.serialize_field("kind", &Self::kind(&()))?;
        obj.serialize_field("metadata", &self.metadata)?;
        obj.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            obj.serialize_field("status", status)?;
        }
        obj.end()
    }
}

impl Resource for DiscoveryService {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        generated::DiscoveryServiceCrd::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        generated::DiscoveryServiceCrd::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        generated::DiscoveryServiceCrd::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        generated::DiscoveryServiceCrd::plural(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        generated::DiscoveryServiceCrd::api_version(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl HasSpec for DiscoveryService {
    type Spec = DiscoveryServiceSpec;
    fn spec(&self) -> &DiscoveryServiceSpec {
        &self.spec
    }
    fn spec_mut(&mut self) -> &mut DiscoveryServiceSpec {
        &mut self.spec
    }
}

impl HasStatus for DiscoveryService {
    type Status = DiscoveryServiceStatus;
    fn status(&self) -> Option<&DiscoveryServiceStatus> {
        self.status.as_ref()
    }
    fn status_mut(&mut self) -> &mut Option<DiscoveryServiceStatus> {
        &mut self.status
    }
}

impl CustomResourceExt for DiscoveryService {
    fn crd() -> CustomResourceDefinition {
        generated::DiscoveryServiceCrd::crd()
    }
    fn crd_name() -> &'static str {
        generated::DiscoveryServiceCrd::crd_name()
    }
    fn api_resource() -> kube::core::ApiResource {
        generated::DiscoveryServiceCrd::api_resource()
    }
    fn shortnames() -> &'static [&'static str] {
        generated::DiscoveryServiceCrd::shortnames()
    }
}

/// Options of one certificate of the discovery service's PKI, defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateOptions {
    /// The DSC and Secret name.
    pub secret_name: String,
    /// The certificate's common name.
    pub common_name: String,
    /// Validity.
    pub duration: Duration,
}

impl DiscoveryService {
    /// A DiscoveryService named `name` with `spec`.
    pub fn new(name: &str, spec: DiscoveryServiceSpec) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    fn ds_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `marin3r-<ds>`: ServiceAccount, Role, RoleBinding, Service and Deployment.
    pub fn resource_name(&self) -> String {
        marin3r_wire::object_names::discovery_service(self.ds_name())
    }

    /// The Service of the xDS server: `marin3r-<ds>` (`serviceConfig.name` is ignored).
    pub fn service_name(&self) -> String {
        self.resource_name()
    }

    /// `<service>.<namespace>.svc`, the xDS host Envoys connect to.
    pub fn xds_host(&self, namespace: &str) -> String {
        format!("{}.{namespace}.svc", self.service_name())
    }

    /// Image of the discovery service: `spec.image`, else `default` (the operator's
    /// marin3r image, e.g. from `MARIN3R_IMAGE`).
    pub fn image<'a>(&'a self, default: &'a str) -> &'a str {
        crate::image_or(self.spec.image.as_deref(), default)
    }

    /// `spec.debug`, default false.
    pub fn debug(&self) -> bool {
        self.spec.debug.unwrap_or(false)
    }

    /// `spec.resources`, default `{}` (no requests, no limits).
    pub fn resources(&self) -> ResourceRequirements {
        self.spec.resources.clone().unwrap_or_default()
    }

    /// `spec.podSecurityContext`: fields set over the generated pod securityContext.
    pub fn pod_security_context(&self) -> Option<&PodSecurityContext> {
        self.spec.pod_security_context.as_ref()
    }

    /// `spec.securityContext`: fields set over the generated container securityContext.
    pub fn security_context(&self) -> Option<&SecurityContext> {
        self.spec.security_context.as_ref()
    }

    /// The CA certificate: `marin3r-ca-cert-<ds>`, CN `marin3r-ca-<ds>`, default
    /// 26280h.
    pub fn root_certificate_authority(&self) -> Result<CertificateOptions, Error> {
        let duration = self
            .spec
            .pki_config
            .as_ref()
            .map(|p| p.root_certificate_authority.duration.as_str())
            .unwrap_or(DEFAULT_CA_DURATION);
        Ok(CertificateOptions {
            secret_name: format!("{CA_CERTIFICATE_PREFIX}-{}", self.ds_name()),
            common_name: format!("{CA_COMMON_NAME_PREFIX}-{}", self.ds_name()),
            duration: certificate_lifetime(
                "spec.pkiConfg.rootCertificateAuthority.duration",
                duration,
            )?,
        })
    }

    /// The server certificate: `marin3r-server-cert-<ds>`, CN `marin3r-server-<ds>`,
    /// default 2160h.
    pub fn server_certificate(&self) -> Result<CertificateOptions, Error> {
        let duration = self
            .spec
            .pki_config
            .as_ref()
            .map(|p| p.server_certificate.duration.as_str())
            .unwrap_or(DEFAULT_SERVER_CERTIFICATE_DURATION);
        Ok(CertificateOptions {
            secret_name: format!("{SERVER_CERTIFICATE_PREFIX}-{}", self.ds_name()),
            common_name: format!("{SERVER_COMMON_NAME_PREFIX}-{}", self.ds_name()),
            duration: certificate_lifetime("spec.pkiConfg.serverCertificate.duration", duration)?,
        })
    }

    /// The namespace's sidecar client certificate: `envoy-sidecar-client-cert`, 48h.
    pub fn client_certificate(&self) -> CertificateOptions {
        CertificateOptions {
            secret_name: marin3r_wire::object_names::SIDECAR_CLIENT_CERTIFICATE.to_string(),
            common_name: marin3r_wire::object_names::SIDECAR_CLIENT_CERTIFICATE.to_string(),
            duration: Duration::from_secs(48 * 3600),
        }
    }

    /// `spec.xdsServerPort`, default 18000.
    pub fn xds_server_port(&self) -> Result<u16, Error> {
        self.spec
            .xds_server_port
            .map_or(Ok(marin3r_wire::ports::XDSS), |p| {
                crate::port("spec.xdsServerPort", p)
            })
    }

    /// `spec.metricsPort`, default 8383.
    pub fn metrics_port(&self) -> Result<u16, Error> {
        self.spec
            .metrics_port
            .map_or(Ok(marin3r_wire::ports::METRICS), |p| {
                crate::port("spec.metricsPort", p)
            })
    }

    /// `spec.probePort`, default 8384.
    pub fn probe_port(&self) -> Result<u16, Error> {
        self.spec
            .probe_port
            .map_or(Ok(marin3r_wire::ports::PROBES), |p| {
                crate::port("spec.probePort", p)
            })
    }

    /// `spec.podPriorityClass`, default [`marin3r_wire::object_names::DISCOVERY_SERVICE_PRIORITY_CLASS`]; `""`: none.
    pub fn pod_priority_class(&self) -> Option<&str> {
        let class = self
            .spec
            .pod_priority_class
            .as_deref()
            .unwrap_or(marin3r_wire::object_names::DISCOVERY_SERVICE_PRIORITY_CLASS);
        (!class.is_empty()).then_some(class)
    }

    /// `spec.replicas`, default [`DEFAULT_REPLICAS`]; at least 1.
    pub fn replicas(&self) -> Result<i32, Error> {
        match self.spec.replicas {
            None => Ok(DEFAULT_REPLICAS),
            Some(n) if n >= 1 => Ok(n),
            Some(n) => Err(Error::Invalid(vec![FieldError {
                path: "spec.replicas".into(),
                rule: Rule::Range,
                message: format!("{n} is less than 1"),
            }])),
        }
    }

    /// Fields the user set that this implementation ignores (upstream compatibility),
    /// as JSON paths, for a warning or a status condition: `pkiConfg.*.secretName` when
    /// it differs from the derived name, and `serviceConfig.name` / `serviceConfig.type`
    /// when they differ from `marin3r-<ds>` / `ClusterIP`.
    pub fn ignored_fields(&self) -> Vec<&'static str> {
        let mut ignored = Vec::new();
        if let Some(pki) = &self.spec.pki_config {
            if pki.root_certificate_authority.secret_name
                != format!("{CA_CERTIFICATE_PREFIX}-{}", self.ds_name())
            {
                ignored.push("spec.pkiConfg.rootCertificateAuthority.secretName");
            }
            if pki.server_certificate.secret_name
                != format!("{SERVER_CERTIFICATE_PREFIX}-{}", self.ds_name())
            {
                ignored.push("spec.pkiConfg.serverCertificate.secretName");
            }
        }
        if let Some(service) = &self.spec.service_config {
            if service
                .name
                .as_deref()
                .is_some_and(|n| n != self.service_name())
            {
                ignored.push("spec.serviceConfig.name");
            }
            if service.type_.as_deref().is_some_and(|t| t != "ClusterIP") {
                ignored.push("spec.serviceConfig.type");
            }
        }
        ignored
    }
}

impl DiscoveryService {
    /// Every problem of the DiscoveryService, or `Ok`: its name (every object generated
    /// for it is named `marin3r-<name>` or a longer prefix, and its Service name must be
    /// a DNS-1035 label: at most 55 characters, no dots) and its spec
    /// ([`DiscoveryServiceSpec::validate`]). The DiscoveryService controller and
    /// `marin3r operator render` call it before generating anything.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errors = Errors::default();
        errors.object_meta(&self.metadata);
        // A name that is no object name at all is reported once, above.
        if let Some(name) = self
            .metadata
            .name
            .as_deref()
            .filter(|n| marin3r_wire::is_dns1123_subdomain(n))
            && let Err(why) = marin3r_wire::dns1035_label(&self.service_name())
        {
            errors.push(
                "metadata.name",
                Rule::Format,
                format!(
                    "{name:?} gives the Service name {why} (a DiscoveryService name is at most {} lowercase letters, digits and '-')",
                    63 - marin3r_wire::object_names::discovery_service("").len()
                ),
            );
        }
        self.spec.check(&mut errors);
        errors.into_result()
    }
}

impl DiscoveryServiceSpec {
    /// Every problem of the spec (schema rules, durations, port collisions, resources,
    /// image), or `Ok`.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errors = Errors::default();
        self.check(&mut errors);
        errors.into_result()
    }

    fn check(&self, errors: &mut Errors) {
        errors.image("spec.image", self.image.as_deref());
        errors.resources("spec.resources", self.resources.as_ref());
        errors.security_contexts(
            self.pod_security_context.as_ref(),
            self.security_context.as_ref(),
        );
        if let Some(pki) = &self.pki_config {
            errors.certificate_lifetime(
                "spec.pkiConfg.rootCertificateAuthority.duration",
                Some(&pki.root_certificate_authority.duration),
            );
            errors.certificate_lifetime(
                "spec.pkiConfg.serverCertificate.duration",
                Some(&pki.server_certificate.duration),
            );
        }
        errors.port("spec.xdsServerPort", self.xds_server_port);
        errors.port("spec.metricsPort", self.metrics_port);
        errors.port("spec.probePort", self.probe_port);
        let xds = self
            .xds_server_port
            .unwrap_or(i32::from(marin3r_wire::ports::XDSS));
        let metrics = self
            .metrics_port
            .unwrap_or(i32::from(marin3r_wire::ports::METRICS));
        let probe = self
            .probe_port
            .unwrap_or(i32::from(marin3r_wire::ports::PROBES));
        // The container binds all three; the Service exposes xDS (and, when it is not
        // 18000, 18000 too as `discovery-default`) and metrics.
        errors.distinct_ports(&[
            ("spec.xdsServerPort", xds),
            ("spec.metricsPort", metrics),
            ("spec.probePort", probe),
        ]);
        let conventional = i32::from(marin3r_wire::ports::XDSS);
        if xds != conventional && metrics == conventional {
            errors.push(
                "spec.metricsPort",
                Rule::Unique,
                format!(
                    "port {metrics} is the Service's conventional xDS port (discovery-default) while xdsServerPort is {xds}"
                ),
            );
        }
        errors.at_least("spec.replicas", self.replicas.map(i64::from), 1);
        if let Some(class) = self.pod_priority_class.as_deref().filter(|c| !c.is_empty())
            && let Err(why) = marin3r_wire::dns1123_subdomain(class)
        {
            errors.push("spec.podPriorityClass", Rule::Format, why);
        }
        if let Some(t) = self
            .service_config
            .as_ref()
            .and_then(|s| s.type_.as_deref())
            && !SERVICE_TYPES.contains(&t)
        {
            errors.push(
                "spec.serviceConfig.type",
                Rule::Enum,
                format!("{t:?} is not one of {}", SERVICE_TYPES.join(", ")),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::FieldError;

    fn ds(spec: serde_json::Value) -> DiscoveryService {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryService",
            "metadata": {"name": "instance", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap()
    }

    // Mirrors upstream discoveryservice_types_test.go (operator-design.md §9.2).
    #[test]
    fn getters_default_like_upstream() {
        let ds = ds(serde_json::json!({}));
        assert_eq!(ds.resources(), ResourceRequirements::default());
        assert_eq!(
            ds.root_certificate_authority().unwrap(),
            CertificateOptions {
                secret_name: "marin3r-ca-cert-instance".into(),
                common_name: "marin3r-ca-instance".into(),
                duration: Duration::from_secs(26280 * 3600),
            }
        );
        assert_eq!(
            ds.server_certificate().unwrap(),
            CertificateOptions {
                secret_name: "marin3r-server-cert-instance".into(),
                common_name: "marin3r-server-instance".into(),
                duration: Duration::from_secs(2160 * 3600),
            }
        );
        assert_eq!(
            ds.client_certificate(),
            CertificateOptions {
                secret_name: "envoy-sidecar-client-cert".into(),
                common_name: "envoy-sidecar-client-cert".into(),
                duration: Duration::from_secs(48 * 3600),
            }
        );
        assert_eq!(ds.xds_server_port(), Ok(18000));
        assert_eq!(ds.metrics_port(), Ok(8383));
        assert_eq!(ds.probe_port(), Ok(8384));
        assert_eq!(ds.service_name(), "marin3r-instance");
        assert_eq!(ds.resource_name(), "marin3r-instance");
        assert_eq!(ds.xds_host("default"), "marin3r-instance.default.svc");
        assert_eq!(ds.image("quay.io/x/marin3r:v1"), "quay.io/x/marin3r:v1");
        assert!(!ds.debug());
        assert_eq!(ds.pod_priority_class(), Some("marin3r-discovery-service"));
        assert_eq!(ds.replicas(), Ok(3));
        assert!(ds.ignored_fields().is_empty());
        assert_eq!(ds.spec.validate(), Ok(()));
    }

    #[test]
    fn getters_use_the_spec() {
        let ds = ds(serde_json::json!({
            "image": "image",
            "debug": true,
            "resources": {"limits": {"cpu": "1"}},
            "pkiConfg": {
                "rootCertificateAuthority": {"secretName": "my-ca", "duration": "1h30m"},
                "serverCertificate": {"secretName": "marin3r-server-cert-instance", "duration": "1h"}
            },
            "xdsServerPort": 1000,
            "metricsPort": 1001,
            "probePort": 1002,
            "serviceConfig": {"name": "other", "type": "LoadBalancer"},
            "podPriorityClass": "highest",
            "replicas": 1
        }));
        assert_eq!(ds.image("default"), "image");
        assert!(ds.debug());
        assert!(ds.resources().limits.is_some());
        let ca = ds.root_certificate_authority().unwrap();
        // The secret name is ignored: names derive from the DS name only (Q2).
        assert_eq!(ca.secret_name, "marin3r-ca-cert-instance");
        assert_eq!(ca.duration, Duration::from_secs(5400));
        assert_eq!(
            ds.server_certificate().unwrap().duration,
            Duration::from_secs(3600)
        );
        assert_eq!(ds.xds_server_port(), Ok(1000));
        assert_eq!(ds.metrics_port(), Ok(1001));
        assert_eq!(ds.probe_port(), Ok(1002));
        assert_eq!(ds.service_name(), "marin3r-instance");
        assert_eq!(ds.pod_priority_class(), Some("highest"));
        assert_eq!(ds.replicas(), Ok(1));
        let mut none = ds.clone();
        none.spec.pod_priority_class = Some(String::new());
        assert_eq!(
            none.pod_priority_class(),
            None,
            "\"\" sets no priority class"
        );
        assert_eq!(
            ds.ignored_fields(),
            [
                "spec.pkiConfg.rootCertificateAuthority.secretName",
                "spec.serviceConfig.name",
                "spec.serviceConfig.type"
            ]
        );
        assert_eq!(ds.spec.validate(), Ok(()));
    }

    #[test]
    fn a_manifest_without_spec_decodes_with_defaults() {
        let ds: DiscoveryService = serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryService",
            "metadata": {"name": "discoveryservice", "namespace": "default"},
        }))
        .unwrap();
        assert_eq!(ds.spec, DiscoveryServiceSpec::default());
        assert_eq!(ds.service_name(), "marin3r-discoveryservice");
        let back = serde_json::to_value(&ds).unwrap();
        assert_eq!(back["apiVersion"], "operator.marin3r.3scale.net/v1alpha1");
        assert_eq!(back["kind"], "DiscoveryService");
        assert_eq!(back["spec"], serde_json::json!({}));
        assert!(back.get("status").is_none());
    }

    #[test]
    fn validate_reports_every_problem_with_its_path() {
        let ds = ds(serde_json::json!({
            "pkiConfg": {
                "rootCertificateAuthority": {"secretName": "a", "duration": "3y"},
                "serverCertificate": {"secretName": "b", "duration": "-1h"}
            },
            "xdsServerPort": 0,
            "metricsPort": 70000,
            "probePort": -1,
            "serviceConfig": {"type": "NodePort"},
            "replicas": 0
        }));
        let Err(Error::Invalid(errors)) = ds.spec.validate() else {
            panic!("expected errors");
        };
        let got: Vec<(&str, Rule)> = errors.iter().map(|e| (e.path.as_str(), e.rule)).collect();
        assert_eq!(
            got,
            [
                (
                    "spec.pkiConfg.rootCertificateAuthority.duration",
                    Rule::Duration
                ),
                ("spec.pkiConfg.serverCertificate.duration", Rule::Duration),
                ("spec.xdsServerPort", Rule::Range),
                ("spec.metricsPort", Rule::Range),
                ("spec.probePort", Rule::Range),
                ("spec.replicas", Rule::Range),
                ("spec.serviceConfig.type", Rule::Enum),
            ]
        );
        assert_eq!(
            errors[2],
            FieldError {
                path: "spec.xdsServerPort".into(),
                rule: Rule::Range,
                message: "port 0 is outside 1-65535".into()
            }
        );
        // The getters refuse what validate() reports, naming the field.
        assert_eq!(
            ds.metrics_port().unwrap_err().to_string(),
            "spec.metricsPort: port 70000 is outside 1-65535"
        );
        assert_eq!(
            ds.replicas().unwrap_err().to_string(),
            "spec.replicas: 0 is less than 1"
        );
        assert_eq!(
            ds.root_certificate_authority().unwrap_err().to_string(),
            "spec.pkiConfg.rootCertificateAuthority.duration: invalid duration \"3y\": unknown unit (use ns, us, ms, s, m or h)"
        );
    }

    fn named(name: &str, spec: serde_json::Value) -> DiscoveryService {
        let mut d = ds(spec);
        d.metadata.name = Some(name.to_string());
        d
    }

    fn problems(d: &DiscoveryService) -> Vec<(String, Rule)> {
        match d.validate() {
            Ok(()) => Vec::new(),
            Err(Error::Invalid(errors)) => errors.into_iter().map(|e| (e.path, e.rule)).collect(),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_name_whose_service_name_is_not_a_dns1035_label_is_refused() {
        let at_bound = "a".repeat(55);
        assert_eq!(named(&at_bound, serde_json::json!({})).validate(), Ok(()));
        for bad in ["a".repeat(56), "my.ds".to_string()] {
            let err = named(&bad, serde_json::json!({})).validate().unwrap_err();
            assert_eq!(
                problems(&named(&bad, serde_json::json!({}))),
                [("metadata.name".to_string(), Rule::Format)],
                "{bad}"
            );
            assert!(
                err.to_string().contains("at most 55 lowercase letters"),
                "{err}"
            );
        }
        // Names the API server refuses for the DiscoveryService itself.
        assert_eq!(
            problems(&named("", serde_json::json!({}))),
            [("metadata.name".to_string(), Rule::Required)]
        );
        let mut bad_ns = named("ds", serde_json::json!({}));
        bad_ns.metadata.namespace = Some("Not_A_Namespace".into());
        assert_eq!(
            problems(&bad_ns),
            [("metadata.namespace".to_string(), Rule::Format)]
        );
    }

    #[test]
    fn ports_that_collide_in_the_container_or_the_service_are_refused() {
        let cases = [
            (
                serde_json::json!({"xdsServerPort": 8383}),
                "spec.metricsPort",
                "port 8383 is already used by spec.xdsServerPort",
            ),
            (
                serde_json::json!({"xdsServerPort": 19000, "metricsPort": 18000}),
                "spec.metricsPort",
                "port 18000 is the Service's conventional xDS port (discovery-default) while xdsServerPort is 19000",
            ),
            (
                serde_json::json!({"probePort": 8383}),
                "spec.probePort",
                "port 8383 is already used by spec.metricsPort",
            ),
            (
                serde_json::json!({"probePort": 18000}),
                "spec.probePort",
                "port 18000 is already used by spec.xdsServerPort",
            ),
        ];
        for (spec, path, message) in cases {
            let Err(Error::Invalid(errors)) = ds(spec.clone()).validate() else {
                panic!("{spec} accepted");
            };
            assert_eq!(
                errors,
                [FieldError {
                    path: path.into(),
                    rule: Rule::Unique,
                    message: message.into()
                }],
                "{spec}"
            );
        }
        // The probe port is not in the Service: 18000 is free for it when xDS moved.
        assert_eq!(
            ds(serde_json::json!({"xdsServerPort": 19000, "probePort": 18000})).validate(),
            Ok(())
        );
    }

    #[test]
    fn certificate_lifetimes_are_bounded() {
        let pki = |ca: &str, server: &str| {
            ds(serde_json::json!({"pkiConfg": {
                "rootCertificateAuthority": {"secretName": "a", "duration": ca},
                "serverCertificate": {"secretName": "b", "duration": server}}}))
        };
        for ok in ["1h", "60m", "876000h"] {
            assert_eq!(pki(ok, ok).validate(), Ok(()), "{ok}");
        }
        for bad in ["0s", "1s", "59m59s", "876001h", "2562047h"] {
            let d = pki(bad, bad);
            assert_eq!(
                problems(&d),
                [
                    (
                        "spec.pkiConfg.rootCertificateAuthority.duration".to_string(),
                        Rule::Range
                    ),
                    (
                        "spec.pkiConfg.serverCertificate.duration".to_string(),
                        Rule::Range
                    ),
                ],
                "{bad}"
            );
            // The getters the generator calls refuse them too.
            assert!(d.root_certificate_authority().is_err(), "{bad}");
            assert!(d.server_certificate().is_err(), "{bad}");
        }
        assert_eq!(
            pki("1s", "1h")
                .root_certificate_authority()
                .unwrap_err()
                .to_string(),
            "spec.pkiConfg.rootCertificateAuthority.duration: certificate lifetime \"1s\" is shorter than the minimum 1h"
        );
    }

    #[test]
    fn resources_image_and_priority_class_are_checked() {
        let d = ds(serde_json::json!({
            "image": "quay.io/x/marin3r :v1",
            "resources": {"requests": {"memory": "lots", "cpu": "2"}, "limits": {"cpu": "1"}},
            "podPriorityClass": "Not a class"
        }));
        assert_eq!(
            problems(&d),
            [
                ("spec.image".to_string(), Rule::Format),
                ("spec.resources.requests.memory".to_string(), Rule::Format),
                ("spec.resources.requests.cpu".to_string(), Rule::Order),
                ("spec.podPriorityClass".to_string(), Rule::Format),
            ]
        );
    }
}
