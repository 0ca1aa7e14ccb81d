//! The `marin3r.3scale.net/*` annotation contract (design.md §1.2): every annotation is
//! parsed and validated up front, and every problem is reported, not only the first.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::ops::Bound;

use marin3r_wire::object_names::discovery_service;
use marin3r_wire::{paths, ports};

use crate::extra_volumes::{self, ExtraVolume};
use crate::host_ports::{self, HostPortUse};
use crate::validate::{self, Quantity};
use marin3r_wire::quote::{listed, quoted};

use marin3r_wire::DOMAIN;

use marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE;

/// Every annotation this crate understands, without the prefix.
pub mod keys {
    pub const NODE_ID: &str = "node-id";
    pub const CLUSTER_ID: &str = "cluster-id";
    pub const CONTAINER_NAME: &str = "container-name";
    pub const ENVOY_IMAGE: &str = "envoy-image";
    pub const ENVOY_API_VERSION: &str = "envoy-api-version";
    pub const PORTS: &str = "ports";
    pub const HOST_PORT_MAPPINGS: &str = "host-port-mappings";
    pub const ENVOY_EXTRA_ARGS: &str = "envoy-extra-args";
    pub const CONFIG_VOLUME: &str = "config-volume";
    pub const TLS_VOLUME: &str = "tls-volume";
    pub const CLIENT_CERTIFICATE: &str = "client-certificate";
    pub const DISCOVERY_SERVICE_NAME: &str = "discovery-service.name";
    pub const DISCOVERY_SERVICE_ADDRESS: &str = "discovery-service.address";
    pub const ADMIN_PORT: &str = "admin.port";
    pub const ADMIN_BIND_ADDRESS: &str = "admin.bind-address";
    pub const ADMIN_ACCESS_LOG_PATH: &str = "admin.access-log-path";
    pub const REQUESTS_CPU: &str = "resources.requests.cpu";
    pub const REQUESTS_MEMORY: &str = "resources.requests.memory";
    pub const LIMITS_CPU: &str = "resources.limits.cpu";
    pub const LIMITS_MEMORY: &str = "resources.limits.memory";
    pub const SHTDN_ENABLED: &str = "shutdown-manager.enabled";
    pub const SHTDN_PORT: &str = "shutdown-manager.port";
    pub const SHTDN_IMAGE: &str = "shutdown-manager.image";
    pub const SHTDN_HOOKS: &str = "shutdown-manager.extra-lifecycle-hooks";
    pub const SHTDN_DRAIN_TIME: &str = "shutdown-manager.drain-time";
    pub const SHTDN_DRAIN_STRATEGY: &str = "shutdown-manager.drain-strategy";
    pub const INIT_MANAGER_IMAGE: &str = "init-manager.image";
    pub const NATIVE_SIDECAR: &str = "native-sidecar";
    pub const EXTRA_SECRET_VOLUMES: &str = "envoy-extra-secret-volumes";
    pub const EXTRA_CONFIGMAP_VOLUMES: &str = "envoy-extra-configmap-volumes";

    /// Every key above: the table checks that must cover each annotation iterate.
    pub const ALL: &[&str] = &[
        NODE_ID,
        CLUSTER_ID,
        CONTAINER_NAME,
        ENVOY_IMAGE,
        ENVOY_API_VERSION,
        PORTS,
        HOST_PORT_MAPPINGS,
        ENVOY_EXTRA_ARGS,
        CONFIG_VOLUME,
        TLS_VOLUME,
        CLIENT_CERTIFICATE,
        DISCOVERY_SERVICE_NAME,
        DISCOVERY_SERVICE_ADDRESS,
        ADMIN_PORT,
        ADMIN_BIND_ADDRESS,
        ADMIN_ACCESS_LOG_PATH,
        REQUESTS_CPU,
        REQUESTS_MEMORY,
        LIMITS_CPU,
        LIMITS_MEMORY,
        SHTDN_ENABLED,
        SHTDN_PORT,
        SHTDN_IMAGE,
        SHTDN_HOOKS,
        SHTDN_DRAIN_TIME,
        SHTDN_DRAIN_STRATEGY,
        INIT_MANAGER_IMAGE,
        NATIVE_SIDECAR,
        EXTRA_SECRET_VOLUMES,
        EXTRA_CONFIGMAP_VOLUMES,
    ];
}

