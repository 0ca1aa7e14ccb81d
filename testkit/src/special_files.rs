//! Every kind of path that is not a usable regular file, made on demand: the class the
//! one file reader (`marin3r-fsread`) refuses. Tests run each kind through every reader,
//! at start and while running.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;

/// A kind of entry put where a file is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// A named pipe nobody writes to: a blocking open never returns.
    Fifo,
    /// A symlink to `/dev/zero`: a character device that never ends.
    DevZero,
    /// A Unix socket file (its listener closed).
    Socket,
    /// A symlink to nothing.
    DanglingSymlink,
    /// A directory.
    Directory,
    /// A sparse regular file of 2 GiB: over every reader's limit, never to be read.
    Huge,
}

impl Special {
    /// Every kind.
    pub const ALL: [Special; 6] = [
        Special::Fifo,
        Special::DevZero,
        Special::Socket,
        Special::DanglingSymlink,
        Special::Directory,
        Special::Huge,
    ];

    /// What a reader's error says about this kind (a substring of it).
    pub fn expected_error(self) -> &'static str {
        match self {
            Special::Fifo => "a named pipe (FIFO)",
            Special::DevZero => "a character device",
            // open(2) of a socket: ENXIO.
            Special::Socket => "No such device or address",
            Special::DanglingSymlink => "No such file or directory",
            Special::Directory => "a directory",
            Special::Huge => "-byte limit",
        }
    }

    /// Replaces whatever is at `path` with an entry of this kind (panics if it cannot:
    /// a test that cannot make its input must fail, not pass).
    pub fn make(self, path: &Path) {
        remove(path);
        match self {
            Special::Fifo => {
                let made = std::process::Command::new("mkfifo").arg(path).status();
                assert!(
                    made.as_ref().is_ok_and(|s| s.success()),
                    "mkfifo {}: {made:?}",
                    path.display()
                );
            }
            Special::DevZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
            Special::Socket => {
                drop(std::os::unix::net::UnixListener::bind(path).unwrap());
            }
            Special::DanglingSymlink => {
                std::os::unix::fs::symlink(path.with_extension("nowhere"), path).unwrap();
            }
            Special::Directory => std::fs::create_dir(path).unwrap(),
            Special::Huge => std::fs::File::create(path)
                .unwrap()
                .set_len(2 << 30)
                .unwrap(),
        }
    }
}

/// Removes whatever is at `path` (file, symlink, socket, FIFO or empty directory).
pub fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(path).unwrap(),
        Ok(_) => std::fs::remove_file(path).unwrap(),
        Err(_) => {}
    }
}

/// Writes `bytes` at `path` atomically (a temporary file renamed over it), whatever was
/// there (a special file included).
pub fn replace_with(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp-replace");
    std::fs::write(&tmp, bytes).unwrap();
    remove(path);
    std::fs::rename(&tmp, path).unwrap();
}
