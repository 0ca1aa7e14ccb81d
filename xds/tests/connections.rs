//! The ADS server's connection lifecycle over real sockets (mTLS on 127.0.0.1), with
//! an HTTP/2 client that shows what the server sends on the wire (hyper's client: its
//! connection ends `Ok` only after a GOAWAY, an `Err` when the socket just closes) and a
//! tonic client for what a real gRPC client does with it:
//!
//! - a connection that reaches its max age gets a GOAWAY and its ADS stream ends with
//!   `UNAVAILABLE`; the client reconnects on a new connection, behind a Service to
//!   another replica;
//! - on shutdown the server serves on (a new connection is accepted and served) during
//!   the drain delay, then closes the connections one by one over the drain window, in
//!   accept order, each with a GOAWAY and its streams ended with `UNAVAILABLE`;
//! - with no ADS connection open, the shutdown does not wait for the delay (paused
//!   clock).
//!
//! Socket tests run on the real clock and assert orders and lower bounds, never how
//! fast the machine is.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::attack::{Pki, pki};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use marin3r_envoyconfig::resource::fnv1a64;
use marin3r_xds::drain::{MAX_AGE_REACHED, SHUTTING_DOWN};
use marin3r_xds::server::{AdsService, serve_ads};
use marin3r_xds::{
    AdsConfig, NodeInfo, Resource, ResourceType, SharedStats, Snapshot, SnapshotCache,
};
use prost::Message as _;
use prost_types::Any;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

const NODE: &str = "connections";
const LISTENER: ResourceType = ResourceType::Listener;
/// How long a condition may take on a loaded machine (never reached when it holds).
const LONG: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------------- server

fn snapshot(version: u64) -> Snapshot {
    let value = format!("listener version {version}").into_bytes();
    Snapshot::new(vec![Resource {
        kind: LISTENER,
        name: "http".into(),
        digest: fnv1a64(&value),
        body: Any {
            type_url: LISTENER.type_url().into(),
            value,
        },
    }])
    .unwrap()
}

