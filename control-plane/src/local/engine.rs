//! Local mode's self-healing engine, sans-I/O: the revisions of every EnvoyConfig of the
//! folder, brought in line by [`crate::publisher::decide`]. It never touches the snapshot
//! cache, the NACK statistics or the disk: every method returns the [`Effect`]s for the
//! shell ([`super::backend`]) to carry out, and reads the NACK statistics through
//! [`NackView`].
//!
//! "Did it change?" is answered once per fact: whether the folder's Secrets changed, by
//! [`Engine::reconcile`] (once per reconcile); whether an EnvoyConfig has anything new
//! (its spec, namespace or the Secrets its last resolution read), by
//! [`Tracked::changed`]; whether the snapshot to serve is new, by
//! [`Revisions::mark_published`] in [`sync`] — an unchanged one is not published at all.
//! A file's documents are the folder's ([`super::folder`]: its digest).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::folder::{Key, Manifests, key_of};
use super::state::{StateFile, StateFileRef};
use crate::nacks::Taint;
use crate::publisher::{self, NackView};
use crate::revisions::{DEFAULT_NACK_THRESHOLD, Revisions};
use crate::status::{EnvoyConfigReport, FileReport, StatusReport, conditions, envoy_config_report};
use marin3r_envoyconfig::envoyconfig::{CacheState, EnvoyConfig, EnvoyConfigSpec};
use marin3r_envoyconfig::manifest::ManifestSecrets;
use marin3r_xds::{ResourceType, Snapshot};

/// What the engine asks its shell to do.
#[derive(Debug)]
pub enum Effect {
    /// Serve `snapshot` to `node_id` (revision `version` of `envoyconfig`): only a new
    /// snapshot, or a revision that becomes the served one. With `reset_nacks` (the
    /// versions the snapshot provides, when the revision becomes the served one) first
    /// forget the NACK counts of those versions.
    Publish {
        envoyconfig: String,
        version: String,
        node_id: String,
        snapshot: Box<Snapshot>,
        reset_nacks: Option<BTreeMap<ResourceType, String>>,
    },
    /// No EnvoyConfig configures `node_id` any more: drop its snapshot (connected Envoys
    /// keep their config) and its NACK counts.
    Forget { node_id: String },
    /// Replace the state file of an EnvoyConfig with `json` (with `--state-dir`).
    Save { key: Key, json: String },
    /// Delete the state file of an EnvoyConfig (with `--state-dir`).
    Unsave { key: Key },
}

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
    spec: Arc<EnvoyConfigSpec>,
    revisions: Revisions,
    /// The revision whose snapshot the cache holds.
    served: Option<String>,
    /// The spec of `served` (kept because a served revision may be deleted).
    served_spec: Option<Arc<EnvoyConfigSpec>>,
    /// Restored from `--state-dir`: the revision served before the restart and its spec,
    /// served again if nothing untainted is left (so `RollbackFailed` survives a restart).
    restore: Option<(String, Arc<EnvoyConfigSpec>)>,
    /// The elected revision cannot be served yet (a Secret is missing or unusable).
    waiting: Option<publisher::Waiting>,
    /// Why the folder's current content of this EnvoyConfig is not used (an invalid
    /// document, a broken file): its last good state keeps being served.
    problems: Vec<String>,
    state: Option<CacheState>,
    conditions: Vec<Condition>,
    /// The JSON last written to the state dir.
    saved: Option<String>,
    /// The folder's latest parse of this EnvoyConfig (its `spec` and `namespace` are
    /// `spec` and `namespace`): the same parse again is "unchanged" at the cost of a
    /// pointer comparison.
    parsed: Option<Arc<EnvoyConfig>>,
    /// What the last [`sync`] read from the folder's Secrets: while the spec, its
    /// namespace and these are unchanged, a folder change elsewhere skips this
    /// EnvoyConfig (nothing is decoded again).
    reads: Option<publisher::Reads>,
}

impl Tracked {
    fn new(namespace: Option<String>, spec: Arc<EnvoyConfigSpec>) -> Self {
        Self {
            namespace,
            envoy_api: String::new(),
            revisions: Revisions::new(spec.node_id.clone()),
            spec,
            served: None,
            served_spec: None,
            restore: None,
            waiting: None,
            problems: Vec::new(),
            state: None,
            conditions: Vec::new(),
            saved: None,
            parsed: None,
            reads: None,
        }
    }

    /// Whether `ec` gives this EnvoyConfig anything to sync: the one place the engine
    /// decides "did it change?" for an EnvoyConfig. Unchanged: the same parse, or the same
    /// spec and namespace, and every Secret its last [`sync`] read the same. `secrets`:
    /// the folder's Secrets when they may differ from those of its last sync; `None` when
    /// they are known not to (reconcile's quick path compared them once for every
    /// EnvoyConfig).
    fn changed(&self, ec: &Arc<EnvoyConfig>, secrets: Option<&ManifestSecrets>) -> bool {
        // The folder parses a file only when its documents change: the same parse is the
        // same spec.
        let same_config = self.parsed.as_ref().is_some_and(|p| Arc::ptr_eq(p, ec))
            || (*self.spec == ec.spec && self.namespace == ec.metadata.namespace);
        let same_reads = self.reads.as_ref().is_some_and(|reads| match secrets {
            None => reads.complete(),
            Some(secrets) => reads.unchanged_in(&secrets.for_namespace(self.namespace.as_deref())),
        });
        !(same_config && same_reads)
    }
}

