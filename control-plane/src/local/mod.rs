//! Local mode (`discovery-service --config-dir DIR`): EnvoyConfig and Secret manifests
//! from a folder, no cluster needed, with the same self-healing as Kubernetes mode.
//!
//! Every `*.yaml`, `*.yml` and `*.json` regular file directly in the folder is read
//! (multi-document; hidden files are skipped; symlinks are followed, so a mounted ConfigMap
//! works). The rule for what the folder holds: **only regular files are read, reads are
//! bounded, the watch heals itself, and a file that cannot be read is not a deleted
//! EnvoyConfig.** An entry named like a manifest that is not a regular file (a FIFO, a
//! socket, a device such as a symlink to `/dev/zero`, a directory), a dangling symlink or
//! a loop is never opened (or opened `O_NONBLOCK` and checked again once open), is
//! listed in `GET /status` with why, and keeps its last good content; a read stops at
//! [`folder::MAX_FILE_BYTES`]; only a directory entry gone for [`folder::DELETE_GRACE`]
//! deletes what it defined. The folder is re-scanned at once when inotify reports a
//! change in it, and every [`POLL_INTERVAL`] anyway; a file is re-read when its size,
//! inode, modification or status-change time changes (this also catches editors that
//! write a new file and rename it, and `cp -p` over it), every settled file is read again
//! every [`folder::CONTENT_RESCAN`] and its bytes compared, and a changed file is read
//! only once it has settled ([`settle`]: its writer closed it, as inotify reports; a file
//! still being written keeps its last good content). The inotify watch is set up again
//! when its queue overflows, when the folder is deleted, moved or swapped for another
//! one, or when it could not be set up (with backoff). A file that does not parse is
//! logged and its last good content keeps being used; so does an EnvoyConfig document
//! that is not a valid EnvoyConfig. Every file system call runs on tokio's blocking pool
//! ([`backend::blocking`]).
//!
//! Self-healing (design.md §4) runs through [`Engine`], one [`Revisions`] per EnvoyConfig
//! (`namespace/name`):
//! - every folder change applies the EnvoyConfigs it concerns (a new spec is a new
//!   desired revision, a known one moves to the top) and publishes the topmost untainted
//!   revision whose resources resolve with the folder's Secrets
//!   ([`crate::publisher::decide`]); a revision whose resources do not decode is tainted
//!   on the way, one waiting for a missing Secret is kept and published once the Secret
//!   is there. The cost follows the change, not the folder: a file is read only when
//!   its fingerprint changes and parsed only when its documents do, an EnvoyConfig whose
//!   spec, namespace and the Secrets its last resolution read
//!   ([`crate::publisher::Reads`]) are unchanged is not resolved again, and a snapshot
//!   that resolves the same as the one served is not published again (each of these
//!   asked in one place, see [`engine`]);
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
//!   replaced atomically on every change, with a second copy used when it is corrupt);
//!   the first publication after a restart already honours the restored taints.
//!
//! Removing an EnvoyConfig drops its revisions and stops serving its node to new streams;
//! connected Envoys keep what they have.
//!
//! Layout: [`folder`] reads the folder, [`engine`] decides (sans-I/O: it returns
//! [`Effect`]s instead of touching the cache, the statistics or the disk), [`state`] is
//! the `--state-dir` file format, [`backend`] is the async shell that applies the effects
//! and serves the status routes.

pub mod backend;
pub mod engine;
pub mod folder;
pub mod settle;
pub mod state;

pub use backend::{EVALUATE_INTERVAL, LocalBackend, POLL_INTERVAL};
pub use engine::{Effect, Engine, Options, RemoveError};
pub use folder::{Key, LocalSource, Manifests};
