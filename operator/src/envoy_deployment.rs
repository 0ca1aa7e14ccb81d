//! What the EnvoyDeployment controller applies for an EnvoyDeployment `<ed>`
//! (operator-design.md §5.3, with the [R] decisions of §5.4, §5.5 and §8): the client
//! certificate `envoy-client-cert-<ed>`, the Deployment `marin3r-envoydeployment-<ed>`,
//! and its HorizontalPodAutoscaler (`replicas.dynamic`) and PodDisruptionBudget when
//! asked for.
//!
//! The pod is built by **the same container generator as sidecar injection**
//! ([`marin3r_sidecar::generate`]): the init manager, the `envoy` container and, with
//! `shutdownManager`, the shutdown manager, fed from the EnvoyDeployment, its
//! EnvoyConfig (node id) and its DiscoveryService (xDS host and port). What only an
//! EnvoyDeployment has is then set on what the generator made: its probe timings and
//! `resources`. Differences from upstream, on purpose:
//! - `shutdownManager.serverPort` is honoured and the shutdown manager is given Envoy's
//!   admin address, so draining works with any `adminPort` (Q4);
//! - every container passes Pod Security `restricted` and OpenShift's restricted-v2
//!   (the injection's securityContext; the user is the first UID of the namespace's
//!   `openshift.io/sa.scc.uid-range` when it has one, else Envoy 101 and the managers
//!   65532), with `podSecurityContext` / `securityContext` fields set over it;
//! - the pod does not mount a ServiceAccount token (Envoy never calls the API server);
//! - with `replicas.dynamic` the Deployment's `replicas` is left out of what is applied,
//!   so the HPA owns it, and the HPA's `behavior` is applied too (§5.5 [R]).

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec,
};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, Probe, SecretReference};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_operator_api::discoveryservicecertificate::{CaSigned, CertificateRenewal, Signer};
use marin3r_operator_api::envoydeployment::{ProbeSpec, Replicas};
use marin3r_operator_api::{
    DiscoveryService, DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec, EnvoyDeployment,
};
use marin3r_sidecar::annotations::{PortSpec, Protocol, Resources, ShutdownManager, SidecarConfig};
use marin3r_sidecar::{RunAs, generate};

use super::Images;
use super::objects::{ENVOY_DEPLOYMENT_COMPONENT, labels, metadata};
use super::security::{overlay, pod_security_context};
use crate::Error;

/// Name of the Envoy container.
pub const ENVOY_CONTAINER: &str = "envoy";
/// Name of the bootstrap emptyDir volume.
pub const CONFIG_VOLUME: &str = "envoy-bootstrap";
/// Name of the client certificate volume.
pub const TLS_VOLUME: &str = "envoy-tls";
/// Termination grace period without a shutdown manager (Kubernetes' default).
pub const DEFAULT_GRACE_PERIOD: i64 = 30;

/// Everything applied for one EnvoyDeployment, in apply order.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvoyDeploymentObjects {
    pub client_certificate: DiscoveryServiceCertificate,
    /// Created only once the client certificate is ready (the controller's gate);
    /// updated whatever its state.
    pub deployment: Deployment,
    /// `Some` with `replicas.dynamic`; `None` means an existing one is deleted.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// `Some` when `podDisruptionBudget` is not `{}`; `None` means an existing one is
    /// deleted.
    pub pdb: Option<PodDisruptionBudget>,
}

