//! The MARIN3R control plane: what each Envoy node is served, and the discovery-service
//! process around it.
//!
//! - [`revisions`]: the self-healing revision engine (SPEC §4), sans-I/O;
//! - [`local`]: local mode, EnvoyConfig and Secret manifests from a folder;
//! - [`kubernetes`]: Kubernetes mode, the EnvoyConfig and EnvoyConfigRevision
//!   controllers;
//! - [`status`]: the status report of local mode (`GET /status`);
//! - this module: [`serve_with`] runs a [`Backend`] (one of the two sources) next to the
//!   xDS server of `marin3r-xds`, with metrics and probes.
#![forbid(unsafe_code)]

pub mod kubernetes;
pub mod local;
pub mod publisher;
pub mod revisions;
pub mod status;

use marin3r_process::{metrics_router, probe_router};
use marin3r_xds::{AdsConfig, SharedStats, SnapshotCache, XdsMetrics, server};

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Errors of the discovery service process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load the TLS certificates")]
    Tls(#[source] marin3r_certs::CertsError),
    /// A listener could not bind or failed.
    #[error(transparent)]
    Process(#[from] marin3r_process::Error),
    #[error("cannot read the config folder {dir}")]
    ConfigDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use the state folder {dir}")]
    StateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed")]
    Grpc(#[source] tonic::transport::Error),
}

/// Discovery service settings (from the CLI flags, or built directly in tests).
#[derive(Debug, Clone)]
pub struct Config {
    /// gRPC listener (`--xdss-port`).
    pub xdss_addr: SocketAddr,
    /// Server certificate and key (`--server-certificate-path` DIR/tls.crt, tls.key).
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// CA bundle client certificates must chain to (`--ca-certificate-path`).
    pub ca_file: PathBuf,
    /// Prometheus `/metrics` (`--metrics-bind-address`).
    pub metrics_addr: SocketAddr,
    /// `/healthz` and `/readyz` (`--health-probe-bind-address`).
    pub health_addr: SocketAddr,
    /// NACK backoff and control plane id.
    pub ads: AdsConfig,
}

/// The three bound sockets of a discovery service (tests bind them on port 0).
#[derive(Debug)]
pub struct Listeners {
    pub xdss: tokio::net::TcpListener,
    pub metrics: tokio::net::TcpListener,
    pub health: tokio::net::TcpListener,
}

impl Listeners {
    pub async fn bind(config: &Config) -> Result<Self, Error> {
        Ok(Self {
            xdss: marin3r_process::bind(config.xdss_addr).await?,
            metrics: marin3r_process::bind(config.metrics_addr).await?,
            health: marin3r_process::bind(config.health_addr).await?,
        })
    }
}

/// Binds the configured addresses and serves `backend` until `shutdown` completes.
pub async fn run<B: Backend>(
    config: Config,
    backend: B,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let listeners = Listeners::bind(&config).await?;
    serve_with(config, listeners, backend, shutdown).await
}

/// Shared handles a [`Backend`] feeds: the snapshot cache the ADS streams read, the
/// ACK/NACK statistics they write (self-healing reads them back), and the signal that
/// the backend has synced.
#[derive(Debug, Clone)]
pub struct Context {
    pub cache: SnapshotCache,
    pub stats: SharedStats,
    pub ready: Ready,
}

impl Context {
    /// An empty cache and stats, not synced.
    pub fn new(stats: SharedStats) -> Self {
        Self {
            cache: SnapshotCache::new(),
            stats,
            ready: Ready::default(),
        }
    }
}

/// Set by the backend once it has synced its sources and published the snapshots of
/// that first sync (local mode: the first folder scan applied; Kubernetes mode: the
/// first lists of every kind received and the published revisions loaded). The
/// discovery service is ready (`/readyz`, gRPC health) from then until it stops. Cheap
/// to clone; setting it twice is harmless.
#[derive(Debug, Clone)]
pub struct Ready(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Ready {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }
}

impl Ready {
    /// The backend has synced (idempotent).
    pub fn set_synced(&self) {
        self.0
            .send_if_modified(|synced| !std::mem::replace(synced, true));
    }

    pub fn is_synced(&self) -> bool {
        *self.0.borrow()
    }

    /// Follows the flag.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<bool> {
        self.0.subscribe()
    }

    /// Completes once synced.
    pub async fn synced(&self) {
        let _ = self.subscribe().wait_for(|synced| *synced).await;
    }
}

/// The discovery service's readiness (`/readyz`, gRPC health): synced and not stopping.
pub fn is_ready(synced: bool, stopping: bool) -> bool {
    synced && !stopping
}

/// A future that completes when the process shuts down.
pub type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where EnvoyConfigs come from (a local folder, Kubernetes) and how they reach the cache.
pub trait Backend: Send + 'static {
    /// Loads the initial state into the cache (streams of nodes without a snapshot are
    /// held meanwhile) and calls [`Ready::set_synced`] once it is complete — here, or
    /// later from [`run`](Self::run) if the sources are not reachable yet.
    fn start(&mut self, ctx: &Context) -> impl Future<Output = Result<(), Error>> + Send;
    /// Extra HTTP routes served on the metrics listener (local mode's `/status`).
    fn routes(&self, ctx: &Context) -> axum::Router {
        let _ = ctx;
        axum::Router::new()
    }
    /// Keeps the cache in sync until `shutdown` completes.
    fn run(self, ctx: Context, shutdown: Shutdown) -> impl Future<Output = ()> + Send;
}

