//! What Envoy's TLS context loader refuses in a resource that its proto constraints
//! accept: `envoy --mode validate` never builds TLS contexts, but a serving Envoy does
//! when it loads a listener, a cluster or an SDS secret, and NACKs the resource when:
//!
//! - an inline `TlsCertificate.certificate_chain` holds no PEM certificate that parses
//!   ("Failed to load certificate chain from <inline>"), a later certificate of the chain
//!   does not parse, or the leaf's key is not one Envoy serves with: RSA of 2048 bits or
//!   more ("only RSA certificates with 2048-bit or larger keys are supported"), ECDSA on
//!   P-256, P-384 or P-521, or Ed25519 (RSA-PSS, DSA, Ed448… are refused);
//! - an inline `TlsCertificate.private_key` holds no PEM private key (labels `PRIVATE
//!   KEY`, `RSA PRIVATE KEY`, `EC PRIVATE KEY`, `DSA PRIVATE KEY`, `ENCRYPTED PRIVATE
//!   KEY`; "Failed to load private key from <inline>, Cause: …NO_START_LINE"), the key
//!   does not parse or is of an algorithm BoringSSL does not read (`UNSUPPORTED_ALGORITHM`:
//!   Ed448, RSA-PSS), an encrypted key has no `password`, does not decrypt with it
//!   (`BAD_DECRYPT`) or uses a scheme BoringSSL cannot decrypt ([`encrypted_key`]), or
//!   the (decrypted) key does not belong to the inline leaf certificate
//!   (`KEY_TYPE_MISMATCH`, also for DSA keys; `KEY_VALUES_MISMATCH`);
//! - an inline `CertificateValidationContext.trusted_ca` holds no PEM certificate, or
//!   one of its certificates does not parse ("Failed to load trusted CA certificates
//!   from <inline>"); not checked when a `custom_validator_config` replaces the default
//!   validator; a CA's key algorithm is not checked (Envoy loads DSA and RSA-PSS CAs);
//! - `TlsParameters.ecdh_curves`, joined with `:` as Envoy does, names a group BoringSSL
//!   does not know, an empty entry or a group twice ("Failed to initialize ECDH curves");
//! - `TlsParameters.cipher_suites`, joined with `:`, does not parse as BoringSSL's strict
//!   cipher rule list or selects no cipher ("Failed to initialize cipher suites";
//!   [`cipher_rules`]);
//! - `TlsParameters.signature_algorithms`, joined with `:`, does not parse as BoringSSL's
//!   signature algorithm list ("Failed to initialize TLS signature algorithms";
//!   [`sigalgs`]).
//!
//! BoringSSL reads each joined list as a C string: it ends at the first NUL.
//!
//! Each rule was checked against Envoy 1.40.0 (`envoy --mode init_only` on a static
//! bootstrap, which builds every listener's and cluster's TLS context; see
//! `envoyconfig/tests/envoy_tls_loader.rs`). What Envoy reads from files, environment
//! variables or watched directories is not seen here (nor a password from them). A CRL
//! (`crl`) is not checked: Envoy 1.40 loads a placeholder CRL without complaint. Not
//! checked either (accepted here, refused by Envoy): an EC private key that does not
//! carry its public point, for a certificate of another EC key (matching it would take
//! an EC scalar multiplication). Errors name the field and the rule, never the content
//! (a private key must not end up in a log).

mod cipher_rules;
mod encrypted_key;
mod sigalgs;

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use prost_reflect::{DynamicMessage, ReflectMessage, Value};
use x509_parser::asn1_rs::{Any, Class, FromBer, Tag};
use x509_parser::certificate::X509Certificate;
use x509_parser::public_key::PublicKey;

use crate::error::{DecodeError, Location, join_path};

const TLS: &str = "envoy.extensions.transport_sockets.tls.v3.";

/// Checks one message if it is one of the TLS messages Envoy loads.
pub(crate) fn check(message: &DynamicMessage, path: &str) -> Result<(), DecodeError> {
    let name = message.descriptor();
    let Some(short) = name.full_name().strip_prefix(TLS) else {
        return Ok(());
    };
    match short {
        "TlsCertificate" => tls_certificate(message, path),
        "CertificateValidationContext" => validation_context(message, path),
        "TlsParameters" => tls_parameters(message, path),
        _ => Ok(()),
    }
}

