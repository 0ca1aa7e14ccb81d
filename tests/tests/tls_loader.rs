//! The real Envoy 1.40's verdict on every row of `envoyconfig/tests/tls_cases/cases.json`
//! (what its TLS context loader accepts and refuses; `envoyconfig/tests/envoy_tls_loader.rs`
//! checks our decoder on the same rows). `envoy --mode validate` never builds TLS
//! contexts, so each row is loaded with `envoy --mode init_only`: a static bootstrap with
//! the row's listener (and a plain cluster it points at) or cluster; Envoy builds every
//! TLS context while it initializes, then exits (0 = accepted, 1 with the loader's error).
//! The listener binds 127.0.0.1 port 0; the admin has no address (no socket).

// Test-only crate: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../envoyconfig/tests/tls_cases/mod.rs"]
mod tls_cases;

use std::process::{Command, Stdio};
use std::time::Duration;

use marin3r_tests::{KillOnDrop, envoy_bin, wait_for};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Envoy's verdict on one row: `Ok` or its log (the loader's error).
fn envoy_verdict(case: &tls_cases::Case, dir: &std::path::Path, i: usize) -> Result<(), String> {
    let (is_listener, resource) = tls_cases::resource(case);
    let plain = json!({"name": "c", "connect_timeout": "1s"});
    let resources = if is_listener {
        json!({"listeners": [resource], "clusters": [plain]})
    } else {
        json!({"clusters": [resource]})
    };
    let path = dir.join(format!("case-{i}.json"));
    std::fs::write(&path, json!({"static_resources": resources}).to_string()).unwrap();
    let log = dir.join(format!("case-{i}.log"));
    let mut envoy = KillOnDrop::spawn(
        "envoy",
        Command::new(envoy_bin())
            .args([
                "--mode",
                "init_only",
                "--disable-hot-restart",
                "-l",
                "error",
            ])
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    )
    .unwrap();
    let status = wait_for(TIMEOUT, || envoy.try_wait())
        .unwrap_or_else(|| panic!("{}: Envoy did not exit", case.name));
    if status.success() {
        Ok(())
    } else {
        Err(std::fs::read_to_string(&log).unwrap_or_default())
    }
}

/// Every row, a few Envoys at a time (each run is mostly Envoy starting up).
#[test]
fn envoy_agrees_with_every_case_of_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(usize, tls_cases::Case)> = tls_cases::cases().into_iter().enumerate().collect();
    assert!(cases.len() > 80, "{} cases", cases.len());
    let wrong = marin3r_testkit::batches::in_batches(&cases, |(i, case)| {
        let got = envoy_verdict(case, dir.path(), *i);
        let good = match (&got, case.envoy.as_str()) {
            (Ok(()), "accept") => true,
            (Err(log), want) => want != "accept" && log.contains(want),
            _ => false,
        };
        (!good).then(|| format!("{}: want {:?}, got {got:?}", case.name, case.envoy))
    });
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
