//! One certificate's lifecycle, as the DiscoveryServiceCertificate controller runs it
//! (operator-design.md §4 and Q6–Q8, Q15): issue it from a [`Profile`], check it on every
//! pass ([`check`]), re-issue it when it is missing, unreadable, not what the profile asks
//! for, not signed by its signer, expired, or has less than 20 % of its lifetime left, and
//! build the trust bundle that keeps a previous CA trusted while a CA rotates
//! ([`trust_bundle`]). Pure: the clock is an argument; nothing here does I/O.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::KeyPair;
use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};

use crate::certificate::BACKDATE;
use crate::{CertKeyPem, KeyType};

// A profile and issuing from it are shared with `marin3r certs` (`crate::certificate`);
// the operator reaches them through this module.
pub use crate::certificate::{ORGANIZATION, Profile, Usage, issue_cert};

/// Fraction of a certificate's lifetime left below which it is renewed: it is re-issued
/// at 80 % of its lifetime.
pub const RENEW_WHEN_LEFT: f64 = 0.20;
/// Longest wait between two checks of a valid certificate: wall-clock expiry cannot be
/// trusted to a monotonic timer days ahead (a suspended node, a clock step), so a
/// certificate is looked at again at least this often.
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(60 * 60);
/// Shortest wait between two checks, so that a certificate due now cannot spin.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Tolerance when comparing a certificate's lifetime with the profile's validity.
const LIFETIME_TOLERANCE: Duration = Duration::from_secs(2);

/// What a pass finds about the current certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Usable. Check it again at `next_check` (its renewal time, or its expiry when
    /// renewal is off).
    Ready {
        not_before: SystemTime,
        not_after: SystemTime,
        next_check: SystemTime,
    },
    /// Issue a new certificate (and key), for this reason.
    Reissue(String),
    /// Unusable and not to be replaced (renewal is off and it expired).
    Expired {
        not_before: SystemTime,
        not_after: SystemTime,
    },
}

/// Checks `current` (the Secret's `tls.crt` and `tls.key`, `None` when the Secret or one
/// of them is missing) against `profile` and its signer's certificate (`None`:
/// self-signed) at `now`. With `renewal` on (the default), an expired certificate or
/// one with less than [`RENEW_WHEN_LEFT`] of its lifetime left is re-issued; with it
/// off, it is used until it expires and then reported [`Verdict::Expired`]. Anything
/// else wrong — unparsable PEM, a key that is not the certificate's, a common name,
/// SANs, usage, key type or lifetime other than the profile's, a signature that is not
/// the signer's — is always re-issued.
pub fn check(
    profile: &Profile,
    current: Option<&CertKeyPem>,
    signer_cert_pem: Option<&str>,
    renewal: bool,
    now: SystemTime,
) -> Verdict {
    let Some(current) = current else {
        return Verdict::Reissue("no certificate yet".into());
    };
    let inspected = match inspect(profile, current, signer_cert_pem) {
        Ok(window) => window,
        Err(reason) => return Verdict::Reissue(reason),
    };
    let (not_before, not_after) = inspected;
    // The lifetime counts from the issue time (`notBefore` + the backdate), i.e. it is
    // the spec's validity: a certificate valid for 10 s is renewed 8 s after its issue
    // (upstream's worked examples), not at once because of the 5-minute backdate.
    let issued_at = not_before + BACKDATE;
    let lifetime = not_after.duration_since(issued_at).unwrap_or_default();
    let renew_at = not_after
        .checked_sub(lifetime.mul_f64(RENEW_WHEN_LEFT))
        .unwrap_or(issued_at);
    let expired = now >= not_after || now < not_before;
    match (renewal, expired) {
        (true, true) => Verdict::Reissue("outside its validity window".into()),
        (true, false) if now >= renew_at => Verdict::Reissue(format!(
            "renewal due: less than {:.0} % of its lifetime left",
            RENEW_WHEN_LEFT * 100.0
        )),
        (true, false) => Verdict::Ready {
            not_before,
            not_after,
            next_check: renew_at,
        },
        (false, true) => Verdict::Expired {
            not_before,
            not_after,
        },
        (false, false) => Verdict::Ready {
            not_before,
            not_after,
            next_check: not_after + Duration::from_secs(1),
        },
    }
}

