//! The attacker's side of the ADS listener tests (`limits.rs`, `attack_memory.rs`):
//! a server on 127.0.0.1 with given `ConnectionLimits`, raw HTTP/2 frames over mTLS,
//! and hyper's HTTP/2 client for requests sent in parts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use marin3r_envoyconfig::resource::fnv1a64;
use marin3r_xds::limits::ConnectionLimits;
use marin3r_xds::server::{AdsService, serve_ads};
use marin3r_xds::{
    AdsConfig, NodeInfo, Resource, ResourceType, SharedStats, Snapshot, SnapshotCache,
};
use prost::Message as _;
use prost_types::Any;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

pub const NODE: &str = "limits";
pub const LISTENER: ResourceType = ResourceType::Listener;
/// How long a condition may take on a loaded machine (never reached when it holds).
pub const LONG: Duration = Duration::from_secs(30);
pub const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

// ------------------------------------------------------------------------- server

/// Certificates for `localhost` and `127.0.0.1`, and the client's (the limits tests and
/// `connections.rs`).
pub struct Pki {
    dir: tempfile::TempDir,
    pub bundle: marin3r_certs::Bundle,
}

pub fn pki() -> Pki {
    let bundle = marin3r_certs::issue(&marin3r_certs::IssueOptions {
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    bundle.write_to(dir.path()).unwrap();
    Pki { dir, bundle }
}

impl Pki {
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let d: &Path = self.dir.path();
        marin3r_certs::mtls_server_config(
            d.join("server/tls.crt"),
            d.join("server/tls.key"),
            d.join("ca/ca.crt"),
            &[b"h2"],
        )
        .unwrap()
    }

    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        marin3r_testkit::tls::client_config(&self.bundle.ca.cert_pem)
            .identity(&self.bundle.client.cert_pem, &self.bundle.client.key_pem)
            .alpn(b"h2")
            .build()
            .unwrap()
    }
}

pub struct Server {
    pub addr: SocketAddr,
    _stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(pki: &Pki, limits: ConnectionLimits) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cache = SnapshotCache::new();
        let value = b"listener".to_vec();
        cache.set(
            NODE,
            Snapshot::new(vec![Resource {
                kind: LISTENER,
                name: "http".into(),
                digest: fnv1a64(&value),
                body: Any {
                    type_url: LISTENER.type_url().into(),
                    value,
                },
            }])
            .unwrap(),
        );
        let config = AdsConfig {
            limits,
            ..AdsConfig::default()
        };
        let service = AdsService::new(cache, SharedStats::new(), config);
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
            _stop: stop,
            task,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub type Tls = tokio_rustls::client::TlsStream<TcpStream>;

pub async fn tls(addr: SocketAddr, pki: &Pki) -> Result<Tls, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(pki.client_config())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))
}

// -------------------------------------------------------------- raw HTTP/2 frames

pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK: literal header fields without indexing, no Huffman (RFC 7541 §6.2.2).
pub fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0);
        out.push(u8::try_from(name.len()).unwrap());
        out.extend_from_slice(name.as_bytes());
        out.push(u8::try_from(value.len()).unwrap());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

