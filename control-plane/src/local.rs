//! Local mode (`discovery-service --config-dir DIR`): EnvoyConfig and Secret manifests
//! from a folder, no cluster needed, with the same self-healing as Kubernetes mode.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file directly in the folder is read (multi-document;
//! hidden files and sub-folders are skipped; symlinks are followed, so a mounted ConfigMap
//! works). The folder is re-scanned every [`POLL_INTERVAL`]; a file is re-read when its
//! size, inode or modification time changes (this also catches editors that write a new
//! file and rename it). A file that does not parse is logged and its last good content
//! keeps being used; so does an EnvoyConfig document that is not a valid EnvoyConfig.
//!
//! Self-healing (SPEC §4) runs through [`Engine`], one [`Revisions`] per EnvoyConfig
//! (`namespace/name`):
//! - every folder change applies each EnvoyConfig's spec (a new spec is a new desired
//!   revision, a known one moves to the top) and publishes the topmost untainted revision
//!   whose resources resolve with the folder's Secrets ([`decide`]); a revision whose
//!   resources do not decode is tainted on the way;
//! - every [`EVALUATE_INTERVAL`] the NACK statistics are checked: when every subscribed
//!   Envoy of the node rejected a version of the published revision `--nack-threshold`
//!   times, that revision is tainted and the next untainted one is published (rollback);
//!   with none left the state is `RollbackFailed` and the cache keeps the last good
//!   snapshot;
//! - a Secret change re-publishes the same revision with a new snapshot;
//! - a revision that becomes the published one (first time or again) has the NACK counts
//!   of its versions reset, so only fresh NACKs judge it;
//! - `GET /status` shows the state, `DELETE /status/revisions/{namespace}/{name}/{version}`
//!   deletes a revision (the current spec's revision is then re-created afresh and tried
//!   again, as the Kubernetes controller does);
//! - with `--state-dir` the revisions survive restarts (one JSON file per EnvoyConfig,
//!   replaced atomically on every change).
//!
//! Removing an EnvoyConfig drops its revisions and stops serving its node to new streams;
//! connected Envoys keep what they have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::revisions::{DEFAULT_NACK_THRESHOLD, Revisions, Taint};
use crate::status::{EnvoyConfigReport, StatusReport, conditions, envoy_config_report};
use marin3r_envoyconfig::envoyconfig::{
    CacheState, EnvoyConfig, EnvoyConfigSpec, SecretSource, parse_envoy_config, parse_secret,
    resolve,
};
use marin3r_envoyconfig::manifest::ManifestSecrets;
use marin3r_xds::snapshot::Snapshot;
use marin3r_xds::stats::SharedStats;

/// How often the folder is re-scanned. A scan only lists the folder and `stat`s its
/// manifests (files are re-read only when their fingerprint changes), a few tens of µs
/// for a typical folder, so it can run often: an edit waits 0–50 ms to be noticed
/// (200 ms before; that wait was a fifth of the 10,000-stream fan-out budget).
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How often the NACK statistics are checked for a taint verdict.
pub const EVALUATE_INTERVAL: Duration = Duration::from_millis(250);
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
    dir: PathBuf,
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

/// The RTDS layer every injected Envoy asks for (`init-manager --rtds-resource-name`).
pub const DEFAULT_RTDS_LAYER: &str = "runtime";

/// Adds an empty runtime layer named [`DEFAULT_RTDS_LAYER`] unless the config has one:
/// Envoy's RTDS init target waits for that named resource (15 s `initial_fetch_timeout`)
/// before it even asks for clusters and listeners.
pub fn with_default_runtime(
    mut resources: Vec<marin3r_envoyconfig::Resource>,
) -> Vec<marin3r_envoyconfig::Resource> {
    let has_layer = resources.iter().any(|r| {
        r.kind == marin3r_envoyconfig::ResourceType::Runtime && r.name == DEFAULT_RTDS_LAYER
    });
    if !has_layer {
        let empty = serde_json::json!({"name": DEFAULT_RTDS_LAYER, "layer": {}});
        match marin3r_envoyconfig::decode::decode_resource(
            marin3r_envoyconfig::ResourceType::Runtime,
            &empty,
        ) {
            Ok(r) => resources.push(r),
            Err(e) => tracing::error!(error = %e, "cannot build the default runtime layer"),
        }
    }
    resources
}

/// Resolves a spec with `secrets` into the snapshot to serve (plus the default runtime
/// layer), or every error as text.
pub fn resolve_snapshot(
    spec: &EnvoyConfigSpec,
    secrets: &dyn SecretSource,
) -> Result<Snapshot, Vec<String>> {
    match resolve(spec, secrets) {
        Ok(resources) => {
            Snapshot::new(with_default_runtime(resources)).map_err(|e| vec![e.to_string()])
        }
        Err(errors) => Err(errors.iter().map(ToString::to_string).collect()),
    }
}

// ---------------------------------------------------------------------------------------
// Deciding what to publish (pure).

/// The revision [`decide`] picked and its snapshot.
#[derive(Debug)]
pub struct Publish {
    pub version: String,
    pub snapshot: Snapshot,
    /// It is not the revision whose snapshot the cache holds, or it was never published
    /// since it was created: the NACK counts of its versions must be reset first, so old
    /// NACKs (of a deleted twin, of an earlier push of the same content) do not judge it.
    pub newly_published: bool,
}

/// What to do for one EnvoyConfig.
#[derive(Debug)]
pub struct Decision {
    /// Revisions tainted on the way because their resources do not resolve.
    pub tainted: Vec<Taint>,
    /// `None` when every revision is tainted: the cache keeps the last good snapshot.
    pub publish: Option<Publish>,
}

