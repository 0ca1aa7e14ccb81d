//! The MARIN3R admission webhook (AdmissionReview v1 over HTTPS, design.md §1.1): sidecar
//! injection at `POST /pod-v1-mutate` over the pure `marin3r-sidecar` toolkit, EnvoyConfig
//! validation at `POST /validate-marin3r-3scale-net-v1alpha1-envoyconfig` with the
//! `marin3r-envoyconfig` decoder, and EnvoyDeployment validation at
//! `POST /validate-operator-marin3r-3scale-net-v1alpha1-envoydeployment` with the rules of
//! `marin3r-operator-api` (operator-design.md §5.8); probes and Prometheus metrics.
//!
//! Every value taken from a request and written to a log goes through
//! `marin3r_wire::quote::bounded`, the function that also bounds the values echoed in
//! denial messages: one rule for logs and messages.
#![forbid(unsafe_code)]

pub mod admission;
pub mod metrics;
pub mod server;
pub mod validation;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use marin3r_sidecar::Defaults;

use marin3r_process::{Process, Readiness, Stopping, metrics_router};
pub use server::{
    AppState, MAX_BODY_BYTES, MUTATE_PATH, VALIDATE_ENVOYCONFIG_PATH,
    VALIDATE_ENVOYDEPLOYMENT_PATH, router,
};

/// How long in-flight requests may take to finish after a shutdown signal.
pub const GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);
/// How long a client may take for the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers, from the moment the server
/// waits for them (a new connection, or the next request on a kept-alive one).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take from its headers to the answer: reading the body and
/// handling it. The API server gives a webhook at most 30 s (`timeoutSeconds`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How many admission connections are held at once; one more is closed as soon as it
/// is accepted, before its TLS handshake. Each may buffer one AdmissionReview of at most
/// [`MAX_BODY_BYTES`] (3 MiB), so all of them at most 96 MiB: within the webhook's
/// 128 Mi memory limit. An idle kept-alive connection is closed after
/// [`HEADER_READ_TIMEOUT`], so the API server's connection pool does not hold slots.
pub const MAX_CONNECTIONS: usize = 32;

/// Bounds on slow or stuck clients (slowloris), see docs/reliability.md. Every one of
/// them is reached with a client that trickles bytes, not only with an idle one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TLS handshake ([`HANDSHAKE_TIMEOUT`]).
    pub handshake: Duration,
    /// Request line and headers ([`HEADER_READ_TIMEOUT`]).
    pub header_read: Duration,
    /// Body and answer ([`REQUEST_TIMEOUT`]); a request over it gets 408.
    pub request: Duration,
    /// In-flight requests after the shutdown signal ([`GRACEFUL_SHUTDOWN_TIMEOUT`]).
    pub graceful_shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: HANDSHAKE_TIMEOUT,
            header_read: HEADER_READ_TIMEOUT,
            request: REQUEST_TIMEOUT,
            graceful_shutdown: GRACEFUL_SHUTDOWN_TIMEOUT,
        }
    }
}

/// The acceptor every accepted admission TCP stream goes through before TLS: it sets
/// `TCP_NODELAY` ([`marin3r_process::set_nodelay`], as on every listener), so a small
/// answer is not held back by Nagle's algorithm waiting for the client's delayed ACK
/// (~40 ms on fresh connections).
pub fn tcp_acceptor() -> TcpAcceptor {
    TcpAcceptor
}

/// See [`tcp_acceptor`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpAcceptor;

impl<S> axum_server::accept::Accept<tokio::net::TcpStream, S> for TcpAcceptor {
    type Stream = tokio::net::TcpStream;
    type Service = S;
    type Future = std::future::Ready<std::io::Result<(tokio::net::TcpStream, S)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        marin3r_process::set_nodelay(&stream);
        std::future::ready(Ok((stream, service)))
    }
}

/// The admission listener's acceptor: [`tcp_acceptor`], a slot of `slots` (none free:
/// the connection is closed at once), then the TLS handshake bounded by `handshake`.
pub fn https_acceptor(
    tls: Arc<rustls::ServerConfig>,
    handshake: Duration,
    slots: marin3r_process::ConnectionSlots,
) -> axum_server::tls_rustls::RustlsAcceptor<Capped> {
    axum_server::tls_rustls::RustlsAcceptor::new(
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .handshake_timeout(handshake)
    .acceptor(Capped { slots })
}

/// [`tcp_acceptor`] holding a slot of the listener's connection limit ([`MAX_CONNECTIONS`]).
#[derive(Debug, Clone)]
pub struct Capped {
    slots: marin3r_process::ConnectionSlots,
}

impl<S> axum_server::accept::Accept<tokio::net::TcpStream, S> for Capped {
    type Stream = marin3r_process::Held<tokio::net::TcpStream>;
    type Service = S;
    type Future = std::future::Ready<std::io::Result<(Self::Stream, S)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        marin3r_process::set_nodelay(&stream);
        std::future::ready(self.slots.take(stream).map(|held| (held, service)))
    }
}

