//! Objects injected into a Pod (design.md §1.3), generated from a validated
//! [`SidecarConfig`].

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector, Probe, ResourceRequirements,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::annotations::{ShutdownManager, SidecarConfig};
use crate::extra_volumes::{ExtraVolume, Source};

/// Name of the init container that writes the bootstrap.
pub const INIT_MANAGER_NAME: &str = "envoy-init-mgr";
/// Name of the shutdown manager container.
pub const SHUTDOWN_MANAGER_NAME: &str = "envoy-shtdn-mgr";
/// User and group the Envoy container runs as when the Pod names no user ([`RunAs`]):
/// the `envoy` user of Envoy's official images (their entrypoint, which
/// `command: [envoy]` bypasses, switches to it too).
pub const ENVOY_UID: i64 = 101;
/// User and group the init and shutdown managers run as when the Pod names no user
/// ([`RunAs`]): the `nonroot` user of the marin3r image (`Dockerfile`).
pub const MARIN3R_UID: i64 = 65532;

pub use crate::run_as::{RunAs, restricted_security_context};

fn http_get(path: &str, port: u16) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.to_string()),
        port: IntOrString::Int(i32::from(port)),
        scheme: Some("HTTP".to_string()),
        ..Default::default()
    }
}

fn pre_stop(path: &str, port: u16) -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            http_get: Some(http_get(path, port)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// preStop handler that makes a container wait for the shutdown manager's drain.
pub fn drain_pre_stop(port: u16) -> LifecycleHandler {
    LifecycleHandler {
        http_get: Some(http_get(marin3r_wire::http_paths::DRAIN, port)),
        ..Default::default()
    }
}

fn ready_probe(admin_port: u16, initial_delay: i32, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(http_get("/ready", admin_port)),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        success_threshold: Some(1),
        timeout_seconds: Some(1),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resource_list(pairs: [(&str, Option<&str>); 2]) -> Option<BTreeMap<String, Quantity>> {
    let map: BTreeMap<String, Quantity> = pairs
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), Quantity(v.to_string()))))
        .collect();
    (!map.is_empty()).then_some(map)
}

/// The Envoy sidecar container.
pub fn envoy_container(cfg: &SidecarConfig) -> Container {
    let mut args = vec![
        "-c".to_string(),
        marin3r_wire::paths::ENVOY_BOOTSTRAP_FILE.to_string(),
        "--service-node".to_string(),
        cfg.node_id.clone(),
        "--service-cluster".to_string(),
        cfg.cluster_id.clone(),
    ];
    if let Some(sm) = &cfg.shutdown_manager {
        args.extend([
            "--drain-time-s".to_string(),
            sm.drain_time_seconds.to_string(),
            "--drain-strategy".to_string(),
            sm.drain_strategy.as_str().to_string(),
        ]);
    }
    args.extend(cfg.extra_args.iter().cloned());

    let mut ports: Vec<ContainerPort> = cfg
        .ports
        .iter()
        .map(|p| ContainerPort {
            name: Some(p.name.clone()),
            container_port: i32::from(p.port),
            host_port: p.host_port.map(i32::from),
            protocol: Some(p.protocol.as_str().to_string()),
            ..Default::default()
        })
        .collect();
    ports.push(ContainerPort {
        name: Some("admin".to_string()),
        container_port: i32::from(cfg.admin_port),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    });

    let r = &cfg.resources;
    let text = |q: &Option<crate::validate::Quantity>| q.as_ref().map(|q| q.text.clone());
    let requests_cpu = text(&r.requests_cpu);
    let requests_memory = text(&r.requests_memory);
    let limits_cpu = text(&r.limits_cpu);
    let limits_memory = text(&r.limits_memory);
    let resources = ResourceRequirements {
        requests: resource_list([
            ("cpu", requests_cpu.as_deref()),
            ("memory", requests_memory.as_deref()),
        ]),
        limits: resource_list([
            ("cpu", limits_cpu.as_deref()),
            ("memory", limits_memory.as_deref()),
        ]),
        ..Default::default()
    };

    Container {
        name: cfg.container_name.clone(),
        image: Some(cfg.envoy_image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec!["envoy".to_string()]),
        args: Some(args),
        ports: Some(ports),
        resources: Some(resources),
        volume_mounts: Some(
            [
                mount(&cfg.tls_volume, marin3r_wire::paths::ENVOY_TLS_CLIENT, true),
                mount(
                    &cfg.config_volume,
                    marin3r_wire::paths::ENVOY_BOOTSTRAP,
                    true,
                ),
            ]
            .into_iter()
            .chain(
                cfg.extra_volumes
                    .iter()
                    .map(|v| mount(&v.volume_name, &v.mount_path, true)),
            )
            .collect(),
        ),
        liveness_probe: Some(ready_probe(cfg.admin_port, 30, 10, 10)),
        readiness_probe: Some(ready_probe(cfg.admin_port, 15, 5, 1)),
        lifecycle: cfg
            .shutdown_manager
            .as_ref()
            .map(|sm| pre_stop(marin3r_wire::http_paths::SHUTDOWN, sm.port)),
        restart_policy: cfg.native_sidecar.then(|| "Always".to_string()),
        security_context: Some(cfg.run_as.security_context(ENVOY_UID)),
        ..Default::default()
    }
}

