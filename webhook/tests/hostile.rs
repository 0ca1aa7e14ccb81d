//! The webhook against hostile or unlucky clients, over real TLS sockets on 127.0.0.1
//! (docs/reliability.md): slowloris clients (handshake, headers, body trickled byte by
//! byte) are cut off after a bounded time without delaying anybody else; oversized and
//! deeply nested bodies get 400 without a stack overflow; concurrent clients see zero
//! failed requests while the certificate files are swapped; a graceful shutdown
//! finishes the request in flight and refuses new connections.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::{Running, bundle, cert_der, labelled_pod, pod_review, read_response, start};
use marin3r_certs::Bundle;
use marin3r_testkit::{wait_until, wait_until_async};
use marin3r_webhook::{MAX_BODY_BYTES, MUTATE_PATH, Timeouts};
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Short bounds so the tests stay fast; production defaults are 10 s each.
const TIMEOUTS: Timeouts = Timeouts {
    handshake: Duration::from_millis(1500),
    header_read: Duration::from_millis(1500),
    request: Duration::from_millis(1500),
    graceful_shutdown: Duration::from_secs(10),
};
/// Bounds long enough that no slow client is cut off while a test looks at the others.
const PATIENT: Timeouts = Timeouts {
    handshake: Duration::from_secs(60),
    header_read: Duration::from_secs(60),
    request: Duration::from_secs(60),
    graceful_shutdown: Duration::from_secs(10),
};
/// How long a slow client keeps going before it gives up by itself (a server that never
/// cuts it off).
const GIVE_UP: Duration = Duration::from_secs(12);

