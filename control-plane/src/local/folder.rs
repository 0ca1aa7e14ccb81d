//! The config folder: its manifest files, re-read incrementally, and what they define
//! (EnvoyConfigs and Secrets).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;

use marin3r_envoyconfig::envoyconfig::{EnvoyConfig, SecretData, parse_envoy_config, parse_secret};
use marin3r_envoyconfig::manifest::ManifestSecrets;

/// Namespace of an EnvoyConfig manifest without `metadata.namespace`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Identity of an EnvoyConfig: `(namespace, name)`.
pub type Key = (String, String);

/// Largest manifest file that is read, like the API server's ~1.5 MiB object limit (an
/// EnvoyConfig larger than that could not exist in a cluster either). A larger file is
/// reported and its last good content kept; it is never read into memory.
pub const MAX_FILE_BYTES: u64 = 3 * 512 * 1024;

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
    /// `None` while the entry cannot be stat'ed (a dangling symlink, a loop).
    fingerprint: Option<Fingerprint>,
    /// The documents of the last successful parse.
    docs: Vec<Value>,
    /// What each of `docs` defines, parsed once when the file changes (a change elsewhere
    /// in the folder never parses this file again).
    parsed: Vec<Parsed>,
    /// Why the current content is not used (its last good content is), if so.
    error: Option<String>,
}

/// What one document defines.
#[derive(Debug)]
enum Parsed {
    /// A `kind: EnvoyConfig` document: its key (when it has a name) and the EnvoyConfig
    /// or why it is not a valid one.
    Config {
        key: Option<Key>,
        config: Result<Arc<EnvoyConfig>, String>,
    },
    Secret(Result<(Option<String>, String, SecretData), String>),
    /// Any other kind: ignored.
    Other,
}

fn parse(doc: &Value) -> Parsed {
    match doc.get("kind").and_then(Value::as_str) {
        Some("EnvoyConfig") => {
            let key = doc["metadata"]["name"].as_str().map(|name| {
                let namespace = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(DEFAULT_NAMESPACE);
                (namespace.to_string(), name.to_string())
            });
            Parsed::Config {
                key,
                config: parse_envoy_config(doc)
                    .map(Arc::new)
                    .map_err(|e| e.to_string()),
            }
        }
        Some("Secret") => Parsed::Secret(parse_secret(doc)),
        _ => Parsed::Other,
    }
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

    /// Re-reads what changed; returns whether anything did (content or problems).
    /// Errors only when the folder itself cannot be listed.
    ///
    /// A file that is present but cannot be used — unreadable, a dangling symlink or a
    /// loop, larger than [`MAX_FILE_BYTES`], not valid YAML/JSON, or empty — keeps its
    /// last good content (never "deleted") and is reported ([`Self::file_errors`]),
    /// logged once per distinct problem. Only a file whose directory entry is gone is
    /// deleted.
    pub fn scan(&mut self) -> std::io::Result<bool> {
        let mut present = BTreeSet::new();
        let mut changed = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if !is_manifest_name(&path) {
                continue;
            }
            // One `stat` per file and scan (symlinks followed, e.g. a mounted ConfigMap).
            let read = match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => continue,
                Ok(meta) => {
                    let fp = fingerprint(&meta);
                    if self
                        .files
                        .get(&path)
                        .is_some_and(|f| f.fingerprint.as_ref() == Some(&fp))
                    {
                        present.insert(path);
                        continue;
                    }
                    (Some(fp), read_manifest(&path, &meta))
                }
                Err(e) => (None, Err(format!("cannot read the file: {e}"))),
            };
            present.insert(path.clone());
            changed |= self.update(path, read);
        }
        let before = self.files.len();
        self.files.retain(|p, _| present.contains(p));
        Ok(changed || self.files.len() != before)
    }

    /// Records what reading `path` gave; returns whether its content or problem changed.
    fn update(
        &mut self,
        path: PathBuf,
        (fingerprint, read): (Option<Fingerprint>, Result<Vec<Value>, String>),
    ) -> bool {
        let state = self.files.entry(path.clone()).or_insert(FileState {
            fingerprint: None,
            docs: Vec::new(),
            parsed: Vec::new(),
            error: None,
        });
        state.fingerprint = fingerprint;
        match read {
            Ok(docs) => {
                let changed = state.docs != docs || state.error.is_some();
                if state.docs != docs {
                    state.parsed = docs.iter().map(parse).collect();
                }
                state.docs = docs;
                state.error = None;
                changed
            }
            Err(error) => {
                if state.error.as_ref() == Some(&error) {
                    return false;
                }
                // Errors are logged without a source snippet: it may quote Secret data.
                tracing::error!(file = %path.display(), error = %error, "cannot use manifest file; keeping its last good content");
                state.error = Some(error);
                true
            }
        }
    }

    /// The files that cannot be used now (their last good content is), with why.
    pub fn file_errors(&self) -> BTreeMap<PathBuf, String> {
        self.files
            .iter()
            .filter_map(|(p, f)| Some((p.clone(), f.error.clone()?)))
            .collect()
    }

    /// The EnvoyConfigs and Secrets currently defined (parsed when their file changed).
    pub fn manifests(&self) -> Manifests {
        let mut out = Manifests {
            file_errors: self.file_errors(),
            ..Manifests::default()
        };
        let parsed = self
            .files
            .iter()
            .flat_map(|(p, f)| f.parsed.iter().map(move |d| (p.as_path(), d)));
        for (path, doc) in parsed {
            match doc {
                Parsed::Config { key, config } => {
                    if let Some(key) = key {
                        out.files
                            .entry(key.clone())
                            .or_insert_with(|| path.to_path_buf());
                    }
                    match config {
                        Ok(ec) => out.configs.push(ec.clone()),
                        Err(e) => {
                            out.errors
                                .push(format!("{}: EnvoyConfig: {e}", path.display()));
                            if let Some(key) = key {
                                out.invalid_configs
                                    .entry(key.clone())
                                    .or_insert_with(|| format!("invalid EnvoyConfig: {e}"));
                            }
                        }
                    }
                }
                Parsed::Secret(Ok(secret)) => out.secrets.0.push(secret.clone()),
                Parsed::Secret(Err(e)) => {
                    out.errors.push(format!("{}: Secret: {e}", path.display()));
                }
                Parsed::Other => {}
            }
        }
        out
    }
}