/// Defaults that come from the webhook's flags rather than from annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// `--default-envoy-image`.
    pub envoy_image: String,
    /// `--default-discovery-service`.
    pub discovery_service: String,
    /// `--marin3r-image`: default for the init and shutdown manager images.
    pub marin3r_image: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            envoy_image: marin3r_wire::images::ENVOY.into(),
            discovery_service: DEFAULT_DISCOVERY_SERVICE.into(),
            marin3r_image: marin3r_wire::images::MARIN3R.into(),
        }
    }
}

/// One problem with one annotation (or with the Pod, `annotation` then names the field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationError {
    /// The annotation key without the `marin3r.3scale.net/` prefix.
    pub annotation: String,
    /// What is wrong, naming the rule.
    pub message: String,
}

impl fmt::Display for AnnotationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.annotation, self.message)
    }
}

/// All the problems found in a Pod's annotations, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationErrors(pub Vec<AnnotationError>);

impl fmt::Display for AnnotationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid marin3r annotations: ")?;
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for AnnotationErrors {}

/// Transport protocol of a container port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// A port Envoy listens on, from `ports` (+ `host-port-mappings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
    pub host_port: Option<u16>,
}

// How Envoy drains listeners when the shutdown manager stops it: annotation
// `shutdown-manager.drain-strategy`, EnvoyDeployment `spec.shutdownManager.drainStrategy`.
// The doc line below is the CRD schema's description.
/// Envoy's `--drain-strategy`.
#[derive(
    serde::Deserialize,
    serde::Serialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DrainStrategy {
    /// Envoy discourages connections gradually over the drain time.
    #[default]
    Gradual,
    /// Envoy discourages all connections at once.
    Immediate,
}

impl DrainStrategy {
    /// `gradual` or `immediate`.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainStrategy::Gradual => "gradual",
            DrainStrategy::Immediate => "immediate",
        }
    }
}

/// Container resources from the `resources.*` annotations (absent = unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub requests_cpu: Option<Quantity>,
    pub requests_memory: Option<Quantity>,
    pub limits_cpu: Option<Quantity>,
    pub limits_memory: Option<Quantity>,
}

/// Shutdown manager settings (present only when `shutdown-manager.enabled` is true).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownManager {
    pub port: u16,
    pub image: String,
    pub extra_lifecycle_hooks: Vec<String>,
    pub drain_time_seconds: i64,
    pub drain_strategy: DrainStrategy,
}

/// The validated sidecar configuration of one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarConfig {
    pub node_id: String,
    pub cluster_id: String,
    pub container_name: String,
    pub envoy_image: String,
    pub ports: Vec<PortSpec>,
    pub extra_args: Vec<String>,
    pub config_volume: String,
    pub tls_volume: String,
    pub client_certificate: String,
    pub xdss_host: String,
    pub xdss_port: u16,
    pub admin_port: u16,
    pub admin_bind_address: IpAddr,
    pub admin_access_log_path: String,
    pub resources: Resources,
    pub shutdown_manager: Option<ShutdownManager>,
    pub init_manager_image: String,
    pub native_sidecar: bool,
    /// Secrets and ConfigMaps mounted read-only into the Envoy container
    /// (`envoy-extra-secret-volumes`, then `envoy-extra-configmap-volumes`).
    pub extra_volumes: Vec<ExtraVolume>,
    /// Who the generated containers run as ([`crate::RunAs`]): decided from the Pod by
    /// injection ([`crate::RunAs::of_pod`]), from the Namespace by the operator;
    /// [`crate::RunAs::IMAGE_USERS`] from the annotations alone.
    pub run_as: crate::RunAs,
}

/// Collects errors while each annotation is parsed independently.
struct Parser<'a> {
    /// The `marin3r.3scale.net/*` annotations, by key without the prefix. Looked up about
    /// 30 times per Pod: formatting `DOMAIN/key` for each lookup was a tenth of the
    /// injection's time (BENCHMARKS.md).
    ours: BTreeMap<&'a str, &'a str>,
    errors: Vec<AnnotationError>,
}

