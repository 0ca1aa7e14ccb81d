//! The EnvoyDeployment pod that `marin3r operator render` prints really works: its
//! init-manager and Envoy command lines, and the discovery service's, taken from the
//! rendered Deployments and run as local processes, serve the walkthrough's direct
//! response through a real Envoy 1.40.
//!
//! What is remapped, and only that: paths of mounted volumes (to folders of a temp dir
//! laid out as the volumes are), ports (to free ones on 127.0.0.1), the discovery
//! service's source (`--config-dir` with the walkthrough's EnvoyConfig: local mode, no
//! cluster, a single process, so the rendered `--leader-elect` of a DiscoveryService
//! with several replicas is left out) and the xDS host's address (the bootstrap's `xds_cluster` endpoint resolves
//! to 127.0.0.1, as cluster DNS would resolve the Service; the TLS SNI and the server
//! certificate's names stay the Service's). The certificates are issued from the
//! rendered DiscoveryServiceCertificates by the certificate controller's own `plan`;
//! Secrets are folders with their keys (`tls.crt`, `tls.key`, `ca.crt`), as volumes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use marin3r_operator::render::render;
use marin3r_operator::{Images, certificate};
use marin3r_operator_api::DiscoveryServiceCertificate;
use marin3r_tests::{KillOnDrop, envoy_bin, free_port, marin3r_bin, wait_for, workspace_root};
use serde_json::Value;

