//! One home for each wire fact: every key, default port, mount path, image and name rule
//! users, Kubernetes or Envoy see by name is spelled in `wire/src` and imported
//! everywhere else. This scans the workspace's non-test Rust sources for the literals and
//! fails naming `file:line` and the constant to import instead.
//!
//! Scanned: `git ls-files '*.rs'`, minus files under a `tests/` directory, `testkit/`,
//! `bench/`, `fuzz/` and `wire/src/` (the home), minus test-only modules (`#[cfg(test)]
//! mod x;`), minus everything from the first `#[cfg(test)] mod … {` of a file on, minus
//! comment lines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How a literal is matched on a line.
#[derive(Clone, Copy)]
enum Match {
    /// As a substring.
    Text(&'static str),
    /// As a number not part of a longer word (`9901`, not `19901` or `v9901`).
    Number(&'static str),
}

/// The wire literals and where each lives.
const LITERALS: &[(Match, &str)] = &[
    (
        Match::Text("\"tls.crt\""),
        "marin3r_wire::secret_keys::TLS_CRT",
    ),
    (
        Match::Text("\"tls.key\""),
        "marin3r_wire::secret_keys::TLS_KEY",
    ),
    (
        Match::Text("\"ca.crt\""),
        "marin3r_wire::secret_keys::CA_CRT",
    ),
    (
        Match::Text("\"apiserver.crt\""),
        "marin3r_wire::olm::APISERVER_CRT",
    ),
    (
        Match::Text("\"apiserver.key\""),
        "marin3r_wire::olm::APISERVER_KEY",
    ),
    (
        Match::Text("\"/apiserver.local.config/certificates\""),
        "marin3r_wire::olm::APISERVER_CERT_DIR",
    ),
    (
        Match::Text("\"/tmp/k8s-webhook-server/serving-certs\""),
        "marin3r_wire::olm::WEBHOOK_CERT_DIR",
    ),
    (
        Match::Text("\"marin3r.3scale.net\""),
        "marin3r_wire::DOMAIN",
    ),
    (
        Match::Text("\"marin3r.3scale.net/"),
        "marin3r_wire::{INJECTION_LABEL, NODE_ID_ANNOTATION, SIDECAR_STATUS_ANNOTATION, CONFIG_VERSION_LABEL, ENVOY_API_LABEL, APPLIED_AT_ANNOTATION} or `<K as kube::Resource>::api_version`",
    ),
    (
        Match::Text("\"operator.marin3r.3scale.net"),
        "marin3r_wire::{OPERATOR_GROUP, RETIRED_CA_UNTIL_ANNOTATION, RETIRED_CA_SINCE_ANNOTATION} or `<K as kube::Resource>::api_version`",
    ),
    (
        Match::Text("\"pod_name\""),
        "marin3r_wire::POD_NAME_METADATA_KEY",
    ),
    (
        Match::Text("\"pod_namespace\""),
        "marin3r_wire::POD_NAMESPACE_METADATA_KEY",
    ),
    (
        Match::Text("finalizer.marin3r"),
        "marin3r_wire::REVISION_FINALIZER",
    ),
    (
        Match::Text("\"enabled\""),
        "marin3r_wire::INJECTION_ENABLED",
    ),
    (
        Match::Text("\"app.kubernetes.io/"),
        "marin3r_wire::app_labels",
    ),
    (
        Match::Text("\"envoy-sidecar-client-cert\""),
        "marin3r_wire::object_names::SIDECAR_CLIENT_CERTIFICATE",
    ),
    (Match::Number("18000"), "marin3r_wire::ports::XDSS"),
    (
        Match::Text("\"discovery\""),
        "marin3r_wire::ports::XDSS_NAME",
    ),
    (Match::Number("9901"), "marin3r_wire::ports::ENVOY_ADMIN"),
    (
        Match::Number("8090"),
        "marin3r_wire::ports::SHUTDOWN_MANAGER",
    ),
    (Match::Number("8383"), "marin3r_wire::ports::METRICS"),
    (Match::Number("8384"), "marin3r_wire::ports::PROBES"),
    (
        Match::Text("\"/healthz\""),
        "marin3r_wire::http_paths::HEALTHZ",
    ),
    (
        Match::Text("\"/readyz\""),
        "marin3r_wire::http_paths::READYZ",
    ),
    (Match::Text("\"/drain\""), "marin3r_wire::http_paths::DRAIN"),
    (
        Match::Text("\"/shutdown\""),
        "marin3r_wire::http_paths::SHUTDOWN",
    ),
    (Match::Text("/etc/envoy/"), "marin3r_wire::paths"),
    (Match::Text("/etc/marin3r/"), "marin3r_wire::paths"),
    (
        Match::Text("\"/dev/null\""),
        "marin3r_wire::paths::ENVOY_ADMIN_ACCESS_LOG",
    ),
    (
        Match::Text("envoyproxy/envoy:v"),
        "marin3r_wire::images::ENVOY",
    ),
    (
        Match::Text("quay.io/marin3r"),
        "marin3r_wire::images::MARIN3R",
    ),
    (
        Match::Text("\"v3\""),
        "EnvoyApi::as_str or marin3r_wire::ENVOY_API_V3",
    ),
    (
        Match::Text("\"default\""),
        "marin3r_wire::namespace_or_default (DEFAULT_NAMESPACE)",
    ),
    (Match::Text("\"openshift.io/"), "marin3r_wire::openshift"),
    (
        Match::Text("seccomp.security.alpha.kubernetes.io"),
        "marin3r_wire::openshift",
    ),
    (Match::Text("fn error_chain("), "marin3r_wire::error_chain"),
    (
        Match::Text("fn dns1123"),
        "marin3r_wire::{dns1123_label, dns1123_subdomain}",
    ),
    (
        Match::Text("fn is_dns1123"),
        "marin3r_wire::is_dns1123_subdomain",
    ),
    (
        Match::Text("fn is_dns_subdomain"),
        "marin3r_wire::is_dns1123_subdomain",
    ),
    (
        Match::Text("fn is_label_value"),
        "marin3r_wire::is_label_value",
    ),
    (Match::Text("fn iana_svc_name"), "marin3r_wire::port_name"),
    (Match::Text("fn port_name("), "marin3r_wire::port_name"),
    (
        Match::Text("fn namespace_or"),
        "marin3r_wire::{namespace_or_default, namespace_or, given_namespace}",
    ),
];

/// Lines that must spell a literal: arguments of derive macros take literals only. Each
/// is tied to its wire constant by a unit test next to it (`api_ready` in operator-api,
/// `the_derive_literals_are_the_wire_facts` in envoyconfig).
fn derive_argument(line: &str) -> bool {
    let t = line.trim();
    // `#[kube(group = "…")]`: `K::group(&())` is compared with the wire group.
    t.starts_with("group = \"")
        // `#[serde(rename = "v3")]` of EnvoyApi: compared with `EnvoyApi::as_str`.
        || t.starts_with("#[serde(rename = \"v3\")]")
        // `#[schemars(extend("default" = …))]`: the JSON Schema keyword, not a namespace.
        || t.starts_with("#[schemars(extend(\"default\"")
}

/// This workspace, or the checkout `MARIN3R_ONE_HOME_ROOT` names (to list another
/// tree's strays: `MARIN3R_ONE_HOME_ROOT=/path cargo test -p marin3r-wire --test one_home`).
fn workspace_root() -> PathBuf {
    match std::env::var_os("MARIN3R_ONE_HOME_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf(),
    }
}

/// The tracked Rust files; `None` outside a git checkout (a source tarball), where there
/// is nothing "tracked" to check.
fn rust_files(root: &Path) -> Option<Vec<String>> {
    let out = Command::new("git")
        .args(["ls-files", "*.rs"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|out| out.status.success())?;
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

fn excluded(path: &str) -> bool {
    path.split('/').any(|part| part == "tests")
        || ["testkit/", "bench/", "fuzz/", "wire/src/"]
            .iter()
            .any(|p| path.starts_with(p))
}

/// The directory of the child modules of `file` (`a/b.rs` → `a/b/`, `a/mod.rs` → `a/`).
fn module_dir(file: &str) -> String {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    match name {
        "mod.rs" | "lib.rs" | "main.rs" => prefix,
        _ => format!("{prefix}{}/", name.trim_end_matches(".rs")),
    }
}

/// The lines of `text` that are not test code, numbered from 1, and the files of the
/// test-only modules it declares (`#[cfg(test)] mod x;`).
fn product_lines(file: &str, text: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::new();
    let mut test_modules = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim().starts_with("#[") {
                j += 1;
            }
            let item = lines.get(j).map_or("", |l| l.trim());
            let item = item.strip_prefix("pub ").unwrap_or(item);
            if let Some(name) = item.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                let dir = module_dir(file);
                test_modules.push(format!("{dir}{name}.rs"));
                test_modules.push(format!("{dir}{name}/mod.rs"));
                i = j + 1;
                continue;
            }
            // An inline test module (or any other test item): the rest is test code.
            break;
        }
        kept.push((i + 1, lines[i].to_string()));
        i += 1;
    }
    (kept, test_modules)
}

fn matches(line: &str, m: Match) -> bool {
    match m {
        Match::Text(t) => line.contains(t),
        Match::Number(n) => line.match_indices(n).any(|(at, _)| {
            let before = line[..at].chars().next_back();
            let after = line[at + n.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            !word(before) && !word(after)
        }),
    }
}

/// Every occurrence of a wire literal outside its home: `file:line: literal (use …)`.
fn strays(root: &Path, files: Vec<String>) -> Vec<String> {
    let files: Vec<String> = files.into_iter().filter(|f| !excluded(f)).collect();
    let mut sources = Vec::new();
    let mut test_only = BTreeSet::new();
    for file in &files {
        // A file listed but gone (deleted in the working tree) has nothing to say.
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        let (lines, tests) = product_lines(file, &text);
        test_only.extend(tests);
        sources.push((file, lines));
    }
    let mut found = Vec::new();
    for (file, lines) in sources {
        if test_only.contains(file.as_str()) {
            continue;
        }
        for (n, line) in lines {
            if line.trim_start().starts_with("//") || derive_argument(&line) {
                continue;
            }
            for &(m, home) in LITERALS {
                if matches(&line, m) {
                    let (Match::Text(l) | Match::Number(l)) = m;
                    found.push(format!("{file}:{n}: {l} (use {home}): {}", line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn every_wire_literal_lives_in_wire() {
    let root = workspace_root();
    let Some(files) = rust_files(&root) else {
        eprintln!("{}: not a git checkout, nothing scanned", root.display());
        return;
    };
    let found = strays(&root, files);
    assert!(
        found.is_empty(),
        "wire literals outside wire/src (import the constant instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_what_it_must() {
    // The scanner itself: a literal in product code is found, test code and comments
    // are not, and a `#[cfg(test)] mod x;` makes x.rs a test file.
    let text = "const A: u16 = 9901;\n// 9901\nlet p = 19901;\n#[cfg(test)]\nmod fixtures;\nlet t = \"tls.crt\";\n#[cfg(test)]\nmod tests {\n    const B: &str = \"ca.crt\";\n}\n";
    let (lines, tests) = product_lines("operator/src/certificate/mod.rs", text);
    assert_eq!(
        tests,
        [
            "operator/src/certificate/fixtures.rs",
            "operator/src/certificate/fixtures/mod.rs"
        ]
    );
    let hits: Vec<usize> = lines
        .iter()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| LITERALS.iter().any(|&(m, _)| matches(l, m)))
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(hits, [1, 6]);
    assert_eq!(
        module_dir("operator/src/objects.rs"),
        "operator/src/objects/"
    );
    assert_eq!(module_dir("sidecar/src/lib.rs"), "sidecar/src/");
    assert!(excluded("control-plane/tests/kube_backend.rs"));
    assert!(excluded("wire/src/lib.rs"));
    assert!(!excluded("sidecar/src/annotations.rs"));
    assert!(derive_argument("    group = \"marin3r.3scale.net\","));
}