/// How much longer than [`Timeouts::graceful_shutdown`] the process may take to stop:
/// past both, whatever is left is dropped (see [`marin3r_process::Process::serve`]).
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(2);

/// Errors of the webhook server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load the TLS certificate")]
    Tls(#[source] marin3r_certs::CertsError),
    /// A listener could not bind or failed.
    #[error(transparent)]
    Process(#[from] marin3r_process::Error),
}

/// Webhook settings (built from the CLI flags, or directly in tests).
#[derive(Debug, Clone)]
pub struct Config {
    /// HTTPS listener (`--webhook-port`, all interfaces).
    pub webhook_addr: SocketAddr,
    /// The serving certificate and key: `--tls-dir` alone (either layout of
    /// [`marin3r_wire::olm::SERVING_LAYOUTS`], chosen again at every reload), or with
    /// `--tls-cert-name` / `--tls-key-name` (those two files).
    pub tls: marin3r_certs::ServingFiles,
    /// Plain-HTTP probes (`--health-probe-bind-address`).
    pub health_addr: SocketAddr,
    /// Prometheus metrics (`--metrics-bind-address`).
    pub metrics_addr: SocketAddr,
    /// Image and discovery-service defaults.
    pub defaults: Defaults,
}

/// The three bound sockets of a webhook (tests bind them on port 0).
#[derive(Debug)]
pub struct Listeners {
    pub https: std::net::TcpListener,
    pub probes: tokio::net::TcpListener,
    pub metrics: tokio::net::TcpListener,
}

impl Listeners {
    /// Binds the addresses of `config`.
    pub async fn bind(config: &Config) -> Result<Self, Error> {
        let addr = config.webhook_addr;
        let https = marin3r_process::bind(addr)
            .await?
            .into_std()
            .map_err(|source| marin3r_process::Error::Bind { addr, source })?;
        Ok(Self {
            https,
            probes: marin3r_process::bind(config.health_addr).await?,
            metrics: marin3r_process::bind(config.metrics_addr).await?,
        })
    }
}

/// Binds the configured addresses and serves until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let listeners = Listeners::bind(&config).await?;
    serve(config, listeners, shutdown).await
}

/// Serves on already-bound listeners until `shutdown` completes, then lets in-flight
/// requests finish (up to [`GRACEFUL_SHUTDOWN_TIMEOUT`]). The TLS certificate is re-read
/// when its files change, so rotation needs no restart.
pub async fn serve(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_with_timeouts(config, listeners, Timeouts::default(), shutdown).await
}

/// [`serve`] with explicit [`Timeouts`] (tests use short ones).
///
/// The admission listener speaks HTTP/1.1 only (ALPN `http/1.1`), like controller-runtime
/// webhooks since the HTTP/2 rapid-reset CVE (CVE-2023-44487): the API server falls back
/// to it, and every phase of a connection is then bounded: handshake, headers (hyper's
/// header read timer runs from the connection's start, which HTTP/2 and the HTTP/1-or-2
/// detection would not give) and body plus answer.
///
/// Run by [`marin3r_process::Process::serve`]: ready once the HTTPS listener is up. On
/// `shutdown`: not ready at once, the listener closes, connections still in their TLS
/// handshake are dropped, idle ones are closed, and requests in flight get
/// [`Timeouts::graceful_shutdown`] to finish; the process's grace is that plus
/// [`SHUTDOWN_MARGIN`].
pub async fn serve_with_timeouts(
    config: Config,
    listeners: Listeners,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let tls = marin3r_certs::serving_config(&config.tls, &[b"http/1.1"]).map_err(Error::Tls)?;
    let readiness = Readiness::new();
    let metrics = Arc::new(metrics::Metrics::serving(
        config.tls.clone(),
        readiness.clone(),
    ));
    let state = Arc::new(AppState::new(config.defaults.clone(), metrics.clone()));
    let process = Process {
        name: "webhook",
        health: listeners.probes,
        metrics: listeners.metrics,
        metrics_routes: metrics_router(metrics.registry()),
        readiness: readiness.clone(),
        grace: timeouts.graceful_shutdown + SHUTDOWN_MARGIN,
    };
    let https = listeners.https;
    process
        .serve(shutdown, move |stopping| {
            serve_https(https, tls, state, timeouts, readiness, stopping)
        })
        .await
}

