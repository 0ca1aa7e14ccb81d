//! The transport of the xDS server: [`serve_ads`] serves [`AdsService`] (through the
//! hand-written routes of [`crate::grpc`]) and `grpc.health.v1` over mTLS from a
//! reloading rustls config, with bounded handshakes and HTTP/2 prefaces, one HTTP/2
//! server per connection, so that it can close connections one by one: on shutdown,
//! spread over the drain window, and at their jittered max age ([`crate::drain`]).

use std::future::Future;
use std::hash::BuildHasher as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::codegen::http;
use tonic::service::Routes;
use tower::ServiceExt as _;

#[cfg(doc)]
use crate::AdsConfig;
use crate::connection::Registry;
use crate::drain::{self, CloseReason, DrainPlan};
pub use crate::grpc::{AdsServer, CsdsServer};
use crate::limits::{Bounded, Budget, ConnectionLimits};
pub use crate::service::AdsService;

/// TLS handshakes that take longer are dropped (slow or stuck clients).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A TLS connection whose HTTP/2 preface the server has already read (to bound how
/// long a client may stay silent after its handshake); the preface is replayed to the
/// HTTP/2 server before the rest of the stream. No heap: 24 bytes and a cursor.
struct Prefaced<S> {
    replayed: usize,
    inner: S,
}

impl<S: tokio::io::AsyncRead + Unpin> Prefaced<S> {
    /// Reads the preface from `inner`; an error as soon as a byte differs from it or the
    /// client closes first.
    async fn read(mut inner: S) -> std::io::Result<Self> {
        use tokio::io::AsyncReadExt as _;
        let mut got = [0u8; H2_PREFACE.len()];
        let mut filled = 0;
        while filled < got.len() {
            let n = inner.read(&mut got[filled..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let end = filled + n;
            if got[filled..end] != H2_PREFACE[filled..end] {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the first bytes are not the HTTP/2 connection preface",
                ));
            }
            filled = end;
        }
        Ok(Self { replayed: 0, inner })
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefaced<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(rest) = H2_PREFACE.get(this.replayed..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return std::task::Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefaced<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// HTTP/2 keepalive: a PING after this long without frames from the client...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// ...and the connection is closed when its ACK does not come within this long.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves ADS and gRPC health on `listener` over mTLS until `shutdown` completes and
/// the connections are drained.
///
/// Handshakes run concurrently (one slow client does not hold up the others) and are
/// bounded by [`HANDSHAKE_TIMEOUT`], then the HTTP/2 preface by
/// [`AdsConfig::preface_timeout`]; the rustls config re-reads its certificate and CA
/// files when they change, so rotation needs no restart and open streams are untouched.
/// Each connection is served by its own HTTP/2 server (keepalive PINGs every 30 s, 10 s
/// to answer), so the server can close it by itself ([`crate::drain`]): a GOAWAY (the
/// client opens no new stream on it and reconnects), and its ADS streams end with
/// `UNAVAILABLE` ([`CloseReason::message`]; Envoy keeps its config).
///
/// A connection is closed once it is [`AdsConfig::max_connection_age`] old ± 10 %
/// ([`drain::jittered_age`], the jitter drawn per connection when it is accepted). A
/// connection still open [`AdsConfig::shutdown_grace`] after its close (a client that
/// does not let its streams end) is dropped.
///
/// gRPC health (`""` and the ADS service) says `SERVING` while `ready` is `true`,
/// `NOT_SERVING` otherwise (ADS streams are served either way: a node without a
/// published snapshot is held). `ready` is the process's readiness, already computed
/// (`marin3r_process::Readiness`: synced and not stopping); the caller turns it off
/// when the shutdown begins.
///
/// On `shutdown` the server keeps serving fully (new connections, new streams) for
/// [`AdsConfig::drain_delay`] — not at all when no ADS stream is open (no Envoy is
/// connected), and no longer once the last one closed — then closes the listener and
/// the open connections, spread over
/// [`AdsConfig::drain_time`] in accept order ([`DrainPlan`]; a handshake that completes
/// after that is closed at once). It returns once every connection is closed, or
/// [`AdsConfig::shutdown_grace`] after the last one was told to close (connections
/// still open then are dropped).
pub async fn serve_ads(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: AdsService,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let config = service.config.clone();
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, false).await;
    let health_task = tokio::spawn(follow_readiness(health, ready));
    let (plan_tx, plan) = watch::channel(None);
    let limits = config.limits;
    let mut server = Connections {
        acceptor: tokio_rustls::TlsAcceptor::from(tls),
        limits,
        slots: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
        requests: Arc::new(Budget::new(limits.total_request_bytes, "server")),
        streams: Arc::new(tokio::sync::Semaphore::new(limits.max_streams)),
        preface_timeout: config.preface_timeout,
        max_age: config.max_connection_age,
        close_grace: config.shutdown_grace,
        // The client status service shares the listener (and its client-certificate
        // rules) with ADS, and answers for this replica's streams.
        routes: Routes::new(health_service)
            .add_service(CsdsServer::new(&service))
            .add_service(AdsServer::new(service))
            .prepare(),
        registry: Arc::default(),
        plan,
        seeds: std::collections::hash_map::RandomState::new(),
        next_id: 0,
        tasks: JoinSet::new(),
    };

    server.accept_until(&listener, shutdown).await;
    let (open, ads) = server.registry.counts();
    let delay = drain::drain_delay(ads, config.drain_delay);
    tracing::info!(
        connections = open,
        ads_connections = ads,
        ?delay,
        drain_time = ?config.drain_time,
        "shutting down: serving on for the drain delay, then closing the connections over the drain time"
    );
    // Nothing to redirect once the last ADS connection is gone (its Envoy left).
    let registry = server.registry.clone();
    let delayed = async move {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = registry.no_ads_connection() => {}
        }
    };
    server.accept_until(&listener, delayed).await;
    // Stop accepting (and free the port); the handshakes under way go on.
    drop(listener);

    let plan = DrainPlan::new(
        Instant::now(),
        config.drain_time,
        server.registry.open_ids(),
    );
    let deadline = drain::after(plan.last_close(), config.shutdown_grace);
    tracing::info!(
        connections = plan.connections(),
        drain_time = ?config.drain_time,
        "closing the connections"
    );
    plan_tx.send_replace(Some(Arc::new(plan)));
    // Envoys close their connections once their streams ended; a client that does not
    // (one that stopped reading keeps unsent data in its stream, a health watch) must
    // not hold the shutdown forever.
    loop {
        tokio::select! {
            joined = server.tasks.join_next() => match joined {
                Some(joined) => log_panic(joined),
                None => break,
            },
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    connections = server.tasks.len(),
                    grace = ?config.shutdown_grace,
                    "connections still open after the drain and the shutdown grace period; leaving them"
                );
                break;
            }
        }
    }
    server.tasks.abort_all();
    health_task.abort();
}