fn fixture() -> PathBuf {
    workspace_root()
        .join("operator/tests/fixtures/operator-render/02-walkthrough-shutdown-manager/input.yaml")
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("render printed no {kind} {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Issues the Secret of a rendered DiscoveryServiceCertificate the way the certificate
/// controller does: its pure `plan`, given the signer's Secret.
fn issue(dsc: &Value, signer: Option<&Secret>, now: SystemTime) -> Secret {
    let dsc: DiscoveryServiceCertificate = serde_json::from_value(dsc.clone()).unwrap();
    let plan = certificate::plan(&dsc, "default", None, signer, &[], now);
    let secret = plan
        .secret
        .unwrap_or_else(|| panic!("nothing issued: {:?}", plan.status));
    assert_eq!(plan.status.ready, Some(true), "{:?}", plan.status);
    secret
}

/// Writes a Secret's keys into `dir`, as its volume would (all keys, or `only`).
fn mount(dir: &Path, secret: &Secret, only: Option<&str>) {
    std::fs::create_dir_all(dir).unwrap();
    for (key, value) in secret.data.as_ref().unwrap() {
        if only.is_none_or(|o| o == key) {
            std::fs::write(dir.join(key), &value.0).unwrap();
        }
    }
}

/// `args` with every occurrence of each `from` replaced by its `to`, and the value of
/// each `--flag` (as `--flag=V` or `--flag V`) in `flags` set.
fn remap(args: &[String], paths: &[(&str, &Path)], flags: &[(&str, String)]) -> Vec<String> {
    let mut out: Vec<String> = args
        .iter()
        .map(|a| {
            paths.iter().fold(a.clone(), |a, (from, to)| {
                a.replace(from, &to.display().to_string())
            })
        })
        .collect();
    for (flag, value) in flags {
        let mut found = false;
        for i in 0..out.len() {
            if out[i].starts_with(&format!("{flag}=")) {
                out[i] = format!("{flag}={value}");
                found = true;
            } else if out[i] == *flag && i + 1 < out.len() {
                out[i + 1] = value.clone();
                found = true;
            }
        }
        assert!(found, "{flag} is not in the rendered arguments {args:?}");
    }
    out
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[test]
fn the_rendered_envoydeployment_pod_serves_the_walkthrough_response() {
    let input = std::fs::read_to_string(fixture()).unwrap();
    let docs = marin3r_envoyconfig::manifest::documents(&input).unwrap();
    let rendered = render(&docs, &Images::default());
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    let objects = &rendered.objects;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // The PKI, issued from the rendered certificates by the certificate controller's
    // plan.
    let now = SystemTime::now();
    let dsc = |name| find(objects, "DiscoveryServiceCertificate", name);
    let ca = issue(dsc("marin3r-ca-cert-discoveryservice"), None, now);
    let server = issue(dsc("marin3r-server-cert-discoveryservice"), Some(&ca), now);
    let client = issue(dsc("envoy-client-cert-envoy"), Some(&ca), now);
    mount(&dir.join("server-cert"), &server, None);
    // The discovery service's CA volume holds only `ca.crt` (items: [ca.crt]).
    mount(&dir.join("ca-cert"), &ca, Some("ca.crt"));
    mount(&dir.join("envoy-tls"), &client, None);

    // The walkthrough's EnvoyConfig in local mode, its listener on a free port.
    let port = free_port().unwrap();
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let ec_doc = docs.iter().find(|d| d["kind"] == "EnvoyConfig").unwrap();
    let ec_yaml = serde_json::to_string(ec_doc)
        .unwrap()
        .replace("\"0.0.0.0\"", "\"127.0.0.1\"")
        .replace("\"port_value\":8080", &format!("\"port_value\":{port}"));
    std::fs::write(config.join("envoy.json"), ec_yaml).unwrap();

    // The discovery service, as its rendered Deployment runs it.
    let ds = find(objects, "Deployment", "marin3r-discoveryservice");
    let ds_container = &ds["spec"]["template"]["spec"]["containers"][0];
    let xds_port = free_port().unwrap();
    let mut ds_args = remap(
        &strings(&ds_container["args"]),
        &[
            ("/etc/marin3r/tls/server", &dir.join("server-cert")),
            ("/etc/marin3r/tls/ca", &dir.join("ca-cert")),
        ],
        &[
            ("--xdss-port", xds_port.to_string()),
            (
                "--metrics-bind-address",
                format!("127.0.0.1:{}", free_port().unwrap()),
            ),
            (
                "--health-probe-bind-address",
                format!("127.0.0.1:{}", free_port().unwrap()),
            ),
        ],
    );
    assert!(
        ds_args.iter().any(|a| a == "--leader-elect"),
        "three replicas by default: {ds_args:?}"
    );
    ds_args.retain(|a| a != "--leader-elect");
    ds_args.extend(["--xdss-bind-address".into(), "127.0.0.1".into()]);
    ds_args.extend(["--config-dir".into(), config.display().to_string()]);
    let ds_log = dir.join("discovery-service.log");
    let _ds = KillOnDrop::spawn(
        "discovery-service",
        Command::new(marin3r_bin())
            .args(&ds_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&ds_log).unwrap()),
    )
    .unwrap();

    // The pod: init manager, then Envoy, with the rendered command lines.
    let pod =
        &find(objects, "Deployment", "marin3r-envoydeployment-envoy")["spec"]["template"]["spec"];
    let admin = free_port().unwrap();
    let volumes: [(&str, &Path); 2] = [
        ("/etc/envoy/bootstrap", &dir.join("envoy-bootstrap")),
        ("/etc/envoy/tls/client", &dir.join("envoy-tls")),
    ];
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "envoy-init-mgr");
    let init_args = remap(
        &strings(&init["args"]),
        &volumes,
        &[
            ("--xdss-port", xds_port.to_string()),
            ("--admin-bind-address", format!("127.0.0.1:{admin}")),
        ],
    );
    let status = Command::new(marin3r_bin())
        .args(&init_args)
        .env("POD_NAME", "envoy-6b7f9-abcde")
        .env("POD_NAMESPACE", "default")
        .env("HOST_NAME", "node-1")
        .status()
        .unwrap();
    assert!(status.success(), "init manager: {status}");

    // Cluster DNS: the Service's name resolves to the discovery service.
    let bootstrap_path = dir.join("envoy-bootstrap/config.json");
    let mut bootstrap: Value =
        serde_json::from_str(&std::fs::read_to_string(&bootstrap_path).unwrap()).unwrap();
    let xds = bootstrap["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "xds_cluster")
        .unwrap();
    let address = &mut xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"]["address"];
    assert_eq!(*address, "marin3r-discoveryservice.default.svc");
    *address = "127.0.0.1".into();
    std::fs::write(&bootstrap_path, serde_json::to_string(&bootstrap).unwrap()).unwrap();

    let envoy = &pod["containers"][0];
    assert_eq!(envoy["command"], serde_json::json!(["envoy"]));
    let mut envoy_args = remap(&strings(&envoy["args"]), &volumes, &[]);
    // Several Envoys may run at once on a test machine.
    envoy_args.push("--use-dynamic-base-id".into());
    let envoy_log = dir.join("envoy.log");
    let _envoy = KillOnDrop::spawn(
        "envoy",
        Command::new(envoy_bin())
            .args(&envoy_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&envoy_log).unwrap()),
    )
    .unwrap();

    let served = wait_for(Duration::from_secs(30), || {
        marin3r_testkit::http::get_blocking(([127, 0, 0, 1], port).into(), "/")
            .ok()
            .filter(|r| r.status == 200)
    });
    let Some(response) = served else {
        panic!(
            "Envoy never served the walkthrough's response\n---- envoy ----\n{}\n---- discovery service ----\n{}",
            log_tail(&envoy_log),
            log_tail(&ds_log)
        );
    };
    assert_eq!(response.body, "Hello World!");
}
