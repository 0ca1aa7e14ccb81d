//! Issuing one certificate: what it must be ([`Profile`]: common name, SANs,
//! [`Usage`], validity, [`KeyType`]) and [`issue_cert`], which signs it with a fresh key
//! (self-signed or by a CA) into a [`CertKeyPem`]. Both `marin3r certs` (a CA with a
//! server and a client certificate) and the operator's certificate lifecycle (checks and
//! renewal) issue through it. Pure: the clock is an argument; nothing here does I/O.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::CertsError;

/// Organization of every certificate [`issue_cert`] issues: the API group, as upstream's
/// operator writes it.
pub const ORGANIZATION: &str = marin3r_wire::DOMAIN;
/// Certificates start being valid this long before they are issued, to tolerate clock skew.
pub(crate) const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Kind of key generated for each certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// ECDSA on NIST P-256 with SHA-256 (the default).
    #[default]
    EcdsaP256,
    /// RSA 2048 with SHA-256 (PKCS#1 v1.5 signatures). ring cannot generate RSA keys, so
    /// the key comes from the pure-Rust `rsa` crate; ring signs with it.
    Rsa2048,
}

impl FromStr for KeyType {
    type Err = CertsError;

    /// Accepts `ecdsa`, `ecdsa-p256`, `rsa` and `rsa-2048` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ecdsa" | "ecdsa-p256" | "p256" => Ok(Self::EcdsaP256),
            "rsa" | "rsa-2048" | "rsa2048" => Ok(Self::Rsa2048),
            other => Err(CertsError::InvalidOptions(format!(
                "unknown key type {other:?} (expected ecdsa or rsa)"
            ))),
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EcdsaP256 => "ecdsa",
            Self::Rsa2048 => "rsa",
        })
    }
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A certificate authority (`isCA`): signs the others; no extended key usage.
    Ca,
    /// A TLS server (`server: true`): extended key usage `serverAuth`.
    Server,
    /// A TLS client: extended key usage `clientAuth` (upstream set none;
    /// operator-design.md §8 Q8).
    Client,
}

/// What a certificate must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub common_name: String,
    /// Subject alternative names: an entry that parses as an IP address is an IP SAN,
    /// any other a DNS SAN.
    pub hosts: Vec<String>,
    pub usage: Usage,
    /// From `notBefore + backdate` (the issue time) to `notAfter`.
    pub validity: Duration,
    pub key_type: KeyType,
}

/// One PEM-encoded certificate and its private key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKeyPem {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The PKCS#8 private key, PEM. Secret.
    pub key_pem: String,
}

impl fmt::Debug for CertKeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertKeyPem")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Issues a certificate for `profile` at `now` with a fresh key, signed by `signer` (a CA
/// certificate and its key) or self-signed. `notBefore` is backdated by 5 minutes for
/// clock skew.
pub fn issue_cert(
    profile: &Profile,
    signer: Option<&CertKeyPem>,
    now: SystemTime,
) -> Result<CertKeyPem, CertsError> {
    let params = params(profile, now)?;
    let key = generate_key(profile.key_type, "certificate key")?;
    let generate = |source| CertsError::Generate {
        what: "certificate",
        source,
    };
    let cert = match signer {
        None => params.self_signed(&key).map_err(generate)?,
        Some(signer) => {
            let signer_key =
                KeyPair::from_pem(&signer.key_pem).map_err(|source| CertsError::Generate {
                    what: "signer key (tls.key of the CA)",
                    source,
                })?;
            let issuer =
                Issuer::from_ca_cert_pem(&signer.cert_pem, signer_key).map_err(|source| {
                    CertsError::Generate {
                        what: "signer certificate (tls.crt of the CA)",
                        source,
                    }
                })?;
            params.signed_by(&key, &issuer).map_err(generate)?
        }
    };
    Ok(CertKeyPem {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn params(profile: &Profile, now: SystemTime) -> Result<CertificateParams, CertsError> {
    let cn = profile.common_name.trim();
    if cn.is_empty() {
        return Err(CertsError::InvalidOptions(
            "commonName must not be empty".into(),
        ));
    }
    if profile.validity.is_zero() {
        return Err(CertsError::InvalidOptions(
            "the validity (validFor) must be positive".into(),
        ));
    }
    let not_after = now.checked_add(profile.validity).ok_or_else(|| {
        CertsError::InvalidOptions(format!("validity {:?} is too long", profile.validity))
    })?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, ORGANIZATION);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.not_before = now.checked_sub(BACKDATE).unwrap_or(now).into();
    params.not_after = not_after.into();
    params.subject_alt_names =
        profile
            .hosts
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
            .map(|host| match host.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => host.try_into().map(SanType::DnsName).map_err(|source| {
                    CertsError::InvalidHost {
                        host: host.to_owned(),
                        source,
                    }
                }),
            })
            .collect::<Result<_, _>>()?;
    match profile.usage {
        Usage::Ca => {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
        }
        Usage::Server | Usage::Client => {
            params.is_ca = IsCa::ExplicitNoCa;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.use_authority_key_identifier_extension = true;
            params.extended_key_usages = vec![if profile.usage == Usage::Server {
                ExtendedKeyUsagePurpose::ServerAuth
            } else {
                ExtendedKeyUsagePurpose::ClientAuth
            }];
        }
    }
    Ok(params)
}

/// Generates a key of `key_type`; `what` names it in errors.
fn generate_key(key_type: KeyType, what: &'static str) -> Result<KeyPair, CertsError> {
    match key_type {
        KeyType::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|source| CertsError::Generate { what, source }),
        KeyType::Rsa2048 => {
            use rsa::pkcs8::EncodePrivateKey as _;
            let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).map_err(|e| {
                CertsError::Rsa {
                    what,
                    message: e.to_string(),
                }
            })?;
            let der = key.to_pkcs8_der().map_err(|e| CertsError::Rsa {
                what,
                message: e.to_string(),
            })?;
            let der = rustls_pki_types::PrivatePkcs8KeyDer::from(der.as_bytes());
            KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256)
                .map_err(|source| CertsError::Generate { what, source })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_type_parses() {
        assert_eq!("ecdsa".parse::<KeyType>().unwrap(), KeyType::EcdsaP256);
        assert_eq!("RSA".parse::<KeyType>().unwrap(), KeyType::Rsa2048);
        assert!("dsa".parse::<KeyType>().is_err());
        assert_eq!(KeyType::default().to_string(), "ecdsa");
    }
}