impl<'a> Parser<'a> {
    fn new<K, V>(annotations: &'a BTreeMap<K, V>) -> Self
    where
        K: Borrow<str> + Ord,
        V: AsRef<str>,
    {
        let prefix = format!("{DOMAIN}/");
        // Keys with the prefix sort contiguously, starting at the prefix itself.
        let ours = annotations
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .map_while(|(k, v)| Some((k.borrow().strip_prefix(prefix.as_str())?, v.as_ref())))
            .collect();
        Self {
            ours,
            errors: Vec::new(),
        }
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.ours.get(key).copied()
    }

    fn error(&mut self, key: &str, message: impl Into<String>) {
        self.errors.push(AnnotationError {
            annotation: key.to_string(),
            message: message.into(),
        });
    }

    /// Parses `key` with `f` when present; falls back to `default` when absent or invalid
    /// (an invalid value is recorded, so the fallback never reaches a Pod).
    fn parse<T>(&mut self, key: &str, default: T, f: impl FnOnce(&str) -> Result<T, String>) -> T {
        match self.get(key) {
            None => default,
            Some(v) => match f(v) {
                Ok(t) => t,
                Err(e) => {
                    self.error(key, e);
                    default
                }
            },
        }
    }

    fn string(
        &mut self,
        key: &str,
        default: &str,
        check: fn(&str) -> Result<(), String>,
    ) -> String {
        self.parse(key, default.to_string(), |v| {
            check(v).map(|()| v.to_string())
        })
    }
}

/// A node or cluster id: not empty and no longer than the discovery service accepts
/// (`marin3r_wire::MAX_NODE_NAME_BYTES`; a longer one would be injected and then refused
/// on every ADS stream).
fn node_name(s: &str) -> Result<(), String> {
    non_empty(s)?;
    if s.len() > marin3r_wire::MAX_NODE_NAME_BYTES {
        return Err(format!(
            "is {} bytes long; the discovery service accepts at most {}",
            s.len(),
            marin3r_wire::MAX_NODE_NAME_BYTES
        ));
    }
    Ok(())
}

fn non_empty(s: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        Err("must not be empty".into())
    } else if s.chars().any(char::is_control) {
        Err("must not contain control characters".into())
    } else {
        Ok(())
    }
}

fn absolute_path(s: &str) -> Result<(), String> {
    non_empty(s)?;
    if s.starts_with('/') {
        Ok(())
    } else {
        Err(format!("{} is not an absolute path", quoted(s)))
    }
}

fn api_version(s: &str) -> Result<(), String> {
    match s {
        marin3r_wire::ENVOY_API_V3 => Ok(()),
        "v2" => Err("Envoy removed the v2 xDS API; use v3".into()),
        other => Err(format!("{} is not supported; use v3", quoted(other))),
    }
}

fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim)
}

fn parse_port_spec(entry: &str) -> Result<PortSpec, String> {
    let parts: Vec<&str> = entry.split(':').collect();
    let (name, port, protocol) = match parts.as_slice() {
        [name, port] => (*name, *port, Protocol::Tcp),
        [name, port, proto] => {
            let protocol = match *proto {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                "SCTP" => Protocol::Sctp,
                other => {
                    return Err(format!(
                        "{}: protocol {} is not one of TCP, UDP, SCTP",
                        quoted(entry),
                        quoted(other)
                    ));
                }
            };
            (*name, *port, protocol)
        }
        _ => return Err(format!("{} is not name:port[:protocol]", quoted(entry))),
    };
    marin3r_wire::port_name(name)?;
    let port = validate::port(port)?;
    Ok(PortSpec {
        name: name.to_string(),
        port,
        protocol,
        host_port: None,
    })
}

