//! The config folder: its manifest files, re-read incrementally, and what they define
//! (EnvoyConfigs and Secrets).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::Value;

use marin3r_envoyconfig::envoyconfig::{EnvoyConfig, SecretData, parse_envoy_config, parse_secret};
use marin3r_envoyconfig::manifest::ManifestSecrets;

use super::settle::{Event, Settling, Verdict, Watch};

/// How long after a failed attempt the folder's inotify watch is set up again (doubling
/// up to [`REARM_BACKOFF_MAX`]).
pub const REARM_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between two attempts to set the watch up again.
pub const REARM_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a file's directory entry must stay gone before what it defined is deleted:
/// a file replaced in two steps (`rm` then a new file or symlink, `ln -sf` without an
/// atomic rename) is a replacement, not a deletion followed by a new EnvoyConfig (which
/// would drop its revisions and taints).
pub const DELETE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How often every settled file is read again and its bytes compared, whatever its
/// fingerprint says: a rewrite that kept size, inode and times (a clock or file system
/// with coarse timestamps) is not served stale for longer than this.
pub const CONTENT_RESCAN: std::time::Duration = std::time::Duration::from_secs(10);

/// Identity of an EnvoyConfig: `(namespace, name)`.
pub type Key = (String, String);

/// The key of an EnvoyConfig named `name` in `namespace` (empty or missing: the default
/// namespace): the one rule keys are derived with, from a document or a parse.
fn key(namespace: Option<&str>, name: &str) -> Key {
    (
        marin3r_wire::namespace_or_default(namespace).to_string(),
        name.to_string(),
    )
}

