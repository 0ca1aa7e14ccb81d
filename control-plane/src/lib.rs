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
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
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
    #[error("{server} server failed")]
    Serve {
        server: &'static str,
        #[source]
        source: std::io::Error,
    },
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

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

impl Listeners {
    pub async fn bind(config: &Config) -> Result<Self, Error> {
        Ok(Self {
            xdss: bind(config.xdss_addr).await?,
            metrics: bind(config.metrics_addr).await?,
            health: bind(config.health_addr).await?,
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

/// Shared handles a [`Backend`] feeds: the snapshot cache the ADS streams read, and the
/// ACK/NACK statistics they write (self-healing reads them back).
#[derive(Debug, Clone)]
pub struct Context {
    pub cache: SnapshotCache,
    pub stats: SharedStats,
}

/// A future that completes when the process shuts down.
pub type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where EnvoyConfigs come from (a local folder, Kubernetes) and how they reach the cache.
pub trait Backend: Send + 'static {
    /// Loads the initial state into the cache, before any stream is accepted.
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
    let ctx = Context {
        cache: SnapshotCache::new(),
        stats,
    };
    // Initial load before serving, so the first Envoy gets the config at once.
    backend.start(&ctx).await?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let ready = Arc::new(AtomicBool::new(false));
    let http = metrics_router(registry).merge(backend.routes(&ctx));
    let backend_task = tokio::spawn(backend.run(ctx.clone(), Box::pin(stopped())));
    let metrics_task = tokio::spawn(
        axum::serve(listeners.metrics, http)
            .with_graceful_shutdown(stopped())
            .into_future(),
    );
    let health_task = tokio::spawn(
        axum::serve(listeners.health, probe_router(ready.clone()))
            .with_graceful_shutdown(stopped())
            .into_future(),
    );
    let service = server::AdsService::new(ctx.cache.clone(), ctx.stats.clone(), config.ads.clone());
    ready.store(true, Ordering::Release);
    tracing::info!(addr = ?listeners.xdss.local_addr().ok(), "discovery service listening");
    let grpc = server::serve_ads(listeners.xdss, tls, service, shutdown).await;
    ready.store(false, Ordering::Release);
    let _ = stop_tx.send(true);
    let _ = backend_task.await;
    let join = |r: Result<std::io::Result<()>, tokio::task::JoinError>| {
        r.unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let metrics_res = join(metrics_task.await);
    let health_res = join(health_task.await);
    grpc.map_err(Error::Grpc)?;
    metrics_res.map_err(|source| Error::Serve {
        server: "metrics",
        source,
    })?;
    health_res.map_err(|source| Error::Serve {
        server: "health",
        source,
    })?;
    Ok(())
}
