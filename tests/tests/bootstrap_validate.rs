//! The bootstrap written by `marin3r_sidecar::bootstrap::write_files` must load in a real
//! Envoy 1.40 (design.md §2): `envoy --mode validate` accepts it for SotW and Delta and for
//! several admin addresses, rejects a deliberately broken copy (so these tests can fail),
//! and a really started Envoy reports the node identity from the bootstrap on its admin
//! `/server_info` and loads the client certificate through the file-based SDS.

// Test-only crate: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use marin3r_sidecar::bootstrap::{ApiType, BootstrapOptions, write_files};
use marin3r_tests::{KillOnDrop, envoy_bin, free_port, port_open, wait_for};
use serde_json::Value;
use tempfile::TempDir;

const VALIDATE_TIMEOUT: Duration = Duration::from_secs(60);
const START_TIMEOUT: Duration = Duration::from_secs(30);
const CLIENT_SAN: &str = "envoy-client.test";
const CA_SAN: &str = "marin3r-ca.test";

/// A temp dir holding throwaway client cert files and the bootstrap written for `opts`.
struct Fixture {
    dir: TempDir,
    opts: BootstrapOptions,
}

impl Fixture {
    /// Writes the client cert files, then the bootstrap and SDS file via `write_files`
    /// for the base options adjusted by `tweak`.
    fn new(tweak: impl FnOnce(&mut BootstrapOptions)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = BootstrapOptions {
            xdss_host: "marin3r-instance.default.svc".to_string(),
            node_id: "test-node".to_string(),
            cluster_id: "test-cluster".to_string(),
            envoy_image: "envoyproxy/envoy:v1.40.0".to_string(),
            pod_name: "test-pod".to_string(),
            pod_namespace: "test-ns".to_string(),
            host_name: "test-host".to_string(),
            admin_access_log_path: dir.path().join("admin.log").display().to_string(),
            client_certificate_path: dir.path().join("tls/client"),
            config_file: dir.path().join("bootstrap/config.json"),
            resources_path: dir.path().join("bootstrap"),
            ..BootstrapOptions::default()
        };
        tweak(&mut opts);
        write_client_cert(&opts.client_certificate_path);
        let written = write_files(&opts).unwrap();
        assert_eq!(written[0], opts.config_file);
        assert!(written.iter().all(|p| p.is_file()), "{written:?}");
        Self { dir, opts }
    }

    fn config(&self) -> &Path {
        &self.opts.config_file
    }
}

/// Throwaway self-signed certificates: the client cert (`tls.crt`/`tls.key`, SAN
/// `envoy-client.test`) and a distinct `ca.crt` (SAN `marin3r-ca.test`), so the admin
/// `/certs` output tells them apart.
fn write_client_cert(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let client = rcgen::generate_simple_self_signed(vec![CLIENT_SAN.to_string()]).unwrap();
    fs::write(dir.join("tls.crt"), client.cert.pem()).unwrap();
    fs::write(dir.join("tls.key"), client.signing_key.serialize_pem()).unwrap();
    let ca = rcgen::generate_simple_self_signed(vec![CA_SAN.to_string()]).unwrap();
    fs::write(dir.join("ca.crt"), ca.cert.pem()).unwrap();
}

/// Spawns Envoy with `args`, stdout/stderr going to files under `dir`.
fn spawn_envoy(name: &str, dir: &Path, args: &[&str]) -> (KillOnDrop, PathBuf, PathBuf) {
    let out = dir.join(format!("{name}.stdout"));
    let err = dir.join(format!("{name}.stderr"));
    let mut cmd = Command::new(envoy_bin());
    cmd.args(args)
        .stdout(Stdio::from(File::create(&out).unwrap()))
        .stderr(Stdio::from(File::create(&err).unwrap()));
    let child = KillOnDrop::spawn(name, &mut cmd).unwrap();
    (child, out, err)
}

fn read_output(out: &Path, err: &Path) -> String {
    format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        fs::read_to_string(out).unwrap_or_default(),
        fs::read_to_string(err).unwrap_or_default()
    )
}

/// `--service-node`/`--service-cluster` overrides passed to most validate runs.
const NODE_OVERRIDES: &[&str] = &["--service-node", "x", "--service-cluster", "y"];