/// What [`Engine::follow`] knows of the folder's Secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Secrets {
    /// The same as at every EnvoyConfig's last sync (reconcile's quick path).
    AsLastSynced,
    /// Maybe not: the Secrets an EnvoyConfig's last sync read are compared.
    MayDiffer,
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
    /// The folder's Secrets, the revision metrics and the decode memo: what [`sync`]
    /// reads beside the EnvoyConfig it brings in line.
    env: SyncEnv,
    configs: BTreeMap<Key, Tracked>,
    /// Loaded from the state dir, taken when their EnvoyConfig shows up.
    restored: BTreeMap<Key, StateFile>,
    /// The folder's files that cannot be used now, as of the last reconcile.
    file_errors: BTreeMap<PathBuf, String>,
    /// EnvoyConfigs whose state may differ from their state file (synced since the last
    /// save, or their save failed).
    unsaved: BTreeSet<Key>,
    /// The folder's EnvoyConfigs as of the last reconcile, in file order.
    last: Vec<Arc<EnvoyConfig>>,
    /// Whether the last reconcile saw no problem at all (no invalid document, no broken
    /// file, no error): then a change of specs only takes [`Engine::reconcile`]'s
    /// quick path.
    last_clean: bool,
}

/// What [`sync`] reads beside the EnvoyConfig it brings in line.
#[derive(Debug, Default)]
struct SyncEnv {
    /// The folder's Secrets, as of the last [`Engine::reconcile`].
    secrets: ManifestSecrets,
    /// The self-healing series (`Context::revisions`; unregistered until set).
    metrics: crate::metrics::RevisionMetrics,
    /// The resources decoded from the specs' own text, for every resolution of this
    /// engine ([`publisher::resolution`]).
    memo: marin3r_envoyconfig::memo::DecodeMemo,
}

fn source(key: &Key) -> String {
    format!("{}/{}", key.0, key.1)
}

impl Engine {
    pub fn new(options: Options) -> Self {
        Self {
            options: Options {
                nack_threshold: options.nack_threshold.max(1),
                ..options
            },
            env: SyncEnv::default(),
            configs: BTreeMap::new(),
            restored: BTreeMap::new(),
            file_errors: BTreeMap::new(),
            unsaved: BTreeSet::new(),
            last: Vec::new(),
            last_clean: false,
        }
    }

    /// Feeds `metrics` (the process's [`crate::Context::revisions`]) from now on.
    pub fn set_metrics(&mut self, metrics: crate::metrics::RevisionMetrics) {
        self.env.metrics = metrics;
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Takes the state files read at start ([`super::state::load`]): each is used when
    /// its EnvoyConfig shows up with the same node id. Returns how many there are.
    pub fn restore(&mut self, states: Vec<StateFile>) -> usize {
        for state in states {
            self.restored
                .insert((state.namespace.clone(), state.name.clone()), state);
        }
        self.restored.len()
    }

    /// Applies the folder's content: new/changed specs become desired revisions, removed
    /// EnvoyConfigs are dropped, and every EnvoyConfig's cache entry is brought in line
    /// (Secrets may have changed).
    pub fn reconcile(
        &mut self,
        manifests: &Manifests,
        nacks: &dyn NackView,
        now: SystemTime,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        // Whether the folder's Secrets changed: asked here, once per reconcile.
        let secrets_changed = manifests.secrets != self.env.secrets;
        if let Some(changed) = self.only_specs_changed(manifests, secrets_changed) {
            // The same EnvoyConfigs, node ids and Secrets as last time, in the same
            // order, and no problem then or now: who wins each node is unchanged, so only
            // the changed specs are looked at, whatever the size of the folder; every
            // EnvoyConfig's last sync read these very Secrets.
            for (key, ec) in changed {
                self.follow(key, ec, Secrets::AsLastSynced, nacks, now, &mut effects);
            }
            self.last.clone_from(&manifests.configs);
            self.persist(&mut effects);
            return effects;
        }
        for e in &manifests.errors {
            tracing::error!(error = %e, "invalid manifest; ignored");
        }
        if secrets_changed {
            self.env.secrets = manifests.secrets.clone();
        }
        self.file_errors = manifests.file_errors.clone();

        // An invalid EnvoyConfig document keeps its last good state and its node id.
        let kept: BTreeSet<&Key> = manifests
            .invalid_configs
            .keys()
            .filter(|k| self.configs.contains_key(*k))
            .collect();
        // One definition per EnvoyConfig (the first in file order), then one EnvoyConfig
        // per node id (publisher::node_owners, as in Kubernetes mode). An invalid document
        // of a known EnvoyConfig keeps its last good state, node id included.
        let mut defined: BTreeMap<Key, &Arc<EnvoyConfig>> = BTreeMap::new();
        for ec in &manifests.configs {
            let key = key_of(ec);
            if defined.contains_key(&key) || kept.contains(&key) {
                tracing::error!(envoyconfig = %source(&key), "EnvoyConfig defined more than once; the first one is used");
                continue;
            }
            defined.insert(key, ec);
        }
        let kept_nodes: Vec<(&Key, &str)> = kept
            .iter()
            .filter_map(|k| Some((*k, self.configs.get(*k)?.revisions.node_id.as_str())))
            .collect();
        let claimed = publisher::node_owners(
            kept_nodes
                .iter()
                .copied()
                .chain(defined.iter().map(|(k, ec)| (k, ec.spec.node_id.as_str()))),
        );
        let mut winners: BTreeMap<Key, &Arc<EnvoyConfig>> = BTreeMap::new();
        for (key, ec) in defined {
            let node_id = &ec.spec.node_id;
            match claimed.get(node_id) {
                Some(owner) if *owner != key => {
                    tracing::error!(envoyconfig = %source(&key), node_id = %node_id, claimed_by = %source(owner), "node id already configured by another EnvoyConfig; ignored");
                }
                _ => {
                    winners.insert(key, ec);
                }
            }
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
            self.env.metrics.forget(&key.0, &key.1);
            if self.options.state_dir.is_some() {
                effects.push(Effect::Unsave { key: key.clone() });
            }
            if !claimed.contains_key(node_id) {
                effects.push(Effect::Forget {
                    node_id: node_id.clone(),
                });
            }
        }

        for (key, ec) in winners {
            self.follow(key, ec, Secrets::MayDiffer, nacks, now, &mut effects);
        }
        // What keeps each EnvoyConfig from following its file, shown in the status.
        for (key, t) in &mut self.configs {
            t.problems = manifests
                .invalid_configs
                .get(key)
                .cloned()
                .into_iter()
                .chain(manifests.files.get(key).and_then(|f| {
                    Some(format!(
                        "{}: {}",
                        f.display(),
                        manifests.file_errors.get(f)?
                    ))
                }))
                .collect();
        }
        self.last.clone_from(&manifests.configs);
        self.last_clean = manifests.errors.is_empty()
            && manifests.invalid_configs.is_empty()
            && manifests.file_errors.is_empty()
            && self.configs.len() == manifests.configs.len();
        self.persist(&mut effects);
        effects
    }

    /// The EnvoyConfigs the folder parsed again (with their keys), when that is all that
    /// changed since the last reconcile: the same EnvoyConfigs (key and node id) in the
    /// same order, each of them tracked (the winner of its node), the same Secrets
    /// (`secrets_changed` is false), and no problem then or now. `None` otherwise (the
    /// full reconcile decides). Whether each one changed is [`Tracked::changed`]'s to say.
    fn only_specs_changed<'m>(
        &self,
        manifests: &'m Manifests,
        secrets_changed: bool,
    ) -> Option<Vec<(Key, &'m Arc<EnvoyConfig>)>> {
        if !self.last_clean
            || secrets_changed
            || !manifests.errors.is_empty()
            || !manifests.invalid_configs.is_empty()
            || !manifests.file_errors.is_empty()
            || manifests.configs.len() != self.last.len()
        {
            return None;
        }
        let mut reparsed = Vec::new();
        for (old, new) in self.last.iter().zip(&manifests.configs) {
            // Not parsed again: nothing to look at (after a clean reconcile every
            // EnvoyConfig's `parsed` is its entry of `last`).
            if Arc::ptr_eq(old, new) {
                continue;
            }
            let same_identity = old.metadata.namespace == new.metadata.namespace
                && old.metadata.name == new.metadata.name
                && old.spec.node_id == new.spec.node_id;
            let key = key_of(new);
            if !same_identity || !self.configs.contains_key(&key) {
                return None;
            }
            reparsed.push((key, new));
        }
        Some(reparsed)
    }

