//! The one in-process launcher of the discovery service for tests:
//! `marin3r_control_plane::serve_with` as a task of the current tokio runtime, with any
//! [`Backend`], ADS on a listener the caller binds (127.0.0.1:0, or a port it reuses),
//! metrics and probes on 127.0.0.1:0. The task is aborted when the handle drops, also
//! when a test panics. Used by [`crate::xds::Xds`] (a config folder and a real Envoy) and
//! by `control-plane/tests/hardening_ads.rs` (tonic clients, a test backend).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use marin3r_control_plane::{Backend, Config, Listeners};
use marin3r_xds::AdsConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The discovery service's certificate files (`--server-certificate-path`,
/// `--ca-certificate-path`).
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub ca_file: PathBuf,
}

impl CertFiles {
    /// The layout `marin3r certs` writes under `dir`: `server/tls.crt`, `server/tls.key`,
    /// and the CA file of `ca/`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            server_cert: dir.join("server/tls.crt"),
            server_key: dir.join("server/tls.key"),
            ca_file: marin3r_certs::ca_file_in_dir(dir.join("ca")),
        }
    }
}

/// A listener on 127.0.0.1 with a free port.
pub async fn bind_localhost() -> Result<TcpListener, String> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind 127.0.0.1:0: {e}"))
}

/// A discovery service running in-process.
pub struct InProcess {
    /// The ADS gRPC (mTLS) listener.
    pub xdss: SocketAddr,
    /// The Prometheus `/metrics` listener (and `/status` in local mode).
    pub metrics: SocketAddr,
    /// The `/healthz` and `/readyz` listener.
    pub health: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), marin3r_control_plane::Error>>,
}

impl InProcess {
    /// Serves `backend` with ADS on `xdss`, the certificates `certs` and `ads`; metrics
    /// and probes bind 127.0.0.1:0. Returns at once: the backend starts in the task.
    pub async fn launch<B: Backend>(
        xdss: TcpListener,
        certs: &CertFiles,
        ads: AdsConfig,
        backend: B,
    ) -> Result<Self, String> {
        let listeners = Listeners {
            xdss,
            metrics: bind_localhost().await?,
            health: bind_localhost().await?,
        };
        let addr = |l: &TcpListener| l.local_addr().map_err(|e| format!("local_addr: {e}"));
        let (xdss, metrics, health) = (
            addr(&listeners.xdss)?,
            addr(&listeners.metrics)?,
            addr(&listeners.health)?,
        );
        let config = Config {
            xdss_addr: xdss,
            server_cert: certs.server_cert.clone(),
            server_key: certs.server_key.clone(),
            ca_file: certs.ca_file.clone(),
            metrics_addr: metrics,
            health_addr: health,
            ads,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(marin3r_control_plane::serve_with(
            config,
            listeners,
            backend,
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            xdss,
            metrics,
            health,
            stop: Some(stop),
            task,
        })
    }

    /// Signals the shutdown (SIGTERM in the process) without waiting for it.
    pub fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether `serve_with` has returned.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Signals the shutdown and waits up to `within` for `serve_with` to return cleanly
    /// (the task is aborted when it does not).
    pub async fn stop(mut self, within: Duration) -> Result<(), String> {
        self.signal_stop();
        match tokio::time::timeout(within, &mut self.task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("serve failed: {e:?}")),
            Ok(Err(e)) => Err(format!("the discovery service task failed: {e}")),
            Err(_) => Err(format!(
                "the discovery service did not stop within {within:?}"
            )),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.task.abort();
    }
}
