//! EnvoyDeployment (operator-design.md §2.3): a Deployment of Envoys that take their
//! configuration from an EnvoyConfig through a DiscoveryService of the same namespace.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscalerBehavior, MetricSpec};
use k8s_openapi::api::core::v1::{
    Affinity, PodSecurityContext, ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::validate::{Errors, Rule, certificate_lifetime};
use marin3r_sidecar::annotations::DrainStrategy;

/// Default client certificate validity (`spec.duration`).
pub const DEFAULT_CLIENT_CERTIFICATE_DURATION: &str = "48h";
/// Default static replicas.
pub const DEFAULT_REPLICAS: i32 = 1;
/// Default drain time in seconds (also the pod's termination grace period).
pub const DEFAULT_DRAIN_TIME: i64 = 300;
/// The container port names `ports[].name` may not take: the generator adds `admin`.
pub const RESERVED_PORT_NAMES: [&str; 1] = ["admin"];
/// The protocols `ports[].protocol` accepts.
pub const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

const REPLICAS_MESSAGE: &str =
    "only one of 'spec.replicas.static' or 'spec.replicas.dynamic' is allowed";
const EXTRA_VOLUME_MESSAGE: &str =
    "exactly one of 'secret' or 'configMap' is required in an extra volume";
const PDB_MESSAGE: &str = "only one of 'spec.podDisruptionBudget.minAvailable' or \
     'spec.podDisruptionBudget.maxUnavailable' is allowed";

/// Desired state of an EnvoyDeployment.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.marin3r.3scale.net",
    version = "v1alpha1",
    kind = "EnvoyDeployment",
    plural = "envoydeployments",
    namespaced,
    status = "EnvoyDeploymentStatus",
    derive = "PartialEq",
    doc = "EnvoyDeployment runs a Deployment of Envoy proxies configured by an EnvoyConfig \
           through the namespace's DiscoveryService.",
    printcolumn = r#"{"name": "Replicas", "type": "integer", "jsonPath": ".status.deploymentStatus.replicas"}"#,
    printcolumn = r#"{"name": "Ready", "type": "integer", "jsonPath": ".status.deploymentStatus.readyReplicas"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyDeploymentSpec {
    /// The EnvoyConfig (same namespace) whose node id the Envoys use.
    pub envoy_config_ref: String,
    /// The DiscoveryService (same namespace) the Envoys connect to.
    pub discovery_service_ref: String,
    /// Envoy's `--service-cluster` (default: the EnvoyConfig's node id).
    #[serde(rename = "clusterID", default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// Ports of the Envoy container (names unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
    /// Envoy image (default `envoyproxy/envoy:v1.40.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Compute resources of the Envoy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Validity of the client certificate as a Go duration (default `48h`).
    #[serde(rename = "duration", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::go_duration")]
    pub client_certificate_duration: Option<String>,
    /// Extra arguments appended to Envoy's command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_args: Option<Vec<String>>,
    /// Envoy admin port (default 9901).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::port")]
    pub admin_port: Option<i32>,
    /// Envoy admin access log path (default `/dev/null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access_log_path: Option<String>,
    /// Replicas: `static` (default `{static: 1}`) or `dynamic` (an HPA), not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicasSpec>,
    /// Liveness probe timings (default 30/1/10/1/10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ProbeSpec>,
    /// Readiness probe timings (default 15/1/5/1/1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ProbeSpec>,
    /// Pod affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// A PodDisruptionBudget (`minAvailable` or `maxUnavailable`, not both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<PodDisruptionBudgetSpec>,
    /// Drain Envoy before a pod stops; presence enables the shutdown manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_manager: Option<ShutdownManager>,
    /// The init container that writes Envoy's bootstrap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_manager: Option<InitManager>,
    /// Secrets and ConfigMaps (same namespace) mounted read-only into the Envoy
    /// container, for files Envoy reads itself (SDS file paths, `DataSource` filenames).
    /// At most 16; mount paths absolute, normalised, distinct, not nested in one another
    /// and clear of `/etc/envoy/bootstrap`, `/etc/envoy/tls/client`, `/dev`, `/proc` and
    /// `/sys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub extra_volumes: Option<Vec<ExtraVolume>>,
    /// Pod-level securityContext fields set over the generated ones on the Envoy pods
    /// (`runAsNonRoot: true`, `seccompProfile: RuntimeDefault`). Each field given
    /// replaces the generated one; the others stay. For a policy that needs something
    /// else, e.g. `fsGroup` or a fixed `runAsUser` under a custom OpenShift SCC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// Container-level securityContext fields set over the generated ones on every
    /// container of the pod (Envoy, the init manager, the shutdown manager:
    /// `runAsNonRoot`, no privilege escalation, `drop: [ALL]`, `readOnlyRootFilesystem`,
    /// `seccompProfile: RuntimeDefault`, and `runAsUser`: the first UID of the
    /// namespace's `openshift.io/sa.scc.uid-range` when it has one, else Envoy 101 and
    /// the managers 65532 with the same `runAsGroup`). Each field given replaces the
    /// generated one; the others stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

/// An extra volume of the Envoy container: `secret` or `configMap`, not both.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.secret) != has(self.configMap)",
    "message": EXTRA_VOLUME_MESSAGE
}]))]
pub struct ExtraVolume {
    /// A Secret to mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ExtraSecretVolume>,
    /// A ConfigMap to mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ExtraConfigMapVolume>,
    /// Absolute path in the Envoy container (mounted read-only).
    pub mount_path: String,
}

/// `extraVolumes[].secret`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraSecretVolume {
    /// The Secret's name.
    pub secret_name: String,
}

/// `extraVolumes[].configMap`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ExtraConfigMapVolume {
    /// The ConfigMap's name.
    pub name: String,
}

