//! The CSDS client of `marin3r status`: `FetchClientStatus` (gRPC service
//! `envoy.service.status.v3.ClientStatusDiscoveryService`) on the discovery service's
//! mTLS ADS listener, with a client certificate of the CA Envoys use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::service::status::v3::{
    ClientStatusRequest, ClientStatusResponse,
    client_status_discovery_service_client::ClientStatusDiscoveryServiceClient,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    NodeMatcher, StringMatcher, string_matcher::MatchPattern,
};
use marin3r_wire::secret_keys;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// gRPC messages up to the server's limit are read (it refuses larger answers with
/// `RESOURCE_EXHAUSTED`, asking to narrow the matchers).
pub use marin3r_xds::csds::MAX_ANSWER_BYTES;

/// The client certificate, its key and the CA the server certificate must chain to (PEM).
#[derive(Clone)]
pub struct ClientCertificate {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// Where they came from, for messages (`DIR`, or `Secret ns/name`).
    pub origin: String,
}

impl std::fmt::Debug for ClientCertificate {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// Where the client certificate files are: `--csds-ca`, `--csds-cert`, `--csds-key`, each
/// defaulting to `ca.crt`, `tls.crt`, `tls.key` of `--csds-certificate-path`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertificateFiles {
    pub dir: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl CertificateFiles {
    /// True when no file is named at all.
    pub fn is_empty(&self) -> bool {
        self.dir.is_none() && self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The three paths, or the flag missing one.
    pub fn paths(&self) -> Result<[(PathBuf, &'static str); 3], CsdsError> {
        let pick = |file: &Option<PathBuf>, key: &str, flag: &'static str| {
            file.clone()
                .or_else(|| self.dir.as_ref().map(|d| d.join(key)))
                .map(|p| (p, flag))
                .ok_or(CsdsError::MissingFile { flag })
        };
        Ok([
            pick(&self.ca, secret_keys::CA_CRT, "--csds-ca")?,
            pick(&self.cert, secret_keys::TLS_CRT, "--csds-cert")?,
            pick(&self.key, secret_keys::TLS_KEY, "--csds-key")?,
        ])
    }

    /// Reads the three files through the one bounded, regular-file-only reader
    /// (`marin3r_certs::read_pem`: a FIFO or `/dev/zero` named by a flag is refused).
    pub fn read(&self) -> Result<ClientCertificate, CsdsError> {
        let [ca, cert, key] = self.paths()?;
        let read = |(path, flag): &(PathBuf, &'static str)| {
            marin3r_certs::read_pem(path).map_err(|source| CsdsError::File {
                flag,
                path: path.clone(),
                source: Box::new(source),
            })
        };
        Ok(ClientCertificate {
            ca_pem: read(&ca)?,
            cert_pem: read(&cert)?,
            key_pem: read(&key)?,
            origin: self
                .dir
                .as_deref()
                .map_or_else(|| cert.0.display().to_string(), |d| d.display().to_string()),
        })
    }
}

/// Errors of [`fetch`].
#[derive(Debug, thiserror::Error)]
pub enum CsdsError {
    #[error(
        "no client certificate for CSDS: {flag} is not set (--csds-certificate-path DIR names \
         DIR/tls.crt, DIR/tls.key and DIR/ca.crt at once)"
    )]
    MissingFile { flag: &'static str },
    #[error("{flag} {}: cannot read it", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: Box<marin3r_certs::CertsError>,
    },
    #[error("--csds-address {address:?} is not HOST:PORT")]
    Address { address: String },
    #[error("CSDS {address}: cannot connect: {}", chain(source))]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("CSDS {address}: no answer within {timeout:?}")]
    Timeout { address: String, timeout: Duration },
    #[error(
        "CSDS {address}: the answer is too large ({message}); narrow it to one node: \
         marin3r status NODE"
    )]
    TooLarge { address: String, message: String },
    #[error("CSDS {address}: {code:?}: {message}")]
    Status {
        address: String,
        code: tonic::Code,
        message: String,
    },
}

/// What to ask: every Envoy (no matcher), or the Envoys of one node id with the
/// resources themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    AllNodes,
    Node(String),
}

