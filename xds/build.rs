//! Build step: compiles the complete Envoy v3 API into a protobuf `FileDescriptorSet`
//! (`$OUT_DIR/envoy_descriptor_set.bin`, embedded by `src/registry.rs`).
//!
//! The `.proto` sources are the ones the `envoy-types` crate ships (its `proto/` folder:
//! `data-plane-api`, `xds`, `googleapis`, `protoc-gen-validate`, `cel-spec`, `client_model`,
//! `opentelemetry-proto`, `ratelimit`), so the registry always matches the Rust types this
//! crate serves. Every `envoy/**/*.proto`, `xds/**/*.proto` and `udpa/**/*.proto` is
//! compiled with `protoc --include_imports`, which adds everything they import (Google
//! well-known types, `validate`, `cel`, OpenTelemetry, …).
//!
//! Requirements and knobs:
//! - `protoc` (Debian: `apt-get install protobuf-compiler libprotobuf-dev`; the latter holds
//!   `google/protobuf/*.proto`). `$PROTOC` picks another binary, `$PROTOC_INCLUDE` adds the
//!   folder holding `google/protobuf/*.proto` when that protoc has no bundled includes.
//! - The `envoy-types` source folder is found with `cargo metadata --frozen` (no network,
//!   no lock writes; it does not take the build lock). `$MARIN3R_ENVOY_PROTO_DIR` overrides
//!   it with a `proto/` folder of the same layout.
//!
//! The step takes well under a second (protoc ≈ 0.6 s, cargo metadata ≈ 0.2 s) and reruns
//! only when `Cargo.lock` (an `envoy-types` upgrade), this file or one of the variables
//! above changes. The pure-Rust `protox` compiler is not used: 0.10 rejects Envoy's
//! relative type references (`common.dynamic_forward_proxy.v3.DnsCacheConfig`) that
//! protoc accepts.

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

type BoxError = Box<dyn Error>;

/// Include roots inside envoy-types' `proto/` folder.
const INCLUDE_ROOTS: [&str; 8] = [
    "data-plane-api",
    "xds",
    "googleapis",
    "protoc-gen-validate",
    "cel-spec/proto",
    "client_model",
    "opentelemetry-proto",
    "ratelimit/api",
];

/// (include root, folder under it) whose every `.proto` is compiled.
const COMPILED: [(&str, &str); 3] = [("data-plane-api", "envoy"), ("xds", "xds"), ("xds", "udpa")];

fn main() -> Result<(), BoxError> {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PROTOC");
    println!("cargo::rerun-if-env-changed=PROTOC_INCLUDE");
    println!("cargo::rerun-if-env-changed=MARIN3R_ENVOY_PROTO_DIR");

    let proto_dir = match std::env::var_os("MARIN3R_ENVOY_PROTO_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => envoy_types_proto_dir()?,
    };
    // Absolute, so protoc maps every file to its include root.
    let proto_dir = fs::canonicalize(&proto_dir)
        .map_err(|e| format!("envoy proto folder {}: {e}", proto_dir.display()))?;
    if !proto_dir.join("data-plane-api/envoy").is_dir() {
        return Err(format!(
            "{} does not hold data-plane-api/envoy (the envoy-types proto/ layout)",
            proto_dir.display()
        )
        .into());
    }

    let mut files = Vec::new();
    for (root, sub) in COMPILED {
        collect_protos(&proto_dir.join(root).join(sub), &mut files)?;
    }
    files.sort();

    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?)
        .join("envoy_descriptor_set.bin");
    let protoc = std::env::var_os("PROTOC").unwrap_or_else(|| "protoc".into());
    let mut cmd = Command::new(&protoc);
    for root in INCLUDE_ROOTS {
        cmd.arg(format!("-I{}", proto_dir.join(root).display()));
    }
    if let Some(include) = std::env::var_os("PROTOC_INCLUDE") {
        cmd.arg(format!("-I{}", Path::new(&include).display()));
    }
    cmd.arg("--include_imports")
        .arg(format!("--descriptor_set_out={}", out.display()))
        .args(&files);
    let output = cmd.output().map_err(|e| {
        format!(
            "cannot run {:?} ({e}): install protoc (Debian: apt-get install protobuf-compiler \
             libprotobuf-dev) or point $PROTOC at it",
            protoc
        )
    })?;
    if !output.status.success() {
        return Err(format!(
            "{:?} failed ({}) compiling {} Envoy protos from {}:\n{}",
            protoc,
            output.status,
            files.len(),
            proto_dir.display(),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
}

/// Finds `proto/` of the `envoy-types` package this crate depends on, via `cargo metadata`.
fn envoy_types_proto_dir() -> Result<PathBuf, BoxError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR unset")?);
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--frozen",
            "--manifest-path",
        ])
        .arg(manifest_dir.join("Cargo.toml"))
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed (set MARIN3R_ENVOY_PROTO_DIR to envoy-types' proto/ folder \
             instead):\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    if let Some(root) = meta["workspace_root"].as_str() {
        // An envoy-types upgrade shows up in the lock file.
        println!("cargo::rerun-if-changed={root}/Cargo.lock");
    }

    // The envoy-types package id in this crate's resolved dependencies.
    let own_manifest = manifest_dir.join("Cargo.toml");
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let own_id = packages
        .iter()
        .find(|p| p["manifest_path"].as_str().map(Path::new) == Some(own_manifest.as_path()))
        .and_then(|p| p["id"].as_str())
        .ok_or("cargo metadata: this package is missing")?;
    let dep_id = meta["resolve"]["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["id"].as_str() == Some(own_id)))
        .and_then(|n| n["deps"].as_array())
        .and_then(|deps| {
            deps.iter()
                .find(|d| d["name"].as_str() == Some("envoy_types"))
        })
        .and_then(|d| d["pkg"].as_str())
        .ok_or("cargo metadata: envoy-types is not a dependency")?;
    let manifest = packages
        .iter()
        .find(|p| p["id"].as_str() == Some(dep_id))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata: envoy-types package is missing")?;
    let dir = Path::new(manifest)
        .parent()
        .ok_or("cargo metadata: bad envoy-types manifest path")?;
    Ok(dir.join("proto"))
}

/// Appends every `.proto` under `dir` to `out` (protoc maps them to paths relative to
/// their include root).
fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), BoxError> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
