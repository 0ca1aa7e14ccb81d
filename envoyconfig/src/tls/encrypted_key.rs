//! Decrypting an encrypted inline private key with `TlsCertificate.password`, as
//! BoringSSL's `PEM_read_bio_PrivateKey` in Envoy 1.40 does, so that a wrong password
//! or a key of another certificate is refused before Envoy sees it. Checked against
//! Envoy 1.40.0 (`envoyconfig/tests/tls_cases/cases.json`):
//!
//! - `ENCRYPTED PRIVATE KEY` (PKCS #8): PBES2 with PBKDF2 and HMAC-SHA1 or HMAC-SHA256,
//!   AES-128/192/256-CBC or DES-EDE3-CBC; scrypt and other PRFs are refused
//!   (`UNSUPPORTED_KEY_DERIVATION_FUNCTION`, `UNSUPPORTED_PRF`); PKCS #12
//!   `pbeWithSHAAnd3-KeyTripleDES-CBC`;
//! - a traditional key with `Proc-Type: 4,ENCRYPTED` and `DEK-Info`: DES-CBC,
//!   DES-EDE3-CBC, AES-128/192/256-CBC (others: `UNSUPPORTED_ENCRYPTION`), the key
//!   derived with OpenSSL's `EVP_BytesToKey` (MD5, one round, the IV's first 8 bytes as
//!   salt).
//!
//! A wrong password shows as bad padding (`BAD_DECRYPT`) or, rarely, as content that
//! does not parse. Schemes BoringSSL may know but this file does not (PBES2 with RC2,
//! the RC2/RC4 PKCS #12 schemes) are `Unchecked`: left to Envoy. So is a key derived
//! with more than [`MAX_ITERATIONS`] rounds (BoringSSL takes up to 2^32 - 1): the
//! count is the writer's choice, and decoding a resource must not cost seconds of CPU.

use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockDecryptMut, KeyIvInit};
use md5::{Digest as _, Md5};
use pkcs8::pkcs5::pbes2::{EncryptionScheme, Kdf, Pbkdf2Prf};
use sha1::Sha1;
use x509_parser::asn1_rs::{Any, FromBer, Tag};

/// The result of decrypting.
#[derive(Debug, PartialEq)]
pub(crate) enum Decrypted {
    /// The plain DER (a PKCS #8 `PrivateKeyInfo`, or the traditional label's structure).
    Der(Vec<u8>),
    /// A scheme not checked here.
    Unchecked,
}

/// Why BoringSSL cannot decrypt the key.
#[derive(Debug, PartialEq)]
pub(crate) enum DecryptError {
    /// Bad padding: the password is wrong (`BAD_DECRYPT`).
    BadDecrypt,
    /// A scheme BoringSSL does not support.
    Unsupported(&'static str),
    /// The encrypted structure or its headers do not parse.
    Malformed,
}

/// The most key derivation rounds checked here: 1,000,000 (OpenSSL writes 2,048 by
/// default, OWASP's advice for PBKDF2-HMAC-SHA256 is 600,000); about 0.3 s.
pub(crate) const MAX_ITERATIONS: u32 = 1_000_000;

/// `pbeWithSHAAnd3-KeyTripleDES-CBC` (1.2.840.113549.1.12.1.3).
const OID_PBE_SHA1_3DES: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x0c, 0x01, 0x03];
/// PBES2 (1.2.840.113549.1.5.13).
const OID_PBES2: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x05, 0x0d];

fn unpad<C: BlockDecryptMut>(cipher: C, data: &[u8]) -> Result<Vec<u8>, DecryptError> {
    let mut buf = data.to_vec();
    let len = cipher
        .decrypt_padded_mut::<Pkcs7>(&mut buf)
        .map_err(|_| DecryptError::BadDecrypt)?
        .len();
    buf.truncate(len);
    Ok(buf)
}