    /// Makes the EnvoyConfig `key` (the winner of its node id) follow `ec`: a new or
    /// changed spec becomes its desired revision and the cache is brought in line, unless
    /// nothing it depends on changed ([`Tracked::changed`]).
    fn follow(
        &mut self,
        key: Key,
        ec: &Arc<EnvoyConfig>,
        secrets: Secrets,
        nacks: &dyn NackView,
        now: SystemTime,
        effects: &mut Vec<Effect>,
    ) {
        if let Some(t) = self.configs.get_mut(&key) {
            let may_differ = (secrets == Secrets::MayDiffer).then_some(&self.env.secrets);
            if !t.changed(ec, may_differ) {
                // Keep the latest parse: the next look at it is a pointer comparison.
                t.parsed = Some(Arc::clone(ec));
                return;
            }
        }
        // One copy of the spec for the EnvoyConfig, its revision and the served one.
        let spec = Arc::new(ec.spec.clone());
        let t = match self.configs.entry(key.clone()) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let mut t = Tracked::new(ec.metadata.namespace.clone(), Arc::clone(&spec));
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
        t.envoy_api = ec.spec.envoy_api.unwrap_or_default().as_str().to_string();
        t.parsed = Some(Arc::clone(ec));
        t.revisions.apply(&spec, now);
        t.spec = spec;
        self.unsaved.insert(key.clone());
        let verdict = publisher::served_verdict(
            &t.revisions,
            t.served.as_deref(),
            nacks,
            self.options.nack_threshold,
        );
        sync(t, &key, &self.env, verdict, now, effects);
    }

    /// Checks the NACK statistics of every served revision
    /// ([`publisher::served_verdict`]): a revision every subscribed Envoy rejected is
    /// tainted and the next untainted one published. The verdict is derived once and
    /// handed to [`sync`].
    pub fn evaluate(&mut self, nacks: &dyn NackView, now: SystemTime) -> Vec<Effect> {
        let threshold = self.options.nack_threshold;
        let mut effects = Vec::new();
        for (key, t) in &mut self.configs {
            let Some(taint) =
                publisher::served_verdict(&t.revisions, t.served.as_deref(), nacks, threshold)
            else {
                continue;
            };
            self.unsaved.insert(key.clone());
            sync(t, key, &self.env, Some(taint), now, &mut effects);
        }
        // A taint is saved even when it leaves nothing to publish (RollbackFailed: the
        // last good snapshot stays served, no other effect).
        self.persist(&mut effects);
        effects
    }

    /// Deletes a revision (`kubectl delete ecr` in Kubernetes mode). The current spec
    /// always has a revision: deleting it re-creates it afresh (untainted, fresh NACK
    /// counts) and tries it again. Returns the EnvoyConfig's report afterwards, and the
    /// effects.
    pub fn remove_revision(
        &mut self,
        namespace: &str,
        name: &str,
        version: &str,
        nacks: &dyn NackView,
        now: SystemTime,
    ) -> Result<(EnvoyConfigReport, Vec<Effect>), RemoveError> {
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
        self.unsaved.insert(key.clone());
        let mut effects = Vec::new();
        let verdict = publisher::served_verdict(
            &t.revisions,
            t.served.as_deref(),
            nacks,
            self.options.nack_threshold,
        );
        sync(t, &key, &self.env, verdict, now, &mut effects);
        let report = report_of(&key, t);
        self.persist(&mut effects);
        Ok((report, effects))
    }

