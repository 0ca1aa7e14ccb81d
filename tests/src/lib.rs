//! Shared helpers for the end-to-end tests that drive a real Envoy.
//!
//! Envoy is never optional: [`envoy_bin`] (the test kit's) fails loudly when the binary is missing, so a
//! machine without Envoy makes the suite red instead of silently skipping.
#![forbid(unsafe_code)]

pub mod configs;
pub mod ha;
pub mod in_process;
pub mod xds;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Root of the cargo workspace (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub use marin3r_testkit::envoy::{envoy_bin, find_envoy};

/// Unwraps a harness result, panicking with its message (the harness reports failures as
/// `Err(String)`; in a test they fail it).
pub trait Must<T> {
    fn must(self) -> T;
}

impl<T> Must<T> for Result<T, String> {
    #[track_caller]
    #[allow(clippy::panic)]
    fn must(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Fails the test with the command's stderr unless it exited 0.
#[allow(clippy::panic)]
pub fn assert_success(out: &std::process::Output) {
    if !out.status.success() {
        panic!(
            "exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A child process that is killed (and reaped) when dropped, also when a test panics.
pub struct KillOnDrop {
    pub child: Child,
    pub name: String,
}

impl KillOnDrop {
    pub fn spawn(name: &str, cmd: &mut Command) -> std::io::Result<Self> {
        let child = cmd.stdin(Stdio::null()).spawn()?;
        Ok(Self {
            child,
            name: name.to_string(),
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Returns `Some(status)` if the process already exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM (with `kill`) and waits up to `timeout` for the exit; `None` when the
    /// signal could not be sent or the process is still running.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !sent {
            return None;
        }
        wait_for(timeout, || self.try_wait())
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub use marin3r_testkit::{free_port, wait_for};

/// `GET path` to 127.0.0.1:`port` as one text: `HTTP/1.1 <status>`, then the body after
/// a blank line; `None` when the exchange fails. Kept (on the test kit's client) for
/// `cli/tests/status.rs`; new tests use [`marin3r_testkit::http`].
pub fn http_get_raw(port: u16, path: &str) -> Option<String> {
    let r =
        marin3r_testkit::http::get_blocking(SocketAddr::from(([127, 0, 0, 1], port)), path).ok()?;
    Some(format!("HTTP/1.1 {}\r\n\r\n{}", r.status, r.body))
}

/// True when something accepts TCP connections at `addr`.
pub fn port_open(addr: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Path of the `marin3r` binary built by cargo for the current profile.
pub fn marin3r_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    target.join(profile).join("marin3r")
}
