//! Rendering the kustomizations under `manifests/` with `kubectl kustomize` (what
//! `kubectl apply -k` applies), for the install tests of this crate and of the CLI.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The `manifests/` folder of this source tree.
pub fn manifests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Errors of rendering a kustomization.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot run `kubectl kustomize {dir}` (is kubectl >= 1.27 on PATH? the manifests \
         tests need it)"
    )]
    Kubectl {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`kubectl kustomize {dir}` failed: {stderr}")]
    Failed { dir: String, stderr: String },
    #[error("`kubectl kustomize {dir}` printed invalid YAML: {message}")]
    Yaml { dir: String, message: String },
    #[error("cannot list {dir}")]
    Walk {
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

/// Every folder under `root` (itself included) holding a `kustomization.yaml`, sorted.
pub fn kustomizations(root: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        if dir.join("kustomization.yaml").is_file() {
            found.push(dir.clone());
        }
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Walk {
            dir: dir.display().to_string(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| Error::Walk {
                dir: dir.display().to_string(),
                source,
            })?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The objects `kubectl kustomize dir` renders, in its order.
pub fn render(dir: &Path) -> Result<Vec<Value>, Error> {
    let shown = dir.display().to_string();
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|source| Error::Kubectl {
            dir: shown.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(Error::Failed {
            dir: shown,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8(output.stdout).map_err(|e| Error::Yaml {
        dir: shown.clone(),
        message: e.to_string(),
    })?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Yaml {
        dir: shown,
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `kind/name` of an object, for messages.
pub fn describe(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or("<no kind>");
    let name = obj["metadata"]["name"].as_str().unwrap_or("<no name>");
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// The containers and init containers of a workload's pod template (or a Pod).
pub fn containers(obj: &Value) -> Vec<&Value> {
    let spec = match obj["kind"].as_str() {
        Some("Pod") => &obj["spec"],
        Some("CronJob") => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &obj["spec"]["template"]["spec"],
    };
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
        .collect()
}