/// A port of the Envoy container.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ContainerPort {
    /// Port name (an IANA service name, unique).
    pub name: String,
    /// Port number.
    #[schemars(schema_with = "crate::schema::port")]
    pub port: i32,
    /// TCP (the default), UDP or SCTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "TCP"))]
    pub protocol: Option<String>,
}

/// `replicas`: `static` or `dynamic`, not both.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicasSpec {
    /// A fixed number of replicas.
    #[serde(rename = "static", default, skip_serializing_if = "Option::is_none")]
    pub static_: Option<i32>,
    /// A HorizontalPodAutoscaler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicReplicasSpec>,
}

/// `replicas.dynamic`: the HorizontalPodAutoscaler's settings.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DynamicReplicasSpec {
    /// Lower limit of replicas (HPA default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    /// Upper limit of replicas.
    pub max_replicas: i32,
    /// The HPA metrics (HPA default: 80% average CPU utilisation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Vec<MetricSpec>>,
    /// The HPA scaling behaviour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
}

/// Probe timings; the handler is `GET /ready` on the admin port.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// Seconds after start before the first probe.
    pub initial_delay_seconds: i32,
    /// Seconds before a probe times out.
    pub timeout_seconds: i32,
    /// Seconds between probes.
    pub period_seconds: i32,
    /// Consecutive successes to count as passing.
    pub success_threshold: i32,
    /// Consecutive failures to count as failing.
    pub failure_threshold: i32,
}

/// Default liveness probe: 30/1/10/1/10.
pub const DEFAULT_LIVENESS_PROBE: ProbeSpec = ProbeSpec {
    initial_delay_seconds: 30,
    timeout_seconds: 1,
    period_seconds: 10,
    success_threshold: 1,
    failure_threshold: 10,
};

/// Default readiness probe: 15/1/5/1/1.
pub const DEFAULT_READINESS_PROBE: ProbeSpec = ProbeSpec {
    initial_delay_seconds: 15,
    timeout_seconds: 1,
    period_seconds: 5,
    success_threshold: 1,
    failure_threshold: 1,
};

/// `podDisruptionBudget`: `minAvailable` or `maxUnavailable`, not both; `{}` means no PDB.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetSpec {
    /// Pods that must stay available (a number or a percentage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    /// Pods that may be unavailable (a number or a percentage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

impl PodDisruptionBudgetSpec {
    /// `{}`: no PodDisruptionBudget is created.
    pub fn is_empty(&self) -> bool {
        self.min_available.is_none() && self.max_unavailable.is_none()
    }
}

/// `shutdownManager`: its presence adds the shutdown manager container.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownManager {
    /// Image (default: the operator's marin3r image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Port of the shutdown manager (default 8090).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::port")]
    pub server_port: Option<i32>,
    /// Seconds to drain (default 300; also the termination grace period).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_time: Option<i64>,
    /// `gradual` (default) or `immediate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_strategy: Option<DrainStrategy>,
}

/// `initManager`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct InitManager {
    /// Image (default: the operator's marin3r image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Observed state of an EnvoyDeployment.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyDeploymentStatus {
    /// Name of the Envoy Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_name: Option<String>,
    /// A copy of the Deployment's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_status: Option<DeploymentStatus>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (reasons such as `DiscoveryServiceNotFound`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The replica mode, with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub enum Replicas<'a> {
    /// A fixed count (the Deployment's `spec.replicas`).
    Static(i32),
    /// An HPA owns the count.
    Dynamic(&'a DynamicReplicasSpec),
}

impl EnvoyDeployment {
    fn ed_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `marin3r-envoydeployment-<ed>`: the Deployment, HPA and PDB.
    pub fn deployment_name(&self) -> String {
        format!("marin3r-envoydeployment-{}", self.ed_name())
    }

    /// `envoy-client-cert-<ed>`: the client certificate DSC and Secret.
    pub fn client_certificate_name(&self) -> String {
        format!("envoy-client-cert-{}", self.ed_name())
    }

    /// Every problem of the EnvoyDeployment, or `Ok`: its name (the value of the label
    /// `app.kubernetes.io/instance` of every object generated for it: at most 63
    /// characters) and its spec ([`EnvoyDeploymentSpec::validate`]). The EnvoyDeployment
    /// webhook, its controller and `marin3r operator render` all call it.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errors = Errors::default();
        errors.object_meta(&self.metadata);
        let name = self.ed_name();
        // A name that is no object name at all is reported once, above.
        if marin3r_wire::is_dns1123_subdomain(name)
            && let Err(why) = marin3r_wire::label_value(name)
        {
            errors.push(
                "metadata.name",
                Rule::Format,
                format!("the label app.kubernetes.io/instance of the generated objects takes the name, and {why}"),
            );
        }
        self.spec.check(&mut errors);
        errors.into_result()
    }
}

impl EnvoyDeploymentSpec {
    /// Envoy image: `spec.image`, else `default` (the operator passes the Envoy image
    /// sidecar injection uses, design.md §1.2 / operator-design.md §5.4, not upstream's
    /// v1.29.0).
    pub fn image<'a>(&'a self, default: &'a str) -> &'a str {
        crate::image_or(self.image.as_deref(), default)
    }

    /// `spec.clusterID`, else the EnvoyConfig's node id.
    pub fn cluster_id<'a>(&'a self, node_id: &'a str) -> &'a str {
        self.cluster_id
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(node_id)
    }

    /// `spec.ports`, in order.
    pub fn ports(&self) -> &[ContainerPort] {
        self.ports.as_deref().unwrap_or_default()
    }

    /// `spec.resources`, default `{}`.
    pub fn resources(&self) -> ResourceRequirements {
        self.resources.clone().unwrap_or_default()
    }

    /// `spec.duration`, default 48h.
    pub fn client_certificate_duration(&self) -> Result<Duration, Error> {
        certificate_lifetime(
            "spec.duration",
            self.client_certificate_duration
                .as_deref()
                .unwrap_or(DEFAULT_CLIENT_CERTIFICATE_DURATION),
        )
    }

