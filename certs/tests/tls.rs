//! Real TLS handshakes on 127.0.0.1 against `server_config` / `mtls_server_config`,
//! rotating the files under a running server.

// Test-only crate: clippy's allow-*-in-tests does not cover helper functions here.
#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use marin3r_certs::{
    CertsError, ReloadingCertResolver, ca_file_in_dir, mtls_server_config, server_config,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ServerConfig, SupportedProtocolVersion};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const STEP: Duration = Duration::from_secs(10);

/// A test CA that can sign any number of certificates.
struct TestCa {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, PEM, plus the certificate's DER for comparisons.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl TestCa {
    fn new(cn: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert_pem = params.self_signed(&key).unwrap().pem();
        Self {
            cert_pem,
            issuer: Issuer::new(params, key),
        }
    }

    fn server(&self, hosts: &[&str]) -> Leaf {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        let mut params = CertificateParams::new(hosts).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    fn client(&self, cn: &str) -> Leaf {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

/// Writes `contents` in place (same inode) and gives the file a modification time no
/// other write in this process used, so the change is visible whatever the file system's
/// timestamp granularity and even when the length stays the same.
fn write_in_place(path: &Path, contents: &str) {
    static TICK: AtomicU64 = AtomicU64::new(1);
    std::fs::write(path, contents).unwrap();
    let tick = TICK.fetch_add(1, Ordering::Relaxed);
    let mtime = SystemTime::now() + Duration::from_secs(1000 * tick);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
}

/// Writes a certificate and key into `dir` as tls.crt / tls.key; returns their paths.
fn write_leaf(dir: &Path, leaf: &Leaf) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    write_in_place(&key, &leaf.key_pem);
    write_in_place(&cert, &leaf.cert_pem);
    (cert, key)
}

/// Serves `config` on 127.0.0.1: every accepted TLS connection receives `ok`.
async fn serve(config: Arc<ServerConfig>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tls.write_all(b"ok").await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    addr
}

/// A client trusting `ca_pem`, optionally presenting `identity`, limited to `versions`.
fn client_config(
    ca_pem: &str,
    identity: Option<&Leaf>,
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let builder = marin3r_testkit::tls::client_config(ca_pem).versions(versions);
    match identity {
        Some(leaf) => builder.identity(&leaf.cert_pem, &leaf.key_pem),
        None => builder,
    }
    .build()
    .unwrap()
}

/// A client config with its own session cache: reusing one would resume the session of a
/// previous connection, where the server sends no certificate.
fn default_client(ca_pem: &str, identity: Option<&Leaf>) -> Arc<ClientConfig> {
    client_config(ca_pem, identity, rustls::DEFAULT_VERSIONS)
}

/// Connects to `addr` as `localhost`, reads the server's `ok` and returns the server's
/// leaf certificate. A refused handshake is an error (with TLS 1.3 a refused client
/// certificate only shows on the first read).
async fn fetch(addr: SocketAddr, config: Arc<ClientConfig>) -> io::Result<CertificateDer<'static>> {
    let exchange = async {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = TlsConnector::from(config).connect(name, tcp).await?;
        let peer = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .cloned()
            .ok_or_else(|| io::Error::other("no peer certificate"))?;
        let mut buf = [0; 2];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ok");
        Ok(peer)
    };
    timeout(STEP, exchange)
        .await
        .map_err(|_| io::Error::other("timed out"))?
}

#[tokio::test]
async fn server_picks_up_certificates_rewritten_in_place() {
    let ca = TestCa::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let v1 = ca.server(&["localhost", "v1.example"]);
    let (cert, key) = write_leaf(dir.path(), &v1);
    let addr = serve(server_config(&cert, &key, &[]).unwrap()).await;

    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v1.der
    );
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v1.der
    );

    let v2 = ca.server(&["localhost", "v2.example"]);
    write_leaf(dir.path(), &v2);
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v2.der
    );

    // Garbage keeps the last good certificate, on every later handshake too.
    write_in_place(&cert, "not a certificate");
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v2.der
    );
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v2.der
    );

    // A new certificate whose key has not arrived yet (mismatch) is not served either...
    let v3 = ca.server(&["localhost", "v3.example"]);
    write_in_place(&cert, &v3.cert_pem);
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v2.der
    );
    // ...until its key is there.
    write_in_place(&key, &v3.key_pem);
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v3.der
    );

    // A removed file is a failed reload as well; its return is picked up.
    std::fs::remove_file(&key).unwrap();
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v3.der
    );
    let v4 = ca.server(&["localhost"]);
    write_leaf(dir.path(), &v4);
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v4.der
    );
}

