//! Credentials that follow their files: a server certificate resolver and a client
//! certificate verifier that re-read their PEM files when those change (see
//! [the crate docs](crate#reloading)).

use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use marin3r_wire::error_chain;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::{CertsError, load_certs, load_private_key};

/// What a file's metadata says about its content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

/// Stamps of `paths`, following symlinks; with `missing_ok`, a missing file is `None`
/// (its appearing is a change), otherwise an error.
fn stamps(paths: &[PathBuf], missing_ok: bool) -> Result<Vec<Option<FileStamp>>, CertsError> {
    paths
        .iter()
        .map(|path| {
            let meta = match fs::metadata(path) {
                Ok(meta) => meta,
                Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(None);
                }
                Err(source) => {
                    return Err(CertsError::Read {
                        path: path.clone(),
                        source,
                    });
                }
            };
            Ok(Some(FileStamp {
                dev: meta.dev(),
                ino: meta.ino(),
                len: meta.len(),
                mtime: meta.mtime(),
                mtime_nsec: meta.mtime_nsec(),
            }))
        })
        .collect()
}

/// Where a server's certificate and key are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingFiles {
    /// These two files.
    Pair { cert: PathBuf, key: PathBuf },
    /// In `dir`, the first `(certificate, key)` of `layouts` whose two files exist
    /// (symlinks followed), chosen again at every reload: a Secret volume whose `..data`
    /// swap brings the other layout is followed.
    Dir {
        dir: PathBuf,
        layouts: Vec<(String, String)>,
    },
}

impl ServingFiles {
    /// The two files `cert` and `key`.
    pub fn pair(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self::Pair {
            cert: cert.into(),
            key: key.into(),
        }
    }

    /// `dir` holding either layout of [`marin3r_wire::olm::SERVING_LAYOUTS`]: OLM v0's
    /// `apiserver.crt`/`apiserver.key`, or a `kubernetes.io/tls` Secret's
    /// `tls.crt`/`tls.key`.
    pub fn dir(dir: impl Into<PathBuf>) -> Self {
        Self::Dir {
            dir: dir.into(),
            layouts: marin3r_wire::olm::SERVING_LAYOUTS
                .iter()
                .map(|(c, k)| ((*c).to_string(), (*k).to_string()))
                .collect(),
        }
    }

    /// The certificate and key files to read now.
    pub fn current(&self) -> Result<(PathBuf, PathBuf), CertsError> {
        match self {
            Self::Pair { cert, key } => Ok((cert.clone(), key.clone())),
            Self::Dir { dir, layouts } => layouts
                .iter()
                .map(|(c, k)| (dir.join(c), dir.join(k)))
                .find(|(c, k)| c.exists() && k.exists())
                .ok_or_else(|| CertsError::NoServingFiles {
                    dir: dir.clone(),
                    layouts: layouts
                        .iter()
                        .map(|(c, k)| format!("{c} and {k}"))
                        .collect::<Vec<_>>()
                        .join(", or "),
                }),
        }
    }

    /// Every file whose change may change what is served.
    fn watched(&self) -> Vec<PathBuf> {
        match self {
            Self::Pair { cert, key } => vec![cert.clone(), key.clone()],
            Self::Dir { dir, layouts } => layouts
                .iter()
                .flat_map(|(c, k)| [dir.join(c), dir.join(k)])
                .collect(),
        }
    }
}

/// Logs subject, serial and expiry of the first certificate of `certs` (public data only),
/// and warns if it has expired.
fn log_loaded(what: &'static str, path: &Path, certs: &[CertificateDer<'_>]) {
    let Some(Ok((_, cert))) = certs
        .first()
        .map(|c| x509_parser::parse_x509_certificate(c))
    else {
        return;
    };
    let not_after = cert.validity().not_after;
    tracing::info!(
        what,
        path = %path.display(),
        subject = %cert.subject(),
        serial = %cert.raw_serial_as_string(),
        not_after = %not_after,
        certificates = certs.len(),
        "loaded TLS certificate"
    );
    if !cert.validity().is_valid() {
        tracing::warn!(
            what,
            path = %path.display(),
            not_after = %not_after,
            "TLS certificate is not valid now"
        );
    }
}

type Loader<T> = Box<dyn Fn() -> Result<T, CertsError> + Send + Sync>;

