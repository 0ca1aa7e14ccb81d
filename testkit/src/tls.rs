//! rustls client configs for tests: trust one CA (PEM), optionally present a client
//! certificate, optionally pin protocol versions and ALPN.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The first certificate in `pem`, as DER.
pub fn cert_der(pem: &str) -> Result<CertificateDer<'static>, String> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("certificate PEM: {e}"))
}

/// Builder of a ring-backed [`ClientConfig`] trusting only one CA.
#[derive(Debug, Clone)]
pub struct ClientConfigBuilder {
    ca_pem: String,
    identity: Option<(String, String)>,
    versions: Option<Vec<&'static SupportedProtocolVersion>>,
    alpn: Vec<Vec<u8>>,
}

/// A client config trusting only `ca_pem` (safe default protocol versions, no client
/// certificate, no ALPN until set).
pub fn client_config(ca_pem: &str) -> ClientConfigBuilder {
    ClientConfigBuilder {
        ca_pem: ca_pem.to_string(),
        identity: None,
        versions: None,
        alpn: Vec::new(),
    }
}

impl ClientConfigBuilder {
    /// Presents this client certificate (PEM chain) and key (PEM) — mTLS.
    pub fn identity(mut self, cert_pem: &str, key_pem: &str) -> Self {
        self.identity = Some((cert_pem.to_string(), key_pem.to_string()));
        self
    }

    /// Only these protocol versions.
    pub fn versions(mut self, versions: &[&'static SupportedProtocolVersion]) -> Self {
        self.versions = Some(versions.to_vec());
        self
    }

    /// Offers this ALPN protocol (e.g. `b"h2"`, `b"http/1.1"`).
    pub fn alpn(mut self, protocol: &[u8]) -> Self {
        self.alpn.push(protocol.to_vec());
        self
    }

    /// The config.
    pub fn build(self) -> Result<Arc<ClientConfig>, String> {
        let mut roots = RootCertStore::empty();
        roots
            .add(cert_der(&self.ca_pem)?)
            .map_err(|e| format!("CA certificate: {e}"))?;
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()));
        let builder = match &self.versions {
            Some(versions) => builder.with_protocol_versions(versions),
            None => builder.with_safe_default_protocol_versions(),
        }
        .map_err(|e| format!("TLS client config: {e}"))?
        .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert_pem, key_pem)) => {
                let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("client certificate PEM: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                    .map_err(|e| format!("client key PEM: {e}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("client certificate: {e}"))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = self.alpn;
        Ok(Arc::new(config))
    }
}

/// Throwaway certificate/key pairs (PEM) that Envoy's TLS loader, and so marin3r's
/// decoder, accepts — for the Kubernetes TLS Secrets of tests, where placeholder data is
/// refused: `[0]` EC P-256, `[1]` EC P-384, `[2]` RSA 2048. Distinct pairs give distinct
/// Secret versions. They are files of `envoyconfig/tests/tls_cases/`.
pub const PEM_PAIRS: [(&[u8], &[u8]); 3] = [
    (
        include_bytes!("../../envoyconfig/tests/tls_cases/ec.crt"),
        include_bytes!("../../envoyconfig/tests/tls_cases/ec.key"),
    ),
    (
        include_bytes!("../../envoyconfig/tests/tls_cases/P-384.crt"),
        include_bytes!("../../envoyconfig/tests/tls_cases/P-384.key"),
    ),
    (
        include_bytes!("../../envoyconfig/tests/tls_cases/rsa.crt"),
        include_bytes!("../../envoyconfig/tests/tls_cases/rsa.key"),
    ),
];
