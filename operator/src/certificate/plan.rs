//! The pure core of the DiscoveryServiceCertificate controller: [`plan`] and the Secret
//! format (see the module docs of [`super`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::ResourceExt as _;
use marin3r_certs::lifecycle::{self, Profile, RetiredCa, Usage, Verdict};
use marin3r_certs::{CertKeyPem, KeyType};
use marin3r_operator_api::conditions::{READY, REASON_INVALID_SPEC};
use marin3r_operator_api::discoveryservicecertificate::{
    DiscoveryServiceCertificate, DiscoveryServiceCertificateStatus, Issuer,
};

use crate::objects::owner_reference;

/// Type of every certificate Secret.
pub const SECRET_TYPE: &str = "kubernetes.io/tls";
use marin3r_wire::secret_keys::CA_CRT;
use marin3r_wire::secret_keys::TLS_CRT;
use marin3r_wire::secret_keys::TLS_KEY;
/// CA Secrets during a rotation: the replaced CA certificate(s), PEM.
pub const RETIRED_CA_CRT: &str = "retired-ca.crt";
/// How long after a CA rotation the leaves it signed keep their old-CA certificates
/// (with the new bundle as `ca.crt`), so that every peer has the bundle before any
/// certificate of the new CA is presented: two kubelet syncs.
pub const PROPAGATION: Duration = Duration::from_secs(2 * 60);
/// The kubelet's Secret volume sync period the overlap allows for (twice).
pub const KUBELET_SYNC: Duration = Duration::from_secs(60);
/// How soon a DSC waiting for its signer's Secret looks again.
pub const SIGNER_RETRY: Duration = Duration::from_secs(10);

/// Condition reason: the certificate in the Secret is valid.
pub const REASON_CERTIFICATE_VALID: &str = "CertificateValid";
/// Condition reason: the CA Secret is missing or unusable.
pub const REASON_SIGNER_NOT_READY: &str = "SignerNotReady";
/// Condition reason: `caSecretRef.namespace` is not the DSC's namespace.
pub const REASON_CROSS_NAMESPACE_SIGNER: &str = "CrossNamespaceSigner";
/// Condition reason: the certificate expired and renewal is off.
pub const REASON_EXPIRED: &str = "Expired";
/// Condition reason: the certificate cannot be issued from this spec.
pub const REASON_ISSUE_FAILED: &str = "IssueFailed";

/// What one pass over a DSC does.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The Secret to apply (server-side apply), if it must change.
    pub secret: Option<Secret>,
    /// The status the DSC must have (written when it differs).
    pub status: DiscoveryServiceCertificateStatus,
    /// When to look again; `None`: when the DSC or its Secret changes.
    pub requeue: Option<Duration>,
    /// Why a new certificate was issued this pass (for the log).
    pub reissued: Option<String>,
}

/// The certificate profile of a DSC's spec: CN, hosts (default `[CN]`), usage (`isCA` →
/// CA, `server` → server, else client), `validFor` seconds, ECDSA P-256. `None` when
/// `validFor` is not positive.
pub fn profile(dsc: &DiscoveryServiceCertificate) -> Option<Profile> {
    let spec = &dsc.spec;
    let secs = u64::try_from(spec.valid_for).ok().filter(|s| *s > 0)?;
    Some(Profile {
        common_name: spec.common_name.clone(),
        hosts: spec.hosts(),
        usage: if spec.is_ca() {
            Usage::Ca
        } else if spec.is_server() {
            Usage::Server
        } else {
            Usage::Client
        },
        validity: Duration::from_secs(secs),
        key_type: KeyType::EcdsaP256,
    })
}

/// The name of the CA Secret to read for `dsc` in `namespace`: `Some` for a CA-signed
/// DSC whose signer is in its own namespace, `None` otherwise (self-signed, refused).
pub fn signer_secret_name<'a>(
    dsc: &'a DiscoveryServiceCertificate,
    namespace: &str,
) -> Option<&'a str> {
    let ca = dsc.spec.signer.ca_signed.as_ref()?;
    let ns = marin3r_wire::namespace_or(ca.ca_secret_ref.namespace.as_deref(), namespace);
    let name = ca.ca_secret_ref.name.as_deref().unwrap_or_default();
    (dsc.spec.signer.self_signed.is_none() && ns == namespace && !name.is_empty()).then_some(name)
}

/// One pass over `dsc` in `namespace` at `now` (see the module docs): `current_secret`
/// is its Secret, `signer_secret` the CA Secret of a CA-signed DSC, and
/// `signed_by_this_ca` the `validFor` of every DSC this one signs (for a CA: the length
/// of the overlap when it rotates).
pub fn plan(
    dsc: &DiscoveryServiceCertificate,
    namespace: &str,
    current_secret: Option<&Secret>,
    signer_secret: Option<&Secret>,
    signed_by_this_ca: &[i64],
    now: SystemTime,
) -> Plan {
    plan_recovering(
        dsc,
        namespace,
        current_secret,
        signer_secret,
        signed_by_this_ca,
        &[],
        now,
    )
}

/// Whether a CA's own Secret is gone or its `tls.crt` unreadable: the CA it held can
/// then only be recovered from the `ca.crt` of the Secrets it signed
/// ([`trusted_cas`], [`plan_recovering`]).
pub fn needs_recovery(current_secret: Option<&Secret>) -> bool {
    current_secret
        .and_then(|s| text(s, TLS_CRT))
        .is_none_or(|pem| lifecycle::validity(&pem).is_err())
}

/// The distinct certificates in the `ca.crt` of `secrets` (the Secrets a CA signed).
pub fn trusted_cas<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for pem in secrets.into_iter().filter_map(|s| text(s, CA_CRT)) {
        for cert in split_certificates(&pem) {
            if !found.contains(&cert) {
                found.push(cert);
            }
        }
    }
    found
}

/// [`plan`] for a CA whose Secret was deleted or damaged ([`needs_recovery`]):
/// `recovered` are the CA certificates its leaves still trust ([`trusted_cas`]). When
/// the CA is re-issued, those still valid are retired like a replaced CA, so the
/// rotation keeps its bundle and propagation phases instead of cutting every peer off.
pub fn plan_recovering(
    dsc: &DiscoveryServiceCertificate,
    namespace: &str,
    current_secret: Option<&Secret>,
    signer_secret: Option<&Secret>,
    signed_by_this_ca: &[i64],
    recovered: &[String],
    now: SystemTime,
) -> Plan {
    let ready = || -> Result<Plan, NotReady> {
        let profile = checked_profile(dsc)?;
        let signer = signer(dsc, namespace, signer_secret)?;
        let current = current_secret.and_then(key_pair);
        let cert = certificate(dsc, &profile, signer.as_ref(), current.as_ref(), now)?;
        let trust = match (&profile.usage, &signer) {
            (Usage::Ca, _) => ca_trust(&cert, current_secret, signed_by_this_ca, recovered, now),
            (_, Some((secret, pair))) => signed_trust(secret, pair, now),
            (_, None) => Trust {
                retired: None,
                ca_crt: with_newline(&cert.pair.cert_pem),
                wake: None,
            },
        };
        Ok(ready_plan(dsc, namespace, current_secret, cert, trust, now))
    };
    ready().unwrap_or_else(|not_ready| not_ready.into_plan(dsc, now))
}