/// How long to wait before the next check of a certificate due at `next_check`:
/// clamped to [[`MIN_CHECK_INTERVAL`], [`MAX_CHECK_INTERVAL`]].
pub fn requeue_after(next_check: SystemTime, now: SystemTime) -> Duration {
    next_check
        .duration_since(now)
        .unwrap_or_default()
        .clamp(MIN_CHECK_INTERVAL, MAX_CHECK_INTERVAL)
}

/// `(notBefore, notAfter)` of the first certificate of `cert_pem`, or why it does not
/// parse (the operator keeps a replaced CA in the trust bundle only if it parsed).
pub fn validity(cert_pem: &str) -> Result<(SystemTime, SystemTime), String> {
    let der = pem_der(cert_pem, "CERTIFICATE")?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|e| e.to_string())?;
    let validity = cert.validity();
    Ok((
        to_system_time(validity.not_before.timestamp()),
        to_system_time(validity.not_after.timestamp()),
    ))
}

/// `(notBefore, notAfter)` of `current` if it is what `profile` and the signer ask for,
/// else why not.
fn inspect(
    profile: &Profile,
    current: &CertKeyPem,
    signer_cert_pem: Option<&str>,
) -> Result<(SystemTime, SystemTime), String> {
    let der = pem_der(&current.cert_pem, "CERTIFICATE")
        .map_err(|e| format!("tls.crt is not a PEM certificate: {e}"))?;
    let (_, cert) = X509Certificate::from_der(&der)
        .map_err(|e| format!("tls.crt does not parse as X.509: {e}"))?;
    let key = KeyPair::from_pem(&current.key_pem)
        .map_err(|e| format!("tls.key is not a usable private key: {e}"))?;
    if key.public_key_raw() != &*cert.public_key().subject_public_key.data {
        return Err("tls.key is not the key of tls.crt".into());
    }

    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default();
    if cn != profile.common_name.trim() {
        return Err(format!(
            "common name {cn:?} is not the spec's {:?}",
            profile.common_name
        ));
    }
    let want_sans: BTreeSet<String> = profile
        .hosts
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .map(|h| match h.parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => h.to_string(),
        })
        .collect();
    let got_sans: BTreeSet<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|s| {
            s.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some((*d).to_string()),
                    GeneralName::IPAddress(b) => ip_from_bytes(b),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if got_sans != want_sans {
        return Err(format!(
            "SANs {got_sans:?} are not the spec's hosts {want_sans:?}"
        ));
    }
    let eku = cert.extended_key_usage().ok().flatten().map(|e| e.value);
    let usage_ok = match profile.usage {
        Usage::Ca => cert.is_ca(),
        Usage::Server => !cert.is_ca() && eku.is_some_and(|e| e.server_auth),
        Usage::Client => !cert.is_ca() && eku.is_some_and(|e| e.client_auth),
    };
    if !usage_ok {
        return Err(format!(
            "not a {} certificate",
            match profile.usage {
                Usage::Ca => "CA",
                Usage::Server => "server (serverAuth)",
                Usage::Client => "client (clientAuth)",
            }
        ));
    }
    let algorithm = cert.public_key().algorithm.algorithm.to_id_string();
    let key_ok = match profile.key_type {
        KeyType::EcdsaP256 => algorithm == "1.2.840.10045.2.1",
        KeyType::Rsa2048 => algorithm == "1.2.840.113549.1.1.1",
    };
    if !key_ok {
        return Err(format!("the key is not {}", profile.key_type));
    }

    let validity = cert.validity();
    let not_before = to_system_time(validity.not_before.timestamp());
    let not_after = to_system_time(validity.not_after.timestamp());
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let want = profile.validity + BACKDATE;
    if lifetime.abs_diff(want) > LIFETIME_TOLERANCE {
        return Err(format!(
            "its lifetime is {} s, not the spec's {} s",
            lifetime.saturating_sub(BACKDATE).as_secs(),
            profile.validity.as_secs()
        ));
    }

    let signer_der = match signer_cert_pem {
        None => der.clone(),
        Some(pem) => pem_der(pem, "CERTIFICATE")
            .map_err(|e| format!("the signer's tls.crt is not a PEM certificate: {e}"))?,
    };
    let (_, signer) = X509Certificate::from_der(&signer_der)
        .map_err(|e| format!("the signer's tls.crt does not parse as X.509: {e}"))?;
    if cert.issuer() != signer.subject()
        || cert.verify_signature(Some(signer.public_key())).is_err()
    {
        return Err(if signer_cert_pem.is_some() {
            "not signed by the current CA".into()
        } else {
            "not self-signed".into()
        });
    }
    Ok((not_before, not_after))
}