/// A value loaded from files, reloaded when their stamps change.
struct Reloading<T> {
    /// What is loaded, for logs ("server certificate", "client CA").
    what: &'static str,
    /// The files `load` reads, watched for changes.
    paths: Vec<PathBuf>,
    /// Whether a missing file is a state of its own (a layout not there) rather than an
    /// error.
    missing_ok: bool,
    load: Loader<T>,
    state: Mutex<State<T>>,
}

struct State<T> {
    stamps: Vec<Option<FileStamp>>,
    value: T,
    /// The last failure that was logged, so a persisting one is logged once.
    last_warning: Option<String>,
}

impl<T: Clone> Reloading<T> {
    /// Loads the value; failing here is an error (there is nothing to fall back to).
    fn new(
        what: &'static str,
        paths: Vec<PathBuf>,
        missing_ok: bool,
        load: Loader<T>,
    ) -> Result<Self, CertsError> {
        // Stamp before reading: if the files change in between, the next check reloads.
        let stamps = stamps(&paths, missing_ok)?;
        let value = load()?;
        Ok(Self {
            what,
            paths,
            missing_ok,
            load,
            state: Mutex::new(State {
                stamps,
                value,
                last_warning: None,
            }),
        })
    }

    /// The current value, reloaded first if the files changed.
    fn get(&self) -> T {
        let stamps = stamps(&self.paths, self.missing_ok);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let result = match stamps {
            Ok(stamps) if stamps == state.stamps => return state.value.clone(),
            Ok(stamps) => (self.load)().map(|value| (stamps, value)),
            Err(err) => Err(err),
        };
        match result {
            Ok((stamps, value)) => {
                state.stamps = stamps;
                state.value = value;
                state.last_warning = None;
                tracing::info!(what = self.what, paths = ?self.paths, "reloaded TLS credentials");
            }
            Err(err) => {
                let message = error_chain(&err);
                if state.last_warning.as_deref() != Some(message.as_str()) {
                    tracing::warn!(
                        what = self.what,
                        error = %message,
                        "reloading TLS credentials failed; keeping the previous ones"
                    );
                    state.last_warning = Some(message);
                }
            }
        }
        state.value.clone()
    }

    /// The value as last loaded, without looking at the files.
    fn loaded(&self) -> T {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.value.clone()
    }
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

/// A [`ResolvesServerCert`] serving the certificate chain and key from two PEM files,
/// reloaded on change (see [the crate docs](crate#reloading)).
///
/// The whole chain in the certificate file is sent to clients, leaf first.
#[derive(Debug)]
pub struct ReloadingCertResolver {
    inner: Reloading<Arc<CertifiedKey>>,
}

impl ReloadingCertResolver {
    /// Loads `cert_path` (PEM chain, leaf first) and `key_path` (PEM private key) with the
    /// ring crypto provider. Fails if they cannot be read or do not form a usable pair.
    pub fn new(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
    ) -> Result<Self, CertsError> {
        Self::with_provider(
            cert_path,
            key_path,
            Arc::new(rustls::crypto::ring::default_provider()),
        )
    }

    /// Like [`new`](Self::new), with the given crypto provider loading the key.
    pub fn with_provider(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, CertsError> {
        Self::serving(ServingFiles::pair(cert_path, key_path), provider)
    }

    /// Serves `files` (see [`ServingFiles`]: a directory's layout is chosen again at every
    /// reload), with the given crypto provider loading the key.
    pub fn serving(files: ServingFiles, provider: Arc<CryptoProvider>) -> Result<Self, CertsError> {
        let paths = files.watched();
        let missing_ok = matches!(files, ServingFiles::Dir { .. });
        let load = move || {
            let (cert, key) = files.current()?;
            load_certified_key(&cert, &key, &provider)
        };
        let inner = Reloading::new("server certificate", paths, missing_ok, Box::new(load))?;
        Ok(Self { inner })
    }

    /// The certificate and key served now, reloaded first if the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.inner.get()
    }
}

impl ResolvesServerCert for ReloadingCertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Loads a certificate chain and its key, checking that they match.
fn load_certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, CertsError> {
    let chain = load_certs(cert)?;
    let der = load_private_key(key)?;
    let pair_err = |source| CertsError::KeyPair {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    };
    let signing_key = provider
        .key_provider
        .load_private_key(der)
        .map_err(pair_err)?;
    let certified = CertifiedKey::new(chain, signing_key);
    // Unlike `CertifiedKey::from_der`, a key whose public half is unknown is refused too:
    // serving an unverifiable pair would fail every handshake.
    certified.keys_match().map_err(pair_err)?;
    log_loaded("server certificate", cert, &certified.cert);
    Ok(Arc::new(certified))
}

/// A [`ClientCertVerifier`] requiring a client certificate that chains to the CAs of a PEM
/// file, rebuilt when the file changes (see [the crate docs](crate#reloading)).
///
/// It wraps rustls' [`WebPkiClientVerifier`]. Unlike it, it sends no CA names in the
/// certificate request (the list could change under a handshake): clients then offer their
/// certificate whatever CA signed it, which also keeps them working during a CA rotation.
#[derive(Debug)]
pub struct ReloadingClientVerifier {
    inner: Reloading<Arc<dyn ClientCertVerifier>>,
}

impl ReloadingClientVerifier {
    /// Loads the CA bundle `ca_path` (one or more PEM certificates, all trusted) with the
    /// ring crypto provider. Fails if it cannot be read or holds no usable CA.
    pub fn new(ca_path: impl Into<PathBuf>) -> Result<Self, CertsError> {
        Self::with_provider(ca_path, Arc::new(rustls::crypto::ring::default_provider()))
    }