    /// `spec.extraArgs`.
    pub fn extra_args(&self) -> &[String] {
        self.extra_args.as_deref().unwrap_or_default()
    }

    /// `spec.adminPort`, default 9901.
    pub fn admin_port(&self) -> Result<u16, Error> {
        self.admin_port
            .map_or(Ok(marin3r_wire::ports::ENVOY_ADMIN), |p| {
                crate::port("spec.adminPort", p)
            })
    }

    /// `spec.adminAccessLogPath`, default `/dev/null`.
    pub fn admin_access_log_path(&self) -> &str {
        self.admin_access_log_path
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(marin3r_wire::paths::ENVOY_ADMIN_ACCESS_LOG)
    }

    /// The replica mode: `static` wins if both are set (which validation rejects);
    /// neither means `{static: 1}`.
    pub fn replicas(&self) -> Replicas<'_> {
        match &self.replicas {
            Some(ReplicasSpec {
                static_: Some(n), ..
            }) => Replicas::Static(*n),
            Some(ReplicasSpec {
                dynamic: Some(d), ..
            }) => Replicas::Dynamic(d),
            _ => Replicas::Static(DEFAULT_REPLICAS),
        }
    }

    /// `spec.livenessProbe`, default 30/1/10/1/10.
    pub fn liveness_probe(&self) -> ProbeSpec {
        self.liveness_probe.unwrap_or(DEFAULT_LIVENESS_PROBE)
    }

    /// `spec.readinessProbe`, default 15/1/5/1/1.
    pub fn readiness_probe(&self) -> ProbeSpec {
        self.readiness_probe.unwrap_or(DEFAULT_READINESS_PROBE)
    }

    /// `spec.affinity`.
    pub fn affinity(&self) -> Option<&Affinity> {
        self.affinity.as_ref()
    }

    /// `spec.podSecurityContext`: fields set over the generated pod securityContext.
    pub fn pod_security_context(&self) -> Option<&PodSecurityContext> {
        self.pod_security_context.as_ref()
    }

    /// `spec.securityContext`: fields set over the generated containers' securityContext.
    pub fn security_context(&self) -> Option<&SecurityContext> {
        self.security_context.as_ref()
    }

    /// `spec.podDisruptionBudget`, default `{}` (no PDB).
    pub fn pod_disruption_budget(&self) -> PodDisruptionBudgetSpec {
        self.pod_disruption_budget.clone().unwrap_or_default()
    }

    /// `spec.shutdownManager`; `None` means no shutdown manager.
    pub fn shutdown_manager(&self) -> Option<&ShutdownManager> {
        self.shutdown_manager.as_ref()
    }

    /// The init manager image: `initManager.image`, else `default` (the operator's
    /// marin3r image).
    pub fn init_manager_image<'a>(&'a self, default: &'a str) -> &'a str {
        crate::image_or(
            self.init_manager.as_ref().and_then(|i| i.image.as_deref()),
            default,
        )
    }

    /// `spec.extraVolumes`, checked and named as sidecar injection checks and names its
    /// extra volume annotations ([`marin3r_sidecar::extra_volumes::check`]).
    pub fn extra_volumes(&self) -> Result<Vec<marin3r_sidecar::extra_volumes::ExtraVolume>, Error> {
        let mut errors = Errors::default();
        let volumes = self.check_extra_volumes(&mut errors);
        errors.into_result().map(|()| volumes)
    }

    /// [`EnvoyDeploymentSpec::extra_volumes`], its problems pushed onto `errors` with
    /// their paths (`spec.extraVolumes[i]...`).
    fn check_extra_volumes(
        &self,
        errors: &mut Errors,
    ) -> Vec<marin3r_sidecar::extra_volumes::ExtraVolume> {
        use marin3r_sidecar::extra_volumes::{self as extra, Field, Request, Source};
        let entries = self.extra_volumes.as_deref().unwrap_or_default();
        // (index in spec.extraVolumes, request): entries with exactly one source.
        let mut requests: Vec<(usize, Request<'_>)> = Vec::new();
        for (i, v) in entries.iter().enumerate() {
            let (source, object_name) = match (&v.secret, &v.config_map) {
                (Some(s), None) => (Source::Secret, s.secret_name.as_str()),
                (None, Some(c)) => (Source::ConfigMap, c.name.as_str()),
                _ => {
                    errors.push(
                        format!("spec.extraVolumes[{i}]"),
                        Rule::ExactlyOne,
                        EXTRA_VOLUME_MESSAGE,
                    );
                    continue;
                }
            };
            requests.push((
                i,
                Request {
                    source,
                    object_name,
                    mount_path: &v.mount_path,
                },
            ));
        }
        if entries.len() > extra::MAX_EXTRA_VOLUMES && requests.len() <= extra::MAX_EXTRA_VOLUMES {
            errors.push(
                "spec.extraVolumes",
                Rule::Range,
                format!(
                    "{} extra volumes; at most {}",
                    entries.len(),
                    extra::MAX_EXTRA_VOLUMES
                ),
            );
        }
        let only: Vec<Request<'_>> = requests.iter().map(|(_, r)| *r).collect();
        match extra::check(&only) {
            Ok(volumes) => volumes,
            Err(problems) => {
                for p in problems {
                    let at = requests.get(p.index).map_or(0, |(i, _)| *i);
                    let source = requests.get(p.index).map(|(_, r)| r.source);
                    let path = match (p.field, source) {
                        (Field::List, _) => "spec.extraVolumes".to_string(),
                        (Field::ObjectName, Some(Source::ConfigMap)) => {
                            format!("spec.extraVolumes[{at}].configMap.name")
                        }
                        (Field::ObjectName, _) => {
                            format!("spec.extraVolumes[{at}].secret.secretName")
                        }
                        (Field::MountPath, _) => format!("spec.extraVolumes[{at}].mountPath"),
                    };
                    let rule = match p.rule {
                        extra::Rule::Format => Rule::Format,
                        extra::Rule::Unique => Rule::Unique,
                        extra::Rule::Count => Rule::Range,
                    };
                    errors.push(path, rule, p.message);
                }
                Vec::new()
            }
        }
    }

    /// Every problem of the spec, or `Ok`: the schema's rules (with the upstream
    /// webhook's messages for `replicas` and `podDisruptionBudget`) plus durations,
    /// port names and port clashes that would make the Deployment invalid.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errors = Errors::default();
        self.check(&mut errors);
        errors.into_result()
    }

    fn check(&self, errors: &mut Errors) {
        for (path, reference) in [
            ("spec.envoyConfigRef", &self.envoy_config_ref),
            ("spec.discoveryServiceRef", &self.discovery_service_ref),
        ] {
            errors.non_empty(path, reference);
            if !reference.trim().is_empty()
                && let Err(why) = marin3r_wire::dns1123_subdomain(reference)
            {
                errors.push(path, Rule::Format, why);
            }
        }
        errors.image("spec.image", self.image.as_deref());
        errors.resources("spec.resources", self.resources.as_ref());
        errors.security_contexts(
            self.pod_security_context.as_ref(),
            self.security_context.as_ref(),
        );
        let mut names: Vec<&str> = Vec::new();
        let mut numbers: Vec<(i32, &str)> = Vec::new();
        for (i, p) in self.ports().iter().enumerate() {
            let path = format!("spec.ports[{i}]");
            if let Err(why) = marin3r_wire::port_name(&p.name) {
                errors.push(format!("{path}.name"), Rule::Format, why);
            } else if RESERVED_PORT_NAMES.contains(&p.name.as_str()) {
                errors.push(
                    format!("{path}.name"),
                    Rule::Unique,
                    format!("port name {:?} is reserved for Envoy's admin port", p.name),
                );
            } else if names.contains(&p.name.as_str()) {
                errors.push(
                    format!("{path}.name"),
                    Rule::Unique,
                    format!("duplicate port name {:?}", p.name),
                );
            }
            names.push(&p.name);
            errors.port(format!("{path}.port"), Some(p.port));
            if let Some(proto) = p.protocol.as_deref()
                && !PROTOCOLS.contains(&proto)
            {
                errors.push(
                    format!("{path}.protocol"),
                    Rule::Enum,
                    format!("{proto:?} is not one of {}", PROTOCOLS.join(", ")),
                );
            }
            // One container may not declare one port and protocol twice.
            let protocol = p.protocol.as_deref().unwrap_or("TCP");
            if let Some(first) = numbers
                .iter()
                .position(|(n, proto)| *n == p.port && *proto == protocol)
            {
                errors.push(
                    format!("{path}.port"),
                    Rule::Unique,
                    format!(
                        "port {} ({protocol}) is already used by spec.ports[{first}]",
                        p.port
                    ),
                );
            }
            numbers.push((p.port, protocol));
        }
        errors.certificate_lifetime("spec.duration", self.client_certificate_duration.as_deref());
        errors.port("spec.adminPort", self.admin_port);
        let admin = self
            .admin_port
            .unwrap_or(i32::from(marin3r_wire::ports::ENVOY_ADMIN));
        for (i, p) in self.ports().iter().enumerate() {
            if p.port == admin {
                errors.push(
                    format!("spec.ports[{i}].port"),
                    Rule::Unique,
                    format!("port {} is Envoy's admin port", p.port),
                );
            }
        }
        if let Some(r) = &self.replicas {
            if r.static_.is_some() && r.dynamic.is_some() {
                errors.push("spec.replicas", Rule::MutuallyExclusive, REPLICAS_MESSAGE);
            }
            errors.at_least("spec.replicas.static", r.static_.map(i64::from), 0);
            if let Some(d) = &r.dynamic {
                // The HPA API refuses minReplicas 0 (scale to zero is an alpha gate).
                errors.at_least(
                    "spec.replicas.dynamic.minReplicas",
                    d.min_replicas.map(i64::from),
                    1,
                );
                errors.at_least(
                    "spec.replicas.dynamic.maxReplicas",
                    Some(i64::from(d.max_replicas)),
                    1,
                );
                if d.min_replicas.is_some_and(|min| min > d.max_replicas) {
                    errors.push(
                        "spec.replicas.dynamic",
                        Rule::Order,
                        "minReplicas must not be greater than maxReplicas",
                    );
                }
            }
        }
        for (field, probe) in [
            ("livenessProbe", &self.liveness_probe),
            ("readinessProbe", &self.readiness_probe),
        ] {
            let Some(p) = probe else { continue };
            for (name, value) in [
                ("initialDelaySeconds", p.initial_delay_seconds),
                ("timeoutSeconds", p.timeout_seconds),
                ("periodSeconds", p.period_seconds),
                ("successThreshold", p.success_threshold),
                ("failureThreshold", p.failure_threshold),
            ] {
                errors.at_least(format!("spec.{field}.{name}"), Some(i64::from(value)), 0);
            }
            // Kubernetes: liveness (and startup) probes must have successThreshold 1
            // (0 is defaulted to 1).
            if field == "livenessProbe" && p.success_threshold > 1 {
                errors.push(
                    "spec.livenessProbe.successThreshold",
                    Rule::Range,
                    format!(
                        "{} must be 1: Kubernetes requires successThreshold 1 for liveness probes",
                        p.success_threshold
                    ),
                );
            }
        }
        if let Some(pdb) = &self.pod_disruption_budget {
            if pdb.min_available.is_some() && pdb.max_unavailable.is_some() {
                errors.push(
                    "spec.podDisruptionBudget",
                    Rule::MutuallyExclusive,
                    PDB_MESSAGE,
                );
            }
            errors.int_or_percent(
                "spec.podDisruptionBudget.minAvailable",
                pdb.min_available.as_ref(),
            );
            errors.int_or_percent(
                "spec.podDisruptionBudget.maxUnavailable",
                pdb.max_unavailable.as_ref(),
            );
        }
        if let Some(sm) = &self.shutdown_manager {
            errors.image("spec.shutdownManager.image", sm.image.as_deref());
            errors.port("spec.shutdownManager.serverPort", sm.server_port);
            errors.at_least("spec.shutdownManager.drainTime", sm.drain_time, 0);
            let port = sm
                .server_port
                .unwrap_or(i32::from(marin3r_wire::ports::SHUTDOWN_MANAGER));
            if port == admin || self.ports().iter().any(|p| p.port == port) {
                errors.push(
                    "spec.shutdownManager.serverPort",
                    Rule::Unique,
                    format!("port {port} is already used by Envoy"),
                );
            }
        }
        errors.image(
            "spec.initManager.image",
            self.init_manager.as_ref().and_then(|i| i.image.as_deref()),
        );
        self.check_extra_volumes(errors);
    }
}

