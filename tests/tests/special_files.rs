//! The class "every file we read goes through one bounded, regular-file-only,
//! non-blocking reader" (`marin3r-fsread`), walked over every reader of a served file and
//! every kind of special file ([`Special::ALL`]: FIFO, `/dev/zero`, socket, dangling
//! symlink, directory, huge sparse file):
//!
//! - at start: each reader refuses the file at once with an error naming it (a FIFO used
//!   to block the start for ever, `/dev/zero` to read until memory ran out);
//! - while running: the discovery service and the webhook keep answering `/metrics` and
//!   `/readyz` and completing new handshakes, with the last good certificate, while a
//!   served certificate, key or CA bundle is replaced by each kind (a FIFO as `tls.crt`
//!   used to stall the next scrape, then `/readyz` and every new handshake).
//!
//! The config folder's manifests and the state files go through the same reader; their
//! own class tests are `control-plane/src/local/folder.rs`
//! (`special_files_never_block_the_scan_are_reported_and_never_delete`) and
//! `control-plane/src/local/state.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use marin3r_certs::Bundle;
use marin3r_testkit::special_files::{Special, replace_with};
use marin3r_tests::in_process::{CertFiles, InProcess, bind_localhost};
use marin3r_tests::xds::issue_bundle;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Bound of one answer; a reader that blocks never answers.
const ANSWER: Duration = Duration::from_secs(10);

/// Runs `f` on a thread of its own and waits up to [`ANSWER`]: a read that blocks fails
/// the test instead of hanging it.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(ANSWER)
        .unwrap_or_else(|_| panic!("{what}: the read blocked"))
}

/// One reader of a served file at start: loads from `path`, the error text if it fails.
type StartReader = fn(&Path, &Path, &Path) -> Result<(), String>;

/// Every reader of a served PEM file, at start, with which of the three files it reads:
/// `(name, reader, which)`, the reader taking (certificate, key, CA).
fn start_readers() -> Vec<(&'static str, StartReader, usize)> {
    fn resolver(cert: &Path, key: &Path, _: &Path) -> Result<(), String> {
        marin3r_certs::ReloadingCertResolver::new(cert, key)
            .map(drop)
            .map_err(|e| marin3r_wire::error_chain(&e))
    }
    fn verifier(_: &Path, _: &Path, ca: &Path) -> Result<(), String> {
        marin3r_certs::ReloadingClientVerifier::new(ca)
            .map(drop)
            .map_err(|e| marin3r_wire::error_chain(&e))
    }
    fn pem(cert: &Path, _: &Path, _: &Path) -> Result<(), String> {
        marin3r_certs::load_certs(cert)
            .map(drop)
            .map_err(|e| marin3r_wire::error_chain(&e))
    }
    fn key(_: &Path, key: &Path, _: &Path) -> Result<(), String> {
        marin3r_certs::load_private_key(key)
            .map(drop)
            .map_err(|e| marin3r_wire::error_chain(&e))
    }
    vec![
        ("server certificate (resolver)", resolver, 0),
        ("server key (resolver)", resolver, 1),
        ("client CA bundle (verifier)", verifier, 2),
        ("certificate file (load_certs)", pem, 0),
        ("key file (load_private_key)", key, 1),
    ]
}

struct Files {
    _dir: tempfile::TempDir,
    bundle: Bundle,
    certs: CertFiles,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let bundle = issue_bundle().unwrap();
    bundle.write_to(dir.path()).unwrap();
    let certs = CertFiles::in_dir(dir.path());
    Files {
        _dir: dir,
        bundle,
        certs,
    }
}

impl Files {
    fn paths(&self) -> [PathBuf; 3] {
        [
            self.certs.server_cert.clone(),
            self.certs.server_key.clone(),
            self.certs.ca_file.clone(),
        ]
    }

    fn good(&self, which: usize) -> String {
        match which {
            0 => self.bundle.server.cert_pem.clone(),
            1 => self.bundle.server.key_pem.clone(),
            _ => self.bundle.ca.cert_pem.clone(),
        }
    }
}