/// The key of a parsed EnvoyConfig.
pub fn key_of(ec: &EnvoyConfig) -> Key {
    key(
        ec.metadata.namespace.as_deref(),
        ec.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// Largest manifest file that is read, like the API server's ~1.5 MiB object limit (an
/// EnvoyConfig larger than that could not exist in a cluster either). A larger file is
/// reported and its last good content kept; it is never read into memory (a file that
/// grows while read, or says it is smaller than it is, is cut at the limit and refused).
pub const MAX_FILE_BYTES: u64 = 3 * 512 * 1024;

/// With inotify, how often the whole folder is listed anyway, for the changes it does not
/// report (the target of a symlink outside the folder). Between two such scans only the
/// files named by events are looked at, so an edit costs the same beside 1,000 other
/// files as alone.
pub const FULL_RESCAN: std::time::Duration = std::time::Duration::from_secs(1);

/// What `stat` says of a file; a change of any of it means the file is read again. The
/// status-change time (`ctime`) moves on every write and cannot be set back, so a
/// rewrite of the same size that restores the modification time (`cp -p`) is seen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    changed: (i64, i64),
    device: u64,
    inode: u64,
}

impl Fingerprint {
    fn hash(&self) -> u64 {
        use std::hash::{Hash, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        Hash::hash(self, &mut h);
        h.finish()
    }
}

fn fingerprint(m: &std::fs::Metadata) -> Fingerprint {
    use std::os::unix::fs::MetadataExt as _;
    Fingerprint {
        len: m.len(),
        modified: m.modified().ok(),
        changed: (m.ctime(), m.ctime_nsec()),
        device: m.dev(),
        inode: m.ino(),
    }
}

/// Why a folder entry named like a manifest cannot be read as one, from its `stat`
/// (symlinks followed), or `None` for a regular file: only regular files are ever
/// read. Asked before opening and again on the opened file by the one file reader
/// ([`marin3r_fsread::read_regular_file`]; it may have been swapped in between).
fn not_a_regular_file(meta: &std::fs::Metadata) -> Option<String> {
    marin3r_fsread::special_kind(meta)
        .map(|kind| format!("not a regular file ({kind}): only regular files are read"))
}

/// Reads the regular file at `path` (symlinks followed), at most `limit` bytes, or why
/// not (without the path, which the caller reports): local mode's files (manifests,
/// state files) go through the one bounded, regular-file-only, non-blocking reader of
/// every process, [`marin3r_fsread::read_regular_file`].
pub(super) fn read_regular_file(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    marin3r_fsread::read_regular_file(path, limit).map_err(|e| e.reason())
}

/// Whether the folder entry at `path` is gone (only then is what it defined deleted): an
/// entry that is there but cannot be used (a dangling symlink, a loop, a special file,
/// a directory, no permission) is not.
fn entry_gone(path: &Path) -> bool {
    matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

#[derive(Debug)]
struct FileState {
    /// `None` while the entry cannot be stat'ed (a dangling symlink, a loop).
    fingerprint: Option<Fingerprint>,
    /// [`digest`] of the documents of the last successful parse (the documents are not
    /// kept: their tree is ten times the file's size).
    digest: Option<u64>,
    /// A hash of the bytes of the last successful parse: the same bytes read again are
    /// not parsed again.
    bytes: Option<u64>,
    /// What each document defines, parsed once when the file changes (a change elsewhere
    /// in the folder never parses this file again).
    parsed: Vec<Parsed>,
    /// Why the current content is not used (its last good content is), if so.
    error: Option<String>,
}

/// What one document defines.
#[derive(Debug)]
enum Parsed {
    /// A valid `kind: EnvoyConfig` document (its key is derived by who needs it,
    /// [`key_of`]).
    Config(Arc<EnvoyConfig>),
    /// A `kind: EnvoyConfig` document that is not a valid EnvoyConfig: its key (when it
    /// has a name) and why.
    InvalidConfig {
        key: Option<Key>,
        error: String,
    },
    Secret(Result<(Option<String>, String, SecretData), String>),
    /// Any other kind: ignored.
    Other,
}

fn parse(doc: &Value) -> Parsed {
    match doc.get("kind").and_then(Value::as_str) {
        Some("EnvoyConfig") => match parse_envoy_config(doc) {
            Ok(ec) => Parsed::Config(Arc::new(ec)),
            Err(e) => Parsed::InvalidConfig {
                key: doc["metadata"]["name"]
                    .as_str()
                    .map(|name| key(doc["metadata"]["namespace"].as_str(), name)),
                error: e.to_string(),
            },
        },
        Some("Secret") => Parsed::Secret(parse_secret(doc)),
        _ => Parsed::Other,
    }
}

/// The folder's manifests, re-read incrementally.
#[derive(Debug)]
pub struct LocalSource {
    pub(super) dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// The folder's inotify watch; `None` when it could not be set up or was lost.
    watch: Option<Watch>,
    /// Without a watch: when to try setting it up again, and the wait after that.
    rearm: Option<(Instant, std::time::Duration)>,
    /// How many times the watch was set up (a new one needs a new [`Self::readiness`]).
    watch_generation: u64,
    /// When every settled file was last read again ([`CONTENT_RESCAN`]).
    last_content: Option<Instant>,
    /// Known files whose directory entry is gone, since when ([`DELETE_GRACE`]).
    gone: BTreeMap<PathBuf, Instant>,
    settling: Settling,
    /// Changed files whose writer is not done yet (their last good content is used).
    unsettled: BTreeSet<PathBuf>,
    /// Files read while still held open by a writer (warned once per file).
    overdue: BTreeSet<PathBuf>,
    /// Whether the first scan was done (it reads every file as it is).
    scanned: bool,
    /// Manifests named by inotify events since the last scan.
    dirty: BTreeSet<PathBuf>,
    /// Whether an event asks for the whole folder to be listed again (a `..data` swap).
    rescan_all: bool,
    /// When the whole folder was last listed.
    last_full: Option<Instant>,
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
    /// Reads `dir`, watching it with inotify to know when a changed file has settled
    /// ([`super::settle`]).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let watch = match Watch::new(&dir) {
            Ok(watch) => Some(watch),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config folder with inotify; a changed file is read once unchanged for {} ms until the watch can be set up", super::settle::QUIET.as_millis());
                None
            }
        };
        Self::with_watch(dir, watch, true)
    }

    /// Reads `dir` without inotify: a changed file is read once unchanged for
    /// [`super::settle::QUIET`].
    #[cfg(test)]
    fn without_watch(dir: impl Into<PathBuf>) -> Self {
        Self::with_watch(dir.into(), None, false)
    }

    /// `inotify`: whether a missing watch is to be set up again (never for
    /// a source read without inotify).
    fn with_watch(dir: PathBuf, watch: Option<Watch>, inotify: bool) -> Self {
        let now = Instant::now();
        Self {
            dir,
            files: BTreeMap::new(),
            settling: Settling::new(watch.is_some()),
            rearm: (inotify && watch.is_none()).then_some((now + REARM_BACKOFF, REARM_BACKOFF)),
            watch_generation: u64::from(watch.is_some()),
            last_content: None,
            gone: BTreeMap::new(),
            watch,
            unsettled: BTreeSet::new(),
            overdue: BTreeSet::new(),
            scanned: false,
            dirty: BTreeSet::new(),
            rescan_all: false,
            last_full: None,
        }
    }

    /// Something to wait on for "the folder's files changed" (its inotify queue became
    /// readable), or `None` without inotify (then only polling finds changes).
    pub fn readiness(&self) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
        let watch = self.watch.as_ref()?;
        match watch.readiness() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot wait on the config folder's inotify events; polling only");
                None
            }
        }
    }

    /// Whether the folder is watched by inotify now (its changes are events).
    pub fn watching(&self) -> bool {
        self.watch.is_some()
    }

    /// Changes each time the watch is set up again: [`Self::readiness`] is then to be
    /// asked again.
    pub fn watch_generation(&self) -> u64 {
        self.watch_generation
    }

    /// The watch is lost (the folder was deleted, moved or swapped): drops it, and sets it
    /// up again on this scan or the next ones ([`Self::rearm_if_due`]).
    fn lose_watch(&mut self, now: Instant, why: &str) {
        tracing::warn!(dir = %self.dir.display(), "{why}; watching the folder again");
        self.watch = None;
        self.settling.observe(Event::Lost, now);
        self.rescan_all = true;
        self.rearm = Some((now, REARM_BACKOFF));
    }

    /// Without a watch, sets it up again once due (with backoff while that fails); then
    /// the whole folder is listed again, and a file whose writer was not seen closing it
    /// is read only once it stayed unchanged for a while ([`Settling::resume`]).
    fn rearm_if_due(&mut self, now: Instant) {
        let Some((due, backoff)) = self.rearm else {
            return;
        };
        if self.watch.is_some() || now < due {
            return;
        }
        match Watch::new(&self.dir) {
            Ok(watch) => {
                tracing::info!(dir = %self.dir.display(), "watching the config folder with inotify again");
                self.watch = Some(watch);
                self.watch_generation += 1;
                self.rearm = None;
                self.settling.resume(now);
                self.rescan_all = true;
            }
            Err(e) => {
                if backoff == REARM_BACKOFF {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the config folder with inotify; retrying with backoff, polling meanwhile");
                }
                self.rearm = Some((now + backoff, (backoff * 2).min(REARM_BACKOFF_MAX)));
            }
        }
    }

    /// Takes the events queued since the last call: write events feed the settling, and
    /// the manifests they name are looked at again by the next scan. Lost events mean
    /// the whole folder is listed again; a lost watch is set up again.
    fn observe_events(&mut self, now: Instant) {
        let Some(watch) = &mut self.watch else { return };
        for event in watch.drain() {
            let path = match &event {
                Event::Written(p) | Event::Done(p) | Event::Touched(p) => p,
                Event::Overflow => {
                    tracing::warn!(dir = %self.dir.display(), "inotify queue overflow: lost track of the config folder's writers; listing it again");
                    self.rescan_all = true;
                    self.settling.observe(event, now);
                    continue;
                }
                Event::Lost => {
                    self.lose_watch(now, "the config folder's inotify watch is gone (the folder was deleted, moved or swapped)");
                    return;
                }
            };
            if is_manifest_name(path) {
                self.dirty.insert(path.clone());
            } else if path
                .file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b".."))
            {
                // The kubelet's atomic writer (a mounted ConfigMap or Secret) swaps its
                // `..data` symlink: every file behind it may have changed.
                self.rescan_all = true;
            }
            self.settling.observe(event, now);
        }
    }

    /// Whether the changed file at `path` can be read now.
    fn settled(&mut self, path: &Path, fp: &Fingerprint, now: Instant) -> bool {
        if !self.scanned && !self.settling.uses_events() {
            // At start, without write events, every file is read as it is.
            return true;
        }
        match self.settling.verdict(path, fp.hash(), now) {
            Verdict::Settled => true,
            Verdict::Writing => false,
            Verdict::Overdue => {
                if self.overdue.insert(path.to_path_buf()) {
                    tracing::warn!(file = %path.display(), "the file has been held open by a writer for {} s; reading it as it is", super::settle::MAX_SETTLE.as_secs());
                }
                true
            }
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
    ///
    /// A changed file is read only once it has settled ([`super::settle`]); until then
    /// its last good content is used and it is reported as being written.
    pub fn scan(&mut self) -> std::io::Result<bool> {
        self.scan_at(Instant::now())
    }

    /// [`Self::scan`] at `now`.
    ///
    /// With inotify, a scan looks only at the files named by events since the last one
    /// (and those still being written); the whole folder is listed at start, after a
    /// `..data` swap, and every [`FULL_RESCAN`] for what inotify does not report (the
    /// target of a symlink outside the folder changed). Without inotify every scan lists
    /// the folder.
    pub fn scan_at(&mut self, now: Instant) -> std::io::Result<bool> {
        self.observe_events(now);
        self.rearm_if_due(now);
        let full = !self.scanned
            || self.watch.is_none()
            || self.rescan_all
            || self
                .last_full
                .is_none_or(|at| now.saturating_duration_since(at) >= FULL_RESCAN);
        if full {
            self.full_scan(now)
        } else {
            Ok(self.targeted_scan(now))
        }
    }

    /// Lists the folder and looks at every manifest in it.
    fn full_scan(&mut self, now: Instant) -> std::io::Result<bool> {
        if self.watch.as_ref().is_some_and(|w| !w.watches_the_folder()) {
            // The folder was swapped for another one (renamed over, or its path is a
            // symlink that now points elsewhere): the watch sees the old one.
            self.lose_watch(now, "the config folder was replaced by another one");
            self.rearm_if_due(now);
        }
        let entries = std::fs::read_dir(&self.dir)?;
        self.dirty.clear();
        self.rescan_all = false;
        self.last_full = Some(now);
        // Every settled file is read again now and then, whatever its fingerprint says.
        let reread = self
            .last_content
            .is_none_or(|at| now.saturating_duration_since(at) >= CONTENT_RESCAN);
        if reread {
            self.last_content = Some(now);
        }
        let mut present = HashSet::new();
        let mut unsettled = BTreeSet::new();
        let mut changed = false;
        for entry in entries {
            let path = entry?.path();
            if !is_manifest_name(&path) {
                continue;
            }
            // One `stat` per file and scan (symlinks followed, e.g. a mounted ConfigMap).
            let meta = std::fs::metadata(&path);
            changed |= self.look_at(&path, meta, now, reread, &mut unsettled);
            self.gone.remove(&path);
            present.insert(path);
        }
        let missing: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains(*p))
            .cloned()
            .collect();
        for path in missing {
            changed |= self.entry_is_gone(path, now);
        }
        self.settling
            .retain(|p| present.contains(p) || self.files.contains_key(p));
        self.overdue.retain(|p| present.contains(p));
        changed |= unsettled != self.unsettled;
        self.unsettled = unsettled;
        self.scanned = true;
        Ok(changed)
    }

    /// The directory entry of `path` is gone at `now`: what it defined is deleted once it
    /// stayed gone for [`DELETE_GRACE`] (kept meanwhile). Returns whether it was deleted.
    fn entry_is_gone(&mut self, path: PathBuf, now: Instant) -> bool {
        let since = *self.gone.entry(path.clone()).or_insert(now);
        if self.files.contains_key(&path) && now.saturating_duration_since(since) < DELETE_GRACE {
            return false;
        }
        self.gone.remove(&path);
        self.settling.remove(&path);
        self.overdue.remove(&path);
        self.files.remove(&path).is_some()
    }

    /// Looks only at the files events named since the last scan, and those still being
    /// written.
    fn targeted_scan(&mut self, now: Instant) -> bool {
        let mut paths = std::mem::take(&mut self.dirty);
        paths.extend(self.unsettled.iter().cloned());
        paths.extend(self.gone.keys().cloned());
        // Every file still being written or gone for less than DELETE_GRACE is among
        // `paths`: looked at again.
        let mut unsettled = BTreeSet::new();
        let mut changed = false;
        for path in paths {
            let meta = std::fs::metadata(&path);
            // A dangling symlink, a special file or a directory is still an entry of the
            // folder (reported); only a gone entry is a deletion.
            if meta.is_ok() || !entry_gone(&path) {
                self.gone.remove(&path);
                changed |= self.look_at(&path, meta, now, false, &mut unsettled);
            } else {
                changed |= self.entry_is_gone(path, now);
            }
        }
        changed |= unsettled != self.unsettled;
        self.unsettled = unsettled;
        changed
    }

    /// Looks at one manifest of the folder (`meta`: its `stat`): reads it when its
    /// fingerprint changed (or `reread`, [`CONTENT_RESCAN`]) and it has settled, or adds
    /// it to `unsettled`. Returns whether its content or problem changed. An entry that is
    /// not a regular file is never opened: it is reported at once.
    fn look_at(
        &mut self,
        path: &Path,
        meta: std::io::Result<std::fs::Metadata>,
        now: Instant,
        reread: bool,
        unsettled: &mut BTreeSet<PathBuf>,
    ) -> bool {
        let read = match meta {
            Ok(meta) => {
                let fp = fingerprint(&meta);
                if let Some(problem) = not_a_regular_file(&meta) {
                    self.settling.remove(path);
                    return self.update(path.to_path_buf(), (Some(fp), Err(problem)));
                }
                let same = self
                    .files
                    .get(path)
                    .is_some_and(|f| f.fingerprint.as_ref() == Some(&fp));
                if same && !reread {
                    return false;
                }
                // A read again with the same fingerprint: nothing says a writer is at it
                // (one would have changed the times), unless its events do.
                let settled = if same {
                    !self.settling.uses_events() || self.settled(path, &fp, now)
                } else {
                    self.settled(path, &fp, now)
                };
                if !settled {
                    if !same {
                        unsettled.insert(path.to_path_buf());
                    }
                    return false;
                }
                let token = self.settling.before_read(path);
                let read = read_manifest(path, &meta);
                self.observe_events(now);
                if !self.overdue.contains(path) && !self.settling.unchanged_since(path, token) {
                    // Written while it was read: read again once settled.
                    unsettled.insert(path.to_path_buf());
                    return false;
                }
                self.settling.forget(path);
                self.overdue.remove(path);
                (Some(fp), read)
            }
            Err(e) => (None, Err(format!("cannot read the file: {e}"))),
        };
        self.update(path.to_path_buf(), read)
    }

    /// Records what reading `path` gave; returns whether its content or problem changed.
    fn update(
        &mut self,
        path: PathBuf,
        (fingerprint, read): (Option<Fingerprint>, Result<Vec<u8>, String>),
    ) -> bool {
        let state = self.files.entry(path.clone()).or_insert(FileState {
            fingerprint: None,
            digest: None,
            bytes: None,
            parsed: Vec::new(),
            error: None,
        });
        state.fingerprint = fingerprint;
        let read = read.and_then(|bytes| {
            let hash = bytes_hash(&bytes);
            if state.bytes == Some(hash) {
                // The bytes of the last good parse: nothing to parse again.
                return Ok(None);
            }
            let docs = documents(bytes)?;
            state.bytes = Some(hash);
            Ok(Some(docs))
        });
        match read {
            Ok(None) => state.error.take().is_some(),
            Ok(Some(docs)) => {
                let digest = digest(&docs);
                let same = state.digest == Some(digest);
                let changed = !same || state.error.is_some();
                if !same {
                    state.parsed = docs.iter().map(parse).collect();
                    state.digest = Some(digest);
                }
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
    /// A file still being written is reported as such.
    pub fn file_errors(&self) -> BTreeMap<PathBuf, String> {
        let mut errors: BTreeMap<PathBuf, String> = self
            .files
            .iter()
            .filter_map(|(p, f)| Some((p.clone(), f.error.clone()?)))
            .collect();
        for path in &self.unsettled {
            let what = if self.files.contains_key(path) {
                "its last good content is used until its writer closes it"
            } else {
                "it is read once its writer closes it"
            };
            errors.insert(path.clone(), format!("being written: {what}"));
        }
        errors
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
                Parsed::Config(ec) => {
                    if out.file_errors.contains_key(path) {
                        out.files
                            .entry(key_of(ec))
                            .or_insert_with(|| path.to_path_buf());
                    }
                    out.configs.push(ec.clone());
                }
                Parsed::InvalidConfig { key, error } => {
                    out.errors
                        .push(format!("{}: EnvoyConfig: {error}", path.display()));
                    if let Some(key) = key {
                        if out.file_errors.contains_key(path) {
                            out.files
                                .entry(key.clone())
                                .or_insert_with(|| path.to_path_buf());
                        }
                        out.invalid_configs
                            .entry(key.clone())
                            .or_insert_with(|| format!("invalid EnvoyConfig: {error}"));
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
    /// The file each EnvoyConfig (valid or not) is defined in, for the files that cannot
    /// be used now (those of [`Self::file_errors`]; it is only needed to report them).
    pub files: BTreeMap<Key, PathBuf>,
    /// Files that cannot be used now (their last good content is), with why.
    pub file_errors: BTreeMap<PathBuf, String>,
}

/// A digest of a file's documents: equal for the same documents, whatever the file's
/// formatting or comments (then nothing is parsed again or re-published).
fn digest(docs: &[Value]) -> u64 {
    use std::hash::Hasher as _;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for doc in docs {
        // A `Value` serialises the same way each time (its maps are sorted).
        h.write(doc.to_string().as_bytes());
        h.write_u8(0);
    }
    h.finish()
}

/// A hash of a file's bytes.
fn bytes_hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher as _;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// Reads one manifest file (`meta` is its `stat`, symlinks followed), or why it cannot be
/// used: only a regular file of at most [`MAX_FILE_BYTES`] (the API server's object size
/// limit) is read ([`read_regular_file`]).
fn read_manifest(path: &Path, meta: &std::fs::Metadata) -> Result<Vec<u8>, String> {
    if let Some(problem) = not_a_regular_file(meta) {
        return Err(problem);
    }
    marin3r_fsread::read_regular_file(path, MAX_FILE_BYTES).map_err(|e| match e {
        marin3r_fsread::Error::TooLarge { .. } => {
            format!("{} (the API server's object size limit)", e.reason())
        }
        e => e.reason(),
    })
}

/// The documents of a file's bytes, or why they cannot be used.
fn documents(bytes: Vec<u8>) -> Result<Vec<Value>, String> {
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("cannot read the file: it is not UTF-8 text ({e})"))?;
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
        // The same documents written differently: nothing changed, nothing parsed.
        write(
            &dir.path().join("b.yaml"),
            &format!("# a comment\n{}", ec("b", 2)),
        );
        assert!(!source.scan().unwrap());
        assert!(Arc::ptr_eq(&after[1], &source.manifests().configs[1]));
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
        // Only a file whose directory entry is gone (for DELETE_GRACE) is deleted.
        std::fs::remove_file(&file).unwrap();
        let t = Instant::now();
        assert!(!source.scan_at(t).unwrap());
        assert_eq!(names(&source), ["kuard"], "gone for less than the grace");
        assert!(source.scan_at(t + DELETE_GRACE).unwrap());
        assert!(names(&source).is_empty());
    }

    /// How many resources the EnvoyConfig read from the folder has.
    fn resources(source: &LocalSource) -> Vec<usize> {
        source
            .manifests()
            .configs
            .iter()
            .map(|c| c.spec.resources.as_ref().map_or(0, Vec::len))
            .collect()
    }

    fn two_listeners(name: &str) -> String {
        format!(
            "{}  - type: listener\n    value: {{name: l2, port: 2}}\n",
            ec(name, 1)
        )
    }

    #[test]
    fn a_file_is_read_only_once_its_writer_closes_it() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        let three = format!(
            "{}  - type: listener\n    value: {{name: l3, port: 3}}\n",
            two_listeners("a")
        );
        write(&file, &three);
        let mut source = LocalSource::new(dir.path());
        assert!(source.scan().unwrap());
        assert_eq!(resources(&source), [3]);

        // A writer rewrites the file and pauses after the first listener.
        let full = two_listeners("a");
        let (half, rest) = full.split_at(ec("a", 1).len());
        let mut writer = std::fs::File::create(&file).unwrap();
        writer.write_all(half.as_bytes()).unwrap();
        writer.flush().unwrap();
        assert!(source.scan().unwrap(), "being written is reported");
        assert_eq!(resources(&source), [3], "the half file is not used");
        assert!(source.file_errors()[&file].starts_with("being written"));
        assert!(
            !source.scan().unwrap(),
            "nothing new while the writer pauses"
        );
        assert_eq!(resources(&source), [3]);

        writer.write_all(rest.as_bytes()).unwrap();
        drop(writer);
        assert!(source.scan().unwrap());
        assert_eq!(resources(&source), [2]);
        assert!(source.file_errors().is_empty());

        // A new file being written is not read either.
        let mut writer = std::fs::File::create(dir.path().join("b.yaml")).unwrap();
        writer.write_all(ec("b", 1).as_bytes()).unwrap();
        assert!(source.scan().unwrap());
        assert_eq!(names(&source), ["a"]);
        drop(writer);
        assert!(source.scan().unwrap());
        assert_eq!(names(&source), ["a", "b"]);
    }

    #[test]
    fn a_file_held_open_for_too_long_is_read_as_it_is() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        write(&file, &two_listeners("a"));
        let mut source = LocalSource::new(dir.path());
        let t0 = Instant::now();
        assert!(source.scan_at(t0).unwrap());
        let mut writer = std::fs::File::create(&file).unwrap();
        writer.write_all(ec("a", 1).as_bytes()).unwrap();
        assert!(source.scan_at(t0).unwrap());
        assert_eq!(resources(&source), [2]);
        let later = t0 + super::super::settle::MAX_SETTLE + std::time::Duration::from_secs(1);
        assert!(source.scan_at(later).unwrap());
        assert_eq!(resources(&source), [1], "read although still open");
        assert!(source.file_errors().is_empty());
        drop(writer);
    }

    #[test]
    fn between_full_rescans_only_the_files_events_name_are_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("b.yaml");
        write(&target, &ec("b", 1));
        std::os::unix::fs::symlink(&target, dir.path().join("b.yaml")).unwrap();
        write(&dir.path().join("a.yaml"), &two_listeners("a"));
        let mut source = LocalSource::new(dir.path());
        let t0 = Instant::now();
        assert!(source.scan_at(t0).unwrap());
        assert_eq!(resources(&source), [2, 1]);
        let soon = t0 + std::time::Duration::from_millis(100);

        // An edit and a deletion in the folder are seen at once.
        write(&dir.path().join("a.yaml"), &ec("a", 1));
        assert!(source.scan_at(soon).unwrap());
        assert_eq!(resources(&source), [1, 1]);

        // The target of a symlink outside the folder changes without an event in it:
        // found by the next full rescan only.
        write(&target, &two_listeners("b"));
        assert!(!source.scan_at(soon).unwrap(), "not listed between rescans");
        assert_eq!(resources(&source), [1, 1]);
        assert!(source.scan_at(t0 + FULL_RESCAN).unwrap());
        assert_eq!(resources(&source), [1, 2]);

        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let soon = t0 + FULL_RESCAN + std::time::Duration::from_millis(100);
        assert!(
            !source.scan_at(soon).unwrap(),
            "gone for less than the grace"
        );
        assert!(source.scan_at(soon + DELETE_GRACE).unwrap());
        assert_eq!(names(&source), ["b"]);
    }

    #[test]
    fn a_configmap_data_swap_is_seen_at_once() {
        // The kubelet's atomic writer: `a.yaml -> ..data/a.yaml`, `..data -> ..v1`, and an
        // update writes `..v2`, then renames a new `..data_tmp -> ..v2` over `..data`.
        let dir = tempfile::tempdir().unwrap();
        let version = |v: &str, text: &str| {
            std::fs::create_dir(dir.path().join(v)).unwrap();
            std::fs::write(dir.path().join(v).join("a.yaml"), text).unwrap();
        };
        version("..v1", &two_listeners("a"));
        std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.yaml", dir.path().join("a.yaml")).unwrap();
        let mut source = LocalSource::new(dir.path());
        let t0 = Instant::now();
        assert!(source.scan_at(t0).unwrap());
        assert_eq!(resources(&source), [2]);
        version("..v2", &ec("a", 1));
        std::os::unix::fs::symlink("..v2", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        let soon = t0 + std::time::Duration::from_millis(100);
        assert!(source.scan_at(soon).unwrap());
        assert_eq!(resources(&source), [1]);
    }

    /// One kind of folder entry named `kuard.yaml` that is not a usable file, made in
    /// place of `file`; `None` when it cannot be made here.
    fn make_special(kind: &str, file: &Path, dir: &Path) -> Option<String> {
        let expect = match kind {
            "FIFO" => {
                let made = std::process::Command::new("mkfifo").arg(file).status();
                if !made.is_ok_and(|s| s.success()) {
                    return None;
                }
                "named pipe (FIFO)"
            }
            "/dev/zero symlink" => {
                std::os::unix::fs::symlink("/dev/zero", file).unwrap();
                "character device"
            }
            "dangling symlink" => {
                std::os::unix::fs::symlink(dir.join("nowhere.yaml"), file).unwrap();
                "No such file"
            }
            "symlink loop" => {
                std::os::unix::fs::symlink(file, file).unwrap();
                "symbolic links"
            }
            "directory" => {
                std::fs::create_dir(file).unwrap();
                "directory"
            }
            "socket" => {
                // The listener is closed at once; the socket file stays.
                std::os::unix::net::UnixListener::bind(file).unwrap();
                "socket"
            }
            "unreadable" => {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::write(file, ec("kuard", 9)).unwrap();
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o000)).unwrap();
                if std::fs::File::open(file).is_ok() {
                    // Running as root (as in CI): permissions do not stop a read.
                    std::fs::remove_file(file).unwrap();
                    return None;
                }
                "Permission denied"
            }
            _ => return Some(String::new()),
        };
        Some(expect.to_string())
    }

    fn unmake(file: &Path) {
        match std::fs::symlink_metadata(file) {
            Ok(m) if m.is_dir() => std::fs::remove_dir(file).unwrap(),
            Ok(_) => std::fs::remove_file(file).unwrap(),
            Err(_) => {}
        }
    }

    /// The class "special files": over every kind of entry that is not a usable regular
    /// file, present at start or replacing a served file: the scan finishes (a FIFO never
    /// blocks it, /dev/zero is never read), the entry is reported, the last good content
    /// is kept and nothing is deleted, however long it stays. (Permissions are skipped
    /// when running as root.)
    #[test]
    fn special_files_never_block_the_scan_are_reported_and_never_delete() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            special_files_cases();
            let _ = done.send(());
        });
        // A liveness guard, not a timing assertion: without the fix the FIFO blocks the
        // scan for ever.
        finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the scan finished");
    }

    fn special_files_cases() {
        let kinds = [
            "FIFO",
            "/dev/zero symlink",
            "dangling symlink",
            "symlink loop",
            "directory",
            "socket",
            "unreadable",
            "regular",
        ];
        for kind in kinds {
            // At start, beside a good file.
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("kuard.yaml");
            write(&dir.path().join("other.yaml"), &ec("other", 1));
            let Some(expect) = make_special(kind, &file, dir.path()) else {
                continue;
            };
            if kind == "regular" {
                write(&file, &ec("kuard", 1));
            }
            for watched in [true, false] {
                let mut source = if watched {
                    LocalSource::new(dir.path())
                } else {
                    LocalSource::without_watch(dir.path())
                };
                let t0 = Instant::now();
                assert!(source.scan_at(t0).unwrap(), "{kind}: at start");
                let errors = source.file_errors();
                if kind == "regular" {
                    assert!(errors.is_empty(), "{errors:?}");
                    assert_eq!(names(&source), ["kuard", "other"]);
                } else {
                    assert!(errors[&file].contains(&expect), "{kind}: {errors:?}");
                    assert_eq!(names(&source), ["other"], "{kind}");
                }
            }
            unmake(&file);

            // Replacing a served file (in two steps: the entry is gone for a moment).
            write(&file, &ec("kuard", 1));
            for watched in [true, false] {
                let mut source = if watched {
                    LocalSource::new(dir.path())
                } else {
                    LocalSource::without_watch(dir.path())
                };
                let t0 = Instant::now();
                assert!(source.scan_at(t0).unwrap());
                assert_eq!(names(&source), ["kuard", "other"]);
                std::fs::remove_file(&file).unwrap();
                let t1 = t0 + std::time::Duration::from_millis(10);
                assert!(!source.scan_at(t1).unwrap(), "{kind}: not deleted at once");
                make_special(kind, &file, dir.path());
                if kind == "regular" {
                    write(&file, &ec("kuard", 1));
                }
                let mut at = t1;
                for step in 0..4 {
                    // Long past every grace and settling time, and a full rescan each.
                    at += FULL_RESCAN + DELETE_GRACE + super::super::settle::QUIET;
                    source.scan_at(at).unwrap();
                    assert_eq!(
                        names(&source),
                        ["kuard", "other"],
                        "{kind}, watched {watched}, step {step}: last good content kept"
                    );
                    assert_eq!(resources(&source), [1, 1], "{kind}");
                    let errors = source.file_errors();
                    if kind == "regular" {
                        // (Without inotify, read once unchanged for QUIET: one scan later.)
                        assert!(step == 0 || errors.is_empty(), "{errors:?}");
                    } else {
                        assert!(errors[&file].contains(&expect), "{kind}: {errors:?}");
                        let manifests = source.manifests();
                        assert_eq!(
                            manifests.files[&("default".to_string(), "kuard".to_string())],
                            file,
                            "{kind}: reported on its EnvoyConfig"
                        );
                    }
                }
                unmake(&file);
                write(&file, &two_listeners("kuard"));
                at += FULL_RESCAN + super::super::settle::QUIET;
                source.scan_at(at).unwrap();
                at += super::super::settle::QUIET;
                source.scan_at(at).unwrap();
                assert_eq!(resources(&source), [2, 1], "{kind}: fixed, read again");
                assert!(source.file_errors().is_empty(), "{kind}");
                write(&file, &ec("kuard", 1));
            }
        }
    }

    /// The port of the first listener of the first EnvoyConfig read.
    fn port(source: &LocalSource) -> Option<u64> {
        let configs = source.manifests().configs;
        let resources = configs.first()?.spec.resources.clone()?;
        resources.first()?.value.as_ref()?["port"].as_u64()
    }

    /// Rewrites `path` in place with `text` and puts its modification time back, as
    /// `cp -p` over it does.
    fn rewrite_keeping_mtime(path: &Path, text: &str) {
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }

    #[test]
    fn a_same_size_rewrite_that_keeps_the_mtime_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        write(&file, &ec("a", 1));
        for watched in [true, false] {
            let mut source = if watched {
                LocalSource::new(dir.path())
            } else {
                LocalSource::without_watch(dir.path())
            };
            let t0 = Instant::now();
            source.scan_at(t0).unwrap();
            let before = port(&source);
            let other = if before == Some(1) { 2 } else { 1 };
            rewrite_keeping_mtime(&file, &ec("a", other));
            // Full rescans (not the content rescan) and past the quiet time.
            let mut at = t0;
            for _ in 0..2 {
                at += FULL_RESCAN + super::super::settle::QUIET;
                source.scan_at(at).unwrap();
            }
            assert!(at < t0 + CONTENT_RESCAN);
            assert_eq!(port(&source), Some(other.into()), "watched {watched}");
        }
    }

    #[test]
    fn the_content_rescan_finds_a_rewrite_no_stat_field_shows() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        write(&file, &ec("a", 1));
        let mut source = LocalSource::new(dir.path());
        let t0 = Instant::now();
        source.scan_at(t0).unwrap();
        rewrite_keeping_mtime(&file, &ec("a", 2));
        // A file system whose stat did not move (coarse or frozen times): the recorded
        // fingerprint is the new one.
        let fp = fingerprint(&std::fs::metadata(&file).unwrap());
        source.files.get_mut(&file).unwrap().fingerprint = Some(fp);
        source.scan_at(t0 + FULL_RESCAN).unwrap();
        assert_eq!(resources(&source), [1]);
        assert_eq!(
            port(&source),
            Some(1),
            "the full rescan trusts the fingerprint"
        );
        assert!(source.scan_at(t0 + CONTENT_RESCAN).unwrap());
        assert_eq!(port(&source), Some(2), "the content rescan reads it");
        // Unchanged bytes are not parsed again.
        let parsed = source.manifests().configs[0].clone();
        assert!(!source.scan_at(t0 + CONTENT_RESCAN * 2).unwrap());
        assert!(Arc::ptr_eq(&parsed, &source.manifests().configs[0]));
    }

    #[test]
    fn after_the_folder_is_swapped_edits_are_events_again() {
        // Three swaps: renamed away and deleted; renamed away and kept; a symlink to the
        // folder pointed at another one (what Kubernetes does with `..data`).
        for swap in ["mv and rm", "mv", "symlink"] {
            let parent = tempfile::tempdir().unwrap();
            let dir = parent.path().join("config");
            let first = parent.path().join("v1");
            std::fs::create_dir(&first).unwrap();
            write(&first.join("a.yaml"), &ec("a", 1));
            if swap == "symlink" {
                std::os::unix::fs::symlink(&first, &dir).unwrap();
            } else {
                std::fs::rename(&first, &dir).unwrap();
            }
            let mut source = LocalSource::new(&dir);
            let t0 = Instant::now();
            assert!(source.scan_at(t0).unwrap());
            let generation = source.watch_generation();
            assert!(source.watching());

            let second = parent.path().join("v2");
            std::fs::create_dir(&second).unwrap();
            write(&second.join("a.yaml"), &two_listeners("a"));
            match swap {
                "symlink" => {
                    let tmp = parent.path().join("config.tmp");
                    std::os::unix::fs::symlink(&second, &tmp).unwrap();
                    std::fs::rename(&tmp, &dir).unwrap();
                }
                _ => {
                    std::fs::rename(&dir, parent.path().join("config.old")).unwrap();
                    std::fs::rename(&second, &dir).unwrap();
                    if swap == "mv and rm" {
                        std::fs::remove_dir_all(parent.path().join("config.old")).unwrap();
                    }
                }
            }
            // Seen by the next full rescan at the latest (the symlink swap has no event).
            let mut at = t0 + FULL_RESCAN;
            source.scan_at(at).unwrap();
            assert!(source.watching(), "{swap}: watched again");
            assert!(source.watch_generation() > generation, "{swap}");
            // A file not seen closed since is read once quiet.
            at += super::super::settle::QUIET;
            source.scan_at(at).unwrap();
            assert_eq!(resources(&source), [2], "{swap}");

            // An edit in the new folder is an event again: seen before any full rescan.
            write(&dir.join("a.yaml"), &ec("a", 1));
            at += std::time::Duration::from_millis(10);
            assert!(source.scan_at(at).unwrap(), "{swap}");
            assert_eq!(resources(&source), [1], "{swap}: event-driven");
        }
    }

    #[test]
    fn after_an_inotify_overflow_edits_are_events_again_and_a_half_file_waits() {
        use std::io::Write as _;
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(16_384);
        if max > 200_000 {
            return; // too many events to overflow it quickly
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        write(&file, &two_listeners("a"));
        let mut source = LocalSource::new(dir.path());
        let t0 = Instant::now();
        assert!(source.scan_at(t0).unwrap());
        // Flood the queue: every event after the limit is lost, a writer's included.
        let noise = dir.path().join("noise");
        for _ in 0..=max / 2 {
            std::fs::write(&noise, "x").unwrap();
            std::fs::remove_file(&noise).unwrap();
        }
        let full = two_listeners("a");
        let (half, _) = full.split_at(ec("a", 1).len());
        let mut writer = std::fs::File::create(&file).unwrap();
        writer.write_all(half.as_bytes()).unwrap();
        writer.flush().unwrap();
        let at = t0 + std::time::Duration::from_millis(10);
        source.scan_at(at).unwrap();
        assert!(source.watching(), "the watch is kept");
        assert_eq!(resources(&source), [2], "the half file is not read");
        // The writer is done (its half of two listeners is a whole one-listener file).
        drop(writer);
        // Its close is an event again: read at once.
        let at = at + std::time::Duration::from_millis(10);
        source.scan_at(at).unwrap();
        assert!(
            source.file_errors().is_empty(),
            "{:?}",
            source.file_errors()
        );
        assert_eq!(resources(&source), [1]);
    }

    #[test]
    fn without_inotify_a_file_is_read_once_unchanged_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        write(&file, &two_listeners("a"));
        let mut source = LocalSource::without_watch(dir.path());
        let t0 = Instant::now();
        assert!(
            source.scan_at(t0).unwrap(),
            "the first scan reads every file"
        );
        assert_eq!(resources(&source), [2]);
        write(&file, &ec("a", 1));
        assert!(source.scan_at(t0).unwrap());
        assert_eq!(resources(&source), [2], "just changed");
        let quiet = t0 + super::super::settle::QUIET;
        assert!(source.scan_at(quiet).unwrap());
        assert_eq!(resources(&source), [1]);
        assert!(source.file_errors().is_empty());
    }
}
