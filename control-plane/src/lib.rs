//! The MARIN3R control plane: what each Envoy node is served, and the discovery-service
//! process around it.
//!
//! - [`revisions`]: the self-healing revision engine (design.md §4), sans-I/O;
//! - [`nacks`]: the NACK verdict on a revision (what the statistics say, the taint);
//! - [`fleet`]: the NACK verdict over several replicas (their reports, what each is
//!   expected to serve, the judgement; docs/ha.md);
//! - [`metrics`]: the revision, rollback, taint and cache-state metrics of both modes;
//! - [`publisher`]: every self-healing rule in one pure function, both modes apply;
//! - [`local`]: local mode, EnvoyConfig and Secret manifests from a folder;
//! - [`kubernetes`]: Kubernetes mode, the EnvoyConfig and EnvoyConfigRevision
//!   controllers;
//! - [`status`]: the status report of local mode (`GET /status`);
//! - this module: [`serve_with`] runs a [`Backend`] (one of the two sources) next to the
//!   xDS server of `marin3r-xds`, with metrics and probes.
#![forbid(unsafe_code)]

pub mod fleet;
pub mod kubernetes;
pub mod local;
pub mod metrics;
pub mod nacks;
pub mod publisher;
pub mod revisions;
pub mod status;

#[cfg(test)]
mod fixtures;

use marin3r_process::{Process, Stopping, metrics_router};
use marin3r_xds::{AdsConfig, SharedStats, SnapshotCache, XdsMetrics, server};

pub use marin3r_process::Readiness;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// NACK backoff, control plane id, the connections' max age and the shutdown
    /// drain (`--max-connection-age`, `--drain-delay`, `--drain-time`).
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
/// ACK/NACK statistics they write (self-healing reads them back), and the process's
/// readiness, which the backend sets synced.
#[derive(Debug, Clone)]
pub struct Context {
    pub cache: SnapshotCache,
    pub stats: SharedStats,
    /// Set synced by the backend once it has synced its sources and published the
    /// snapshots of that first sync (local mode: the first folder scan applied;
    /// Kubernetes mode: the first lists of every kind received and the published
    /// revisions loaded). The discovery service is ready (`/readyz`, gRPC health) from
    /// then until it stops.
    pub ready: Readiness,
    /// The self-healing series both sources feed ([`metrics::RevisionMetrics`]).
    pub revisions: metrics::RevisionMetrics,
}

impl Context {
    /// An empty cache and stats, not synced.
    pub fn new(stats: SharedStats) -> Self {
        Self {
            cache: SnapshotCache::new(),
            stats,
            ready: Readiness::new(),
            revisions: metrics::RevisionMetrics::default(),
        }
    }
}

/// A future that completes when the process shuts down.
pub type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where EnvoyConfigs come from (a local folder, Kubernetes) and how they reach the cache.
pub trait Backend: Send + 'static {
    /// Loads the initial state into the cache (streams of nodes without a snapshot are
    /// held meanwhile) and calls [`Readiness::set_synced`] once it is complete — here, or
    /// later from [`run`](Self::run) if the sources are not reachable yet.
    fn start(&mut self, ctx: &Context) -> impl Future<Output = Result<(), Error>> + Send;
    /// Extra HTTP routes served on the metrics listener (local mode's `/status`).
    fn routes(&self, ctx: &Context) -> axum::Router {
        let _ = ctx;
        axum::Router::new()
    }
    /// Keeps the cache in sync until `shutdown` completes.
    fn run(self, ctx: Context, shutdown: Shutdown) -> impl Future<Output = ()> + Send;
    /// Registers the backend's own metrics with the process's (before it starts).
    fn register_metrics(&mut self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}

/// How much longer than its ADS server may take (the drain delay, the drain, then the
/// wait for connections to close: [`shutdown_grace`]) the discovery service may take to
/// stop.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(2);

/// The discovery service's grace after its shutdown signal: the ADS server serves on
/// for `drain_delay`, closes the connections over `drain_time`, then waits up to
/// `shutdown_grace` for them to go, plus [`SHUTDOWN_MARGIN`] for the backend to stop.
/// With the defaults, 5 + 5 + 10 + 2 = 22 s, inside Kubernetes' default 30 s termination
/// grace period (saturating: a huge flag means no bound, not a panic).
pub fn shutdown_grace(ads: &AdsConfig) -> Duration {
    ads.drain_delay
        .saturating_add(ads.drain_time)
        .saturating_add(ads.shutdown_grace)
        .saturating_add(SHUTDOWN_MARGIN)
}

