//! The public corpus (`tests/corpus/`, see its README): every listener, cluster and
//! secret of every bootstrap that Envoy 1.40 accepts (`VERDICTS`) decodes, and every
//! upstream MARIN3R EnvoyConfig passes `validate_file`.
//!
//! `MARIN3R_ENVOY=<envoy binary>` also re-runs `envoy --mode validate` on every bootstrap
//! and checks that its verdicts are still the recorded ones.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use marin3r_envoyconfig::decode::{Serialization, decode_resource, parse_text};
use marin3r_envoyconfig::envoyconfig::validate_file;
use marin3r_envoyconfig::resource::ResourceType;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// `file → accepted by Envoy` from `VERDICTS`.
fn verdicts() -> BTreeMap<String, bool> {
    std::fs::read_to_string(corpus().join("VERDICTS"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut words = l.split_whitespace();
            let verdict = words.next().unwrap();
            let file = words.next().unwrap().to_string();
            assert!(verdict == "ACCEPT" || verdict == "REFUSE", "{l}");
            (file, verdict == "ACCEPT")
        })
        .collect()
}

/// Decodes the static listeners, clusters and secrets of a bootstrap: (resources,
/// errors).
fn decode_bootstrap(file: &str) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(corpus().join(file)).unwrap();
    let doc = parse_text(&text, Serialization::Yaml).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut count = 0;
    let mut errors = Vec::new();
    for (field, kind) in [
        ("listeners", ResourceType::Listener),
        ("clusters", ResourceType::Cluster),
        ("secrets", ResourceType::Secret),
    ] {
        let Some(items) = doc["static_resources"][field].as_array() else {
            continue;
        };
        for (i, item) in items.iter().enumerate() {
            count += 1;
            // Envoy names an unnamed static listener itself; a listener served over
            // xDS needs its name, which marin3r requires.
            let mut item = item.clone();
            if kind == ResourceType::Listener && item.get("name").is_none() {
                item["name"] = format!("static-listener-{i}").into();
            }
            if let Err(e) = decode_resource(kind, &item) {
                errors.push(format!("{file}: static_resources.{field}[{i}]: {e}"));
            }
        }
    }
    (count, errors)
}

#[test]
fn every_resource_envoy_accepts_decodes() {
    let verdicts = verdicts();
    let accepted: Vec<&String> = verdicts
        .iter()
        .filter(|(f, a)| **a && !f.starts_with("marin3r/"))
        .map(|(f, _)| f)
        .collect();
    assert!(
        accepted.len() >= 300,
        "only {} accepted files",
        accepted.len()
    );
    let mut resources = 0;
    let mut errors = Vec::new();
    for file in &accepted {
        let (n, e) = decode_bootstrap(file);
        resources += n;
        errors.extend(e);
    }
    assert!(resources >= 1000, "only {resources} resources");
    assert!(
        errors.is_empty(),
        "{} of {resources} resources of {} files Envoy accepts do not decode:\n{}",
        errors.len(),
        accepted.len(),
        errors.join("\n")
    );
}

#[test]
fn every_bootstrap_has_a_verdict() {
    let verdicts = verdicts();
    let mut files = 0;
    for dir in std::fs::read_dir(corpus()).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let dir_name = dir.file_name().unwrap().to_str().unwrap().to_string();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = format!(
                "{dir_name}/{}",
                entry.unwrap().file_name().to_str().unwrap()
            );
            assert!(verdicts.contains_key(&name), "{name} has no verdict");
            files += 1;
        }
    }
    assert_eq!(
        files,
        verdicts.len(),
        "VERDICTS names files that are not there"
    );
}

/// Upstream MARIN3R's EnvoyConfigs: those whose resources Envoy accepts validate; the
/// one with v2 types (which Envoy 1.40 no longer has) is refused with its path.
#[test]
fn upstream_marin3r_envoyconfigs_validate() {
    let mut checked = 0;
    for (file, accepted) in verdicts() {
        if !file.starts_with("marin3r/") {
            continue;
        }
        let text = std::fs::read_to_string(corpus().join(&file)).unwrap();
        match validate_file(&text) {
            Ok(n) => checked += n,
            Err(e) if accepted => panic!("{file}:\n{}", e.join("\n")),
            Err(e) => assert!(
                e.iter()
                    .any(|e| e.contains("spec.envoyResources.listeners[0].value")),
                "{file}: {e:?}"
            ),
        }
    }
    assert!(checked >= 5, "only {checked} EnvoyConfigs");
}

#[test]
fn envoy_still_gives_the_recorded_verdicts() {
    let Some(envoy) = std::env::var_os("MARIN3R_ENVOY") else {
        return;
    };
    let scratch = std::env::temp_dir().join("marin3r-corpus-verdicts");
    std::fs::create_dir_all(&scratch).unwrap();
    for (file, accepted) in verdicts() {
        if file.starts_with("marin3r/") {
            continue; // EnvoyConfigs, not bootstraps
        }
        let status = std::process::Command::new(&envoy)
            .args(["--mode", "validate", "-l", "critical", "-c"])
            .arg(corpus().join(&file))
            .current_dir(&scratch)
            .output()
            .unwrap()
            .status;
        assert_eq!(status.success(), accepted, "{file}");
    }
}