/// The accept loop's state: what each connection needs, and the connection tasks.
struct Connections {
    acceptor: tokio_rustls::TlsAcceptor,
    limits: ConnectionLimits,
    /// One per connection held ([`ConnectionLimits::max_connections`]).
    slots: Arc<tokio::sync::Semaphore>,
    /// Bytes of requests being received, all connections together.
    requests: Arc<Budget>,
    /// One per stream open, all connections together ([`ConnectionLimits::max_streams`]).
    streams: Arc<tokio::sync::Semaphore>,
    preface_timeout: Duration,
    max_age: Duration,
    close_grace: Duration,
    routes: Routes,
    registry: Arc<Registry>,
    /// The drain plan, once the drain began.
    plan: watch::Receiver<Option<Arc<DrainPlan>>>,
    /// Per-connection seeds of the max-age jitter: `hash(id)` with this server's random
    /// keys.
    seeds: std::collections::hash_map::RandomState,
    next_id: u64,
    /// One task per accepted connection (handshake, then HTTP/2), aborted when dropped.
    tasks: JoinSet<()>,
}

impl Connections {
    /// Accepts connections ([`marin3r_process::accept`]: `TCP_NODELAY`, failed accepts
    /// retried) until `until` completes.
    async fn accept_until(&mut self, listener: &TcpListener, until: impl Future<Output = ()>) {
        let mut until = std::pin::pin!(until);
        loop {
            // `TCP_NODELAY` there, like every listener's connections.
            let (tcp, peer) = tokio::select! {
                accepted = marin3r_process::accept(listener) => accepted,
                Some(joined) = self.tasks.join_next() => {
                    log_panic(joined);
                    continue;
                }
                () = &mut until => return,
            };
            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                tracing::debug!(
                    %peer,
                    max_connections = self.limits.max_connections,
                    "connection limit reached; connection closed"
                );
                continue;
            };
            self.spawn(tcp, peer, slot);
        }
    }

    /// Serves one accepted connection in a task of its own, holding its `slot`.
    fn spawn(&mut self, tcp: TcpStream, peer: SocketAddr, slot: tokio::sync::OwnedSemaphorePermit) {
        let id = self.next_id;
        self.next_id += 1;
        // Decided at accept time, from a seed of its own.
        let close_by_age = drain::jittered_age(self.max_age, self.seeds.hash_one(id))
            .map(|age| drain::after(Instant::now(), age));
        let conn = Connection {
            id,
            peer,
            acceptor: self.acceptor.clone(),
            preface_timeout: self.preface_timeout,
            close_grace: self.close_grace,
            routes: self.routes.clone(),
            registry: self.registry.clone(),
            plan: self.plan.clone(),
            close_by_age,
            limits: self.limits,
            requests: self.requests.clone(),
            streams: self.streams.clone(),
        };
        self.tasks.spawn(async move {
            conn.serve(tcp).await;
            drop(slot);
        });
    }
}

