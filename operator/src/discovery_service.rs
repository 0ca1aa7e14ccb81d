//! What the DiscoveryService controller applies for a DiscoveryService `<ds>` in a
//! namespace (operator-design.md §3.3, with the [R] decisions of §6 and §8): its PKI as
//! three DiscoveryServiceCertificates, the ServiceAccount, Role and RoleBinding
//! `marin3r-<ds>`, the Service `marin3r-<ds>`, the discovery-service Deployment
//! `marin3r-<ds>` and, with several replicas, its PodDisruptionBudget `marin3r-<ds>`.
//!
//! Replicas (`spec.replicas`, default 3; `docs/ha.md` §6, the same settings as
//! `manifests/discovery-service`): with more than one, the discovery service runs with
//! `--leader-elect --discovery-service-name=<ds>` (every replica serves, the holder of
//! the Lease `marin3r-<ds>-leader` writes), rolls with `maxSurge: 1, maxUnavailable: 0`
//! and `minReadySeconds: 10`, its Role adds the Lease and replica-report rules
//! ([`marin3r_kube::rbac::DISCOVERY_SERVICE_HA`]) and a PodDisruptionBudget
//! (`maxUnavailable: 1`, unhealthy pods always evictable) keeps evictions one at a time.
//! With 1 it is the single replica it always was: `Recreate`, no Lease, no PDB. Either
//! way the pods spread over nodes (required) and zones (preferred), get `POD_NAME`,
//! `POD_UID` and `POD_NAMESPACE` from the downward API, a readiness probe every 2 s, a
//! 30 s termination grace (drain delay 5 s + drain time 5 s + the wait for connections
//! 10 s + 2 s, `marin3r_control_plane::shutdown_grace`) and the PriorityClass
//! `marin3r-discovery-service` unless `spec.podPriorityClass` says otherwise.
//!
//! Differences from upstream, on purpose:
//! - the server certificate's SANs are the Service's DNS names (Q8), and every
//!   certificate has an ECDSA P-256 key, a backdated `notBefore` and, for clients,
//!   `clientAuth` (`marin3r_certs::lifecycle`);
//! - the Role is exactly what Kubernetes mode needs (the one table
//!   [`marin3r_kube::rbac::DISCOVERY_SERVICE`], also behind `manifests/discovery-service/role.yaml`), not
//!   `marin3r.3scale.net/*: *` (Q14);
//! - the Deployment runs our `discovery-service` with the flags it has, mounts only the
//!   CA's trust bundle (`ca.crt`), never the CA key, and carries no certificate-hash
//!   label: the discovery service re-reads renewed certificates, so a renewal or a CA
//!   rotation restarts nothing (Q5). Upstream ran one replica with `Recreate`; ours
//!   defaults to 3 (above);
//! - the Service exposes the xDS port as `discovery` on `xdsServerPort` and, when that
//!   is not 18000, also on 18000 (`discovery-default`), the port sidecars dial by
//!   convention (`marin3r-<ds>.<namespace>.svc:18000`, §6 [R] item 1);
//! - `pkiConfg.*.secretName` and `serviceConfig` are accepted and ignored: every name
//!   derives from the DiscoveryService's (Q2, Q3).

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector,
    PodSpec, PodTemplateSpec, Probe, SecretReference, SecretVolumeSource, Service, ServiceAccount,
    ServicePort, ServiceSpec, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use marin3r_operator_api::discoveryservice::CertificateOptions;
use marin3r_operator_api::discoveryservicecertificate::{
    CaSigned, CertificateRenewal, SelfSigned, Signer,
};
use marin3r_operator_api::{
    DiscoveryService, DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec,
};

use marin3r_wire::http_paths;
use marin3r_wire::ports::XDSS_NAME;
use marin3r_wire::secret_keys::CA_CRT;

use marin3r_sidecar::run_as::restricted_security_context;

use super::Images;
use super::objects::{DISCOVERY_SERVICE_COMPONENT, labels, metadata};
use super::security::{overlay, pod_security_context};
use crate::Error;