/// Repoints `dir/..data` to `dir/target` atomically, like the kubelet does.
fn swap_data_symlink(dir: &Path, target: &str) {
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// Writes a certificate and key into `dir/version` without touching the mtime.
fn write_version(dir: &Path, version: &str, leaf: &Leaf) {
    let sub = dir.join(version);
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("tls.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(sub.join("tls.key"), &leaf.key_pem).unwrap();
}

#[tokio::test]
async fn server_picks_up_a_kubernetes_symlink_swap() {
    let ca = TestCa::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = ca.server(&["localhost", "v1.example"]);
    write_version(d, "v1", &v1);
    swap_data_symlink(d, "v1");
    for f in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), d.join(f)).unwrap();
    }
    let addr = serve(server_config(d.join("tls.crt"), d.join("tls.key"), &[]).unwrap()).await;
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v1.der
    );

    let v2 = ca.server(&["localhost", "v2.example"]);
    write_version(d, "v2", &v2);
    swap_data_symlink(d, "v2");
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v2.der
    );

    // A broken version behind the symlink keeps v2 served.
    let sub = d.join("v3");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("tls.crt"), &v2.cert_pem).unwrap();
    std::fs::write(sub.join("tls.key"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    swap_data_symlink(d, "v3");
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v2.der
    );

    let v4 = ca.server(&["localhost", "v4.example"]);
    write_version(d, "v4", &v4);
    swap_data_symlink(d, "v4");
    assert_eq!(
        fetch(addr, default_client(&ca.cert_pem, None))
            .await
            .unwrap(),
        v4.der
    );
}

#[test]
fn broken_initial_files_are_an_error() {
    let ca = TestCa::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = ca.server(&["localhost"]);
    let b = ca.server(&["localhost"]);
    std::fs::write(d.join("a.crt"), &a.cert_pem).unwrap();
    std::fs::write(d.join("b.key"), &b.key_pem).unwrap();
    std::fs::write(d.join("junk"), "junk").unwrap();

    let err = ReloadingCertResolver::new(d.join("a.crt"), d.join("b.key")).unwrap_err();
    assert!(matches!(err, CertsError::KeyPair { .. }), "{err:?}");
    let err = ReloadingCertResolver::new(d.join("junk"), d.join("b.key")).unwrap_err();
    assert!(matches!(err, CertsError::NoCertificate { .. }), "{err:?}");
    let err = server_config(d.join("a.crt"), d.join("junk"), &[]).unwrap_err();
    assert!(matches!(err, CertsError::Pem { .. }), "{err:?}");
    let err = server_config(d.join("missing.crt"), d.join("b.key"), &[]).unwrap_err();
    assert!(
        matches!(&err, CertsError::Read { path, .. } if path.ends_with("missing.crt")),
        "{err:?}"
    );
    // Errors never show key material.
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("PRIVATE KEY"));
    let err = mtls_server_config(d.join("a.crt"), d.join("b.key"), d.join("junk"), &[]);
    assert!(err.is_err());
}

#[tokio::test]
async fn alpn_is_offered() {
    let ca = TestCa::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_leaf(dir.path(), &ca.server(&["localhost"]));
    let config = server_config(&cert, &key, &[b"h2", b"http/1.1"]).unwrap();
    assert_eq!(
        config.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    );
    let addr = serve(config).await;
    let mut client = (*default_client(&ca.cert_pem, None)).clone();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
}

/// An mTLS server with a server certificate from `ca`, trusting `ca` for clients.
async fn mtls_server(ca: &TestCa, dir: &Path) -> (SocketAddr, PathBuf) {
    let (cert, key) = write_leaf(dir, &ca.server(&["localhost", "127.0.0.1"]));
    let ca_file = dir.join("ca.crt");
    write_in_place(&ca_file, &ca.cert_pem);
    assert_eq!(ca_file_in_dir(dir), ca_file);
    let config = mtls_server_config(&cert, &key, &ca_file, &[]).unwrap();
    (serve(config).await, ca_file)
}

#[tokio::test]
async fn mtls_accepts_a_client_certificate_from_the_ca() {
    let ca = TestCa::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let (addr, _) = mtls_server(&ca, dir.path()).await;
    let me = ca.client("envoy-sidecar-client");
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config = client_config(&ca.cert_pem, Some(&me), &[version]);
        fetch(addr, config).await.unwrap();
    }
}

