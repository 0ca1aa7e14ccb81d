//! Reading PEM files.

use std::path::Path;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::CertsError;

/// Reads every certificate (`CERTIFICATE` sections, in file order) from a PEM file.
///
/// Other sections are skipped. A file without any certificate is
/// [`CertsError::NoCertificate`].
pub fn load_certs(path: impl AsRef<Path>) -> Result<Vec<CertificateDer<'static>>, CertsError> {
    let path = path.as_ref();
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertsError::Pem {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(CertsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 RSA or SEC1 EC) from a PEM file.
///
/// Errors name the file, never its content.
pub fn load_private_key(path: impl AsRef<Path>) -> Result<PrivateKeyDer<'static>, CertsError> {
    let path = path.as_ref();
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| CertsError::Pem {
        path: path.to_path_buf(),
        source,
    })
}

/// Largest PEM file read (certificate chain, key or CA bundle): a Kubernetes Secret
/// holds at most 1 MiB, and the largest public CA bundles are a quarter of that.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// Reads a PEM file through the one bounded, regular-file-only, non-blocking reader
/// ([`marin3r_fsread::read_regular_file`], at most [`MAX_PEM_BYTES`]): a FIFO, a device
/// or a huge file put in place of a certificate is refused at once, never read.
pub fn read_pem(path: impl AsRef<Path>) -> Result<Vec<u8>, CertsError> {
    Ok(marin3r_fsread::read_regular_file(
        path.as_ref(),
        MAX_PEM_BYTES,
    )?)
}

fn read(path: &Path) -> Result<Vec<u8>, CertsError> {
    read_pem(path)
}