/// Mode of the Secret volumes: read-only for any user (the pod sets no user and no
/// `fsGroup`, which OpenShift's restricted-v2 would refuse unless in its range).
pub const SECRET_MODE: i32 = 0o444;
/// The pods' termination grace: the discovery service's own shutdown bound with the
/// default drain flags (5 s + 5 s + 10 s + 2 s = 22 s,
/// `marin3r_control_plane::shutdown_grace`) plus a margin.
pub const TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// How long a new replica must stay ready before the rollout goes on (several replicas).
pub const MIN_READY_SECONDS: i32 = 10;
/// Period of the readiness probe: a replica that stops is out of the endpoints fast.
pub const READINESS_PERIOD_SECONDS: i32 = 2;

/// Everything applied for one DiscoveryService, in apply order.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveryServiceObjects {
    pub ca: DiscoveryServiceCertificate,
    pub server: DiscoveryServiceCertificate,
    pub client: DiscoveryServiceCertificate,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub service: Service,
    /// Applied only once the server certificate's Secret exists (the controller's
    /// gate); never deleted because an input is missing.
    pub deployment: Deployment,
    /// `Some` with several replicas; `None` means an existing one is deleted.
    pub pdb: Option<PodDisruptionBudget>,
}

/// The DNS names of the discovery service's Service in `namespace`: the server
/// certificate's SANs (Q8).
pub fn server_hosts(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Generates every object of `ds` in `namespace`. Fails only on a DiscoveryService that
/// does not validate ([`DiscoveryService::validate`]), naming the field.
pub fn generate(
    ds: &DiscoveryService,
    namespace: &str,
    images: &Images,
) -> Result<DiscoveryServiceObjects, Error> {
    let invalid = |source| Error::InvalidSpec {
        kind: "DiscoveryService",
        name: ds.metadata.name.clone().unwrap_or_default(),
        source,
    };
    // The one check of a DiscoveryService (names, ports, quantities, lifetimes): nothing
    // is generated from one the API server would refuse an object of.
    ds.validate().map_err(invalid)?;
    let instance = ds.metadata.name.clone().unwrap_or_default();
    let name = ds.resource_name();
    let labels = labels(DISCOVERY_SERVICE_COMPONENT, &instance);
    let meta = |object_name: &str| metadata(object_name, namespace, labels.clone(), ds);

    let replicas = ds.replicas().map_err(invalid)?;
    let ha = replicas > 1;
    let ca_options = ds.root_certificate_authority().map_err(invalid)?;
    let server_options = ds.server_certificate().map_err(invalid)?;
    let client_options = ds.client_certificate();
    let ca_signed = Signer {
        ca_signed: Some(CaSigned {
            ca_secret_ref: SecretReference {
                name: Some(ca_options.secret_name.clone()),
                namespace: Some(namespace.to_string()),
            },
        }),
        ..Signer::default()
    };
    let certificate = |options: &CertificateOptions,
                       hosts: Vec<String>,
                       is_ca: bool,
                       server: bool,
                       signer: Signer| DiscoveryServiceCertificate {
        metadata: meta(&options.secret_name),
        spec: DiscoveryServiceCertificateSpec {
            common_name: options.common_name.clone(),
            server: Some(server),
            is_ca: Some(is_ca),
            valid_for: i64::try_from(options.duration.as_secs()).unwrap_or(i64::MAX),
            hosts: Some(hosts),
            signer,
            secret_ref: SecretReference {
                name: Some(options.secret_name.clone()),
                namespace: Some(namespace.to_string()),
            },
            certificate_renewal: Some(CertificateRenewal { enabled: true }),
        },
        status: None,
    };
    let ca = certificate(
        &ca_options,
        vec![ca_options.common_name.clone()],
        true,
        false,
        Signer {
            self_signed: Some(SelfSigned {}),
            ..Signer::default()
        },
    );
    let server = certificate(
        &server_options,
        server_hosts(&ds.service_name(), namespace),
        false,
        true,
        ca_signed.clone(),
    );
    let client = certificate(
        &client_options,
        vec![client_options.common_name.clone()],
        false,
        false,
        ca_signed,
    );

    let service_account = ServiceAccount {
        metadata: meta(&name),
        // The discovery service talks to the API server with this account's token.
        ..ServiceAccount::default()
    };
    let role = Role {
        metadata: meta(&name),
        rules: Some(role_rules(&instance, ha)),
    };
    let role_binding = RoleBinding {
        metadata: meta(&name),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.clone(),
            namespace: Some(namespace.to_string()),
            ..Subject::default()
        }]),
    };

    let xds_port = ds.xds_server_port().map_err(invalid)?;
    let metrics_port = ds.metrics_port().map_err(invalid)?;
    let probe_port = ds.probe_port().map_err(invalid)?;
    let service_port = |port_name: &str, port: u16, target: &str| ServicePort {
        name: Some(port_name.to_string()),
        port: i32::from(port),
        target_port: Some(IntOrString::String(target.to_string())),
        protocol: Some("TCP".into()),
        app_protocol: (target == XDSS_NAME).then(|| "grpc".to_string()),
        ..ServicePort::default()
    };
    let mut ports = vec![service_port(XDSS_NAME, xds_port, XDSS_NAME)];
    if xds_port != marin3r_wire::ports::XDSS {
        ports.push(service_port(
            "discovery-default",
            marin3r_wire::ports::XDSS,
            XDSS_NAME,
        ));
    }
    ports.push(service_port("metrics", metrics_port, "metrics"));
    let service = Service {
        metadata: meta(&ds.service_name()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(labels.clone()),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    };

    let deployment = Deployment {
        metadata: meta(&name),
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            strategy: Some(if ha {
                DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(IntOrString::Int(1)),
                        max_unavailable: Some(IntOrString::Int(0)),
                    }),
                }
            } else {
                DeploymentStrategy {
                    type_: Some("Recreate".into()),
                    rolling_update: None,
                }
            }),
            min_ready_seconds: ha.then_some(MIN_READY_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(
                    ds,
                    namespace,
                    images,
                    ha,
                    (xds_port, metrics_port, probe_port),
                    (&server_options.secret_name, &ca_options.secret_name),
                )),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    };

    let pdb = ha.then(|| PodDisruptionBudget {
        metadata: meta(&name),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            }),
            max_unavailable: Some(IntOrString::Int(1)),
            // A replica that is not ready serves nobody: evicting it never hurts, and
            // must not block a node drain.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    });

    Ok(DiscoveryServiceObjects {
        ca,
        server,
        client,
        service_account,
        role,
        role_binding,
        service,
        deployment,
        pdb,
    })
}

