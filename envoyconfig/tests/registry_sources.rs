//! The committed Envoy type registry (`registry/envoy.descriptor.bin`, written by
//! `scripts/gen-registry`) matches what it claims to be built from: the `envoy-types`
//! version in `Cargo.lock` and that version's `.proto` files, and the cncf/xds `.proto`
//! files vendored in `proto/cncf-xds/` (commit in its `PROVENANCE`). Fails after an
//! `envoy-types` upgrade or a change of the vendored files until `scripts/gen-registry`
//! is run again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ring::digest::{SHA256, digest};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `key = value` lines of `registry/SOURCES` (comments skipped).
fn recorded() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(crate_dir().join("registry/SOURCES")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l
                .split_once(" = ")
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `envoy-types` version `Cargo.lock` resolves.
fn locked_envoy_types() -> String {
    let lock = std::fs::read_to_string(crate_dir().join("../Cargo.lock")).unwrap();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"envoy-types\"" {
            let version = lines.next().unwrap();
            return version
                .strip_prefix("version = \"")
                .and_then(|v| v.strip_suffix('"'))
                .unwrap()
                .to_string();
        }
    }
    panic!("envoy-types is not in Cargo.lock");
}

/// envoy-types' `proto/` folder: `$MARIN3R_ENVOY_PROTO_DIR`, else cargo's registry sources
/// (`$CARGO_HOME` or `~/.cargo`), where building this test put the crate.
fn envoy_types_proto_dir(version: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("MARIN3R_ENVOY_PROTO_DIR") {
        return dir.into();
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .unwrap();
    let src = cargo_home.join("registry/src");
    for index in std::fs::read_dir(&src).unwrap() {
        let dir = index
            .unwrap()
            .path()
            .join(format!("envoy-types-{version}/proto"));
        if dir.is_dir() {
            return dir;
        }
    }
    panic!(
        "envoy-types {version} sources not found under {} (set MARIN3R_ENVOY_PROTO_DIR to its proto/ folder)",
        src.display()
    );
}

/// What `scripts/gen-registry` records: SHA-256 of the sorted lines
/// "relative path NUL sha256(content) LF" of every `.proto` under `dir`.
fn protos_digest(dir: &Path) -> (String, usize) {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "proto") {
                let rel = path.strip_prefix(root).unwrap().to_str().unwrap();
                let content = std::fs::read(&path).unwrap();
                let mut line = rel.as_bytes().to_vec();
                line.push(0);
                line.extend(hex(digest(&SHA256, &content).as_ref()).as_bytes());
                line.push(b'\n');
                out.push(line);
            }
        }
    }
    let mut lines = Vec::new();
    walk(dir, dir, &mut lines);
    lines.sort();
    (hex(digest(&SHA256, &lines.concat()).as_ref()), lines.len())
}

#[test]
fn registry_matches_the_locked_envoy_types() {
    let recorded = recorded();
    let locked = locked_envoy_types();
    assert_eq!(
        recorded["envoy-types"], locked,
        "the registry was generated from envoy-types {} but Cargo.lock has {locked}: run scripts/gen-registry",
        recorded["envoy-types"]
    );
    let (protos, count) = protos_digest(&envoy_types_proto_dir(&locked));
    assert!(count > 450, "only {count} .proto files found");
    assert_eq!(
        recorded["envoy-types-protos-sha256"], protos,
        "envoy-types {locked}'s .proto files differ from the ones the registry was generated from: run scripts/gen-registry"
    );
}

#[test]
fn embedded_registry_is_the_generated_file() {
    let recorded = recorded();
    assert_eq!(
        hex(digest(&SHA256, marin3r_envoyconfig::registry::DESCRIPTOR_SET).as_ref()),
        recorded["descriptor-set-sha256"],
        "registry/envoy.descriptor.bin was changed by hand: run scripts/gen-registry"
    );
}

#[test]
fn registry_matches_the_vendored_cncf_xds() {
    let recorded = recorded();
    let dir = crate_dir().join("proto/cncf-xds");
    let (protos, count) = protos_digest(&dir);
    assert_eq!(
        count, 34,
        "cncf/xds has 34 .proto files, {count} are vendored"
    );
    assert_eq!(
        recorded["cncf-xds-protos-sha256"], protos,
        "proto/cncf-xds/ differs from the files the registry was generated from: run scripts/gen-registry"
    );
    let provenance = std::fs::read_to_string(dir.join("PROVENANCE")).unwrap();
    let commit = provenance
        .lines()
        .find_map(|l| l.strip_prefix("commit = "))
        .expect("PROVENANCE names the commit");
    assert_eq!(recorded["cncf-xds-commit"], commit);
    assert!(provenance.contains("license = Apache-2.0"));
    assert!(dir.join("LICENSE").is_file());
}

/// The registry keeps the `(udpa.annotations.sensitive) = true` field option of every
/// field the `.proto` files mark so (the set `marin3r_envoyconfig::sensitive` keeps out of
/// error texts): as many fields of the registry carry it as there are annotations in the
/// `.proto` files it was generated from.
#[test]
fn registry_keeps_every_sensitive_annotation() {
    fn count(dir: &Path) -> usize {
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                n += count(&path);
            } else if path.extension().is_some_and(|e| e == "proto") {
                let text = std::fs::read_to_string(&path).unwrap();
                n += text.matches("(udpa.annotations.sensitive) = true").count();
            }
        }
        n
    }
    let envoy = envoy_types_proto_dir(&locked_envoy_types()).join("data-plane-api");
    let annotated = count(&envoy) + count(&crate_dir().join("proto/cncf-xds"));
    let in_registry = marin3r_envoyconfig::sensitive::sensitive_fields().len();
    assert!(
        annotated > 0,
        "no sensitive annotation found under {}",
        envoy.display()
    );
    assert_eq!(
        in_registry, annotated,
        "the registry marks {in_registry} fields sensitive, the .proto files {annotated}"
    );
}
