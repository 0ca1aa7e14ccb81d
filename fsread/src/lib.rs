//! The one way MARIN3R reads a file it does not control: served certificates and keys,
//! CA bundles, the local config folder's manifests, state files, command-line inputs.
//!
//! [`read_regular_file`] opens the path (symlinks followed) without blocking
//! (`O_NONBLOCK`: a FIFO put where a certificate was never blocks the open), checks on
//! the opened file that it is a regular file (no FIFO, socket or device such as
//! `/dev/zero` is ever read: it could block or never end), and reads at most the
//! caller's limit (a file over it, or one that grows past it while read, is refused and
//! never read whole). Every error names the file and the rule it broke.
//!
//! A separate crate below every reader (`marin3r-certs`, `marin3r-process`, the control
//! plane, the CLI): reading a file is no wire fact (`marin3r-wire` stays free of
//! dependencies), and the certificate crate, the lowest reader, must be able to use it.
#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// What a path that is not a regular file turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    Directory,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Directory => "a directory",
            Self::Fifo => "a named pipe (FIFO)",
            Self::Socket => "a socket",
            Self::CharDevice => "a character device",
            Self::BlockDevice => "a block device",
            Self::Other => "a special file",
        })
    }
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// It could not be opened, stat'ed or read (missing, dangling symlink, no permission,
    /// a socket, …).
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// It is not a regular file.
    #[error("{} is not a regular file ({kind}): only regular files are read", path.display())]
    NotRegular { path: PathBuf, kind: FileKind },
    /// It is larger than the caller's limit (`len` is what was seen: its size, or the
    /// limit + 1 for a file that grew while read).
    #[error("{} is {len} bytes or more, more than the {limit}-byte limit", path.display())]
    TooLarge { path: PathBuf, len: u64, limit: u64 },
}

impl Error {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Io { path, .. } | Self::NotRegular { path, .. } | Self::TooLarge { path, .. } => {
                path
            }
        }
    }

    /// The reason without the file's name, for callers that name it already.
    pub fn reason(&self) -> String {
        match self {
            Self::Io { source, .. } => format!("cannot read the file: {source}"),
            Self::NotRegular { kind, .. } => {
                format!("not a regular file ({kind}): only regular files are read")
            }
            Self::TooLarge { len, limit, .. } => {
                format!("the file is {len} bytes or more, more than the {limit}-byte limit")
            }
        }
    }
}

/// What `meta` (a `stat`, symlinks followed) says the file is, or `None` for a regular
/// file. Callers that list a folder can ask before reading; [`read_regular_file`] asks
/// again on the opened file (it may have been swapped in between).
pub fn special_kind(meta: &std::fs::Metadata) -> Option<FileKind> {
    use std::os::unix::fs::FileTypeExt as _;
    let t = meta.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        FileKind::Directory
    } else if t.is_fifo() {
        FileKind::Fifo
    } else if t.is_socket() {
        FileKind::Socket
    } else if t.is_char_device() {
        FileKind::CharDevice
    } else if t.is_block_device() {
        FileKind::BlockDevice
    } else {
        FileKind::Other
    })
}

/// [`special_kind`] as an error naming `path`.
pub fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), Error> {
    match special_kind(meta) {
        None => Ok(()),
        Some(kind) => Err(Error::NotRegular {
            path: path.to_path_buf(),
            kind,
        }),
    }
}

fn too_large(path: &Path, len: u64, limit: u64) -> Result<(), Error> {
    if len > limit {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
            len,
            limit,
        });
    }
    Ok(())
}

/// Reads the regular file at `path` (symlinks followed), at most `limit` bytes: see the
/// crate docs. Never blocks on a FIFO, never reads a device, never holds more than
/// `limit` + 1 bytes.
pub fn read_regular_file(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let opened = file.metadata().map_err(io)?;
    check_regular(path, &opened)?;
    too_large(path, opened.len(), limit)?;
    read_bounded(file, limit, path)
}

/// Reads `reader` to its end, at most `limit` bytes (more is refused, never held): for
/// inputs that are streams by nature (standard input). `name` names it in errors.
pub fn read_bounded(reader: impl Read, limit: u64, name: &Path) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| Error::Io {
            path: name.to_path_buf(),
            source,
        })?;
    too_large(name, bytes.len() as u64, limit)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_a_regular_file_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular_file(&file, 5).unwrap(), b"12345");
        let e = read_regular_file(&file, 4).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    len: 5,
                    limit: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "{} is 5 bytes or more, more than the 4-byte limit",
                file.display()
            )
        );
        assert_eq!(e.path(), file);
    }

    #[test]
    fn a_stream_is_cut_at_the_limit() {
        let endless = io::repeat(b'x');
        let e = read_bounded(endless, 1024, Path::new("standard input")).unwrap_err();
        assert!(matches!(e, Error::TooLarge { len: 1025, .. }), "{e}");
        assert_eq!(
            read_bounded(&b"abc"[..], 3, Path::new("-")).unwrap(),
            b"abc"
        );
    }
}
