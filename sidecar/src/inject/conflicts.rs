//! Denying up front what the API server would reject after injection: shared names and
//! host ports.

use std::collections::{BTreeMap, BTreeSet};

use marin3r_wire::DOMAIN;
use marin3r_wire::quote::{listed, quoted};

use crate::Error;
use crate::annotations::{self, AnnotationError, AnnotationErrors, SidecarConfig};
use crate::generate;
use crate::host_ports::{self, HostPortUse};

/// The host ports the injected Envoy takes, each with the annotation that gives it: the
/// mapped ports (`host-port-mappings`); with `hostNetwork` every port it declares
/// (`ports`, `admin.port`), as its containerPort is then a host port.
fn envoy_host_ports(cfg: &SidecarConfig, host_network: bool) -> Vec<(&'static str, HostPortUse)> {
    let mut uses: Vec<(&'static str, HostPortUse)> = cfg
        .ports
        .iter()
        .filter_map(|p| {
            let (key, host_port) = match p.host_port {
                Some(h) => (annotations::keys::HOST_PORT_MAPPINGS, h),
                None if host_network => (annotations::keys::PORTS, p.port),
                None => return None,
            };
            Some((
                key,
                HostPortUse {
                    host_port,
                    protocol: p.protocol.as_str().into(),
                    declarer: format!("the sidecar's port {} ({DOMAIN}/{key})", quoted(&p.name)),
                },
            ))
        })
        .collect();
    if host_network {
        let key = annotations::keys::ADMIN_PORT;
        uses.push((
            key,
            HostPortUse {
                host_port: cfg.admin_port,
                protocol: annotations::Protocol::Tcp.as_str().into(),
                declarer: format!("the sidecar's admin port ({DOMAIN}/{key})"),
            },
        ));
    }
    uses
}

/// The names and host ports already in the Pod (after removing an earlier injection).
pub(super) struct PodNames<'a> {
    pub(super) containers: &'a BTreeSet<String>,
    pub(super) init_containers: &'a BTreeSet<String>,
    pub(super) ephemeral_containers: &'a BTreeSet<String>,
    pub(super) volumes: &'a BTreeSet<String>,
    pub(super) host_ports: &'a [HostPortUse],
}

/// Denies up front what the API server would reject after injection: names the injected
/// objects share with the Pod's (containers, init and ephemeral containers, volumes), a
/// host port the Pod's containers already take ([`host_ports`]), and with
/// `hostNetwork: true` a hostPort different from its containerPort.
pub(super) fn check_conflicts(
    cfg: &SidecarConfig,
    pod: &PodNames<'_>,
    host_network: bool,
) -> Result<(), Error> {
    let mut errors = Vec::new();
    let taken = |n: &str| {
        pod.containers.contains(n)
            || pod.init_containers.contains(n)
            || pod.ephemeral_containers.contains(n)
    };
    let kind = |n: &str| {
        if pod.ephemeral_containers.contains(n) {
            "an ephemeral container (spec.ephemeralContainers)"
        } else {
            "a container"
        }
    };
    if taken(&cfg.container_name) {
        errors.push(AnnotationError {
            annotation: annotations::keys::CONTAINER_NAME.into(),
            message: format!(
                "the pod already has {} named {:?}",
                kind(&cfg.container_name),
                cfg.container_name
            ),
        });
    }
    let mut reserved = vec![generate::INIT_MANAGER_NAME];
    if cfg.shutdown_manager.is_some() {
        reserved.push(generate::SHUTDOWN_MANAGER_NAME);
    }
    for name in reserved {
        if taken(name) || cfg.container_name == name {
            errors.push(AnnotationError {
                annotation: "spec.containers".into(),
                message: format!(
                    "the pod already has {} named {name:?}, which the sidecar injection adds",
                    kind(name)
                ),
            });
        }
    }
    let extra = cfg
        .extra_volumes
        .iter()
        .map(|v| (annotations::extra_volumes_key(v.source), &v.volume_name));
    for (key, vol) in [
        (annotations::keys::TLS_VOLUME, &cfg.tls_volume),
        (annotations::keys::CONFIG_VOLUME, &cfg.config_volume),
    ]
    .into_iter()
    .chain(extra)
    {
        if pod.volumes.contains(vol) {
            errors.push(AnnotationError {
                annotation: key.into(),
                message: format!("the pod already has a volume named {vol:?}"),
            });
        }
    }
    if host_network {
        let mismatched: Vec<String> = cfg
            .ports
            .iter()
            .filter_map(|p| {
                p.host_port.filter(|h| *h != p.port).map(|h| {
                    format!(
                        "port {:?}: hostPort {h} must equal containerPort {} because spec.hostNetwork is true",
                        p.name, p.port
                    )
                })
            })
            .collect();
        if !mismatched.is_empty() {
            errors.push(AnnotationError {
                annotation: annotations::keys::HOST_PORT_MAPPINGS.into(),
                message: mismatched.join(", "),
            });
        }
    }
    // The Pod's ports first: a clash is reported on the sidecar port that repeats one.
    let envoy = envoy_host_ports(cfg, host_network);
    let uses: Vec<HostPortUse> = pod
        .host_ports
        .iter()
        .cloned()
        .chain(envoy.iter().map(|(_, u)| u.clone()))
        .collect();
    let mut clashes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (first, again) in host_ports::clashes(&uses) {
        // A clash between two app ports is the Pod's own, left to the API server.
        let Some((key, _)) = again
            .checked_sub(pod.host_ports.len())
            .and_then(|i| envoy.get(i))
        else {
            continue;
        };
        clashes
            .entry(key)
            .or_default()
            .push(host_ports::clash_message(&uses[first], &uses[again]));
    }
    for (key, messages) in clashes {
        errors.push(AnnotationError {
            annotation: key.into(),
            message: listed(messages, ", "),
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Annotations(AnnotationErrors(errors)))
    }
}
