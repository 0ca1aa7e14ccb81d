//! `marin3r status` with the Envoys from CSDS, against a real local-mode discovery
//! service (in process, listeners on 127.0.0.1:0) and real Envoys 1.40, compared with
//! golden files (`cli/tests/golden/status/`; `UPDATE_GOLDEN=1` rewrites them). The fleet
//! shows the failures `docs/troubleshooting.md` walks through:
//!
//! - `kuard`: served and ACKed (SotW), its HTTPS certificate a Secret over SDS (shown by
//!   name and version only in the dump of its configuration);
//! - `broken`: its listener routes to a cluster that does not exist, Envoy NACKs it (the
//!   NACK threshold is high, so it is not rolled back): the NACK row shows Envoy's message;
//! - `tls`: its listener's certificate comes from a Secret that does not exist: the
//!   discovery service holds the node (nothing is sent until the Secret exists), the
//!   Envoy (Delta) has requested its runtime layer and got nothing;
//! - `stray`: an Envoy whose node id has no EnvoyConfig: held, nothing sent;
//! - `idle`: an EnvoyConfig without any Envoy connected.
//!
//! Versions (they hash the listener's random port) and ports are normalised.

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use marin3r_control_plane::local::LocalBackend;
use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::free_port;
use marin3r_tests::configs::{
    answering_listener, direct, envoy_config, http_listener, rejected_listener, sds_tls,
    tls_secret_yaml,
};
use marin3r_tests::xds::{Envoy, Xds, init_tracing, issue_bundle};
use serde_json::json;

mod support;
use support::{golden, normalise};

/// `marin3r status` (the binary) against `xds`: its `/status`, CSDS at `csds` (default:
/// its ADS listener) with its client certificate, and `extra` flags.
async fn status(xds: &Xds, csds: Option<String>, extra: &[&str]) -> (String, Option<i32>) {
    let url = format!("http://{}", xds.metrics);
    let csds = csds.unwrap_or_else(|| xds.xdss.to_string());
    let certs = xds.certs_dir.join("client");
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
            .args(["status", "--url", &url, "--csds-address", &csds])
            .arg("--csds-certificate-path")
            .arg(certs)
            .args(&extra)
            .output()
            .unwrap();
        (String::from_utf8(out.stdout).unwrap(), out.status.code())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_envoy_with_its_acks_nacks_and_held_nodes() {
    init_tracing();
    let [kuard_port, kuard_tls_port, broken_port, tls_port] =
        [(); 4].map(|()| free_port().unwrap());
    // kuard's HTTPS listener certificate, served over SDS from a Secret manifest.
    let cert = issue_bundle().unwrap().server;
    let files = [
        (
            "kuard.json",
            envoy_config(
                "kuard",
                vec![
                    json!({"type": "cluster", "value": {"name": "upstream", "connect_timeout": "1s"}}),
                    answering_listener(kuard_port, "kuard\n"),
                    json!({"type": "secret", "generateFromTlsSecret": "kuard-cert"}),
                    json!({"type": "listener", "value": http_listener(
                        "https", kuard_tls_port, direct("kuard\n"), Some(sds_tls("kuard-cert")))}),
                ],
            ),
        ),
        (
            "kuard-cert.yaml",
            tls_secret_yaml("kuard-cert", &cert.cert_pem, &cert.key_pem),
        ),
        (
            "broken.json",
            envoy_config("broken", vec![rejected_listener(broken_port)]),
        ),
        (
            "tls.json",
            envoy_config(
                "tls",
                vec![
                    json!({"type": "secret", "generateFromTlsSecret": "missing-cert"}),
                    json!({"type": "listener", "value": http_listener(
                        "https", tls_port, direct("tls\n"), Some(sds_tls("missing-cert")))}),
                ],
            ),
        ),
        ("idle.json", envoy_config("idle", vec![])),
    ];
    let xds = Xds::start_with(&files, |dir| {
        LocalBackend::new(dir).with_nack_threshold(1_000_000)
    })
    .await
    .unwrap();
    let _kuard = Envoy::start(&xds, "kuard", ApiType::Sotw).unwrap();
    let _broken = Envoy::start(&xds, "broken", ApiType::Sotw).unwrap();
    let _tls = Envoy::start(&xds, "tls", ApiType::Delta).unwrap();
    let _stray = Envoy::start(&xds, "stray", ApiType::Sotw).unwrap();

    // Wait until every Envoy is there and answered what it will answer, and two statuses
    // in a row agree.
    let ports = [
        kuard_port,
        kuard_tls_port,
        broken_port,
        tls_port,
        xds.xdss.port(),
    ];
    let mut last = String::new();
    let mut settled = None;
    for _ in 0..200 {
        let (text, code) = status(&xds, None, &[]).await;
        let row = |node: &str, ty: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{node} ")) && l.contains(&format!(" {ty} ")))
                .map(str::to_string)
                .unwrap_or_default()
        };
        if text == last
            && code == Some(0)
            && row("kuard", "listener").contains("ACKED")
            && row("kuard", "cluster").contains("ACKED")
            && row("kuard", "secret").contains("ACKED")
            && row("broken", "listener").contains("NACKED")
            && row("tls", "runtime").contains("REQUESTED")
            && row("stray", "runtime").contains("REQUESTED")
        {
            settled = Some(text);
            break;
        }
        last = text;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = settled.unwrap_or_else(|| panic!("never settled; last status:\n{last}"));
    eprintln!("---- marin3r status ----\n{text}------------------------");
    golden("local.txt", &normalise(&text, &ports));

    // One node's configuration, decoded: ready to diff or attach to a bug report.
    let (yaml, code) = status(&xds, None, &["kuard", "-o", "yaml"]).await;
    assert_eq!(code, Some(0), "{yaml}");
    golden("local-node-kuard.yaml", &normalise(&yaml, &ports));
    // The Secret is there by name and version; no key material in the dump.
    assert!(
        yaml.contains("    secret:\n    - name: kuard-cert\n"),
        "{yaml}"
    );
    let key_body = cert.key_pem.lines().nth(1).unwrap();
    assert!(
        !yaml.contains("PRIVATE KEY") && !yaml.contains(key_body),
        "{yaml}"
    );

    // -o json carries the whole NACK message.
    let (json, _) = status(&xds, None, &["-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let broken = json["envoys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["nodeID"] == "broken")
        .unwrap();
    let message = broken["types"][0]["nacks"][0]["message"].as_str().unwrap();
    assert!(message.contains("does-not-exist"), "{message}");

    // CSDS unreachable: the EnvoyConfigs anyway, a line why the Envoys are missing, exit 3.
    let closed = free_port().unwrap();
    let (text, code) = status(&xds, Some(format!("127.0.0.1:{closed}")), &[]).await;
    assert_eq!(code, Some(3), "{text}");
    golden(
        "local-csds-unreachable.txt",
        &normalise(
            &text,
            &[closed, kuard_port, kuard_tls_port, broken_port, tls_port],
        ),
    );
}