/// Parses and validates the MARIN3R annotations of a Pod.
///
/// `namespace` is the Pod's namespace (for the default discovery service address) and
/// `container_names` the names of the Pod's own containers (for
/// `shutdown-manager.extra-lifecycle-hooks`). The annotations may be owned or borrowed
/// (`BTreeMap<String, String>` or `BTreeMap<&str, &str>`).
pub fn parse<K, V>(
    annotations: &BTreeMap<K, V>,
    namespace: &str,
    container_names: &BTreeSet<String>,
    defaults: &Defaults,
) -> Result<SidecarConfig, AnnotationErrors>
where
    K: Borrow<str> + Ord,
    V: AsRef<str>,
{
    use keys::*;
    let mut p = Parser::new(annotations);

    let node_id = match p.get(NODE_ID) {
        None => {
            p.error(
                NODE_ID,
                format!("required annotation {DOMAIN}/{NODE_ID} is missing"),
            );
            String::new()
        }
        Some(_) => p.string(NODE_ID, "", node_name),
    };
    let cluster_id = p.string(CLUSTER_ID, &node_id, node_name);
    let container_name = p.string(CONTAINER_NAME, "envoy-sidecar", marin3r_wire::dns1123_label);
    let envoy_image = p.string(ENVOY_IMAGE, &defaults.envoy_image, validate::image);
    p.parse(ENVOY_API_VERSION, (), api_version);

    let mut ports: Vec<PortSpec> = p.parse(PORTS, Vec::new(), |v| {
        let mut out: Vec<PortSpec> = Vec::new();
        let mut problems = Vec::new();
        for entry in split_list(v) {
            match parse_port_spec(entry) {
                Ok(spec) => {
                    if out.iter().any(|o| o.name == spec.name) {
                        problems.push(format!("port name {} is used twice", quoted(&spec.name)));
                    } else if out
                        .iter()
                        .any(|o| o.port == spec.port && o.protocol == spec.protocol)
                    {
                        problems.push(format!(
                            "port {}/{} is used twice",
                            spec.port,
                            spec.protocol.as_str()
                        ));
                    } else if spec.name == "admin" {
                        problems
                            .push("port name \"admin\" is reserved for Envoy's admin port".into());
                    } else {
                        out.push(spec);
                    }
                }
                Err(e) => problems.push(e),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(listed(problems, ", "))
        }
    });

    // Each mapping entry is checked on its own, so a bad entry does not hide the others.
    let mut mappings: Vec<(String, u16)> = Vec::new();
    let mut mapping_problems = Vec::new();
    for entry in p
        .get(HOST_PORT_MAPPINGS)
        .map(split_list)
        .into_iter()
        .flatten()
    {
        let Some((name, host_port)) = entry.split_once(':') else {
            mapping_problems.push(format!("{} is not portName:hostPort", quoted(entry)));
            continue;
        };
        match validate::port(host_port) {
            Ok(_) if mappings.iter().any(|(n, _)| n == name) => {
                mapping_problems.push(format!("port {} is mapped twice", quoted(name)));
            }
            Ok(hp) => mappings.push((name.to_string(), hp)),
            Err(e) => mapping_problems.push(e),
        }
    }
    if !mapping_problems.is_empty() {
        p.error(HOST_PORT_MAPPINGS, listed(mapping_problems, ", "));
    }
    // Only check names against `ports` when `ports` itself parsed.
    let ports_valid = !p.errors.iter().any(|e| e.annotation == PORTS);
    for (name, host_port) in mappings {
        match ports.iter_mut().find(|s| s.name == name) {
            Some(spec) => spec.host_port = Some(host_port),
            None if ports_valid => p.error(
                HOST_PORT_MAPPINGS,
                format!("port {} is not declared in {DOMAIN}/{PORTS}", quoted(&name)),
            ),
            None => {}
        }
    }

    // Kubernetes rejects two ports with the same hostPort and protocol (the app
    // containers' ports are checked against these when the Pod is injected).
    let host_ports: Vec<HostPortUse> = ports
        .iter()
        .filter_map(|spec| {
            Some(HostPortUse {
                host_port: spec.host_port?,
                protocol: spec.protocol.as_str().into(),
                declarer: quoted(&spec.name),
            })
        })
        .collect();
    let duplicate_host_ports: Vec<String> = host_ports::clashes(&host_ports)
        .into_iter()
        .map(|(first, again)| host_ports::clash_message(&host_ports[first], &host_ports[again]))
        .collect();
    if !duplicate_host_ports.is_empty() {
        p.error(HOST_PORT_MAPPINGS, listed(duplicate_host_ports, ", "));
    }

    let extra_args = p.parse(ENVOY_EXTRA_ARGS, Vec::new(), |v| {
        shell_words::split(v).map_err(|e| format!("cannot split {} like a shell: {e}", quoted(v)))
    });
    let config_volume = p.string(
        CONFIG_VOLUME,
        "envoy-sidecar-bootstrap",
        marin3r_wire::dns1123_label,
    );
    let tls_volume = p.string(TLS_VOLUME, "envoy-sidecar-tls", marin3r_wire::dns1123_label);
    if config_volume == tls_volume {
        p.error(
            TLS_VOLUME,
            format!(
                "volume {} is also the config-volume; they must differ",
                quoted(&tls_volume)
            ),
        );
    }
    let client_certificate = p.string(
        CLIENT_CERTIFICATE,
        marin3r_wire::object_names::SIDECAR_CLIENT_CERTIFICATE,
        marin3r_wire::dns1123_subdomain,
    );

    let ds_name = p.string(DISCOVERY_SERVICE_NAME, &defaults.discovery_service, |v| {
        marin3r_wire::dns1123_label(&discovery_service(v))
    });
    let (xdss_host, xdss_port) = match p.get(DISCOVERY_SERVICE_ADDRESS) {
        Some(_) => p.parse(
            DISCOVERY_SERVICE_ADDRESS,
            (String::new(), marin3r_wire::ports::XDSS),
            validate::host_port,
        ),
        None => (
            format!("{}.{namespace}.svc", discovery_service(&ds_name)),
            marin3r_wire::ports::XDSS,
        ),
    };

    let admin_port = p.parse(ADMIN_PORT, ports::ENVOY_ADMIN, validate::port);
    let admin_bind_address = p.parse(
        ADMIN_BIND_ADDRESS,
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        validate::ip,
    );
    let admin_access_log_path = p.string(
        ADMIN_ACCESS_LOG_PATH,
        paths::ENVOY_ADMIN_ACCESS_LOG,
        absolute_path,
    );

    let quantity =
        |p: &mut Parser<'_>, key: &str| p.parse(key, None, |v| validate::quantity(v).map(Some));
    let resources = Resources {
        requests_cpu: quantity(&mut p, REQUESTS_CPU),
        requests_memory: quantity(&mut p, REQUESTS_MEMORY),
        limits_cpu: quantity(&mut p, LIMITS_CPU),
        limits_memory: quantity(&mut p, LIMITS_MEMORY),
    };
    for (req, lim, key) in [
        (&resources.requests_cpu, &resources.limits_cpu, REQUESTS_CPU),
        (
            &resources.requests_memory,
            &resources.limits_memory,
            REQUESTS_MEMORY,
        ),
    ] {
        if let (Some(r), Some(l)) = (req, lim)
            && r.nanos > l.nanos
        {
            p.error(
                key,
                format!("request {} is greater than the limit {}", r.text, l.text),
            );
        }
    }

    let shtdn_enabled = p.parse(SHTDN_ENABLED, false, validate::boolean);
    let shtdn_port = p.parse(SHTDN_PORT, ports::SHUTDOWN_MANAGER, validate::port);
    let shtdn_image = p.string(SHTDN_IMAGE, &defaults.marin3r_image, validate::image);
    let hooks = p.parse(SHTDN_HOOKS, Vec::new(), |v| {
        let names: Vec<String> = split_list(v)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let unknown: Vec<&str> = names
            .iter()
            .filter(|n| !container_names.contains(n.as_str()))
            .map(String::as_str)
            .collect();
        if unknown.is_empty() {
            Ok(names)
        } else {
            Err(format!(
                "container(s) {} not found in the pod",
                listed(unknown.iter().map(|n| quoted(n)), ", ")
            ))
        }
    });
    let drain_time = p.parse(SHTDN_DRAIN_TIME, 300, |v| {
        let n: i64 = v
            .parse()
            .map_err(|_| format!("{} is not a number", quoted(v)))?;
        if (1..=3600).contains(&n) {
            Ok(n)
        } else {
            Err(format!("{n} is out of range (1-3600 seconds)"))
        }
    });
    let drain_strategy = p.parse(SHTDN_DRAIN_STRATEGY, DrainStrategy::Gradual, |v| match v {
        "gradual" => Ok(DrainStrategy::Gradual),
        "immediate" => Ok(DrainStrategy::Immediate),
        other => Err(format!("{} is not gradual or immediate", quoted(other))),
    });
    let init_manager_image = p.string(INIT_MANAGER_IMAGE, &defaults.marin3r_image, validate::image);
    let native_sidecar = p.parse(NATIVE_SIDECAR, false, validate::boolean);
    let extra_volumes = parse_extra_volumes(&mut p, &[&config_volume, &tls_volume]);

    // Cross-annotation port conflicts.
    let envoy_ports: Vec<u16> = ports
        .iter()
        .filter(|s| s.protocol == Protocol::Tcp)
        .map(|s| s.port)
        .collect();
    if envoy_ports.contains(&admin_port) {
        p.error(
            ADMIN_PORT,
            format!("port {admin_port} is also an Envoy port in {DOMAIN}/{PORTS}"),
        );
    }
    if shtdn_enabled {
        if shtdn_port == admin_port {
            p.error(
                SHTDN_PORT,
                format!("port {shtdn_port} is also the admin port; they must differ"),
            );
        }
        if envoy_ports.contains(&shtdn_port) {
            p.error(
                SHTDN_PORT,
                format!("port {shtdn_port} is also an Envoy port in {DOMAIN}/{PORTS}"),
            );
        }
    }

    if !p.errors.is_empty() {
        return Err(AnnotationErrors(p.errors));
    }
    Ok(SidecarConfig {
        node_id,
        cluster_id,
        container_name,
        envoy_image,
        ports,
        extra_args,
        config_volume,
        tls_volume,
        client_certificate,
        xdss_host,
        xdss_port,
        admin_port,
        admin_bind_address,
        admin_access_log_path,
        resources,
        shutdown_manager: shtdn_enabled.then_some(ShutdownManager {
            port: shtdn_port,
            image: shtdn_image,
            extra_lifecycle_hooks: hooks,
            drain_time_seconds: drain_time,
            drain_strategy,
        }),
        init_manager_image,
        native_sidecar,
        extra_volumes,
        run_as: crate::RunAs::IMAGE_USERS,
    })
}

/// The annotation of extra volumes of `source`.
pub fn extra_volumes_key(source: extra_volumes::Source) -> &'static str {
    match source {
        extra_volumes::Source::Secret => keys::EXTRA_SECRET_VOLUMES,
        extra_volumes::Source::ConfigMap => keys::EXTRA_CONFIGMAP_VOLUMES,
    }
}

