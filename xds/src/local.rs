//! Local mode (`discovery-service --config-dir DIR`): EnvoyConfig and Secret manifests
//! from a folder, no cluster needed.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file directly in the folder is read (multi-document;
//! hidden files and sub-folders are skipped; symlinks are followed, so a mounted ConfigMap
//! works). The folder is re-scanned every [`POLL_INTERVAL`]; a file is re-read when its
//! size, inode or modification time changes (this also catches editors that write a new
//! file and rename it). A file that does not parse is logged and its last good content
//! keeps being used; an EnvoyConfig whose resources do not decode is logged and its node
//! keeps its last good snapshot. Removing an EnvoyConfig stops serving its node to new
//! streams; connected Envoys keep what they have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::envoyconfig::{
    EnvoyConfig, SecretData, SecretSource, parse_envoy_config, parse_secret, resolve,
};
use crate::snapshot::{Snapshot, SnapshotCache};

/// How often the folder is re-scanned.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn fingerprint(path: &Path) -> std::io::Result<Fingerprint> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path)?;
    Ok(Fingerprint {
        len: m.len(),
        modified: m.modified().ok(),
        inode: m.ino(),
    })
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
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    !hidden && matches!(ext, "yaml" | "yml" | "json") && path.is_file()
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
            if !is_manifest(&path) {
                continue;
            }
            present.insert(path.clone());
            let Ok(fp) = fingerprint(&path) else { continue };
            if self.files.get(&path).is_some_and(|f| f.fingerprint == fp) {
                continue;
            }
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| {
                    serde_saphyr::from_multiple::<Value>(&text).map_err(|e| e.to_string())
                });
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
                    Err(e) => out
                        .errors
                        .push(format!("{}: EnvoyConfig: {e}", path.display())),
                },
                Some("Secret") => match parse_secret(doc) {
                    Ok((ns, name, data)) => out.secrets.push((ns, name, data)),
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
    pub secrets: Vec<(Option<String>, String, SecretData)>,
    /// Documents that could not be read (logged; they do not stop the others).
    pub errors: Vec<String>,
}

/// Secrets of the folder visible to one EnvoyConfig: same namespace, or no namespace.
struct FolderSecrets<'a> {
    namespace: Option<&'a str>,
    secrets: &'a [(Option<String>, String, SecretData)],
}

impl SecretSource for FolderSecrets<'_> {
    fn get(&self, name: &str) -> Option<SecretData> {
        self.secrets
            .iter()
            .find(|(ns, n, _)| {
                n == name
                    && match (ns.as_deref(), self.namespace) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            })
            .map(|(_, _, d)| d.clone())
    }
}

/// The resolved configuration of one node.
#[derive(Debug)]
pub struct NodeConfig {
    /// `namespace/name` of the EnvoyConfig.
    pub source: String,
    pub result: Result<Snapshot, Vec<String>>,
}

/// Resolves every EnvoyConfig to a snapshot per node id. A second EnvoyConfig for a node
/// id that another one (first by namespace/name) already claims is an error.
pub fn resolve_nodes(manifests: &Manifests) -> BTreeMap<String, NodeConfig> {
    let mut configs: Vec<&EnvoyConfig> = manifests.configs.iter().collect();
    configs.sort_by_key(|ec| (ec.metadata.namespace.clone(), ec.metadata.name.clone()));
    let mut nodes = BTreeMap::new();
    for ec in configs {
        let source = format!(
            "{}/{}",
            ec.metadata.namespace.as_deref().unwrap_or("default"),
            ec.metadata.name.as_deref().unwrap_or_default()
        );
        let node_id = ec.spec.node_id.clone();
        if let Some(existing) = nodes.get(&node_id) {
            let existing: &NodeConfig = existing;
            tracing::error!(envoyconfig = %source, node_id = %node_id, claimed_by = %existing.source, "node id already configured by another EnvoyConfig; ignored");
            continue;
        }
        let secrets = FolderSecrets {
            namespace: ec.metadata.namespace.as_deref(),
            secrets: &manifests.secrets,
        };
        let result = match resolve(&ec.spec, &secrets) {
            Ok(resources) => {
                Snapshot::new(with_default_runtime(resources)).map_err(|e| vec![e.to_string()])
            }
            Err(errors) => Err(errors.iter().map(ToString::to_string).collect()),
        };
        nodes.insert(node_id, NodeConfig { source, result });
    }
    nodes
}