/// Why a pass ends without a valid certificate: the `Ready=False` condition it reports.
struct NotReady {
    reason: &'static str,
    message: String,
    /// When to look again (`None`: when the DSC or a Secret changes).
    requeue: Option<Duration>,
    /// The validity of an expired certificate, kept in the status.
    expired: Option<(SystemTime, SystemTime)>,
}

impl NotReady {
    fn new(reason: &'static str, message: impl Into<String>, requeue: Option<Duration>) -> Self {
        Self {
            reason,
            message: message.into(),
            requeue,
            expired: None,
        }
    }

    /// The plan: no Secret change, the previous status with `ready: false` and the
    /// condition.
    fn into_plan(self, dsc: &DiscoveryServiceCertificate, now: SystemTime) -> Plan {
        let previous = dsc.status.clone().unwrap_or_default();
        let generation = dsc.metadata.generation;
        let mut status = DiscoveryServiceCertificateStatus {
            ready: Some(false),
            conditions: vec![condition(
                &previous,
                false,
                self.reason,
                self.message,
                generation,
                now,
            )],
            ..previous.clone()
        };
        if let Some((not_before, not_after)) = self.expired {
            status.not_before = Some(time(not_before));
            status.not_after = Some(time(not_after));
        }
        Plan {
            secret: None,
            status,
            requeue: self.requeue,
            reissued: None,
        }
    }
}

/// The profile of a spec that validates, with a positive `validFor`.
fn checked_profile(dsc: &DiscoveryServiceCertificate) -> Result<Profile, NotReady> {
    dsc.spec
        .validate()
        .map_err(|e| NotReady::new(REASON_INVALID_SPEC, e.to_string(), None))?;
    profile(dsc)
        .ok_or_else(|| NotReady::new(REASON_INVALID_SPEC, "spec.validFor must be positive", None))
}

/// The signer: `None` when self-signed, else the CA Secret and its certificate and key.
/// A signer in another namespace is refused; a missing or incomplete CA Secret is waited
/// for.
fn signer<'s>(
    dsc: &DiscoveryServiceCertificate,
    namespace: &str,
    signer_secret: Option<&'s Secret>,
) -> Result<Option<(&'s Secret, CertKeyPem)>, NotReady> {
    match dsc.spec.issuer(namespace) {
        None => Err(NotReady::new(
            REASON_INVALID_SPEC,
            "spec.signer: exactly one of 'selfSigned' or 'caSigned' must be set",
            None,
        )),
        Some(Issuer::SelfSigned) => Ok(None),
        Some(Issuer::CaSigned {
            name,
            namespace: ns,
        }) if ns != namespace => Err(NotReady::new(
            REASON_CROSS_NAMESPACE_SIGNER,
            format!(
                "the CA Secret {ns}/{name} is in another namespace; only CA Secrets in \
                 {namespace} can sign its certificates"
            ),
            None,
        )),
        Some(Issuer::CaSigned { name, .. }) => match signer_secret {
            None => Err(NotReady::new(
                REASON_SIGNER_NOT_READY,
                format!("waiting for the CA Secret {namespace}/{name}"),
                Some(SIGNER_RETRY),
            )),
            Some(secret) => match key_pair(secret) {
                Some(pair) => Ok(Some((secret, pair))),
                None => Err(NotReady::new(
                    REASON_SIGNER_NOT_READY,
                    format!("the CA Secret {namespace}/{name} has no {TLS_CRT} and {TLS_KEY}"),
                    Some(SIGNER_RETRY),
                )),
            },
        },
    }
}

/// The `tls.crt` and `tls.key` of a Secret, when it has both.
fn key_pair(secret: &Secret) -> Option<CertKeyPem> {
    Some(CertKeyPem {
        cert_pem: text(secret, TLS_CRT)?,
        key_pem: text(secret, TLS_KEY)?,
    })
}

/// The certificate the Secret is to hold and its validity.
struct Certificate {
    pair: CertKeyPem,
    not_before: SystemTime,
    not_after: SystemTime,
    /// When to check it again.
    next_check: SystemTime,
    /// Why it was issued this pass (`None`: the current one is kept).
    reissued: Option<String>,
    /// Until when a leaf of a rotating CA is held on the retired CA.
    hold_until: Option<SystemTime>,
}

/// The current certificate while it checks (against the retired CA too during a CA
/// rotation's propagation phase), else a new one; an expired one with renewal off is
/// reported, not replaced.
fn certificate(
    dsc: &DiscoveryServiceCertificate,
    profile: &Profile,
    signer: Option<&(&Secret, CertKeyPem)>,
    current: Option<&CertKeyPem>,
    now: SystemTime,
) -> Result<Certificate, NotReady> {
    let renewal = dsc.spec.renewal_enabled();
    let signer_cert = signer.map(|(_, pair)| pair.cert_pem.as_str());
    let verdict = lifecycle::check(profile, current, signer_cert, renewal, now);
    let (verdict, hold_until) =
        held_for_propagation(verdict, profile, signer, current, renewal, now);
    match verdict {
        Verdict::Ready {
            not_before,
            not_after,
            next_check,
        } => match current {
            Some(pair) => Ok(Certificate {
                pair: pair.clone(),
                not_before,
                not_after,
                next_check,
                reissued: None,
                hold_until,
            }),
            None => Err(NotReady::new(REASON_ISSUE_FAILED, "no certificate", None)),
        },
        Verdict::Expired {
            not_before,
            not_after,
        } => Err(NotReady {
            expired: Some((not_before, not_after)),
            ..NotReady::new(
                REASON_EXPIRED,
                format!(
                    "the certificate expired at {} and renewal is disabled",
                    marin3r_kube::time::rfc3339(not_after)
                ),
                None,
            )
        }),
        Verdict::Reissue(reason) => Ok(Certificate {
            reissued: Some(reason),
            hold_until,
            ..reissue(profile, signer, renewal, now)?
        }),
    }
}

/// The propagation phase of a CA rotation: a leaf that would be re-issued but still
/// checks against the retired CA is kept (with the new bundle as `ca.crt`) until every
/// peer has the bundle. The verdict to act on and, when held, until when.
fn held_for_propagation(
    verdict: Verdict,
    profile: &Profile,
    signer: Option<&(&Secret, CertKeyPem)>,
    current: Option<&CertKeyPem>,
    renewal: bool,
    now: SystemTime,
) -> (Verdict, Option<SystemTime>) {
    if let (Verdict::Reissue(_), Some((signer_secret, _)), Some(cur)) = (&verdict, signer, current)
        && let Some(retired) = live_retired(Some(signer_secret), now)
        && let Some(switch_at) = retired.since.checked_add(PROPAGATION)
        && now < switch_at
    {
        for old_ca in split_certificates(&retired.ca.cert_pem) {
            let old = lifecycle::check(profile, Some(cur), Some(&old_ca), renewal, now);
            if matches!(old, Verdict::Ready { .. }) {
                return (old, Some(switch_at));
            }
        }
    }
    (verdict, None)
}

