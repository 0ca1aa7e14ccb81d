//! The ADS server (`marin3r_control_plane::serve_with`, mTLS on 127.0.0.1) against hostile or
//! broken clients, in-process with tonic clients (docs/reliability.md):
//!
//! - mTLS matrix: no client certificate, one from another CA, an expired one and one
//!   with the wrong key usage are refused; only the valid one gets ADS and health;
//! - garbage on the socket (plain bytes, TLS then garbage, a bad HTTP/2 frame) is cut off
//!   at once while a well-behaved stream keeps getting every update;
//! - a client that never reads its stream is closed after `stream_send_timeout`, so it
//!   neither pins memory nor keeps counting as a subscribed pod (which would block
//!   self-healing), and the reading stream is unaffected;
//! - a NACK storm (200 SotW streams NACKing every response) is paced by the backoff:
//!   bounded responses, bounded memory, and a newer version still goes out at once;
//! - shutdown ends the open streams (UNAVAILABLE), frees the port, and a new server on
//!   the same port serves the reconnecting client;
//! - not ready (`/readyz`, gRPC health) until the backend's first sync is published;
//!   on shutdown not ready at once, serving on for the drain delay, then the connections
//!   closed (streams ended with UNAVAILABLE, GOAWAY) spread over the drain window;
//! - node ids, clusters, pod names and metadata over their limits are refused with
//!   INVALID_ARGUMENT and leave nothing in `/metrics`; per-node series go with the
//!   node's last stream;
//! - a second stream claiming an Envoy's pod cannot turn the version the Envoy ACKed
//!   into a rejection with its NACKs, and is reported;
//! - subscriptions over `MAX_NAMES_PER_TYPE` names (SotW and Delta) are refused with
//!   RESOURCE_EXHAUSTED naming the limit, and the stream's state goes with it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use marin3r_testkit::{wait_ok, wait_until_some};
use marin3r_tests::in_process::{CertFiles, InProcess, bind_localhost};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use marin3r_control_plane::{Backend, Context};
use marin3r_envoyconfig::resource::fnv1a64;
use marin3r_xds::{AdsConfig, NodeInfo, Resource, ResourceType, Snapshot};
use prost_types::Any;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const NODE: &str = "hardening";
const LISTENER: ResourceType = ResourceType::Listener;

// ------------------------------------------------------------------------------ PKI

#[derive(Clone)]
struct Pem {
    cert: String,
    key: String,
}

/// A CA with a server certificate and client certificates: valid, expired, with the
/// server key usage only, and one from another CA.
struct Pki {
    ca: String,
    server: Pem,
    client: Pem,
    expired: Pem,
    server_usage_only: Pem,
    foreign: Pem,
}

fn ca(cn: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    usage: ExtendedKeyUsagePurpose,
    valid: (SystemTime, SystemTime),
) -> Pem {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "envoy-sidecar-client");
    params.extended_key_usages = vec![usage];
    params.not_before = valid.0.into();
    params.not_after = valid.1.into();
    let cert = params.signed_by(&key, issuer).unwrap();
    Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

fn pki() -> Pki {
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let valid = (now - day, now + day);
    let (ca_pem, issuer) = ca("marin3r-test-ca");
    let (_, other) = ca("another-ca");
    Pki {
        ca: ca_pem,
        server: leaf(&issuer, ExtendedKeyUsagePurpose::ServerAuth, valid),
        client: leaf(&issuer, ExtendedKeyUsagePurpose::ClientAuth, valid),
        expired: leaf(
            &issuer,
            ExtendedKeyUsagePurpose::ClientAuth,
            (now - 3 * day, now - day),
        ),
        server_usage_only: leaf(&issuer, ExtendedKeyUsagePurpose::ServerAuth, valid),
        foreign: leaf(&other, ExtendedKeyUsagePurpose::ClientAuth, valid),
    }
}

// --------------------------------------------------------------------------- server

/// A backend that only hands the context (snapshot cache, stats) to the test.
struct TestBackend(Option<tokio::sync::oneshot::Sender<Context>>);

impl Backend for TestBackend {
    async fn start(&mut self, ctx: &Context) -> Result<(), marin3r_control_plane::Error> {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(ctx.clone());
        }
        ctx.ready.set_synced();
        Ok(())
    }

    async fn run(self, _ctx: Context, shutdown: marin3r_control_plane::Shutdown) {
        shutdown.await;
    }
}

/// A backend whose `start` waits for `gate` before running `inner`'s.
struct Gated<B> {
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
    inner: B,
}

impl<B: Backend + Sync> Backend for Gated<B> {
    async fn start(&mut self, ctx: &Context) -> Result<(), marin3r_control_plane::Error> {
        if let Some(gate) = self.gate.take() {
            let _ = gate.await;
        }
        self.inner.start(ctx).await
    }

    fn routes(&self, ctx: &Context) -> axum::Router {
        self.inner.routes(ctx)
    }

    async fn run(self, ctx: Context, shutdown: marin3r_control_plane::Shutdown) {
        self.inner.run(ctx, shutdown).await;
    }
}

