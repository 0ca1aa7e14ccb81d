//! rustls server configurations built on the reloading resolver and verifier.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use marin3r_wire::secret_keys::{CA_CRT, TLS_CRT};
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;

use crate::{CertsError, ReloadingCertResolver, ReloadingClientVerifier, ServingFiles};

/// A TLS 1.2 + 1.3 server configuration (ring provider, no client authentication) serving
/// `cert_path`/`key_path`, re-read when they change, and offering the `alpn` protocols
/// (e.g. `&[b"h2", b"http/1.1"]`; empty for none).
///
/// Fails if the files cannot be loaded now. Session resumption is on (rustls defaults): a
/// client resuming a session made before a rotation is not shown the new certificate,
/// which is harmless since that session was authenticated.
pub fn server_config(
    cert_path: impl AsRef<Path>,
    key_path: impl AsRef<Path>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, CertsError> {
    serving_config(
        &ServingFiles::pair(cert_path.as_ref(), key_path.as_ref()),
        alpn,
    )
}

/// [`server_config`] serving `files` (two files, or a directory whose layout is chosen
/// again at every reload: [`ServingFiles`]).
pub fn serving_config(
    files: &ServingFiles,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, CertsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = ReloadingCertResolver::serving(files.clone(), Arc::clone(&provider))?;
    let mut config = builder(provider)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Like [`server_config`], and requires a client certificate chaining to a CA of the PEM
/// bundle `ca_path`, which is re-read when it changes too.
///
/// Session resumption is disabled, so that every connection's client certificate is
/// verified against the current CA bundle.
pub fn mtls_server_config(
    cert_path: impl AsRef<Path>,
    key_path: impl AsRef<Path>,
    ca_path: impl AsRef<Path>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, CertsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = ReloadingCertResolver::with_provider(
        cert_path.as_ref(),
        key_path.as_ref(),
        Arc::clone(&provider),
    )?;
    let verifier = ReloadingClientVerifier::with_provider(ca_path.as_ref(), Arc::clone(&provider))?;
    let mut config = builder(provider)?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // A resumed session skips client certificate verification: without resumption every
    // new connection is checked against the CA file as it is now (a CA removed from the
    // bundle locks its clients out at once). Clients of these servers (Envoy's xDS
    // stream) keep long-lived connections, so full handshakes cost next to nothing.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

fn builder(
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::WantsVerifier>, CertsError> {
    ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(CertsError::Tls)
}

/// The CA file of a `kubernetes.io/tls` directory: `dir/ca.crt` if it exists, else
/// `dir/tls.crt` (a CA's own secret), as `--ca-certificate-path DIR` expects.
pub fn ca_file_in_dir(dir: impl AsRef<Path>) -> PathBuf {
    let dir = dir.as_ref();
    let ca = dir.join(CA_CRT);
    if ca.exists() { ca } else { dir.join(TLS_CRT) }
}