/// The Role's rules for the DiscoveryService `instance`: one per entry of
/// [`marin3r_kube::rbac::DISCOVERY_SERVICE`], plus
/// [`marin3r_kube::rbac::DISCOVERY_SERVICE_HA`] with several replicas (`ha`; its Lease
/// rule names `marin3r-<instance>-leader`).
pub fn role_rules(instance: &str, ha: bool) -> Vec<PolicyRule> {
    marin3r_kube::rbac::policy_rules(marin3r_kube::rbac::discovery_service(ha), instance)
}

/// The downward-API variable `name` holding the Pod's `field`.
fn field_env(name: &str, field: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: field.into(),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The replicas spread over nodes (required: a node lost takes one replica at most;
/// nodes whose taints the pods do not tolerate do not count) and over zones
/// (preferred).
fn spread(labels: &std::collections::BTreeMap<String, String>) -> Vec<TopologySpreadConstraint> {
    let over = |key: &str, when: &str, taints: Option<&str>| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.into(),
        when_unsatisfiable: when.into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(labels.clone()),
            ..LabelSelector::default()
        }),
        node_taints_policy: taints.map(str::to_string),
        ..TopologySpreadConstraint::default()
    };
    vec![
        over("kubernetes.io/hostname", "DoNotSchedule", Some("Honor")),
        over("topology.kubernetes.io/zone", "ScheduleAnyway", None),
    ]
}