/// Picks the revision to serve: the topmost untainted one whose resources `resolve`;
/// one that fails is tainted (the errors are the reason) and the next is tried. `served`
/// is the revision whose snapshot the cache holds now.
pub fn decide(
    revisions: &mut Revisions,
    served: Option<&str>,
    mut resolve: impl FnMut(&EnvoyConfigSpec) -> Result<Snapshot, Vec<String>>,
) -> Decision {
    let mut tainted = Vec::new();
    while let Some(candidate) = revisions.published() {
        let version = candidate.version.clone();
        let fresh = candidate.last_published_at.is_none();
        match resolve(&candidate.spec) {
            Ok(snapshot) => {
                let newly_published = fresh || served != Some(version.as_str());
                return Decision {
                    tainted,
                    publish: Some(Publish {
                        version,
                        snapshot,
                        newly_published,
                    }),
                };
            }
            Err(errors) => {
                let reason = format!("resources do not decode: {}", errors.join("; "));
                revisions.taint(&version, reason.clone());
                tainted.push(Taint { version, reason });
            }
        }
    }
    Decision {
        tainted,
        publish: None,
    }
}

// ---------------------------------------------------------------------------------------
// The engine: revisions of every EnvoyConfig, fed by the folder and the NACK statistics.

/// Self-healing settings of local mode.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--nack-threshold`: NACKs per pod before a version counts as rejected (≥ 1).
    pub nack_threshold: u64,
    /// `--state-dir`: where revisions are persisted; in memory only when `None`.
    pub state_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nack_threshold: DEFAULT_NACK_THRESHOLD,
            state_dir: None,
        }
    }
}

/// One EnvoyConfig under self-healing.
#[derive(Debug)]
struct Tracked {
    /// `metadata.namespace` as written (Secrets are looked up with it).
    namespace: Option<String>,
    envoy_api: String,
    /// The spec currently in the folder.
    spec: EnvoyConfigSpec,
    revisions: Revisions,
    /// The revision whose snapshot the cache holds.
    served: Option<String>,
    /// The spec of `served` (kept because a served revision may be deleted).
    served_spec: Option<EnvoyConfigSpec>,
    /// Restored from `--state-dir`: the revision served before the restart and its spec,
    /// served again if nothing untainted is left (so `RollbackFailed` survives a restart).
    restore: Option<(String, EnvoyConfigSpec)>,
    state: Option<CacheState>,
    conditions: Vec<Condition>,
    /// The JSON last written to the state dir.
    saved: Option<String>,
}

impl Tracked {
    fn new(namespace: Option<String>, spec: EnvoyConfigSpec) -> Self {
        Self {
            namespace,
            envoy_api: String::new(),
            revisions: Revisions::new(spec.node_id.clone()),
            spec,
            served: None,
            served_spec: None,
            restore: None,
            state: None,
            conditions: Vec::new(),
            saved: None,
        }
    }
}

/// The file format of `--state-dir` (one file per EnvoyConfig).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateFile {
    namespace: String,
    name: String,
    #[serde(default)]
    served: Option<String>,
    #[serde(default)]
    served_spec: Option<EnvoyConfigSpec>,
    revisions: Revisions,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StateFileRef<'a> {
    namespace: &'a str,
    name: &'a str,
    served: Option<&'a str>,
    served_spec: Option<&'a EnvoyConfigSpec>,
    revisions: &'a Revisions,
}

/// Errors of [`Engine::remove_revision`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoveError {
    #[error("EnvoyConfig {namespace}/{name} not found")]
    NoEnvoyConfig { namespace: String, name: String },
    #[error("EnvoyConfig {namespace}/{name} has no revision {version}")]
    NoRevision {
        namespace: String,
        name: String,
        version: String,
    },
}

/// Local mode's self-healing state, shared by the backend's loop and the `/status`
/// routes. Every method is synchronous and quick; callers hold it in a mutex.
#[derive(Debug)]
pub struct Engine {
    options: Options,
    /// The folder's Secrets, as of the last [`reconcile`](Self::reconcile).
    secrets: ManifestSecrets,
    configs: BTreeMap<Key, Tracked>,
    /// Loaded from the state dir, taken when their EnvoyConfig shows up.
    restored: BTreeMap<Key, StateFile>,
}

fn key_of(ec: &EnvoyConfig) -> Key {
    (
        ec.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
        ec.metadata.name.clone().unwrap_or_default(),
    )
}

fn source(key: &Key) -> String {
    format!("{}/{}", key.0, key.1)
}

/// `namespace_name.json`, every byte outside `[A-Za-z0-9.-]` written as `%XX`, so any
/// name maps to one safe file name and back.
fn state_file_name(key: &Key) -> String {
    let encode = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    format!("{}_{}.json", encode(&key.0), encode(&key.1))
}

/// Replaces `path` atomically: a hidden temp file in the same folder (mode 0600: specs
/// may hold inline key material), synced, renamed.
fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{}.tmp", name.unwrap_or_default()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// The NACK message of one pod for the first version of `revision` that every pod
/// rejected (for the taint reason; truncated).
fn nack_message(
    stats: &SharedStats,
    node_id: &str,
    provides: &BTreeMap<String, String>,
    threshold: u64,
) -> Option<String> {
    provides.iter().find_map(|(type_name, version)| {
        let t = type_name.parse().ok()?;
        if !stats.rejected_by_all_pods(node_id, t, version, threshold) {
            return None;
        }
        let message = stats
            .counts(node_id, t, version)
            .into_values()
            .find_map(|c| c.last_nack_message)?;
        Some(message.chars().take(500).collect())
    })
}

