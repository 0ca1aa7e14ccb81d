//! The public corpus (`envoyconfig/tests/corpus/`, see its README): every listener, cluster
//! and secret of every bootstrap that Envoy 1.40 accepts (`VERDICTS`) decodes, except the
//! files of [`REFUSED_WHEN_LOADED`] (accepted by `envoy --mode validate`, which does not
//! load TLS material; refused by a serving Envoy and by us), and every upstream MARIN3R
//! EnvoyConfig passes `validate_file`; what Envoy refuses is refused too, except the listed
//! [`KNOWN_DIFFERENCES`], each with its reason.
//!
//! Envoy 1.40 (`ENVOY_BIN`, as `scripts/test` exports it, else `.venv`; the test fails
//! without it) re-runs `envoy --mode validate` on every bootstrap and checks that its
//! verdicts are still the recorded ones.
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
    verdicts_with_reasons()
        .into_iter()
        .map(|(file, (accepted, _))| (file, accepted))
        .collect()
}

/// `file → (accepted by Envoy, Envoy's reason of a refusal)` from `VERDICTS`.
fn verdicts_with_reasons() -> BTreeMap<String, (bool, String)> {
    std::fs::read_to_string(corpus().join("VERDICTS"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut words = l.splitn(3, ' ');
            let verdict = words.next().unwrap();
            let file = words.next().unwrap().trim().to_string();
            let reason = words.next().unwrap_or_default().trim().to_string();
            assert!(verdict == "ACCEPT" || verdict == "REFUSE", "{l}");
            (file, (verdict == "ACCEPT", reason))
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
        if REFUSED_WHEN_LOADED.contains(&file.as_str()) {
            // Refused, and each error is one of the TLS loader's.
            assert!(
                !e.is_empty(),
                "{file} decodes: remove it from REFUSED_WHEN_LOADED"
            );
            for e in e {
                assert!(e.contains("(Envoy: Failed to"), "{e}");
            }
            continue;
        }
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
/// one with v2 types (which Envoy 1.40 no longer has) and the one with an HTTP filter
/// without `typed_config` (which Envoy's extension lookup refuses) are refused with the
/// path of their first listener.
#[test]
fn upstream_marin3r_envoyconfigs_validate() {
    let mut checked = 0;
    for (file, accepted) in verdicts() {
        if !file.starts_with("marin3r/") {
            continue;
        }
        let text = std::fs::read_to_string(corpus().join(&file)).unwrap();
        match validate_file(&text) {
            Ok(n) if accepted => checked += n,
            Ok(_) => panic!("{file}: Envoy refuses it, validate_file accepts it"),
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

/// Envoy 1.40 (`ENVOY_BIN`, never optional) still gives every recorded verdict; the
/// bootstraps are validated a few at a time.
#[test]
fn envoy_still_gives_the_recorded_verdicts() {
    let envoy = marin3r_testkit::envoy::envoy_bin();
    let scratch = tempfile_dir();
    let bootstraps: Vec<(String, bool)> = verdicts()
        .into_iter()
        .filter(|(file, _)| !file.starts_with("marin3r/")) // EnvoyConfigs, not bootstraps
        .collect();
    assert!(
        bootstraps.len() >= 300,
        "only {} bootstraps",
        bootstraps.len()
    );
    let wrong = marin3r_testkit::batches::in_batches(&bootstraps, |(file, accepted)| {
        let output = std::process::Command::new(&envoy)
            .args(["--mode", "validate", "-l", "critical", "-c"])
            .arg(corpus().join(file))
            .current_dir(&scratch)
            .output()
            .unwrap();
        (output.status.success() != *accepted).then(|| {
            format!(
                "{file}: recorded {}, Envoy says {}",
                if *accepted { "ACCEPT" } else { "REFUSE" },
                String::from_utf8_lossy(&output.stdout).trim()
            )
        })
    });
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A scratch folder Envoy may write into (some bootstraps name relative files).
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("marin3r-corpus-verdicts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Why marin3r accepts a bootstrap that Envoy refuses: what Envoy checks there is not in
/// the resources marin3r decodes.
const MISSING_FILE: &str = "Envoy opens a file that this machine lacks (certificate, Lua \
    script, Wasm module, runtime folder, secret file, MaxMind database, dynamic module); \
    marin3r does not read the data plane's file system";
const DUPLICATE_STATIC_SECRET: &str = "two static secrets of one name in a bootstrap; \
    marin3r has no literal secrets (they are generated from Kubernetes Secrets, one \
    resource per name, and duplicate names in an EnvoyConfig are refused)";
const ENVOY_CRASH: &str = "Envoy 1.40 crashes validating it (a backtrace, no config \
    error)";
const LISTENER_SEMANTICS: &str = "a rule of Envoy's listener manager across filter \
    chains (two chains with the same filter_chain_match), not a constraint of the protos";
const ADDRESS_SEMANTICS: &str = "a rule of Envoy's address code (ipv4_compat only on \
    '::' or an IPv4-mapped IPv6 address), not a constraint of the protos";

/// Files that `envoy --mode validate` accepts and we refuse: "Envoy refuses them when it
/// loads them; validate mode does not load TLS material". A serving Envoy 1.40 NACKs
/// each (`tests/tests/corpus_served.rs` served them before we refused them): Envoy
/// Gateway's placeholders where PEM goes (`cert-data`, `key-data`, `[redacted]`; "Failed
/// to load certificate chain / private key / trusted CA certificates from <inline>"), and
/// in `backend-tls-settings.yaml` cipher suite names as `ecdh_curves` ("Failed to
/// initialize ECDH curves"). The rules are in `src/tls.rs`, checked against Envoy by
/// `envoyconfig/tests/envoy_tls_loader.rs` and `tests/tests/tls_loader.rs`.
const REFUSED_WHEN_LOADED: &[&str] = &[
    "envoy-gateway/backend-tls-settings.yaml",
    "envoy-gateway/ext-auth-backend.yaml",
    "envoy-gateway/http-route-https-mtls-accept-untrusted.yaml",
    "envoy-gateway/http-route-https-mtls-allow-expired-cert.yaml",
    "envoy-gateway/http-route-with-clientcert.yaml",
    "envoy-gateway/jsonpatch.yaml",
    "envoy-gateway/jsonpatch-add-op-empty-jsonpath.yaml",
    "envoy-gateway/jsonpatch-add-op-without-value.yaml",
    "envoy-gateway/jsonpatch-move-op-with-value.yaml",
    "envoy-gateway/jsonpatch-with-jsonpath.yaml",
    "envoy-gateway/jsonpatch-with-jsonpath-invalid.yaml",
    "envoy-gateway/jwt-with-backend-tls-retry.yaml",
    "envoy-gateway/listener-enable-fingerprint.yaml",
    "envoy-gateway/listener-overlapping-tls-config.yaml",
    "envoy-gateway/listener-proxy-protocol.yaml",
    "envoy-gateway/listener-proxy-protocol-multi.yaml",
    "envoy-gateway/mixed-tls-jwt-authn.yaml",
    "envoy-gateway/multiple-listeners-same-port.yaml",
    "envoy-gateway/mutual-tls.yaml",
    "envoy-gateway/mutual-tls-required-client-certificate-disabled.yaml",
    "envoy-gateway/mutual-tls-san.yaml",
    "envoy-gateway/oidc-backend-cluster-provider.yaml",
    "envoy-gateway/sds-listener.yaml",
    "envoy-gateway/simple-tls.yaml",
    "envoy-gateway/suppress-envoy-headers.yaml",
    "envoy-gateway/tcproute-mtls.yaml",
    "envoy-gateway/tls-with-ciphers-versions-alpn.yaml",
];

/// Every bootstrap Envoy refuses that marin3r accepts, with the reason.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "envoy-examples/double-proxy__envoy-backend.yaml",
        MISSING_FILE,
    ),
    (
        "envoy-examples/double-proxy__envoy-frontend.yaml",
        MISSING_FILE,
    ),
    ("envoy-examples/fault-injection__envoy.yaml", MISSING_FILE),
    ("envoy-examples/lua__envoy.yaml", MISSING_FILE),
    ("envoy-examples/single-page-app__envoy.yml", MISSING_FILE),
    ("envoy-examples/tls-sni__envoy.yaml", MISSING_FILE),
    ("envoy-examples/wasm-cc__envoy.yaml", MISSING_FILE),
    (
        "envoy-gateway/backend-with-auto-san-sni.yaml",
        DUPLICATE_STATIC_SECRET,
    ),
    ("envoy-gateway/dynamicmodule.yaml", MISSING_FILE),
    (
        "envoy-gateway/geoip-authorization-direct-source-ip.yaml",
        MISSING_FILE,
    ),
    ("envoy-gateway/geoip-authorization.yaml", MISSING_FILE),
    (
        "envoy-gateway/http-route-dynamic-resolver-with-host-rewriting.yaml",
        ENVOY_CRASH,
    ),
    (
        "envoy-gateway/http-route-dynamic-resolver.yaml",
        ENVOY_CRASH,
    ),
    (
        "envoy-gateway/multiple-simple-tcp-route-same-port.yaml",
        LISTENER_SEMANTICS,
    ),
    (
        "envoy-gateway/tcp-listener-ipfamily.yaml",
        ADDRESS_SEMANTICS,
    ),
    (
        "envoy-gateway/tcp-route-tls-terminate.yaml",
        DUPLICATE_STATIC_SECRET,
    ),
];

/// How many files Envoy refuses and marin3r refuses too (bootstraps: one of their resources
/// does not decode; EnvoyConfigs: `validate_file` fails): 6 bootstraps with extensions of
/// Envoy's contrib build (not in the registry, nor in Envoy's release build), 9 written
/// bootstraps of `envoyconfig/tests/envoy_constraints.rs` (protoc-gen-validate constraints,
/// empty `Any`, missing `typed_config`), 2 written negative twins of YAML scalar typing
/// (`envoyconfig/tests/envoy_leniencies.rs`), 2 upstream MARIN3R EnvoyConfigs, and 21 Envoy
/// Gateway files that Envoy refuses for a file it lacks or a duplicate static secret and we
/// refuse for their placeholder PEM data or curve names (Envoy would refuse those too when
/// it loads them: [`REFUSED_WHEN_LOADED`]).
const REFUSED_BY_BOTH: usize = 40;

/// "Envoy refuses → marin3r refuses", as a figure: every file Envoy refuses is refused
/// here, or is one of [`KNOWN_DIFFERENCES`] (which must still be accepted here and
/// refused by Envoy for a reason that matches its class).
#[test]
fn what_envoy_refuses_is_refused_or_a_known_difference() {
    let known: BTreeMap<&str, &str> = KNOWN_DIFFERENCES.iter().copied().collect();
    let mut refused = Vec::new();
    let mut unexplained = Vec::new();
    let mut refused_now = Vec::new();
    for (file, (accepted, reason)) in verdicts_with_reasons() {
        if accepted {
            assert!(
                !known.contains_key(file.as_str()),
                "{file} is accepted by Envoy"
            );
            continue;
        }
        let refused_here = if file.starts_with("marin3r/") {
            let text = std::fs::read_to_string(corpus().join(&file)).unwrap();
            validate_file(&text).is_err()
        } else {
            !decode_bootstrap(&file).1.is_empty()
        };
        match (refused_here, known.get(file.as_str())) {
            (true, None) => refused.push(file),
            (true, Some(_)) => refused_now.push(file),
            (false, Some(why)) => {
                let matches = match *why {
                    MISSING_FILE => ["path", "file", "no file", "Maxmind", "dynamic module"]
                        .iter()
                        .any(|w| reason.contains(w)),
                    DUPLICATE_STATIC_SECRET => reason.starts_with("Duplicate static"),
                    ENVOY_CRASH => reason.contains("backtrace"),
                    LISTENER_SEMANTICS => reason.contains("same matching rules"),
                    ADDRESS_SEMANTICS => reason.contains("ipv4_compat"),
                    _ => false,
                };
                assert!(matches, "{file}: Envoy's reason {reason:?} is not {why:?}");
            }
            (false, None) => unexplained.push(format!("{file}: Envoy: {reason}")),
        }
    }
    assert!(
        refused_now.is_empty(),
        "refused now, remove them from KNOWN_DIFFERENCES: {refused_now:#?}"
    );
    assert!(
        unexplained.is_empty(),
        "Envoy refuses, marin3r accepts:\n{}",
        unexplained.join("\n")
    );
    assert_eq!(
        refused.len(),
        REFUSED_BY_BOTH,
        "refused by both: {refused:#?}"
    );
}
