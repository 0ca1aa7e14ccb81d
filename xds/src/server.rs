//! The thin async shell over the ADS state machines: a tonic `AggregatedDiscoveryService`
//! (SotW and Delta) plus `grpc.health.v1`, served over mTLS from a reloading rustls
//! config. Each stream task only `select!`s between "request arrived", "snapshot changed"
//! and "a NACK backoff expired"; every protocol decision is in [`crate::sotw`] and
//! [`crate::delta`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt as _};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use crate::grpc::AdsServer;

use crate::resource::ResourceType;
use crate::snapshot::{Snapshot, SnapshotCache};
use crate::sotw::{AdsConfig, Outcome};
use crate::stats::{Api, NodeInfo, SharedStats, StreamCounters};
use crate::{DeltaStream, SotwStream};

/// TLS handshakes that take longer are dropped (slow or stuck clients).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses buffered per stream before the stream task waits for the client.
const STREAM_BUFFER: usize = 16;

/// What the stream task hands to tonic. Boxed: tokio's `mpsc` allocates its slots in
/// blocks of 32 when the channel is created, so an unboxed `Result<DiscoveryResponse,
/// Status>` (≈ 150 bytes) cost every idle stream ≈ 4.8 KiB; boxed it is 32 pointers.
type Item<R> = Box<Result<R, Status>>;

/// One ADS flavour (SotW or Delta) as the shell sees it.
trait Protocol: Send + 'static {
    type Req: Send + 'static;
    type Resp: Send + 'static;
    const API: Api;
    fn node_of(req: &Self::Req) -> Option<&Node>;
    fn type_of(resp: &Self::Resp) -> Option<ResourceType>;
    fn observe_node(&mut self, node: Option<&Node>) -> Option<NodeInfo>;
    fn handle_request(&mut self, req: Self::Req, s: &Snapshot, now: Instant)
    -> Outcome<Self::Resp>;
    fn handle_snapshot(&mut self, s: &Snapshot, now: Instant) -> Outcome<Self::Resp>;
    fn poll_timers(&mut self, s: &Snapshot, now: Instant) -> Outcome<Self::Resp>;
    fn next_timer(&self) -> Option<Instant>;
}

impl Protocol for SotwStream {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    const API: Api = Api::Sotw;
    fn node_of(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_of(resp: &DiscoveryResponse) -> Option<ResourceType> {
        ResourceType::from_type_url(&resp.type_url)
    }
    fn observe_node(&mut self, node: Option<&Node>) -> Option<NodeInfo> {
        SotwStream::observe_node(self, node).cloned()
    }
    fn handle_request(
        &mut self,
        req: DiscoveryRequest,
        s: &Snapshot,
        now: Instant,
    ) -> Outcome<DiscoveryResponse> {
        SotwStream::handle_request(self, req, s, now)
    }
    fn handle_snapshot(&mut self, s: &Snapshot, now: Instant) -> Outcome<DiscoveryResponse> {
        SotwStream::handle_snapshot(self, s, now)
    }
    fn poll_timers(&mut self, s: &Snapshot, now: Instant) -> Outcome<DiscoveryResponse> {
        SotwStream::poll_timers(self, s, now)
    }
    fn next_timer(&self) -> Option<Instant> {
        SotwStream::next_timer(self)
    }
}

impl Protocol for DeltaStream {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    const API: Api = Api::Delta;
    fn node_of(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_of(resp: &DeltaDiscoveryResponse) -> Option<ResourceType> {
        ResourceType::from_type_url(&resp.type_url)
    }
    fn observe_node(&mut self, node: Option<&Node>) -> Option<NodeInfo> {
        DeltaStream::observe_node(self, node).cloned()
    }
    fn handle_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        s: &Snapshot,
        now: Instant,
    ) -> Outcome<DeltaDiscoveryResponse> {
        DeltaStream::handle_request(self, req, s, now)
    }
    fn handle_snapshot(&mut self, s: &Snapshot, now: Instant) -> Outcome<DeltaDiscoveryResponse> {
        DeltaStream::handle_snapshot(self, s, now)
    }
    fn poll_timers(&mut self, s: &Snapshot, now: Instant) -> Outcome<DeltaDiscoveryResponse> {
        DeltaStream::poll_timers(self, s, now)
    }
    fn next_timer(&self) -> Option<Instant> {
        DeltaStream::next_timer(self)
    }
}

/// The ADS service: snapshots come from the cache, ACK/NACKs go to the stats.
#[derive(Debug, Clone)]
pub struct AdsService {
    cache: SnapshotCache,
    stats: SharedStats,
    config: AdsConfig,
    /// Becomes `true` when the server shuts down: every stream then ends, so the
    /// graceful stop does not wait forever for streams that never end by themselves.
    stopping: watch::Receiver<bool>,
}

impl AdsService {
    pub fn new(cache: SnapshotCache, stats: SharedStats, config: AdsConfig) -> Self {
        Self {
            cache,
            stats,
            config,
            stopping: watch::channel(false).1,
        }
    }

    /// The tonic service (the generated ADS routes with a codec that keeps small
    /// per-stream buffers, see [`AdsServer`]).
    pub fn into_server(self) -> AdsServer {
        AdsServer::new(self)
    }

