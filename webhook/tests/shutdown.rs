//! The webhook process stops at once on its shutdown signal when nothing is in flight,
//! even with client connections open: one idle after a request (kept alive), one that
//! never finishes its TLS handshake.
//!
//! The connections are real sockets, so the test sets them up on the real clock, then
//! pauses tokio's clock before the signal: the "within 2 s" bound is virtual time, and
//! with the clock paused every timer the server could wait on (the 10 s handshake
//! timeout, the 25 s graceful shutdown) would be reached only after it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{bundle, start};
use marin3r_webhook::Timeouts;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 response whose body is framed by `content-length`; the
/// connection stays open.
async fn read_one_response<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before a whole response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return head.to_string();
            }
        }
    }
}

#[tokio::test]
async fn sigterm_with_idle_connections_open_stops_the_webhook_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = bundle();
    std::fs::write(dir.path().join("tls.crt"), &b.server.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &b.server.key_pem).unwrap();
    let mut server = start(dir.path(), Timeouts::default()).await;
    marin3r_testkit::wait_until_async("webhook ready", Duration::from_secs(10), || async {
        marin3r_testkit::http::get(server.probes, "/readyz")
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    let client = marin3r_testkit::tls::client_config(&b.ca.cert_pem)
        .alpn(b"http/1.1")
        .build()
        .unwrap();

    // 1. Idle after one request: the connection is kept alive.
    let tcp = TcpStream::connect(server.https).await.unwrap();
    let mut kept_alive = tokio_rustls::TlsConnector::from(client.clone())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    kept_alive
        .write_all(b"GET /no-such-path HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let head = read_one_response(&mut kept_alive).await;
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );

    // 2. Half a TLS handshake: the ClientHello is sent and the server's answer read (so
    //    the server has accepted the connection and waits for the client's Finished),
    //    then nothing more.
    let mut stalled = TcpStream::connect(server.https).await.unwrap();
    let mut hello =
        rustls::ClientConnection::new(client, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut client_hello = Vec::new();
    hello.write_tls(&mut client_hello).unwrap();
    stalled.write_all(&client_hello).await.unwrap();
    let mut first = [0u8; 1];
    stalled.read_exact(&mut first).await.unwrap();
    assert_eq!(first[0], 0x16, "a TLS handshake record from the server");

    tokio::time::pause();
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(2), &mut server.task)
        .await
        .expect("the webhook did not stop within 2 s of its shutdown signal")
        .unwrap()
        .unwrap();
    drop((kept_alive, stalled));
}