fn pod_spec(
    ds: &DiscoveryService,
    namespace: &str,
    images: &Images,
    ha: bool,
    (xds_port, metrics_port, probe_port): (u16, u16, u16),
    (server_secret, ca_secret): (&str, &str),
) -> PodSpec {
    let mut args = vec![
        "discovery-service".to_string(),
        format!("--xdss-port={xds_port}"),
        format!(
            "--server-certificate-path={}",
            marin3r_wire::paths::DISCOVERY_SERVICE_SERVER_CERT
        ),
        format!(
            "--ca-certificate-path={}",
            marin3r_wire::paths::DISCOVERY_SERVICE_CA
        ),
        format!("--metrics-bind-address=:{metrics_port}"),
        format!("--health-probe-bind-address=:{probe_port}"),
        "--log-format=json".to_string(),
    ];
    if ha {
        args.push("--leader-elect".to_string());
        args.push(format!(
            "--discovery-service-name={}",
            ds.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    if ds.debug() {
        args.push("--log-level=debug".to_string());
    }
    let port = |name: &str, port: u16| ContainerPort {
        name: Some(name.to_string()),
        container_port: i32::from(port),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    let probe = |path: &str, initial_delay: i32, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("probes".into()),
            ..HTTPGetAction::default()
        }),
        initial_delay_seconds: (initial_delay > 0).then_some(initial_delay),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    let secret_volume = |name: &str, secret: &str, items: Option<Vec<KeyToPath>>| Volume {
        name: name.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            // Readable by whatever UID runs the container (the image's 65532, or the
            // one OpenShift's SCC assigns; no fsGroup), written by no one.
            default_mode: Some(SECRET_MODE),
            items,
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    let container = Container {
        name: "discovery-service".into(),
        image: Some(ds.image(&images.marin3r).to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args),
        env: Some(vec![
            EnvVar {
                // Kubernetes mode (no --config-dir): watch this namespace only.
                name: "WATCH_NAMESPACE".into(),
                value: Some(namespace.to_string()),
                ..EnvVar::default()
            },
            // Who this replica is (its Lease identity and report, owned by the Pod).
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_UID", "metadata.uid"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![
            port(XDSS_NAME, xds_port),
            port("metrics", metrics_port),
            port("probes", probe_port),
        ]),
        readiness_probe: Some(probe(http_paths::READYZ, 0, READINESS_PERIOD_SECONDS, 2)),
        liveness_probe: Some(probe(http_paths::HEALTHZ, 5, 10, 3)),
        resources: Some(ds.resources()),
        // The securityContext of every container marin3r generates (Pod Security
        // `restricted`, read-only root) without a user: the image's numeric USER, or
        // the UID OpenShift's SCC assigns; then the DiscoveryService's own fields.
        security_context: Some(overlay(
            restricted_security_context(true),
            ds.security_context(),
        )),
        volume_mounts: Some(vec![
            mount(
                "server-cert",
                marin3r_wire::paths::DISCOVERY_SERVICE_SERVER_CERT,
            ),
            mount("ca-cert", marin3r_wire::paths::DISCOVERY_SERVICE_CA),
        ]),
        ..Container::default()
    };
    let labels = labels(
        DISCOVERY_SERVICE_COMPONENT,
        ds.metadata.name.as_deref().unwrap_or_default(),
    );
    PodSpec {
        service_account_name: Some(ds.resource_name()),
        priority_class_name: ds.pod_priority_class().map(str::to_string),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_PERIOD_SECONDS),
        topology_spread_constraints: Some(spread(&labels)),
        security_context: Some(pod_security_context(ds.pod_security_context())),
        containers: vec![container],
        volumes: Some(vec![
            secret_volume("server-cert", server_secret, None),
            // Only the CA's trust bundle, never its key.
            secret_volume(
                "ca-cert",
                ca_secret,
                Some(vec![KeyToPath {
                    key: CA_CRT.into(),
                    path: CA_CRT.into(),
                    ..KeyToPath::default()
                }]),
            ),
        ]),
        ..PodSpec::default()
    }
}