/// The `envoy-init-mgr` init container that writes Envoy's bootstrap.
pub fn init_manager_container(cfg: &SidecarConfig) -> Container {
    let admin = SocketAddr::new(cfg.admin_bind_address, cfg.admin_port);
    let args = [
        "init-manager",
        "--xdss-host",
        &cfg.xdss_host,
        "--xdss-port",
        &cfg.xdss_port.to_string(),
        "--node-id",
        &cfg.node_id,
        "--cluster-id",
        &cfg.cluster_id,
        "--admin-bind-address",
        &admin.to_string(),
        "--admin-access-log-path",
        &cfg.admin_access_log_path,
        "--client-certificate-path",
        marin3r_wire::paths::ENVOY_TLS_CLIENT,
        "--config-file",
        marin3r_wire::paths::ENVOY_BOOTSTRAP_FILE,
        "--resources-path",
        marin3r_wire::paths::ENVOY_BOOTSTRAP,
        "--envoy-image",
        &cfg.envoy_image,
    ]
    .map(str::to_string)
    .to_vec();
    Container {
        name: INIT_MANAGER_NAME.to_string(),
        image: Some(cfg.init_manager_image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        args: Some(args),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("HOST_NAME", "spec.nodeName"),
        ]),
        volume_mounts: Some(vec![
            mount(
                &cfg.config_volume,
                marin3r_wire::paths::ENVOY_BOOTSTRAP,
                false,
            ),
            mount(&cfg.tls_volume, marin3r_wire::paths::ENVOY_TLS_CLIENT, true),
        ]),
        security_context: Some(cfg.run_as.security_context(MARIN3R_UID)),
        ..Default::default()
    }
}

/// The `envoy-shtdn-mgr` container. It deliberately has no liveness probe: a probe
/// restart in the middle of a drain leaves Envoy stuck draining.
pub fn shutdown_manager_container(cfg: &SidecarConfig, sm: &ShutdownManager) -> Container {
    let q = |s: &str| Quantity(s.to_string());
    Container {
        name: SHUTDOWN_MANAGER_NAME.to_string(),
        image: Some(sm.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        args: Some(vec![
            "shutdown-manager".to_string(),
            "--port".to_string(),
            sm.port.to_string(),
            "--envoy-admin-address".to_string(),
            format!("http://127.0.0.1:{}", cfg.admin_port),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), q("5m")),
                ("memory".to_string(), q("16Mi")),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), q("50m")),
                ("memory".to_string(), q("32Mi")),
            ])),
            ..Default::default()
        }),
        lifecycle: Some(pre_stop(marin3r_wire::http_paths::DRAIN, sm.port)),
        restart_policy: cfg.native_sidecar.then(|| "Always".to_string()),
        security_context: Some(cfg.run_as.security_context(MARIN3R_UID)),
        ..Default::default()
    }
}

/// An extra Secret or ConfigMap volume ([`crate::extra_volumes`]): files readable by
/// Envoy (mode 0644, like the client certificate), mounted read-only.
pub fn extra_volume(v: &ExtraVolume) -> Volume {
    let mut volume = Volume {
        name: v.volume_name.clone(),
        ..Default::default()
    };
    match v.source {
        Source::Secret => {
            volume.secret = Some(SecretVolumeSource {
                secret_name: Some(v.object_name.clone()),
                default_mode: Some(0o644),
                ..Default::default()
            });
        }
        Source::ConfigMap => {
            volume.config_map = Some(ConfigMapVolumeSource {
                name: v.object_name.clone(),
                default_mode: Some(0o644),
                ..Default::default()
            });
        }
    }
    volume
}

/// The client certificate Secret volume, the bootstrap emptyDir and the extra volumes.
pub fn volumes(cfg: &SidecarConfig) -> Vec<Volume> {
    let mut volumes = vec![
        Volume {
            name: cfg.tls_volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(cfg.client_certificate.clone()),
                default_mode: Some(0o644),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: cfg.config_volume.clone(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    ];
    volumes.extend(cfg.extra_volumes.iter().map(extra_volume));
    volumes
}