pub fn ads_headers() -> Vec<u8> {
    hpack(&[
        (":method", "POST"),
        (":scheme", "https"),
        (":path", ADS_PATH),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

/// A frame the server sent: `(type, flags, stream, payload)`.
pub type Got = (u8, u8, u32, Vec<u8>);

/// An HTTP/2 connection spoken by hand (the attacker's side).
pub struct Raw {
    tls: Tls,
}

impl Raw {
    /// TLS, the preface and empty SETTINGS.
    pub async fn open(addr: SocketAddr, pki: &Pki) -> Self {
        let mut tls = tls(addr, pki).await.unwrap();
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        tls.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        Self { tls }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tls.write_all(bytes).await?;
        self.tls.flush().await
    }

    /// The next frame, `None` once the server closed the connection.
    pub async fn next(&mut self) -> Option<Got> {
        let mut head = [0u8; 9];
        match tokio::time::timeout(LONG, self.tls.read_exact(&mut head)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return None,
            Err(_) => panic!("the server sent nothing for {LONG:?}"),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        self.tls.read_exact(&mut payload).await.ok()?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let got = (head[3], head[4], stream, payload);
        if got.0 == PING && got.1 & ACK == 0 {
            let _ = self.send(&frame(PING, ACK, 0, &got.3)).await;
        }
        Some(got)
    }

    /// Frames until one matches (`None` if the connection closes first).
    pub async fn until(&mut self, want: impl Fn(&Got) -> bool) -> Option<Got> {
        while let Some(got) = self.next().await {
            if want(&got) {
                return Some(got);
            }
        }
        None
    }
}

/// `SETTINGS_MAX_CONCURRENT_STREAMS` in a SETTINGS payload.
pub fn max_concurrent_streams(payload: &[u8]) -> Option<u32> {
    payload.chunks_exact(6).find_map(|s| {
        (u16::from_be_bytes([s[0], s[1]]) == 0x3)
            .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
    })
}

pub fn small(limits: impl FnOnce(&mut ConnectionLimits)) -> ConnectionLimits {
    let mut l = ConnectionLimits::default();
    limits(&mut l);
    l
}

/// The server still serves: a new connection gets its SETTINGS and an ADS stream its
/// response headers.
pub async fn still_serves(addr: SocketAddr, pki: &Pki) {
    let mut raw = Raw::open(addr, pki).await;
    raw.until(|f| f.0 == SETTINGS && f.1 & ACK == 0)
        .await
        .unwrap();
    raw.send(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
    raw.send(&frame(HEADERS, END_HEADERS, 1, &ads_headers()))
        .await
        .unwrap();
    let got = raw
        .until(|f| f.2 == 1)
        .await
        .expect("an answer on stream 1");
    assert_eq!(got.0, HEADERS, "{got:?}");
}

/// A valid ADS request of `len` encoded bytes (padded with its `version_info`).
pub fn request_of(len: usize) -> Bytes {
    let mut request = DiscoveryRequest {
        node: Some(
            NodeInfo {
                id: NODE.into(),
                pod_name: "pod".into(),
            }
            .to_node(),
        ),
        type_url: LISTENER.type_url().into(),
        ..Default::default()
    };
    let base = request.encoded_len();
    // The field's own tag and length prefix take a few bytes of the padding.
    let mut pad = len.saturating_sub(base + 6);
    request.version_info = "x".repeat(pad);
    while request.encoded_len() > len {
        pad -= 1;
        request.version_info = "x".repeat(pad);
    }
    let body = request.encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + body.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(body.len()).unwrap());
    framed.put_slice(&body);
    framed.freeze()
}

pub type Body = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// One ADS stream over hyper's HTTP/2 client whose request is sent in parts.
pub struct Call {
    pub requests: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    pub response: JoinHandle<Result<hyper::Response<hyper::body::Incoming>, String>>,
}

pub struct H2 {
    send: hyper::client::conn::http2::SendRequest<Body>,
    _conn: JoinHandle<Result<(), hyper::Error>>,
}

pub async fn h2(addr: SocketAddr, pki: &Pki) -> H2 {
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tls(addr, pki).await.unwrap()))
        .await
        .unwrap();
    H2 {
        send,
        _conn: tokio::spawn(conn),
    }
}

impl H2 {
    /// Opens an ADS stream sending `first`.
    pub async fn call(&mut self, first: Bytes) -> Call {
        let (requests, rx) = mpsc::channel(4);
        requests.send(Ok(Frame::data(first))).await.unwrap();
        let request = http::Request::post(format!("https://localhost{ADS_PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(StreamBody::new(ReceiverStream::new(rx)))
            .unwrap();
        self.send.ready().await.unwrap();
        let sent = self.send.send_request(request);
        Call {
            requests,
            response: tokio::spawn(async move { sent.await.map_err(|e| e.to_string()) }),
        }
    }
}

/// How a stream went: `Ok` with the first response message's length, or the
/// `(grpc-status, grpc-message)` it ended with.
pub async fn outcome(call: Call) -> Result<usize, (i32, String)> {
    let response = tokio::time::timeout(LONG, call.response)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|c| {
            (
                c.to_str().unwrap().parse::<i32>().unwrap(),
                h.get("grpc-message")
                    .map(|m| m.to_str().unwrap().replace("%20", " "))
                    .unwrap_or_default(),
            )
        })
    };
    if let Some(s) = status(response.headers()) {
        return Err(s);
    }
    let mut body = response.into_body();
    let frame = tokio::time::timeout(LONG, body.frame())
        .await
        .unwrap()
        .expect("a message or trailers")
        .unwrap();
    match frame.into_data() {
        Ok(data) => Ok(data.len()),
        Err(f) => Err(status(&f.into_trailers().unwrap()).unwrap()),
    }
}

pub const KIB: usize = 1024;