    fn spawn_stream<P: Protocol>(
        &self,
        mut proto: P,
        mut inbound: Streaming<P::Req>,
    ) -> BoxStream<P::Resp> {
        let (tx, rx) = mpsc::channel::<Item<P::Resp>>(STREAM_BUFFER);
        let cache = self.cache.clone();
        let stats = self.stats.clone();
        let send_timeout = self.config.stream_send_timeout;
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            let mut node: Option<NodeInfo> = None;
            let mut counters = StreamCounters::default();
            let mut snapshots: Option<watch::Receiver<Arc<Snapshot>>> = None;
            let empty = Arc::new(Snapshot::empty());
            let current = |rx: &Option<watch::Receiver<Arc<Snapshot>>>| {
                rx.as_ref()
                    .map_or_else(|| empty.clone(), |r| r.borrow().clone())
            };
            'stream: loop {
                let timer = proto.next_timer();
                let outcome = tokio::select! {
                    () = shutting_down(&mut stopping) => {
                        let _ = tx.try_send(Box::new(Err(Status::unavailable("the discovery service is shutting down"))));
                        break;
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => {
                            if node.is_none()
                                && let Some(info) = proto.observe_node(P::node_of(&req))
                            {
                                stats.stream_opened(&info, P::API);
                                tracing::info!(node_id = %info.id, pod_name = %info.pod_name, api = P::API.as_str(), "stream opened");
                                snapshots = Some(cache.subscribe(&info.id));
                                node = Some(info);
                            }
                            let snap = current(&snapshots);
                            proto.handle_request(req, &snap, Instant::now())
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(code = ?status.code(), message = status.message(), "stream ended with error");
                            break;
                        }
                    },
                    changed = async {
                        match snapshots.as_mut() {
                            Some(rx) => rx.changed().await.is_ok(),
                            None => std::future::pending().await,
                        }
                    } => {
                        if !changed {
                            break;
                        }
                        let snap = snapshots.as_mut().map_or_else(|| empty.clone(), |rx| rx.borrow_and_update().clone());
                        let out = proto.handle_snapshot(&snap, Instant::now());
                        if let Some(published) = snap.published_at() {
                            let latency = published.elapsed();
                            for r in &out.responses {
                                if let Some(t) = P::type_of(r) {
                                    stats.observe_push_latency(t, latency);
                                }
                            }
                        }
                        out
                    },
                    () = sleep_until_opt(timer) => {
                        let snap = current(&snapshots);
                        proto.poll_timers(&snap, Instant::now())
                    },
                };
                stats.record_stream(node.as_ref(), &mut counters, &outcome.events);
                for response in outcome.responses {
                    let sent = tokio::select! {
                        sent = tx.send_timeout(Box::new(Ok(response)), send_timeout) => sent,
                        () = shutting_down(&mut stopping) => break 'stream,
                    };
                    match sent {
                        Ok(()) => {}
                        Err(mpsc::error::SendTimeoutError::Closed(_)) => break 'stream,
                        Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                            let (node_id, pod_name) = node
                                .as_ref()
                                .map_or(("", ""), |n| (n.id.as_str(), n.pod_name.as_str()));
                            tracing::warn!(%node_id, %pod_name, api = P::API.as_str(), timeout = ?send_timeout, "client does not read its stream; closing it");
                            break 'stream;
                        }
                    }
                }
            }
            if let Some(info) = &node {
                stats.stream_closed(info, P::API);
                tracing::info!(node_id = %info.id, pod_name = %info.pod_name, api = P::API.as_str(), "stream closed");
            }
        });
        Box::pin(ReceiverStream::new(rx).map(|item| *item))
    }
}

/// Completes once `stopping` is `true`; never if its sender is gone before that.
async fn shutting_down(stopping: &mut watch::Receiver<bool>) {
    if stopping.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let stream = self.spawn_stream(SotwStream::new(self.config.clone()), request.into_inner());
        Ok(Response::new(stream))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let stream = self.spawn_stream(DeltaStream::new(self.config.clone()), request.into_inner());
        Ok(Response::new(stream))
    }
}

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
/// On `shutdown` the listener is closed, every open stream ends with `UNAVAILABLE` (Envoy
/// reconnects, to this address's next server) and the server returns once the
/// connections are closed, or after [`AdsConfig::shutdown_grace`] at the latest.
pub async fn serve_ads(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    mut service: AdsService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = watch::channel(false);
    service.stopping = stop_rx.clone();
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let preface_timeout = service.config.preface_timeout;
    let (conn_tx, conn_rx) = mpsc::channel::<Result<_, std::io::Error>>(64);
    let mut stopping = stop_rx;
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
    health.set_serving::<AdsServer>().await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let grace = service.config.shutdown_grace;
    let mut stopped = service.stopping.clone();
    let serve = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), shutdown);
    // Envoys close their connections once their streams ended; a client that does not
    // (one that stopped reading keeps unsent data in its stream) must not hold the
    // shutdown forever.
    let result = tokio::select! {
        result = serve => result,
        () = async {
            shutting_down(&mut stopped).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "connections still open after the shutdown grace period; leaving them");
            Ok(())
        }
    };
    accept_loop.abort();
    result
}