    /// Like [`new`](Self::new), verifying signatures with the given crypto provider.
    pub fn with_provider(
        ca_path: impl Into<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, CertsError> {
        let ca = ca_path.into();
        let paths = vec![ca.clone()];
        let load = move || build_client_verifier(&ca, &provider);
        let inner = Reloading::new("client CA", paths, false, Box::new(load))?;
        Ok(Self { inner })
    }
}

/// Builds a mandatory-client-auth verifier trusting every certificate in `ca`.
fn build_client_verifier(
    ca: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, CertsError> {
    let certs = load_certs(ca)?;
    let mut roots = RootCertStore::empty();
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|source| CertsError::InvalidCa {
                path: ca.to_path_buf(),
                source,
            })?;
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
            .clear_root_hint_subjects()
            .build()
            .map_err(|source| CertsError::Verifier {
                path: ca.to_path_buf(),
                source,
            })?;
    log_loaded("client CA", ca, &certs);
    Ok(verifier)
}

impl ClientCertVerifier for ReloadingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .get()
            .verify_client_cert(end_entity, intermediates, now)
    }

    // Signature checks do not depend on the CA: use the verifier as loaded, no reload.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner
            .loaded()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner
            .loaded()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.loaded().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::{IssueOptions, issue};

    /// Log lines written while `f` runs.
    fn capture_logs(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Buf {
            fn write(&mut self, data: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(data);
                Ok(data.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// Writes in place and moves the mtime to `secs` from now, so the change is seen.
    fn rewrite(path: &Path, contents: &str, secs: u64) {
        fs::write(path, contents).unwrap();
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(SystemTime::now() + Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn failed_reloads_keep_the_old_pair_and_warn_once_without_secrets() {
        let opts = IssueOptions {
            hosts: vec!["localhost".into()],
            ..IssueOptions::default()
        };
        let (first, second) = (issue(&opts).unwrap(), issue(&opts).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        fs::write(&cert, &first.server.cert_pem).unwrap();
        fs::write(&key, &first.server.key_pem).unwrap();
        let resolver = ReloadingCertResolver::new(&cert, &key).unwrap();
        let served = |r: &ReloadingCertResolver| r.current().cert[0].clone();
        let original = served(&resolver);

        let logs = capture_logs(|| {
            // The other bundle's key does not belong to the certificate.
            rewrite(&key, &second.server.key_pem, 100);
            for _ in 0..3 {
                assert_eq!(served(&resolver), original);
            }
        });
        assert_eq!(logs.matches("WARN").count(), 1, "{logs}");
        assert!(logs.contains("keeping the previous ones"), "{logs}");
        assert!(logs.contains(&*key.to_string_lossy()), "{logs}");
        assert!(!logs.contains("PRIVATE KEY"), "{logs}");
        for line in second
            .server
            .key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
        {
            assert!(!logs.contains(line), "key material in {logs}");
        }

        let logs = capture_logs(|| {
            rewrite(&cert, &second.server.cert_pem, 200);
            assert_ne!(served(&resolver), original);
        });
        assert!(logs.contains("reloaded TLS credentials"), "{logs}");
        assert!(!logs.contains("WARN"), "{logs}");
        assert!(format!("{resolver:?}").contains("tls.crt"));
    }

    #[test]
    fn types_are_shareable() {
        fn check<T: Send + Sync + fmt::Debug + 'static>() {}
        check::<ReloadingCertResolver>();
        check::<ReloadingClientVerifier>();
    }
}