#[test]
fn every_reader_refuses_every_special_file_at_start_at_once_naming_it() {
    let mut wrong = Vec::new();
    for kind in Special::ALL {
        for (name, reader, which) in start_readers() {
            let f = files();
            let paths = f.paths();
            kind.make(&paths[which]);
            let [cert, key, ca] = paths.clone();
            let got = within(&format!("{name}, {kind:?}"), move || {
                reader(&cert, &key, &ca)
            });
            match got {
                Err(e)
                    if e.contains(&*paths[which].to_string_lossy())
                        && e.contains(kind.expected_error()) => {}
                other => wrong.push(format!("{name}, {kind:?}: {other:?}")),
            }
        }
        // The expiry metric's reader: no series, at once.
        let f = files();
        kind.make(&f.certs.server_cert);
        let path = f.certs.server_cert.clone();
        let text = within(&format!("certificate expiry metric, {kind:?}"), move || {
            let mut registry = prometheus_client::registry::Registry::default();
            marin3r_process::CertificateExpiry::served([("discovery-service-server", path)])
                .register(&mut registry);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        });
        if text.contains("discovery-service-server") {
            wrong.push(format!("certificate expiry metric, {kind:?}: {text}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A new mTLS handshake with `addr` (SNI `localhost`), then the HTTP/2 preface: the
/// leaf certificate served, once the server answered with its SETTINGS (so it verified
/// the client certificate against its CA file as it is now).
async fn handshake(
    addr: SocketAddr,
    bundle: &Bundle,
    alpn: &[u8],
    h2: bool,
) -> CertificateDer<'static> {
    let mut config = marin3r_testkit::tls::client_config(&bundle.ca.cert_pem).alpn(alpn);
    if h2 {
        config = config.identity(&bundle.client.cert_pem, &bundle.client.key_pem);
    }
    let connector = tokio_rustls::TlsConnector::from(config.build().unwrap());
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        if h2 {
            tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
                .await
                .unwrap();
            let mut frame = [0u8; 9];
            tls.read_exact(&mut frame).await.unwrap();
            assert_eq!(frame[3], 0x4, "the server's first frame is SETTINGS");
        }
        tls.get_ref().1.peer_certificates().unwrap()[0]
            .clone()
            .into_owned()
    };
    tokio::time::timeout(ANSWER, exchange)
        .await
        .unwrap_or_else(|_| panic!("the handshake with {addr} did not complete"))
}

/// `/metrics` and `/readyz` answer (the latter 200) within [`ANSWER`].
async fn answers(metrics: SocketAddr, health: SocketAddr, during: &str) {
    for (addr, path) in [
        (metrics, "/metrics"),
        (health, "/readyz"),
        (metrics, "/metrics"),
    ] {
        let got = marin3r_testkit::http::Request::get(path)
            .timeout(ANSWER)
            .send(addr)
            .await;
        match got {
            Ok(r) if r.status == 200 => {}
            other => panic!("{during}: GET {path}: {other:?}"),
        }
    }
}

/// A runtime for the servers, apart from the test's own: a server whose worker threads
/// block (a FIFO opened the old way) must fail the test's bounded checks, not freeze
/// their timers too. Dropped without waiting for blocked threads.
struct Servers(Option<tokio::runtime::Runtime>);

impl Drop for Servers {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

#[test]
fn served_files_replaced_by_special_files_while_running_keep_every_listener_answering() {
    let servers = Servers(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    ));
    let on_servers = servers.0.as_ref().unwrap().handle().clone();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client.block_on(while_running(on_servers));
    drop(servers);
}

async fn while_running(on_servers: tokio::runtime::Handle) {
    let f = files();
    let config_dir = f._dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    let certs = f.certs.clone();
    let discovery = on_servers
        .spawn(async move {
            InProcess::launch(
                bind_localhost().await.unwrap(),
                &certs,
                marin3r_xds::AdsConfig::default(),
                marin3r_control_plane::local::LocalBackend::new(&config_dir),
            )
            .await
            .unwrap()
        })
        .await
        .unwrap();

    // The webhook, on the same server certificate and key.
    let https = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    https.set_nonblocking(true).unwrap();
    let listeners = on_servers
        .spawn(async move {
            marin3r_webhook::Listeners {
                https,
                probes: bind_localhost().await.unwrap(),
                metrics: bind_localhost().await.unwrap(),
            }
        })
        .await
        .unwrap();
    let webhook_config = marin3r_webhook::Config {
        webhook_addr: listeners.https.local_addr().unwrap(),
        tls: marin3r_certs::ServingFiles::pair(&f.certs.server_cert, &f.certs.server_key),
        health_addr: listeners.probes.local_addr().unwrap(),
        metrics_addr: listeners.metrics.local_addr().unwrap(),
        defaults: marin3r_sidecar::Defaults::default(),
    };
    let webhook_addrs = (
        webhook_config.webhook_addr,
        webhook_config.metrics_addr,
        webhook_config.health_addr,
    );
    let webhook = on_servers.spawn(marin3r_webhook::serve(
        webhook_config,
        listeners,
        std::future::pending(),
    ));
    let webhook = AbortOnDrop(webhook);

    let ready = |addr: SocketAddr| async move {
        marin3r_testkit::http::get(addr, "/readyz")
            .await
            .is_ok_and(|r| r.status == 200)
    };
    marin3r_testkit::wait_until_async("the discovery service ready", ANSWER * 3, || {
        ready(discovery.health)
    })
    .await;
    marin3r_testkit::wait_until_async("the webhook ready", ANSWER * 3, || ready(webhook_addrs.2))
        .await;

    let original = handshake(discovery.xdss, &f.bundle, b"h2", true).await;
    assert_eq!(
        handshake(webhook_addrs.0, &f.bundle, b"http/1.1", false).await,
        original
    );

    for (which, path) in f.paths().iter().enumerate() {
        for kind in Special::ALL {
            let during = format!("{} replaced by {kind:?}", path.display());
            kind.make(path);
            answers(discovery.metrics, discovery.health, &during).await;
            answers(webhook_addrs.1, webhook_addrs.2, &during).await;
            assert_eq!(
                handshake(discovery.xdss, &f.bundle, b"h2", true).await,
                original,
                "{during}: the discovery service keeps its last good certificate"
            );
            if which < 2 {
                assert_eq!(
                    handshake(webhook_addrs.0, &f.bundle, b"http/1.1", false).await,
                    original,
                    "{during}: the webhook keeps its last good certificate"
                );
            }
            replace_with(path, f.good(which).as_bytes());
        }
    }
    assert!(!webhook.0.is_finished());
    assert!(!discovery.is_finished());
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