/// A running `serve_ads`.
struct Server {
    addr: SocketAddr,
    cache: SnapshotCache,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(pki: &Pki, config: AdsConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cache = SnapshotCache::new();
        cache.set(NODE, snapshot(1));
        let service = AdsService::new(cache.clone(), SharedStats::new(), config);
        let (stop, stopped) = oneshot::channel::<()>();
        let (_ready, ready) = watch::channel(true);
        let task = tokio::spawn(serve_ads(
            listener,
            pki.server_config(),
            service,
            ready,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            cache,
            stop: Some(stop),
            task,
        }
    }

    fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ------------------------------------------------------------ HTTP/2 (hyper) client

type RequestBody = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// One HTTP/2 connection: `ended` resolves when it closes, `Ok` only after the server's
/// GOAWAY (hyper's client reports a socket closed without one as an error).
struct H2 {
    send: hyper::client::conn::http2::SendRequest<RequestBody>,
    ended: JoinHandle<Result<(), hyper::Error>>,
}

async fn connect(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Result<H2, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    Ok(H2 {
        send,
        ended: tokio::spawn(conn),
    })
}

/// One SotW ADS stream over an [`H2`] connection, read by hand: gRPC messages, then the
/// trailers' status.
struct AdsCall {
    /// Keeps the request side open.
    _requests: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    body: hyper::body::Incoming,
    buf: BytesMut,
}

/// What the server said last on a stream.
#[derive(Debug)]
enum Next {
    Response(DiscoveryResponse),
    /// `(grpc-status, grpc-message)` from the trailers (or trailers-only headers).
    Status(i32, String),
}

fn grpc_frame(request: &DiscoveryRequest) -> Bytes {
    let body = request.encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + body.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(body.len()).unwrap());
    frame.put_slice(&body);
    frame.freeze()
}

fn subscribe(pod: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(
            NodeInfo {
                id: NODE.into(),
                pod_name: pod.into(),
            }
            .to_node(),
        ),
        type_url: LISTENER.type_url().into(),
        ..Default::default()
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<(i32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    Some((code, message))
}

/// `grpc-message` is percent-encoded (the gRPC HTTP/2 protocol spec).
fn percent_decode(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        let hex = || -> Option<u8> {
            let pair = [bytes.clone().next()?, bytes.clone().nth(1)?];
            u8::from_str_radix(std::str::from_utf8(&pair).ok()?, 16).ok()
        };
        match (b, hex()) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                bytes.nth(1);
            }
            _ => out.push(b),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl H2 {
    /// Opens an ADS (SotW) stream subscribing `pod` to listeners.
    async fn ads(&mut self, pod: &str) -> Result<AdsCall, String> {
        let (tx, rx) = mpsc::channel(8);
        tx.send(Ok(Frame::data(grpc_frame(&subscribe(pod)))))
            .await
            .unwrap();
        let request = http::Request::post(
            "https://localhost/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        )
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(ReceiverStream::new(rx)))
        .unwrap();
        self.send
            .ready()
            .await
            .map_err(|e| format!("connection not ready: {e}"))?;
        let response = self
            .send
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let (parts, body) = response.into_parts();
        if let Some((code, message)) = status_of(&parts.headers) {
            return Err(format!("refused: {code} {message}"));
        }
        Ok(AdsCall {
            _requests: tx,
            body,
            buf: BytesMut::new(),
        })
    }
}

impl AdsCall {
    async fn next(&mut self) -> Result<Next, String> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let message = self.buf.split_to(len);
                    return DiscoveryResponse::decode(message.freeze())
                        .map(Next::Response)
                        .map_err(|e| format!("decode: {e}"));
                }
            }
            let frame = match self.body.frame().await {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Err(format!("body: {e}")),
                None => return Err("the stream ended without trailers".into()),
            };
            match frame.into_data() {
                Ok(data) => self.buf.extend_from_slice(&data),
                Err(frame) => {
                    let trailers = frame.into_trailers().map_err(|_| "an unknown frame")?;
                    let (code, message) = status_of(&trailers).ok_or("trailers without status")?;
                    return Ok(Next::Status(code, message));
                }
            }
        }
    }

    async fn response(&mut self) -> DiscoveryResponse {
        match tokio::time::timeout(LONG, self.next()).await.unwrap() {
            Ok(Next::Response(r)) => r,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    /// The status the stream ends with (responses before it are skipped).
    async fn end(&mut self) -> (i32, String) {
        loop {
            match tokio::time::timeout(LONG, self.next()).await.unwrap() {
                Ok(Next::Response(_)) => {}
                Ok(Next::Status(code, message)) => return (code, message),
                Err(e) => panic!("the stream broke instead of ending: {e}"),
            }
        }
    }
}

/// gRPC `UNAVAILABLE`.
const UNAVAILABLE: i32 = 14;

/// Waits for the connection to close and checks it closed after a GOAWAY.
async fn closed_with_goaway(h2: H2, what: &str) {
    let ended = tokio::time::timeout(LONG, h2.ended)
        .await
        .unwrap_or_else(|_| panic!("{what}: the connection stayed open"))
        .unwrap();
    assert!(
        ended.is_ok(),
        "{what}: the connection closed without a GOAWAY: {ended:?}"
    );
}

// ------------------------------------------------------------------------ max age

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_its_max_age_gets_a_goaway_and_its_stream_ends_unavailable() {
    let pki = pki();
    let max_age = Duration::from_secs(1);
    let server = Server::start(
        &pki,
        AdsConfig {
            max_connection_age: max_age,
            ..AdsConfig::default()
        },
    )
    .await;
    let connected = Instant::now();
    let mut h2 = connect(server.addr, pki.client_config()).await.unwrap();
    let mut call = h2.ads("pod-a").await.unwrap();
    assert_eq!(
        call.response().await.version_info,
        snapshot(1).version(LISTENER)
    );

    // At its age (1 s − 10 % at the earliest) the stream ends, UNAVAILABLE...
    let (code, message) = call.end().await;
    let age = connected.elapsed();
    assert_eq!((code, message.as_str()), (UNAVAILABLE, MAX_AGE_REACHED));
    assert!(age >= max_age * 9 / 10, "closed after {age:?}");
    // ...the connection got a GOAWAY and closes once its stream is over...
    closed_with_goaway(h2, "max age").await;

    // ...and the client carries on over a new connection.
    let mut again = connect(server.addr, pki.client_config()).await.unwrap();
    let mut call = again.ads("pod-a").await.unwrap();
    assert_eq!(
        call.response().await.version_info,
        snapshot(1).version(LISTENER)
    );
}

/// A TCP round-robin balancer over `backends` (a Kubernetes Service), counting the
/// connections it accepted.
async fn balancer(backends: Vec<SocketAddr>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let backend = backends[count.fetch_add(1, Ordering::SeqCst) % backends.len()];
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_age_a_grpc_client_behind_a_service_reconnects_to_another_replica() {
    let pki = pki();
    let replica = |id: &str| AdsConfig {
        max_connection_age: Duration::from_secs(1),
        control_plane_id: Some(id.into()),
        ..AdsConfig::default()
    };
    let a = Server::start(&pki, replica("replica-a")).await;
    let b = Server::start(&pki, replica("replica-b")).await;
    let (service, accepted) = balancer(vec![a.addr, b.addr]).await;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            &pki.bundle.ca.cert_pem,
        ))
        .identity(tonic::transport::Identity::from_pem(
            &pki.bundle.client.cert_pem,
            &pki.bundle.client.key_pem,
        ))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{service}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let open = |client: &mut AggregatedDiscoveryServiceClient<_>| {
        let mut client = client.clone();
        async move {
            let (tx, rx) = mpsc::channel(8);
            tx.send(subscribe("pod-a")).await.unwrap();
            let stream = client
                .stream_aggregated_resources(ReceiverStream::new(rx))
                .await?
                .into_inner();
            Ok::<_, tonic::Status>((tx, stream))
        }
    };
    let served_by = |r: &DiscoveryResponse| r.control_plane.clone().unwrap().identifier;

    let (_tx, mut stream) = open(&mut client).await.unwrap();
    let first = stream.message().await.unwrap().unwrap();
    let replica = served_by(&first);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    let end = tokio::time::timeout(LONG, stream.message()).await.unwrap();
    let status = end.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, MAX_AGE_REACHED)
    );

    // The client opens its next stream as Envoy does (retrying while the channel
    // reconnects): over a new connection, which the Service sends to the other replica.
    let deadline = Instant::now() + LONG;
    let (_tx, mut stream) = loop {
        match open(&mut client).await {
            Ok(opened) => break opened,
            Err(e) if Instant::now() < deadline => {
                eprintln!("retrying: {e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no new stream: {e:?}"),
        }
    };
    let next = stream.message().await.unwrap().unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the new stream went over a new connection"
    );
    assert_ne!(served_by(&next), replica, "served by the other replica");
    assert_eq!(next.version_info, first.version_info, "the same config");
    drop((a, b));
}