    /// The status of every EnvoyConfig, by namespace and name.
    pub fn report(&self) -> StatusReport {
        StatusReport {
            envoy_configs: self
                .configs
                .iter()
                .map(|(key, t)| report_of(key, t))
                .collect(),
            files: self
                .file_errors
                .iter()
                .map(|(path, error)| FileReport {
                    path: path.display().to_string(),
                    error: error.clone(),
                })
                .collect(),
        }
    }

    /// The revisions of one EnvoyConfig.
    pub fn revisions(&self, namespace: &str, name: &str) -> Option<&Revisions> {
        self.configs
            .get(&(namespace.to_string(), name.to_string()))
            .map(|t| &t.revisions)
    }

    /// A [`Effect::Save`] for every EnvoyConfig whose state changed since it was last
    /// saved (with `--state-dir`).
    fn persist(&mut self, effects: &mut Vec<Effect>) {
        let unsaved = std::mem::take(&mut self.unsaved);
        if self.options.state_dir.is_none() {
            return;
        }
        for key in unsaved {
            let Some(t) = self.configs.get_mut(&key) else {
                continue;
            };
            let state = StateFileRef {
                namespace: &key.0,
                name: &key.1,
                served: t.served.as_deref(),
                served_spec: t.served_spec.as_deref(),
                revisions: &t.revisions,
            };
            let json = match serde_json::to_string_pretty(&state) {
                Ok(json) => json,
                Err(e) => {
                    tracing::error!(envoyconfig = %source(&key), error = %e, "cannot serialize the revisions");
                    continue;
                }
            };
            if t.saved.as_deref() == Some(json.as_str()) {
                continue;
            }
            t.saved = Some(json.clone());
            effects.push(Effect::Save { key, json });
        }
    }

    /// The shell could not write these state files: they are saved again with the next
    /// change.
    pub fn save_failed(&mut self, keys: &[Key]) {
        for key in keys {
            if let Some(t) = self.configs.get_mut(key) {
                t.saved = None;
                self.unsaved.insert(key.clone());
            }
        }
    }
}

fn report_of(key: &Key, t: &Tracked) -> EnvoyConfigReport {
    EnvoyConfigReport {
        errors: t.problems.clone(),
        ..envoy_config_report(
            &key.0,
            &key.1,
            &t.envoy_api,
            &t.revisions,
            t.served.as_deref(),
            t.conditions.clone(),
        )
    }
}