impl Engine {
    pub fn new(options: Options) -> Self {
        Self {
            options: Options {
                nack_threshold: options.nack_threshold.max(1),
                ..options
            },
            secrets: ManifestSecrets::default(),
            configs: BTreeMap::new(),
            restored: BTreeMap::new(),
        }
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Loads the state dir (creating it): returns how many EnvoyConfigs were found. A
    /// file that does not parse is logged and ignored.
    pub fn load_state(&mut self) -> std::io::Result<usize> {
        let Some(dir) = &self.options.state_dir else {
            return Ok(0);
        };
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let visible = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"));
            if !visible {
                continue;
            }
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<StateFile>(&t).map_err(|e| e.to_string()));
            match parsed {
                Ok(state) => {
                    self.restored
                        .insert((state.namespace.clone(), state.name.clone()), state);
                }
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "cannot read a state file; ignored")
                }
            }
        }
        Ok(self.restored.len())
    }

    /// Applies the folder's content: new/changed specs become desired revisions, removed
    /// EnvoyConfigs are dropped, and every EnvoyConfig's cache entry is brought in line
    /// (Secrets may have changed).
    pub fn reconcile(&mut self, manifests: &Manifests, ctx: &crate::Context, now: SystemTime) {
        for e in &manifests.errors {
            tracing::error!(error = %e, "invalid manifest; ignored");
        }
        self.secrets = manifests.secrets.clone();

        // An invalid EnvoyConfig document keeps its last good state and its node id.
        let kept: BTreeSet<&Key> = manifests
            .invalid_configs
            .iter()
            .filter(|k| self.configs.contains_key(*k))
            .collect();
        let mut claimed: BTreeMap<String, Key> = kept
            .iter()
            .filter_map(|k| {
                let t = self.configs.get(*k)?;
                Some((t.revisions.node_id.clone(), (*k).clone()))
            })
            .collect();
        let mut configs: Vec<&EnvoyConfig> = manifests.configs.iter().collect();
        configs.sort_by_key(|ec| key_of(ec));
        let mut winners: BTreeMap<Key, &EnvoyConfig> = BTreeMap::new();
        for ec in configs {
            let key = key_of(ec);
            let node_id = &ec.spec.node_id;
            if winners.contains_key(&key) || kept.contains(&key) {
                tracing::error!(envoyconfig = %source(&key), "EnvoyConfig defined more than once; the first one is used");
                continue;
            }
            if let Some(owner) = claimed.get(node_id) {
                tracing::error!(envoyconfig = %source(&key), node_id = %node_id, claimed_by = %source(owner), "node id already configured by another EnvoyConfig; ignored");
                continue;
            }
            claimed.insert(node_id.clone(), key.clone());
            winners.insert(key, ec);
        }

        // Removed EnvoyConfigs, and those whose node id changed (they start over).
        let gone: Vec<Key> = self
            .configs
            .iter()
            .filter(|(k, t)| match winners.get(*k) {
                Some(ec) => ec.spec.node_id != t.revisions.node_id,
                None => !kept.contains(k),
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            let Some(t) = self.configs.remove(&key) else {
                continue;
            };
            let node_id = &t.revisions.node_id;
            tracing::info!(envoyconfig = %source(&key), node_id = %node_id, "EnvoyConfig removed (or its node id changed); its revisions are dropped");
            self.delete_state(&key);
            if !claimed.contains_key(node_id) {
                ctx.cache.remove(node_id);
                ctx.stats.clear_node(node_id);
            }
        }

        for (key, ec) in winners {
            let t = match self.configs.entry(key.clone()) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let mut t = Tracked::new(ec.metadata.namespace.clone(), ec.spec.clone());
                    match self.restored.remove(&key) {
                        Some(state) if state.revisions.node_id == ec.spec.node_id => {
                            tracing::info!(envoyconfig = %source(&key), revisions = state.revisions.revisions.len(), "restored revisions from the state dir");
                            t.revisions = state.revisions;
                            t.restore = state.served.zip(state.served_spec);
                        }
                        _ => {}
                    }
                    v.insert(t)
                }
            };
            t.namespace = ec.metadata.namespace.clone();
            t.envoy_api = ec
                .spec
                .envoy_api
                .and_then(|a| serde_json::to_value(a).ok())
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "v3".to_string());
            t.spec = ec.spec.clone();
            t.revisions.apply(&ec.spec, now);
            sync(t, &key, &self.secrets, ctx, now);
        }
        self.persist();
    }

    /// Checks the NACK statistics of every published revision; a revision every
    /// subscribed Envoy rejected is tainted and the next untainted one published.
    pub fn evaluate(&mut self, ctx: &crate::Context, now: SystemTime) {
        let threshold = self.options.nack_threshold;
        let mut changed = false;
        for (key, t) in &mut self.configs {
            let Some(published) = t.revisions.published() else {
                continue;
            };
            if t.served.as_deref() != Some(published.version.as_str()) {
                continue;
            }
            let Some(taint) = t.revisions.evaluate(&ctx.stats, threshold) else {
                continue;
            };
            let mut reason = taint.reason;
            if let Some(message) = nack_message(
                &ctx.stats,
                &t.revisions.node_id,
                &published.provides_versions,
                threshold,
            ) {
                reason.push_str(&format!("; Envoy: {message}"));
            }
            tracing::warn!(envoyconfig = %source(key), node_id = %t.revisions.node_id, version = %taint.version, reason = %reason, "revision tainted: every Envoy of the node rejected it");
            t.revisions.taint(&taint.version, reason);
            sync(t, key, &self.secrets, ctx, now);
            changed = true;
        }
        if changed {
            self.persist();
        }
    }

    /// Deletes a revision (`kubectl delete ecr` in Kubernetes mode). The current spec
    /// always has a revision: deleting it re-creates it afresh (untainted, fresh NACK
    /// counts) and tries it again. Returns the EnvoyConfig's report afterwards.
    pub fn remove_revision(
        &mut self,
        namespace: &str,
        name: &str,
        version: &str,
        ctx: &crate::Context,
        now: SystemTime,
    ) -> Result<EnvoyConfigReport, RemoveError> {
        let key = (namespace.to_string(), name.to_string());
        let Some(t) = self.configs.get_mut(&key) else {
            return Err(RemoveError::NoEnvoyConfig {
                namespace: key.0,
                name: key.1,
            });
        };
        if !t.revisions.remove(version) {
            return Err(RemoveError::NoRevision {
                namespace: key.0,
                name: key.1,
                version: version.to_string(),
            });
        }
        tracing::info!(envoyconfig = %source(&key), node_id = %t.revisions.node_id, version = %version, "revision deleted");
        let spec = t.spec.clone();
        t.revisions.apply(&spec, now);
        sync(t, &key, &self.secrets, ctx, now);
        let report = report_of(&key, t);
        self.persist();
        Ok(report)
    }

    /// The status of every EnvoyConfig, by namespace and name.
    pub fn report(&self) -> StatusReport {
        StatusReport {
            envoy_configs: self
                .configs
                .iter()
                .map(|(key, t)| report_of(key, t))
                .collect(),
        }
    }

    /// The revisions of one EnvoyConfig.
    pub fn revisions(&self, namespace: &str, name: &str) -> Option<&Revisions> {
        self.configs
            .get(&(namespace.to_string(), name.to_string()))
            .map(|t| &t.revisions)
    }

    /// Writes the state file of every EnvoyConfig whose state changed.
    fn persist(&mut self) {
        let Some(dir) = &self.options.state_dir else {
            return;
        };
        for (key, t) in &mut self.configs {
            let state = StateFileRef {
                namespace: &key.0,
                name: &key.1,
                served: t.served.as_deref(),
                served_spec: t.served_spec.as_ref(),
                revisions: &t.revisions,
            };
            let json = match serde_json::to_string_pretty(&state) {
                Ok(json) => json,
                Err(e) => {
                    tracing::error!(envoyconfig = %source(key), error = %e, "cannot serialize the revisions");
                    continue;
                }
            };
            if t.saved.as_deref() == Some(json.as_str()) {
                continue;
            }
            let path = dir.join(state_file_name(key));
            match write_atomic(&path, &json) {
                Ok(()) => t.saved = Some(json),
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "cannot write the state file")
                }
            }
        }
    }

    fn delete_state(&self, key: &Key) {
        let Some(dir) = &self.options.state_dir else {
            return;
        };
        let path = dir.join(state_file_name(key));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::error!(file = %path.display(), error = %e, "cannot delete the state file")
            }
            _ => {}
        }
    }
}

