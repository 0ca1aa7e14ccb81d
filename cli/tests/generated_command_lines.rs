//! Every command line marin3r generates for a container that runs its own image is
//! parsed with the CLI's own parser (`marin3r_cli::args::Cli`), and the flags that matter
//! land in the fields that the rest of the generated Pod relies on:
//!
//! - sidecar injection (`marin3r_sidecar::mutate_pod`) of every injecting Pod among the
//!   webhook's golden inputs (`webhook/tests/fixtures/injection/*/input.yaml`: plain,
//!   custom admin and discovery service, the shutdown manager, native sidecars, both
//!   together): the `envoy-init-mgr` and `envoy-shtdn-mgr` containers;
//! - the operator (`marin3r_operator::render::render`, the generators its controllers
//!   call) for every golden case of `operator/tests/fixtures/operator-render`: the
//!   discovery service's container, and the init and shutdown managers of every
//!   EnvoyDeployment.
//!
//! A generated container without `command` runs the image's entrypoint, `marin3r`
//! (Dockerfile), with its `args`. A flag renamed on either side fails here, without a
//! cluster or a slow end-to-end test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser as _;
use marin3r_cli::args::{Cli, Command, DiscoveryServiceArgs, InitManagerArgs, ShutdownManagerArgs};
use marin3r_sidecar::annotations::SidecarConfig;
use marin3r_sidecar::{Defaults, Mutation};
use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `input.yaml` of every case folder under `dir`, sorted: (case, documents).
fn golden_inputs(dir: &str) -> Vec<(String, Vec<Value>)> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(workspace().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path().join("input.yaml"))
        .filter(|p| p.is_file())
        .collect();
    cases.sort();
    cases
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let case = p.parent().unwrap().file_name().unwrap();
            (
                case.to_string_lossy().into_owned(),
                marin3r_envoyconfig::manifest::documents(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display())),
            )
        })
        .collect()
}

/// `marin3r <args>` parsed by the CLI's parser; panics with clap's message.
fn parse(what: &str, args: &[String]) -> Command {
    Cli::try_parse_from(std::iter::once("marin3r").chain(args.iter().map(String::as_str)))
        .unwrap_or_else(|e| panic!("{what}: `marin3r {}` does not parse:\n{e}", args.join(" ")))
        .command
}

fn args_of(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .unwrap_or_else(|| panic!("no args: {container}"))
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The containers and init containers of a Pod spec.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"]
        .into_iter()
        .flat_map(move |k| spec[k].as_array().into_iter().flatten())
}

/// The container named `name` of a Pod spec.
fn container<'a>(spec: &'a Value, name: &str) -> &'a Value {
    containers(spec)
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// `field` of the entry named `name` in the list `list` (`ports`, `volumeMounts`) of
/// `container`.
fn entry<'a>(container: &'a Value, list: &str, name: &str, field: &str) -> &'a Value {
    container[list]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .map(|e| &e[field])
        .unwrap_or_else(|| panic!("no {list} entry {name} in {container}"))
}

/// `containerPort` of the port named `port` of `container`.
fn port(container: &Value, port: &str) -> u16 {
    let number = entry(container, "ports", port, "containerPort");
    u16::try_from(number.as_u64().unwrap()).unwrap()
}

/// `mountPath` of the mount of volume `volume` in `container`.
fn mount(container: &Value, volume: &str) -> PathBuf {
    let path = entry(container, "volumeMounts", volume, "mountPath");
    PathBuf::from(path.as_str().unwrap())
}

/// What the parsed commands of one Pod (or of several, summed) were.
#[derive(Debug, Default)]
struct Seen {
    init_managers: usize,
    shutdown_managers: usize,
    native_shutdown_managers: usize,
    discovery_services: usize,
}

impl std::ops::AddAssign<&Seen> for Seen {
    fn add_assign(&mut self, other: &Seen) {
        self.init_managers += other.init_managers;
        self.shutdown_managers += other.shutdown_managers;
        self.native_shutdown_managers += other.native_shutdown_managers;
        self.discovery_services += other.discovery_services;
    }
}