/// The RTDS layer every injected Envoy asks for (`init-manager --rtds-resource-name`).
pub const DEFAULT_RTDS_LAYER: &str = "runtime";

/// Adds an empty runtime layer named [`DEFAULT_RTDS_LAYER`] unless the config has one:
/// Envoy's RTDS init target waits for that named resource (15 s `initial_fetch_timeout`)
/// before it even asks for clusters and listeners.
pub fn with_default_runtime(mut resources: Vec<crate::Resource>) -> Vec<crate::Resource> {
    let has_layer = resources
        .iter()
        .any(|r| r.kind == crate::ResourceType::Runtime && r.name == DEFAULT_RTDS_LAYER);
    if !has_layer {
        let empty = serde_json::json!({"name": DEFAULT_RTDS_LAYER, "layer": {}});
        match crate::decode::decode_resource(crate::ResourceType::Runtime, &empty) {
            Ok(r) => resources.push(r),
            Err(e) => tracing::error!(error = %e, "cannot build the default runtime layer"),
        }
    }
    resources
}

/// Applies resolved nodes to the cache: good snapshots are published; a broken config
/// is logged and its node keeps the last good snapshot; nodes no longer configured are
/// removed. Returns the node ids whose snapshot changed.
pub fn apply(cache: &SnapshotCache, nodes: BTreeMap<String, NodeConfig>) -> Vec<String> {
    let mut changed = Vec::new();
    for old in cache.node_ids() {
        if !nodes.contains_key(&old) {
            tracing::info!(node_id = %old, "EnvoyConfig removed; node no longer configured");
            cache.remove(&old);
        }
    }
    for (node_id, cfg) in nodes {
        match cfg.result {
            Ok(snapshot) => {
                if cache.set(&node_id, snapshot) {
                    tracing::info!(node_id = %node_id, envoyconfig = %cfg.source, "published new snapshot");
                    changed.push(node_id);
                }
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(node_id = %node_id, envoyconfig = %cfg.source, error = %e, "invalid EnvoyConfig; keeping the last good config");
                }
            }
        }
    }
    changed
}

/// Local mode as a [`crate::Backend`]: loads the folder at start, then re-scans it every
/// [`POLL_INTERVAL`].
#[derive(Debug)]
pub struct LocalBackend {
    source: LocalSource,
}

impl LocalBackend {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            source: LocalSource::new(dir),
        }
    }

    fn reload(&self, cache: &SnapshotCache) {
        let manifests = self.source.manifests();
        for e in &manifests.errors {
            tracing::error!(error = %e, "invalid manifest; ignored");
        }
        apply(cache, resolve_nodes(&manifests));
    }
}

impl crate::Backend for LocalBackend {
    async fn start(&mut self, ctx: &crate::Context) -> Result<(), crate::Error> {
        self.source
            .scan()
            .map_err(|source| crate::Error::ConfigDir {
                dir: self.source.dir.clone(),
                source,
            })?;
        self.reload(&ctx.cache);
        tracing::info!(dir = %self.source.dir.display(), "local mode: serving the config folder");
        Ok(())
    }

    async fn run(mut self, ctx: crate::Context, shutdown: crate::Shutdown) {
        let mut shutdown = shutdown;
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.source.scan() {
                Ok(false) => {}
                Ok(true) => self.reload(&ctx.cache),
                Err(e) => {
                    tracing::error!(dir = %self.source.dir.display(), error = %e, "cannot read config folder")
                }
            }
        }
    }
}