/// `envoy-extra-secret-volumes` and `envoy-extra-configmap-volumes`:
/// `<name>:<mount-path>[,...]` each, checked together by [`extra_volumes::check`] (the
/// rule an EnvoyDeployment's `spec.extraVolumes` follows too); each problem is reported
/// on the annotation of its entry. `injected_volumes` are the names of the volumes
/// injection adds besides (`config-volume`, `tls-volume`).
fn parse_extra_volumes(p: &mut Parser<'_>, injected_volumes: &[&str]) -> Vec<ExtraVolume> {
    use extra_volumes::Source;
    let mut requests = Vec::new();
    let mut ok = true;
    for source in [Source::Secret, Source::ConfigMap] {
        let key = extra_volumes_key(source);
        let mut malformed = Vec::new();
        for entry in p.get(key).map(split_list).into_iter().flatten() {
            match entry.split_once(':') {
                Some((name, path)) => requests.push(extra_volumes::Request {
                    source,
                    object_name: name.trim(),
                    mount_path: path.trim(),
                }),
                None => malformed.push(format!("{} is not name:mount-path", quoted(entry))),
            }
        }
        if !malformed.is_empty() {
            ok = false;
            p.error(key, listed(malformed, ", "));
        }
    }
    let volumes = match extra_volumes::check(&requests) {
        Ok(volumes) => volumes,
        Err(problems) => {
            let mut by_key: BTreeMap<&str, Vec<String>> = BTreeMap::new();
            for problem in problems {
                let source = requests
                    .get(problem.index)
                    .map_or(Source::Secret, |r| r.source);
                let message = match requests.get(problem.index) {
                    Some(r) if problem.field != extra_volumes::Field::List => format!(
                        "{}: {}",
                        quoted(&format!("{}:{}", r.object_name, r.mount_path)),
                        problem.message
                    ),
                    _ => problem.message,
                };
                by_key
                    .entry(extra_volumes_key(source))
                    .or_default()
                    .push(message);
            }
            // In annotation order: secrets, then ConfigMaps.
            for source in [Source::Secret, Source::ConfigMap] {
                let key = extra_volumes_key(source);
                if let Some(messages) = by_key.remove(key) {
                    p.error(key, listed(messages, ", "));
                }
            }
            return Vec::new();
        }
    };
    // The generated names must not be the ones `config-volume` or `tls-volume` chose.
    for v in &volumes {
        if injected_volumes.contains(&v.volume_name.as_str()) {
            ok = false;
            p.error(
                extra_volumes_key(v.source),
                format!(
                    "the generated volume name {} is also the config-volume or tls-volume",
                    quoted(&v.volume_name)
                ),
            );
        }
    }
    if ok { volumes } else { Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{DOMAIN}/{k}"), v.to_string()))
            .collect()
    }

    fn parse_with(pairs: &[(&str, &str)]) -> Result<SidecarConfig, AnnotationErrors> {
        let names = ["app".to_string()].into_iter().collect();
        parse(&ann(pairs), "ns", &names, &Defaults::default())
    }

    #[test]
    fn defaults() {
        let c = parse_with(&[("node-id", "kuard")]).unwrap();
        assert_eq!(c.node_id, "kuard");
        assert_eq!(c.cluster_id, "kuard");
        assert_eq!(c.container_name, "envoy-sidecar");
        assert_eq!(c.envoy_image, marin3r_wire::images::ENVOY);
        assert_eq!(c.xdss_host, "marin3r-discoveryservice.ns.svc");
        assert_eq!(c.xdss_port, 18000);
        assert_eq!(c.admin_port, 9901);
        assert_eq!(c.admin_bind_address.to_string(), "0.0.0.0");
        assert_eq!(c.admin_access_log_path, "/dev/null");
        assert_eq!(c.config_volume, "envoy-sidecar-bootstrap");
        assert_eq!(c.tls_volume, "envoy-sidecar-tls");
        assert_eq!(c.client_certificate, "envoy-sidecar-client-cert");
        assert!(c.shutdown_manager.is_none());
        assert!(!c.native_sidecar);
        assert!(c.ports.is_empty());
    }

    #[test]
    fn node_and_cluster_ids_longer_than_the_discovery_service_accepts_are_denied() {
        let at_limit = "n".repeat(marin3r_wire::MAX_NODE_NAME_BYTES);
        let c = parse_with(&[("node-id", &at_limit), ("cluster-id", &at_limit)]).unwrap();
        assert_eq!(c.node_id.len(), marin3r_wire::MAX_NODE_NAME_BYTES);
        let over = "n".repeat(marin3r_wire::MAX_NODE_NAME_BYTES + 1);
        for key in ["node-id", "cluster-id"] {
            let e = parse_with(&[("node-id", "x"), (key, &over)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "{key}: is 1025 bytes long; the discovery service accepts at most 1024"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn missing_node_id_names_the_annotation() {
        let e = parse_with(&[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid marin3r annotations: node-id: required annotation marin3r.3scale.net/node-id is missing"
        );
    }

    #[test]
    fn all_errors_are_reported_together() {
        let e = parse_with(&[
            ("node-id", "x"),
            ("ports", "http:80"),
            ("admin.port", "abc"),
            ("envoy-api-version", "v2"),
        ])
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid marin3r annotations: envoy-api-version: Envoy removed the v2 xDS API; use v3; \
             ports: port 80 is privileged (1024-65535); admin.port: \"abc\" is not a number"
        );
    }

    #[test]
    fn ports_and_mappings() {
        let c = parse_with(&[
            ("node-id", "x"),
            ("ports", "http:8080, udp:8081:UDP"),
            ("host-port-mappings", "http:3000"),
        ])
        .unwrap();
        assert_eq!(
            c.ports,
            vec![
                PortSpec {
                    name: "http".into(),
                    port: 8080,
                    protocol: Protocol::Tcp,
                    host_port: Some(3000)
                },
                PortSpec {
                    name: "udp".into(),
                    port: 8081,
                    protocol: Protocol::Udp,
                    host_port: None
                },
            ]
        );
        let e = parse_with(&[
            ("node-id", "x"),
            ("ports", "http:8080,http:8081,x:8082:HTTP,bad"),
            ("host-port-mappings", "other:3000"),
        ])
        .unwrap_err();
        assert_eq!(
            e.0.len(),
            1,
            "mapping not checked against broken ports: {e}"
        );
        assert!(e.to_string().contains("port name \"http\" is used twice"));
        assert!(e.to_string().contains("protocol \"HTTP\" is not one of"));
        assert!(
            e.to_string()
                .contains("\"bad\" is not name:port[:protocol]")
        );
        let e = parse_with(&[
            ("node-id", "x"),
            ("ports", "http:8080"),
            ("host-port-mappings", "other:3000"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("port \"other\" is not declared"));
    }

    #[test]
    fn resources_request_must_not_exceed_limit() {
        let e = parse_with(&[
            ("node-id", "x"),
            ("resources.requests.cpu", "2"),
            ("resources.limits.cpu", "1500m"),
        ])
        .unwrap_err();
        assert_eq!(
            e.0[0].to_string(),
            "resources.requests.cpu: request 2 is greater than the limit 1500m"
        );
        assert!(
            parse_with(&[
                ("node-id", "x"),
                ("resources.requests.memory", "1Gi"),
                ("resources.limits.memory", "1073741824"),
            ])
            .is_ok()
        );
    }

    #[test]
    fn shutdown_manager_ports_must_be_distinct() {
        let e = parse_with(&[
            ("node-id", "x"),
            ("ports", "http:8090"),
            ("shutdown-manager.enabled", "true"),
            ("shutdown-manager.port", "9901"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("port 9901 is also the admin port"));
        let e = parse_with(&[
            ("node-id", "x"),
            ("ports", "http:8090"),
            ("shutdown-manager.enabled", "true"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("port 8090 is also an Envoy port"));
    }

    #[test]
    fn lifecycle_hooks_must_name_pod_containers() {
        let e = parse_with(&[
            ("node-id", "x"),
            ("shutdown-manager.enabled", "true"),
            ("shutdown-manager.extra-lifecycle-hooks", "app,nope"),
        ])
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid marin3r annotations: shutdown-manager.extra-lifecycle-hooks: container(s) \"nope\" not found in the pod"
        );
    }

    #[test]
    fn explicit_discovery_address() {
        let c = parse_with(&[
            ("node-id", "x"),
            ("discovery-service.address", "xds.local:1234"),
        ])
        .unwrap();
        assert_eq!((c.xdss_host.as_str(), c.xdss_port), ("xds.local", 1234));
    }

    #[test]
    fn extra_args_honour_quotes() {
        let c = parse_with(&[
            ("node-id", "x"),
            (
                "envoy-extra-args",
                r#"--log-level debug --log-format "%v %n" 'a b'"#,
            ),
        ])
        .unwrap();
        assert_eq!(
            c.extra_args,
            vec!["--log-level", "debug", "--log-format", "%v %n", "a b"]
        );
        let e =
            parse_with(&[("node-id", "x"), ("envoy-extra-args", "\"unterminated")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid marin3r annotations: envoy-extra-args: cannot split")
        );
    }

    #[test]
    fn extra_volumes_are_parsed_in_order_and_problems_name_their_annotation() {
        use crate::extra_volumes::Source;
        let c = parse_with(&[
            ("node-id", "x"),
            (
                "envoy-extra-secret-volumes",
                "token:/etc/envoy/oauth/token, hmac:/etc/envoy/oauth/hmac",
            ),
            ("envoy-extra-configmap-volumes", "lua:/etc/envoy/lua"),
        ])
        .unwrap();
        let got: Vec<(Source, &str, &str, &str)> = c
            .extra_volumes
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
                    "token",
                    "/etc/envoy/oauth/token",
                    "envoy-extra-secret-0"
                ),
                (
                    Source::Secret,
                    "hmac",
                    "/etc/envoy/oauth/hmac",
                    "envoy-extra-secret-1"
                ),
                (
                    Source::ConfigMap,
                    "lua",
                    "/etc/envoy/lua",
                    "envoy-extra-configmap-0"
                ),
            ]
        );
        assert!(
            parse_with(&[("node-id", "x")])
                .unwrap()
                .extra_volumes
                .is_empty()
        );

        // A clash across the two annotations is reported on the later entry's.
        let e = parse_with(&[
            ("node-id", "x"),
            ("envoy-extra-secret-volumes", "a:/etc/envoy/x"),
            ("envoy-extra-configmap-volumes", "b:/etc/envoy/x/y,c"),
        ])
        .unwrap_err();
        let fields: Vec<&str> = e.0.iter().map(|e| e.annotation.as_str()).collect();
        assert_eq!(
            fields,
            [
                "envoy-extra-configmap-volumes",
                "envoy-extra-configmap-volumes"
            ],
            "{e}"
        );
        assert!(
            e.to_string().contains("\"c\" is not name:mount-path"),
            "{e}"
        );
        assert!(
            e.to_string().contains(
                "\"b:/etc/envoy/x/y\": mount path \"/etc/envoy/x/y\" overlaps the mount path \"/etc/envoy/x\""
            ),
            "{e}"
        );

        // Over the bound: reported once, on the annotation of the entry past it.
        let many: Vec<String> = (0..17).map(|i| format!("s:/x/{i}")).collect();
        let e = parse_with(&[
            ("node-id", "x"),
            ("envoy-extra-secret-volumes", &many.join(",")),
        ])
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid marin3r annotations: envoy-extra-secret-volumes: 17 extra volumes; at most 16"
        );

        // A generated name a chosen config-volume or tls-volume already takes.
        let e = parse_with(&[
            ("node-id", "x"),
            ("tls-volume", "envoy-extra-secret-0"),
            ("envoy-extra-secret-volumes", "a:/etc/envoy/x"),
        ])
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid marin3r annotations: envoy-extra-secret-volumes: the generated volume name \"envoy-extra-secret-0\" is also the config-volume or tls-volume"
        );
    }

    #[test]
    fn duplicate_host_ports_are_denied_naming_both_ports() {
        let e = parse_with(&[
            ("node-id", "x"),
            ("ports", "a:8080,b:8081,c:8082:UDP"),
            ("host-port-mappings", "a:30000,b:30000,c:30000"),
        ])
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid marin3r annotations: host-port-mappings: hostPort 30000/TCP is used by both \"a\" and \"b\""
        );
    }
}
