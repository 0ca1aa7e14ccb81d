//! The transport of the xDS server: [`serve_ads`] serves [`AdsService`] (through the
//! hand-written routes of [`crate::grpc`]) and `grpc.health.v1` over mTLS from a
//! reloading rustls config, with bounded handshakes and HTTP/2 prefaces.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

pub use crate::grpc::AdsServer;
pub use crate::service::AdsService;
use crate::service::shutting_down;

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

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Prefaced<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Serves ADS and gRPC health on `listener` over mTLS until `shutdown` completes.
///
/// Handshakes run concurrently (one slow client does not hold up the others) and are
/// bounded by [`HANDSHAKE_TIMEOUT`], then the HTTP/2 preface by
/// [`AdsConfig::preface_timeout`]; the rustls config re-reads its certificate and CA
/// files when they change, so rotation needs no restart and open streams are untouched.
///
/// gRPC health (`""` and the ADS service) says `SERVING` while `ready` is `true`,
/// `NOT_SERVING` otherwise (ADS streams are served either way: a node without a
/// published snapshot is held). `ready` is the process's readiness, already computed
/// (`marin3r_process::Readiness`: synced and not stopping); the caller turns it off
/// when the shutdown begins.
///
/// On `shutdown` the listener is closed, no new stream is
/// accepted (`UNAVAILABLE`), and the open streams are closed spread over
/// [`AdsConfig::drain_time`] ([`crate::drain`]), each with `UNAVAILABLE`
/// "[`SHUTTING_DOWN`](crate::drain::SHUTTING_DOWN)" (Envoy keeps its config and
/// reconnects, to another replica). The server returns once the connections are
/// closed, or [`AdsConfig::shutdown_grace`] after the last stream closed (at the end of
/// the drain window at the latest).
pub async fn serve_ads(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    mut service: AdsService,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = watch::channel(false);
    service.stopping = stop_rx.clone();
    let drain = service.drain.clone();
    let shutdown = async move {
        shutdown.await;
        drain.begin(tokio::time::Instant::now());
        let _ = stop_tx.send(true);
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let preface_timeout = service.config.preface_timeout;
    let (conn_tx, conn_rx) = mpsc::channel::<Result<_, std::io::Error>>(64);
    let mut stopping = stop_rx.clone();
    let accept_loop = tokio::spawn(async move {
        loop {
            // Stop accepting (and free the port) as soon as the shutdown begins.
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = shutting_down(&mut stopping) => break,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = conn_tx.clone();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
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
                match tokio::time::timeout(preface_timeout, Prefaced::read(tls)).await {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "not an HTTP/2 client"),
                    Err(_) => tracing::info!(%peer, ?preface_timeout, "no HTTP/2 preface in time"),
                }
            });
        }
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, false).await;
    let health_task = tokio::spawn(follow_readiness(health, ready));

    let grace = service.config.shutdown_grace;
    let window = service.config.drain_time;
    let drain = service.drain.clone();
    let mut stopped = service.stopping.clone();
    let serve = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(AdsServer::new(service))
        .serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), shutdown);
    // Envoys close their connections once their streams ended; a client that does not
    // (one that stopped reading keeps unsent data in its stream) must not hold the
    // shutdown forever.
    let result = tokio::select! {
        result = serve => result,
        () = async {
            shutting_down(&mut stopped).await;
            // Every stream is closed by the end of the window (earlier if they all are).
            let _ = tokio::time::timeout(window, drain.all_closed()).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "connections still open after the drain and the shutdown grace period; leaving them");
            Ok(())
        }
    };
    accept_loop.abort();
    health_task.abort();
    result
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