/// Writes the server certificate and key like the kubelet updates a Secret volume: a new
/// timestamped folder, then an atomic swap of the `..data` symlink that `tls.crt` and
/// `tls.key` point through.
fn install_like_kubelet(dir: &Path, b: &Bundle, generation: usize) {
    let data = dir.join(format!("..gen_{generation}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("tls.crt"), &b.server.cert_pem).unwrap();
    std::fs::write(data.join("tls.key"), &b.server.key_pem).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(data.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

/// A TLS client trusting the CAs of `roots`, offering h2 and HTTP/1.1 via ALPN. It
/// resumes TLS sessions like most clients; `full_handshakes` turns that off, so every
/// connection sees the certificate served at that moment.
fn connector_with(roots: &[&Bundle], full_handshakes: bool) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for b in roots {
        store.add(cert_der(&b.ca.cert_pem)).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if full_handshakes {
        config.resumption = rustls::client::Resumption::disabled();
    }
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

fn connector(roots: &[&Bundle]) -> tokio_rustls::TlsConnector {
    connector_with(roots, false)
}

async fn connect(
    addr: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tls.connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))
}

fn post_head(path: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    )
}

/// One AdmissionReview POST on a fresh TLS connection.
async fn admit(
    addr: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
    body: &[u8],
) -> Result<(u16, String), String> {
    let mut s = connect(addr, tls).await?;
    let alpn = s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    if alpn.as_deref() != Some(b"http/1.1".as_slice()) {
        return Err(format!("ALPN negotiated {alpn:?}"));
    }
    s.write_all(post_head(MUTATE_PATH, body.len()).as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    s.write_all(body).await.map_err(|e| format!("write: {e}"))?;
    read_response(&mut s).await
}

/// Writes `bytes` one at a time, `gap` apart, until the server closes the connection or
/// the bytes run out; returns how long the server let it go on.
async fn trickle<S: AsyncWrite + AsyncRead + Unpin>(
    s: &mut S,
    bytes: &[u8],
    gap: Duration,
) -> (Duration, &'static str) {
    let start = Instant::now();
    for b in bytes {
        if s.write_all(&[*b]).await.is_err() || s.flush().await.is_err() {
            return (start.elapsed(), "write failed");
        }
        // The server may answer (408) or close at any time: look without blocking long.
        let mut one = [0u8; 1];
        match tokio::time::timeout(gap, s.read(&mut one)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (start.elapsed(), "closed"),
            Ok(Ok(_)) => return (start.elapsed(), "answered"),
            Err(_) => {}
        }
    }
    (start.elapsed(), "never cut off")
}

/// The webhook with one certificate installed like the kubelet does, and a client
/// trusting it. The temp dir must outlive the server.
async fn serve(timeouts: Timeouts) -> (tempfile::TempDir, Running, tokio_rustls::TlsConnector) {
    let dir = tempfile::tempdir().unwrap();
    let b = bundle();
    install_like_kubelet(dir.path(), &b, 0);
    let server = start(dir.path(), timeouts).await;
    (dir, server, connector(&[&b]))
}

// -------------------------------------------------------------------------- slowloris

/// The four slowloris clients, each in a task: how it ended and after how long. Each
/// counts itself in `started` once it is connected and has sent its first byte (the
/// silent one: once its TLS handshake is done), and gives up by itself after
/// [`GIVE_UP`].
struct SlowClients {
    /// Headers trickled byte by byte (a long header line).
    headers: tokio::task::JoinHandle<(Duration, &'static str)>,
    /// The TLS handshake itself trickled: a ClientHello-looking prefix.
    handshake: tokio::task::JoinHandle<(Duration, &'static str)>,
    /// TLS done, then silence (not a single byte of HTTP): whether it was closed.
    silent: tokio::task::JoinHandle<(Duration, bool)>,
    /// Headers complete, body trickled: the server's answer, if any.
    slow_body: tokio::task::JoinHandle<(Duration, String)>,
    started: Arc<AtomicUsize>,
}

impl SlowClients {
    fn spawn(addr: SocketAddr, tls: &tokio_rustls::TlsConnector, body: &[u8]) -> Self {
        let gap = Duration::from_millis(100);
        let started = Arc::new(AtomicUsize::new(0));
        let headers = tokio::spawn({
            let (tls, started) = (tls.clone(), started.clone());
            async move {
                let mut s = connect(addr, &tls).await.unwrap();
                let slow = format!(
                    "POST {MUTATE_PATH} HTTP/1.1\r\nhost: localhost\r\nx-slow: {}",
                    "a".repeat(150)
                );
                s.write_all(&slow.as_bytes()[..1]).await.unwrap();
                started.fetch_add(1, Ordering::SeqCst);
                trickle(&mut s, &slow.as_bytes()[1..], gap).await
            }
        });
        let handshake = tokio::spawn({
            let started = started.clone();
            async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let mut hello = vec![
                    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
                ];
                hello.extend(std::iter::repeat_n(0x42, 150));
                s.write_all(&hello[..1]).await.unwrap();
                started.fetch_add(1, Ordering::SeqCst);
                trickle(&mut s, &hello[1..], gap).await
            }
        });
        let silent = tokio::spawn({
            let (tls, started) = (tls.clone(), started.clone());
            async move {
                let mut s = connect(addr, &tls).await.unwrap();
                started.fetch_add(1, Ordering::SeqCst);
                let start = Instant::now();
                let mut buf = [0u8; 64];
                let r = tokio::time::timeout(GIVE_UP, s.read(&mut buf)).await;
                (start.elapsed(), matches!(r, Ok(Ok(0)) | Ok(Err(_))))
            }
        });
        let slow_body = tokio::spawn({
            let (tls, started, body) = (tls.clone(), started.clone(), body.to_vec());
            async move {
                let mut s = connect(addr, &tls).await.unwrap();
                s.write_all(post_head(MUTATE_PATH, body.len()).as_bytes())
                    .await
                    .unwrap();
                started.fetch_add(1, Ordering::SeqCst);
                let start = Instant::now();
                for b in &body {
                    if s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(gap).await;
                    if start.elapsed() > GIVE_UP {
                        break;
                    }
                    // Stop trickling once the server has answered.
                    let mut peek = [0u8; 1];
                    if let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(1), s.read(&mut peek)).await
                    {
                        let mut rest = Vec::new();
                        let _ = s.read_to_end(&mut rest).await;
                        let mut all = peek[..n].to_vec();
                        all.extend(rest);
                        return (start.elapsed(), String::from_utf8_lossy(&all).into_owned());
                    }
                }
                (start.elapsed(), String::new())
            }
        });
        Self {
            headers,
            handshake,
            silent,
            slow_body,
            started,
        }
    }

    /// Waits until all four are connected and sending (or silent).
    async fn wait_started(&self) {
        wait_until(
            "four slow clients connected",
            Duration::from_secs(10),
            || self.started.load(Ordering::SeqCst) == 4,
        )
        .await;
    }

    fn finished(&self) -> [bool; 4] {
        [
            self.headers.is_finished(),
            self.handshake.is_finished(),
            self.silent.is_finished(),
            self.slow_body.is_finished(),
        ]
    }

    fn abort(&self) {
        self.headers.abort();
        self.handshake.abort();
        self.silent.abort();
        self.slow_body.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_do_not_block_others() {
    // Bounds far beyond the test: the slow clients stay connected throughout.
    let (_dir, server, tls) = serve(PATIENT).await;
    let addr = server.https;
    let body = serde_json::to_vec(&pod_review("ok", labelled_pod())).unwrap();
    let slow = SlowClients::spawn(addr, &tls, &body);
    slow.wait_started().await;

    // Well-behaved clients are served while every slow client is still connected: none
    // of these requests waited for a slow one to go away (they only go when they give
    // up, after GIVE_UP). An ordering, not a measured time.
    for _ in 0..10 {
        let (status, _) = admit(addr, &tls, &body).await.unwrap();
        assert_eq!(status, 200);
    }
    assert_eq!(
        slow.finished(),
        [false; 4],
        "a slow client went away before the others were served"
    );
    slow.abort();
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off() {
    let (_dir, server, tls) = serve(TIMEOUTS).await;
    let addr = server.https;
    let body = serde_json::to_vec(&pod_review("ok", labelled_pod())).unwrap();

    // Warm up: the server answers.
    assert_eq!(admit(addr, &tls, &body).await.unwrap().0, 200);

    // Each slow client is cut off by the server (closed, or answered 408) before it gives
    // up by itself: the outcome, not a measured time, is asserted.
    let slow = SlowClients::spawn(addr, &tls, &body);
    let (took, how) = slow.headers.await.unwrap();
    eprintln!("trickled headers: {how} after {took:?}");
    assert_ne!(how, "never cut off", "headers after {took:?}");
    let (took, how) = slow.handshake.await.unwrap();
    eprintln!("trickled TLS handshake: {how} after {took:?}");
    assert_ne!(how, "never cut off", "handshake after {took:?}");
    let (took, closed) = slow.silent.await.unwrap();
    eprintln!("silent connection: closed={closed} after {took:?}");
    assert!(closed, "silent: not closed after {took:?}");
    let (took, answer) = slow.slow_body.await.unwrap();
    eprintln!("trickled body: after {took:?}: {:?}", answer.lines().next());
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "body: {answer:?} after {took:?}"
    );
    assert!(answer.contains("\"code\":408"), "{answer}");

    // Still serving.
    assert_eq!(admit(addr, &tls, &body).await.unwrap().0, 200);
    drop(server);
}

// ------------------------------------------------------------------ hostile bodies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_deeply_nested_bodies_get_400() {
    let (_dir, server, tls) = serve(TIMEOUTS).await;
    let addr = server.https;

    // Declared too large: refused from the header, before the body is read.
    let mut s = connect(addr, &tls).await.unwrap();
    s.write_all(post_head(MUTATE_PATH, MAX_BODY_BYTES + 1).as_bytes())
        .await
        .unwrap();
    // A 400 naming the size (a server waiting for the body would answer 408 once the
    // request bound passes).
    let (status, body) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("exceeds"), "{body}");

    // Chunked (no declared length) and too large: cut at the limit.
    let mut s = connect(addr, &tls).await.unwrap();
    s.write_all(
        format!("POST {MUTATE_PATH} HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![b' '; 256 * 1024];
    let writer = tokio::spawn(async move {
        for _ in 0..(MAX_BODY_BYTES / chunk.len() + 4) {
            let head = format!("{:x}\r\n", chunk.len());
            if s.write_all(head.as_bytes()).await.is_err()
                || s.write_all(&chunk).await.is_err()
                || s.write_all(b"\r\n").await.is_err()
            {
                break;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n").await;
        read_response(&mut s).await
    });
    let (status, body) = writer.await.unwrap().unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("exceeds"), "{body}");

    // Deeply nested JSON, bare and inside a valid review, on both admission paths: a
    // JSON 400 from the parser's depth limit, not a stack overflow of the server.
    let depth = 1_000_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = format!("{}1{}", "{\"a\":".repeat(depth / 5), "}".repeat(depth / 5));
    let in_review = pod_review("deep", labelled_pod()).to_string().replacen(
        "\"spec\":",
        &format!("\"deep\":{},\"spec\":", &arrays[..]),
        1,
    );
    let validate = "/validate-marin3r-3scale-net-v1alpha1-envoyconfig";
    // Expected: a bare array is refused at its first byte, unknown deep fields are
    // skipped without recursion, and nesting inside `request.object` (kept as a JSON
    // value) hits serde_json's depth limit of 128, long before the stack would.
    for (name, path, body, expected) in [
        (
            "arrays",
            MUTATE_PATH,
            arrays.as_str(),
            "not an AdmissionReview",
        ),
        (
            "objects",
            MUTATE_PATH,
            objects.as_str(),
            "expected apiVersion",
        ),
        (
            "inside a review",
            MUTATE_PATH,
            in_review.as_str(),
            "recursion limit",
        ),
        (
            "arrays, validating webhook",
            validate,
            arrays.as_str(),
            "not an AdmissionReview",
        ),
        (
            "inside a review, validating webhook",
            validate,
            in_review.as_str(),
            "recursion limit",
        ),
    ] {
        let mut s = connect(addr, &tls).await.unwrap();
        s.write_all(post_head(path, body.len()).as_bytes())
            .await
            .unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        let (status, answer) = read_response(&mut s).await.unwrap();
        assert_eq!(status, 400, "{name}: {answer}");
        let v: Value = serde_json::from_str(&answer).unwrap();
        let error = v["error"].as_str().unwrap();
        assert!(error.contains(expected), "{name}: {answer}");
        eprintln!("{name}: {status} {error}");
    }

    // The server is alive and well.
    let ok = serde_json::to_vec(&pod_review("after", labelled_pod())).unwrap();
    assert_eq!(admit(addr, &tls, &ok).await.unwrap().0, 200);
    drop(server);
}

// ---------------------------------------------------------- certificate rotation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_failed_requests_under_load_while_certificates_rotate() {
    const CLIENTS: usize = 8;
    const REQUESTS: usize = 40;
    const ROTATIONS: usize = 8;

    let dir = tempfile::tempdir().unwrap();
    let bundles: Vec<Bundle> = (0..4).map(|_| bundle()).collect();
    install_like_kubelet(dir.path(), &bundles[0], 0);
    let server = start(dir.path(), TIMEOUTS).await;
    let addr = server.https;
    let roots: Vec<&Bundle> = bundles.iter().collect();
    // Half the clients resume TLS sessions (no certificate on the wire), half always do
    // a full handshake with the certificate of the moment.
    let resuming = connector_with(&roots, false);
    let full = connector_with(&roots, true);
    let body = Arc::new(serde_json::to_vec(&pod_review("load", labelled_pod())).unwrap());

    // The clients run until the rotations are over (and at least REQUESTS each).
    let done = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let tls = if c % 2 == 0 {
            full.clone()
        } else {
            resuming.clone()
        };
        let (body, failures, done) = (body.clone(), failures.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut i = 0;
            while i < REQUESTS || !done.load(Ordering::Relaxed) {
                i += 1;
                let result = async {
                    let mut s = connect(addr, &tls).await?;
                    let peer = s.get_ref().1.peer_certificates().unwrap()[0]
                        .clone()
                        .into_owned();
                    s.write_all(post_head(MUTATE_PATH, body.len()).as_bytes())
                        .await
                        .map_err(|e| e.to_string())?;
                    s.write_all(&body).await.map_err(|e| e.to_string())?;
                    let (status, answer) = read_response(&mut s).await?;
                    if status != 200 || !answer.contains("\"patchType\":\"JSONPatch\"") {
                        return Err(format!("status {status}: {answer}"));
                    }
                    Ok::<_, String>(peer)
                }
                .await;
                match result {
                    Ok(peer) => seen.push((c % 2 == 0, peer)),
                    Err(e) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        eprintln!("client {c} request {i} failed: {e}");
                    }
                }
            }
            seen
        }));
    }
    // Rotate while the clients run: kubelet-style symlink swaps, alternating with
    // cert-manager-style in-place atomic renames of each file (key first, so a reader
    // can see a new key with the old certificate in between).
    let rotator = {
        let dir = dir.path().to_path_buf();
        let bundles = bundles.clone();
        let done = done.clone();
        tokio::spawn(async move {
            for r in 1..=ROTATIONS {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let b = &bundles[r % bundles.len()];
                if r % 2 == 0 {
                    install_like_kubelet(&dir, b, r);
                } else {
                    for (name, pem) in [
                        ("tls.key", &b.server.key_pem),
                        ("tls.crt", &b.server.cert_pem),
                    ] {
                        let data = dir.join("..data");
                        let tmp = data.join(format!(".{name}.tmp"));
                        std::fs::write(&tmp, pem).unwrap();
                        std::fs::rename(&tmp, data.join(name)).unwrap();
                    }
                }
            }
            // Let the last certificate be served for a while.
            tokio::time::sleep(Duration::from_millis(150)).await;
            done.store(true, Ordering::Relaxed);
            ROTATIONS
        })
    };
    let started = Instant::now();
    let mut seen = Vec::new();
    for c in clients {
        seen.extend(c.await.unwrap());
    }
    let rotations = rotator.await.unwrap();
    let elapsed = started.elapsed();
    let distinct: std::collections::BTreeSet<Vec<u8>> = seen
        .iter()
        .filter(|(full, _)| *full)
        .map(|(_, c)| c.as_ref().to_vec())
        .collect();
    eprintln!(
        "{} requests from {CLIENTS} clients in {elapsed:?}, {rotations} rotations, {} distinct server certificates seen by full handshakes, {} failures",
        seen.len(),
        distinct.len(),
        failures.load(Ordering::Relaxed)
    );
    assert_eq!(failures.load(Ordering::Relaxed), 0, "failed requests");
    assert!(seen.len() >= CLIENTS * REQUESTS);
    assert!(
        distinct.len() == bundles.len(),
        "the rotation did not reach the clients: {} certificates",
        distinct.len()
    );
    drop(server);
}

// -------------------------------------------------------------- graceful shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_the_request_in_flight() {
    // The request bound is not what is tested here: give the slow request room.
    let (_dir, mut server, tls) = serve(Timeouts {
        request: Duration::from_secs(10),
        ..TIMEOUTS
    })
    .await;
    let addr = server.https;
    let body = serde_json::to_vec(&pod_review("in-flight", labelled_pod())).unwrap();

    // A request in flight: headers and half of the body sent.
    let mut s = connect(addr, &tls).await.unwrap();
    let half = body.len() / 2;
    s.write_all(post_head(MUTATE_PATH, body.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(&body[..half]).await.unwrap();
    s.flush().await.unwrap();
    // The server shows no sign of having read the headers (a connection without a
    // request would count as idle and be closed at once): no condition to await.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Shutdown signal.
    server.stop.take().unwrap().send(()).unwrap();

    // New connections are no longer served...
    wait_until_async(
        "new connections refused",
        Duration::from_secs(5),
        || async { admit(addr, &tls, &body).await.is_err() },
    )
    .await;
    assert!(!server.task.is_finished(), "the server did not wait");

    // ...but the request in flight completes, slowly: the server keeps waiting for it (a
    // negative, so a short fixed window).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!server.task.is_finished(), "the server did not wait");
    s.write_all(&body[half..]).await.unwrap();
    let (status, answer) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["response"]["uid"], "in-flight");
    assert_eq!(v["response"]["patchType"], "JSONPatch");

    // Then the server stops by itself, well before the graceful bound.
    tokio::time::timeout(Duration::from_secs(5), &mut server.task)
        .await
        .expect("the server did not stop after its last request")
        .unwrap()
        .unwrap();
}

/// The admission listener holds at most `MAX_CONNECTIONS` connections: one more is
/// closed before its TLS handshake completes (no bytes of its are buffered), the others
/// are untouched, and once one leaves a new client is served.
#[tokio::test]
async fn connections_past_the_cap_are_closed_and_a_freed_slot_serves_again() {
    let (_dir, server, tls) = serve(PATIENT).await;
    let mut held = Vec::new();
    for _ in 0..marin3r_webhook::MAX_CONNECTIONS {
        held.push(connect(server.https, &tls).await.unwrap());
    }
    assert!(
        connect(server.https, &tls).await.is_err(),
        "a connection past the cap completed its handshake"
    );
    drop(held.pop());
    let body = pod_review("cap", labelled_pod()).to_string();
    let deadline = Instant::now() + GIVE_UP;
    loop {
        match admit(server.https, &tls, body.as_bytes()).await {
            Ok((200, _)) => break,
            other => assert!(Instant::now() < deadline, "never served again: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connections held all along still work.
    let mut first = held.remove(0);
    first
        .write_all(post_head(MUTATE_PATH, body.len()).as_bytes())
        .await
        .unwrap();
    first.write_all(body.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut first).await.unwrap().0, 200);
}

/// `--tls-dir` alone, the OLM way: the webhook serves OLM v0's `apiserver.crt` /
/// `apiserver.key`, then follows a Secret volume update (the kubelet's `..data` swap)
/// that brings a `kubernetes.io/tls` layout with a new certificate; admission goes on
/// all along.
#[tokio::test]
async fn tls_dir_alone_serves_the_olm_layout_and_follows_a_swap_to_the_other() {
    use marin3r_wire::olm::{APISERVER_CRT, APISERVER_KEY};
    use marin3r_wire::secret_keys::{TLS_CRT, TLS_KEY};
    let dir = tempfile::tempdir().unwrap();
    let (olm, renewed) = (bundle(), bundle());
    let swap = |generation: usize, files: [(&str, &str); 2]| {
        let data = dir.path().join(format!("..gen_{generation}"));
        std::fs::create_dir_all(&data).unwrap();
        for (name, content) in files {
            std::fs::write(data.join(name), content).unwrap();
        }
        let tmp = dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(data.file_name().unwrap(), &tmp).unwrap();
        std::fs::rename(&tmp, dir.path().join("..data")).unwrap();
        for (name, _) in files {
            let link = dir.path().join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
            }
        }
    };
    swap(
        1,
        [
            (APISERVER_CRT, &olm.server.cert_pem),
            (APISERVER_KEY, &olm.server.key_pem),
        ],
    );
    let server = common::start_serving(marin3r_certs::ServingFiles::dir(dir.path()), PATIENT).await;
    let tls = connector_with(&[&olm, &renewed], true);
    let leaf = |b: &Bundle| cert_der(&b.server.cert_pem);
    let served = || async {
        let s = connect(server.https, &tls).await.unwrap();
        s.get_ref().1.peer_certificates().unwrap()[0]
            .clone()
            .into_owned()
    };
    assert_eq!(served().await, leaf(&olm));
    let body = pod_review("olm", labelled_pod()).to_string();
    assert_eq!(
        admit(server.https, &tls, body.as_bytes()).await.unwrap().0,
        200
    );

    // The next Secret version holds tls.crt/tls.key only: apiserver.* now dangle.
    swap(
        2,
        [
            (TLS_CRT, &renewed.server.cert_pem),
            (TLS_KEY, &renewed.server.key_pem),
        ],
    );
    assert_eq!(served().await, leaf(&renewed));
    assert_eq!(
        admit(server.https, &tls, body.as_bytes()).await.unwrap().0,
        200
    );
}