/// What a folder defines.
#[derive(Debug, Default)]
pub struct Manifests {
    pub configs: Vec<Arc<EnvoyConfig>>,
    pub secrets: ManifestSecrets,
    /// Documents that could not be read (logged; they do not stop the others).
    pub errors: Vec<String>,
    /// `kind: EnvoyConfig` documents that are not valid EnvoyConfigs, with why: their
    /// last good state is kept rather than treated as deleted.
    pub invalid_configs: BTreeMap<Key, String>,
    /// The file each EnvoyConfig (valid or not) is defined in.
    pub files: BTreeMap<Key, PathBuf>,
    /// Files that cannot be used now (their last good content is), with why.
    pub file_errors: BTreeMap<PathBuf, String>,
}

/// Reads one manifest file (`meta` is its `stat`) into its documents, or why it cannot be
/// used.
fn read_manifest(path: &Path, meta: &std::fs::Metadata) -> Result<Vec<Value>, String> {
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "the file is {} bytes, more than the {MAX_FILE_BYTES}-byte limit (the API server's object size limit)",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the file: {e}"))?;
    let docs: Vec<Value> = marin3r_envoyconfig::manifest::documents(&text)?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect();
    if docs.is_empty() {
        return Err("the file has no documents (an empty file never removes what it defined; delete the file to remove it)".to_string());
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ec(name: &str, port: u32) -> String {
        format!(
            "apiVersion: marin3r.3scale.net/v1alpha1\nkind: EnvoyConfig\nmetadata:\n  name: {name}\nspec:\n  nodeID: {name}\n  resources:\n  - type: listener\n    value: {{name: l, port: {port}}}\n"
        )
    }

    fn names(source: &LocalSource) -> Vec<String> {
        source
            .manifests()
            .configs
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    /// Writes `text` so that the scanner sees a new fingerprint (a new inode).
    fn write(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp~");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_rescan_parses_only_the_files_that_changed() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a.yaml"), &ec("a", 1));
        write(&dir.path().join("b.yaml"), &ec("b", 1));
        let mut source = LocalSource::new(dir.path());
        assert!(source.scan().unwrap());
        let before = source.manifests().configs;
        write(&dir.path().join("b.yaml"), &ec("b", 2));
        assert!(source.scan().unwrap());
        let after = source.manifests().configs;
        assert!(
            Arc::ptr_eq(&before[0], &after[0]),
            "a.yaml is not parsed again"
        );
        assert!(!Arc::ptr_eq(&before[1], &after[1]), "b.yaml is");
        assert_ne!(before[1], after[1]);
    }

    #[test]
    fn unusable_files_keep_their_last_good_content_and_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kuard.yaml");
        write(&file, &ec("kuard", 1));
        let mut source = LocalSource::new(dir.path());
        assert!(source.scan().unwrap());
        assert_eq!(names(&source), ["kuard"]);
        assert!(source.file_errors().is_empty());

        type BreakIt<'a> = Box<dyn Fn() + 'a>;
        let cases: [(&str, BreakIt<'_>); 4] = [
            ("empty", Box::new(|| write(&file, ""))),
            ("invalid YAML", Box::new(|| write(&file, "a: [1,\n"))),
            (
                "too large",
                Box::new(|| write(&file, &"#".repeat(MAX_FILE_BYTES as usize + 1))),
            ),
            (
                "dangling symlink",
                Box::new(|| {
                    std::fs::remove_file(&file).unwrap();
                    std::os::unix::fs::symlink(dir.path().join("gone.yaml"), &file).unwrap();
                }),
            ),
        ];
        for (case, break_it) in cases {
            break_it();
            assert!(source.scan().unwrap(), "{case}: a new problem is a change");
            assert_eq!(names(&source), ["kuard"], "{case}: last good content kept");
            let errors = source.file_errors();
            assert_eq!(errors.len(), 1, "{case}");
            let error = &errors[&file];
            assert!(!error.is_empty(), "{case}");
            assert!(!source.scan().unwrap(), "{case}: unchanged, reported once");
            let manifests = source.manifests();
            assert_eq!(
                manifests.files[&("default".to_string(), "kuard".to_string())],
                file
            );
            assert_eq!(manifests.file_errors[&file], *error);
            if std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&file).unwrap();
            }
        }
        // Fixed: the new content is used and the problem is gone.
        write(&file, &ec("kuard", 2));
        assert!(source.scan().unwrap());
        assert!(source.file_errors().is_empty());
        // Only a file whose directory entry is gone is deleted.
        std::fs::remove_file(&file).unwrap();
        assert!(source.scan().unwrap());
        assert!(names(&source).is_empty());
    }
}