impl ShutdownManager {
    /// Image: `image`, else `default` (the operator's marin3r image).
    pub fn image<'a>(&'a self, default: &'a str) -> &'a str {
        crate::image_or(self.image.as_deref(), default)
    }

    /// `serverPort`, default 8090 (honoured, unlike upstream: operator-design.md §8 Q4).
    pub fn server_port(&self) -> Result<u16, Error> {
        self.server_port
            .map_or(Ok(marin3r_wire::ports::SHUTDOWN_MANAGER), |p| {
                crate::port("spec.shutdownManager.serverPort", p)
            })
    }

    /// `drainTime` in seconds, default 300 (negative values count as 0).
    pub fn drain_time(&self) -> i64 {
        self.drain_time.unwrap_or(DEFAULT_DRAIN_TIME).max(0)
    }

    /// `drainStrategy`, default gradual.
    pub fn drain_strategy(&self) -> DrainStrategy {
        self.drain_strategy.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::FieldError;

    const DEFAULT_ENVOY_IMAGE: &str = "envoyproxy/envoy:v1.40.0";

    fn ed(spec: serde_json::Value) -> EnvoyDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyDeployment",
            "metadata": {"name": "instance", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn minimal() -> EnvoyDeployment {
        ed(serde_json::json!({"envoyConfigRef": "config", "discoveryServiceRef": "ds"}))
    }

    // Mirrors upstream envoydeployment_types_test.go (operator-design.md §9.2), with our
    // Envoy image (v1.40.0, operator-design.md §5.4 [R]).
    #[test]
    fn getters_default_like_upstream() {
        let ed = minimal();
        let s = &ed.spec;
        assert_eq!(s.image(DEFAULT_ENVOY_IMAGE), "envoyproxy/envoy:v1.40.0");
        assert_eq!(s.resources(), ResourceRequirements::default());
        assert_eq!(
            s.client_certificate_duration(),
            Ok(Duration::from_secs(48 * 3600))
        );
        assert_eq!(s.admin_port(), Ok(9901));
        assert_eq!(s.admin_access_log_path(), "/dev/null");
        assert_eq!(s.replicas(), Replicas::Static(1));
        assert_eq!(
            s.liveness_probe(),
            ProbeSpec {
                initial_delay_seconds: 30,
                timeout_seconds: 1,
                period_seconds: 10,
                success_threshold: 1,
                failure_threshold: 10
            }
        );
        assert_eq!(
            s.readiness_probe(),
            ProbeSpec {
                initial_delay_seconds: 15,
                timeout_seconds: 1,
                period_seconds: 5,
                success_threshold: 1,
                failure_threshold: 1
            }
        );
        assert_eq!(s.affinity(), None);
        assert_eq!(
            s.pod_disruption_budget(),
            PodDisruptionBudgetSpec::default()
        );
        assert!(s.pod_disruption_budget().is_empty());
        assert_eq!(s.shutdown_manager(), None);
        assert_eq!(s.init_manager_image("marin3r:test"), "marin3r:test");
        assert_eq!(s.cluster_id("node"), "node");
        assert!(s.ports().is_empty());
        assert!(s.extra_args().is_empty());
        assert_eq!(ed.deployment_name(), "marin3r-envoydeployment-instance");
        assert_eq!(ed.client_certificate_name(), "envoy-client-cert-instance");
        assert_eq!(s.validate(), Ok(()));

        let sm = ShutdownManager::default();
        assert_eq!(sm.image("marin3r:test"), "marin3r:test");
        assert_eq!(sm.server_port(), Ok(8090));
        assert_eq!(sm.drain_time(), 300);
        assert_eq!(sm.drain_strategy(), DrainStrategy::Gradual);
    }

    #[test]
    fn security_context_overrides_the_api_server_would_refuse_are_named() {
        let spec = |extra: serde_json::Value| {
            let mut s = serde_json::json!({"envoyConfigRef": "c", "discoveryServiceRef": "d"});
            for (k, v) in extra.as_object().unwrap() {
                s[k] = v.clone();
            }
            ed(s)
        };
        let ok = spec(serde_json::json!({
            "podSecurityContext": {"fsGroup": 2000, "runAsUser": 0},
            "securityContext": {"runAsUser": 2147483647, "privileged": true, "allowPrivilegeEscalation": true},
        }));
        assert_eq!(ok.validate(), Ok(()));
        let bad = spec(serde_json::json!({
            "podSecurityContext": {"fsGroup": -1, "supplementalGroups": [1, 2147483648_i64]},
            "securityContext": {"runAsUser": -5, "privileged": true,
                                "capabilities": {"add": ["CAP_SYS_ADMIN"]}},
        }));
        let text = bad.validate().unwrap_err().to_string();
        for want in [
            "spec.podSecurityContext.fsGroup",
            "spec.podSecurityContext.supplementalGroups[1]",
            "spec.securityContext.runAsUser",
            "spec.securityContext.privileged",
            "spec.securityContext.capabilities.add",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
    }

    #[test]
    fn getters_use_the_spec() {
        let ed = ed(serde_json::json!({
            "envoyConfigRef": "config",
            "discoveryServiceRef": "ds",
            "clusterID": "cluster",
            "image": "envoy:custom",
            "duration": "1h30m",
            "extraArgs": ["--log-level", "debug"],
            "adminPort": 9902,
            "adminAccessLogPath": "/dev/stdout",
            "livenessProbe": {"initialDelaySeconds": 1, "timeoutSeconds": 2, "periodSeconds": 3, "successThreshold": 1, "failureThreshold": 5},
            "affinity": {"nodeAffinity": {}},
            "podDisruptionBudget": {"maxUnavailable": "25%"},
            "shutdownManager": {"image": "sm", "serverPort": 8091, "drainTime": 60, "drainStrategy": "immediate"},
            "initManager": {"image": "im"}
        }));
        let s = &ed.spec;
        assert_eq!(s.image(DEFAULT_ENVOY_IMAGE), "envoy:custom");
        assert_eq!(s.cluster_id("node"), "cluster");
        assert_eq!(
            s.client_certificate_duration(),
            Ok(Duration::from_secs(5400))
        );
        assert_eq!(s.extra_args(), ["--log-level", "debug"]);
        assert_eq!(s.admin_port(), Ok(9902));
        assert_eq!(s.admin_access_log_path(), "/dev/stdout");
        assert_eq!(s.liveness_probe().initial_delay_seconds, 1);
        assert_eq!(s.readiness_probe(), DEFAULT_READINESS_PROBE);
        assert!(s.affinity().is_some());
        assert_eq!(
            s.pod_disruption_budget().max_unavailable,
            Some(IntOrString::String("25%".into()))
        );
        let sm = s.shutdown_manager().unwrap();
        assert_eq!(sm.image("default"), "sm");
        assert_eq!(sm.server_port(), Ok(8091));
        assert_eq!(sm.drain_time(), 60);
        assert_eq!(sm.drain_strategy(), DrainStrategy::Immediate);
        assert_eq!(s.init_manager_image("default"), "im");
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn replicas_static_dynamic_and_precedence() {
        let dynamic = serde_json::json!({"minReplicas": 2, "maxReplicas": 4,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]});
        let d = ed(
            serde_json::json!({"envoyConfigRef": "c", "discoveryServiceRef": "d",
            "replicas": {"dynamic": dynamic}}),
        );
        let Replicas::Dynamic(spec) = d.spec.replicas() else {
            panic!("dynamic expected")
        };
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 4));
        assert_eq!(spec.metrics.as_ref().map(Vec::len), Some(1));

        let s = ed(
            serde_json::json!({"envoyConfigRef": "c", "discoveryServiceRef": "d",
            "replicas": {"static": 0}}),
        );
        assert_eq!(s.spec.replicas(), Replicas::Static(0));

        // "Static replicas takes precedence" (validation rejects both, though).
        let both = ed(
            serde_json::json!({"envoyConfigRef": "c", "discoveryServiceRef": "d",
            "replicas": {"static": 3, "dynamic": {"maxReplicas": 4}}}),
        );
        assert_eq!(both.spec.replicas(), Replicas::Static(3));
        assert_eq!(
            both.spec.validate().unwrap_err().to_string(),
            "spec.replicas: only one of 'spec.replicas.static' or 'spec.replicas.dynamic' is allowed"
        );
    }

    #[test]
    fn validate_has_the_upstream_webhook_messages() {
        let pdb = ed(
            serde_json::json!({"envoyConfigRef": "c", "discoveryServiceRef": "d",
            "podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": "10%"}}),
        );
        assert_eq!(
            pdb.spec.validate(),
            Err(Error::Invalid(vec![FieldError {
                path: "spec.podDisruptionBudget".into(),
                rule: Rule::MutuallyExclusive,
                message: "only one of 'spec.podDisruptionBudget.minAvailable' or 'spec.podDisruptionBudget.maxUnavailable' is allowed".into()
            }]))
        );
    }