fn report_of(key: &Key, t: &Tracked) -> EnvoyConfigReport {
    envoy_config_report(
        &key.0,
        &key.1,
        &t.envoy_api,
        &t.revisions,
        t.served.as_deref(),
        t.conditions.clone(),
    )
}

/// Brings the cache in line with one EnvoyConfig's revisions: [`decide`], then publish
/// (resetting NACK counts of a newly published revision first) or keep the last good
/// snapshot; logs state transitions and updates the conditions.
fn sync(
    t: &mut Tracked,
    key: &Key,
    secrets: &ManifestSecrets,
    ctx: &crate::Context,
    now: SystemTime,
) {
    let envoyconfig = source(key);
    let node_id = t.revisions.node_id.clone();
    let folder = secrets.for_namespace(t.namespace.as_deref());
    let decision = decide(&mut t.revisions, t.served.as_deref(), |spec| {
        resolve_snapshot(spec, &folder)
    });
    for taint in &decision.tainted {
        tracing::error!(envoyconfig = %envoyconfig, node_id = %node_id, version = %taint.version, reason = %taint.reason, "revision tainted: invalid EnvoyConfig");
    }
    let mut publish = decision.publish;
    if publish.is_none() && t.served.is_none() {
        // Right after a restart in RollbackFailed: serve what was served before.
        if let Some((version, spec)) = t.restore.take()
            && let Ok(snapshot) = resolve_snapshot(&spec, &folder)
        {
            tracing::warn!(envoyconfig = %envoyconfig, node_id = %node_id, version = %version, "every revision is tainted; serving the snapshot served before the restart");
            publish = Some(Publish {
                version,
                snapshot,
                newly_published: false,
            });
            t.served_spec = Some(spec);
        }
    }
    t.restore = None;
    if let Some(p) = publish {
        let versions = p.snapshot.versions();
        if p.newly_published {
            for (ty, version) in &versions {
                ctx.stats.reset_version(&node_id, *ty, version);
            }
        }
        if ctx.cache.set(&node_id, p.snapshot) {
            tracing::info!(envoyconfig = %envoyconfig, node_id = %node_id, version = %p.version, "published new snapshot");
        }
        if p.newly_published {
            t.revisions.mark_newly_published(&p.version, versions, now);
        } else {
            t.revisions.mark_published(&p.version, versions, now);
        }
        if let Some(rev) = t
            .revisions
            .revisions
            .iter()
            .find(|r| r.version == p.version)
        {
            t.served_spec = Some(rev.spec.clone());
        }
        t.served = Some(p.version);
    }
    let state = t.revisions.cache_state();
    let desired = t.revisions.desired().map(|r| r.version.clone());
    if state != t.state {
        let desired = desired.as_deref().unwrap_or_default();
        let served = t.served.as_deref().unwrap_or_default();
        match state {
            Some(CacheState::InSync) => {
                tracing::info!(envoyconfig = %envoyconfig, node_id = %node_id, version = %desired, "cache state InSync")
            }
            Some(CacheState::Rollback) => {
                tracing::warn!(envoyconfig = %envoyconfig, node_id = %node_id, desired = %desired, published = %served, "cache state Rollback: the desired version is tainted, an older revision is published")
            }
            Some(CacheState::RollbackFailed) => {
                tracing::error!(envoyconfig = %envoyconfig, node_id = %node_id, desired = %desired, served = %served, "cache state RollbackFailed: every revision is tainted; the last good snapshot keeps being served")
            }
            None => {}
        }
        t.state = state;
    }
    t.conditions = conditions(
        state,
        desired.as_deref(),
        t.served.as_deref(),
        &t.conditions,
        now,
    );
}

