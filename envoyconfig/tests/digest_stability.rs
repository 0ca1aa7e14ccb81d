//! Canonical encoding and version digests do not move: every resource of a fixed set of
//! existing fixtures and examples keeps the digest and canonical bytes recorded in
//! `fixtures/digests/golden.txt` (written by the decoder before Envoy's YAML leniencies,
//! empty `Any` and the cncf/xds types were added). Inputs that decoded before must give
//! the same versions after any decoder change.
//!
//! Regenerate only for an intended change of the encoding:
//! `MARIN3R_WRITE_GOLDEN=1 cargo test -p marin3r-envoyconfig --test digest_stability`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use marin3r_envoyconfig::envoyconfig::{SecretData, SecretSource, parse_envoy_config, resolve};
use marin3r_envoyconfig::manifest::documents;
use marin3r_envoyconfig::resource::fnv1a64;

/// Files of the repository, relative to the workspace root.
const INPUTS: &[&str] = &[
    "envoyconfig/tests/fixtures/decode/direct_response.yaml",
    "envoyconfig/tests/fixtures/decode/kuard_tls.yaml",
    "envoyconfig/tests/fixtures/decode/kuard_tls_camel.json",
    "envoyconfig/tests/fixtures/decode/kuard_tls_deprecated.yaml",
    "examples/local/direct-response.yaml",
    "manifests/examples/kuard/envoyconfig.yaml",
    "manifests/examples/kuard/envoyconfig-envoyresources.yaml",
    "manifests/examples/kuard-http/envoyconfig.yaml",
    "manifests/examples/kuard-http/broken-update.yaml",
    "manifests/examples/shutdown-manager/envoyconfig.yaml",
];

/// Any Secret exists, with fixed TLS data (throwaway PEM: placeholders such as `CERT`,
/// used here until the decoder refused what Envoy's TLS loader refuses, do not decode;
/// the secrets' lines of the golden file were regenerated then, nothing else moved).
struct FakeSecrets;

impl SecretSource for FakeSecrets {
    fn get(&self, _name: &str) -> Option<SecretData> {
        let mut data = BTreeMap::new();
        data.insert(
            "tls.crt".to_string(),
            include_bytes!("tls_cases/ec.crt").to_vec(),
        );
        data.insert(
            "tls.key".to_string(),
            include_bytes!("tls_cases/ec.key").to_vec(),
        );
        data.insert(
            "ca.crt".to_string(),
            include_bytes!("tls_cases/rsa.crt").to_vec(),
        );
        Some(SecretData {
            type_: "kubernetes.io/tls".into(),
            data,
        })
    }
}

/// One line per resource: `file kind name digest fnv(canonical bytes)`.
fn current() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut out = String::new();
    for input in INPUTS {
        let text = std::fs::read_to_string(format!("{root}/{input}")).unwrap();
        for doc in documents(&text).unwrap() {
            if doc["kind"].as_str() != Some("EnvoyConfig") {
                continue;
            }
            let config = parse_envoy_config(&doc).unwrap();
            let Ok(resources) = resolve(&config.spec, &FakeSecrets) else {
                out.push_str(&format!("{input} refused\n"));
                continue;
            };
            for r in resources {
                out.push_str(&format!(
                    "{input} {} {:?} {:016x} {:016x}\n",
                    r.kind,
                    r.name,
                    r.digest,
                    fnv1a64(&r.body.value)
                ));
            }
        }
    }
    out
}

#[test]
fn digests_and_bytes_are_unchanged() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/digests/golden.txt"
    );
    let now = current();
    if std::env::var_os("MARIN3R_WRITE_GOLDEN").is_some() {
        std::fs::write(path, &now).unwrap();
    }
    let golden = std::fs::read_to_string(path).unwrap();
    assert!(golden.lines().count() >= 10, "too few resources:\n{golden}");
    assert_eq!(now, golden);
}