/// Brings the cache in line with one EnvoyConfig's revisions: applies what
/// [`publisher::decide_given`] decides with the NACK verdict on the served revision
/// (`verdict`, [`publisher::served_verdict`]): taints, publish with NACK counts reset for
/// a newly served revision, or keep the last good snapshot while waiting or with nothing
/// untainted. Logs state transitions and updates the conditions. A snapshot that is
/// neither new nor of a newly served revision is not published (the node already has it).
fn sync(
    t: &mut Tracked,
    key: &Key,
    env: &SyncEnv,
    verdict: Option<Taint>,
    now: SystemTime,
    effects: &mut Vec<Effect>,
) {
    let envoyconfig = source(key);
    let node_id = t.revisions.node_id.clone();
    let SyncEnv {
        secrets,
        metrics,
        memo,
    } = env;
    let namespaced = secrets.for_namespace(t.namespace.as_deref());
    let folder = publisher::Recording::new(&namespaced);
    let decision = publisher::decide_given(&t.revisions, t.served.as_deref(), verdict, |rev| {
        publisher::resolution(&rev.spec, &folder, memo)
    });
    for taint in &decision.taints {
        tracing::warn!(envoyconfig = %envoyconfig, node_id = %node_id, version = %taint.version, reason = %taint.reason, "revision tainted");
        if t.revisions.taint(&taint.version, taint.reason.clone()) {
            metrics.tainted(&node_id, taint.cause);
        }
    }
    if let Some(w) = &decision.waiting
        && t.waiting.as_ref() != Some(w)
    {
        tracing::warn!(envoyconfig = %envoyconfig, node_id = %node_id, version = %w.version, reason = %w.reason, "revision waits for its Secrets; the node keeps its current config");
    }
    t.waiting = decision.waiting;
    let mut publish = decision.publish;
    if publish.is_none() && t.served.is_none() && t.waiting.is_none() {
        // Right after a restart in RollbackFailed: serve what was served before.
        if let Some((version, spec)) = t.restore.take()
            && let publisher::Resolution::Ready(snapshot) =
                publisher::resolution(&spec, &folder, memo)
        {
            tracing::warn!(envoyconfig = %envoyconfig, node_id = %node_id, version = %version, "every revision is tainted; serving the snapshot served before the restart");
            publish = Some(publisher::Publish {
                version,
                versions: snapshot.versions(),
                snapshot: *snapshot,
                reset_nacks: false,
            });
            t.served_spec = Some(spec);
        }
    }
    t.restore = None;
    t.reads = Some(folder.into_reads());
    if let Some(publisher::Publish {
        version,
        snapshot,
        versions,
        reset_nacks,
    }) = publish
    {
        // Whether the node gets anything new: a revision that becomes the served one, or
        // a snapshot whose versions differ from what the revision provided.
        let (news, reset_nacks) = if reset_nacks {
            let news = t
                .revisions
                .mark_newly_published(&version, versions.clone(), now);
            (news, Some(versions))
        } else {
            (t.revisions.mark_published(&version, versions, now), None)
        };
        if let Some(rev) = t.revisions.revisions.iter().find(|r| r.version == version) {
            t.served_spec = Some(rev.spec.clone());
        }
        if reset_nacks.is_some() {
            metrics.published(&t.revisions, &version);
        }
        if news || reset_nacks.is_some() || t.served.as_deref() != Some(version.as_str()) {
            effects.push(Effect::Publish {
                envoyconfig: envoyconfig.clone(),
                version: version.clone(),
                node_id: node_id.clone(),
                snapshot: Box::new(snapshot),
                reset_nacks,
            });
        }
        t.served = Some(version);
    }
    let state = t.revisions.cache_state();
    metrics.cache_state(&key.0, &key.1, &node_id, state);
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
        t.waiting.as_ref().map(|w| w.reason.as_str()),
        &t.conditions,
        now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;
    use marin3r_envoyconfig::envoyconfig::SecretData;
    use marin3r_envoyconfig::envoyconfig::parse_envoy_config;
    use marin3r_xds::ResourceType;
    use marin3r_xds::SharedStats;
    use marin3r_xds::stats::{Api, NodeInfo, StreamEvent};
    use serde_json::{Value, json};
    use std::sync::Arc;

    /// Runs the engine and carries its effects out on `ctx`, as the shell does.
    fn reconcile(e: &mut Engine, m: &Manifests, ctx: &Context, now: SystemTime) {
        let effects = e.reconcile(m, &ctx.stats, now);
        super::super::backend::apply(e, effects, ctx);
    }

    fn evaluate(e: &mut Engine, ctx: &Context, now: SystemTime) {
        let effects = e.evaluate(&ctx.stats, now);
        super::super::backend::apply(e, effects, ctx);
    }

    fn remove_revision(
        e: &mut Engine,
        namespace: &str,
        name: &str,
        version: &str,
        ctx: &Context,
        now: SystemTime,
    ) -> Result<EnvoyConfigReport, RemoveError> {
        let (report, effects) = e.remove_revision(namespace, name, version, &ctx.stats, now)?;
        super::super::backend::apply(e, effects, ctx);
        Ok(report)
    }

    /// Loads the state dir as the shell does at start.
    fn load_state(e: &mut Engine) -> usize {
        let dir = e.options().state_dir.clone().unwrap();
        let (states, _) = super::super::state::load(&dir).unwrap();
        e.restore(states)
    }

    use crate::fixtures::t;

    fn ctx() -> Context {
        Context::new(SharedStats::new())
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
            configs: configs.into_iter().map(Arc::new).collect(),
            ..Manifests::default()
        }
    }

    /// A TLS Secret holding one of three throwaway certificate/key pairs (`"one"`,
    /// `"two"`, `"three"`): Envoy, and so the decoder, refuses data that is not PEM.
    fn tls_secret(cert: &str) -> (Option<String>, String, SecretData) {
        let (crt, key) = match cert {
            "one" => marin3r_testkit::tls::PEM_PAIRS[0],
            "two" => marin3r_testkit::tls::PEM_PAIRS[1],
            _ => marin3r_testkit::tls::PEM_PAIRS[2],
        };
        let data = BTreeMap::from([
            ("tls.crt".to_string(), crt.to_vec()),
            ("tls.key".to_string(), key.to_vec()),
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

    // -- engine ------------------------------------------------------------------------

    #[test]
    fn a_new_config_is_published_in_sync() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        reconcile(
            &mut e,
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
        reconcile(
            &mut e,
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
        reconcile(
            &mut e,
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        let good = served_cluster_version(&ctx);
        reconcile(
            &mut e,
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
        reconcile(
            &mut e,
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        let v1_cluster = served_cluster_version(&ctx);
        reconcile(
            &mut e,
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
        evaluate(&mut e, &ctx, t(3));
        assert_eq!(report(&e).cache_state, Some(CacheState::InSync));

        // pod-b below the threshold: still nothing.
        nack(&ctx, "pod-b", ResourceType::Cluster, &v2_cluster, 2);
        evaluate(&mut e, &ctx, t(4));
        assert_eq!(report(&e).cache_state, Some(CacheState::InSync));

        nack(&ctx, "pod-b", ResourceType::Cluster, &v2_cluster, 1);
        evaluate(&mut e, &ctx, t(5));
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
        evaluate(&mut e, &ctx, t(6));
        assert_eq!(report(&e).cache_state, Some(CacheState::Rollback));

        // The next good config brings InSync back.
        reconcile(
            &mut e,
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
        reconcile(
            &mut e,
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        reconcile(
            &mut e,
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("b")])]),
            &ctx,
            t(2),
        );
        let bad = served_cluster_version(&ctx);
        nack(&ctx, "pod-a", ResourceType::Cluster, &bad, 2);
        evaluate(&mut e, &ctx, t(3));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::Rollback));
        let tainted = r.desired_version.clone().unwrap();

        // Deleting the tainted (desired) revision re-creates it and tries it again.
        let after = remove_revision(&mut e, "default", "kuard", &tainted, &ctx, t(4)).unwrap();
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
        evaluate(&mut e, &ctx, t(5));
        assert_eq!(
            report(&e).cache_state,
            Some(CacheState::InSync),
            "old NACKs do not count"
        );
        nack(&ctx, "pod-a", ResourceType::Cluster, &bad, 2);
        evaluate(&mut e, &ctx, t(6));
        assert_eq!(report(&e).cache_state, Some(CacheState::Rollback));

        // Deleting the good one leaves nothing untainted: RollbackFailed, cache untouched.
        let good = report(&e).revisions[0].version.clone();
        let served = served_cluster_version(&ctx);
        let after = remove_revision(&mut e, "default", "kuard", &good, &ctx, t(7)).unwrap();
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
            remove_revision(&mut e, "default", "kuard", "nope", &ctx, t(8)),
            Err(RemoveError::NoRevision {
                namespace: "default".into(),
                name: "kuard".into(),
                version: "nope".into()
            })
        );
        assert!(matches!(
            remove_revision(&mut e, "default", "other", &good, &ctx, t(8)),
            Err(RemoveError::NoEnvoyConfig { .. })
        ));
    }

    /// The nodes an engine run publishes to.
    fn published_nodes(effects: &[Effect]) -> Vec<&str> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Publish { node_id, .. } => Some(node_id.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_change_syncs_only_the_envoyconfigs_it_concerns() {
        let mut e = Engine::new(Options::default());
        let secret_user = || envoy_config("tls", "tls", vec![tls_secret_resource()]);
        let plain = |n: &str, c: &str| Arc::new(envoy_config(n, n, vec![cluster(c)]));
        let (a, b) = (plain("a", "one"), plain("b", "one"));
        let folder = |a: &Arc<EnvoyConfig>, b: &Arc<EnvoyConfig>, cert: &str| Manifests {
            configs: vec![a.clone(), b.clone(), Arc::new(secret_user())],
            secrets: ManifestSecrets(vec![tls_secret(cert)]),
            ..Manifests::default()
        };
        let first = e.reconcile(&folder(&a, &b, "one"), &SharedStats::new(), t(1));
        assert_eq!(published_nodes(&first), ["a", "b", "tls"]);

        // `a` edited: only `a` is synced (before, every EnvoyConfig was resolved and
        // published again on every change).
        let a2 = plain("a", "two");
        let edit = e.reconcile(&folder(&a2, &b, "one"), &SharedStats::new(), t(2));
        assert_eq!(published_nodes(&edit), ["a"]);
        // The same content parsed again (another file changed) is compared, not trusted
        // by identity only: still nothing to do for it.
        let b_again = plain("b", "one");
        let same = e.reconcile(&folder(&a2, &b_again, "one"), &SharedStats::new(), t(3));
        assert_eq!(published_nodes(&same), Vec::<&str>::new());
        // A Secret change concerns only the EnvoyConfig that read it.
        let rotated = e.reconcile(&folder(&a2, &b_again, "two"), &SharedStats::new(), t(4));
        assert_eq!(published_nodes(&rotated), ["tls"]);
        let r = e.report();
        let last_published = |name: &str| {
            r.envoy_configs
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.revisions.last())
                .and_then(|r| r.last_published_at.clone())
        };
        assert_eq!(last_published("b").as_deref(), Some("1970-01-01T00:00:01Z"));
        assert_eq!(
            last_published("tls").as_deref(),
            Some("1970-01-01T00:00:04Z")
        );
    }

    /// What one reconcile did: the nodes published (with their versions) and forgotten.
    fn outcome(effects: &[Effect]) -> Vec<String> {
        let mut out: Vec<String> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Publish {
                    node_id, version, ..
                } => Some(format!("publish {node_id} {version}")),
                Effect::Forget { node_id } => Some(format!("forget {node_id}")),
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_quick_path_of_a_spec_change_does_what_the_full_reconcile_does() {
        let ec =
            |name: &str, node: &str, c: &str| Arc::new(envoy_config(name, node, vec![cluster(c)]));
        let (a, b, c) = (
            ec("a", "a", "one"),
            ec("b", "b", "one"),
            ec("c", "c", "one"),
        );
        let folder = |configs: Vec<&Arc<EnvoyConfig>>| Manifests {
            configs: configs.into_iter().cloned().collect(),
            ..Manifests::default()
        };
        let b2 = ec("b", "b", "two");
        let b_moved = ec("b", "x", "two");
        let (a_as_c, c_as_a) = (ec("a", "c", "one"), ec("c", "a", "one"));
        let b_broken = Arc::new(envoy_config("b", "x", vec![broken()]));
        let b_twice = ec("b", "y", "three");
        let b3 = ec("b", "x", "four");
        let with_secret = Manifests {
            secrets: ManifestSecrets(vec![tls_secret("one")]),
            ..folder(vec![&a_as_c, &b3, &c_as_a])
        };
        let steps: Vec<(&str, Manifests, bool)> = vec![
            ("start", folder(vec![&a, &b, &c]), false),
            ("b edited", folder(vec![&a, &b2, &c]), true),
            ("b's node id changed", folder(vec![&a, &b_moved, &c]), false),
            (
                "a and c swap node ids",
                folder(vec![&a_as_c, &b_moved, &c_as_a]),
                false,
            ),
            ("b broken", folder(vec![&a_as_c, &b_broken, &c_as_a]), true),
            (
                "b defined twice",
                folder(vec![&a_as_c, &b_broken, &b_twice, &c_as_a]),
                false,
            ),
            (
                "the second b gone, b edited",
                folder(vec![&a_as_c, &b3, &c_as_a]),
                false,
            ),
            ("nothing changed", folder(vec![&a_as_c, &b3, &c_as_a]), true),
            ("a Secret added", with_secret, false),
            ("another order", folder(vec![&c_as_a, &b3, &a_as_c]), false),
        ];
        let (quick_ctx, full_ctx) = (ctx(), ctx());
        let mut quick = Engine::new(Options::default());
        let mut full = Engine::new(Options::default());
        for (i, (step, m, takes_quick_path)) in steps.iter().enumerate() {
            let now = t(i as u64 + 1);
            assert_eq!(
                quick
                    .only_specs_changed(m, m.secrets != quick.env.secrets)
                    .is_some(),
                *takes_quick_path,
                "{step}"
            );
            full.last_clean = false;
            let q = quick.reconcile(m, &quick_ctx.stats, now);
            let f = full.reconcile(m, &full_ctx.stats, now);
            assert_eq!(outcome(&q), outcome(&f), "{step}");
            super::super::backend::apply(&mut quick, q, &quick_ctx);
            super::super::backend::apply(&mut full, f, &full_ctx);
            assert_eq!(quick.report(), full.report(), "{step}");
        }
        assert!(
            quick
                .report()
                .envoy_configs
                .iter()
                .any(|c| c.name == "b" && c.revisions.len() > 1),
            "b went through revisions"
        );
    }

    /// Something an EnvoyConfig depends on changed but what it resolves to did not: it is
    /// resolved again and nothing is published (the node already has that snapshot), and
    /// its revision keeps its `lastPublishedAt`.
    #[test]
    fn a_resolution_to_the_same_snapshot_publishes_nothing() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        let tls = Arc::new(envoy_config("kuard", "kuard", vec![tls_secret_resource()]));
        let folder = |ec: &Arc<EnvoyConfig>, extra: &str| {
            let mut secret = tls_secret("one");
            secret
                .2
                .data
                .insert("extra".to_string(), extra.as_bytes().to_vec());
            Manifests {
                configs: vec![ec.clone()],
                secrets: ManifestSecrets(vec![secret]),
                ..Manifests::default()
            }
        };
        let first = e.reconcile(&folder(&tls, "a"), &ctx.stats, t(1));
        assert_eq!(published_nodes(&first), ["kuard"]);
        super::super::backend::apply(&mut e, first, &ctx);
        let served = ctx.cache.get("kuard").unwrap().versions();

        // The Secret changed in a key the config does not use.
        let same = e.reconcile(&folder(&tls, "b"), &ctx.stats, t(2));
        assert_eq!(published_nodes(&same), Vec::<&str>::new());
        assert_eq!(
            report(&e).revisions[0].last_published_at.as_deref(),
            Some("1970-01-01T00:00:01Z")
        );

        // A revision that is not served is deleted: the served one is decided again, to
        // the same snapshot.
        let plain = Arc::new(envoy_config("kuard", "kuard", vec![cluster("a")]));
        reconcile(&mut e, &folder(&plain, "b"), &ctx, t(3));
        let old = report(&e).revisions[0].version.clone();
        let (_, effects) = e
            .remove_revision("default", "kuard", &old, &ctx.stats, t(4))
            .unwrap();
        assert_eq!(published_nodes(&effects), Vec::<&str>::new());
        assert_ne!(ctx.cache.get("kuard").unwrap().versions(), served);
        assert_eq!(report(&e).cache_state, Some(CacheState::InSync));
    }

    #[test]
    fn a_secret_change_republishes_the_same_revision() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        let ec = || envoy_config("kuard", "kuard", vec![tls_secret_resource()]);
        let with_secret = |cert: &str| Manifests {
            configs: vec![ec().into()],
            secrets: ManifestSecrets(vec![tls_secret(cert)]),
            ..Manifests::default()
        };
        reconcile(&mut e, &with_secret("one"), &ctx, t(1));
        let before = report(&e);
        let secret_version = |ctx: &Context| {
            ctx.cache
                .get("kuard")
                .unwrap()
                .version(ResourceType::Secret)
                .to_string()
        };
        let v1 = secret_version(&ctx);
        reconcile(&mut e, &with_secret("two"), &ctx, t(2));
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

        // The Secret disappears: the revision waits (never a taint, design.md §4); the
        // cache keeps the last good snapshot and the status names the Secret.
        reconcile(&mut e, &manifests(vec![ec()]), &ctx, t(3));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::InSync));
        assert!(!r.revisions[0].tainted, "a missing Secret is a wait");
        let out_of_sync = &r.conditions[0];
        assert_eq!(
            (
                out_of_sync.type_.as_str(),
                out_of_sync.status.as_str(),
                out_of_sync.reason.as_str()
            ),
            ("CacheOutOfSync", "True", "ResourcesOutOfSync")
        );
        assert!(
            out_of_sync.message.contains("cert"),
            "{}",
            out_of_sync.message
        );
        assert_eq!(
            secret_version(&ctx),
            after.revisions[0].provides_versions["secret"]
        );

        // It comes back: published at once, the same revision, in sync again.
        reconcile(&mut e, &with_secret("three"), &ctx, t(4));
        let r = report(&e);
        assert_eq!(r.revisions.len(), 1, "same revision");
        assert_eq!(r.conditions[0].status, "False");
        assert_ne!(
            secret_version(&ctx),
            after.revisions[0].provides_versions["secret"],
            "the new Secret is served"
        );
    }

    #[test]
    fn removed_and_invalid_envoyconfigs() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        reconcile(
            &mut e,
            &manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]),
            &ctx,
            t(1),
        );
        // An invalid document of the same EnvoyConfig keeps its state.
        let invalid = Manifests {
            invalid_configs: BTreeMap::from([(
                ("default".to_string(), "kuard".to_string()),
                "invalid EnvoyConfig: spec.nodeID: missing field".to_string(),
            )]),
            ..Manifests::default()
        };
        reconcile(&mut e, &invalid, &ctx, t(2));
        assert_eq!(e.report().envoy_configs.len(), 1);
        assert!(ctx.cache.get("kuard").is_some());
        // … and the status says why what is written is not used.
        assert_eq!(
            report(&e).errors,
            ["invalid EnvoyConfig: spec.nodeID: missing field"]
        );
        // A broken file: its EnvoyConfigs keep their last good content, and say so; the
        // status lists the file.
        let file = PathBuf::from("/config/kuard.yaml");
        let broken_file = Manifests {
            configs: vec![envoy_config("kuard", "kuard", vec![cluster("a")]).into()],
            files: BTreeMap::from([(("default".to_string(), "kuard".to_string()), file.clone())]),
            file_errors: BTreeMap::from([(file, "invalid YAML/JSON: line 3".to_string())]),
            ..Manifests::default()
        };
        reconcile(&mut e, &broken_file, &ctx, t(2));
        assert_eq!(
            report(&e).errors,
            ["/config/kuard.yaml: invalid YAML/JSON: line 3"]
        );
        assert_eq!(e.report().files.len(), 1);
        assert_eq!(e.report().files[0].path, "/config/kuard.yaml");
        // Removed: revisions dropped, node no longer served.
        reconcile(&mut e, &Manifests::default(), &ctx, t(3));
        assert!(e.report().envoy_configs.is_empty());
        assert!(ctx.cache.get("kuard").is_none());
    }

    #[test]
    fn a_node_id_belongs_to_the_first_envoyconfig() {
        let ctx = ctx();
        let mut e = Engine::new(Options::default());
        reconcile(
            &mut e,
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
        reconcile(
            &mut e,
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
    fn a_taint_that_leaves_nothing_to_publish_is_saved() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            nack_threshold: 1,
            state_dir: Some(dir.path().join("state")),
        };
        let ctx = ctx();
        let mut e = Engine::new(options.clone());
        assert_eq!(load_state(&mut e), 0);
        let only = manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]);
        reconcile(&mut e, &only, &ctx, t(1));
        connect(&ctx, "pod-a");
        nack(
            &ctx,
            "pod-a",
            ResourceType::Cluster,
            &served_cluster_version(&ctx),
            1,
        );
        evaluate(&mut e, &ctx, t(2));
        assert_eq!(report(&e).cache_state, Some(CacheState::RollbackFailed));
        // A new process finds the taint: RollbackFailed, not a fresh untainted revision.
        let mut restarted = Engine::new(options);
        assert_eq!(load_state(&mut restarted), 1);
        reconcile(&mut restarted, &only, &ctx, t(3));
        assert_eq!(
            report(&restarted).cache_state,
            Some(CacheState::RollbackFailed)
        );
    }

    /// A restart on a corrupt state file whose last change was the taint: the first
    /// publication of the new process already honours it (the known-bad revision, which
    /// is the folder's current content, is never published again).
    #[test]
    fn a_restart_on_a_corrupt_state_file_never_publishes_the_tainted_revision() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            nack_threshold: 1,
            state_dir: Some(dir.path().join("state")),
        };
        let good = || manifests(vec![envoy_config("kuard", "kuard", vec![cluster("a")])]);
        let bad = || manifests(vec![envoy_config("kuard", "kuard", vec![cluster("b")])]);
        let ctx1 = ctx();
        let mut e = Engine::new(options.clone());
        assert_eq!(load_state(&mut e), 0);
        reconcile(&mut e, &good(), &ctx1, t(1));
        let good_cluster = served_cluster_version(&ctx1);
        reconcile(&mut e, &bad(), &ctx1, t(2));
        let bad_cluster = served_cluster_version(&ctx1);
        connect(&ctx1, "pod-a");
        nack(&ctx1, "pod-a", ResourceType::Cluster, &bad_cluster, 1);
        evaluate(&mut e, &ctx1, t(3));
        assert_eq!(report(&e).cache_state, Some(CacheState::Rollback));
        assert_eq!(served_cluster_version(&ctx1), good_cluster);

        // The state file is corrupted while the process is down.
        std::fs::write(dir.path().join("state/default_kuard.json"), "{").unwrap();
        let ctx2 = ctx();
        let mut e = Engine::new(options);
        assert_eq!(load_state(&mut e), 1);
        let effects = e.reconcile(&bad(), &ctx2.stats, t(10));
        let published: Vec<String> = effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Publish { snapshot, .. } => {
                    Some(snapshot.version(ResourceType::Cluster).to_string())
                }
                _ => None,
            })
            .collect();
        assert_eq!(published, [good_cluster], "only the last good revision");
        super::super::backend::apply(&mut e, effects, &ctx2);
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::Rollback));
        assert!(r.revisions[1].tainted, "the taint survived");
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
        assert_eq!(load_state(&mut e), 0);
        reconcile(&mut e, &good(), &ctx1, t(1));
        reconcile(&mut e, &bad(), &ctx1, t(2));
        let before = report(&e);
        assert_eq!(before.cache_state, Some(CacheState::Rollback));
        let file = dir.path().join("state/default_kuard.json");
        assert!(file.is_file());
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [".default_kuard.json.prev", "default_kuard.json"],
            "no temp file left behind; the previous generation is kept"
        );
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let ctx2 = ctx();
        let mut e = Engine::new(options.clone());
        assert_eq!(load_state(&mut e), 1);
        reconcile(&mut e, &bad(), &ctx2, t(10));
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
        remove_revision(&mut e, "default", "kuard", &good_version, &ctx2, t(11)).unwrap();
        let ctx3 = ctx();
        let mut e = Engine::new(options.clone());
        load_state(&mut e);
        reconcile(&mut e, &bad(), &ctx3, t(20));
        let r = report(&e);
        assert_eq!(r.cache_state, Some(CacheState::RollbackFailed));
        assert_eq!(r.published_version.as_deref(), Some(good_version.as_str()));
        assert_eq!(served_cluster_version(&ctx3), served_cluster_version(&ctx1));

        // Removing the EnvoyConfig deletes its file (and the previous generation).
        reconcile(&mut e, &Manifests::default(), &ctx3, t(21));
        assert!(!file.exists());
        assert!(!super::super::state::previous_of(&file).exists());

        // A corrupt file is ignored, not fatal.
        std::fs::write(&file, "{").unwrap();
        let mut e = Engine::new(options);
        assert_eq!(load_state(&mut e), 0);
    }
}