fn refuse(path: &str, field: &str, message: impl Into<String>) -> DecodeError {
    DecodeError::TlsMaterial {
        at: Location::new("", join_path(path, field)),
        message: message.into(),
    }
}

// --- DataSource -------------------------------------------------------------------------

/// The inline content of the `DataSource` in `field`, when it is inline.
fn inline(message: &DynamicMessage, field: &str) -> Option<Vec<u8>> {
    let source = message.get_field_by_name(field)?;
    let Value::Message(source) = &*source else {
        return None;
    };
    if let Some(f) = source.descriptor().get_field_by_name("inline_string")
        && source.has_field(&f)
    {
        return source.get_field(&f).as_str().map(|s| s.as_bytes().to_vec());
    }
    if let Some(f) = source.descriptor().get_field_by_name("inline_bytes")
        && source.has_field(&f)
    {
        return source.get_field(&f).as_bytes().map(|b| b.to_vec());
    }
    None
}

fn has(message: &DynamicMessage, field: &str) -> bool {
    message
        .descriptor()
        .get_field_by_name(field)
        .is_some_and(|f| message.has_field(&f))
}

// --- PEM --------------------------------------------------------------------------------

/// One PEM block: its label and DER content; `None` when it is malformed (no END line,
/// END of another label, bad base64), which makes BoringSSL's reader fail.
struct Block {
    label: String,
    der: Option<Vec<u8>>,
    /// An RFC 1421 `Proc-Type: 4,ENCRYPTED` header (an encrypted traditional key).
    encrypted: bool,
    /// The value of its `DEK-Info` header (`<cipher>,<hex IV>`).
    dek_info: Option<String>,
}

/// Base64 as BoringSSL's PEM reader takes it (padding optional).
const PEM_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The PEM blocks of `text`, in order; text outside blocks is ignored (as BoringSSL does).
fn pem_blocks(text: &[u8]) -> Vec<Block> {
    let text = String::from_utf8_lossy(text);
    let mut lines = text.lines().map(str::trim_end);
    let mut out = Vec::new();
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        let mut encrypted = false;
        let mut dek_info = None;
        let mut closed = false;
        let mut bad = false;
        for line in lines.by_ref() {
            if line.starts_with("-----END ") {
                closed = line == end;
                break;
            }
            if line.contains(':') {
                // An RFC 1421 header (Proc-Type, DEK-Info).
                encrypted |= line.starts_with("Proc-Type:") && line.contains("ENCRYPTED");
                if let Some(value) = line.strip_prefix("DEK-Info:") {
                    dek_info = Some(value.trim().to_string());
                }
                if !body.is_empty() {
                    bad = true;
                }
                continue;
            }
            body.extend(line.chars().filter(|c| !c.is_ascii_whitespace()));
        }
        let der = if closed && !bad {
            PEM_BASE64.decode(body.as_bytes()).ok()
        } else {
            None
        };
        out.push(Block {
            label: label.to_string(),
            der,
            encrypted,
            dek_info,
        });
    }
    out
}

/// Labels BoringSSL reads as a certificate (`PEM_read_bio_X509_AUX` also takes `TRUSTED
/// CERTIFICATE`; the rest of a chain is read with `PEM_read_bio_X509`).
fn is_certificate(label: &str, trusted_too: bool) -> bool {
    matches!(label, "CERTIFICATE" | "X509 CERTIFICATE")
        || (trusted_too && label == "TRUSTED CERTIFICATE")
}

fn parse_certificate(der: &[u8]) -> Option<X509Certificate<'_>> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, c)| c)
}

// --- TlsCertificate ---------------------------------------------------------------------

/// The key of a certificate or private key, as far as matching them needs.
#[derive(Debug, PartialEq)]
enum Key {
    /// The modulus, without leading zero bytes.
    Rsa(Vec<u8>),
    /// The public point, when the private key carries it.
    Ec(Option<Vec<u8>>),
    /// The public key, when known.
    Ed25519(Option<Vec<u8>>),
    /// A key BoringSSL parses but TLS cannot use (DSA, X25519): it matches no
    /// certificate.
    Unusable,
}

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_P521: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x23];
const OID_DSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01];
const OID_X25519: &[u8] = &[0x2b, 0x65, 0x6e];