/// Parses the args of every marin3r container (no `command`) among `generated` (names)
/// in the Pod `spec`, and checks each against the rest of the Pod: the Envoy container
/// `envoy` (its image, admin port, preStop hook) and the volumes the container mounts.
fn check_pod(what: &str, spec: &Value, generated: &BTreeSet<String>, envoy: &str) -> Seen {
    let mut seen = Seen::default();
    for c in containers(spec).filter(|c| generated.contains(c["name"].as_str().unwrap())) {
        if c.get("command").is_some() {
            continue;
        }
        let name = c["name"].as_str().unwrap();
        let what = format!("{what}: container {name}");
        match parse(&what, &args_of(c)) {
            Command::InitManager(a) => {
                check_init_manager(&what, &a, c, container(spec, envoy));
                seen.init_managers += 1;
            }
            Command::ShutdownManager(a) => {
                check_shutdown_manager(&what, &a, container(spec, envoy));
                seen.shutdown_managers += 1;
                if c["restartPolicy"] == "Always" {
                    seen.native_shutdown_managers += 1;
                }
            }
            Command::DiscoveryService(a) => {
                check_discovery_service(&what, &a, c);
                seen.discovery_services += 1;
            }
            other => panic!("{what}: unexpected command {other:?}"),
        }
    }
    seen
}