    #[test]
    fn validate_reports_every_problem_with_its_path() {
        let bad = ed(serde_json::json!({
            "envoyConfigRef": "",
            "discoveryServiceRef": "ds",
            "ports": [
                {"name": "http", "port": 8080},
                {"name": "http", "port": 0},
                {"name": "Bad_Name", "port": 9901, "protocol": "HTTP"},
                {"name": "admin", "port": 8090}
            ],
            "duration": "2d",
            "adminPort": 65536,
            "replicas": {"static": -1, "dynamic": {"minReplicas": 5, "maxReplicas": 0}},
            "readinessProbe": {"initialDelaySeconds": -1, "timeoutSeconds": 1, "periodSeconds": 1, "successThreshold": 1, "failureThreshold": 1},
            "podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1},
            "shutdownManager": {"serverPort": 70000, "drainTime": -5}
        }));
        let Err(Error::Invalid(errors)) = bad.spec.validate() else {
            panic!("expected errors")
        };
        let got: Vec<(&str, Rule)> = errors.iter().map(|e| (e.path.as_str(), e.rule)).collect();
        assert_eq!(
            got,
            [
                ("spec.envoyConfigRef", Rule::Required),
                ("spec.ports[1].name", Rule::Unique),
                ("spec.ports[1].port", Rule::Range),
                ("spec.ports[2].name", Rule::Format),
                ("spec.ports[2].protocol", Rule::Enum),
                ("spec.ports[3].name", Rule::Unique),
                ("spec.duration", Rule::Duration),
                ("spec.adminPort", Rule::Range),
                ("spec.replicas", Rule::MutuallyExclusive),
                ("spec.replicas.static", Rule::Range),
                ("spec.replicas.dynamic.maxReplicas", Rule::Range),
                ("spec.replicas.dynamic", Rule::Order),
                ("spec.readinessProbe.initialDelaySeconds", Rule::Range),
                ("spec.podDisruptionBudget", Rule::MutuallyExclusive),
                ("spec.shutdownManager.serverPort", Rule::Range),
                ("spec.shutdownManager.drainTime", Rule::Range),
            ]
        );
        assert_eq!(
            errors[3].message,
            "port name \"Bad_Name\" must contain only lowercase letters, digits and '-'"
        );
        assert_eq!(
            bad.spec.admin_port().unwrap_err().to_string(),
            "spec.adminPort: port 65536 is outside 1-65535"
        );
        assert_eq!(
            bad.spec
                .client_certificate_duration()
                .unwrap_err()
                .to_string(),
            "spec.duration: invalid duration \"2d\": unknown unit (use ns, us, ms, s, m or h)"
        );
    }

