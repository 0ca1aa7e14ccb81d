//! `marin3r status` against a real `marin3r discovery-service --config-dir` process:
//! the `kubectl get ec`-like table (aligned columns, `--revisions`), `-o json`, the
//! `--nack-threshold` / `--state-dir` flags (revisions survive a restart), and a clear
//! error for an unreachable URL; and the status client (`GET /status`, `DELETE
//! /status/revisions/…`) against local mode's routes in process. No Envoy is needed: a
//! config that does not decode is tainted by the discovery service itself, which gives a
//! `Rollback` to show.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use marin3r_tests::{KillOnDrop, assert_success, free_port, http_get_raw, wait_for};

fn marin3r() -> Command {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
}

fn envoy_config(cluster_value: &str) -> String {
    format!(
        r#"apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: kuard, namespace: default}}
spec:
  nodeID: kuard
  envoyAPI: v3
  resources:
    - type: cluster
      value: {cluster_value}
"#
    )
}

const GOOD: &str = "{name: kuard, connect_timeout: 1s}";
const BROKEN: &str = "{name: kuard, connect_timeout: 1s, bogus_field: 1}";

/// A local-mode discovery service on 127.0.0.1; returns the process and the `marin3r
/// status` flags that reach it (its metrics port, its CSDS and a client certificate).
fn start_discovery_service(dir: &Path) -> (KillOnDrop, Vec<String>) {
    let (xdss, metrics, probes) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let mut cmd = marin3r();
    cmd.args(["--log-format", "text", "discovery-service"])
        .args(["--xdss-bind-address", "127.0.0.1"])
        .args(["--xdss-port", &xdss.to_string()])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{metrics}")])
        .args([
            "--health-probe-bind-address",
            &format!("127.0.0.1:{probes}"),
        ])
        .arg("--server-certificate-path")
        .arg(dir.join("certs/server"))
        .arg("--ca-certificate-path")
        .arg(dir.join("certs/ca"))
        .arg("--config-dir")
        .arg(dir.join("config"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--nack-threshold", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = KillOnDrop::spawn("discovery-service", &mut cmd).unwrap();
    let ready = wait_for(Duration::from_secs(20), || {
        http_get_raw(probes, "/readyz").filter(|r| r.starts_with("HTTP/1.1 200"))
    });
    assert!(ready.is_some(), "the discovery service never became ready");
    let flags = vec![
        "--url".to_string(),
        format!("http://127.0.0.1:{metrics}"),
        "--csds-address".to_string(),
        format!("127.0.0.1:{xdss}"),
        "--csds-certificate-path".to_string(),
        dir.join("certs/client").display().to_string(),
    ];
    (child, flags)
}

/// The output of `marin3r status` (exit 0), without its ENVOYS section (no Envoy here).
fn status(flags: &[String], extra: &[&str]) -> String {
    let out = marin3r()
        .arg("status")
        .args(flags)
        .args(extra)
        .output()
        .unwrap();
    assert_success(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    if extra.contains(&"json") {
        return text;
    }
    let (configs, envoys) = text
        .split_once("\nENVOYS\n")
        .unwrap_or_else(|| panic!("no ENVOYS section:\n{text}"));
    assert!(
        envoys.starts_with("No Envoy is connected.\nNo Envoy connected for node kuard.\n"),
        "{text}"
    );
    configs.to_string()
}

/// The cells of a table line, cut at the column starts of its header.
fn cells<'a>(header: &str, line: &'a str, columns: &[&str]) -> Vec<&'a str> {
    let starts: Vec<usize> = columns
        .iter()
        .map(|c| header.find(c).unwrap_or_else(|| panic!("{c} in {header}")))
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let end = starts
                .get(i + 1)
                .copied()
                .unwrap_or(line.len())
                .min(line.len());
            line.get(s..end).unwrap_or_default().trim_end()
        })
        .collect()
}