/// Serves ADS over mTLS, metrics and probes fed by `backend`, until `shutdown` completes.
///
/// Run by [`marin3r_process::Process::serve`]. Everything listens at once; `/readyz` and
/// gRPC health (which both read [`Context::ready`]) say not ready until the backend has
/// synced. On `shutdown` they say not ready at once, the ADS server serves on for
/// `AdsConfig::drain_delay` (not when no Envoy is connected), closes its connections
/// over `AdsConfig::drain_time` and stops, then the backend and the HTTP listeners stop;
/// all of it within [`shutdown_grace`], even when the sources (the API server) do not
/// answer. A shutdown while the backend still loads its initial state (Kubernetes mode
/// waits up to 30 s for the first lists) stops it at once.
pub async fn serve_with<B: Backend>(
    config: Config,
    listeners: Listeners,
    backend: B,
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
    let mut backend = backend;
    backend.register_metrics(&mut registry);
    let mut ctx = Context::new(stats);
    ctx.revisions = metrics::RevisionMetrics::register(&mut registry);
    // The API client's liveness series (the Kubernetes backend's reconcile counters are
    // its own: `Backend::register_metrics`).
    marin3r_kube::client::register_metrics(&mut registry);
    marin3r_process::CertificateExpiry::served([
        ("discovery-service-server", config.server_cert.clone()),
        ("discovery-service-ca", config.ca_file.clone()),
    ])
    .register(&mut registry);
    marin3r_process::register_ready_metric(&mut registry, ctx.ready.clone());
    let process = Process {
        name: "discovery service",
        health: listeners.health,
        metrics: listeners.metrics,
        metrics_routes: metrics_router(Arc::new(registry)).merge(backend.routes(&ctx)),
        readiness: ctx.ready.clone(),
        grace: shutdown_grace(&config.ads),
    };
    let xdss = listeners.xdss;
    process
        .serve(shutdown, move |stopping| {
            discover(xdss, tls, config.ads, backend, ctx, stopping)
        })
        .await
}

/// The main work of the discovery service: the ADS server, and `backend` feeding it
/// from its initial load until the ADS server has drained.
async fn discover<B: Backend>(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ads: AdsConfig,
    mut backend: B,
    ctx: Context,
    stopping: Stopping,
) -> Result<(), Error> {
    let service = server::AdsService::new(ctx.cache.clone(), ctx.stats.clone(), ads);
    tracing::info!(addr = ?listener.local_addr().ok(), "discovery service listening");
    let grpc = server::serve_ads(
        listener,
        tls,
        service,
        ctx.ready.subscribe(),
        stopping.wait(),
    );
    let mut grpc = std::pin::pin!(grpc);

    // The initial load; streams of nodes it has not published yet are held meanwhile.
    let started = tokio::select! {
        started = backend.start(&ctx) => Some(started),
        () = stopping.wait() => None,
        () = &mut grpc => return Ok(()),
    };
    // Aborts the backend if this future is dropped (past the grace).
    let mut running = tokio::task::JoinSet::new();
    let (stop_backend, backend_stopped) = tokio::sync::oneshot::channel::<()>();
    match started {
        // Nothing was served: no drain, the listener closes with `grpc`.
        Some(Err(e)) => return Err(e),
        Some(Ok(())) => {
            running.spawn(backend.run(
                ctx,
                Box::pin(async move {
                    let _ = backend_stopped.await;
                }),
            ));
        }
        None => {}
    }
    grpc.await;
    // The backend keeps the cache current while the connections drain.
    let _ = stop_backend.send(());
    while running.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_covers_the_drain_delay_the_drain_and_the_wait_for_connections() {
        let s = Duration::from_secs;
        let ads = AdsConfig::default();
        assert_eq!(
            (ads.drain_delay, ads.drain_time, ads.shutdown_grace),
            (s(5), s(5), s(10))
        );
        assert_eq!(
            shutdown_grace(&ads),
            s(22),
            "inside Kubernetes' default 30 s"
        );
        let custom = AdsConfig {
            drain_delay: s(1),
            drain_time: s(3),
            shutdown_grace: s(4),
            ..AdsConfig::default()
        };
        assert_eq!(shutdown_grace(&custom), s(8) + SHUTDOWN_MARGIN);
        let huge = AdsConfig {
            drain_delay: Duration::MAX,
            ..AdsConfig::default()
        };
        assert_eq!(shutdown_grace(&huge), Duration::MAX, "saturates");
    }
}
