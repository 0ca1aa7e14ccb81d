//! Every listener of every marin3r process accepts through here: [`accept`] (and
//! [`set_nodelay`] for an acceptor that gets its streams elsewhere, the webhook's
//! HTTPS), and every plain-HTTP listener (probes, metrics, the shutdown manager) is served
//! by [`serve_http`], bounded by [`HttpLimits`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

/// How long the accept loop waits after a failed `accept` (out of file descriptors, say)
/// before it tries again, rather than spinning.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// The smallest read buffer hyper accepts (it panics below).
const MIN_BUF_SIZE: usize = 8192;

/// How long a plain-HTTP client may take to send a request's line and headers, from the
/// moment the server waits for them (a new connection, or the next request on a
/// kept-alive one); then the connection is closed. Their clients (kubelet probes and
/// preStop hooks, Prometheus) send a few hundred bytes at once.
pub const HTTP_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How many connections a plain-HTTP listener holds at once; one more is closed as soon
/// as it is accepted. Sized for the shutdown manager's 32 Mi container: each connection
/// buffers at most [`HTTP_MAX_HEADER_BYTES`], so all of them at most 1 MiB.
pub const HTTP_MAX_CONNECTIONS: usize = 64;
/// The most a plain-HTTP connection buffers of a request's line and headers (hyper's
/// read buffer, 8 KiB at least); a request whose headers do not fit is answered 431 and
/// closed.
pub const HTTP_MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long a plain-HTTP answer may wait for the client to take it (a write that makes
/// no progress); then the connection is closed. A client that stops reading a large
/// answer (`/metrics`) would otherwise hold its connection slot for ever.
pub const HTTP_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds of a plain-HTTP listener against slow, stuck or too many clients (slowloris).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Request line and headers ([`HTTP_HEADER_READ_TIMEOUT`]).
    pub header_read: Duration,
    /// Connections held at once ([`HTTP_MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Bytes of request line and headers ([`HTTP_MAX_HEADER_BYTES`]).
    pub max_header_bytes: usize,
    /// A write waiting for the client ([`HTTP_WRITE_STALL_TIMEOUT`]).
    pub write_stall: Duration,
}

impl HttpLimits {
    /// The limits of every plain-HTTP listener of marin3r.
    pub const DEFAULT: Self = Self {
        header_read: HTTP_HEADER_READ_TIMEOUT,
        max_connections: HTTP_MAX_CONNECTIONS,
        max_header_bytes: HTTP_MAX_HEADER_BYTES,
        write_stall: HTTP_WRITE_STALL_TIMEOUT,
    };
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Sets `TCP_NODELAY` on an accepted stream, so that a small answer is sent at once
/// rather than held back by Nagle's algorithm until the client's delayed ACK (~40 ms on
/// fresh connections). A failure (the peer already gone) is only logged: the connection
/// then fails on its own.
pub fn set_nodelay(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
    }
}

/// Accepts the next connection on `listener`, with [`set_nodelay`]. A failed accept (out
/// of file descriptors, a connection reset while queued) is logged and retried after a
/// short pause, so this only returns a connection.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                set_nodelay(&stream);
                return (stream, peer);
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
            }
        }
    }
}

/// Serves `router` over plain HTTP/1.1 on `listener` until `shutdown` completes, then
/// closes the listener, lets requests in flight finish and closes idle connections;
/// returns once every connection is closed (the caller bounds that wait).
///
/// Bounded by `limits`: a connection that has not sent a request's headers within
/// `limits.header_read` is closed, one over `limits.max_connections` is closed as soon as
/// it is accepted, and headers over `limits.max_header_bytes` are refused. Every
/// connection has [`set_nodelay`] ([`accept`]). If this future is dropped, every
/// connection is dropped with it.
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => accepted,
            Some(_) = connections.join_next() => continue,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(
                %peer,
                max_connections = limits.max_connections,
                "connection limit reached; connection closed"
            );
            continue;
        };
        connections.spawn(serve_connection(
            stream,
            router.clone(),
            limits,
            stopping.clone(),
            slot,
        ));
    }
    drop(listener);
    stop.send_replace(true);
    while connections.join_next().await.is_some() {}
}

/// An accepted stream that holds its slot of a listener's connection limit until it is
/// dropped (for listeners served by another library, like the webhook's axum-server:
/// their acceptor takes a slot with [`ConnectionSlots::take`] and hands this on).
#[derive(Debug)]
pub struct Held<S> {
    stream: S,
    _slot: OwnedSemaphorePermit,
}