/// Logs a connection task that panicked (an aborted one is not worth a line).
fn log_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(error = %e, "a connection task panicked");
    }
}

/// One accepted connection.
struct Connection {
    /// Ascending in accept order: the connection's rank in a drain.
    id: u64,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    preface_timeout: Duration,
    /// Once closing, how long the client may take to let its streams end
    /// (`AdsConfig::shutdown_grace`); then the connection is dropped.
    close_grace: Duration,
    routes: Routes,
    registry: Arc<Registry>,
    plan: watch::Receiver<Option<Arc<DrainPlan>>>,
    /// When it reaches its max age (`None`: never).
    close_by_age: Option<Instant>,
    limits: ConnectionLimits,
    /// The server's budget of bytes of requests being received.
    requests: Arc<Budget>,
    /// The server's stream slots.
    streams: Arc<tokio::sync::Semaphore>,
}

impl Connection {
    /// TLS handshake, HTTP/2 preface, then HTTP/2 until the client leaves or the server
    /// closes the connection (max age, drain) and its streams end.
    async fn serve(mut self, tcp: TcpStream) {
        let peer = self.peer;
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::info!(%peer, error = %e, "TLS handshake refused");
                return;
            }
            Err(_) => {
                tracing::info!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let preface_timeout = self.preface_timeout;
        let io = match tokio::time::timeout(preface_timeout, Prefaced::read(tls)).await {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => {
                tracing::info!(%peer, error = %e, "not an HTTP/2 client");
                return;
            }
            Err(_) => {
                tracing::info!(%peer, ?preface_timeout, "no HTTP/2 preface in time");
                return;
            }
        };

        let registered = self.registry.register(self.id);
        let handle = registered.handle().clone();
        let routes = self.routes.clone();
        let limits = self.limits;
        let connection_budget =
            Arc::new(Budget::new(limits.connection_request_bytes, "connection"));
        let server_budget = self.requests.clone();
        let (streams, mut open_streams) = watch::channel(0usize);
        let streams = Arc::new(streams);
        let slots = self.streams.clone();
        let max_streams = limits.max_streams;
        let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
            // Counted until its response ends (the connection's idle time starts when
            // none is left), holding one of the server's stream slots.
            let open = OpenStream::new(streams.clone());
            let slot = slots.clone().try_acquire_owned();
            let mut request = request
                .map(|body| Bounded::new(body, connection_budget.clone(), server_budget.clone()));
            // The ADS streams of this connection follow its close.
            request.extensions_mut().insert(handle.clone());
            let routes = routes.clone();
            async move {
                let Ok(slot) = slot else {
                    let refused = tonic::Status::resource_exhausted(format!(
                        "the server holds its limit of {max_streams} streams; retry later"
                    ))
                    .into_http::<tonic::body::Body>();
                    return Ok(refused.map(|body| Tracked {
                        body,
                        _open: open,
                        _slot: None,
                    }));
                };
                let response = routes.oneshot(request).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                    body,
                    _open: open,
                    _slot: Some(slot),
                }))
            }
        });
        let conn = http2_builder(&limits).serve_connection(TokioIo::new(io), service);
        let mut conn = std::pin::pin!(conn);

        let reason = tokio::select! {
            served = conn.as_mut() => {
                log_connection_end(peer, served);
                return;
            }
            () = sleep_until_opt(self.close_by_age) => CloseReason::MaxAge,
            () = idle(&mut open_streams, limits.idle_timeout) => CloseReason::Idle,
            () = drain_turn(&mut self.plan, self.id) => CloseReason::Shutdown,
        };
        tracing::debug!(%peer, reason = reason.as_str(), "closing the connection");
        // GOAWAY first (queued before any stream's last frames), then the streams end.
        conn.as_mut().graceful_shutdown();
        registered.handle().close(reason);
        // A client that holds a stream open (unsent data it does not take, a health
        // watch) must not keep the connection forever.
        match tokio::time::timeout(self.close_grace, conn).await {
            Ok(served) => log_connection_end(peer, served),
            Err(_) => {
                tracing::info!(%peer, grace = ?self.close_grace, reason = reason.as_str(), "connection still open after its close and the grace period; dropped")
            }
        }
    }
}

