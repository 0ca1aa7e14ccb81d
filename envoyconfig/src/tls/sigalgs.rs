//! BoringSSL's signature algorithm list, as Envoy 1.40 applies it to
//! `TlsParameters.signature_algorithms` (joined with `:`) through
//! `SSL_CTX_set1_sigalgs_list`: Envoy refuses the list ("Failed to initialize TLS
//! signature algorithms") when this parse fails.
//!
//! Each `:`-separated element is a TLS 1.3 name (`ecdsa_secp256r1_sha256`, `ed25519`,
//! …) or `KEY+HASH` (`RSA`, `RSA-PSS`/`PSS`, `ECDSA` with `SHA1`, `SHA256`, `SHA384`,
//! `SHA512`; not `PSS+SHA1`); an element is at most 23 characters of `[0-9A-Za-z_-]`;
//! empty elements and an algorithm named twice (also by its two spellings) are
//! refused, and so is a list of only `rsa_pkcs1_md5_sha1` (BoringSSL drops it, and an
//! emptied list is an error). Checked against Envoy 1.40.0 (`envoyconfig/tests/
//! tls_cases/cases.json`, `signature_algorithms` rows).

use std::fmt;

const MD5_SHA1: u16 = 0xff01;

/// The TLS 1.3-style names and their code points (`kSignatureAlgorithmNames`, with the
/// ML-DSA ones of Envoy 1.40's BoringSSL).
const NAMES: &[(&str, u16)] = &[
    ("rsa_pkcs1_md5_sha1", MD5_SHA1),
    ("rsa_pkcs1_sha1", 0x0201),
    ("rsa_pkcs1_sha256", 0x0401),
    ("rsa_pkcs1_sha256_legacy", 0x0420),
    ("rsa_pkcs1_sha384", 0x0501),
    ("rsa_pkcs1_sha512", 0x0601),
    ("ecdsa_sha1", 0x0203),
    ("ecdsa_secp256r1_sha256", 0x0403),
    ("ecdsa_secp384r1_sha384", 0x0503),
    ("ecdsa_secp521r1_sha512", 0x0603),
    ("rsa_pss_rsae_sha256", 0x0804),
    ("rsa_pss_rsae_sha384", 0x0805),
    ("rsa_pss_rsae_sha512", 0x0806),
    ("ed25519", 0x0807),
    ("mldsa44", 0x0904),
    ("mldsa65", 0x0905),
    ("mldsa87", 0x0906),
];

/// `KEY+HASH` pairs (`kSignatureAlgorithmsMapping`).
const PAIRS: &[(&str, &str, u16)] = &[
    ("RSA", "SHA1", 0x0201),
    ("RSA", "SHA256", 0x0401),
    ("RSA", "SHA384", 0x0501),
    ("RSA", "SHA512", 0x0601),
    ("PSS", "SHA256", 0x0804),
    ("PSS", "SHA384", 0x0805),
    ("PSS", "SHA512", 0x0806),
    ("ECDSA", "SHA1", 0x0203),
    ("ECDSA", "SHA256", 0x0403),
    ("ECDSA", "SHA384", 0x0503),
    ("ECDSA", "SHA512", 0x0603),
];

/// The longest element part BoringSSL reads (its buffer holds 23 characters).
const MAX_LEN: usize = 23;

/// Why BoringSSL refuses a signature algorithm list.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SigalgError {
    Empty,
    Unknown(String),
    Character(char),
    TooLong(String),
    Twice(String),
    OnlyMd5Sha1,
}

impl fmt::Display for SigalgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "an element is empty"),
            Self::Unknown(name) => write!(f, "{name:?} is not a signature algorithm Envoy knows"),
            Self::Character(c) => write!(
                f,
                "{c:?} is not allowed (names are letters, digits, '_' and '-'; KEY+HASH pairs)"
            ),
            Self::TooLong(part) => write!(f, "{part:?} is longer than {MAX_LEN} characters"),
            Self::Twice(name) => write!(f, "{name:?} names a signature algorithm twice"),
            Self::OnlyMd5Sha1 => write!(
                f,
                "rsa_pkcs1_md5_sha1 alone cannot be configured (BoringSSL drops it)"
            ),
        }
    }
}

fn element(text: &str) -> Result<u16, SigalgError> {
    if text.is_empty() {
        return Err(SigalgError::Empty);
    }
    let parts: Vec<&str> = text.split('+').collect();
    for part in &parts {
        if let Some(c) = part
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
        {
            return Err(SigalgError::Character(c));
        }
        if part.len() > MAX_LEN {
            return Err(SigalgError::TooLong((*part).to_string()));
        }
    }
    let unknown = || SigalgError::Unknown(text.to_string());
    match parts.as_slice() {
        [name] => NAMES
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
            .ok_or_else(unknown),
        [key, hash] => {
            let key = match *key {
                "RSA-PSS" => "PSS",
                other => other,
            };
            PAIRS
                .iter()
                .find(|(k, h, _)| *k == key && h == hash)
                .map(|(_, _, id)| *id)
                .ok_or_else(unknown)
        }
        _ => Err(unknown()),
    }
}

/// The code points BoringSSL configures for `list` (`SSL_CTX_set1_sigalgs_list`); an
/// error when it refuses the list. `list` is not empty (Envoy skips an empty one).
pub(crate) fn parse(list: &str) -> Result<Vec<u16>, SigalgError> {
    let mut out: Vec<u16> = Vec::new();
    for text in list.split(':') {
        let id = element(text)?;
        if out.contains(&id) {
            return Err(SigalgError::Twice(text.to_string()));
        }
        out.push(id);
    }
    out.retain(|id| *id != MD5_SHA1);
    if out.is_empty() {
        return Err(SigalgError::OnlyMd5Sha1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pairs_and_their_limits() {
        assert_eq!(parse("ed25519:ECDSA+SHA256").unwrap(), [0x0807, 0x0403]);
        assert!(parse("RSA-PSS+SHA256:PSS+SHA384").is_ok());
        assert_eq!(
            parse("PSS+SHA1"),
            Err(SigalgError::Unknown("PSS+SHA1".into()))
        );
        assert_eq!(
            parse("RSA+SHA256:rsa_pkcs1_sha256"),
            Err(SigalgError::Twice("rsa_pkcs1_sha256".into()))
        );
        assert_eq!(parse("ed25519:"), Err(SigalgError::Empty));
        assert!(parse("RSA+").is_err());
        assert!(parse("RSA+SHA256+SHA1").is_err());
        assert_eq!(parse("rsa_pkcs1_md5_sha1"), Err(SigalgError::OnlyMd5Sha1));
        assert!(parse("rsa_pkcs1_sha256:rsa_pkcs1_md5_sha1").is_ok());
        assert_eq!(parse("ed25519 "), Err(SigalgError::Character(' ')));
    }
}