/// The request of `query`: an exact `node_id` matcher and the resource contents for one
/// node; no matcher (every Envoy) and no contents otherwise.
pub fn request(query: &Query) -> ClientStatusRequest {
    match query {
        Query::AllNodes => ClientStatusRequest {
            node_matchers: Vec::new(),
            node: None,
            exclude_resource_contents: true,
        },
        Query::Node(id) => ClientStatusRequest {
            node_matchers: vec![NodeMatcher {
                node_id: Some(StringMatcher {
                    match_pattern: Some(MatchPattern::Exact(id.clone())),
                    ignore_case: false,
                }),
                node_metadatas: Vec::new(),
            }],
            node: None,
            exclude_resource_contents: false,
        },
    }
}

/// The TLS server name to verify: `server_name`, else the host of `address` (an IP
/// address is checked against the certificate's IP SANs).
pub fn server_name(address: &str, server_name: Option<&str>) -> Result<String, CsdsError> {
    if let Some(name) = server_name {
        return Ok(name.to_string());
    }
    let bad = || CsdsError::Address {
        address: address.to_string(),
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad());
    }
    Ok(host.to_string())
}

/// `FetchClientStatus` on `address` (HOST:PORT) over mTLS; `timeout` bounds connecting
/// and the call.
pub async fn fetch(
    address: &str,
    certificate: &ClientCertificate,
    server_name_override: Option<&str>,
    query: &Query,
    timeout: Duration,
) -> Result<ClientStatusResponse, CsdsError> {
    let domain = server_name(address, server_name_override)?;
    let endpoint = endpoint(
        &format!("https://{address}"),
        address,
        certificate,
        domain,
        timeout,
    )?;
    bounded(address, timeout, async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| connect_error(address, source))?;
        call(address, channel, query).await
    })
    .await
}

/// `FetchClientStatus` over `io`, a stream already connected to the ADS listener (a
/// port-forward), named `label` in messages; the server certificate must name
/// `server_name`.
pub async fn fetch_over<IO>(
    label: &str,
    io: IO,
    certificate: &ClientCertificate,
    server_name: &str,
    query: &Query,
    timeout: Duration,
) -> Result<ClientStatusResponse, CsdsError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    // The URI only carries the scheme (TLS on) and the :authority; the stream is `io`.
    let endpoint = endpoint(
        &format!("https://{server_name}:{}", marin3r_wire::ports::XDSS),
        label,
        certificate,
        server_name.to_string(),
        timeout,
    )?;
    let io = std::sync::Mutex::new(Some(io));
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let io = io
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        async move {
            io.map(hyper_util::rt::TokioIo::new).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the forwarded stream is used up",
                )
            })
        }
    });
    bounded(label, timeout, async {
        let channel = endpoint
            .connect_with_connector(connector)
            .await
            .map_err(|source| connect_error(label, source))?;
        call(label, channel, query).await
    })
    .await
}

/// The endpoint of `uri` with the client certificate, the server name to verify and
/// `timeout` on connecting and on each call.
fn endpoint(
    uri: &str,
    label: &str,
    certificate: &ClientCertificate,
    domain: String,
    timeout: Duration,
) -> Result<Endpoint, CsdsError> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&certificate.ca_pem))
        .identity(Identity::from_pem(
            &certificate.cert_pem,
            &certificate.key_pem,
        ))
        .domain_name(domain);
    Ok(Endpoint::from_shared(uri.to_string())
        .map_err(|_| CsdsError::Address {
            address: label.to_string(),
        })?
        .tls_config(tls)
        .map_err(|source| connect_error(label, source))?
        .connect_timeout(timeout)
        .timeout(timeout))
}

fn connect_error(label: &str, source: tonic::transport::Error) -> CsdsError {
    CsdsError::Connect {
        address: label.to_string(),
        source,
    }
}

/// The call on a connected channel.
async fn call(
    label: &str,
    channel: tonic::transport::Channel,
    query: &Query,
) -> Result<ClientStatusResponse, CsdsError> {
    let mut client = ClientStatusDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    client
        .fetch_client_status(request(query))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| status_error(label, &status))
}

/// `work` within `timeout`.
async fn bounded<T>(
    label: &str,
    timeout: Duration,
    work: impl Future<Output = Result<T, CsdsError>>,
) -> Result<T, CsdsError> {
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| CsdsError::Timeout {
            address: label.to_string(),
            timeout,
        })?
}