/// The HTTP/2 server of one connection, with the listener's bounds: keepalive PINGs,
/// streams per connection, flow-control windows (fixed: no adaptive window), frame and
/// header list sizes (CONTINUATION floods end at the header list limit), and h2's
/// rapid-reset bounds (streams reset by the client before they are served, and by the
/// server for protocol errors, each capped; past them the connection gets a GOAWAY).
fn http2_builder(limits: &ConnectionLimits) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .initial_stream_window_size(limits.stream_window)
        .initial_connection_window_size(limits.connection_window)
        .adaptive_window(false)
        .max_frame_size(MAX_FRAME_BYTES)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS);
    http2
}

/// HTTP/2 `SETTINGS_MAX_FRAME_SIZE` (the protocol's smallest).
const MAX_FRAME_BYTES: u32 = 16 * 1024;
/// HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`: a request's headers, CONTINUATION frames
/// included (gRPC metadata of an Envoy is a few hundred bytes).
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Streams the client reset before the server accepted them, at once (HTTP/2 rapid
/// reset, CVE-2023-44487; hyper's default).
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Streams the server reset for the client's protocol errors before it closes the
/// connection (h2's default).
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// One open stream of a connection, counted in its watch while alive.
struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    fn new(count: Arc<watch::Sender<usize>>) -> Self {
        count.send_modify(|n| *n += 1);
        Self(count)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A response body that keeps its stream counted ([`OpenStream`]) until it is dropped.
struct Tracked<B> {
    body: B,
    _open: OpenStream,
    /// Its slot of [`ConnectionLimits::max_streams`] (none for a refused stream).
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Completes once the connection has had no open stream for `timeout` (never when it
/// is zero).
async fn idle(open: &mut watch::Receiver<usize>, timeout: Duration) {
    if timeout.is_zero() {
        return std::future::pending().await;
    }
    loop {
        if open.wait_for(|n| *n == 0).await.is_err() {
            return std::future::pending().await;
        }
        tokio::select! {
            () = tokio::time::sleep(timeout) => return,
            changed = open.changed() => if changed.is_err() {
                return std::future::pending().await;
            },
        }
    }
}

fn log_connection_end(peer: SocketAddr, served: Result<(), hyper::Error>) {
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Completes when the connection `id`'s turn in the drain comes (never before the drain
/// begins).
async fn drain_turn(plan: &mut watch::Receiver<Option<Arc<DrainPlan>>>, id: u64) {
    let at = match plan.wait_for(Option::is_some).await {
        Ok(plan) => plan.as_ref().map(|p| p.close_at(id)),
        // The server is gone: its tasks are being aborted.
        Err(_) => None,
    };
    sleep_until_opt(at).await;
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sets gRPC health of `""` and the ADS service.
async fn set_health(health: &tonic_health::server::HealthReporter, serving: bool) {
    let status = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    health.set_service_status("", status).await;
    health
        .set_service_status(<AdsServer as tonic::server::NamedService>::NAME, status)
        .await;
}

/// Keeps gRPC health at `ready`. A dropped `ready` sender keeps its last value.
async fn follow_readiness(
    health: tonic_health::server::HealthReporter,
    mut ready: watch::Receiver<bool>,
) {
    loop {
        let serving = *ready.borrow_and_update();
        set_health(&health, serving).await;
        if ready.changed().await.is_err() {
            return;
        }
    }
}