#[test]
fn status_prints_envoyconfigs_like_kubectl_get_ec() {
    let dir = tempfile::tempdir().unwrap();
    let certs = marin3r()
        .args(["certs", "--hosts", "localhost,127.0.0.1", "--out"])
        .arg(dir.path().join("certs"))
        .output()
        .unwrap();
    assert!(certs.status.success());
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    let file = dir.path().join("config/kuard.yaml");
    std::fs::write(&file, envoy_config(GOOD)).unwrap();
    let (process, flags) = start_discovery_service(dir.path());

    let table = status(&flags, &[]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    let columns = [
        "NAME",
        "NODE ID",
        "ENVOY API",
        "DESIRED VERSION",
        "PUBLISHED VERSION",
        "CACHE STATE",
    ];
    assert!(
        lines[0].starts_with(
            "NAME    NODE ID   ENVOY API   DESIRED VERSION    PUBLISHED VERSION   CACHE STATE"
        ),
        "{table}"
    );
    let row = cells(lines[0], lines[1], &columns);
    assert_eq!(&row[..3], ["kuard", "kuard", "v3"], "{table}");
    let good = row[3].to_string();
    assert_eq!(good.len(), 16, "{table}");
    assert_eq!((row[4], row[5]), (good.as_str(), "InSync"), "{table}");

    // A config that does not decode is tainted: Rollback to the good one.
    let mut rewrite = std::fs::File::create(&file).unwrap();
    rewrite.write_all(envoy_config(BROKEN).as_bytes()).unwrap();
    drop(rewrite);
    let rolled_back = wait_for(Duration::from_secs(10), || {
        let t = status(&flags, &[]);
        t.contains("Rollback").then_some(t)
    })
    .unwrap_or_else(|| panic!("no Rollback:\n{}", status(&flags, &[])));
    let lines: Vec<&str> = rolled_back.lines().collect();
    let row = cells(lines[0], lines[1], &columns);
    let bad = row[3].to_string();
    assert_ne!(bad, good);
    assert_eq!(
        (row[4], row[5]),
        (good.as_str(), "Rollback"),
        "{rolled_back}"
    );

    // --revisions: oldest first, published and tainted flags, RFC 3339 times.
    let with_revisions = status(&flags, &["--revisions"]);
    let lines: Vec<&str> = with_revisions.lines().collect();
    assert_eq!(lines[2], "", "{with_revisions}");
    assert_eq!(
        lines[3], "Revisions of default/kuard (node ID kuard):",
        "{with_revisions}"
    );
    let rev_columns = [
        "VERSION",
        "PUBLISHED",
        "TAINTED",
        "CREATED AT",
        "LAST PUBLISHED AT",
    ];
    assert!(
        lines[4].starts_with("VERSION            PUBLISHED   TAINTED   CREATED AT"),
        "{with_revisions}"
    );
    let first = cells(lines[4], lines[5], &rev_columns);
    let second = cells(lines[4], lines[6], &rev_columns);
    assert_eq!(
        &first[..3],
        [good.as_str(), "true", "false"],
        "{with_revisions}"
    );
    assert_eq!(
        &second[..3],
        [bad.as_str(), "false", "true"],
        "{with_revisions}"
    );
    for time in [first[3], first[4], second[3]] {
        assert!(
            time.len() == 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
            "{time:?} is not RFC 3339:\n{with_revisions}"
        );
    }
    assert_eq!(second[4], "", "never published:\n{with_revisions}");

    // -o json is the /status document.
    let json: serde_json::Value = serde_json::from_str(&status(&flags, &["-o", "json"])).unwrap();
    let ec = &json["envoyConfigs"][0];
    assert_eq!(ec["cacheState"], "Rollback");
    assert!(
        ec["revisions"][1]["taintReason"]
            .as_str()
            .unwrap()
            .contains("bogus_field")
    );

    // --state-dir: the revisions survive a restart (SIGTERM, then start again).
    let mut process = process;
    assert!(process.terminate(Duration::from_secs(10)).is_some());
    assert!(dir.path().join("state/default_kuard.json").is_file());
    let (_process, flags) = start_discovery_service(dir.path());
    let after = status(&flags, &["--revisions"]);
    let lines: Vec<&str> = after.lines().collect();
    let row = cells(lines[0], lines[1], &columns);
    assert_eq!(
        (row[3], row[4], row[5]),
        (bad.as_str(), good.as_str(), "Rollback"),
        "{after}"
    );
    let second = cells(lines[4], lines[6], &rev_columns);
    assert_eq!(&second[..3], [bad.as_str(), "false", "true"], "{after}");
}

#[test]
fn status_reports_an_unreachable_discovery_service() {
    let port = free_port().unwrap();
    let out = marin3r()
        .args(["status", "--url", &format!("http://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot get the status from"), "{err}");

    let out = marin3r()
        .args(["status", "--url", "https://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only http://"));
}

/// The `marin3r status` client against local mode's `/status` routes, in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_routes_over_http_with_the_status_client() {
    use marin3r_cli::status::{ClientError, delete_revision, fetch};
    use marin3r_control_plane::Backend as _;
    use marin3r_control_plane::local::LocalBackend;
    use marin3r_envoyconfig::envoyconfig::CacheState;
    use serde_json::{Value, json};
    use std::future::IntoFuture as _;

    let dir = tempfile::tempdir().unwrap();
    let ec = |resources: Vec<Value>| {
        serde_json::to_string(&json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": "kuard"},
            "spec": {"nodeID": "kuard", "resources": resources},
        }))
        .unwrap()
    };
    let cluster = json!({"type": "cluster", "value": {"name": "a", "connect_timeout": "1s"}});
    std::fs::write(dir.path().join("kuard.json"), ec(vec![cluster])).unwrap();
    let ctx = marin3r_control_plane::Context::new(marin3r_xds::SharedStats::new());
    let mut backend = LocalBackend::new(dir.path()).with_nack_threshold(7);
    backend.start(&ctx).await.unwrap();
    assert_eq!(backend.engine().lock().unwrap().options().nack_threshold, 7);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(axum::serve(listener, backend.routes(&ctx)).into_future());

    let report = fetch(&url, Duration::from_secs(5)).await.unwrap();
    let kuard = &report.envoy_configs[0];
    assert_eq!(
        (kuard.namespace.as_str(), kuard.name.as_str()),
        ("default", "kuard")
    );
    assert_eq!(kuard.cache_state, Some(CacheState::InSync));
    let version = kuard.desired_version.clone().unwrap();

    let delete = |version: String| {
        let url = url.clone();
        async move { delete_revision(&url, "default", "kuard", &version, Duration::from_secs(5)).await }
    };
    // The current spec's revision comes back afresh.
    let after = delete(version.clone()).await.unwrap();
    assert_eq!(after.desired_version.as_deref(), Some(version.as_str()));
    let err = delete("0000".into()).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Status { status: 404, body, .. } if body.contains("no revision 0000")),
        "{err}"
    );
    server.abort();
}
