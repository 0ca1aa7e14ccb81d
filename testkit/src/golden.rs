//! Golden files: a test compares what it produced with a checked-in file, and
//! `UPDATE_GOLDEN=1` rewrites the files instead. The one runner of the webhook's injection
//! cases, the operator's render cases and `marin3r status`' tables.

#![allow(clippy::panic)]

use std::path::{Path, PathBuf};

/// Whether this run rewrites the golden files (`UPDATE_GOLDEN` is set).
pub fn updating() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some()
}

/// The case folders directly below `dir`, sorted by name.
///
/// # Panics
/// When `dir` cannot be read.
pub fn cases(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read the golden cases in {}: {e}", dir.display()));
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Compares `actual` with the golden file `path` as text (a missing file reads as
/// empty), or with `UPDATE_GOLDEN=1` writes `actual` there. The error names the file and
/// shows both texts.
pub fn check(path: &Path, actual: &str) -> Result<(), String> {
    check_by(path, actual, |got, want| got == want)
}

/// [`check`] with `same` deciding whether the produced text and the file's text agree
/// (e.g. equal once parsed as YAML).
pub fn check_by(
    path: &Path,
    actual: &str,
    same: impl FnOnce(&str, &str) -> bool,
) -> Result<(), String> {
    if updating() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        return std::fs::write(path, actual)
            .map_err(|e| format!("cannot write {}: {e}", path.display()));
    }
    let (want, missing) = match std::fs::read_to_string(path) {
        Ok(text) => (text, ""),
        Err(_) => (String::new(), " (missing)"),
    };
    if same(actual, &want) {
        return Ok(());
    }
    Err(format!(
        "{}{missing} differs (UPDATE_GOLDEN=1 rewrites it)\n got:\n{actual}\nwant:\n{want}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_differing_or_missing_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("golden-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.txt");
        std::fs::write(&file, "one\n").unwrap();
        assert_eq!(check(&file, "one\n"), Ok(()));
        let e = check(&file, "two\n").unwrap_err();
        assert!(
            e.contains("a.txt differs") && e.contains("two") && e.contains("one"),
            "{e}"
        );
        let e = check(&dir.join("b.txt"), "x").unwrap_err();
        assert!(e.contains("b.txt (missing) differs"), "{e}");
        assert_eq!(
            check_by(&file, "ONE\n", |g, w| g.to_lowercase() == w),
            Ok(())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