/// A gRPC status as an error; `RESOURCE_EXHAUSTED` (the server's size limit, or ours)
/// says how to narrow the question.
pub fn status_error(address: &str, status: &tonic::Status) -> CsdsError {
    let message = marin3r_wire::quote::bounded(status.message()).to_string();
    match status.code() {
        tonic::Code::ResourceExhausted | tonic::Code::OutOfRange => CsdsError::TooLarge {
            address: address.to_string(),
            message,
        },
        code => CsdsError::Status {
            address: address.to_string(),
            code,
            message,
        },
    }
}

/// The error with its sources on one line (`marin3r_wire::error_chain`), without the
/// repeats tonic's transport errors carry (`tcp connect error: tcp connect error`).
fn chain(error: &tonic::transport::Error) -> String {
    let full = marin3r_wire::error_chain(error);
    let mut parts: Vec<&str> = Vec::new();
    for part in full.split(": ") {
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    parts.join(": ")
}

/// `DIR/tls.crt`, … of a directory, for messages.
pub fn describe_dir(dir: &Path) -> String {
    format!(
        "{}/{{{},{},{}}}",
        dir.display(),
        secret_keys::TLS_CRT,
        secret_keys::TLS_KEY,
        secret_keys::CA_CRT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client certificate files go through the one bounded, regular-file-only reader:
    /// every special-file kind is refused at once, naming the flag and the file.
    #[test]
    fn special_files_given_as_the_client_certificate_are_refused_naming_them() {
        use marin3r_testkit::special_files::Special;
        let dir = tempfile::tempdir().unwrap();
        for name in ["ca.crt", "tls.crt", "tls.key"] {
            std::fs::write(dir.path().join(name), "-----BEGIN CERTIFICATE-----\n").unwrap();
        }
        let files = CertificateFiles {
            dir: Some(dir.path().to_path_buf()),
            ..CertificateFiles::default()
        };
        assert!(files.read().is_ok());
        for kind in Special::ALL {
            let key = dir.path().join("tls.key");
            kind.make(&key);
            let e = files.read().unwrap_err();
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            assert!(
                text.contains("--csds-key") && text.contains(kind.expected_error()),
                "{kind:?}: {text}"
            );
            marin3r_testkit::special_files::replace_with(&key, b"key");
        }
    }

    #[test]
    fn one_node_is_asked_exactly_with_contents_every_node_without() {
        let all = request(&Query::AllNodes);
        assert!(all.node_matchers.is_empty());
        assert!(all.exclude_resource_contents);
        let one = request(&Query::Node("kuard".into()));
        assert!(!one.exclude_resource_contents);
        let matcher = one.node_matchers[0].node_id.as_ref().unwrap();
        assert_eq!(
            matcher.match_pattern,
            Some(MatchPattern::Exact("kuard".into()))
        );
    }

    #[test]
    fn server_names_default_to_the_host() {
        assert_eq!(server_name("127.0.0.1:18000", None).unwrap(), "127.0.0.1");
        assert_eq!(server_name("[::1]:18000", None).unwrap(), "::1");
        assert_eq!(
            server_name("localhost:1", Some("marin3r-discoveryservice")).unwrap(),
            "marin3r-discoveryservice"
        );
        for bad in ["localhost", ":18000", "host:port", "host:99999"] {
            assert!(
                matches!(server_name(bad, None), Err(CsdsError::Address { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_too_large_answer_says_to_narrow_to_one_node() {
        let err = status_error(
            "127.0.0.1:18000",
            &tonic::Status::resource_exhausted("the answer is 5 MiB; narrow node_matchers"),
        );
        assert_eq!(
            err.to_string(),
            "CSDS 127.0.0.1:18000: the answer is too large (the answer is 5 MiB; narrow \
             node_matchers); narrow it to one node: marin3r status NODE"
        );
    }

    #[test]
    fn certificate_files_default_to_the_directory() {
        let files = CertificateFiles {
            dir: Some("/certs/client".into()),
            key: Some("/other/key.pem".into()),
            ..CertificateFiles::default()
        };
        let [ca, cert, key] = files.paths().unwrap();
        assert_eq!(ca.0, Path::new("/certs/client/ca.crt"));
        assert_eq!(cert.0, Path::new("/certs/client/tls.crt"));
        assert_eq!(key.0, Path::new("/other/key.pem"));
        let err = CertificateFiles::default().paths().unwrap_err();
        assert!(err.to_string().contains("--csds-ca is not set"), "{err}");
    }
}
