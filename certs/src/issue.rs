//! Issuing a self-signed CA plus server and client certificates (`marin3r certs`).

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::{Duration, SystemTime};

use marin3r_wire::secret_keys::{CA_CRT, TLS_CRT, TLS_KEY};

use crate::CertsError;
use crate::certificate::{CertKeyPem, KeyType, Profile, Usage, issue_cert};

/// Common name of the generated CA.
pub const CA_COMMON_NAME: &str = "marin3r-ca";
/// Default common name of the client certificate.
pub const DEFAULT_CLIENT_CN: &str = "envoy-sidecar-client";
/// Default validity of every generated certificate: 365 days.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// What [`issue`] generates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueOptions {
    /// DNS names and IP addresses for the server certificate's subject alternative names;
    /// an entry that parses as an IP address becomes an IP SAN. Must not be empty.
    pub hosts: Vec<String>,
    /// Common name of the client certificate.
    pub client_cn: String,
    /// How long every certificate is valid from now.
    pub validity: Duration,
    /// Kind of key for every certificate.
    pub key_type: KeyType,
}

impl Default for IssueOptions {
    fn default() -> Self {
        Self {
            hosts: Vec::new(),
            client_cn: DEFAULT_CLIENT_CN.to_owned(),
            validity: DEFAULT_VALIDITY,
            key_type: KeyType::default(),
        }
    }
}

/// A CA and the server and client certificates it signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The self-signed CA.
    pub ca: CertKeyPem,
    /// The server certificate (`serverAuth`).
    pub server: CertKeyPem,
    /// The client certificate (`clientAuth`).
    pub client: CertKeyPem,
}

impl Bundle {
    /// Writes `dir/{ca,server,client}/{tls.crt,tls.key,ca.crt}`, the `kubernetes.io/tls`
    /// layout cert-manager produces: `ca.crt` is the CA certificate in all three
    /// directories, and `ca/tls.crt` is the CA itself.
    ///
    /// Directories are created as needed. Each file is replaced atomically (written to a
    /// temporary file, then renamed), so a server reading them never sees half a file;
    /// private keys get mode 0600.
    pub fn write_to(&self, dir: impl AsRef<Path>) -> Result<(), CertsError> {
        let dir = dir.as_ref();
        for (name, item) in [
            ("ca", &self.ca),
            ("server", &self.server),
            ("client", &self.client),
        ] {
            let sub = dir.join(name);
            fs::create_dir_all(&sub).map_err(|source| CertsError::Write {
                path: sub.clone(),
                source,
            })?;
            // Key first: a watcher that sees the new certificate then finds its key.
            write_atomic(&sub.join(TLS_KEY), item.key_pem.as_bytes(), 0o600)?;
            write_atomic(&sub.join(CA_CRT), self.ca.cert_pem.as_bytes(), 0o644)?;
            write_atomic(&sub.join(TLS_CRT), item.cert_pem.as_bytes(), 0o644)?;
        }
        Ok(())
    }
}

/// Writes `contents` to `path` with `mode` through a temporary file in the same directory.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertsError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertsError::Write { path, source }
    };
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        file_name.as_deref().unwrap_or("marin3r-certs")
    ));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // `mode` only applies on creation; a leftover temporary file keeps its own.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(write_err(&tmp)(source));
    }
    fs::rename(&tmp, path).map_err(write_err(path))
}