/// Serves ADS over mTLS, metrics and probes fed by `backend`, until `shutdown` completes.
///
/// Everything listens at once; `/readyz` and gRPC health say not ready until the
/// backend has synced ([`Ready`]). On `shutdown` they say not ready at once, the ADS
/// server drains its streams over `AdsConfig::drain_time` and stops, then the backend
/// and the HTTP listeners stop.
pub async fn serve_with<B: Backend>(
    config: Config,
    listeners: Listeners,
    mut backend: B,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let tls = marin3r_certs::mtls_server_config(
        &config.server_cert,
        &config.server_key,
        &config.ca_file,
        &[b"h2"],
    )
    .map_err(Error::Tls)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let stats = SharedStats::with_metrics(XdsMetrics::register(&mut registry));
    let registry = Arc::new(registry);
    let ctx = Context::new(stats);

    // `signal`: the shutdown began (not ready, drain); `stop`: the ADS server is done,
    // the rest stops.
    let (signal_tx, signal_rx) = tokio::sync::watch::channel(false);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let when = |rx: &tokio::sync::watch::Receiver<bool>| {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let signal_task = tokio::spawn(async move {
        shutdown.await;
        let _ = signal_tx.send(true);
    });
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let probe_flag = Arc::new(AtomicBool::new(false));
    let readiness_task = tokio::spawn(follow_readiness(
        ctx.ready.subscribe(),
        signal_rx.clone(),
        ready_tx,
        probe_flag.clone(),
    ));
    let http = metrics_router(registry).merge(backend.routes(&ctx));
    let metrics_task = tokio::spawn(
        axum::serve(listeners.metrics, http)
            .with_graceful_shutdown(when(&stop_rx))
            .into_future(),
    );
    let health_task = tokio::spawn(
        axum::serve(listeners.health, probe_router(probe_flag))
            .with_graceful_shutdown(when(&stop_rx))
            .into_future(),
    );
    let service = server::AdsService::new(ctx.cache.clone(), ctx.stats.clone(), config.ads.clone());
    tracing::info!(addr = ?listeners.xdss.local_addr().ok(), "discovery service listening");
    let grpc_task = tokio::spawn(server::serve_ads(
        listeners.xdss,
        tls,
        service,
        ready_rx,
        when(&signal_rx),
    ));

    // The initial load; streams of nodes it has not published yet are held meanwhile.
    let started = tokio::select! {
        started = backend.start(&ctx) => Some(started),
        () = when(&signal_rx) => None,
    };
    let (backend_task, start_error) = match started {
        Some(Ok(())) => (
            Some(tokio::spawn(
                backend.run(ctx.clone(), Box::pin(when(&stop_rx))),
            )),
            None,
        ),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let join = |r: Result<std::io::Result<()>, tokio::task::JoinError>| {
        r.unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let grpc = if start_error.is_some() {
        // Nothing was served: no drain, the listener closes with the task.
        grpc_task.abort();
        Ok(())
    } else {
        match grpc_task.await {
            Ok(result) => result.map_err(Error::Grpc),
            Err(e) => Err(marin3r_process::Error::Serve {
                server: "ADS",
                source: std::io::Error::other(e),
            }
            .into()),
        }
    };
    let _ = stop_tx.send(true);
    if let Some(task) = backend_task {
        let _ = task.await;
    }
    readiness_task.abort();
    signal_task.abort();
    let metrics_res = join(metrics_task.await);
    let health_res = join(health_task.await);
    if let Some(e) = start_error {
        return Err(e);
    }
    grpc?;
    metrics_res.map_err(|source| marin3r_process::Error::Serve {
        server: "metrics",
        source,
    })?;
    health_res.map_err(|source| marin3r_process::Error::Serve {
        server: "health",
        source,
    })?;
    Ok(())
}

/// Keeps `ready` (gRPC health) and `probe` (`/readyz`) at [`is_ready`] of the backend's
/// `synced` flag and the shutdown `signal`, until the signal.
async fn follow_readiness(
    mut synced: tokio::sync::watch::Receiver<bool>,
    mut signal: tokio::sync::watch::Receiver<bool>,
    ready: tokio::sync::watch::Sender<bool>,
    probe: Arc<AtomicBool>,
) {
    let mut synced_open = true;
    loop {
        let stopping = *signal.borrow_and_update();
        let now = is_ready(*synced.borrow_and_update(), stopping);
        probe.store(now, Ordering::Release);
        ready.send_if_modified(|r| std::mem::replace(r, now) != now);
        if stopping {
            return;
        }
        tokio::select! {
            changed = synced.changed(), if synced_open => synced_open = changed.is_ok(),
            changed = signal.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_synced_and_not_stopping() {
        assert!(!is_ready(false, false));
        assert!(is_ready(true, false));
        assert!(!is_ready(true, true));
        assert!(!is_ready(false, true));
    }

    #[tokio::test]
    async fn readiness_follows_the_backend_and_the_signal() {
        let flag = Ready::default();
        let (signal_tx, signal_rx) = tokio::sync::watch::channel(false);
        let (ready_tx, mut ready_rx) = tokio::sync::watch::channel(false);
        let probe = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(follow_readiness(
            flag.subscribe(),
            signal_rx,
            ready_tx,
            probe.clone(),
        ));
        tokio::task::yield_now().await;
        assert!(!*ready_rx.borrow() && !probe.load(Ordering::Acquire));
        flag.set_synced();
        flag.set_synced();
        ready_rx.wait_for(|r| *r).await.unwrap();
        assert!(probe.load(Ordering::Acquire));
        signal_tx.send(true).unwrap();
        ready_rx.wait_for(|r| !*r).await.unwrap();
        task.await.unwrap();
        assert!(!probe.load(Ordering::Acquire), "not ready once stopping");
        flag.set_synced();
        assert!(!*ready_rx.borrow(), "stays not ready after the signal");
    }
}