impl<S> Held<S> {
    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

/// The slots of a listener's connection limit.
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    max: usize,
}

impl ConnectionSlots {
    /// `max` connections at once.
    pub fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// `stream` holding a slot, or an error (the caller closes it) when none is free.
    pub fn take<S>(&self, stream: S) -> std::io::Result<Held<S>> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => Ok(Held {
                stream,
                _slot: slot,
            }),
            Err(_) => Err(std::io::Error::other(format!(
                "connection limit ({}) reached; connection closed",
                self.max
            ))),
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Held<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Held<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// A stream whose writes fail once one has waited for the peer longer than `timeout`
/// (the client stopped reading): the connection then ends.
struct WriteStall<S> {
    inner: S,
    timeout: Duration,
    /// Since when a write has been waiting, as a timer.
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteStall<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            waiting: None,
        }
    }

    /// `polled` as it is, unless it is pending past the timeout: then an error.
    fn bound<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.waiting = None;
            return polled;
        }
        let timeout = self.timeout;
        let timer = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took no data for the write stall timeout",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteStall<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteStall<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        this.bound(cx, polled)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_flush(cx);
        this.bound(cx, polled)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_shutdown(cx);
        this.bound(cx, polled)
    }
}

/// One connection of [`serve_http`]; holds its `slot` until it is closed.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: HttpLimits,
    mut stopping: watch::Receiver<bool>,
    slot: OwnedSemaphorePermit,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    // Without a timer hyper has no header read timeout at all.
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        // hyper's smallest buffer.
        .max_buf_size(limits.max_header_bytes.max(MIN_BUF_SIZE));
    let stream = WriteStall::new(stream, limits.write_stall);
    let conn = http1.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        served = conn.as_mut() => {
            log_end(served);
            drop(slot);
            return;
        }
        // An error: the server is gone, and this task with it.
        _ = stopping.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    log_end(conn.await);
    drop(slot);
}