// --------------------------------------------------------------------------- drain

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_serves_on_for_the_drain_delay_then_closes_the_connections_one_by_one() {
    let pki = pki();
    let delay = Duration::from_secs(2);
    let window = Duration::from_secs(3);
    let mut server = Server::start(
        &pki,
        AdsConfig {
            drain_delay: delay,
            drain_time: window,
            max_connection_age: Duration::ZERO,
            ..AdsConfig::default()
        },
    )
    .await;
    let mut first = connect(server.addr, pki.client_config()).await.unwrap();
    let mut first_call = first.ads("pod-a").await.unwrap();
    first_call.response().await;
    let mut second = connect(server.addr, pki.client_config()).await.unwrap();
    let mut second_call = second.ads("pod-b").await.unwrap();
    second_call.response().await;

    let signalled = Instant::now();
    server.signal_stop();

    // During the delay the server serves fully: a new connection is accepted and
    // served, and the open streams still get pushes.
    let mut third = connect(server.addr, pki.client_config()).await.unwrap();
    let mut third_call = third.ads("pod-c").await.unwrap();
    third_call.response().await;
    server.cache.set(NODE, snapshot(2));
    for call in [&mut first_call, &mut second_call, &mut third_call] {
        assert_eq!(
            call.response().await.version_info,
            snapshot(2).version(LISTENER)
        );
    }
    assert!(
        signalled.elapsed() < delay,
        "the test took longer than the delay to check it (a slow machine): {:?}",
        signalled.elapsed()
    );

    // Then the three connections close in accept order, spread over the window
    // (0, 1 s and 2 s after it began), each ending its stream and sending a GOAWAY.
    let mut ends = Vec::new();
    for (call, name) in [
        (&mut first_call, "first"),
        (&mut second_call, "second"),
        (&mut third_call, "third"),
    ] {
        let (code, message) = call.end().await;
        assert_eq!(
            (code, message.as_str()),
            (UNAVAILABLE, SHUTTING_DOWN),
            "{name}"
        );
        ends.push(signalled.elapsed());
    }
    eprintln!("streams ended {ends:?} after the signal");
    assert!(
        ends[0] >= delay,
        "the drain began before the delay: {ends:?}"
    );
    assert!(
        ends[2] - ends[0] >= window / 3,
        "the closes are not spread over the window: {ends:?}"
    );
    for (h2, name) in [(first, "first"), (second, "second"), (third, "third")] {
        closed_with_goaway(h2, name).await;
    }
    // The listener is closed once the drain began, and the server returns by itself.
    assert!(connect(server.addr, pki.client_config()).await.is_err());
    tokio::time::timeout(LONG, &mut server.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_a_connection_end_together_with_it() {
    // Two streams on one connection (a client that multiplexes): both end when the
    // connection's turn comes, and the connection's GOAWAY follows.
    let pki = pki();
    let mut server = Server::start(
        &pki,
        AdsConfig {
            drain_delay: Duration::from_millis(200),
            drain_time: Duration::ZERO,
            max_connection_age: Duration::ZERO,
            ..AdsConfig::default()
        },
    )
    .await;
    let mut h2 = connect(server.addr, pki.client_config()).await.unwrap();
    let mut one = h2.ads("pod-a").await.unwrap();
    let mut two = h2.ads("pod-b").await.unwrap();
    one.response().await;
    two.response().await;
    server.signal_stop();
    for call in [&mut one, &mut two] {
        let (code, message) = call.end().await;
        assert_eq!((code, message.as_str()), (UNAVAILABLE, SHUTTING_DOWN));
    }
    closed_with_goaway(h2, "multiplexed").await;
    tokio::time::timeout(LONG, &mut server.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_an_ads_connection_the_shutdown_does_not_wait_for_the_delay() {
    let pki = pki();
    let delay = Duration::from_secs(3600);
    let mut server = Server::start(
        &pki,
        AdsConfig {
            drain_delay: delay,
            ..AdsConfig::default()
        },
    )
    .await;
    tokio::task::yield_now().await;
    let signalled = Instant::now();
    server.signal_stop();
    (&mut server.task).await.unwrap();
    // The paused clock jumps over any timer the server waits on: had it waited for the
    // delay (or the drain window, or the grace), the virtual time would show it.
    assert_eq!(signalled.elapsed(), Duration::ZERO);
}