/// A name for a key algorithm Envoy does not load, for errors.
fn algorithm_name(oid: &[u8]) -> &'static str {
    match oid {
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a] => "RSA-PSS (id-RSASSA-PSS)",
        OID_DSA => "DSA",
        OID_X25519 => "X25519",
        [0x2b, 0x65, 0x71] => "Ed448",
        [0x2b, 0x65, 0x6f] => "X448",
        _ => "of another algorithm",
    }
}

fn strip_zeros(b: &[u8]) -> Vec<u8> {
    let first = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    b[first..].to_vec()
}

fn tls_certificate(message: &DynamicMessage, path: &str) -> Result<(), DecodeError> {
    let leaf = match inline(message, "certificate_chain") {
        Some(chain) => Some(certificate_chain(&chain, path)?),
        None => None,
    };
    let Some(key) = inline(message, "private_key") else {
        return Ok(());
    };
    let blocks = pem_blocks(&key);
    let mut found = None;
    for block in &blocks {
        let is_key = matches!(
            block.label.as_str(),
            "PRIVATE KEY"
                | "RSA PRIVATE KEY"
                | "EC PRIVATE KEY"
                | "DSA PRIVATE KEY"
                | "ENCRYPTED PRIVATE KEY"
        );
        if block.der.is_none() {
            return Err(refuse(
                path,
                "private_key",
                "a PEM block is malformed (Envoy: Failed to load private key)",
            ));
        }
        if is_key {
            found = Some(block);
            break;
        }
    }
    let Some(block) = found else {
        return Err(refuse(
            path,
            "private_key",
            "no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block) \
             (Envoy: Failed to load private key, NO_START_LINE)",
        ));
    };
    let der = block.der.as_deref().unwrap_or_default();
    let (label, der) = if block.label == "ENCRYPTED PRIVATE KEY" || block.encrypted {
        let password = inline(message, "password");
        if !has(message, "password") || password.as_ref().is_some_and(|p| p.is_empty()) {
            return Err(refuse(
                path,
                "private_key",
                "the PEM private key is encrypted and no password is set (Envoy: Failed \
                 to load private key)",
            ));
        }
        // A password from a file or the environment is not seen here.
        let Some(password) = password else {
            return Ok(());
        };
        let decrypted = if block.label == "ENCRYPTED PRIVATE KEY" {
            encrypted_key::pkcs8(der, &password).map(|d| ("PRIVATE KEY", d))
        } else {
            encrypted_key::traditional(block.dek_info.as_deref(), der, &password)
                .map(|d| (block.label.as_str(), d))
        };
        match decrypted {
            Ok((label, encrypted_key::Decrypted::Der(der))) => (label, der),
            Ok((_, encrypted_key::Decrypted::Unchecked)) => return Ok(()),
            Err(e) => return Err(refuse(path, "private_key", decrypt_error(&e))),
        }
    } else {
        (block.label.as_str(), der.to_vec())
    };
    let private = match private_key(label, &der) {
        Some(Ok(private)) => private,
        Some(Err(algorithm)) => {
            return Err(refuse(
                path,
                "private_key",
                format!(
                    "the private key is {algorithm}: Envoy loads RSA, ECDSA and Ed25519 keys \
                     (Envoy: Failed to load private key, UNSUPPORTED_ALGORITHM)"
                ),
            ));
        }
        None if block.label != label || block.encrypted => {
            // Decrypted content that does not parse: the password is wrong.
            return Err(refuse(
                path,
                "private_key",
                decrypt_error(&encrypted_key::DecryptError::BadDecrypt),
            ));
        }
        None => {
            return Err(refuse(
                path,
                "private_key",
                format!("the PEM {label} does not parse (Envoy: Failed to load private key)"),
            ));
        }
    };
    if let Some(public) = leaf {
        key_matches(&private, &public, path)?;
    }
    Ok(())
}

fn decrypt_error(e: &encrypted_key::DecryptError) -> String {
    match e {
        encrypted_key::DecryptError::BadDecrypt => {
            "the encrypted private key does not decrypt with the given password (Envoy: \
             Failed to load private key, BAD_DECRYPT)"
                .to_string()
        }
        encrypted_key::DecryptError::Unsupported(what) => format!(
            "the private key is encrypted with {what}, which Envoy cannot decrypt (Envoy: \
             Failed to load private key)"
        ),
        encrypted_key::DecryptError::Malformed => "the encrypted private key's encryption \
             parameters do not parse (Envoy: Failed to load private key)"
            .to_string(),
    }
}