// ---------------------------------------------------------------------------------------
// The backend.

/// Local mode as a [`crate::Backend`]: loads the folder (and the state dir) at start,
/// then re-scans the folder every [`POLL_INTERVAL`] and evaluates NACKs every
/// [`EVALUATE_INTERVAL`]; serves `GET /status` and
/// `DELETE /status/revisions/{namespace}/{name}/{version}` on the metrics listener.
#[derive(Debug)]
pub struct LocalBackend {
    source: LocalSource,
    engine: Arc<Mutex<Engine>>,
}

fn lock(engine: &Mutex<Engine>) -> MutexGuard<'_, Engine> {
    // Every engine method leaves it consistent, so a poisoned lock is usable.
    engine.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LocalBackend {
    /// Serves `dir` with the default [`Options`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_options(dir, Options::default())
    }

    pub fn with_options(dir: impl Into<PathBuf>, options: Options) -> Self {
        Self {
            source: LocalSource::new(dir),
            engine: Arc::new(Mutex::new(Engine::new(options))),
        }
    }

    fn options(&self) -> Options {
        lock(&self.engine).options().clone()
    }

    /// NACKs per pod before a version counts as rejected (`--nack-threshold`, ≥ 1).
    pub fn with_nack_threshold(self, nack_threshold: u64) -> Self {
        let options = Options {
            nack_threshold,
            ..self.options()
        };
        Self::with_options(self.source.dir, options)
    }

    /// Persists revisions under `dir` (`--state-dir`).
    pub fn with_state_dir(self, dir: impl Into<PathBuf>) -> Self {
        let options = Options {
            state_dir: Some(dir.into()),
            ..self.options()
        };
        Self::with_options(self.source.dir, options)
    }

    /// The engine (what `/status` shows), e.g. for tests.
    pub fn engine(&self) -> Arc<Mutex<Engine>> {
        self.engine.clone()
    }
}

#[derive(Clone)]
struct RouteState {
    engine: Arc<Mutex<Engine>>,
    ctx: crate::Context,
}

async fn get_status(
    axum::extract::State(s): axum::extract::State<RouteState>,
) -> axum::Json<StatusReport> {
    axum::Json(lock(&s.engine).report())
}