/// The discovery service in-process ([`InProcess`], the launcher the end-to-end tests
/// use) with the context its backend was handed.
struct Server {
    addr: SocketAddr,
    health: SocketAddr,
    metrics: SocketAddr,
    ctx: Context,
    ds: InProcess,
}

impl Server {
    /// Signals shutdown and waits (bounded) for the server to return.
    async fn stop(self, within: Duration) -> Result<(), String> {
        self.ds.stop(within).await
    }
}

fn write_certs(dir: &Path, pki: &Pki) -> CertFiles {
    let (crt, key, ca) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
    std::fs::write(&crt, &pki.server.cert).unwrap();
    std::fs::write(&key, &pki.server.key).unwrap();
    std::fs::write(&ca, &pki.ca).unwrap();
    CertFiles {
        server_cert: crt,
        server_key: key,
        ca_file: ca,
    }
}

/// A server running `backend` on `xdss`, without waiting for anything.
async fn launch<B: Backend>(
    xdss: tokio::net::TcpListener,
    dir: &Path,
    pki: &Pki,
    ads: AdsConfig,
    backend: B,
) -> InProcess {
    InProcess::launch(xdss, &write_certs(dir, pki), ads, backend)
        .await
        .unwrap()
}

async fn start_on(xdss: tokio::net::TcpListener, dir: &Path, pki: &Pki, ads: AdsConfig) -> Server {
    let (ctx_tx, ctx_rx) = tokio::sync::oneshot::channel();
    let ds = launch(xdss, dir, pki, ads, TestBackend(Some(ctx_tx))).await;
    let ctx = ctx_rx.await.unwrap();
    Server {
        addr: ds.xdss,
        health: ds.health,
        metrics: ds.metrics,
        ctx,
        ds,
    }
}

async fn start(dir: &Path, pki: &Pki, ads: AdsConfig) -> Server {
    start_on(bind_localhost().await.unwrap(), dir, pki, ads).await
}

/// A snapshot with one listener resource of `size` bytes (content varies with `version`).
fn snapshot(version: u64, size: usize) -> Snapshot {
    let mut value = format!("listener version {version} ").into_bytes();
    value.resize(size.max(value.len()), b'x');
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

// --------------------------------------------------------------------------- clients

async fn channel(addr: SocketAddr, ca: &str, identity: Option<&Pem>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert, &id.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))
}

fn node(pod: &str) -> Node {
    NodeInfo {
        id: NODE.into(),
        pod_name: pod.into(),
    }
    .to_node()
}

fn subscribe(pod: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(node(pod)),
        type_url: LISTENER.type_url().into(),
        ..Default::default()
    }
}

/// The ACK (or, with `nack`, the NACK) of `resp`; `accepted` is the last accepted version.
fn answer(resp: &DiscoveryResponse, accepted: &str, nack: bool) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: resp.type_url.clone(),
        response_nonce: resp.nonce.clone(),
        version_info: if nack {
            accepted.to_string()
        } else {
            resp.version_info.clone()
        },
        error_detail: nack.then(|| RpcStatus {
            code: 3,
            message: "rejected by the test".into(),
            details: vec![],
        }),
        ..Default::default()
    }
}

type Stream = tonic::Streaming<DiscoveryResponse>;

/// Opens a SotW stream for pod `pod` and subscribes to listeners.
async fn open(ch: Channel, pod: &str) -> Result<(mpsc::Sender<DiscoveryRequest>, Stream), String> {
    let (tx, rx) = mpsc::channel(64);
    tx.send(subscribe(pod)).await.map_err(|e| e.to_string())?;
    let resp = AggregatedDiscoveryServiceClient::new(ch)
        .max_decoding_message_size(64 * 1024 * 1024)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|e| format!("stream: {e:?}"))?;
    Ok((tx, resp.into_inner()))
}

