//! The config folder: its manifest files, re-read incrementally, and what they define
//! (EnvoyConfigs and Secrets).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::Value;

use marin3r_envoyconfig::envoyconfig::{EnvoyConfig, parse_envoy_config, parse_secret};
use marin3r_envoyconfig::manifest::ManifestSecrets;

/// Namespace of an EnvoyConfig manifest without `metadata.namespace`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Identity of an EnvoyConfig: `(namespace, name)`.
pub type Key = (String, String);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn fingerprint(m: &std::fs::Metadata) -> Fingerprint {
    use std::os::unix::fs::MetadataExt as _;
    Fingerprint {
        len: m.len(),
        modified: m.modified().ok(),
        inode: m.ino(),
    }
}

#[derive(Debug)]
struct FileState {
    fingerprint: Fingerprint,
    /// The documents of the last successful parse.
    docs: Vec<Value>,
}

/// The folder's manifests, re-read incrementally.
#[derive(Debug)]
pub struct LocalSource {
    pub(super) dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

/// Whether the name is one of a manifest (the caller checks that it is a file).
fn is_manifest_name(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    !hidden && matches!(ext, "yaml" | "yml" | "json")
}

impl LocalSource {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
        }
    }

    /// Re-reads what changed; returns whether anything did. Errors only when the folder
    /// itself cannot be listed.
    pub fn scan(&mut self) -> std::io::Result<bool> {
        let mut present = BTreeSet::new();
        let mut changed = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if !is_manifest_name(&path) {
                continue;
            }
            // One `stat` per file and scan (symlinks followed, e.g. a mounted ConfigMap).
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            present.insert(path.clone());
            let fp = fingerprint(&meta);
            if self.files.get(&path).is_some_and(|f| f.fingerprint == fp) {
                continue;
            }
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| marin3r_envoyconfig::manifest::documents(&text));
            match parsed {
                Ok(docs) => {
                    let docs = docs.into_iter().filter(|d| !d.is_null()).collect();
                    self.files.insert(
                        path,
                        FileState {
                            fingerprint: fp,
                            docs,
                        },
                    );
                    changed = true;
                }
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "cannot parse manifest file; keeping its last good content");
                    match self.files.get_mut(&path) {
                        Some(f) => f.fingerprint = fp,
                        None => {
                            self.files.insert(
                                path,
                                FileState {
                                    fingerprint: fp,
                                    docs: Vec::new(),
                                },
                            );
                        }
                    }
                }
            }
        }
        let before = self.files.len();
        self.files.retain(|p, _| present.contains(p));
        Ok(changed || self.files.len() != before)
    }

    /// Every document of every file, in file-name order.
    fn documents(&self) -> impl Iterator<Item = (&Path, &Value)> {
        self.files
            .iter()
            .flat_map(|(p, f)| f.docs.iter().map(move |d| (p.as_path(), d)))
    }

    /// The EnvoyConfigs and Secrets currently defined.
    pub fn manifests(&self) -> Manifests {
        let mut out = Manifests::default();
        for (path, doc) in self.documents() {
            match doc.get("kind").and_then(Value::as_str) {
                Some("EnvoyConfig") => match parse_envoy_config(doc) {
                    Ok(ec) => out.configs.push(ec),
                    Err(e) => {
                        out.errors
                            .push(format!("{}: EnvoyConfig: {e}", path.display()));
                        if let Some(name) = doc["metadata"]["name"].as_str() {
                            let namespace = doc["metadata"]["namespace"]
                                .as_str()
                                .unwrap_or(DEFAULT_NAMESPACE);
                            out.invalid_configs
                                .push((namespace.to_string(), name.to_string()));
                        }
                    }
                },
                Some("Secret") => match parse_secret(doc) {
                    Ok(secret) => out.secrets.0.push(secret),
                    Err(e) => out.errors.push(format!("{}: Secret: {e}", path.display())),
                },
                _ => {}
            }
        }
        out
    }
}

/// What a folder defines.
#[derive(Debug, Default)]
pub struct Manifests {
    pub configs: Vec<EnvoyConfig>,
    pub secrets: ManifestSecrets,
    /// Documents that could not be read (logged; they do not stop the others).
    pub errors: Vec<String>,
    /// `(namespace, name)` of `kind: EnvoyConfig` documents that are not valid
    /// EnvoyConfigs: their last good state is kept rather than treated as deleted.
    pub invalid_configs: Vec<Key>,
}