/// Issues a self-signed CA (CN `marin3r-ca`), a server certificate for `opts.hosts` and a
/// client certificate with CN `opts.client_cn`, all valid for `opts.validity`.
///
/// Errors: [`CertsError::InvalidOptions`] for empty hosts or client CN or a zero validity,
/// and [`CertsError::InvalidHost`] for a host that is no DNS name.
pub fn issue(opts: &IssueOptions) -> Result<Bundle, CertsError> {
    let hosts: Vec<&str> = opts
        .hosts
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .collect();
    let Some(first_host) = hosts.first().copied() else {
        return Err(CertsError::InvalidOptions(
            "at least one host is required for the server certificate".into(),
        ));
    };
    if opts.client_cn.trim().is_empty() {
        return Err(CertsError::InvalidOptions(
            "the client common name must not be empty".into(),
        ));
    }
    if opts.validity.is_zero() {
        return Err(CertsError::InvalidOptions(
            "the validity must be positive".into(),
        ));
    }

    let now = SystemTime::now();
    let profile = |common_name: &str, hosts: Vec<String>, usage: Usage| Profile {
        common_name: common_name.to_owned(),
        hosts,
        usage,
        validity: opts.validity,
        key_type: opts.key_type,
    };
    let ca = issue_cert(&profile(CA_COMMON_NAME, Vec::new(), Usage::Ca), None, now)?;
    let server_hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
    let server = issue_cert(
        &profile(first_host, server_hosts, Usage::Server),
        Some(&ca),
        now,
    )?;
    let client = issue_cert(
        &profile(opts.client_cn.trim(), Vec::new(), Usage::Client),
        Some(&ca),
        now,
    )?;
    Ok(Bundle { ca, server, client })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::server::WebPkiClientVerifier;
    use rustls::{RootCertStore, crypto::CryptoProvider};
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    use super::*;
    use crate::{load_certs, load_private_key};

    fn opts() -> IssueOptions {
        IssueOptions {
            hosts: vec![
                "localhost".into(),
                "marin3r.default.svc".into(),
                "127.0.0.1".into(),
                "::1".into(),
            ],
            ..IssueOptions::default()
        }
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        use rustls_pki_types::pem::PemObject as _;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn cn(cert: &X509Certificate<'_>) -> String {
        cert.subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    #[test]
    fn issued_certificates_have_the_specified_fields() {
        let bundle = issue(&opts()).unwrap();

        let ca_der = der(&bundle.ca.cert_pem);
        let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
        assert_eq!(cn(&ca), CA_COMMON_NAME);
        assert_eq!(ca.subject(), ca.issuer());
        assert!(ca.is_ca());
        let usage = ca.key_usage().unwrap().unwrap().value;
        assert!(usage.key_cert_sign() && usage.crl_sign());
        let validity = ca.validity().time_to_expiration().unwrap();
        let days = validity.whole_days();
        assert!((364..=365).contains(&days), "{days} days");

        let server_der = der(&bundle.server.cert_pem);
        let (_, server) = X509Certificate::from_der(&server_der).unwrap();
        assert!(!server.is_ca());
        assert_eq!(server.issuer(), ca.subject());
        let eku = server.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let sans = &server
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names;
        assert_eq!(
            sans,
            &vec![
                GeneralName::DNSName("localhost"),
                GeneralName::DNSName("marin3r.default.svc"),
                GeneralName::IPAddress(&[127, 0, 0, 1]),
                GeneralName::IPAddress(&std::net::Ipv6Addr::LOCALHOST.octets()),
            ]
        );

        let client_der = der(&bundle.client.cert_pem);
        let (_, client) = X509Certificate::from_der(&client_der).unwrap();
        assert_eq!(cn(&client), DEFAULT_CLIENT_CN);
        assert_eq!(client.issuer(), ca.subject());
        let eku = client.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
    }

    #[test]
    fn issued_certificates_chain_to_the_ca() {
        let bundle = issue(&opts()).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(der(&bundle.ca.cert_pem)).unwrap();
        let roots = Arc::new(roots);
        let server = der(&bundle.server.cert_pem);
        let client = der(&bundle.client.cert_pem);

        let servers = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .unwrap();
        for name in ["localhost", "marin3r.default.svc", "127.0.0.1", "::1"] {
            let name = ServerName::try_from(name).unwrap();
            servers
                .verify_server_cert(&server, &[], &name, &[], UnixTime::now())
                .unwrap();
        }
        let other = ServerName::try_from("other.example").unwrap();
        assert!(
            servers
                .verify_server_cert(&server, &[], &other, &[], UnixTime::now())
                .is_err()
        );

        let clients = WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .unwrap();
        clients
            .verify_client_cert(&client, &[], UnixTime::now())
            .unwrap();
        // The server certificate lacks clientAuth: it cannot act as a client.
        assert!(
            clients
                .verify_client_cert(&server, &[], UnixTime::now())
                .is_err()
        );

        // A different CA does not vouch for them.
        let other = issue(&opts()).unwrap();
        let mut other_roots = RootCertStore::empty();
        other_roots.add(der(&other.ca.cert_pem)).unwrap();
        let other_clients =
            WebPkiClientVerifier::builder_with_provider(Arc::new(other_roots), provider())
                .build()
                .unwrap();
        assert!(
            other_clients
                .verify_client_cert(&client, &[], UnixTime::now())
                .is_err()
        );
    }

    #[test]
    fn options_are_honoured_and_validated() {
        let bundle = issue(&IssueOptions {
            hosts: vec![" 10.0.0.1 ".into(), String::new()],
            client_cn: "my-client".into(),
            validity: Duration::from_secs(2 * 24 * 60 * 60),
            key_type: KeyType::EcdsaP256,
        })
        .unwrap();
        let client_der = der(&bundle.client.cert_pem);
        let (_, client) = X509Certificate::from_der(&client_der).unwrap();
        assert_eq!(cn(&client), "my-client");
        let days = client.validity().time_to_expiration().unwrap().whole_days();
        assert!((1..=2).contains(&days), "{days} days");

        assert!(matches!(
            issue(&IssueOptions::default()),
            Err(CertsError::InvalidOptions(_))
        ));
        let bad_host = IssueOptions {
            hosts: vec!["bücher.example".into()],
            ..IssueOptions::default()
        };
        assert!(
            matches!(issue(&bad_host), Err(CertsError::InvalidHost { host, .. }) if host == "bücher.example")
        );
    }

    #[test]
    fn debug_output_hides_private_keys() {
        let bundle = issue(&opts()).unwrap();
        let debug = format!("{bundle:?}");
        assert!(!debug.contains("PRIVATE KEY"));
        assert!(debug.contains("<redacted>"));
    }

    #[test]
    fn write_to_uses_the_kubernetes_tls_layout() {
        let bundle = issue(&opts()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        bundle.write_to(&out).unwrap();
        // Writing again over existing files works (rotation).
        bundle.write_to(&out).unwrap();

        for (name, item) in [
            ("ca", &bundle.ca),
            ("server", &bundle.server),
            ("client", &bundle.client),
        ] {
            let sub = out.join(name);
            let read = |f: &str| std::fs::read_to_string(sub.join(f)).unwrap();
            assert_eq!(read("tls.crt"), item.cert_pem);
            assert_eq!(read("tls.key"), item.key_pem);
            assert_eq!(read("ca.crt"), bundle.ca.cert_pem);
            let mode =
                |f: &str| std::fs::metadata(sub.join(f)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode("tls.key"), 0o600, "{name}/tls.key");
            assert_eq!(mode("tls.crt"), 0o644, "{name}/tls.crt");

            assert_eq!(load_certs(sub.join("tls.crt")).unwrap().len(), 1);
            load_private_key(sub.join("tls.key")).unwrap();
        }
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(out.join("server"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert_eq!(
            crate::ca_file_in_dir(out.join("server")),
            out.join("server/ca.crt")
        );
    }
}