/// A client that ACKs everything and records the versions it received.
fn spawn_reader(
    ch: Channel,
    pod: &'static str,
) -> (
    tokio::sync::watch::Receiver<Vec<String>>,
    tokio::task::JoinHandle<Result<(), String>>,
) {
    let (seen_tx, seen_rx) = tokio::sync::watch::channel(Vec::new());
    let task = tokio::spawn(async move {
        let (tx, mut stream) = open(ch, pod).await?;
        while let Some(resp) = stream.message().await.map_err(|e| format!("{e:?}"))? {
            seen_tx.send_modify(|v| v.push(resp.version_info.clone()));
            tx.send(answer(&resp, "", false))
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    (seen_rx, task)
}

/// Resident set size of this process (server and clients), bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time (user + system) of this process so far.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the ")" of the command name: state is field 3; utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // USER_HZ is 100 on Linux.
    Duration::from_millis((ticks(14) + ticks(15)) * 10)
}

// ----------------------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_every_client_but_the_valid_one() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    server.ctx.cache.set(NODE, snapshot(1, 64));

    let attempt = |identity: Option<Pem>| {
        let (addr, ca) = (server.addr, pki.ca.clone());
        async move {
            let ch = channel(addr, &ca, identity.as_ref()).await?;
            let health = HealthClient::new(ch.clone())
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .map_err(|e| format!("health: {}", e.message()))?;
            let (_tx, mut stream) = open(ch, "mtls").await?;
            let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .map_err(|_| "no ADS response".to_string())?
                .map_err(|e| format!("ADS: {}", e.message()))?
                .ok_or("ADS stream ended")?;
            Ok::<_, String>((health.into_inner().status, first.version_info))
        }
    };
    let cases = [
        ("no client certificate", None, false),
        (
            "certificate from another CA",
            Some(pki.foreign.clone()),
            false,
        ),
        ("expired certificate", Some(pki.expired.clone()), false),
        (
            "serverAuth-only certificate",
            Some(pki.server_usage_only.clone()),
            false,
        ),
        ("valid certificate", Some(pki.client.clone()), true),
    ];
    for (name, identity, accepted) in cases {
        let result = tokio::time::timeout(Duration::from_secs(15), attempt(identity))
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        eprintln!("{name}: {result:?}");
        match (accepted, &result) {
            (true, Ok((status, version))) => {
                assert_eq!(*status, 1, "SERVING");
                assert_eq!(version, snapshot(1, 64).version(LISTENER));
            }
            (false, Err(_)) => {}
            _ => panic!(
                "{name}: expected {}, got {result:?}",
                if accepted { "success" } else { "refusal" }
            ),
        }
    }
    server.stop(Duration::from_secs(5)).await.unwrap();
}

/// A TLS client with the valid client certificate, ALPN h2.
async fn raw_tls(addr: SocketAddr, pki: &Pki) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![CertificateDer::from_pem_slice(pki.client.cert.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(pki.client.key.as_bytes()).unwrap(),
    )
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// Reads until the peer closes; the time it took (None if still open after `within`).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    within: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(
            tokio::time::Instant::from_std(start + within),
            s.read(&mut buf),
        )
        .await
        {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_clients_are_cut_off_while_a_good_stream_keeps_updating() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    server.ctx.cache.set(NODE, snapshot(0, 64));
    let ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let (seen, reader) = spawn_reader(ch, "good");
    let want = |v: u64| snapshot(v, 64).version(LISTENER).to_string();
    wait_until_some("first version", Duration::from_secs(5), || {
        seen.borrow().contains(&want(0)).then_some(())
    })
    .await;

    // Updates keep flowing while the bad clients do their thing.
    let pusher = {
        let cache = server.ctx.cache.clone();
        tokio::spawn(async move {
            for v in 1..=20 {
                cache.set(NODE, snapshot(v, 64));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let bound = Duration::from_secs(3);
    // Plain bytes where a TLS ClientHello belongs.
    let mut plain = TcpStream::connect(server.addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n\x00\xff\xfe garbage")
        .await
        .unwrap();
    let plain_closed = closed_within(&mut plain, bound).await;
    // TLS with a valid client certificate, then bytes that are not the HTTP/2 preface.
    let mut tls = raw_tls(server.addr, &pki).await;
    tls.write_all(b"\x00\x01\x02 this is not HTTP/2 \xff\xff")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let tls_closed = closed_within(&mut tls, bound).await;
    // TLS, the HTTP/2 preface, then a malformed frame (a DATA frame on stream 0).
    let mut h2 = raw_tls(server.addr, &pki).await;
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    h2.write_all(&[0, 0, 4, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef])
        .await
        .unwrap();
    h2.flush().await.unwrap();
    let h2_closed = closed_within(&mut h2, bound).await;
    eprintln!(
        "closed: plain {plain_closed:?}, TLS+garbage {tls_closed:?}, bad HTTP/2 frame {h2_closed:?}"
    );
    assert!(plain_closed.is_some(), "plain garbage was not cut off");
    assert!(tls_closed.is_some(), "TLS + garbage was not cut off");
    assert!(h2_closed.is_some(), "a bad HTTP/2 frame was not cut off");

    pusher.await.unwrap();
    wait_until_some(
        "last version at the good stream",
        Duration::from_secs(5),
        || seen.borrow().contains(&want(20)).then_some(()),
    )
    .await;
    let received = seen.borrow().len();
    eprintln!("good stream received {received} versions");
    assert!(
        received >= 5,
        "the good stream stalled: {received} versions"
    );
    assert!(!reader.is_finished(), "the good stream ended");
    // The good stream is still open: the stop serves on for the drain delay (5 s) first.
    server.stop(Duration::from_secs(15)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_silent_after_its_tls_handshake_is_cut_off_after_the_preface_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let ads = AdsConfig {
        preface_timeout: Duration::from_millis(1500),
        ..AdsConfig::default()
    };
    let server = start(dir.path(), &pki, ads).await;
    server.ctx.cache.set(NODE, snapshot(0, 8));

    // TLS with a valid client certificate, then nothing; and half a preface, then nothing.
    let mut silent = raw_tls(server.addr, &pki).await;
    let mut half = raw_tls(server.addr, &pki).await;
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    half.flush().await.unwrap();
    // A real client connecting meanwhile is served (the preface is replayed to HTTP/2).
    let ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let (seen, reader) = spawn_reader(ch, "good");
    let want = snapshot(0, 8).version(LISTENER).to_string();
    wait_until_some("first version", Duration::from_secs(5), || {
        seen.borrow().contains(&want).then_some(())
    })
    .await;

    let bound = Duration::from_secs(5);
    let silent_closed = closed_within(&mut silent, bound).await;
    let half_closed = closed_within(&mut half, bound).await;
    eprintln!("closed: silent {silent_closed:?}, half preface {half_closed:?}");
    let silent_closed = silent_closed.expect("a silent TLS client was not cut off");
    assert!(
        silent_closed >= Duration::from_millis(1000),
        "cut off before the preface timeout: {silent_closed:?}"
    );
    assert!(half_closed.is_some(), "a half preface was not cut off");
    assert!(!reader.is_finished(), "the good stream ended");
    // The good stream is still open: the stop serves on for the drain delay (5 s) first.
    server.stop(Duration::from_secs(15)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_and_stops_counting_as_a_pod() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let ads = AdsConfig {
        stream_send_timeout: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(1),
        ..AdsConfig::default()
    };
    let server = start(dir.path(), &pki, ads).await;
    const SIZE: usize = 256 * 1024;
    server.ctx.cache.set(NODE, snapshot(0, SIZE));

    let good = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let (seen, reader) = spawn_reader(good, "reader");
    // The stuck client has its own connection: it subscribes, then never reads.
    let stuck_ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let (_stuck_tx, _stuck_stream) = open(stuck_ch, "stuck").await.unwrap();
    wait_until_some("both pods subscribed", Duration::from_secs(5), || {
        (server.ctx.stats.pods_for_node(NODE).len() == 2).then_some(())
    })
    .await;
    let rss_before = rss();

    // 60 versions × 256 KiB = 15 MiB: far beyond the stuck stream's HTTP/2 window
    // (2 MiB) and the 16 buffered responses.
    let started = Instant::now();
    for v in 1..=60u64 {
        server.ctx.cache.set(NODE, snapshot(v, SIZE));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let last = snapshot(60, SIZE).version(LISTENER).to_string();
    wait_until_some(
        "last version at the reading stream",
        Duration::from_secs(10),
        || seen.borrow().contains(&last).then_some(()),
    )
    .await;
    let gone = wait_until_some("the stuck pod is dropped", Duration::from_secs(10), || {
        let pods = server.ctx.stats.pods_for_node(NODE);
        (!pods.contains("stuck")).then(|| started.elapsed())
    })
    .await;
    let rss_after = rss();
    eprintln!(
        "reading stream got {} versions; stuck stream closed {gone:?} after the pushes began; RSS {} → {} MiB",
        seen.borrow().len(),
        rss_before / (1 << 20),
        rss_after / (1 << 20)
    );
    assert!(server.ctx.stats.pods_for_node(NODE).contains("reader"));
    assert!(!reader.is_finished());
    // What the stuck stream can pin is bounded: 16 buffered responses plus the HTTP/2
    // windows, ~10 MiB here; 64 MiB is far above that and far below 60 × 256 KiB × 2.
    assert!(
        rss_after.saturating_sub(rss_before) < 64 << 20,
        "memory grew by {} MiB",
        (rss_after - rss_before) >> 20
    );
    // The stuck connection still holds unsent data: the stop returns after the drain
    // delay (5 s; the reader is connected), its turn in the drain and the grace.
    let t = Instant::now();
    server.stop(Duration::from_secs(15)).await.unwrap();
    eprintln!(
        "stopped in {:?} with the stuck client connected",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_storm_from_200_streams_is_paced_by_the_backoff() {
    const STREAMS: usize = 200;
    const PER_CHANNEL: usize = 50;
    /// Responses of the rejected version each stream waits for.
    const PACED: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    server.ctx.cache.set(NODE, snapshot(1, 1024));

    let responses = Arc::new(AtomicU64::new(0));
    let newest = Arc::new(AtomicU64::new(0));
    // Per stream: from its first response to its PACED-th one, all of version 1.
    let spans = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let v2 = snapshot(2, 1024).version(LISTENER).to_string();
    let mut tasks = Vec::new();
    let mut ch = None;
    for i in 0..STREAMS {
        if i % PER_CHANNEL == 0 {
            ch = Some(
                channel(server.addr, &pki.ca, Some(&pki.client))
                    .await
                    .unwrap(),
            );
        }
        let ch = ch.clone().unwrap();
        let (responses, newest, spans, v2) =
            (responses.clone(), newest.clone(), spans.clone(), v2.clone());
        tasks.push(tokio::spawn(async move {
            let (tx, mut stream) = open(ch, &format!("storm-{i}")).await?;
            let mut received = Vec::new();
            while let Some(resp) = stream.message().await.map_err(|e| format!("{e:?}"))? {
                responses.fetch_add(1, Ordering::Relaxed);
                if resp.version_info == v2 {
                    newest.fetch_add(1, Ordering::Relaxed);
                } else if received.len() < PACED {
                    received.push(Instant::now());
                    if received.len() == PACED {
                        spans
                            .lock()
                            .unwrap()
                            .push(received[PACED - 1] - received[0]);
                    }
                }
                // NACK everything, at once.
                tx.send(answer(&resp, "", true))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    wait_until_some(
        "every stream got its first response",
        Duration::from_secs(20),
        || (responses.load(Ordering::Relaxed) >= STREAMS as u64).then_some(()),
    )
    .await;
    let (r0, m0, c0, t0) = (
        responses.load(Ordering::Relaxed),
        rss(),
        cpu(),
        Instant::now(),
    );
    // Until every stream has had the rejected version PACED times.
    wait_until_some(
        "every stream re-sent the rejected version",
        Duration::from_secs(30),
        || (spans.lock().unwrap().len() >= STREAMS).then_some(()),
    )
    .await;
    let (r1, m1, c1, t1) = (
        responses.load(Ordering::Relaxed),
        rss(),
        cpu(),
        Instant::now(),
    );
    let window = t1 - t0;
    let shortest = spans.lock().unwrap().iter().copied().min().unwrap();
    eprintln!(
        "NACK storm, {STREAMS} streams: {r1} responses in total, {} in the {window:?} until each stream had {PACED} (the fastest in {shortest:?}); CPU {:?} meanwhile ({:.0}% of one core); RSS {} → {} MiB",
        r1 - r0,
        c1 - c0,
        100.0 * (c1 - c0).as_secs_f64() / window.as_secs_f64(),
        m0 >> 20,
        m1 >> 20
    );
    // The backoff (100 ms doubling) holds every re-send of a rejected version back: a
    // stream's PACED-th response comes at least 100 + 200 + 400 ms after its first (a
    // lower bound: a slow machine only makes it longer); a tight loop takes a few ms.
    assert!(
        shortest >= Duration::from_millis(700),
        "a stream got {PACED} responses in {shortest:?}: the NACK backoff does not hold"
    );
    assert!(
        m1.saturating_sub(m0) < 32 << 20,
        "memory grew by {} MiB",
        (m1 - m0) >> 20
    );

    // A newer version goes out to every stream at once, whatever the backoff.
    server.ctx.cache.set(NODE, snapshot(2, 1024));
    let pushed = Instant::now();
    wait_until_some(
        "the new version reaches every stream",
        Duration::from_secs(10),
        || (newest.load(Ordering::Relaxed) >= STREAMS as u64).then_some(()),
    )
    .await;
    eprintln!(
        "new version at all {STREAMS} streams after {:?}",
        pushed.elapsed()
    );
    assert!(tasks.iter().all(|t| !t.is_finished()), "a stream ended");
    for t in &tasks {
        t.abort();
    }
    server.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_and_a_new_server_on_the_port_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    let addr = server.addr;
    server.ctx.cache.set(NODE, snapshot(1, 64));
    let ch = channel(addr, &pki.ca, Some(&pki.client)).await.unwrap();
    let (tx, mut stream) = open(ch, "restart").await.unwrap();
    let first = stream.message().await.unwrap().unwrap();
    tx.send(answer(&first, "", false)).await.unwrap();

    // The stream is open; the graceful stop must not wait for it forever (it serves on
    // for the drain delay, 5 s, then closes the connection).
    let t = Instant::now();
    server.stop(Duration::from_secs(15)).await.unwrap();
    eprintln!("stopped with an open stream in {:?}", t.elapsed());
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .unwrap();
    match end {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        Ok(other) => panic!("stream did not end with UNAVAILABLE: {other:?}"),
    }

    // Same port, new server: a fresh channel reaches it and gets the snapshot.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let server = start_on(listener, dir2.path(), &pki, AdsConfig::default()).await;
    server.ctx.cache.set(NODE, snapshot(2, 64));
    let ch = channel(addr, &pki.ca, Some(&pki.client)).await.unwrap();
    let (_tx, mut stream) = open(ch, "restart").await.unwrap();
    let resp = stream.message().await.unwrap().unwrap();
    assert_eq!(resp.version_info, snapshot(2, 64).version(LISTENER));
    drop(stream);
    // The request side is still open (`_tx`): the drain delay (5 s) applies.
    server.stop(Duration::from_secs(15)).await.unwrap();
}

// ------------------------------------------------ readiness, drain, bounded nodes

/// gRPC health of `service` (1 SERVING, 2 NOT_SERVING).
async fn health_of(ch: Channel, service: &str) -> Result<i32, String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|e| format!("health: {e:?}"))
}

const ADS_SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;
const LONG: Duration = Duration::from_secs(20);

/// `(gRPC health of "", of ADS, /readyz status)`.
async fn readiness(ch: &Channel, health: SocketAddr) -> (i32, i32, u16) {
    let readyz = marin3r_testkit::http::get(health, "/readyz").await.unwrap();
    (
        health_of(ch.clone(), "").await.unwrap(),
        health_of(ch.clone(), ADS_SERVICE).await.unwrap(),
        readyz.status,
    )
}

async fn wait_readiness(ch: &Channel, health: SocketAddr, want: (i32, i32, u16)) {
    wait_ok(format!("readiness {want:?}"), LONG, || async {
        match readiness(ch, health).await {
            got if got == want => Ok(()),
            got => Err(format!("{got:?}")),
        }
    })
    .await;
}

const LOCAL_CONFIG: &str = r#"apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata:
  name: hardening
  namespace: default
spec:
  nodeID: hardening
  resources:
    - type: listener
      value:
        name: http
        address:
          socket_address: {address: 127.0.0.1, port_value: 8080}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_and_not_serving_until_the_first_folder_scan_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("config");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("hardening.yaml"), LOCAL_CONFIG).unwrap();
    let pki = pki();
    let (gate, gated) = tokio::sync::oneshot::channel();
    let backend = Gated {
        gate: Some(gated),
        inner: marin3r_control_plane::local::LocalBackend::new(&folder),
    };
    let l = launch(
        bind_localhost().await.unwrap(),
        dir.path(),
        &pki,
        AdsConfig::default(),
        backend,
    )
    .await;
    let ch = channel(l.xdss, &pki.ca, Some(&pki.client)).await.unwrap();

    // The first scan is held back: everything listens, nothing says ready, and a stream
    // of the node is held (not answered with an empty config).
    assert_eq!(
        readiness(&ch, l.health).await,
        (NOT_SERVING, NOT_SERVING, 503)
    );
    let (_tx, mut stream) = open(ch.clone(), "early").await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err(),
        "a node is not answered before its snapshot is published"
    );
    assert_eq!(
        readiness(&ch, l.health).await,
        (NOT_SERVING, NOT_SERVING, 503)
    );

    // The scan runs and publishes: the held stream gets the config, then ready.
    gate.send(()).unwrap();
    let first = tokio::time::timeout(LONG, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.type_url, LISTENER.type_url());
    assert_eq!(first.resources.len(), 1);
    wait_readiness(&ch, l.health, (SERVING, SERVING, 200)).await;

    l.stop(LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reports_not_ready_at_once_and_closes_streams_spread_over_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    // Three connections (health, drain-a, drain-b, in accept order) closed over 6 s once
    // the 1 s drain delay is over: the health one at once, drain-a 2 s later, drain-b
    // 4 s later.
    let ads = AdsConfig {
        drain_time: Duration::from_secs(6),
        drain_delay: Duration::from_secs(1),
        ..AdsConfig::default()
    };
    let server = start(dir.path(), &pki, ads).await;
    server.ctx.cache.set(NODE, snapshot(1, 64));
    let ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    wait_readiness(&ch, server.health, (SERVING, SERVING, 200)).await;
    let mut streams = Vec::new();
    for pod in ["drain-a", "drain-b"] {
        let ch = channel(server.addr, &pki.ca, Some(&pki.client))
            .await
            .unwrap();
        let (tx, mut stream) = open(ch, pod).await.unwrap();
        let first = stream.message().await.unwrap().unwrap();
        tx.send(answer(&first, "", false)).await.unwrap();
        streams.push((tx, stream));
    }
    let (health, addr) = (server.health, server.addr);
    let ctx = server.ctx.clone();
    let (stop_result_tx, mut stop_result) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = stop_result_tx.send(server.stop(Duration::from_secs(60)).await);
    });

    // One stream (drain-a's) ends first, cleanly, with the shutdown status.
    let ends = futures::future::select_all(streams.iter_mut().map(|(_, s)| Box::pin(s.message())));
    let (first_end, index, _) = tokio::time::timeout(LONG, ends).await.unwrap();
    let status = first_end.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "discovery service shutting down");
    let (tx, mut other) = streams.swap_remove(1 - index);
    drop(streams);

    // Meanwhile: not ready, while the other stream is still served (a new version
    // reaches it). gRPC health went NOT_SERVING too, but cannot be asked any more: the
    // listener is closed and the health connection got its GOAWAY.
    let readyz = marin3r_testkit::http::get(health, "/readyz").await.unwrap();
    assert_eq!((readyz.status, readyz.body.as_str()), (503, "not ready"));
    assert!(health_of(ch.clone(), "").await.is_err());
    ctx.cache.set(NODE, snapshot(2, 64));
    let pushed = tokio::time::timeout(LONG, other.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(pushed.version_info, snapshot(2, 64).version(LISTENER));
    tx.send(answer(&pushed, "", false)).await.unwrap();
    // No new connection is accepted: the listener is closed.
    let late = tokio::time::timeout(LONG, channel(addr, &pki.ca, Some(&pki.client)))
        .await
        .unwrap();
    assert!(
        late.is_err(),
        "a new connection during the drain is refused"
    );

    // Then it ends too, the same way, and the server returns by itself.
    let end = tokio::time::timeout(LONG, other.message()).await.unwrap();
    let status = end.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "discovery service shutting down");
    tokio::time::timeout(Duration::from_secs(60), &mut stop_result)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

async fn metrics_text(addr: SocketAddr) -> String {
    marin3r_testkit::http::get(addr, "/metrics")
        .await
        .unwrap()
        .body
}

/// The status a stream whose first request carries `node` ends with.
async fn refusal_of(ch: Channel, node: Node) -> tonic::Status {
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(node),
        type_url: LISTENER.type_url().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let result = AggregatedDiscoveryServiceClient::new(ch)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await;
    let status = match result {
        Err(status) => status,
        Ok(resp) => {
            let mut stream = resp.into_inner();
            match tokio::time::timeout(LONG, stream.message()).await.unwrap() {
                Err(status) => status,
                Ok(other) => panic!("not refused: {other:?}"),
            }
        }
    };
    drop(tx);
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_node_ids_cluster_and_metadata_are_refused_and_leave_no_trace() {
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use envoy_types::pb::google::protobuf::{Value, value::Kind};
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    let ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let big_id = format!("huge-{}", "i".repeat(2048));
    server.ctx.cache.set(&big_id, snapshot(1, 64));

    let with_id = |id: &str| Node {
        id: id.into(),
        ..node("pod")
    };
    let s = refusal_of(ch.clone(), with_id(&big_id)).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert_eq!(
        s.message(),
        "node.id is 2053 bytes, over the limit of 1024 bytes"
    );
    let s = refusal_of(
        ch.clone(),
        Node {
            cluster: "c".repeat(1025),
            ..node("pod")
        },
    )
    .await;
    assert_eq!(
        (s.code(), s.message()),
        (
            tonic::Code::InvalidArgument,
            "node.cluster is 1025 bytes, over the limit of 1024 bytes"
        )
    );
    let s = refusal_of(ch.clone(), node(&"p".repeat(4096))).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(
        s.message()
            .starts_with("node.metadata.pod_name is 4096 bytes"),
        "{s:?}"
    );
    let mut fat = node("pod");
    fat.metadata.as_mut().unwrap().fields.insert(
        "blob".into(),
        Value {
            kind: Some(Kind::StringValue("m".repeat(100 * 1024))),
        },
    );
    let s = refusal_of(ch.clone(), fat).await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(
        s.message().starts_with("node.metadata is ")
            && s.message().ends_with("over the limit of 65536 bytes"),
        "{s:?}"
    );
    // The SRE's case: an 8 MiB node id is over the request size limit (4 MiB) and
    // refused before it is decoded.
    let s = refusal_of(ch.clone(), with_id(&"x".repeat(8 << 20))).await;
    assert_ne!(s.code(), tonic::Code::Ok, "{s:?}");
    eprintln!("8 MiB node id: {:?} {}", s.code(), s.message());
    assert!(s.message().len() < 1024, "bounded message");

    // Delta too.
    let (tx, rx) = mpsc::channel(4);
    tx.send(DeltaDiscoveryRequest {
        node: Some(with_id(&big_id)),
        type_url: LISTENER.type_url().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut delta = AggregatedDiscoveryServiceClient::new(ch.clone())
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let s = tokio::time::timeout(LONG, delta.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");

    // Nothing about the refused streams was counted or labelled.
    let text = metrics_text(server.metrics).await;
    assert!(!text.contains("huge-"), "{}", &text[..text.len().min(4096)]);
    assert!(!text.contains("ccccc") && !text.contains("ppppp"));
    assert!(server.ctx.stats.pods_for_node(&big_id).is_empty());
    assert!(
        text.len() < 64 * 1024,
        "/metrics stays small: {} bytes",
        text.len()
    );
    server.stop(LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_node_series_are_removed_with_the_last_stream() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    let ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let node_of = |i: usize| format!("seen-node-{i}");
    let mut streams = Vec::new();
    for i in 0..20 {
        server.ctx.cache.set(&node_of(i), snapshot(1, 64));
        let (tx, rx) = mpsc::channel(4);
        tx.send(DiscoveryRequest {
            node: Some(Node {
                id: node_of(i),
                ..node(&format!("seen-pod-{i}"))
            }),
            type_url: LISTENER.type_url().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut stream = AggregatedDiscoveryServiceClient::new(ch.clone())
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        tx.send(answer(&first, "", false)).await.unwrap();
        streams.push((tx, stream));
    }
    // Node 0 gets a second stream.
    let (tx0b, rx0b) = mpsc::channel(4);
    tx0b.send(DiscoveryRequest {
        node: Some(Node {
            id: node_of(0),
            ..node("seen-pod-0b")
        }),
        type_url: LISTENER.type_url().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut second = AggregatedDiscoveryServiceClient::new(ch.clone())
        .stream_aggregated_resources(ReceiverStream::new(rx0b))
        .await
        .unwrap()
        .into_inner();
    second.message().await.unwrap().unwrap();
    let wait_metrics = |pred: fn(&str) -> bool, what: &'static str| {
        let addr = server.metrics;
        wait_ok(what, LONG, move || async move {
            let text = metrics_text(addr).await;
            if pred(&text) {
                Ok(text)
            } else {
                Err(format!("\n{text}"))
            }
        })
    };
    wait_metrics(
        |t| {
            t.contains(r#"marin3r_xdss_streams{node_id="seen-node-0",api="sotw"} 2"#)
                && t.contains(r#"marin3r_xdss_streams{node_id="seen-node-19",api="sotw"} 1"#)
        },
        "every stream counted",
    )
    .await;

    drop(streams);
    let text = wait_metrics(
        |t| !t.contains("seen-node-1") && !t.contains("seen-pod-1"),
        "series of nodes without streams removed",
    )
    .await;
    assert!(
        text.contains(r#"marin3r_xdss_streams{node_id="seen-node-0",api="sotw"} 1"#),
        "a node with a stream left keeps its series:\n{text}"
    );
    assert!(!text.contains(r#"pod_name="seen-pod-0""#), "{text}");
    assert!(text.contains(r#"pod_name="seen-pod-0b""#), "{text}");
    drop(tx0b);
    drop(second);
    wait_metrics(|t| !t.contains("seen-"), "every per-node series removed").await;
    server.stop(LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stream_claiming_an_acking_pod_cannot_forge_its_rejection() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let ads = AdsConfig {
        nack_backoff_initial: Duration::from_millis(10),
        nack_backoff_max: Duration::from_millis(20),
        ..AdsConfig::default()
    };
    let server = start(dir.path(), &pki, ads).await;
    server.ctx.cache.set(NODE, snapshot(1, 64));
    let v1 = snapshot(1, 64).version(LISTENER).to_string();
    let stats = server.ctx.stats.clone();

    // The real Envoy of pod "envoy" ACKs v1 on its connection.
    let honest = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let (_seen, reader) = spawn_reader(honest, "envoy");
    wait_until_some("the Envoy ACKed v1", LONG, || {
        stats
            .acks(NODE, LISTENER, &v1)
            .contains_key("envoy")
            .then_some(())
    })
    .await;
    // Another client holding the certificate claims the same pod and NACKs everything.
    let forged = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let (tx, mut stream) = open(forged, "envoy").await.unwrap();
    let forger = tokio::spawn(async move {
        while let Ok(Some(resp)) = stream.message().await {
            if tx.send(answer(&resp, "", true)).await.is_err() {
                break;
            }
        }
    });
    const THRESHOLD: u64 = 5;
    wait_until_some("the forged NACKs are counted", LONG, || {
        let nacks = stats.nacks(NODE, LISTENER, &v1);
        (nacks.get("envoy").copied().unwrap_or(0) >= 2 * THRESHOLD).then_some(())
    })
    .await;
    assert!(
        !stats.rejected_by_all_pods(NODE, LISTENER, &v1, THRESHOLD),
        "the pod ACKed v1 on its Envoy's stream: the forged NACKs do not taint it"
    );
    // Reported: two live streams for the pod, and the counter.
    assert_eq!(stats.snapshot().streams_for_node(NODE)["envoy"], 2);
    let text = metrics_text(server.metrics).await;
    assert!(
        text.contains("marin3r_xdss_pod_stream_overlaps_total 1"),
        "{text}"
    );
    forger.abort();
    reader.abort();
    server.stop(LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_over_the_name_limit_are_refused_and_leave_nothing() {
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use marin3r_xds::MAX_NAMES_PER_TYPE;
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(dir.path(), &pki, AdsConfig::default()).await;
    server.ctx.cache.set(NODE, snapshot(1, 64));
    let ch = channel(server.addr, &pki.ca, Some(&pki.client))
        .await
        .unwrap();
    let names = |prefix: &str, n: usize| -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:06}")).collect()
    };
    let endpoints = ResourceType::Endpoint.type_url().to_string();

    // Delta: a stream subscribes names that do not exist, a quarter of the limit per
    // request, as the SRE's client did; the request that goes over is refused.
    let (tx, rx) = mpsc::channel(8);
    tx.send(DeltaDiscoveryRequest {
        node: Some(node("subscriber")),
        type_url: endpoints.clone(),
        resource_names_subscribe: names("first", MAX_NAMES_PER_TYPE / 4),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut delta = AggregatedDiscoveryServiceClient::new(ch.clone())
        .max_decoding_message_size(64 * 1024 * 1024)
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = delta.message().await.unwrap().unwrap();
    assert_eq!(first.removed_resources.len(), MAX_NAMES_PER_TYPE / 4);
    for i in 1..=4 {
        tx.send(DeltaDiscoveryRequest {
            type_url: endpoints.clone(),
            resource_names_subscribe: names(&format!("more{i}"), MAX_NAMES_PER_TYPE / 4),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let status = loop {
        match tokio::time::timeout(LONG, delta.message()).await.unwrap() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "resource_names_subscribe of endpoint: {} resource names, over the limit of {MAX_NAMES_PER_TYPE} per type per stream",
            MAX_NAMES_PER_TYPE + MAX_NAMES_PER_TYPE / 4
        )
    );
    // The stream is gone, and with it its pod.
    let stats = server.ctx.stats.clone();
    wait_until_some("the refused stream closed", LONG, || {
        (!stats.pods_for_node(NODE).contains("subscriber")).then_some(())
    })
    .await;
    drop(tx);

    // SotW: one request with too many names.
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(node("sotw-subscriber")),
        type_url: endpoints.clone(),
        resource_names: names("sotw", MAX_NAMES_PER_TYPE + 1),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut sotw = AggregatedDiscoveryServiceClient::new(ch.clone())
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let status = tokio::time::timeout(LONG, sotw.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("resource_names of endpoint: 10001 resource names"),
        "{status:?}"
    );
    wait_until_some("no stream left", LONG, || {
        stats.nodes_with_streams().is_empty().then_some(())
    })
    .await;
    drop(tx);
    server.stop(LONG).await.unwrap();
}