/// Generates every object of `ed` in `namespace`, for its DiscoveryService `ds` and
/// EnvoyConfig `ec`. `uid_range` is the namespace's `openshift.io/sa.scc.uid-range`
/// annotation (`None` without one): when it has one, every container runs as its first
/// UID ([`RunAs::of_uid_range`]), which OpenShift's restricted-v2 admits. Fails only on
/// an EnvoyDeployment or DiscoveryService that does not validate
/// ([`EnvoyDeployment::validate`]), naming the field.
pub fn generate(
    ed: &EnvoyDeployment,
    ds: &DiscoveryService,
    ec: &EnvoyConfig,
    namespace: &str,
    uid_range: Option<&str>,
    images: &Images,
) -> Result<EnvoyDeploymentObjects, Error> {
    let name = ed.metadata.name.clone().unwrap_or_default();
    let invalid = |source| Error::InvalidSpec {
        kind: "EnvoyDeployment",
        name: name.clone(),
        source,
    };
    // The one check of an EnvoyDeployment (the webhook's and render's too), and of the
    // DiscoveryService it points the Envoys at.
    ed.validate().map_err(invalid)?;
    ds.validate().map_err(|source| Error::InvalidSpec {
        kind: "DiscoveryService",
        name: ds.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    let spec = &ed.spec;
    let labels = labels(ENVOY_DEPLOYMENT_COMPONENT, &name);
    let deployment_name = ed.deployment_name();
    let certificate_name = ed.client_certificate_name();

    let ca = ds
        .root_certificate_authority()
        .map_err(|source| Error::InvalidSpec {
            kind: "DiscoveryService",
            name: ds.metadata.name.clone().unwrap_or_default(),
            source,
        })?;
    let xds_port = ds.xds_server_port().map_err(|source| Error::InvalidSpec {
        kind: "DiscoveryService",
        name: ds.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    let validity = spec.client_certificate_duration().map_err(invalid)?;
    let client_certificate = DiscoveryServiceCertificate {
        metadata: metadata(&certificate_name, namespace, labels.clone(), ed),
        spec: DiscoveryServiceCertificateSpec {
            common_name: certificate_name.clone(),
            server: Some(false),
            is_ca: Some(false),
            valid_for: i64::try_from(validity.as_secs()).unwrap_or(i64::MAX),
            hosts: Some(vec![certificate_name.clone()]),
            signer: Signer {
                ca_signed: Some(CaSigned {
                    ca_secret_ref: SecretReference {
                        name: Some(ca.secret_name),
                        namespace: Some(namespace.to_string()),
                    },
                }),
                ..Signer::default()
            },
            secret_ref: SecretReference {
                name: Some(certificate_name.clone()),
                namespace: Some(namespace.to_string()),
            },
            certificate_renewal: Some(CertificateRenewal { enabled: true }),
        },
        status: None,
    };

    let node_id = ec.spec.node_id.clone();
    let admin_port = spec.admin_port().map_err(invalid)?;
    let shutdown_manager = match spec.shutdown_manager() {
        None => None,
        Some(sm) => Some(ShutdownManager {
            port: sm.server_port().map_err(invalid)?,
            image: sm.image(&images.marin3r).to_string(),
            extra_lifecycle_hooks: Vec::new(),
            drain_time_seconds: sm.drain_time(),
            drain_strategy: sm.drain_strategy(),
        }),
    };
    let ports = spec
        .ports()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(PortSpec {
                name: p.name.clone(),
                port: marin3r_operator_api::port(&format!("spec.ports[{i}].port"), p.port)
                    .map_err(invalid)?,
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => Protocol::Udp,
                    Some("SCTP") => Protocol::Sctp,
                    _ => Protocol::Tcp,
                },
                host_port: None,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let cfg = SidecarConfig {
        cluster_id: spec.cluster_id(&node_id).to_string(),
        node_id,
        container_name: ENVOY_CONTAINER.to_string(),
        envoy_image: spec.image(&images.envoy).to_string(),
        ports,
        extra_args: spec.extra_args().to_vec(),
        config_volume: CONFIG_VOLUME.to_string(),
        tls_volume: TLS_VOLUME.to_string(),
        client_certificate: certificate_name,
        xdss_host: ds.xds_host(namespace),
        xdss_port: xds_port,
        admin_port,
        // Probes come from the kubelet, on the pod's IP.
        admin_bind_address: std::net::Ipv4Addr::UNSPECIFIED.into(),
        admin_access_log_path: spec.admin_access_log_path().to_string(),
        resources: Resources::default(),
        shutdown_manager: shutdown_manager.clone(),
        init_manager_image: spec.init_manager_image(&images.marin3r).to_string(),
        native_sidecar: false,
        extra_volumes: spec.extra_volumes().map_err(invalid)?,
        run_as: RunAs::of_uid_range(uid_range),
    };

    let mut envoy = generate::envoy_container(&cfg);
    envoy.resources = Some(spec.resources());
    set_probe(&mut envoy.liveness_probe, spec.liveness_probe());
    set_probe(&mut envoy.readiness_probe, spec.readiness_probe());
    let mut containers: Vec<Container> = vec![envoy];
    if let Some(sm) = &shutdown_manager {
        containers.push(generate::shutdown_manager_container(&cfg, sm));
    }
    let mut init_manager = generate::init_manager_container(&cfg);
    // The EnvoyDeployment's own securityContext fields, over every container's.
    for c in containers.iter_mut().chain([&mut init_manager]) {
        c.security_context = c
            .security_context
            .take()
            .map(|sc| overlay(sc, spec.security_context()));
    }
    let grace_period = shutdown_manager
        .as_ref()
        .map_or(DEFAULT_GRACE_PERIOD, |sm| sm.drain_time_seconds);
    let pod = PodSpec {
        init_containers: Some(vec![init_manager]),
        containers,
        volumes: Some(generate::volumes(&cfg)),
        affinity: spec.affinity().cloned(),
        termination_grace_period_seconds: Some(grace_period),
        automount_service_account_token: Some(false),
        security_context: Some(pod_security_context(spec.pod_security_context())),
        ..PodSpec::default()
    };

    let replicas = spec.replicas();
    let deployment = Deployment {
        metadata: metadata(&deployment_name, namespace, labels.clone(), ed),
        spec: DeploymentSpec {
            // Dynamic: left out, so that the HPA owns it (server-side apply).
            replicas: match replicas {
                Replicas::Static(n) => Some(n),
                Replicas::Dynamic(_) => None,
            },
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::String("25%".into())),
                    max_unavailable: Some(IntOrString::String("25%".into())),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    };

    let hpa = match replicas {
        Replicas::Static(_) => None,
        Replicas::Dynamic(dynamic) => Some(HorizontalPodAutoscaler {
            metadata: metadata(&deployment_name, namespace, labels.clone(), ed),
            spec: HorizontalPodAutoscalerSpec {
                scale_target_ref: CrossVersionObjectReference {
                    api_version: Some("apps/v1".into()),
                    kind: "Deployment".into(),
                    name: deployment_name.clone(),
                },
                min_replicas: dynamic.min_replicas,
                max_replicas: dynamic.max_replicas,
                metrics: dynamic.metrics.clone(),
                behavior: dynamic.behavior.clone(),
            },
            status: None,
        }),
    };

    let budget = spec.pod_disruption_budget();
    let pdb = (!budget.is_empty()).then(|| PodDisruptionBudget {
        metadata: metadata(&deployment_name, namespace, labels.clone(), ed),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            }),
            // Validation refuses both; were both set, minAvailable wins (as upstream).
            min_available: budget.min_available.clone(),
            max_unavailable: if budget.min_available.is_some() {
                None
            } else {
                budget.max_unavailable.clone()
            },
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    });

    Ok(EnvoyDeploymentObjects {
        client_certificate,
        deployment,
        hpa,
        pdb,
    })
}

/// Sets the timings of a generated probe (its handler, `GET /ready` on the admin port,
/// stays the generator's).
fn set_probe(probe: &mut Option<Probe>, timings: ProbeSpec) {
    if let Some(p) = probe {
        p.initial_delay_seconds = Some(timings.initial_delay_seconds);
        p.timeout_seconds = Some(timings.timeout_seconds);
        p.period_seconds = Some(timings.period_seconds);
        p.success_threshold = Some(timings.success_threshold);
        p.failure_threshold = Some(timings.failure_threshold);
    }
}