/// A new certificate and key for `profile`, checked like the current one would be.
fn reissue(
    profile: &Profile,
    signer: Option<&(&Secret, CertKeyPem)>,
    renewal: bool,
    now: SystemTime,
) -> Result<Certificate, NotReady> {
    let issued = lifecycle::issue_cert(profile, signer.map(|(_, pair)| pair), now)
        .map_err(|e| issue_failure(&e))?;
    let signer_cert = signer.map(|(_, pair)| pair.cert_pem.as_str());
    match lifecycle::check(profile, Some(&issued), signer_cert, renewal, now) {
        Verdict::Ready {
            not_before,
            not_after,
            next_check,
        } => Ok(Certificate {
            pair: issued,
            not_before,
            not_after,
            next_check,
            reissued: None,
            hold_until: None,
        }),
        other => Err(NotReady::new(
            REASON_ISSUE_FAILED,
            format!("the issued certificate does not check: {other:?}"),
            Some(SIGNER_RETRY),
        )),
    }
}

/// Why issuing failed: an unusable CA Secret is waited for, anything else reported.
fn issue_failure(e: &marin3r_certs::CertsError) -> NotReady {
    let message = marin3r_wire::error_chain(e);
    match e {
        marin3r_certs::CertsError::Generate { what, .. } if what.contains("signer") => {
            NotReady::new(
                REASON_SIGNER_NOT_READY,
                format!("the CA Secret is unusable: {message}"),
                Some(SIGNER_RETRY),
            )
        }
        _ => NotReady::new(REASON_ISSUE_FAILED, message, None),
    }
}

/// What the Secret's peers trust: its `ca.crt`, the retired CAs it carries (a CA's) and
/// when that trust next changes.
struct Trust {
    retired: Option<Retired>,
    ca_crt: String,
    wake: Option<SystemTime>,
}

/// A CA's trust: the retired CAs it keeps (on a re-issue, the ones it replaces) and the
/// bundle of its certificate and those.
fn ca_trust(
    cert: &Certificate,
    current_secret: Option<&Secret>,
    signed_by_this_ca: &[i64],
    recovered: &[String],
    now: SystemTime,
) -> Trust {
    let mut retired = live_retired(current_secret, now);
    if cert.reissued.is_some() {
        retired = retire_replaced(
            &cert.pair,
            current_secret,
            retired.as_ref(),
            signed_by_this_ca,
            recovered,
            now,
        );
    }
    let ca_crt = lifecycle::trust_bundle(
        &cert.pair.cert_pem,
        retired
            .as_ref()
            .map(|r| std::slice::from_ref(&r.ca))
            .unwrap_or_default(),
        now,
    );
    Trust {
        wake: retired.as_ref().map(|r| r.ca.until),
        retired,
        ca_crt,
    }
}

/// What a re-issued CA retires: the CA(s) it replaces (its previous certificate, or the
/// ones `recovered` from its leaves) and those it already kept, still valid and not the
/// new one, trusted from `now` until the leaves switched and the overlap passed.
fn retire_replaced(
    new: &CertKeyPem,
    current_secret: Option<&Secret>,
    kept: Option<&Retired>,
    signed_by_this_ca: &[i64],
    recovered: &[String],
    now: SystemTime,
) -> Option<Retired> {
    let mut olds: Vec<String> = Vec::new();
    if needs_recovery(current_secret) {
        olds.extend(recovered.iter().cloned());
    } else {
        olds.extend(current_secret.and_then(|s| text(s, TLS_CRT)));
    }
    if let Some(r) = kept {
        olds.extend(split_certificates(&r.ca.cert_pem));
    }
    let pem = still_valid_others(new, olds, now);
    (!pem.is_empty()).then_some(Retired {
        ca: RetiredCa {
            cert_pem: pem,
            until: retired_until(signed_by_this_ca, now),
        },
        since: now,
    })
}

/// Until when a CA replaced at `now` stays trusted: the leaves switch to the new CA after
/// the propagation phase; from then on the old CA stays trusted for the overlap of the
/// longest-lived certificate it signs.
fn retired_until(signed_by_this_ca: &[i64], now: SystemTime) -> SystemTime {
    let longest = signed_by_this_ca
        .iter()
        .filter_map(|s| u64::try_from(*s).ok())
        .max()
        .unwrap_or(0);
    now + PROPAGATION + lifecycle::overlap(Duration::from_secs(longest), KUBELET_SYNC)
}

/// The PEM of the certificates of `olds` still valid after `now`, each once and none
/// the `new` one.
fn still_valid_others(new: &CertKeyPem, olds: Vec<String>, now: SystemTime) -> String {
    let mut pem = String::new();
    let mut seen = vec![new.cert_pem.trim().to_string()];
    for old in olds {
        let usable = lifecycle::validity(&old).is_ok_and(|(_, end)| end > now);
        if usable && !seen.contains(&old.trim().to_string()) {
            seen.push(old.trim().to_string());
            pem.push_str(&with_newline(&old));
        }
    }
    pem
}

/// A CA-signed certificate's trust: during its CA's rotation the new CA and the retired
/// ones, after it the new CA alone, else the CA Secret's `ca.crt` (or its certificate).
fn signed_trust(secret: &Secret, pair: &CertKeyPem, now: SystemTime) -> Trust {
    let (ca_crt, wake) = match live_retired(Some(secret), now) {
        Some(r) => {
            let until = r.ca.until;
            (
                lifecycle::trust_bundle(&pair.cert_pem, &[r.ca], now),
                Some(until),
            )
        }
        None if retired_annotation(secret).is_some() => {
            (lifecycle::trust_bundle(&pair.cert_pem, &[], now), None)
        }
        None => (
            text(secret, CA_CRT)
                .filter(|c| !c.trim().is_empty())
                .unwrap_or_else(|| pair.cert_pem.clone()),
            None,
        ),
    };
    Trust {
        retired: None,
        ca_crt,
        wake,
    }
}

/// The plan of a valid certificate: its Secret (applied when it must change), a ready
/// status, and a requeue at the next check, hold or retirement.
fn ready_plan(
    dsc: &DiscoveryServiceCertificate,
    namespace: &str,
    current_secret: Option<&Secret>,
    cert: Certificate,
    trust: Trust,
    now: SystemTime,
) -> Plan {
    let desired = secret(
        dsc,
        namespace,
        &cert.pair,
        &trust.ca_crt,
        trust.retired.as_ref(),
        secret_type(current_secret),
    );
    let apply = cert.reissued.is_some() || !up_to_date(current_secret, &desired);
    let wake = [Some(cert.next_check), cert.hold_until, trust.wake];
    Plan {
        secret: apply.then_some(desired),
        status: ready_status(dsc, &cert, now),
        requeue: Some(requeue(wake.into_iter().flatten(), now)),
        reissued: cert.reissued,
    }
}

/// A Secret's type is immutable: one that exists with another type (made by hand) keeps
/// it rather than failing every apply.
fn secret_type(current_secret: Option<&Secret>) -> &str {
    current_secret
        .and_then(|s| s.type_.as_deref())
        .filter(|t| !t.is_empty())
        .unwrap_or(SECRET_TYPE)
}

