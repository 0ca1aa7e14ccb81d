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
    pub served_spec: Option<EnvoyConfigSpec>,
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

/// Replaces `path` atomically: a hidden temp file in the same folder (mode 0600: specs
/// may hold inline key material), synced, renamed.
pub fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
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
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<StateFile>(&t).map_err(|e| e.to_string()));
        match parsed {
            Ok(state) => states.push(state),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    Ok((states, errors))
}

/// The state file of an EnvoyConfig under `dir`.
pub fn path_of(dir: &Path, key: &Key) -> PathBuf {
    dir.join(state_file_name(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_names_are_safe_and_unambiguous() {
        let name = |ns: &str, n: &str| state_file_name(&(ns.to_string(), n.to_string()));
        assert_eq!(name("default", "kuard.v1"), "default_kuard.v1.json");
        assert_eq!(name("a_b", "c"), "a%5Fb_c.json");
        assert_eq!(name("a", "b_c"), "a_b%5Fc.json");
        assert_eq!(name("x", "../../etc"), "x_..%2F..%2Fetc.json");
    }
}