/// Checks the chain; returns the leaf's key.
fn certificate_chain(chain: &[u8], path: &str) -> Result<Key, DecodeError> {
    let failed = |why: &str| {
        refuse(
            path,
            "certificate_chain",
            format!("{why} (Envoy: Failed to load certificate chain)"),
        )
    };
    let mut leaf = None;
    for block in pem_blocks(chain) {
        let Some(der) = block.der else {
            return Err(failed("a PEM block is malformed"));
        };
        if !is_certificate(&block.label, leaf.is_none()) {
            continue;
        }
        let Some(cert) = parse_certificate(&der) else {
            return Err(failed(if leaf.is_none() {
                "the first PEM certificate does not parse"
            } else {
                "a PEM certificate of the chain does not parse"
            }));
        };
        if leaf.is_none() {
            leaf = Some(leaf_key(&cert, path)?);
        }
    }
    leaf.ok_or_else(|| failed("no PEM certificate (CERTIFICATE block)"))
}

fn leaf_key(cert: &X509Certificate<'_>, path: &str) -> Result<Key, DecodeError> {
    let spki = cert.public_key();
    let oid = spki.algorithm.algorithm.as_bytes();
    if oid == OID_RSA {
        let Ok(PublicKey::RSA(rsa)) = spki.parsed() else {
            return Err(refuse(
                path,
                "certificate_chain",
                "the certificate's RSA key does not parse (Envoy: Failed to load certificate \
                 chain)",
            ));
        };
        let modulus = strip_zeros(rsa.modulus);
        let bits = modulus.first().map_or(0, |b| {
            (modulus.len() - 1) * 8 + (8 - b.leading_zeros() as usize)
        });
        if bits < 2048 {
            return Err(refuse(
                path,
                "certificate_chain",
                format!(
                    "the certificate's RSA key has {bits} bits: Envoy supports RSA \
                     certificates with 2048-bit or larger keys"
                ),
            ));
        }
        return Ok(Key::Rsa(modulus));
    }
    if oid == OID_EC {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .filter(|p| p.tag() == Tag::Oid)
            .map(|p| p.data);
        if !matches!(curve, Some(c) if c == OID_P256 || c == OID_P384 || c == OID_P521) {
            return Err(refuse(
                path,
                "certificate_chain",
                "the certificate's ECDSA key is not on P-256, P-384 or P-521 (Envoy: Failed \
                 to load certificate chain)",
            ));
        }
        return Ok(Key::Ec(Some(spki.subject_public_key.data.to_vec())));
    }
    if oid == OID_ED25519 {
        return Ok(Key::Ed25519(Some(spki.subject_public_key.data.to_vec())));
    }
    Err(refuse(
        path,
        "certificate_chain",
        format!(
            "the certificate's key is {}: Envoy loads RSA, ECDSA (P-256, P-384, P-521) and \
             Ed25519 certificates (Envoy: Failed to load certificate chain)",
            algorithm_name(oid)
        ),
    ))
}

/// The items of a DER/BER SEQUENCE.
fn sequence(der: &[u8]) -> Option<Vec<Any<'_>>> {
    let (_, any) = Any::from_ber(der).ok()?;
    items(&any)
}

/// The items of a SEQUENCE item.
fn items<'a>(any: &Any<'a>) -> Option<Vec<Any<'a>>> {
    if any.tag() != Tag::Sequence {
        return None;
    }
    let mut rest = any.data;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (r, item) = Any::from_ber(rest).ok()?;
        out.push(item);
        rest = r;
    }
    Some(out)
}