/// How soon the first of `wake` after `now` comes (at least the minimum check interval
/// when none does).
fn requeue(wake: impl IntoIterator<Item = SystemTime>, now: SystemTime) -> Duration {
    wake.into_iter()
        .filter(|t| *t > now)
        .min()
        .map(|t| lifecycle::requeue_after(t, now))
        .unwrap_or(lifecycle::MIN_CHECK_INTERVAL)
}

/// The status of a DSC whose Secret holds `cert`.
fn ready_status(
    dsc: &DiscoveryServiceCertificate,
    cert: &Certificate,
    now: SystemTime,
) -> DiscoveryServiceCertificateStatus {
    let previous = dsc.status.clone().unwrap_or_default();
    let message = format!(
        "valid from {} until {}",
        marin3r_kube::time::rfc3339(cert.not_before),
        marin3r_kube::time::rfc3339(cert.not_after)
    );
    DiscoveryServiceCertificateStatus {
        ready: Some(true),
        not_before: Some(time(cert.not_before)),
        not_after: Some(time(cert.not_after)),
        certificate_hash: Some(certificate_hash(&cert.pair.cert_pem)),
        conditions: vec![condition(
            &previous,
            true,
            REASON_CERTIFICATE_VALID,
            message,
            dsc.metadata.generation,
            now,
        )],
    }
}

/// `certificateHash`: FNV-1a 64 of the PEM certificate, 16 hex digits.
pub fn certificate_hash(cert_pem: &str) -> String {
    marin3r_envoyconfig::resource::version_string(marin3r_envoyconfig::resource::fnv1a64(
        cert_pem.as_bytes(),
    ))
}

