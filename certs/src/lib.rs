//! Certificates for marin3r: issuing a CA with server and client certificates
//! (`marin3r certs`), reading PEM files, and rustls server configurations whose
//! certificate, key and client CA follow their files, so servers pick up rotated
//! credentials (cert-manager renewals, Kubernetes Secret volume updates) without a restart
//! and without touching established connections.
//!
//! # Reloading
//!
//! [`ReloadingCertResolver`] and [`ReloadingClientVerifier`] `stat` their files at every
//! handshake (following symlinks, so the `..data` symlink swap Kubernetes does for Secret
//! volumes is seen: the target is a new inode) and compare device, inode, length and
//! modification time with what they loaded. Only a change triggers a reload. A reload that
//! fails (unreadable or unparseable files, a key that does not match its certificate, an
//! unusable CA) keeps the previous credentials, logs a warning once per distinct failure
//! (paths and reasons, never key material), and is retried on later handshakes until it
//! succeeds. A file rewritten in place with the same length within the file system's
//! timestamp granularity cannot be told apart; writers should replace files (write, then
//! rename), as [`Bundle::write_to`], cert-manager and the kubelet do.
//!
//! ```no_run
//! # fn main() -> Result<(), marin3r_certs::CertsError> {
//! use marin3r_certs::{IssueOptions, issue, mtls_server_config, ca_file_in_dir};
//!
//! let bundle = issue(&IssueOptions {
//!     hosts: vec!["marin3r-instance.default.svc".into(), "127.0.0.1".into()],
//!     ..IssueOptions::default()
//! })?;
//! bundle.write_to("/tmp/certs")?;
//!
//! let config = mtls_server_config(
//!     "/tmp/certs/server/tls.crt",
//!     "/tmp/certs/server/tls.key",
//!     ca_file_in_dir("/tmp/certs/ca"),
//!     &[b"h2"],
//! )?;
//! # let _ = config;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod certificate;
mod config;
mod error;
mod issue;
pub mod lifecycle;
mod pem;
mod reload;

pub use certificate::{CertKeyPem, KeyType};
pub use config::{ca_file_in_dir, mtls_server_config, server_config, serving_config};
pub use error::CertsError;
pub use issue::{Bundle, CA_COMMON_NAME, DEFAULT_CLIENT_CN, DEFAULT_VALIDITY, IssueOptions, issue};
pub use pem::{MAX_PEM_BYTES, load_certs, load_private_key, read_pem};
pub use reload::{ReloadingCertResolver, ReloadingClientVerifier, ServingFiles};