#[tokio::test]
async fn mtls_refuses_a_client_without_certificate() {
    let ca = TestCa::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let (addr, _) = mtls_server(&ca, dir.path()).await;
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config = client_config(&ca.cert_pem, None, &[version]);
        let err = fetch(addr, config).await.unwrap_err();
        assert!(!err.to_string().contains("timed out"), "{err}");
    }
}

#[tokio::test]
async fn mtls_refuses_a_client_certificate_from_another_ca() {
    let ca = TestCa::new("test-ca");
    let other = TestCa::new("other-ca");
    let dir = tempfile::tempdir().unwrap();
    let (addr, _) = mtls_server(&ca, dir.path()).await;
    let stranger = other.client("envoy-sidecar-client");
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config = client_config(&ca.cert_pem, Some(&stranger), &[version]);
        let err = fetch(addr, config).await.unwrap_err();
        assert!(!err.to_string().contains("timed out"), "{err}");
    }
}

#[tokio::test]
async fn mtls_picks_up_a_ca_rotation() {
    let old = TestCa::new("old-ca");
    let new = TestCa::new("new-ca");
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca_file) = mtls_server(&old, dir.path()).await;
    // The clients are reused: mTLS servers must not let them resume a session verified
    // under the previous CA. The server certificate stays from the old CA: both trust it.
    let old_client = default_client(&old.cert_pem, Some(&old.client("old")));
    let new_client = default_client(&old.cert_pem, Some(&new.client("new")));

    fetch(addr, old_client.clone()).await.unwrap();
    fetch(addr, new_client.clone()).await.unwrap_err();

    // Overlap: both CAs trusted.
    write_in_place(&ca_file, &format!("{}{}", old.cert_pem, new.cert_pem));
    fetch(addr, old_client.clone()).await.unwrap();
    fetch(addr, new_client.clone()).await.unwrap();

    // Only the new CA.
    write_in_place(&ca_file, &new.cert_pem);
    fetch(addr, old_client.clone()).await.unwrap_err();
    fetch(addr, new_client.clone()).await.unwrap();

    // A broken CA file keeps the last good trust.
    write_in_place(&ca_file, "-----BEGIN CERTIFICATE-----\nbroken\n");
    fetch(addr, old_client).await.unwrap_err();
    fetch(addr, new_client).await.unwrap();
}

#[test]
fn ca_file_falls_back_to_tls_crt() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(ca_file_in_dir(dir.path()), dir.path().join("tls.crt"));
    std::fs::write(dir.path().join("ca.crt"), "").unwrap();
    assert_eq!(ca_file_in_dir(dir.path()), dir.path().join("ca.crt"));
}

/// `marin3r certs --key-type rsa`: an RSA 2048 CA, server and client certificate that a
/// real mTLS handshake (TLS 1.2 and 1.3) accepts, with RSA keys in the PKCS#8 PEM files.
#[tokio::test]
async fn rsa_bundle_serves_mtls() {
    let bundle = marin3r_certs::issue(&marin3r_certs::IssueOptions {
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        key_type: marin3r_certs::KeyType::Rsa2048,
        ..marin3r_certs::IssueOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    bundle.write_to(dir.path()).unwrap();
    for part in ["ca", "server", "client"] {
        let key_pem = std::fs::read_to_string(dir.path().join(part).join("tls.key")).unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let rsa = rcgen::KeyPair::try_from(&key).unwrap();
        assert!(
            rsa.is_compatible(&rcgen::PKCS_RSA_SHA256),
            "{part} key is not RSA"
        );
    }
    let server = dir.path().join("server");
    let config = mtls_server_config(
        server.join("tls.crt"),
        server.join("tls.key"),
        server.join("ca.crt"),
        &[],
    )
    .unwrap();
    let addr = serve(config).await;
    let me = Leaf {
        cert_pem: bundle.client.cert_pem.clone(),
        key_pem: bundle.client.key_pem.clone(),
        der: CertificateDer::from_pem_slice(bundle.client.cert_pem.as_bytes()).unwrap(),
    };
    let server_der = CertificateDer::from_pem_slice(bundle.server.cert_pem.as_bytes()).unwrap();
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config = client_config(&bundle.ca.cert_pem, Some(&me), &[version]);
        assert_eq!(fetch(addr, config).await.unwrap(), server_der);
    }
    // Without a client certificate the RSA-issued server refuses the client.
    assert!(
        fetch(addr, default_client(&bundle.ca.cert_pem, None))
            .await
            .is_err()
    );
}