/// Runs `envoy --mode validate -c <config> <extra> --disable-hot-restart`; returns its
/// exit status and output.
fn envoy_validate_with(dir: &Path, config: &Path, extra: &[&str]) -> (ExitStatus, String) {
    let mut args = vec!["--mode", "validate", "-c", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push("--disable-hot-restart");
    let (mut child, out, err) = spawn_envoy("envoy-validate", dir, &args);
    let status = wait_for(VALIDATE_TIMEOUT, || child.try_wait());
    let output = read_output(&out, &err);
    let status = status.unwrap_or_else(|| {
        panic!("envoy --mode validate still running after {VALIDATE_TIMEOUT:?}\n{output}")
    });
    (status, output)
}

/// `envoy --mode validate` with the node overrides.
fn envoy_validate(dir: &Path, config: &Path) -> (ExitStatus, String) {
    envoy_validate_with(dir, config, NODE_OVERRIDES)
}

fn assert_valid(fx: &Fixture) {
    let (status, output) = envoy_validate(fx.dir.path(), fx.config());
    assert!(
        status.success(),
        "envoy rejected the bootstrap ({status})\n{output}"
    );
    let ok_line = format!("configuration '{}' OK", fx.config().display());
    assert!(output.contains(&ok_line), "missing {ok_line:?}\n{output}");
}

#[test]
fn sotw_bootstrap_validates() {
    let fx = Fixture::new(|o| o.api_type = ApiType::Sotw);
    let config: Value = serde_json::from_slice(&fs::read(fx.config()).unwrap()).unwrap();
    assert_eq!(
        config["dynamic_resources"]["ads_config"]["api_type"],
        "GRPC"
    );
    assert_valid(&fx);
}

#[test]
fn delta_bootstrap_validates() {
    let fx = Fixture::new(|o| o.api_type = ApiType::Delta);
    let config: Value = serde_json::from_slice(&fs::read(fx.config()).unwrap()).unwrap();
    assert_eq!(
        config["dynamic_resources"]["ads_config"]["api_type"],
        "DELTA_GRPC"
    );
    assert_valid(&fx);
}

#[test]
fn ipv6_admin_and_custom_options_validate() {
    let fx = Fixture::new(|o| {
        o.admin_bind_address = "[::1]:9901".to_string();
        o.xdss_port = 18443;
        o.rtds_resource_name = "custom-runtime".to_string();
        o.api_type = ApiType::Delta;
    });
    assert_valid(&fx);
}

#[test]
fn ipv4_loopback_admin_on_free_port_validates() {
    let port = free_port().unwrap();
    let fx = Fixture::new(|o| o.admin_bind_address = format!("127.0.0.1:{port}"));
    assert_valid(&fx);
}

#[test]
fn broken_bootstrap_fails_validation() {
    let fx = Fixture::new(|_| {});
    let mut config: Value = serde_json::from_slice(&fs::read(fx.config()).unwrap()).unwrap();
    config["dynamic_resources"]["ads_config"]["bogus_field"] = Value::from(1);
    let broken = fx.dir.path().join("broken.json");
    fs::write(&broken, serde_json::to_vec_pretty(&config).unwrap()).unwrap();

    let (status, output) = envoy_validate(fx.dir.path(), &broken);
    assert!(
        !status.success(),
        "envoy accepted a bootstrap with an unknown field\n{output}"
    );
    assert!(output.contains("bogus_field"), "{output}");
}

#[test]
fn validation_reads_the_referenced_files() {
    // Envoy's validate mode opens the SDS file and the CA named in the bootstrap, so the
    // passing cases above really exercise the paths `write_files` produced.
    let fx = Fixture::new(|_| {});
    let ca = fx.opts.client_certificate_path.join("ca.crt");
    fs::remove_file(&ca).unwrap();
    let (status, output) = envoy_validate(fx.dir.path(), fx.config());
    assert!(!status.success(), "accepted without ca.crt\n{output}");
    assert!(output.contains(ca.to_str().unwrap()), "{output}");

    let fx = Fixture::new(|_| {});
    let sds = fx.opts.sds_secret_path();
    fs::remove_file(&sds).unwrap();
    let (status, output) = envoy_validate(fx.dir.path(), fx.config());
    assert!(!status.success(), "accepted without the SDS file\n{output}");
    assert!(output.contains(sds.to_str().unwrap()), "{output}");
}

#[test]
fn validates_without_service_node_overrides() {
    // The bootstrap alone must identify the node: Envoy requires node id and cluster for
    // file-based SDS, and the command-line overrides must not be what makes it load.
    let fx = Fixture::new(|_| {});
    let (status, output) = envoy_validate_with(fx.dir.path(), fx.config(), &[]);
    assert!(status.success(), "{output}");
    let ok_line = format!("configuration '{}' OK", fx.config().display());
    assert!(output.contains(&ok_line), "missing {ok_line:?}\n{output}");
}

/// Minimal HTTP/1.1 GET (the admin interface refuses HTTP/1.0); decodes a chunked body.
fn get_json(addr: SocketAddr, path: &str) -> Value {
    let marin3r_testkit::http::Response { status, body, .. } =
        marin3r_testkit::http::get_blocking(addr, path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

#[test]
fn envoy_starts_with_sotw_bootstrap_and_reports_node() {
    let admin_port = free_port().unwrap();
    // Nothing listens there: Envoy keeps retrying the ADS stream, which is fine here.
    let xds_port = free_port().unwrap();
    let fx = Fixture::new(|o| {
        o.api_type = ApiType::Sotw;
        o.xdss_host = "127.0.0.1".to_string();
        o.xdss_port = xds_port;
        o.admin_bind_address = format!("127.0.0.1:{admin_port}");
    });
    let config = fx.config().to_str().unwrap().to_string();
    let (mut envoy, out, err) = spawn_envoy(
        "envoy",
        fx.dir.path(),
        &[
            "-c",
            &config,
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "--log-level",
            "info",
        ],
    );
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let up = wait_for(START_TIMEOUT, || {
        if let Some(status) = envoy.try_wait() {
            return Some(Err(status));
        }
        port_open(admin).then_some(Ok(()))
    });
    match up {
        Some(Ok(())) => {}
        Some(Err(status)) => panic!("envoy exited ({status})\n{}", read_output(&out, &err)),
        None => panic!(
            "envoy admin not up on {admin} after {START_TIMEOUT:?}\n{}",
            read_output(&out, &err)
        ),
    }

    let info = get_json(admin, "/server_info");
    let state = info["state"].as_str().unwrap_or_default();
    assert!(
        ["LIVE", "PRE_INITIALIZING", "INITIALIZING", "DRAINING"].contains(&state),
        "unexpected state {state:?}: {info:#}"
    );
    let node = &info["node"];
    assert_eq!(node["id"], "test-node", "{info:#}");
    assert_eq!(node["cluster"], "test-cluster", "{info:#}");
    assert_eq!(
        node["metadata"],
        serde_json::json!({
            "pod_name": "test-pod",
            "pod_namespace": "test-ns",
            "host_name": "test-host",
            "envoy_image": "envoyproxy/envoy:v1.40.0",
        }),
        "{info:#}"
    );

    // Envoy loaded the client certificate through the SDS file (SDS-delivered certs are
    // listed as "<inline>") and the CA from the validation context's file.
    let ca_crt = fx.opts.client_certificate_path.join("ca.crt");
    let loaded = wait_for(START_TIMEOUT, || {
        let certs = get_json(admin, "/certs");
        let ctx = &certs["certificates"][0];
        let chain_san = &ctx["cert_chain"][0]["subject_alt_names"][0]["dns"];
        let ca = &ctx["ca_cert"][0];
        (chain_san == CLIENT_SAN
            && ca["path"] == ca_crt.to_str().unwrap()
            && ca["subject_alt_names"][0]["dns"] == CA_SAN)
            .then_some(())
    });
    assert!(
        loaded.is_some(),
        "client cert / CA not loaded: {:#}\n{}",
        get_json(admin, "/certs"),
        read_output(&out, &err)
    );

    // The bootstrap Envoy runs with is ours: SotW ADS over xds_cluster.
    let dump = get_json(admin, "/config_dump?mask=bootstrap");
    let bootstrap = dump["configs"]
        .as_array()
        .and_then(|cs| cs.iter().find_map(|c| c.get("bootstrap")))
        .unwrap_or_else(|| panic!("no bootstrap in config dump: {dump:#}"));
    assert_eq!(
        bootstrap["dynamic_resources"]["ads_config"]["api_type"], "GRPC",
        "{bootstrap:#}"
    );
    assert_eq!(
        bootstrap["dynamic_resources"]["ads_config"]["grpc_services"][0]["envoy_grpc"]["cluster_name"],
        "xds_cluster",
        "{bootstrap:#}"
    );

    // The admin access log from the bootstrap was opened.
    let log = PathBuf::from(&fx.opts.admin_access_log_path);
    assert!(
        wait_for(Duration::from_secs(5), || log.exists().then_some(())).is_some(),
        "admin access log {} not created",
        log.display()
    );

    drop(envoy);
}