/// CBC decryption with PKCS #7 padding for the ciphers BoringSSL's PEM code knows.
fn cbc(cipher: &str, key: &[u8], iv: &[u8], data: &[u8]) -> Result<Vec<u8>, DecryptError> {
    let bad = |_| DecryptError::Malformed;
    match cipher {
        "AES-128-CBC" => unpad(
            cbc::Decryptor::<aes::Aes128>::new_from_slices(key, iv).map_err(bad)?,
            data,
        ),
        "AES-192-CBC" => unpad(
            cbc::Decryptor::<aes::Aes192>::new_from_slices(key, iv).map_err(bad)?,
            data,
        ),
        "AES-256-CBC" => unpad(
            cbc::Decryptor::<aes::Aes256>::new_from_slices(key, iv).map_err(bad)?,
            data,
        ),
        "DES-EDE3-CBC" => unpad(
            cbc::Decryptor::<des::TdesEde3>::new_from_slices(key, iv).map_err(bad)?,
            data,
        ),
        "DES-CBC" => unpad(
            cbc::Decryptor::<des::Des>::new_from_slices(key, iv).map_err(bad)?,
            data,
        ),
        _ => Err(DecryptError::Unsupported("this PEM encryption")),
    }
}

fn key_len(cipher: &str) -> Option<usize> {
    match cipher {
        "AES-128-CBC" => Some(16),
        "AES-192-CBC" | "DES-EDE3-CBC" => Some(24),
        "AES-256-CBC" => Some(32),
        "DES-CBC" => Some(8),
        _ => None,
    }
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A traditional PEM key with `DEK-Info: <cipher>,<hex IV>`.
pub(crate) fn traditional(
    dek_info: Option<&str>,
    der: &[u8],
    password: &[u8],
) -> Result<Decrypted, DecryptError> {
    let (cipher, iv) = dek_info
        .and_then(|d| d.split_once(','))
        .ok_or(DecryptError::Malformed)?;
    let cipher = cipher.trim();
    let Some(len) = key_len(cipher) else {
        return Err(DecryptError::Unsupported("this PEM encryption (DEK-Info)"));
    };
    let iv = hex(iv.trim()).ok_or(DecryptError::Malformed)?;
    let salt = iv.get(..8).ok_or(DecryptError::Malformed)?;
    // EVP_BytesToKey(MD5, count 1): D_i = MD5(D_{i-1} || password || salt).
    let mut key = Vec::new();
    let mut last: Vec<u8> = Vec::new();
    while key.len() < len {
        let mut h = Md5::new();
        h.update(&last);
        h.update(password);
        h.update(salt);
        last = h.finalize().to_vec();
        key.extend_from_slice(&last);
    }
    key.truncate(len);
    cbc(cipher, &key, &iv, der).map(Decrypted::Der)
}

/// An `ENCRYPTED PRIVATE KEY` (PKCS #8 `EncryptedPrivateKeyInfo`).
pub(crate) fn pkcs8(der: &[u8], password: &[u8]) -> Result<Decrypted, DecryptError> {
    let (_, outer) = Any::from_ber(der).map_err(|_| DecryptError::Malformed)?;
    let items = super::items(&outer).ok_or(DecryptError::Malformed)?;
    let algorithm = items
        .first()
        .and_then(super::items)
        .ok_or(DecryptError::Malformed)?;
    let oid = algorithm
        .first()
        .filter(|a| a.tag() == Tag::Oid)
        .ok_or(DecryptError::Malformed)?
        .data;
    if oid == OID_PBE_SHA1_3DES {
        let params = algorithm
            .get(1)
            .and_then(super::items)
            .ok_or(DecryptError::Malformed)?;
        let salt = params
            .first()
            .filter(|a| a.tag() == Tag::OctetString)
            .ok_or(DecryptError::Malformed)?
            .data;
        let iterations = params
            .get(1)
            .filter(|a| a.tag() == Tag::Integer)
            .and_then(|a| {
                a.data
                    .iter()
                    .try_fold(0u32, |n, b| n.checked_mul(256).map(|n| n | u32::from(*b)))
            })
            .ok_or(DecryptError::Malformed)?;
        let data = items
            .get(1)
            .filter(|a| a.tag() == Tag::OctetString)
            .ok_or(DecryptError::Malformed)?
            .data;
        if iterations > MAX_ITERATIONS {
            return Ok(Decrypted::Unchecked);
        }
        let password = bmp_password(password)?;
        let key = pkcs12_kdf(1, salt, &password, iterations, 24);
        let iv = pkcs12_kdf(2, salt, &password, iterations, 8);
        return cbc("DES-EDE3-CBC", &key, &iv, data).map(Decrypted::Der);
    }
    if oid != OID_PBES2 {
        return Ok(Decrypted::Unchecked);
    }
    let Ok(info) = pkcs8::EncryptedPrivateKeyInfo::try_from(der) else {
        // A PBES2 cipher the pkcs5 crate does not parse (RC2): left to Envoy.
        return Ok(Decrypted::Unchecked);
    };
    let pkcs8::pkcs5::EncryptionScheme::Pbes2(params) = &info.encryption_algorithm else {
        return Ok(Decrypted::Unchecked);
    };
    match &params.kdf {
        Kdf::Pbkdf2(p) if p.iteration_count > MAX_ITERATIONS => return Ok(Decrypted::Unchecked),
        Kdf::Pbkdf2(p) if matches!(p.prf, Pbkdf2Prf::HmacWithSha1 | Pbkdf2Prf::HmacWithSha256) => {}
        Kdf::Pbkdf2(_) => {
            return Err(DecryptError::Unsupported(
                "a PBKDF2 PRF other than HMAC-SHA1 and HMAC-SHA256 (UNSUPPORTED_PRF)",
            ));
        }
        _ => {
            return Err(DecryptError::Unsupported(
                "a key derivation other than PBKDF2 (UNSUPPORTED_KEY_DERIVATION_FUNCTION)",
            ));
        }
    }
    if !matches!(
        params.encryption,
        EncryptionScheme::Aes128Cbc { .. }
            | EncryptionScheme::Aes192Cbc { .. }
            | EncryptionScheme::Aes256Cbc { .. }
            | EncryptionScheme::DesEde3Cbc { .. }
    ) {
        return Ok(Decrypted::Unchecked);
    }
    params
        .decrypt(password, info.encrypted_data)
        .map(Decrypted::Der)
        .map_err(|_| DecryptError::BadDecrypt)
}

/// The password as a NUL-terminated BMPString (UTF-16BE), as PKCS #12 derives keys.
fn bmp_password(password: &[u8]) -> Result<Vec<u8>, DecryptError> {
    let text = std::str::from_utf8(password).map_err(|_| DecryptError::BadDecrypt)?;
    let mut out: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
    out.extend_from_slice(&[0, 0]);
    Ok(out)
}

/// RFC 7292 appendix B.2 with SHA-1 (u = 20, v = 64 bytes).
fn pkcs12_kdf(id: u8, salt: &[u8], password: &[u8], iterations: u32, len: usize) -> Vec<u8> {
    const V: usize = 64;
    let fill = |s: &[u8]| -> Vec<u8> {
        if s.is_empty() {
            return Vec::new();
        }
        let n = V * s.len().div_ceil(V);
        s.iter().copied().cycle().take(n).collect()
    };
    let d = [id; V];
    let mut i: Vec<u8> = fill(salt);
    i.extend(fill(password));
    let mut out = Vec::new();
    while out.len() < len {
        let mut a = Sha1::new();
        a.update(d);
        a.update(&i);
        let mut a = a.finalize().to_vec();
        for _ in 1..iterations.max(1) {
            a = Sha1::digest(&a).to_vec();
        }
        out.extend_from_slice(&a);
        let b: Vec<u8> = a.iter().copied().cycle().take(V).collect();
        for block in i.chunks_mut(V) {
            // block = (block + b + 1) mod 2^(8v)
            let mut carry = 1u16;
            for (x, y) in block.iter_mut().rev().zip(b.iter().rev()) {
                let sum = u16::from(*x) + u16::from(*y) + carry;
                *x = (sum & 0xff) as u8;
                carry = sum >> 8;
            }
        }
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn der(pem: &str) -> Vec<u8> {
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap_or_default()
    }

    /// A key derived with 1,000,001 PBKDF2 rounds is not decrypted (it would take
    /// seconds in a debug build): left to Envoy, whatever the password.
    #[test]
    fn keys_with_too_many_rounds_are_not_decrypted() {
        let slow = der(include_str!("../../tests/tls_cases/ec_enc_slow.key"));
        assert_eq!(pkcs8(&slow, b"not-the-password"), Ok(Decrypted::Unchecked));
        let fast = der(include_str!("../../tests/tls_cases/ec_enc.key"));
        assert_eq!(
            pkcs8(&fast, b"not-the-password"),
            Err(DecryptError::BadDecrypt)
        );
        assert!(matches!(pkcs8(&fast, b"secret"), Ok(Decrypted::Der(_))));
    }
}
