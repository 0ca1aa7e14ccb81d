//! The `marin3r` binary end to end: offline injection, certificate issuance, init-manager
//! and the webhook process (start, serve, stop on SIGTERM).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use marin3r_tests::{KillOnDrop, assert_success, free_port, http_get_raw, wait_for};

fn marin3r() -> Command {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
}

const WORKLOADS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: kuard}
spec: {ports: [{port: 8443}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kuard, namespace: demo}
spec:
  selector: {matchLabels: {app: kuard}}
  template:
    metadata:
      labels: {app: kuard, marin3r.3scale.net/status: enabled}
      annotations:
        marin3r.3scale.net/node-id: kuard
        marin3r.3scale.net/ports: envoy-https:8443
    spec:
      containers:
      - {name: kuard, image: "gcr.io/kuar-demo/kuard-amd64:blue"}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 0 * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          labels: {marin3r.3scale.net/status: enabled}
          annotations: {marin3r.3scale.net/node-id: nightly}
        spec:
          restartPolicy: Never
          containers: [{name: job, image: job}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: plain}
spec:
  template:
    metadata: {labels: {app: plain}}
    spec: {containers: [{name: app, image: app}]}
"#;

fn json_file(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn run_with_stdin(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = marin3r()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn inject_rewrites_pod_templates_and_passes_other_objects_through() {
    let out = run_with_stdin(&["inject", "-f", "-"], WORKLOADS);
    assert_success(&out);
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(std::str::from_utf8(&out.stdout).unwrap()).unwrap();
    assert_eq!(docs.len(), 4);
    assert_eq!(docs[0]["kind"], "Service");
    assert!(docs[0]["spec"].get("template").is_none());

    let pod = &docs[1]["spec"]["template"]["spec"];
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kuard", "envoy-sidecar"]);
    assert_eq!(pod["initContainers"][0]["name"], "envoy-init-mgr");
    let init_args: Vec<&str> = pod["initContainers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        init_args
            .windows(2)
            .any(|w| w == ["--xdss-host", "marin3r-discoveryservice.demo.svc"]),
        "{init_args:?}"
    );
    assert_eq!(pod["containers"][1]["ports"][0]["containerPort"], 8443);

    let cron = &docs[2]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(cron["containers"][1]["name"], "envoy-sidecar");
    // Unlabelled template: unchanged.
    assert_eq!(
        docs[3]["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Injecting the output again changes nothing (idempotent).
    let again = run_with_stdin(
        &["inject", "-f", "-"],
        std::str::from_utf8(&out.stdout).unwrap(),
    );
    assert!(again.status.success());
    assert_eq!(again.stdout, out.stdout);
}

#[test]
fn inject_reports_invalid_annotations_and_fails() {
    let bad = WORKLOADS.replace("envoy-https:8443", "envoy-https:443");
    let out = run_with_stdin(&["inject", "-f", "-"], &bad);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Deployment/kuard: invalid marin3r annotations: ports: port 443 is privileged (1024-65535)"), "{err}");
    assert!(out.stdout.is_empty(), "nothing is half-printed");
}

#[test]
fn certs_and_init_manager_write_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = marin3r()
        .args(["--log-format", "text", "certs", "--out"])
        .arg(dir.path())
        .args(["--hosts", "localhost,127.0.0.1"])
        .output()
        .unwrap();
    assert_success(&out);
    for sub in ["ca", "server", "client"] {
        for f in ["tls.crt", "tls.key", "ca.crt"] {
            assert!(dir.path().join(sub).join(f).is_file(), "{sub}/{f}");
        }
    }

    let boot = dir.path().join("bootstrap");
    let out = marin3r()
        .args([
            "init-manager",
            "--xdss-host",
            "127.0.0.1",
            "--node-id",
            "kuard",
            "--api-type",
            "delta",
        ])
        .arg("--client-certificate-path")
        .arg(dir.path().join("client"))
        .arg("--config-file")
        .arg(boot.join("config.json"))
        .arg("--resources-path")
        .arg(&boot)
        .env("POD_NAME", "kuard-abc")
        .output()
        .unwrap();
    assert_success(&out);
    let config = json_file(&boot.join("config.json"));
    assert_eq!(config["node"]["id"], "kuard");
    assert_eq!(
        config["node"]["cluster"], "kuard",
        "cluster id defaults to the node id"
    );
    assert_eq!(config["node"]["metadata"]["pod_name"], "kuard-abc");
    assert_eq!(
        config["dynamic_resources"]["ads_config"]["api_type"],
        "DELTA_GRPC"
    );
    assert!(boot.join("tls_certificate_sds_secret.json").is_file());

    let out = marin3r()
        .args(["init-manager", "--xdss-host", "x"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "missing --node-id is a usage error"
    );
}

#[test]
fn init_manager_writes_config_json_under_resources_path_and_reads_env() {
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("boot");
    // Only --resources-path: the bootstrap goes to <resources-path>/config.json.
    let metadata = |extra: &[&str], env: &[(&str, &str)]| {
        let mut cmd = marin3r();
        cmd.args([
            "init-manager",
            "--xdss-host",
            "ds.example",
            "--node-id",
            "n",
        ])
        .arg("--resources-path")
        .arg(&boot)
        .args(extra)
        .env_remove("MARIN3R_POD_NAMESPACE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        assert_success(&cmd.output().unwrap());
        assert!(boot.join("tls_certificate_sds_secret.json").is_file());
        json_file(&boot.join("config.json"))["node"]["metadata"].clone()
    };
    let meta = metadata(
        &[],
        &[
            ("MARIN3R_POD_NAME", "from-marin3r-env"),
            ("POD_NAME", "from-downward-api"),
            ("POD_NAMESPACE", "ns1"),
            ("MARIN3R_HOST_NAME", "node-7"),
        ],
    );
    assert_eq!(
        meta["pod_name"], "from-marin3r-env",
        "MARIN3R_POD_NAME wins"
    );
    assert_eq!(
        meta["pod_namespace"], "ns1",
        "POD_NAMESPACE is the fallback"
    );
    assert_eq!(meta["host_name"], "node-7");
    // The flag beats both variables.
    let meta = metadata(
        &["--pod-name", "from-flag"],
        &[("MARIN3R_POD_NAME", "from-marin3r-env"), ("POD_NAME", "x")],
    );
    assert_eq!(meta["pod_name"], "from-flag");
}

#[test]
fn certs_key_type_rsa_writes_rsa_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = marin3r()
        .args([
            "--log-format",
            "text",
            "certs",
            "--key-type",
            "rsa",
            "--out",
        ])
        .arg(dir.path())
        .args(["--hosts", "localhost"])
        .output()
        .unwrap();
    assert_success(&out);
    for sub in ["ca", "server", "client"] {
        let key = std::fs::read_to_string(dir.path().join(sub).join("tls.key")).unwrap();
        // PKCS#8 RSA 2048: the rsaEncryption OID, and far longer than a P-256 key.
        assert!(
            key.starts_with("-----BEGIN PRIVATE KEY-----"),
            "{sub}: {key}"
        );
        assert!(
            key.len() > 1500,
            "{sub}: {} bytes is no RSA 2048 key",
            key.len()
        );
    }
}

#[test]
fn webhook_process_serves_probes_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let status = marin3r()
        .args(["certs", "--hosts", "localhost", "--out"])
        .arg(dir.path())
        .output()
        .unwrap()
        .status;
    assert!(status.success());
    let (https, probes, metrics) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let mut cmd = marin3r();
    cmd.args(["webhook", "--webhook-bind-address", "127.0.0.1"])
        .args(["--webhook-port", &https.to_string()])
        .arg("--tls-dir")
        .arg(dir.path().join("server"))
        .args([
            "--health-probe-bind-address",
            &format!("127.0.0.1:{probes}"),
        ])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{metrics}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop::spawn("webhook", &mut cmd).unwrap();
    let ready = wait_for(Duration::from_secs(10), || {
        http_get_raw(probes, "/readyz").filter(|r| r.starts_with("HTTP/1.1 200"))
    });
    assert!(ready.is_some(), "webhook never became ready");
    let metrics_text = http_get_raw(metrics, "/metrics").unwrap();
    assert!(metrics_text.contains("marin3r_webhook_requests_total{result=\"injected\"} 0"));

    let status = child.terminate(Duration::from_secs(10));
    let status = status.expect("no exit after SIGTERM");
    assert!(status.success(), "graceful exit, got {status}");
    let mut logs = String::new();
    let mut stderr = child.child.stderr.take().unwrap();
    stderr.read_to_string(&mut logs).unwrap();
    let first: serde_json::Value =
        serde_json::from_str(logs.lines().next().unwrap()).expect("JSON logs by default");
    assert!(first.get("level").is_some(), "{first}");
    assert!(logs.contains("shutting down"), "{logs}");
}

/// Starts `binary shutdown-manager` on a free port, waits for `/healthz`, returns the
/// program the process runs (`/proc/PID/exe`) and stops it with SIGTERM (exit 0).
fn shutdown_manager_exe(binary: &std::path::Path) -> std::path::PathBuf {
    let port = free_port().unwrap();
    let mut cmd = Command::new(binary);
    cmd.args(["--log-format", "text", "shutdown-manager", "--bind-address"])
        .args(["127.0.0.1", "--port", &port.to_string()])
        .args(["--envoy-admin-address", "http://127.0.0.1:9"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = KillOnDrop::spawn("shutdown-manager", &mut cmd).unwrap();
    let healthy = wait_for(Duration::from_secs(10), || {
        http_get_raw(port, "/healthz").filter(|r| r.starts_with("HTTP/1.1 200"))
    });
    assert!(
        healthy.is_some(),
        "{} never answered /healthz",
        binary.display()
    );
    let exe = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
    let status = child.terminate(Duration::from_secs(10));
    assert!(status.expect("no exit after SIGTERM").success());
    exe
}

#[test]
fn shutdown_manager_runs_as_the_small_binary_when_installed_and_in_process_otherwise() {
    // Installed next to marin3r (as cargo and the image do): the same process becomes it.
    let marin3r = std::path::PathBuf::from(env!("CARGO_BIN_EXE_marin3r"));
    let small = std::path::PathBuf::from(env!("CARGO_BIN_EXE_marin3r-shutdown-manager"));
    assert_eq!(small.parent(), marin3r.parent());
    assert_eq!(shutdown_manager_exe(&marin3r), small);

    // marin3r alone in a folder: it runs the shutdown manager itself.
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("marin3r");
    std::fs::hard_link(&marin3r, &alone)
        .or_else(|_| std::fs::copy(&marin3r, &alone).map(|_| ()))
        .unwrap();
    assert_eq!(shutdown_manager_exe(&alone), alone);
}

const BROKEN_CONFIG: &str = r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {name: broken, namespace: default}
spec:
  nodeID: broken
  resources:
    - type: cluster
      value: {name: a, connect_timeout: 1s, bogus_field: 1}
    - type: listener
      value:
        name: l
        address: {socket_address: {address: 127.0.0.1, port_value: 1}}
        filter_chains:
          - filters:
              - name: x
                typed_config: {"@type": type.googleapis.com/not.a.Type}
    - type: nonsense
      value: {name: n}
"#;

#[test]
fn validate_accepts_the_examples_and_lists_every_error() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/local/direct-response.yaml"
    );
    let out = marin3r()
        .args(["validate", "-f", example])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = run_with_stdin(&["validate", "-f", "-"], BROKEN_CONFIG);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["bogus_field", "not.a.Type", "nonsense"] {
        assert!(text.contains(needle), "{needle} missing in:\n{text}");
    }
    assert!(text.contains("spec.resources[0]"), "{text}");
    assert!(text.contains("spec.resources[1]"), "{text}");
    assert!(text.lines().count() >= 3, "one line per error:\n{text}");
}

#[test]
fn discovery_service_without_config_dir_fails_clearly() {
    let out = marin3r()
        .args(["discovery-service", "--xdss-port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config-dir"));
}

#[test]
fn crds_prints_the_crds_and_with_operator_the_operators() {
    let out = marin3r().arg("crds").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        marin3r_manifests::crds_yaml().unwrap()
    );
    let out = marin3r().args(["crds", "--operator"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, marin3r_manifests::operator_crds_yaml().unwrap());
    for kind in [
        "kind: DiscoveryService\n",
        "kind: DiscoveryServiceCertificate\n",
        "kind: EnvoyDeployment\n",
    ] {
        assert!(text.contains(kind), "{kind}");
    }
}

/// `marin3r operator render` exits non-zero naming each field the API server would refuse
/// an object for (here: a DiscoveryService name whose Service name exceeds 63 characters,
/// an unknown field, an object given twice), and prints nothing for those objects.
#[test]
fn operator_render_refuses_what_the_api_server_would_reject_naming_the_field() {
    let input = format!(
        r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {{name: {long}, namespace: apps}}
---
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {{name: ds, namespace: other}}
spec: {{replicas: 1, xdsServerPort: 8383}}
---
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: EnvoyDeployment
metadata: {{name: e, namespace: apps}}
spec: {{discoveryServiceRef: ds, envoyConfigRef: ec, replicas: {{statik: 2}}}}
---
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: EnvoyDeployment
metadata: {{name: e, namespace: apps}}
spec: {{discoveryServiceRef: ds, envoyConfigRef: ec}}
"#,
        long = "d".repeat(56)
    );
    let out = run_with_stdin(&["operator", "render", "-f", "-"], &input);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    for field in [
        "document 1 (DiscoveryService ddd",
        "metadata.name: ",
        "document 2 (DiscoveryService ds): spec.metricsPort: port 8383 is already used by spec.xdsServerPort",
        "document 3 (EnvoyDeployment e): spec.replicas.statik: unknown field",
        "document 4 (EnvoyDeployment e): EnvoyDeployment apps/e is already defined by document 3",
    ] {
        assert!(stderr.contains(field), "{field}: {stderr}");
    }
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Control characters a terminal acts on, as YAML double-quoted escapes (the input) and
/// as the characters themselves (a file name).
const HOSTILE_YAML: [&str; 8] = [
    r"\e[2J",
    r"\e[1A\e[2K",
    r"\e]52;c;QUJD\a",
    r"\e]8;;https://evil.example\e\\",
    r"ok\rEVIL",
    r"\x9b2J\x7f",
    r"abc\u202efed",
    r"a\tb\nc",
];

/// A character `marin3r_cli::terminal` escapes, other than a newline.
fn raw_control(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c != '\n' && c.is_control())
                || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// Every human-readable message of the binary (`validate`'s lines, `operator render`'s
/// problems, the error line of `inject`) writes values with control characters as text.
#[test]
fn human_messages_write_no_control_character_from_the_input() {
    let dir = tempfile::tempdir().unwrap();
    for h in HOSTILE_YAML {
        let quoted = format!("\"x{h}y\"");
        let cases: Vec<(&str, Vec<String>, String)> = vec![
            (
                "validate",
                vec!["validate".into(), "-f".into(), "-".into()],
                BROKEN_CONFIG
                    .replace("name: broken", &format!("name: {quoted}"))
                    .replace("bogus_field: 1", &format!("{quoted}: 1"))
                    .replace("type: nonsense", &format!("type: {quoted}")),
            ),
            (
                "operator render",
                vec!["operator".into(), "render".into(), "-f".into(), "-".into()],
                format!(
                    "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryService\n\
                     metadata: {{name: {quoted}, namespace: {quoted}}}\nspec: {{{quoted}: 1}}\n"
                ),
            ),
            (
                "inject",
                vec!["inject".into(), "-f".into(), "-".into()],
                WORKLOADS.replace(
                    "marin3r.3scale.net/ports: envoy-https:8443",
                    &format!("marin3r.3scale.net/ports: {quoted}"),
                ),
            ),
        ];
        for (what, args, input) in cases {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run_with_stdin(&args, &input);
            assert!(!out.status.success(), "{what} {h}: accepted");
            for stream in [&out.stdout, &out.stderr] {
                let text = String::from_utf8_lossy(stream);
                assert!(raw_control(&text).is_empty(), "{what} {h}: {text:?}");
            }
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("x")
                    || String::from_utf8_lossy(&out.stderr).contains("x"),
                "{what} {h}: the value is shown"
            );
        }
        // A file name with the characters themselves.
        let unquoted: String = serde_saphyr::from_str::<String>(&format!("\"{h}\"")).unwrap();
        let file = dir
            .path()
            .join(format!("f{}.yaml", unquoted.replace('/', "_")));
        std::fs::write(&file, BROKEN_CONFIG).unwrap();
        let out = marin3r()
            .arg("validate")
            .arg("-f")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(raw_control(&text).is_empty(), "validate {h}: {text:?}");
        assert!(text.contains("bogus_field"), "{text}");
    }
}
