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
/// reported and its last good content kept; it is never read into memory.
pub const MAX_FILE_BYTES: u64 = 3 * 512 * 1024;

/// With inotify, how often the whole folder is listed anyway, for the changes it does not
/// report (the target of a symlink outside the folder). Between two such scans only the
/// files named by events are looked at, so an edit costs the same beside 1,000 other
/// files as alone.
pub const FULL_RESCAN: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
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
        inode: m.ino(),
    }
}

#[derive(Debug)]
struct FileState {
    /// `None` while the entry cannot be stat'ed (a dangling symlink, a loop).
    fingerprint: Option<Fingerprint>,
    /// [`digest`] of the documents of the last successful parse (the documents are not
    /// kept: their tree is ten times the file's size).
    digest: Option<u64>,
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
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config folder with inotify; a changed file is read once unchanged for {} ms instead", super::settle::QUIET.as_millis());
                None
            }
        };
        Self::with_watch(dir, watch)
    }

    /// Reads `dir` without inotify: a changed file is read once unchanged for
    /// [`super::settle::QUIET`].
    pub fn without_watch(dir: impl Into<PathBuf>) -> Self {
        Self::with_watch(dir.into(), None)
    }

    fn with_watch(dir: PathBuf, watch: Option<Watch>) -> Self {
        Self {
            dir,
            files: BTreeMap::new(),
            settling: Settling::new(watch.is_some()),
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

    /// Takes the events queued since the last call: write events feed the settling, and
    /// the manifests they name are looked at again by the next scan.
    fn observe_events(&mut self, now: Instant) {
        let Some(watch) = &mut self.watch else { return };
        for event in watch.drain() {
            let path = match &event {
                Event::Written(p) | Event::Done(p) | Event::Touched(p) => p,
                Event::Overflow => {
                    tracing::warn!(dir = %self.dir.display(), "lost track of the config folder's writers (inotify queue overflow or watch removed); from now on a changed file is read once unchanged for {} ms", super::settle::QUIET.as_millis());
                    self.watch = None;
                    self.settling.observe(event, now);
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
        let entries = std::fs::read_dir(&self.dir)?;
        self.dirty.clear();
        self.rescan_all = false;
        self.last_full = Some(now);
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
            if meta.as_ref().is_ok_and(std::fs::Metadata::is_dir) {
                continue;
            }
            changed |= self.look_at(&path, meta, now, &mut unsettled);
            present.insert(path);
        }
        let before = self.files.len();
        self.files.retain(|p, _| present.contains(p));
        self.settling.retain(|p| present.contains(p));
        self.overdue.retain(|p| present.contains(p));
        changed |= unsettled != self.unsettled;
        self.unsettled = unsettled;
        self.scanned = true;
        Ok(changed || self.files.len() != before)
    }

    /// Looks only at the files events named since the last scan, and those still being
    /// written.
    fn targeted_scan(&mut self, now: Instant) -> bool {
        let mut paths = std::mem::take(&mut self.dirty);
        paths.extend(self.unsettled.iter().cloned());
        // Every file still being written is among `paths`: looked at again.
        let mut unsettled = BTreeSet::new();
        let mut changed = false;
        for path in paths {
            let meta = std::fs::metadata(&path);
            let present = match &meta {
                Ok(meta) => !meta.is_dir(),
                // A dangling symlink is still an entry of the folder (reported).
                Err(_) => std::fs::symlink_metadata(&path).is_ok(),
            };
            if present {
                changed |= self.look_at(&path, meta, now, &mut unsettled);
            } else {
                changed |= self.files.remove(&path).is_some();
                self.settling.remove(&path);
                self.overdue.remove(&path);
            }
        }
        changed |= unsettled != self.unsettled;
        self.unsettled = unsettled;
        changed
    }

    /// Looks at one manifest of the folder (`meta`: its `stat`): reads it when its
    /// fingerprint changed and it has settled, or adds it to `unsettled`. Returns whether
    /// its content or problem changed.
    fn look_at(
        &mut self,
        path: &Path,
        meta: std::io::Result<std::fs::Metadata>,
        now: Instant,
        unsettled: &mut BTreeSet<PathBuf>,
    ) -> bool {
        let read = match meta {
            Ok(meta) => {
                let fp = fingerprint(&meta);
                if self
                    .files
                    .get(path)
                    .is_some_and(|f| f.fingerprint.as_ref() == Some(&fp))
                {
                    return false;
                }
                if !self.settled(path, &fp, now) {
                    unsettled.insert(path.to_path_buf());
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
        (fingerprint, read): (Option<Fingerprint>, Result<Vec<Value>, String>),
    ) -> bool {
        let state = self.files.entry(path.clone()).or_insert(FileState {
            fingerprint: None,
            digest: None,
            parsed: Vec::new(),
            error: None,
        });
        state.fingerprint = fingerprint;
        match read {
            Ok(docs) => {
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
        // Only a file whose directory entry is gone is deleted.
        std::fs::remove_file(&file).unwrap();
        assert!(source.scan().unwrap());
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
        assert!(source.scan_at(soon).unwrap());
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