/// The Secret of `dsc` holding `cert`, with `ca_crt` and, for a rotating CA, `retired`.
fn secret(
    dsc: &DiscoveryServiceCertificate,
    namespace: &str,
    cert: &CertKeyPem,
    ca_crt: &str,
    retired: Option<&Retired>,
    type_: &str,
) -> Secret {
    let mut labels: BTreeMap<String, String> = dsc.labels().clone();
    labels.insert(
        marin3r_wire::app_labels::MANAGED_BY.to_string(),
        marin3r_wire::app_labels::OPERATOR.to_string(),
    );
    let mut data = BTreeMap::from([
        (TLS_CRT.to_string(), bytes(&cert.cert_pem)),
        (TLS_KEY.to_string(), bytes(&cert.key_pem)),
        (CA_CRT.to_string(), bytes(ca_crt)),
    ]);
    let annotations = retired.map(|r| {
        data.insert(RETIRED_CA_CRT.to_string(), bytes(&r.ca.cert_pem));
        BTreeMap::from([
            (
                marin3r_wire::RETIRED_CA_UNTIL_ANNOTATION.to_string(),
                marin3r_kube::time::rfc3339(r.ca.until),
            ),
            (
                marin3r_wire::RETIRED_CA_SINCE_ANNOTATION.to_string(),
                marin3r_kube::time::rfc3339(r.since),
            ),
        ])
    });
    Secret {
        metadata: ObjectMeta {
            name: Some(dsc.spec.secret_name().to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations,
            owner_references: owner_reference(dsc).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some(type_.to_string()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The retired CAs of a CA Secret: the certificates, until when they are trusted, and
/// since when (the rotation).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Retired {
    ca: RetiredCa,
    since: SystemTime,
}

/// Every PEM certificate block of `pem`.
fn split_certificates(pem: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    pem.split_inclusive(END)
        .filter(|block| block.contains(END))
        .map(|block| format!("{}\n", block.trim()))
        .collect()
}

/// Whether `current` already is `desired` in everything the operator writes.
fn up_to_date(current: Option<&Secret>, desired: &Secret) -> bool {
    let Some(current) = current else {
        return false;
    };
    let empty = BTreeMap::new();
    let have = current.data.as_ref().unwrap_or(&empty);
    let want = desired.data.as_ref().unwrap_or(&empty);
    let data_ok = want.iter().all(|(k, v)| have.get(k) == Some(v))
        && (want.contains_key(RETIRED_CA_CRT) || !have.contains_key(RETIRED_CA_CRT));
    let labels_ok = desired
        .labels()
        .iter()
        .all(|(k, v)| current.labels().get(k) == Some(v));
    let annotation_ok = [
        marin3r_wire::RETIRED_CA_UNTIL_ANNOTATION,
        marin3r_wire::RETIRED_CA_SINCE_ANNOTATION,
    ]
    .iter()
    .all(|a| current.annotations().get(*a) == desired.annotations().get(*a));
    let owner_ok = desired.owner_references().iter().all(|want| {
        current
            .owner_references()
            .iter()
            .any(|o| o.uid == want.uid && o.controller == Some(true))
    });
    let type_ok = current.type_ == desired.type_;
    data_ok && labels_ok && annotation_ok && owner_ok && type_ok
}

fn retired_annotation(secret: &Secret) -> Option<&String> {
    secret
        .annotations()
        .get(marin3r_wire::RETIRED_CA_UNTIL_ANNOTATION)
}

/// The retired CAs of a CA Secret still trusted at `now`.
fn live_retired(secret: Option<&Secret>, now: SystemTime) -> Option<Retired> {
    let secret = secret?;
    let at = |annotation: &str| {
        let t: k8s_openapi::jiff::Timestamp = secret.annotations().get(annotation)?.parse().ok()?;
        Some(SystemTime::from(t))
    };
    let until = at(marin3r_wire::RETIRED_CA_UNTIL_ANNOTATION)?;
    // Without it (written by hand): no propagation phase.
    let since = at(marin3r_wire::RETIRED_CA_SINCE_ANNOTATION).unwrap_or(SystemTime::UNIX_EPOCH);
    let cert_pem = text(secret, RETIRED_CA_CRT)?;
    (until > now && !cert_pem.trim().is_empty()).then_some(Retired {
        ca: RetiredCa { cert_pem, until },
        since,
    })
}

/// The data key `key` of `secret` as text (`None`: absent).
fn text(secret: &Secret, key: &str) -> Option<String> {
    let value = secret.data.as_ref()?.get(key)?;
    Some(String::from_utf8_lossy(&value.0).into_owned())
}

fn bytes(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

fn with_newline(pem: &str) -> String {
    let mut s = pem.trim_end().to_string();
    s.push('\n');
    s
}

fn time(t: SystemTime) -> Time {
    marin3r_kube::time::time(t)
}

/// The `Ready` condition, keeping the previous transition time when the status is
/// unchanged.
fn condition(
    previous: &DiscoveryServiceCertificateStatus,
    ready: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: SystemTime,
) -> Condition {
    marin3r_kube::conditions::condition(
        &previous.conditions,
        READY,
        ready,
        reason,
        message,
        generation,
        marin3r_kube::time::timestamp(now),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::certificate::fixtures::{NS, ca, dsc};
    use serde_json::json;

    const HOUR: Duration = Duration::from_secs(3600);

    fn t0() -> SystemTime {
        marin3r_testkit::unix_time(1_800_000_000)
    }

    fn leaf(name: &str, server: bool, valid_for: i64) -> DiscoveryServiceCertificate {
        dsc(
            name,
            NS,
            json!({"commonName": name, "server": server, "validFor": valid_for,
                   "hosts": [name, "localhost", "127.0.0.1"],
                   "signer": {"caSigned": {"caSecretRef": {"name": "marin3r-ca-cert-instance"}}},
                   "secretRef": {"name": name, "namespace": "ignored"}}),
        )
    }

    fn server() -> DiscoveryServiceCertificate {
        leaf("marin3r-server-cert-instance", true, 10 * 3600)
    }

    fn data<'a>(secret: &'a Secret, key: &str) -> &'a str {
        std::str::from_utf8(&secret.data.as_ref().unwrap()[key].0).unwrap()
    }

    fn pair(secret: &Secret) -> CertKeyPem {
        CertKeyPem {
            cert_pem: data(secret, TLS_CRT).to_string(),
            key_pem: data(secret, TLS_KEY).to_string(),
        }
    }

    fn certs_in(pem: &str) -> usize {
        pem.matches("BEGIN CERTIFICATE").count()
    }

    /// One pass, with the API server's side of it: the applied Secret and the written
    /// status become the current ones.
    fn pass(
        d: &mut DiscoveryServiceCertificate,
        current: &mut Option<Secret>,
        signer: Option<&Secret>,
        signed: &[i64],
        now: SystemTime,
    ) -> Plan {
        let plan = plan(d, NS, current.as_ref(), signer, signed, now);
        if let Some(s) = &plan.secret {
            *current = Some(s.clone());
        }
        d.status = Some(plan.status.clone());
        plan
    }

    fn ready(plan: &Plan) -> &Condition {
        let c = &plan.status.conditions[0];
        assert_eq!(c.type_, READY);
        c
    }

    fn not_ready_reason(plan: &Plan) -> &str {
        assert_eq!(plan.status.ready, Some(false), "{plan:?}");
        let c = ready(plan);
        assert_eq!(c.status, "False");
        &c.reason
    }

    /// The CA issued at `t0()`, and its Secret.
    fn issued_ca() -> (DiscoveryServiceCertificate, Secret) {
        let mut ca = ca();
        let mut secret = None;
        pass(&mut ca, &mut secret, None, &[10 * 3600], t0());
        (ca, secret.unwrap())
    }

    #[test]
    fn a_self_signed_ca_is_issued_into_a_tls_secret() {
        let mut ca = ca();
        let mut current = None;
        let plan = pass(&mut ca, &mut current, None, &[], t0());
        let secret = plan.secret.clone().expect("a Secret to apply");
        assert_eq!(plan.reissued.as_deref(), Some("no certificate yet"));
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("marin3r-ca-cert-instance")
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(
            secret.labels(),
            &BTreeMap::from([
                ("app.kubernetes.io/instance".into(), "instance".into()),
                (
                    "app.kubernetes.io/managed-by".into(),
                    "marin3r-operator".into()
                ),
            ])
        );
        let owner = &secret.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            (
                "DiscoveryServiceCertificate",
                "uid-marin3r-ca-cert-instance",
                Some(true)
            )
        );
        let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
        assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
        assert_eq!(data(&secret, CA_CRT), data(&secret, TLS_CRT));
        assert!(data(&secret, TLS_KEY).contains("PRIVATE KEY"));
        assert!(secret.annotations().is_empty());
        assert!(matches!(
            lifecycle::check(
                &profile(&ca).unwrap(),
                Some(&pair(&secret)),
                None,
                true,
                t0()
            ),
            Verdict::Ready { .. }
        ));

        let status = &plan.status;
        assert_eq!(status.ready, Some(true));
        assert_eq!(
            status.certificate_hash.as_deref(),
            Some(certificate_hash(data(&secret, TLS_CRT)).as_str())
        );
        assert_eq!(status.certificate_hash.as_ref().unwrap().len(), 16);
        let json = serde_json::to_value(status).unwrap();
        assert_eq!(
            json["notBefore"], "2027-01-15T07:55:00Z",
            "backdated 5 minutes"
        );
        assert_eq!(json["notAfter"], "2027-02-26T00:00:00Z", "1000 h");
        let c = ready(&plan);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "CertificateValid")
        );
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(
            c.message,
            "valid from 2027-01-15T07:55:00Z until 2027-02-26T00:00:00Z"
        );
        assert!(
            !json.to_string().contains("PRIVATE"),
            "no key material in the status"
        );
        assert_eq!(
            plan.requeue,
            Some(lifecycle::MAX_CHECK_INTERVAL),
            "clamped to 1 h"
        );

        // The next pass (and every one until renewal) changes nothing.
        let again = pass(&mut ca, &mut current, None, &[], t0() + 5 * HOUR);
        assert_eq!(again.secret, None);
        assert_eq!(again.reissued, None);
        assert_eq!(
            again.status, plan.status,
            "same status, same transition time"
        );
    }

    #[test]
    fn a_ca_signed_server_certificate_carries_the_ca_bundle() {
        let (_, ca_secret) = issued_ca();
        let mut server = server();
        let mut current = None;
        let plan = pass(&mut server, &mut current, Some(&ca_secret), &[], t0());
        let secret = plan.secret.clone().unwrap();
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("marin3r-server-cert-instance")
        );
        assert_eq!(
            secret.metadata.namespace.as_deref(),
            Some(NS),
            "secretRef.namespace ignored"
        );
        assert_eq!(data(&secret, CA_CRT), data(&ca_secret, CA_CRT));
        let issued = pair(&secret);
        assert!(matches!(
            lifecycle::check(
                &profile(&server).unwrap(),
                Some(&issued),
                Some(data(&ca_secret, TLS_CRT)),
                true,
                t0()
            ),
            Verdict::Ready { .. }
        ));
        assert_eq!(profile(&server).unwrap().usage, Usage::Server);
        assert_eq!(
            profile(&leaf("client", false, 60)).unwrap().usage,
            Usage::Client
        );
        assert_eq!(plan.status.ready, Some(true));
        // Checked again at its renewal time: 80 % of its 10 h after the issue.
        let renew_at = t0() + 8 * HOUR;
        assert_eq!(plan.requeue, Some(lifecycle::MAX_CHECK_INTERVAL));
        let late = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            renew_at - HOUR / 2,
        );
        assert_eq!(late.secret, None);
        assert_eq!(late.requeue, Some(HOUR / 2));
    }

    #[test]
    fn renewal_at_80_percent_of_the_lifetime() {
        let (_, ca_secret) = issued_ca();
        let mut server = server();
        let mut current = None;
        pass(&mut server, &mut current, Some(&ca_secret), &[], t0());
        let first = current.clone().unwrap();
        let renew_at = t0() + 8 * HOUR;
        let before = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            renew_at - Duration::from_secs(1),
        );
        assert_eq!(before.secret, None);
        assert_eq!(before.requeue, Some(Duration::from_secs(1)));
        let due = pass(&mut server, &mut current, Some(&ca_secret), &[], renew_at);
        assert!(due.reissued.as_deref().unwrap().starts_with("renewal due"));
        let renewed = due.secret.unwrap();
        assert_ne!(data(&renewed, TLS_CRT), data(&first, TLS_CRT));
        assert_ne!(data(&renewed, TLS_KEY), data(&first, TLS_KEY), "a new key");
        assert_ne!(
            due.status.certificate_hash,
            Some(certificate_hash(data(&first, TLS_CRT)))
        );
        assert_eq!(due.status.ready, Some(true));
    }

    // Upstream `TestCertificateReconciler_Reconcile` (operator-design.md §4.2) for a
    // certificate issued at 00:00:00, valid 100 s: every row is upstream's (the backdated
    // notBefore does not move the renewal time). Upstream re-issues and requeues before
    // writing a status; here the same pass writes the new certificate's status.
    #[test]
    fn upstream_worked_examples() {
        let (_, ca_secret) = issued_ca();
        let issue = |renewal: bool| {
            let mut d = leaf("short", true, 100);
            d.spec.certificate_renewal = Some(
                marin3r_operator_api::discoveryservicecertificate::CertificateRenewal {
                    enabled: renewal,
                },
            );
            let mut current = None;
            pass(&mut d, &mut current, Some(&ca_secret), &[], t0());
            (d, current)
        };
        let at = |s: u64| t0() + Duration::from_secs(s);
        // 00:01:00, renewal off: ready, look again in 41 s (expiry + 1 s).
        let (mut off, mut current) = issue(false);
        let p = pass(&mut off, &mut current, Some(&ca_secret), &[], at(60));
        assert_eq!(
            (p.status.ready, p.requeue, p.secret.is_none()),
            (Some(true), Some(Duration::from_secs(41)), true)
        );
        // 00:02:00, renewal off: not ready, nothing scheduled, nothing re-issued.
        let p = pass(&mut off, &mut current, Some(&ca_secret), &[], at(120));
        assert_eq!(not_ready_reason(&p), REASON_EXPIRED);
        assert_eq!((p.requeue, p.secret.is_none()), (None, true));
        assert!(p.status.not_after.is_some());
        // 00:02:00, renewal on: re-issued.
        let (mut on, mut current) = issue(true);
        let p = pass(&mut on, &mut current, Some(&ca_secret), &[], at(120));
        assert!(p.reissued.unwrap().starts_with("outside its validity"));
        // 00:01:00, renewal on: ready, looked at again in 20 s.
        let (mut on, mut current) = issue(true);
        let p = pass(&mut on, &mut current, Some(&ca_secret), &[], at(60));
        assert_eq!(
            (p.status.ready, p.requeue, p.secret.is_none()),
            (Some(true), Some(Duration::from_secs(20)), true)
        );
        // 00:01:21, renewal on: 19 s < 20 s left → re-issued.
        let p = pass(&mut on, &mut current, Some(&ca_secret), &[], at(81));
        assert!(p.reissued.unwrap().starts_with("renewal due"));
        assert_eq!(p.status.ready, Some(true));
    }

    #[test]
    fn garbage_and_foreign_keys_are_healed() {
        let (_, ca_secret) = issued_ca();
        let mut server = server();
        let mut current = None;
        pass(&mut server, &mut current, Some(&ca_secret), &[], t0());
        let good = current.clone().unwrap();

        let mut garbage = good.clone();
        garbage
            .data
            .as_mut()
            .unwrap()
            .insert(TLS_CRT.into(), bytes("garbage"));
        let mut current = Some(garbage);
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert!(
            p.reissued
                .unwrap()
                .contains("tls.crt is not a PEM certificate")
        );
        assert!(matches!(
            lifecycle::check(
                &profile(&server).unwrap(),
                Some(&pair(current.as_ref().unwrap())),
                Some(data(&ca_secret, TLS_CRT)),
                true,
                t0() + HOUR
            ),
            Verdict::Ready { .. }
        ));

        let mut foreign = good.clone();
        foreign.data.as_mut().unwrap().insert(
            TLS_KEY.into(),
            ca_secret.data.as_ref().unwrap()[TLS_KEY].clone(),
        );
        let mut current = Some(foreign);
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert!(p.reissued.unwrap().contains("not the key"));

        // A Secret with no tls.key at all (e.g. made by hand).
        let mut bare = good;
        bare.data.as_mut().unwrap().remove(TLS_KEY);
        let mut current = Some(bare);
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert_eq!(p.reissued.as_deref(), Some("no certificate yet"));
    }

    #[test]
    fn a_spec_change_reissues() {
        let (_, ca_secret) = issued_ca();
        let mut server = server();
        let mut current = None;
        pass(&mut server, &mut current, Some(&ca_secret), &[], t0());
        server.spec.hosts = Some(vec![
            "marin3r-instance".into(),
            "marin3r-instance.ns.svc".into(),
        ]);
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert!(p.reissued.unwrap().starts_with("SANs"));
        server.spec.valid_for = 20 * 3600;
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert!(p.reissued.unwrap().contains("lifetime"));
        server.spec.server = Some(false);
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert!(p.reissued.unwrap().contains("clientAuth"));
        let p = pass(
            &mut server,
            &mut current,
            Some(&ca_secret),
            &[],
            t0() + HOUR,
        );
        assert_eq!((p.reissued, p.secret), (None, None), "then stable");
    }

    #[test]
    fn ca_rotation_keeps_the_old_ca_trusted_for_the_overlap_then_drops_it() {
        let leaf_validity: i64 = 10 * 3600;
        let signed = [leaf_validity, 2 * 3600];
        let (mut ca, ca_secret) = issued_ca();
        let ca1 = data(&ca_secret, TLS_CRT).to_string();
        let mut ca_current = Some(ca_secret);
        let mut server = server();
        let mut server_current = None;
        pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            t0(),
        );
        assert_eq!(
            data(server_current.as_ref().unwrap(), CA_CRT).trim(),
            ca1.trim()
        );

        // The CA is re-issued (here: its spec changed).
        let t1 = t0() + HOUR;
        ca.spec.common_name = "marin3r-ca-instance-2".into();
        ca.spec.hosts = Some(vec!["marin3r-ca-instance-2".into()]);
        let p = pass(&mut ca, &mut ca_current, None, &signed, t1);
        assert!(p.reissued.is_some());
        let rotated = p.secret.unwrap();
        let ca2 = data(&rotated, TLS_CRT).to_string();
        assert_ne!(ca1, ca2);
        // Propagation, then overlap(max validFor of its leaves = 10 h, 2 × 60 s).
        let until = t1 + PROPAGATION + 10 * HOUR;
        assert_eq!(data(&rotated, RETIRED_CA_CRT).trim(), ca1.trim());
        assert_eq!(
            rotated.annotations(),
            &BTreeMap::from([
                (
                    marin3r_wire::RETIRED_CA_UNTIL_ANNOTATION.to_string(),
                    marin3r_kube::time::rfc3339(until)
                ),
                (
                    marin3r_wire::RETIRED_CA_SINCE_ANNOTATION.to_string(),
                    marin3r_kube::time::rfc3339(t1)
                ),
            ])
        );
        let bundle = data(&rotated, CA_CRT).to_string();
        assert_eq!(certs_in(&bundle), 2);
        assert!(bundle.starts_with(ca2.trim_end()), "the new CA first");
        assert!(bundle.contains(ca1.trim_end()), "the old CA still trusted");

        // Phase 1: the leaf keeps its old-CA certificate and gets the bundle at once.
        let old_leaf = server_current.clone().unwrap();
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            t1,
        );
        assert_eq!(p.reissued, None);
        let held = p.secret.expect("re-applied with the bundle");
        assert_eq!(data(&held, TLS_CRT), data(&old_leaf, TLS_CRT));
        assert_eq!(data(&held, TLS_KEY), data(&old_leaf, TLS_KEY));
        assert_eq!(data(&held, CA_CRT), bundle);
        assert_eq!(
            p.requeue,
            Some(PROPAGATION),
            "looks again when it must switch"
        );
        assert_eq!(p.status.ready, Some(true));
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            t1 + PROPAGATION - Duration::from_secs(1),
        );
        assert_eq!((p.secret, p.requeue), (None, Some(Duration::from_secs(1))));

        // Phase 2: not signed by the current CA → re-issued by the new one, with the bundle.
        let t1 = t1 + PROPAGATION;
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            t1,
        );
        assert_eq!(p.reissued.as_deref(), Some("not signed by the current CA"));
        let leaf_secret = p.secret.unwrap();
        assert_eq!(data(&leaf_secret, CA_CRT), bundle);
        assert!(matches!(
            lifecycle::check(
                &profile(&server).unwrap(),
                Some(&pair(&leaf_secret)),
                Some(&ca2),
                true,
                t1
            ),
            Verdict::Ready { .. }
        ));
        // It is renewed at 80 % of its lifetime, before the overlap ends: still the bundle.
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            t1 + 8 * HOUR,
        );
        assert!(p.reissued.unwrap().starts_with("renewal due"));
        assert_eq!(certs_in(data(server_current.as_ref().unwrap(), CA_CRT)), 2);
        let renewed = server_current.clone().unwrap();
        // Both look again when the overlap ends.
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            until - Duration::from_secs(30),
        );
        assert_eq!((p.secret, p.requeue), (None, Some(Duration::from_secs(30))));
        let p = pass(
            &mut ca,
            &mut ca_current,
            None,
            &signed,
            until - Duration::from_secs(30),
        );
        assert_eq!((p.secret, p.requeue), (None, Some(Duration::from_secs(30))));

        // The overlap ended; the leaf passes first (its CA Secret still lists the old
        // CA): the same certificate and key, with the new CA only.
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            until,
        );
        assert_eq!(p.reissued, None);
        let dropped = p.secret.expect("re-applied with the new ca.crt");
        assert_eq!(data(&dropped, TLS_CRT), data(&renewed, TLS_CRT));
        assert_eq!(data(&dropped, TLS_KEY), data(&renewed, TLS_KEY));
        assert_eq!(data(&dropped, CA_CRT).trim(), ca2.trim());
        // The CA drops it too: same certificate, no retired key, no annotation.
        let p = pass(&mut ca, &mut ca_current, None, &signed, until);
        assert_eq!(p.reissued, None);
        let ca_after = p.secret.unwrap();
        assert_eq!(data(&ca_after, TLS_CRT), ca2);
        assert_eq!(data(&ca_after, CA_CRT).trim(), ca2.trim());
        assert!(!ca_after.data.as_ref().unwrap().contains_key(RETIRED_CA_CRT));
        assert!(ca_after.annotations().is_empty());
        // And then everything is stable.
        let p = pass(
            &mut server,
            &mut server_current,
            ca_current.as_ref(),
            &signed,
            until + Duration::from_secs(1),
        );
        assert_eq!(p.secret, None);
        let p = pass(
            &mut ca,
            &mut ca_current,
            None,
            &signed,
            until + Duration::from_secs(1),
        );
        assert_eq!(p.secret, None);
    }

    #[test]
    fn a_ca_without_leaves_keeps_the_old_ca_for_four_kubelet_syncs_and_garbage_is_not_retired() {
        let (mut ca, ca_secret) = issued_ca();
        let mut current = Some(ca_secret);
        ca.spec.valid_for = 2000 * 3600;
        let p = pass(&mut ca, &mut current, None, &[], t0());
        assert_eq!(
            retired_annotation(p.secret.as_ref().unwrap()).map(String::as_str),
            Some(marin3r_kube::time::rfc3339(t0() + Duration::from_secs(240)).as_str())
        );
        assert_eq!(p.requeue, Some(Duration::from_secs(240)));
        // A garbage tls.crt is replaced, not retired.
        let mut garbage = current.clone().unwrap();
        let d = garbage.data.as_mut().unwrap();
        d.insert(TLS_CRT.into(), bytes("garbage"));
        d.remove(RETIRED_CA_CRT);
        garbage.metadata.annotations = None;
        let mut current = Some(garbage);
        let p = pass(&mut ca, &mut current, None, &[], t0());
        assert!(p.reissued.unwrap().contains("tls.crt"));
        let s = p.secret.unwrap();
        assert!(!s.data.as_ref().unwrap().contains_key(RETIRED_CA_CRT));
        assert_eq!(certs_in(data(&s, CA_CRT)), 1);
    }

    #[test]
    fn a_deleted_ca_secret_is_recovered_from_its_leaves_and_rotates_with_overlap() {
        let (mut ca, ca_secret) = issued_ca();
        let ca1 = data(&ca_secret, TLS_CRT).to_string();
        let mut server = server();
        let mut server_current = None;
        pass(
            &mut server,
            &mut server_current,
            Some(&ca_secret),
            &[],
            t0(),
        );
        let leaf_secret = server_current.clone().unwrap();
        assert!(!needs_recovery(Some(&ca_secret)));
        assert!(needs_recovery(None));
        let recovered = trusted_cas([&leaf_secret, &leaf_secret]);
        assert_eq!(recovered.len(), 1, "deduplicated");
        assert_eq!(recovered[0].trim(), ca1.trim());

        // The CA Secret was deleted: a new CA, the old one (from the leaf) retired.
        let t1 = t0() + HOUR;
        let p = plan_recovering(&ca, NS, None, None, &[10 * 3600], &recovered, t1);
        ca.status = Some(p.status.clone());
        let rotated = p.secret.unwrap();
        assert_eq!(data(&rotated, RETIRED_CA_CRT).trim(), ca1.trim());
        assert_eq!(certs_in(data(&rotated, CA_CRT)), 2);
        assert_eq!(
            rotated.annotations()[marin3r_wire::RETIRED_CA_SINCE_ANNOTATION],
            marin3r_kube::time::rfc3339(t1)
        );
        // The leaf is held with the bundle, then switched: the usual rotation.
        let p = pass(&mut server, &mut server_current, Some(&rotated), &[], t1);
        assert_eq!(p.reissued, None);
        assert_eq!(
            data(p.secret.as_ref().unwrap(), CA_CRT),
            data(&rotated, CA_CRT)
        );
        let p = pass(
            &mut server,
            &mut server_current,
            Some(&rotated),
            &[],
            t1 + PROPAGATION,
        );
        assert_eq!(p.reissued.as_deref(), Some("not signed by the current CA"));

        // A damaged tls.crt is recovered the same way; a readable one needs no recovery
        // (and recovered certificates are then ignored).
        let mut damaged = ca_secret.clone();
        damaged
            .data
            .as_mut()
            .unwrap()
            .insert(TLS_CRT.into(), bytes("garbage"));
        assert!(needs_recovery(Some(&damaged)));
        let p = plan_recovering(&ca, NS, Some(&damaged), None, &[], &recovered, t1);
        assert_eq!(data(&p.secret.unwrap(), RETIRED_CA_CRT).trim(), ca1.trim());
        let other = issued_ca().1;
        let mut spec_changed = ca.clone();
        spec_changed.spec.valid_for = 2000 * 3600;
        let p = plan_recovering(&spec_changed, NS, Some(&other), None, &[], &recovered, t1);
        let retired = data(p.secret.as_ref().unwrap(), RETIRED_CA_CRT).to_string();
        assert_eq!(retired.trim(), data(&other, TLS_CRT).trim());
        // Expired recovered certificates are not kept.
        let p = plan_recovering(&ca, NS, None, None, &[], &recovered, t0() + 2000 * HOUR);
        assert!(!p.secret.unwrap().data.unwrap().contains_key(RETIRED_CA_CRT));
    }

    #[test]
    fn a_missing_or_unusable_ca_is_a_wait() {
        let mut server = server();
        let mut current = None;
        let p = pass(&mut server, &mut current, None, &[], t0());
        assert_eq!(not_ready_reason(&p), REASON_SIGNER_NOT_READY);
        assert_eq!(
            ready(&p).message,
            "waiting for the CA Secret ns/marin3r-ca-cert-instance"
        );
        assert_eq!((p.secret, p.requeue), (None, Some(SIGNER_RETRY)));

        let (_, ca_secret) = issued_ca();
        let mut no_key = ca_secret.clone();
        no_key.data.as_mut().unwrap().remove(TLS_KEY);
        let p = pass(&mut server, &mut current, Some(&no_key), &[], t0());
        assert_eq!(not_ready_reason(&p), REASON_SIGNER_NOT_READY);
        assert!(ready(&p).message.contains("has no tls.crt and tls.key"));

        let mut garbage = ca_secret.clone();
        garbage
            .data
            .as_mut()
            .unwrap()
            .insert(TLS_CRT.into(), bytes("garbage"));
        let p = pass(&mut server, &mut current, Some(&garbage), &[], t0());
        assert_eq!(not_ready_reason(&p), REASON_SIGNER_NOT_READY);
        assert!(
            ready(&p).message.contains("unusable"),
            "{}",
            ready(&p).message
        );
        assert_eq!((p.secret, p.requeue), (None, Some(SIGNER_RETRY)));
        assert!(
            !serde_json::to_string(&p.status)
                .unwrap()
                .contains("PRIVATE")
        );

        // A leaf that was fine keeps its Secret while its CA is away; the status says so.
        let p = pass(&mut server, &mut current, Some(&ca_secret), &[], t0());
        assert!(p.secret.is_some());
        let hash = p.status.certificate_hash.clone();
        let p = pass(&mut server, &mut current, None, &[], t0());
        assert_eq!((p.secret, p.status.ready), (None, Some(false)));
        assert_eq!(p.status.certificate_hash, hash);
        // The CA comes back: ready again, nothing re-issued.
        let p = pass(&mut server, &mut current, Some(&ca_secret), &[], t0());
        assert_eq!((p.secret, p.status.ready), (None, Some(true)));
    }

    #[test]
    fn cross_namespace_signers_and_invalid_specs_are_refused() {
        let mut other = server();
        other
            .spec
            .signer
            .ca_signed
            .as_mut()
            .unwrap()
            .ca_secret_ref
            .namespace = Some("other".into());
        assert_eq!(signer_secret_name(&other, NS), None);
        let p = plan(&other, NS, None, None, &[], t0());
        assert_eq!(not_ready_reason(&p), REASON_CROSS_NAMESPACE_SIGNER);
        assert!(ready(&p).message.contains("other/marin3r-ca-cert-instance"));
        assert_eq!((p.secret, p.requeue), (None, None));
        // Its own namespace spelled out is fine.
        let mut own = server();
        own.spec
            .signer
            .ca_signed
            .as_mut()
            .unwrap()
            .ca_secret_ref
            .namespace = Some(NS.into());
        assert_eq!(
            signer_secret_name(&own, NS),
            Some("marin3r-ca-cert-instance")
        );

        let mut invalid = server();
        invalid.spec.valid_for = 0;
        let p = plan(&invalid, NS, None, None, &[], t0());
        assert_eq!(not_ready_reason(&p), REASON_INVALID_SPEC);
        assert!(ready(&p).message.contains("spec.validFor"));
        assert_eq!((p.secret, p.requeue), (None, None));
    }

    #[test]
    fn a_host_that_cannot_be_a_san_is_reported() {
        let (_, ca_secret) = issued_ca();
        let mut bad = server();
        bad.spec.hosts = Some(vec!["bücher.example".into()]);
        let p = plan(&bad, NS, None, Some(&ca_secret), &[], t0());
        assert_eq!(not_ready_reason(&p), REASON_ISSUE_FAILED);
        assert!(
            ready(&p).message.contains("bücher.example"),
            "{}",
            ready(&p).message
        );
        assert_eq!((p.secret, p.requeue), (None, None));
    }

    #[test]
    fn a_hand_made_ca_secret_gives_its_ca_crt_or_its_certificate() {
        let (_, ca_secret) = issued_ca();
        let mut hand_made = ca_secret.clone();
        hand_made.data.as_mut().unwrap().remove(CA_CRT);
        let p = plan(&server(), NS, None, Some(&hand_made), &[], t0());
        let s = p.secret.unwrap();
        assert_eq!(data(&s, CA_CRT), data(&ca_secret, TLS_CRT));
        let mut with_bundle = hand_made;
        with_bundle
            .data
            .as_mut()
            .unwrap()
            .insert(CA_CRT.into(), bytes("ROOTS"));
        let p = plan(&server(), NS, None, Some(&with_bundle), &[], t0());
        assert_eq!(data(&p.secret.unwrap(), CA_CRT), "ROOTS");
    }

    #[test]
    fn a_self_signed_leaf_trusts_itself_and_a_foreign_secret_is_adopted() {
        let mut d = dsc(
            "test",
            NS,
            json!({"commonName": "test", "validFor": 3600, "hosts": ["example.test"],
                   "signer": {"selfSigned": {}}, "secretRef": {"name": "secret"}}),
        );
        let mut current = None;
        let p = pass(&mut d, &mut current, None, &[], t0());
        let s = p.secret.unwrap();
        assert_eq!(data(&s, CA_CRT), data(&s, TLS_CRT));
        // The same Secret without our labels and owner (made by someone else): adopted
        // with the same certificate.
        let mut foreign = s.clone();
        foreign.metadata.labels = None;
        foreign.metadata.owner_references = None;
        foreign.type_ = Some("Opaque".into());
        let mut current = Some(foreign);
        let p = pass(&mut d, &mut current, None, &[], t0());
        assert_eq!(p.reissued, None);
        let adopted = p.secret.unwrap();
        assert_eq!(data(&adopted, TLS_CRT), data(&s, TLS_CRT));
        assert_eq!(adopted.owner_references().len(), 1);
        assert_eq!(
            adopted.type_.as_deref(),
            Some("Opaque"),
            "a type is immutable"
        );
        let p = pass(&mut d, &mut current, None, &[], t0());
        assert_eq!(p.secret, None, "then stable");
    }
}