/// Parses a private key of a PEM label; `None` when it does not parse, `Some(Err(name))`
/// for an algorithm BoringSSL does not parse (`UNSUPPORTED_ALGORITHM`).
fn private_key(label: &str, der: &[u8]) -> Option<Result<Key, &'static str>> {
    match label {
        "RSA PRIVATE KEY" => rsa_private_key(der).map(Ok),
        "EC PRIVATE KEY" => ec_private_key(der).map(Ok),
        "PRIVATE KEY" => {
            // PKCS #8: version, AlgorithmIdentifier, OCTET STRING privateKey, …
            let info = sequence(der)?;
            let algorithm = items(info.get(1)?)?;
            let oid = algorithm.first().filter(|a| a.tag() == Tag::Oid)?.data;
            let inner = info.get(2).filter(|a| a.tag() == Tag::OctetString)?.data;
            if oid == OID_RSA {
                rsa_private_key(inner).map(Ok)
            } else if oid == OID_EC {
                ec_private_key(inner).map(Ok)
            } else if oid == OID_ED25519 {
                // ring reads PKCS #8 v1 and v2 Ed25519 keys and derives the public key.
                let public = ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
                    .ok()
                    .map(|pair| {
                        use ring::signature::KeyPair as _;
                        pair.public_key().as_ref().to_vec()
                    });
                Some(Ok(Key::Ed25519(public)))
            } else if oid == OID_DSA || oid == OID_X25519 {
                Some(Ok(Key::Unusable))
            } else {
                Some(Err(algorithm_name(oid)))
            }
        }
        // `DSA PRIVATE KEY`
        _ => Some(Ok(Key::Unusable)),
    }
}

/// PKCS #1 RSAPrivateKey: version, modulus, publicExponent, …
fn rsa_private_key(der: &[u8]) -> Option<Key> {
    let items = sequence(der)?;
    if items.len() < 9 {
        return None;
    }
    let modulus = items.get(1).filter(|a| a.tag() == Tag::Integer)?.data;
    Some(Key::Rsa(strip_zeros(modulus)))
}

/// SEC 1 ECPrivateKey: version, privateKey, [0] parameters, [1] publicKey.
fn ec_private_key(der: &[u8]) -> Option<Key> {
    let items = sequence(der)?;
    items.get(1).filter(|a| a.tag() == Tag::OctetString)?;
    let public = items
        .iter()
        .find(|a| a.class() == Class::ContextSpecific && a.tag() == Tag(1))
        .and_then(|a| Any::from_ber(a.data).ok())
        .filter(|(_, bits)| bits.tag() == Tag::BitString)
        .and_then(|(_, bits)| bits.data.get(1..).map(<[u8]>::to_vec));
    Some(Key::Ec(public))
}

fn key_matches(private: &Key, public: &Key, path: &str) -> Result<(), DecodeError> {
    let mismatch = |what: &str| {
        Err(refuse(
            path,
            "private_key",
            format!(
                "the private key does not belong to the first certificate of \
                 certificate_chain ({what}; Envoy: Failed to load private key)"
            ),
        ))
    };
    match (private, public) {
        (Key::Rsa(a), Key::Rsa(b)) if a != b => mismatch("KEY_VALUES_MISMATCH"),
        (Key::Ec(Some(a)), Key::Ec(Some(b))) | (Key::Ed25519(Some(a)), Key::Ed25519(Some(b)))
            if a != b =>
        {
            mismatch("KEY_VALUES_MISMATCH")
        }
        (Key::Rsa(_), Key::Rsa(_))
        | (Key::Ec(_), Key::Ec(_))
        | (Key::Ed25519(_), Key::Ed25519(_)) => Ok(()),
        _ => mismatch("KEY_TYPE_MISMATCH"),
    }
}

// --- CertificateValidationContext -------------------------------------------------------

fn validation_context(message: &DynamicMessage, path: &str) -> Result<(), DecodeError> {
    if has(message, "custom_validator_config") {
        return Ok(());
    }
    let Some(ca) = inline(message, "trusted_ca") else {
        return Ok(());
    };
    let failed = |why: &str| {
        refuse(
            path,
            "trusted_ca",
            format!("{why} (Envoy: Failed to load trusted CA certificates)"),
        )
    };
    let mut count = 0;
    for block in pem_blocks(&ca) {
        let Some(der) = block.der else {
            return Err(failed("a PEM block is malformed"));
        };
        if is_certificate(&block.label, true) {
            if parse_certificate(&der).is_none() {
                return Err(failed("a PEM certificate does not parse"));
            }
            count += 1;
        }
    }
    if count == 0 {
        return Err(failed("no PEM certificate (CERTIFICATE block)"));
    }
    Ok(())
}

// --- TlsParameters ----------------------------------------------------------------------