    #[test]
    fn validate_reports_port_clashes() {
        let clash = ed(serde_json::json!({
            "envoyConfigRef": "c", "discoveryServiceRef": "d",
            "ports": [{"name": "http", "port": 9901}, {"name": "https", "port": 8090}],
            "shutdownManager": {}
        }));
        let Err(Error::Invalid(errors)) = clash.spec.validate() else {
            panic!("expected errors")
        };
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "spec.ports[0].port: port 9901 is Envoy's admin port",
                "spec.shutdownManager.serverPort: port 8090 is already used by Envoy",
            ]
        );
    }

    #[test]
    fn iana_service_names() {
        for ok in ["http", "https-8443", "a1", "abcdefghijklmno"] {
            assert_eq!(marin3r_wire::port_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "abcdefghijklmnop",
            "HTTP",
            "123",
            "-a",
            "a-",
            "a--b",
            "a_b",
        ] {
            assert!(marin3r_wire::port_name(bad).is_err(), "{bad}");
        }
    }

    /// `(path, rule)` of every problem of `minimal()` with `extra` merged into its spec.
    fn problems_with(extra: serde_json::Value) -> Vec<(String, Rule)> {
        let mut spec = serde_json::json!({"envoyConfigRef": "config", "discoveryServiceRef": "ds"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        match ed(spec).validate() {
            Ok(()) => Vec::new(),
            Err(Error::Invalid(errors)) => errors.into_iter().map(|e| (e.path, e.rule)).collect(),
            Err(other) => panic!("{other:?}"),
        }
    }

    fn one(path: &str, rule: Rule) -> Vec<(String, Rule)> {
        vec![(path.to_string(), rule)]
    }

    #[test]
    fn a_name_longer_than_a_label_value_is_refused() {
        let mut e = minimal();
        for ok in ["a".repeat(63), "my.gateway".to_string()] {
            e.metadata.name = Some(ok.clone());
            assert_eq!(e.validate(), Ok(()), "{ok}");
        }
        e.metadata.name = Some("a".repeat(64));
        let Err(Error::Invalid(errors)) = e.validate() else {
            panic!("64 characters accepted")
        };
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, "metadata.name");
        assert!(
            errors[0].message.contains("app.kubernetes.io/instance"),
            "{}",
            errors[0].message
        );
        e.metadata.name = None;
        assert_eq!(
            e.validate().unwrap_err().to_string(),
            "metadata.name: must not be empty"
        );
    }

    #[test]
    fn hpa_min_replicas_must_be_at_least_one() {
        assert_eq!(
            problems_with(
                serde_json::json!({"replicas": {"dynamic": {"minReplicas": 0, "maxReplicas": 2}}})
            ),
            one("spec.replicas.dynamic.minReplicas", Rule::Range)
        );
        assert!(
            problems_with(
                serde_json::json!({"replicas": {"dynamic": {"minReplicas": 1, "maxReplicas": 2}}})
            )
            .is_empty()
        );
    }

    #[test]
    fn a_liveness_probe_needs_success_threshold_one() {
        let probe = |t: i32| {
            serde_json::json!({"initialDelaySeconds": 1, "timeoutSeconds": 1,
            "periodSeconds": 1, "successThreshold": t, "failureThreshold": 1})
        };
        assert_eq!(
            problems_with(serde_json::json!({"livenessProbe": probe(3)})),
            one("spec.livenessProbe.successThreshold", Rule::Range)
        );
        assert!(problems_with(serde_json::json!({"livenessProbe": probe(1)})).is_empty());
        // Readiness probes may ask for several successes.
        assert!(problems_with(serde_json::json!({"readinessProbe": probe(3)})).is_empty());
    }

    #[test]
    fn quantities_must_be_valid_non_negative_and_requests_within_limits() {
        for (resources, path, rule) in [
            (
                serde_json::json!({"limits": {"memory": "lots"}}),
                "spec.resources.limits.memory",
                Rule::Format,
            ),
            (
                serde_json::json!({"requests": {"memory": "-1Gi"}}),
                "spec.resources.requests.memory",
                Rule::Format,
            ),
            (
                serde_json::json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}),
                "spec.resources.requests.cpu",
                Rule::Order,
            ),
            (
                serde_json::json!({"limits": {"gpu": "1"}}),
                "spec.resources.limits.gpu",
                Rule::Format,
            ),
        ] {
            assert_eq!(
                problems_with(serde_json::json!({"resources": resources})),
                one(path, rule),
                "{resources}"
            );
        }
        assert!(problems_with(serde_json::json!({"resources": {
            "requests": {"cpu": "100m", "memory": "1Gi", "example.com/gpu": "1", "hugepages-2Mi": "0"},
            "limits": {"memory": "1073741824", "ephemeral-storage": "-0"}}})).is_empty());
    }

    #[test]
    fn budgets_are_integers_from_zero_or_percentages_up_to_100() {
        for (pdb, path, rule) in [
            (
                serde_json::json!({"minAvailable": "1000%"}),
                "spec.podDisruptionBudget.minAvailable",
                Rule::Range,
            ),
            (
                serde_json::json!({"maxUnavailable": -1}),
                "spec.podDisruptionBudget.maxUnavailable",
                Rule::Range,
            ),
            (
                serde_json::json!({"maxUnavailable": "half"}),
                "spec.podDisruptionBudget.maxUnavailable",
                Rule::Format,
            ),
            (
                serde_json::json!({"minAvailable": "-5%"}),
                "spec.podDisruptionBudget.minAvailable",
                Rule::Format,
            ),
            (
                serde_json::json!({"minAvailable": "%"}),
                "spec.podDisruptionBudget.minAvailable",
                Rule::Format,
            ),
        ] {
            assert_eq!(
                problems_with(serde_json::json!({"podDisruptionBudget": pdb})),
                one(path, rule),
                "{pdb}"
            );
        }
        for ok in [
            serde_json::json!({"minAvailable": 0}),
            serde_json::json!({"maxUnavailable": "100%"}),
            serde_json::json!({"maxUnavailable": "0%"}),
            serde_json::json!({"minAvailable": "0100%"}),
        ] {
            assert!(
                problems_with(serde_json::json!({"podDisruptionBudget": ok})).is_empty(),
                "{ok}"
            );
        }
    }

    #[test]
    fn every_image_reference_is_checked() {
        assert_eq!(
            problems_with(serde_json::json!({
                "image": "envoyproxy/envoy: v1",
                "shutdownManager": {"image": "bad image"},
                "initManager": {"image": " "}
            })),
            [
                ("spec.image".to_string(), Rule::Format),
                ("spec.shutdownManager.image".to_string(), Rule::Format),
                ("spec.initManager.image".to_string(), Rule::Format),
            ]
        );
        // Empty means the operator's default image.
        assert!(
            problems_with(serde_json::json!({"image": "", "initManager": {"image": ""}}))
                .is_empty()
        );
    }

    #[test]
    fn a_port_and_protocol_declared_twice_is_refused() {
        assert_eq!(
            problems_with(serde_json::json!({"ports": [
                {"name": "http", "port": 8080}, {"name": "http2", "port": 8080, "protocol": "TCP"}]})),
            one("spec.ports[1].port", Rule::Unique)
        );
        assert!(
            problems_with(serde_json::json!({"ports": [
            {"name": "dns", "port": 8053}, {"name": "dns-udp", "port": 8053, "protocol": "UDP"}]}))
            .is_empty()
        );
    }

    #[test]
    fn the_client_certificate_lifetime_is_bounded() {
        for bad in ["0s", "1s", "2562047h"] {
            assert_eq!(
                problems_with(serde_json::json!({"duration": bad})),
                one("spec.duration", Rule::Range),
                "{bad}"
            );
            let mut e = minimal();
            e.spec.client_certificate_duration = Some(bad.into());
            assert!(e.spec.client_certificate_duration().is_err(), "{bad}");
        }
        assert!(problems_with(serde_json::json!({"duration": "1h"})).is_empty());
    }

    #[test]
    fn references_must_be_object_names() {
        assert_eq!(
            problems_with(serde_json::json!({"discoveryServiceRef": "My DS"})),
            one("spec.discoveryServiceRef", Rule::Format)
        );
    }

    #[test]
    fn extra_volumes_follow_the_sidecar_annotations_rule() {
        use marin3r_sidecar::extra_volumes::Source;
        let spec = serde_json::json!({"extraVolumes": [
            {"secret": {"secretName": "oauth-token"}, "mountPath": "/etc/envoy/oauth/token"},
            {"configMap": {"name": "lua"}, "mountPath": "/etc/envoy/lua"},
        ]});
        assert_eq!(problems_with(spec.clone()), []);
        let mut full = serde_json::json!({"envoyConfigRef": "config", "discoveryServiceRef": "ds"});
        full["extraVolumes"] = spec["extraVolumes"].clone();
        let volumes = ed(full).spec.extra_volumes().unwrap();
        let got: Vec<(Source, &str, &str, &str)> = volumes
            .iter()
            .map(|v| {
                (
                    v.source,
                    v.object_name.as_str(),
                    v.mount_path.as_str(),
                    v.volume_name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    Source::Secret,
                    "oauth-token",
                    "/etc/envoy/oauth/token",
                    "envoy-extra-secret-0"
                ),
                (
                    Source::ConfigMap,
                    "lua",
                    "/etc/envoy/lua",
                    "envoy-extra-configmap-0"
                ),
            ]
        );
        assert_eq!(minimal().spec.extra_volumes(), Ok(Vec::new()));

        assert_eq!(
            problems_with(serde_json::json!({"extraVolumes": [
                {"mountPath": "/a"},
                {"secret": {"secretName": "s"}, "configMap": {"name": "c"}, "mountPath": "/b"},
                {"secret": {"secretName": "Bad"}, "mountPath": "/etc/envoy/bootstrap/x"},
                {"configMap": {"name": "c"}, "mountPath": "relative"},
                {"configMap": {"name": "c"}, "mountPath": "/x"},
                {"secret": {"secretName": "s"}, "mountPath": "/x/y"},
            ]})),
            [
                ("spec.extraVolumes[0]".to_string(), Rule::ExactlyOne),
                ("spec.extraVolumes[1]".to_string(), Rule::ExactlyOne),
                (
                    "spec.extraVolumes[2].secret.secretName".to_string(),
                    Rule::Format
                ),
                ("spec.extraVolumes[2].mountPath".to_string(), Rule::Format),
                ("spec.extraVolumes[3].mountPath".to_string(), Rule::Format),
                ("spec.extraVolumes[5].mountPath".to_string(), Rule::Unique),
            ]
        );
        let many: Vec<serde_json::Value> = (0..17)
            .map(|i| serde_json::json!({"secret": {"secretName": "s"}, "mountPath": format!("/x/{i}")}))
            .collect();
        assert_eq!(
            problems_with(serde_json::json!({ "extraVolumes": many })),
            one("spec.extraVolumes", Rule::Range)
        );
    }
}