async fn delete_revision(
    axum::extract::State(s): axum::extract::State<RouteState>,
    axum::extract::Path((namespace, name, version)): axum::extract::Path<(String, String, String)>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let result =
        lock(&s.engine).remove_revision(&namespace, &name, &version, &s.ctx, SystemTime::now());
    match result {
        Ok(report) => (axum::http::StatusCode::OK, axum::Json(report)).into_response(),
        Err(e) => (
            axum::http::StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
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
        let manifests = self.source.manifests();
        let mut engine = lock(&self.engine);
        let restored = engine
            .load_state()
            .map_err(|source| crate::Error::StateDir {
                dir: engine.options().state_dir.clone().unwrap_or_default(),
                source,
            })?;
        engine.reconcile(&manifests, ctx, SystemTime::now());
        tracing::info!(
            dir = %self.source.dir.display(),
            nack_threshold = engine.options().nack_threshold,
            state_dir = ?engine.options().state_dir,
            restored,
            "local mode: serving the config folder"
        );
        Ok(())
    }

    fn routes(&self, ctx: &crate::Context) -> axum::Router {
        let state = RouteState {
            engine: self.engine.clone(),
            ctx: ctx.clone(),
        };
        axum::Router::new()
            .route("/status", axum::routing::get(get_status))
            .route(
                "/status/revisions/{namespace}/{name}/{version}",
                axum::routing::delete(delete_revision),
            )
            .with_state(state)
    }

    async fn run(mut self, ctx: crate::Context, shutdown: crate::Shutdown) {
        let mut shutdown = shutdown;
        let mut scan = tokio::time::interval(POLL_INTERVAL);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut evaluate = tokio::time::interval(EVALUATE_INTERVAL);
        evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = scan.tick() => match self.source.scan() {
                    Ok(false) => {}
                    Ok(true) => {
                        let manifests = self.source.manifests();
                        lock(&self.engine).reconcile(&manifests, &ctx, SystemTime::now());
                    }
                    Err(e) => {
                        tracing::error!(dir = %self.source.dir.display(), error = %e, "cannot read config folder")
                    }
                },
                _ = evaluate.tick() => lock(&self.engine).evaluate(&ctx, SystemTime::now()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;
    use marin3r_envoyconfig::envoyconfig::SecretData;
    use marin3r_xds::stats::{Api, NodeInfo, StreamEvent};
    use marin3r_xds::{ResourceType, SnapshotCache};
    use serde_json::json;
    use std::time::Duration;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn ctx() -> Context {
        Context {
            cache: SnapshotCache::new(),
            stats: SharedStats::new(),
        }
    }

    fn cluster(name: &str) -> Value {
        json!({"type": "cluster", "value": {"name": name, "connect_timeout": "1s"}})
    }

    fn broken() -> Value {
        json!({"type": "cluster", "value": {"name": "x", "bogus_field": 1}})
    }

    fn tls_secret_resource() -> Value {
        json!({"type": "secret", "generateFromTlsSecret": "cert", "blueprint": "tlsCertificate"})
    }

    fn envoy_config(name: &str, node: &str, resources: Vec<Value>) -> EnvoyConfig {
        parse_envoy_config(&json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeID": node, "resources": resources},
        }))
        .unwrap()
    }

    fn manifests(configs: Vec<EnvoyConfig>) -> Manifests {
        Manifests {
            configs,
            ..Manifests::default()
        }
    }

    fn tls_secret(cert: &str) -> (Option<String>, String, SecretData) {
        let data = BTreeMap::from([
            ("tls.crt".to_string(), cert.as_bytes().to_vec()),
            ("tls.key".to_string(), b"key".to_vec()),
        ]);
        (
            Some("default".into()),
            "cert".into(),
            SecretData {
                type_: "kubernetes.io/tls".into(),
                data,
            },
        )
    }

    fn spec_of(resources: Vec<Value>) -> EnvoyConfigSpec {
        envoy_config("kuard", "kuard", resources).spec
    }

    fn report(engine: &Engine) -> EnvoyConfigReport {
        engine.report().envoy_configs.remove(0)
    }

    fn connect(ctx: &Context, pod: &str) {
        ctx.stats.stream_opened(
            &NodeInfo {
                id: "kuard".into(),
                pod_name: pod.into(),
            },
            Api::Sotw,
        );
    }

    fn nack(ctx: &Context, pod: &str, t: ResourceType, version: &str, times: u64) {
        let events: Vec<StreamEvent> = (0..times)
            .map(|_| StreamEvent::Nack {
                node_id: "kuard".into(),
                pod_name: pod.into(),
                resource_type: t,
                version: version.into(),
                message: "unknown cluster 'nope'".into(),
            })
            .collect();
        ctx.stats.record(&events);
    }

    fn served_cluster_version(ctx: &Context) -> String {
        ctx.cache
            .get("kuard")
            .unwrap()
            .version(ResourceType::Cluster)
            .to_string()
    }

    // -- decide ------------------------------------------------------------------------

    #[test]
    fn decide_publishes_the_topmost_untainted_revision_that_resolves() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec_of(vec![cluster("a")]), t(1));
        let v2 = r.apply(&spec_of(vec![broken()]), t(2));
        let d = decide(&mut r, None, |s| {
            resolve_snapshot(s, &marin3r_envoyconfig::envoyconfig::NoSecrets)
        });
        assert_eq!(d.tainted.len(), 1);
        assert_eq!(d.tainted[0].version, v2);
        assert!(d.tainted[0].reason.starts_with("resources do not decode: "));
        assert!(
            d.tainted[0].reason.contains("bogus_field"),
            "{}",
            d.tainted[0].reason
        );
        let p = d.publish.unwrap();
        assert_eq!(p.version, v1);
        assert!(p.newly_published);
        assert_eq!(r.cache_state(), Some(CacheState::Rollback));

        // Already served and published before: not newly published.
        r.mark_published(&v1, p.snapshot.versions(), t(3));
        let d = decide(&mut r, Some(&v1), |s| {
            resolve_snapshot(s, &marin3r_envoyconfig::envoyconfig::NoSecrets)
        });
        assert!(d.tainted.is_empty());
        assert!(!d.publish.unwrap().newly_published);

        // Every revision tainted: nothing to publish.
        r.taint(&v1, "rejected");
        let d = decide(&mut r, Some(&v1), |_| {
            unreachable!("tainted revisions are not resolved")
        });
        assert!(d.publish.is_none());
        assert_eq!(r.cache_state(), Some(CacheState::RollbackFailed));
    }

    #[test]
    fn decide_treats_a_recreated_revision_as_newly_published() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec_of(vec![cluster("a")]), t(1));
        r.remove(&v1);
        r.apply(&spec_of(vec![cluster("a")]), t(2));
        let d = decide(&mut r, Some(&v1), |s| {
            resolve_snapshot(s, &marin3r_envoyconfig::envoyconfig::NoSecrets)
        });
        assert!(
            d.publish.unwrap().newly_published,
            "same version as the served one, but never published since it was re-created"
        );
    }

    // -- engine ------------------------------------------------------------------------

    #[test]
    fn a_new_config_is_published_in_sync() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::InSync));
        assert_eq!(r.desired_version, r.published_version);
        assert_eq!(r.envoy_api, "v3");
        assert_eq!(r.revisions.len(), 1);
        assert!(r.revisions[0].published);
        assert_eq!(
            r.revisions[0].last_published_at.as_deref(),
            Some("1970-01-01T00:00:01Z")
        );
        assert_eq!(
            r.revisions[0].provides_versions["cluster"],
            served_cluster_version(&ctx)
        );
        assert!(
            ctx.cache
                .get("kuard")
                .unwrap()
                .resource(ResourceType::Runtime, "runtime")
                .is_some()
        );
        // An unchanged folder changes nothing.
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(2),
        );
        assert_eq!(report(&e), r);
    }

    #[test]
    fn a_config_that_does_not_decode_is_tainted_and_the_last_good_one_kept() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        let good = served_cluster_version(&ctx);
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![broken()])]),
            &ctx,
            t(2),
        );
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::Rollback));
        assert_ne!(r.desired_version, r.published_version);
        assert_eq!(
            r.published_version.as_deref(),
            Some(r.revisions[0].version.as_str())
        );
        assert!(r.revisions[1].tainted);
        assert_eq!(served_cluster_version(&ctx), good);
        let out_of_sync = &r.conditions[0];
        assert_eq!(
            (out_of_sync.type_.as_str(), out_of_sync.status.as_str()),
            ("CacheOutOfSync", "True")
        );
    }

    #[test]
    fn nacks_from_every_pod_taint_and_roll_back_partial_ones_do_not() {
        let ctx = ctx();
        let mut e = Engine::new(Options {
            nack_threshold: 3,
            state_dir: None,
        });
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        let v1_cluster = served_cluster_version(&ctx);
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("b")])]),
            &ctx,
            t(2),
        );
        let v2_cluster = served_cluster_version(&ctx);
        assert_ne!(v1_cluster, v2_cluster);
        connect(&ctx, "pod-a");
        connect(&ctx, "pod-b");

        // Only pod-a rejects: never a taint.
        nack(&ctx, "pod-a", ResourceType::Cluster, &v2_cluster, 10);
        e.evaluate(&ctx, t(3));
        assert_eq!(report(&e).cache_state, Some(CacheState::InSync));

        // pod-b below the threshold: still nothing.
        nack(&ctx, "pod-b", ResourceType::Cluster, &v2_cluster, 2);
        e.evaluate(&ctx, t(4));
        assert_eq!(report(&e).cache_state, Some(CacheState::InSync));

        nack(&ctx, "pod-b", ResourceType::Cluster, &v2_cluster, 1);
        e.evaluate(&ctx, t(5));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::Rollback));
        let reason = r.revisions[1].taint_reason.clone().unwrap();
        assert!(reason.contains("at least 3 times"), "{reason}");
        assert!(reason.contains("Envoy: unknown cluster 'nope'"), "{reason}");
        assert_eq!(served_cluster_version(&ctx), v1_cluster, "rolled back");
        assert!(r.revisions[0].published && !r.revisions[1].published);
        assert_eq!(
            r.revisions[0].last_published_at.as_deref(),
            Some("1970-01-01T00:00:05Z")
        );
        // The rolled-back revision is not judged by the counts of the rejected one.
        e.evaluate(&ctx, t(6));
        assert_eq!(report(&e).cache_state, Some(CacheState::Rollback));

        // The next good config brings InSync back.
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("c")])]),
            &ctx,
            t(7),
        );
        assert_eq!(report(&e).cache_state, Some(CacheState::InSync));
    }

    #[test]
    fn a_revision_published_again_is_judged_on_fresh_nacks_only() {
        let ctx = ctx();
        let mut e = Engine::new(Options {
            nack_threshold: 2,
            state_dir: None,
        });
        connect(&ctx, "pod-a");
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("b")])]),
            &ctx,
            t(2),
        );
        let bad = served_cluster_version(&ctx);
        nack(&ctx, "pod-a", ResourceType::Cluster, &bad, 2);
        e.evaluate(&ctx, t(3));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::Rollback));
        let tainted = r.desired_version.clone().unwrap();

        // Deleting the tainted (desired) revision re-creates it and tries it again.
        let after = e
            .remove_revision("default", "kuard", &tainted, &ctx, t(4))
            .unwrap();
        assert_eq!(after.cache_state, Some(CacheState::InSync));
        assert_eq!(after.revisions[1].created_at, "1970-01-01T00:00:04Z");
        assert!(!after.revisions[1].tainted);
        assert_eq!(served_cluster_version(&ctx), bad);
        assert!(
            ctx.stats
                .nacks("kuard", ResourceType::Cluster, &bad)
                .is_empty(),
            "counts reset"
        );
        e.evaluate(&ctx, t(5));
        assert_eq!(
            report(&e).cache_state,
            Some(CacheState::InSync),
            "old NACKs do not count"
        );
        nack(&ctx, "pod-a", ResourceType::Cluster, &bad, 2);
        e.evaluate(&ctx, t(6));
        assert_eq!(report(&e).cache_state, Some(CacheState::Rollback));

        // Deleting the good one leaves nothing untainted: RollbackFailed, cache untouched.
        let good = report(&e).revisions[0].version.clone();
        let served = served_cluster_version(&ctx);
        let after = e
            .remove_revision("default", "kuard", &good, &ctx, t(7))
            .unwrap();
        assert_eq!(after.cache_state, Some(CacheState::RollbackFailed));
        assert_eq!(
            after.published_version.as_deref(),
            Some(good.as_str()),
            "still served"
        );
        assert_eq!(served_cluster_version(&ctx), served);
        let failed = &after.conditions[1];
        assert_eq!(
            (failed.type_.as_str(), failed.status.as_str()),
            ("RollbackFailed", "True")
        );

        assert_eq!(
            e.remove_revision("default", "kuard", "nope", &ctx, t(8)),
            Err(RemoveError::NoRevision {
                namespace: "default".into(),
                name: "kuard".into(),
                version: "nope".into()
            })
        );
        assert!(matches!(
            e.remove_revision("default", "other", &good, &ctx, t(8)),
            Err(RemoveError::NoEnvoyConfig { .. })
        ));
    }

    #[test]
    fn a_secret_change_republishes_the_same_revision() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        let ec = || envoy_config("kuard", "kuard", vec![tls_secret_resource()]);
        let with_secret = |cert: &str| Manifests {
            configs: vec![ec()],
            secrets: ManifestSecrets(vec![tls_secret(cert)]),
            ..Manifests::default()
        };
        e.reconcile(&with_secret("one"), &ctx, t(1));
        let before = report(&e);
        let secret_version = |ctx: &Context| {
            ctx.cache
                .get("kuard")
                .unwrap()
                .version(ResourceType::Secret)
                .to_string()
        };
        let v1 = secret_version(&ctx);
        e.reconcile(&with_secret("two"), &ctx, t(2));
        let after = report(&e);
        assert_eq!(after.revisions.len(), 1, "same revision");
        assert_eq!(after.desired_version, before.desired_version);
        assert_ne!(secret_version(&ctx), v1);
        assert_eq!(
            after.revisions[0].provides_versions["secret"],
            secret_version(&ctx)
        );
        assert_eq!(
            after.revisions[0].last_published_at.as_deref(),
            Some("1970-01-01T00:00:02Z")
        );

        // The Secret disappears: the revision no longer resolves and is tainted; the
        // cache keeps the last good snapshot.
        e.reconcile(&manifests(vec![ec()]), &ctx, t(3));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::RollbackFailed));
        assert!(
            r.revisions[0]
                .taint_reason
                .as_deref()
                .unwrap()
                .contains("cert")
        );
        assert_eq!(
            secret_version(&ctx),
            after.revisions[0].provides_versions["secret"]
        );
    }

    #[test]
    fn removed_and_invalid_envoyconfigs() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        e.reconcile(
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        // An invalid document of the same EnvoyConfig keeps its state.
        let invalid = Manifests {
            invalid_configs: vec![("default".into(), "kuard".into())],
            ..Manifests::default()
        };
        e.reconcile(&invalid, &ctx, t(2));
        assert_eq!(e.report().envoy_configs.len(), 1);
        assert!(ctx.cache.get("kuard").is_some());
        // Removed: revisions dropped, node no longer served.
        e.reconcile(&Manifests::default(), &ctx, t(3));
        assert!(e.report().envoy_configs.is_empty());
        assert!(ctx.cache.get("kuard").is_none());
    }

    #[test]
    fn a_node_id_belongs_to_the_first_envoyconfig() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        e.reconcile(
            &manifests(vec![
                envoy_config("b", "kuard", vec![cluster("b")]),
                envoy_config("a", "kuard", vec![cluster("a")]),
            ]),
            &ctx,
            t(1),
        );
        let r = e.report();
        assert_eq!(r.envoy_configs.len(), 1);
        assert_eq!(r.envoy_configs[0].name, "a");
        // a goes away: b takes the node over.
        e.reconcile(
            &manifests(vec![envoy_config("b", "kuard", vec![cluster("b")])]),
            &ctx,
            t(2),
        );
        assert_eq!(e.report().envoy_configs[0].name, "b");
        assert_eq!(
            served_cluster_version(&ctx),
            e.report().envoy_configs[0].revisions[0].provides_versions["cluster"]
        );
    }

    #[test]
    fn revisions_survive_a_restart_with_a_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            nack_threshold: 1,
            state_dir: Some(dir.path().join("state")),
        };
        let good = || manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]);
        let bad = || manifests(vec![envoy_config("kuard", "kuard", vec![broken()])]);
        let ctx1 = ctx();
        let mut e = Engine::new(options.clone());
        assert_eq!(e.load_state().unwrap(), 0);
        e.reconcile(&good(), &ctx1, t(1));
        e.reconcile(&bad(), &ctx1, t(2));
        let before = report(&e);
        assert_eq!(before.cache_state, Some(CacheState::Rollback));
        let file = dir.path().join("state/default_kuard.json");
        assert!(file.is_file());
        let names: Vec<String> = std::fs::read_dir(dir.path().join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["default_kuard.json"], "no temp file left behind");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let ctx2 = ctx();
        let mut e = Engine::new(options.clone());
        assert_eq!(e.load_state().unwrap(), 1);
        e.reconcile(&bad(), &ctx2, t(10));
        let after = report(&e);
        let summary = |r: &EnvoyConfigReport| -> Vec<(String, bool, Option<String>, String)> {
            r.revisions
                .iter()
                .map(|x| {
                    (
                        x.version.clone(),
                        x.published,
                        x.taint_reason.clone(),
                        x.created_at.clone(),
                    )
                })
                .collect()
        };
        assert_eq!(summary(&after), summary(&before), "restored as they were");
        assert_eq!(
            after.revisions[0].last_published_at.as_deref(),
            Some("1970-01-01T00:00:10Z"),
            "published again by the new process"
        );
        assert_eq!(after.cache_state, Some(CacheState::Rollback));
        assert_eq!(served_cluster_version(&ctx2), served_cluster_version(&ctx1));

        // RollbackFailed survives a restart too: the last good snapshot is served again.
        let good_version = after.revisions[0].version.clone();
        e.remove_revision("default", "kuard", &good_version, &ctx2, t(11))
            .unwrap();
        let ctx3 = ctx();
        let mut e = Engine::new(options.clone());
        e.load_state().unwrap();
        e.reconcile(&bad(), &ctx3, t(20));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::RollbackFailed));
        assert_eq!(r.published_version.as_deref(), Some(good_version.as_str()));
        assert_eq!(served_cluster_version(&ctx3), served_cluster_version(&ctx1));

        // Removing the EnvoyConfig deletes its file.
        e.reconcile(&Manifests::default(), &ctx3, t(21));
        assert!(!file.exists());

        // A corrupt file is ignored, not fatal.
        std::fs::write(&file, "{").unwrap();
        let mut e = Engine::new(options);
        assert_eq!(e.load_state().unwrap(), 0);
    }

    #[test]
    fn state_file_names_are_safe_and_unambiguous() {
        let name = |ns: &str, n: &str| state_file_name(&(ns.to_string(), n.to_string()));
        assert_eq!(name("default", "kuard.v1"), "default_kuard.v1.json");
        assert_eq!(name("a_b", "c"), "a%5Fb_c.json");
        assert_eq!(name("a", "b_c"), "a_b%5Fc.json");
        assert_eq!(name("x", "../../etc"), "x_..%2F..%2Fetc.json");
    }
}