/// The groups BoringSSL in Envoy 1.40 takes in a curves list, with their aliases (each
/// entry is one group). Checked one by one against Envoy 1.40.0; `P-224`,
/// `X25519Kyber768Draft00`, `X25519MLKEM1024`, `MLKEM768`, `secp256r1`, `X448`,
/// `ffdhe2048` and lower-case `p-256` are refused.
const CURVES: &[&[&str]] = &[
    &["P-256", "prime256v1"],
    &["P-384", "secp384r1"],
    &["P-521", "secp521r1"],
    &["X25519", "x25519"],
    &["X25519MLKEM768"],
    &["MLKEM1024"],
];

fn strings(message: &DynamicMessage, field: &str) -> Vec<String> {
    match message.get_field_by_name(field).as_deref() {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// A list field as BoringSSL receives it, or `None` when Envoy does not set it (empty):
/// Envoy joins the entries with `:` and passes a C string, so BoringSSL's list ends at
/// the first NUL (`["X25519\u0000junk"]` is `X25519`).
fn boringssl_list(message: &DynamicMessage, field: &str) -> Option<String> {
    let joined = strings(message, field).join(":");
    if joined.is_empty() {
        return None;
    }
    let end = joined.find('\0').unwrap_or(joined.len());
    Some(joined[..end].to_string())
}

fn tls_parameters(message: &DynamicMessage, path: &str) -> Result<(), DecodeError> {
    if let Some(curves) = boringssl_list(message, "ecdh_curves") {
        let mut seen = Vec::new();
        for name in curves.split(':') {
            let Some(group) = CURVES.iter().position(|g| g.contains(&name)) else {
                return Err(refuse(
                    path,
                    "ecdh_curves",
                    format!(
                        "{name:?} is not a curve Envoy knows (P-256, P-384, P-521, X25519, \
                         X25519MLKEM768, MLKEM1024) (Envoy: Failed to initialize ECDH curves)"
                    ),
                ));
            };
            if seen.contains(&group) {
                return Err(refuse(
                    path,
                    "ecdh_curves",
                    format!(
                        "{name:?} names a curve twice (Envoy: Failed to initialize ECDH curves)"
                    ),
                ));
            }
            seen.push(group);
        }
    }
    if let Some(ciphers) = boringssl_list(message, "cipher_suites") {
        cipher_list(&ciphers, path)?;
    }
    if let Some(list) = boringssl_list(message, "signature_algorithms") {
        sigalgs::parse(&list).map_err(|why| {
            refuse(
                path,
                "signature_algorithms",
                format!(
                    "{why}, in {list:?} (Envoy: Failed to initialize TLS signature algorithms)"
                ),
            )
        })?;
    }
    Ok(())
}

/// BoringSSL's strict cipher rule list (`cipher_rules`): Envoy refuses a list that does
/// not parse or selects no cipher.
fn cipher_list(list: &str, path: &str) -> Result<(), DecodeError> {
    cipher_rules::select(list).map(|_| ()).map_err(|why| {
        refuse(
            path,
            "cipher_suites",
            format!("{why}, in {list:?} (Envoy: Failed to initialize cipher suites)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_skip_text_and_flag_malformed_ones() {
        let text = b"junk\n-----BEGIN A-----\nAAEC\n-----END A-----\nmore\n-----BEGIN B-----\n!!\n-----END B-----\n-----BEGIN C-----\nAA==\n";
        let blocks = pem_blocks(text);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0].label, "A");
        assert_eq!(blocks[0].der.as_deref(), Some(&[0u8, 1, 2][..]));
        assert!(blocks[1].der.is_none());
        assert!(blocks[2].der.is_none());
    }

    #[test]
    fn cipher_rules() {
        let ok = |l: &str| cipher_list(l, "").is_ok();
        assert!(ok("ECDHE-RSA-AES128-GCM-SHA256"));
        assert!(ok("-ALL:ECDHE-RSA-AES128-GCM-SHA256"));
        assert!(ok(
            "[ECDHE-ECDSA-AES128-GCM-SHA256|ECDHE-ECDSA-CHACHA20-POLY1305]"
        ));
        assert!(ok("ECDHE+AES"));
        assert!(!ok("-ALL"));
        assert!(!ok("!ALL:AES"));
        assert!(!ok("+ECDHE"));
        assert!(!ok("ECDHE-RSA-AES128-GCM-SHA256:-ALL"));
        assert!(!ok("!RC4:ALL"));
        assert!(!ok("TLS_AES_128_GCM_SHA256"));
    }
}