fn log_end(served: Result<(), hyper::Error>) {
    if let Err(e) = served {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::net::SocketAddr;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    use super::*;

    /// Guards a socket test that would otherwise hang without the fix; never reached
    /// when the behaviour holds.
    const LONG: Duration = Duration::from_secs(30);

    /// `serve_http` on 127.0.0.1 port 0 with `limits`, serving `/healthz`.
    async fn start(limits: HttpLimits) -> (SocketAddr, oneshot::Sender<()>, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/healthz", get(|| async { "ok" }));
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, router, limits, async move {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    /// Reads until the server closes the connection; what it sent meanwhile.
    async fn read_until_closed(conn: &mut TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        match conn.read_to_end(&mut got).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("reading: {e}"),
        }
        got
    }

    /// `GET /healthz` on `conn`; the status line of the answer.
    async fn healthz(conn: &mut TcpStream) -> String {
        conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = tokio::time::timeout(LONG, read_until_closed(conn))
            .await
            .expect("no answer");
        String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    /// The idle bound of a plain-HTTP connection: once its answer is sent, a kept-alive
    /// connection that sends no next request is closed after the header read timeout
    /// (it runs from the moment the server waits for the next request), so an idle
    /// client holds a slot for at most that long.
    #[tokio::test]
    async fn kept_alive_connections_are_closed_once_idle_for_the_header_timeout() {
        let limits = HttpLimits {
            header_read: Duration::from_millis(300),
            ..HttpLimits::DEFAULT
        };
        let (addr, _stop, _server) = start(limits).await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answered = Instant::now();
        let rest = tokio::time::timeout(LONG, read_until_closed(&mut conn))
            .await
            .expect("the idle kept-alive connection was not closed");
        let text = String::from_utf8_lossy(&rest);
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(!text.contains("connection: close"), "kept alive: {text}");
        assert!(answered.elapsed() >= limits.header_read);
    }

    #[tokio::test]
    async fn accepted_streams_have_tcp_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = accept(&listener).await;
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(stream.nodelay().unwrap());
    }

    /// The socket `serve_http` accepted (seen from the server's side) has `TCP_NODELAY`.
    #[tokio::test]
    async fn served_connections_have_tcp_nodelay() {
        let (addr, _stop, _server) = start(HttpLimits::DEFAULT).await;
        let conn = TcpStream::connect(addr).await.unwrap();
        assert!(
            marin3r_testkit::sockets::server_side_nodelay(addr, conn.local_addr().unwrap()).await
        );
    }

    /// Silent, and headers trickled and never finished: both closed once the header read
    /// timeout passed from the connection's start, not before.
    #[tokio::test(start_paused = true)]
    async fn connections_that_never_finish_their_headers_are_closed_after_the_timeout() {
        let (addr, _stop, _server) = start(HttpLimits::DEFAULT).await;
        let started = Instant::now();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        partial.write_all(b"host: x\r\n").await.unwrap();
        for conn in [&mut silent, &mut partial] {
            let answer = tokio::time::timeout(LONG, read_until_closed(conn))
                .await
                .expect("the connection was not closed");
            assert_eq!(answer, b"", "no answer to a request never sent");
            assert!(started.elapsed() >= HTTP_HEADER_READ_TIMEOUT);
        }
        assert!(started.elapsed() < HTTP_HEADER_READ_TIMEOUT + Duration::from_secs(1));
        // The server goes on serving.
        let mut conn = TcpStream::connect(addr).await.unwrap();
        assert_eq!(healthz(&mut conn).await, "HTTP/1.1 200 OK");
    }

    /// A client that asks for a large answer and never reads it holds its connection
    /// only until the write stall timeout: with one slot, the next client is served
    /// afterwards.
    #[tokio::test]
    async fn a_client_that_stops_reading_is_closed_after_the_write_stall_timeout() {
        let limits = HttpLimits {
            max_connections: 1,
            write_stall: Duration::from_millis(300),
            ..HttpLimits::DEFAULT
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let big = "x".repeat(32 * 1024 * 1024);
        let router = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/big", get(move || std::future::ready(big.clone())));
        let server = tokio::spawn(serve_http(listener, router, limits, std::future::pending()));
        let mut stuck = TcpStream::connect(addr).await.unwrap();
        stuck
            .write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let stalled = Instant::now();
        marin3r_testkit::wait_until_async("served after the stalled one", LONG, || async {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            healthz(&mut conn).await == "HTTP/1.1 200 OK"
        })
        .await;
        assert!(stalled.elapsed() >= limits.write_stall);
        drop(stuck);
        server.abort();
    }

    /// Below the limit a request is served while other connections are held; at the limit
    /// a new connection is closed at once (by then the held ones still wait for their
    /// headers for an hour); once one of them closes, requests are served again.
    #[tokio::test]
    async fn beyond_the_limit_new_connections_are_closed_at_once() {
        let limits = HttpLimits {
            header_read: Duration::from_secs(3600),
            max_connections: 3,
            ..HttpLimits::DEFAULT
        };
        let (addr, _stop, _server) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut below = TcpStream::connect(addr).await.unwrap();
        assert_eq!(healthz(&mut below).await, "HTTP/1.1 200 OK");

        held.push(TcpStream::connect(addr).await.unwrap());
        // Accepted in order: by the time this one is, the three held ones hold the slots.
        let mut over = TcpStream::connect(addr).await.unwrap();
        over.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = tokio::time::timeout(LONG, read_until_closed(&mut over))
            .await
            .expect("a connection over the limit was kept");
        assert_eq!(answer, b"", "served over the limit");

        drop(held.pop());
        marin3r_testkit::wait_until_async("served below the limit again", LONG, || async {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            healthz(&mut conn).await == "HTTP/1.1 200 OK"
        })
        .await;
    }

    /// Headers over the limit are refused at once (431, unless the close outran it), not
    /// buffered until the header read timeout.
    #[tokio::test(start_paused = true)]
    async fn headers_over_the_limit_are_refused_at_once() {
        let (addr, _stop, _server) = start(HttpLimits::DEFAULT).await;
        let started = Instant::now();
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let big = format!("GET /healthz HTTP/1.1\r\nx: {}\r\n", "a".repeat(64 * 1024));
        // The server may close before it read everything.
        let _ = conn.write_all(big.as_bytes()).await;
        let answer = tokio::time::timeout(LONG, read_until_closed(&mut conn))
            .await
            .expect("not closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        assert!(started.elapsed() < HTTP_HEADER_READ_TIMEOUT, "buffered");
    }

    /// On shutdown the listener closes, an idle connection is closed, and the server
    /// returns.
    #[tokio::test]
    async fn shutdown_closes_the_listener_and_idle_connections() {
        let (addr, stop, server) = start(HttpLimits::DEFAULT).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 15];
        idle.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200 OK");
        stop.send(()).unwrap();
        tokio::time::timeout(LONG, server).await.unwrap().unwrap();
        let _ = tokio::time::timeout(LONG, read_until_closed(&mut idle))
            .await
            .expect("the idle connection was kept");
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }
}
