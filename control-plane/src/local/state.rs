//! The `--state-dir` file format of local mode: one JSON file per EnvoyConfig, replaced
//! atomically, so revisions (taints, rollbacks, `RollbackFailed` with its last good
//! snapshot) survive a restart.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::folder::Key;
use crate::revisions::Revisions;
use marin3r_envoyconfig::envoyconfig::EnvoyConfigSpec;

/// The file format of `--state-dir` (one file per EnvoyConfig).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateFile {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub served: Option<String>,
    #[serde(default)]
    pub served_spec: Option<std::sync::Arc<EnvoyConfigSpec>>,
    pub revisions: Revisions,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateFileRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub served: Option<&'a str>,
    pub served_spec: Option<&'a EnvoyConfigSpec>,
    pub revisions: &'a Revisions,
}

/// `namespace_name.json`, every byte outside `[A-Za-z0-9.-]` written as `%XX`, so any
/// name maps to one safe file name and back.
pub fn state_file_name(key: &Key) -> String {
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

/// The second copy of a state file: `.<name>.prev`, hidden (never loaded as a state file
/// of its own), used when the file itself does not parse. It holds the same state as the
/// file (written just before it, [`write_atomic`]); it is older only after a crash
/// between the two writes.
pub fn previous_of(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{}.prev", name.unwrap_or_default()))
}

/// Writes the state to `path` and to its [second copy](previous_of), the copy first, each
/// replaced atomically ([`replace`]), so a corrupt state file (a bad disk, a hand edit)
/// loses nothing: the copy holds the same revisions and taints. (A copy one change
/// behind, the previous generation, lost exactly that change when it was a taint: the
/// known-bad revision was published again after the restart.)
pub fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    replace(&previous_of(path), contents)?;
    replace(path, contents)
}

/// Replaces `path` atomically: a hidden temp file in the same folder (mode 0600: specs
/// may hold inline key material), synced, renamed (`path` itself always exists).
fn replace(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
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

/// Reads every state file of `dir` (creating it): the parsed ones, and one error line
/// per file that does not parse (logged by the caller and ignored).
pub fn load(dir: &Path) -> std::io::Result<(Vec<StateFile>, Vec<String>)> {
    std::fs::create_dir_all(dir)?;
    let mut states = Vec::new();
    let mut errors = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let visible = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"));
        if !visible {
            continue;
        }
        match read(&path) {
            Ok(state) => states.push(state),
            Err(e) => match read(&previous_of(&path)) {
                Ok(state) => {
                    errors.push(format!("{}: {e}; using its copy", path.display()));
                    states.push(state);
                }
                Err(_) => errors.push(format!("{}: {e}", path.display())),
            },
        }
    }
    Ok((states, errors))
}

/// Largest state file read: ten revisions of EnvoyConfigs at the API server's object size
/// limit, and the served spec, fit several times over.
pub const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;

fn read(path: &Path) -> Result<StateFile, String> {
    // Only a regular file, bounded, never blocking (the folder's rule).
    let bytes = super::folder::read_regular_file(path, MAX_STATE_BYTES)?;
    serde_json::from_slice::<StateFile>(&bytes).map_err(|e| e.to_string())
}

/// The state file of an EnvoyConfig under `dir`.
pub fn path_of(dir: &Path, key: &Key) -> PathBuf {
    dir.join(state_file_name(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(revisions: usize) -> String {
        let mut r = Revisions::new("kuard");
        for i in 0..revisions {
            let spec = serde_json::from_value(serde_json::json!({
                "nodeID": "kuard",
                "resources": [{"type": "listener", "value": {"name": "l", "port": i}}]
            }))
            .unwrap();
            r.apply(&spec, std::time::SystemTime::UNIX_EPOCH);
        }
        serde_json::to_string(&StateFileRef {
            namespace: "default",
            name: "kuard",
            served: None,
            served_spec: None,
            revisions: &r,
        })
        .unwrap()
    }

    #[test]
    fn a_corrupt_state_file_falls_back_to_its_copy_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_of(dir.path(), &("default".to_string(), "kuard".to_string()));
        write_atomic(&path, &state(1)).unwrap();
        write_atomic(&path, &state(2)).unwrap();
        let (states, errors) = load(dir.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(states[0].revisions.revisions.len(), 2);
        for corrupt in ["", "{", "{}", "\u{0}garbage"] {
            std::fs::write(&path, corrupt).unwrap();
            let (states, errors) = load(dir.path()).unwrap();
            assert_eq!(states.len(), 1, "{corrupt:?}: the copy is used");
            assert_eq!(
                states[0].revisions.revisions.len(),
                2,
                "{corrupt:?}: the copy holds the latest state (the last change is often a taint)"
            );
            assert!(errors[0].contains("using its copy"), "{errors:?}");
        }
        // Nothing but hidden files besides the state file itself.
        let visible: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        assert_eq!(visible, ["default_kuard.json"]);
    }

    /// The class "special files" through the state reader: each kind named like a state
    /// file is reported at once (a FIFO never blocks the load, `/dev/zero` and a huge
    /// sparse file are never read) and the good state files still load.
    #[test]
    fn special_files_in_the_state_dir_never_block_the_load() {
        use marin3r_testkit::special_files::Special;
        for kind in Special::ALL {
            let dir = tempfile::tempdir().unwrap();
            kind.make(&dir.path().join("default_special.json"));
            let path = path_of(dir.path(), &("default".to_string(), "kuard".to_string()));
            write_atomic(&path, &state(1)).unwrap();
            let (done, loaded) = std::sync::mpsc::channel();
            let state_dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let _ = done.send(load(&state_dir).unwrap());
            });
            // A liveness guard, not a timing assertion: without the rule the open blocks.
            let (states, errors) = loaded
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{kind:?}: the load blocked"));
            assert_eq!(states.len(), 1, "{kind:?}");
            assert_eq!(errors.len(), 1, "{kind:?}: {errors:?}");
            assert!(
                errors[0].contains(kind.expected_error()),
                "{kind:?}: {errors:?}"
            );
        }
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