/// The DER of the first PEM block with label `label` in `pem`.
fn pem_der(pem: &str, label: &str) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::{PemObject as _, SectionKind};
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        let (kind, der) = item.map_err(|e| e.to_string())?;
        if kind == SectionKind::Certificate && label == "CERTIFICATE" {
            return Ok(der);
        }
    }
    Err(format!("no {label} block"))
}

fn ip_from_bytes(b: &[u8]) -> Option<String> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b)
            .ok()
            .map(|a| IpAddr::from(a).to_string()),
        16 => <[u8; 16]>::try_from(b)
            .ok()
            .map(|a| IpAddr::from(a).to_string()),
        _ => None,
    }
}

fn to_system_time(unix: i64) -> SystemTime {
    match u64::try_from(unix) {
        Ok(secs) => SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

/// A CA that was replaced and stays trusted until `until`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetiredCa {
    pub cert_pem: String,
    pub until: SystemTime,
}

/// The trust bundle (`ca.crt`) while a CA rotates: the current CA first, then every
/// retired CA still inside its overlap window at `now`. Leaves signed by a retired CA
/// keep being trusted (and Envoys keep trusting the discovery service's certificate)
/// until each is re-issued and mounted.
pub fn trust_bundle(current_ca_pem: &str, retired: &[RetiredCa], now: SystemTime) -> String {
    let mut bundle = ensure_newline(current_ca_pem);
    for ca in retired.iter().filter(|ca| now < ca.until) {
        if ca.cert_pem.trim() != current_ca_pem.trim() {
            bundle.push_str(&ensure_newline(&ca.cert_pem));
        }
    }
    bundle
}

/// How long a replaced CA stays in the trust bundles: long enough for every leaf it
/// signed to be re-issued and for the kubelet to refresh every Secret volume, i.e.
/// `max(longest leaf validity, 2 × kubelet sync period)`.
pub fn overlap(longest_leaf_validity: Duration, kubelet_sync: Duration) -> Duration {
    longest_leaf_validity.max(kubelet_sync * 2)
}

fn ensure_newline(pem: &str) -> String {
    let mut s = pem.trim_end().to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn t0() -> SystemTime {
        marin3r_testkit::unix_time(1_800_000_000)
    }

    fn ca_profile() -> Profile {
        Profile {
            common_name: "marin3r-ca-instance".into(),
            hosts: vec!["marin3r-ca-instance".into()],
            usage: Usage::Ca,
            validity: 1000 * HOUR,
            key_type: KeyType::EcdsaP256,
        }
    }

    fn server_profile() -> Profile {
        Profile {
            common_name: "marin3r-server-instance".into(),
            hosts: vec![
                "marin3r-instance".into(),
                "marin3r-instance.ns.svc".into(),
                "127.0.0.1".into(),
            ],
            usage: Usage::Server,
            validity: 100 * HOUR,
            key_type: KeyType::EcdsaP256,
        }
    }

    #[test]
    fn an_issued_certificate_checks_ready_until_80_percent_of_its_lifetime() {
        let ca = issue_cert(&ca_profile(), None, t0()).unwrap();
        assert!(matches!(
            check(&ca_profile(), Some(&ca), None, true, t0()),
            Verdict::Ready { .. }
        ));
        let server = issue_cert(&server_profile(), Some(&ca), t0()).unwrap();
        let Verdict::Ready {
            not_before,
            not_after,
            next_check,
        } = check(
            &server_profile(),
            Some(&server),
            Some(&ca.cert_pem),
            true,
            t0(),
        )
        else {
            panic!("not ready")
        };
        assert_eq!(not_before, t0() - BACKDATE, "backdated 5 minutes");
        assert_eq!(not_after, t0() + 100 * HOUR);
        // 80 % of the 100 h after the issue time (notBefore is backdated).
        assert_eq!(next_check, t0() + 80 * HOUR);
        assert!(matches!(
            check(&server_profile(), Some(&server), Some(&ca.cert_pem), true, next_check),
            Verdict::Reissue(r) if r.starts_with("renewal due")
        ));
        assert!(matches!(
            check(
                &server_profile(),
                Some(&server),
                Some(&ca.cert_pem),
                true,
                next_check - Duration::from_secs(1)
            ),
            Verdict::Ready { .. }
        ));
    }

    #[test]
    fn upstream_worked_examples_of_renewal() {
        // A certificate issued at 00:00:00 valid for 100 s (operator-design.md §4.2); the
        // backdated notBefore does not shift the renewal time.
        let p = Profile {
            validity: Duration::from_secs(100),
            ..server_profile()
        };
        let ca = issue_cert(&ca_profile(), None, t0()).unwrap();
        let cert = issue_cert(&p, Some(&ca), t0()).unwrap();
        let signer = Some(ca.cert_pem.as_str());
        let not_after = t0() + Duration::from_secs(100);
        let renew_at = t0() + Duration::from_secs(80);
        assert_eq!(
            check(&p, Some(&cert), signer, true, t0()),
            Verdict::Ready {
                not_before: t0() - BACKDATE,
                not_after,
                next_check: renew_at
            }
        );
        // Renewal off: ready until expiry, checked again one second after it.
        assert_eq!(
            check(&p, Some(&cert), signer, false, renew_at),
            Verdict::Ready {
                not_before: t0() - BACKDATE,
                not_after,
                next_check: not_after + Duration::from_secs(1)
            }
        );
        assert_eq!(
            check(&p, Some(&cert), signer, false, not_after),
            Verdict::Expired {
                not_before: t0() - BACKDATE,
                not_after
            }
        );
        assert!(matches!(
            check(&p, Some(&cert), signer, true, not_after + Duration::from_secs(20)),
            Verdict::Reissue(r) if r.starts_with("outside its validity")
        ));
        // 00:01:00, renewal on: ready, looked at again in 20 s; 00:01:21: re-issued.
        let at = |s: u64| t0() + Duration::from_secs(s);
        assert!(matches!(
            check(&p, Some(&cert), signer, true, at(60)),
            Verdict::Ready { next_check, .. } if requeue_after(next_check, at(60)) == Duration::from_secs(20)
        ));
        assert!(matches!(
            check(&p, Some(&cert), signer, true, at(81)),
            Verdict::Reissue(r) if r.starts_with("renewal due")
        ));
        // Even a 10 s certificate (upstream's envtest renewal case) is renewed at 8 s.
        let short = Profile {
            validity: Duration::from_secs(10),
            ..p.clone()
        };
        let cert = issue_cert(&short, Some(&ca), t0()).unwrap();
        assert!(matches!(
            check(&short, Some(&cert), signer, true, t0()),
            Verdict::Ready { next_check, .. } if next_check == at(8)
        ));
    }

    #[test]
    fn everything_that_is_not_what_the_spec_asks_for_is_reissued() {
        let ca = issue_cert(&ca_profile(), None, t0()).unwrap();
        let other_ca = issue_cert(&ca_profile(), None, t0()).unwrap();
        let server = issue_cert(&server_profile(), Some(&ca), t0()).unwrap();
        let signer = Some(ca.cert_pem.as_str());
        let reissue =
            |p: &Profile, c: Option<&CertKeyPem>, s: Option<&str>| match check(p, c, s, true, t0())
            {
                Verdict::Reissue(reason) => reason,
                other => panic!("not re-issued: {other:?}"),
            };
        assert_eq!(
            reissue(&server_profile(), None, signer),
            "no certificate yet"
        );
        let garbage = CertKeyPem {
            cert_pem: "garbage".into(),
            key_pem: server.key_pem.clone(),
        };
        assert!(reissue(&server_profile(), Some(&garbage), signer).contains("tls.crt"));
        let wrong_key = CertKeyPem {
            cert_pem: server.cert_pem.clone(),
            key_pem: ca.key_pem.clone(),
        };
        assert!(reissue(&server_profile(), Some(&wrong_key), signer).contains("not the key"));
        let cases: Vec<(Profile, &str)> = vec![
            (
                Profile {
                    common_name: "other".into(),
                    ..server_profile()
                },
                "common name",
            ),
            (
                Profile {
                    hosts: vec!["marin3r-instance".into()],
                    ..server_profile()
                },
                "SANs",
            ),
            (
                Profile {
                    usage: Usage::Client,
                    ..server_profile()
                },
                "clientAuth",
            ),
            (
                Profile {
                    usage: Usage::Ca,
                    ..server_profile()
                },
                "CA",
            ),
            (
                Profile {
                    validity: 200 * HOUR,
                    ..server_profile()
                },
                "lifetime",
            ),
        ];
        for (profile, reason) in cases {
            let got = reissue(&profile, Some(&server), signer);
            assert!(got.contains(reason), "{reason}: {got}");
        }
        // Signed by another CA (the CA was replaced): re-issued with the current one.
        assert_eq!(
            reissue(&server_profile(), Some(&server), Some(&other_ca.cert_pem)),
            "not signed by the current CA"
        );
        // A CA that is not self-signed.
        let mut leaf_as_ca = ca_profile();
        leaf_as_ca.common_name = "marin3r-server-instance".into();
        assert!(
            reissue(&ca_profile(), Some(&server), None).contains("common name"),
            "{leaf_as_ca:?}"
        );
    }

    #[test]
    fn client_certificates_carry_client_auth_and_rsa_profiles_get_rsa_keys() {
        let ca = issue_cert(&ca_profile(), None, t0()).unwrap();
        let client = Profile {
            common_name: "envoy-sidecar-client-cert".into(),
            hosts: vec!["envoy-sidecar-client-cert".into()],
            usage: Usage::Client,
            validity: 48 * HOUR,
            key_type: KeyType::EcdsaP256,
        };
        let cert = issue_cert(&client, Some(&ca), t0()).unwrap();
        assert!(matches!(
            check(&client, Some(&cert), Some(&ca.cert_pem), true, t0()),
            Verdict::Ready { .. }
        ));
        let rsa = Profile {
            key_type: KeyType::Rsa2048,
            ..client.clone()
        };
        assert!(matches!(
            check(&rsa, Some(&cert), Some(&ca.cert_pem), true, t0()),
            Verdict::Reissue(r) if r.contains("rsa")
        ));
        let cert = issue_cert(&rsa, Some(&ca), t0()).unwrap();
        assert!(matches!(
            check(&rsa, Some(&cert), Some(&ca.cert_pem), true, t0()),
            Verdict::Ready { .. }
        ));
    }

    #[test]
    fn validity_reads_the_window_of_a_pem_certificate() {
        let ca = issue_cert(&ca_profile(), None, t0()).unwrap();
        assert_eq!(
            validity(&ca.cert_pem),
            Ok((t0() - BACKDATE, t0() + 1000 * HOUR))
        );
        assert!(validity("garbage").is_err());
        assert!(validity(&ca.key_pem).is_err());
    }

    #[test]
    fn requeues_are_clamped_between_a_second_and_an_hour() {
        assert_eq!(requeue_after(t0() + 1000 * HOUR, t0()), MAX_CHECK_INTERVAL);
        assert_eq!(
            requeue_after(t0() + Duration::from_secs(8), t0()),
            Duration::from_secs(8)
        );
        assert_eq!(requeue_after(t0() - HOUR, t0()), MIN_CHECK_INTERVAL);
    }

    #[test]
    fn the_trust_bundle_keeps_retired_cas_during_their_overlap() {
        let old = issue_cert(&ca_profile(), None, t0()).unwrap();
        let new = issue_cert(&ca_profile(), None, t0()).unwrap();
        let retired = [RetiredCa {
            cert_pem: old.cert_pem.clone(),
            until: t0() + 48 * HOUR,
        }];
        let bundle = trust_bundle(&new.cert_pem, &retired, t0());
        assert!(bundle.starts_with(new.cert_pem.trim_end()));
        assert!(bundle.contains(old.cert_pem.trim_end()));
        assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2);
        let after = trust_bundle(&new.cert_pem, &retired, t0() + 48 * HOUR);
        assert_eq!(after, format!("{}\n", new.cert_pem.trim_end()));
        assert_eq!(overlap(48 * HOUR, Duration::from_secs(60)), 48 * HOUR);
        assert_eq!(
            overlap(Duration::from_secs(10), Duration::from_secs(60)),
            Duration::from_secs(120)
        );
    }
}
