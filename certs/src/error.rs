//! The crate's error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while issuing, reading or serving certificates.
///
/// Every variant names the file or the item it is about; none ever carries key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertsError {
    /// The [`IssueOptions`](crate::IssueOptions) cannot produce a usable bundle.
    #[error("invalid certificate options: {0}")]
    InvalidOptions(String),

    /// A host given for the server certificate is neither an IP address nor a valid DNS name.
    #[error("invalid host {host:?} for the server certificate")]
    InvalidHost {
        /// The offending entry.
        host: String,
        /// Why rcgen rejected it.
        #[source]
        source: rcgen::Error,
    },

    /// Generating an RSA key failed (the `rsa` crate's message carries no key material).
    #[error("generating the {what} (RSA): {message}")]
    Rsa {
        /// Which key (e.g. "server key").
        what: &'static str,
        /// What the `rsa` crate reported.
        message: String,
    },

    /// Generating a key or signing a certificate failed.
    #[error("generating the {what}")]
    Generate {
        /// Which item (e.g. "CA certificate", "server key").
        what: &'static str,
        /// The rcgen error.
        #[source]
        source: rcgen::Error,
    },

    /// A file could not be read (or its metadata could not be queried).
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// A file could not be read through the one file reader (missing, not a regular
    /// file, over its size limit): the error names the file and the rule.
    #[error(transparent)]
    File(#[from] marin3r_fsread::Error),

    /// A file or directory could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// A file is not valid PEM, or holds no item of the expected kind.
    #[error("parsing PEM in {}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// The PEM error (it names markers, never the encoded content).
        #[source]
        source: rustls_pki_types::pem::Error,
    },

    /// A serving directory holds none of the certificate and key layouts looked for.
    #[error("no serving certificate and key in {}: looked for {layouts}", dir.display())]
    NoServingFiles {
        /// The directory.
        dir: PathBuf,
        /// The layouts looked for, in order.
        layouts: String,
    },

    /// A certificate file holds no certificate.
    #[error("no certificate found in {}", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },

    /// A certificate and private key cannot be served together: the key is unsupported,
    /// or it does not belong to the certificate.
    #[error("certificate {} and key {} are not a usable pair", cert.display(), key.display())]
    KeyPair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },

    /// A CA bundle holds a certificate that cannot be used as a trust anchor.
    #[error("invalid CA certificate in {}", path.display())]
    InvalidCa {
        /// The CA file.
        path: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },

    /// No client-certificate verifier can be built from a CA bundle.
    #[error("building the client certificate verifier from {}", path.display())]
    Verifier {
        /// The CA file.
        path: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },

    /// rustls refused the TLS configuration.
    #[error("building the TLS configuration")]
    Tls(#[source] rustls::Error),
}