/// The admission server: HTTPS on `listener` until `stopping`, then a graceful shutdown
/// bounded by `timeouts.graceful_shutdown`.
async fn serve_https(
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<AppState>,
    timeouts: Timeouts,
    readiness: Readiness,
    stopping: Stopping,
) -> Result<(), Error> {
    let serve_error = |source| marin3r_process::Error::Serve {
        server: "webhook",
        source,
    };
    let handle = axum_server::Handle::new();
    let mut server = axum_server::from_tcp(listener)
        .map_err(serve_error)?
        .acceptor(UntilStopping {
            inner: https_acceptor(
                tls,
                timeouts.handshake,
                marin3r_process::ConnectionSlots::new(MAX_CONNECTIONS),
            ),
            stopping: stopping.clone(),
        })
        .handle(handle.clone())
        .http1_only();
    server
        .http_builder()
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeouts.header_read);
    let app = router(state).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            server::with_timeout(timeouts.request, next.run(req))
        },
    ));
    let serving = server.serve(app.into_make_service());
    let control = async {
        if let Some(addr) = handle.listening().await {
            readiness.set_synced();
            tracing::info!(%addr, "webhook listening");
        }
        stopping.wait().await;
        tracing::info!("shutting down, finishing in-flight requests");
        handle.graceful_shutdown(Some(timeouts.graceful_shutdown));
        std::future::pending::<()>().await;
    };
    tokio::select! {
        served = serving => served.map_err(serve_error)?,
        () = control => {}
    }
    Ok(())
}

/// An acceptor that gives up a connection still being accepted (in its TLS handshake)
/// once the shutdown began: axum-server waits for every accepted connection, so one that
/// never finishes its handshake would otherwise hold the shutdown for the whole
/// handshake timeout. Connections past their handshake are closed by hyper's graceful
/// shutdown (at once when idle).
#[derive(Debug, Clone)]
struct UntilStopping<A> {
    inner: A,
    stopping: Stopping,
}

impl<I, S, A> axum_server::accept::Accept<I, S> for UntilStopping<A>
where
    A: axum_server::accept::Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future =
        Pin<Box<dyn Future<Output = std::io::Result<(A::Stream, A::Service)>> + Send + 'static>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let accepting = self.inner.accept(stream, service);
        let stopped = self.stopping.wait();
        Box::pin(async move {
            tokio::select! {
                accepted = accepting => accepted,
                () = stopped => Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "shutting down during the TLS handshake",
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use axum_server::accept::Accept as _;

    #[tokio::test]
    async fn accepted_streams_have_tcp_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(tokio::net::TcpStream::connect(addr));
        let (stream, _) = listener.accept().await.unwrap();
        assert!(!stream.nodelay().unwrap(), "the OS default is Nagle on");
        let (stream, ()) = super::tcp_acceptor().accept(stream, ()).await.unwrap();
        assert!(stream.nodelay().unwrap());
        drop(client.await.unwrap().unwrap());
    }

    /// The acceptor `serve` uses: the TLS stream it hands to hyper has `TCP_NODELAY`.
    #[tokio::test]
    async fn the_https_acceptor_sets_tcp_nodelay_under_tls() {
        let bundle = marin3r_certs::issue(&marin3r_certs::IssueOptions {
            hosts: vec!["localhost".into()],
            ..Default::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &bundle.server.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &bundle.server.key_pem).unwrap();
        let tls = marin3r_certs::server_config(
            dir.path().join("tls.crt"),
            dir.path().join("tls.key"),
            &[b"http/1.1"],
        )
        .unwrap();
        let acceptor = super::https_acceptor(
            tls,
            std::time::Duration::from_secs(10),
            marin3r_process::ConnectionSlots::new(1),
        );

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client_config = marin3r_testkit::tls::client_config(&bundle.ca.cert_pem)
            .build()
            .unwrap();
        let client = tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            tokio_rustls::TlsConnector::from(client_config)
                .connect(name, tcp)
                .await
                .unwrap()
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (tls_stream, ()) = acceptor.accept(stream, ()).await.unwrap();
        assert!(tls_stream.get_ref().0.get_ref().nodelay().unwrap());
        drop(client.await.unwrap());
    }
}