/// The bootstrap goes where Envoy reads it, for the Envoy it describes.
fn check_init_manager(what: &str, a: &InitManagerArgs, init: &Value, envoy: &Value) {
    let admin: SocketAddr = a.admin_bind_address.parse().unwrap();
    assert_eq!(admin.port(), port(envoy, "admin"), "{what}: admin port");
    assert_eq!(a.envoy_image, envoy["image"].as_str().unwrap(), "{what}");
    // Envoy starts with `-c <config file>`, the file the init manager writes.
    let envoy_args = args_of(envoy);
    let config = envoy_args
        .iter()
        .skip_while(|a| *a != "-c")
        .nth(1)
        .unwrap_or_else(|| panic!("{what}: Envoy has no -c: {envoy_args:?}"));
    assert_eq!(a.config_file.as_deref(), Some(Path::new(config)), "{what}");
    assert!(
        a.config_file
            .as_deref()
            .unwrap()
            .starts_with(&a.resources_path),
        "{what}: the bootstrap is in the resources path"
    );
    // Written to the volume Envoy reads it from, with the client certificate mounted.
    let bootstrap_volume = envoy["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == a.resources_path)
        .unwrap_or_else(|| panic!("{what}: Envoy does not mount {:?}", a.resources_path))["name"]
        .as_str()
        .unwrap();
    assert_eq!(mount(init, bootstrap_volume), a.resources_path, "{what}");
    let tls_mounts: Vec<PathBuf> = init["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| PathBuf::from(m["mountPath"].as_str().unwrap()))
        .collect();
    assert!(
        tls_mounts.contains(&a.client_certificate_path),
        "{what}: {:?} is not mounted",
        a.client_certificate_path
    );
}

/// The shutdown manager listens where the preStop hooks call it and drains the Envoy of
/// the Pod.
fn check_shutdown_manager(what: &str, a: &ShutdownManagerArgs, envoy: &Value) {
    let hook = &envoy["lifecycle"]["preStop"]["httpGet"];
    assert_eq!(hook["port"].as_u64(), Some(u64::from(a.port)), "{what}");
    assert_eq!(
        a.envoy_admin_address,
        format!("http://127.0.0.1:{}", port(envoy, "admin")),
        "{what}"
    );
}

/// The discovery service listens on the ports the Deployment names, and reads the
/// certificates from the mounted Secrets; Kubernetes mode (no folder).
fn check_discovery_service(what: &str, a: &DiscoveryServiceArgs, c: &Value) {
    assert_eq!(a.xdss_port, port(c, "discovery"), "{what}");
    assert_eq!(a.metrics_bind_address.port(), port(c, "metrics"), "{what}");
    assert_eq!(
        a.health_probe_bind_address.port(),
        port(c, "probes"),
        "{what}"
    );
    assert_eq!(a.server_certificate_path, mount(c, "server-cert"), "{what}");
    assert_eq!(a.ca_certificate_path, mount(c, "ca-cert"), "{what}");
    assert_eq!(a.config_dir, None, "{what}: Kubernetes mode");
}

/// The names an injection added (its `sidecar-status` annotation).
fn injected_names(pod: &Value) -> BTreeSet<String> {
    let status = pod["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION]
        .as_str()
        .unwrap();
    let status: Value = serde_json::from_str(status).unwrap();
    ["containers", "initContainers"]
        .iter()
        .flat_map(|k| status[k].as_array().unwrap().iter())
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

/// The validated annotations of `pod`, as injection reads them.
fn sidecar_config(pod: &Value) -> SidecarConfig {
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(pod["metadata"]["annotations"].clone()).unwrap();
    let names = containers(&pod["spec"])
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    marin3r_sidecar::annotations::parse(&annotations, namespace, &names, &Defaults::default())
        .unwrap()
}

#[test]
fn injected_containers_parse_with_the_cli() {
    let mut total = Seen::default();
    let mut pods = 0;
    for (case, docs) in golden_inputs("webhook/tests/fixtures/injection") {
        let pod = &docs[0];
        let Ok(Mutation::Injected(injected)) =
            marin3r_sidecar::mutate_pod(pod, None, &Defaults::default())
        else {
            continue; // skipped or denied: nothing generated
        };
        pods += 1;
        let cfg = sidecar_config(pod);
        let spec = &injected["spec"];
        let seen = check_pod(&case, spec, &injected_names(&injected), &cfg.container_name);
        assert_eq!(seen.init_managers, 1, "{case}");
        assert_eq!(
            seen.shutdown_managers,
            usize::from(cfg.shutdown_manager.is_some()),
            "{case}"
        );
        // The annotations reach the init manager's flags.
        let init = container(spec, marin3r_sidecar::generate::INIT_MANAGER_NAME);
        let Command::InitManager(a) = parse(&case, &args_of(init)) else {
            unreachable!()
        };
        assert_eq!(
            (a.xdss_host.as_str(), a.xdss_port),
            (cfg.xdss_host.as_str(), cfg.xdss_port),
            "{case}"
        );
        assert_eq!(a.node_id, cfg.node_id, "{case}");
        assert_eq!(
            a.cluster_id.as_deref(),
            Some(cfg.cluster_id.as_str()),
            "{case}"
        );
        assert_eq!(
            a.admin_bind_address,
            SocketAddr::new(cfg.admin_bind_address, cfg.admin_port).to_string(),
            "{case}"
        );
        assert_eq!(a.admin_access_log_path, cfg.admin_access_log_path, "{case}");
        if let Some(sm) = &cfg.shutdown_manager {
            let c = container(spec, marin3r_sidecar::generate::SHUTDOWN_MANAGER_NAME);
            let Command::ShutdownManager(a) = parse(&case, &args_of(c)) else {
                unreachable!()
            };
            assert_eq!(a.port, sm.port, "{case}");
        }
        total += &seen;
    }
    eprintln!("{pods} injected Pods, parsed: {total:?}");
    assert!(pods >= 20, "only {pods} injected Pods");
    assert!(total.shutdown_managers >= 3 && total.native_shutdown_managers >= 1);
}

#[test]
fn operator_generated_containers_parse_with_the_cli() {
    let images = marin3r_operator::Images {
        marin3r: "quay.io/marin3r-rs/marin3r:v0.1.0".into(),
        envoy: "envoyproxy/envoy:v1.40.0".into(),
    };
    let mut total = Seen::default();
    for (case, docs) in golden_inputs("operator/tests/fixtures/operator-render") {
        let rendered = marin3r_operator::render::render(&docs, &images);
        for d in rendered
            .objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
        {
            let spec = &d["spec"]["template"]["spec"];
            let what = format!("{case}: Deployment {}", d["metadata"]["name"]);
            // Every container of a Deployment the operator renders is generated.
            let names = containers(spec)
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect();
            let envoy = containers(spec)
                .find(|c| c.get("command").is_some())
                .map_or("", |c| c["name"].as_str().unwrap());
            let seen = check_pod(&what, spec, &names, envoy);
            total += &seen;
        }
    }
    eprintln!("operator, parsed: {total:?}");
    assert!(
        total.discovery_services >= 5,
        "{}",
        total.discovery_services
    );
    assert!(total.init_managers >= 3 && total.shutdown_managers >= 1);
}
