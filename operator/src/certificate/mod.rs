//! The DiscoveryServiceCertificate controller (operator-design.md §4, with the decisions
//! (marked R) of §8 Q6–Q9, Q15, Q16): every DiscoveryServiceCertificate (DSC) becomes a
//! `kubernetes.io/tls` Secret holding a certificate the operator issued, checked on every
//! pass and re-issued whenever it is not what the spec asks for. No cert-manager.
//!
//! The decisions are one pure function, [`plan`] (the DSC, its Secret, its signer's
//! Secret, the clock → the Secret to apply, the status, when to look again); the
//! kube-runtime shell ([`run`], [`reconcile`]) reads the two Secrets, calls it and
//! writes what it says.
//!
//! # The Secret
//!
//! Name `spec.secretRef.name`, always in the DSC's namespace (`secretRef.namespace` is
//! ignored, as upstream). Type `kubernetes.io/tls` (an existing Secret of another type,
//! made by hand, keeps its type: it is immutable). Labels: the DSC's labels plus
//! `app.kubernetes.io/managed-by: marin3r-operator` (the controller's Secret watch is
//! selected on it). A controller owner reference to the DSC (deleting the DSC deletes
//! the Secret). Written with server-side apply (field manager
//! [`super::FIELD_MANAGER`], forced), so keys and annotations the operator stops writing
//! are removed and everything else on the Secret is left alone.
//!
//! | data key | content |
//! |---|---|
//! | `tls.crt` | the certificate (PEM), ECDSA P-256, `notBefore` backdated 5 min |
//! | `tls.key` | its PKCS#8 private key (PEM) |
//! | `ca.crt` | what a peer of this certificate must trust (below) |
//! | `retired-ca.crt` | CA Secrets only, during a rotation: the replaced CA certificate(s) (PEM), still trusted |
//!
//! and, with `retired-ca.crt`, two annotations (RFC 3339 UTC):
//! [`marin3r_wire::RETIRED_CA_UNTIL_ANNOTATION`] (`operator.marin3r.3scale.net/retired-ca-until`), the
//! instant until which every certificate in `retired-ca.crt` stays in the trust bundles,
//! and [`marin3r_wire::RETIRED_CA_SINCE_ANNOTATION`] (`operator.marin3r.3scale.net/retired-ca-since`), when
//! the CA was last re-issued. From the `until` instant on, the key and both annotations
//! are dropped.
//!
//! `ca.crt`:
//! - a CA (`isCA`): the trust bundle, its own certificate first, then the retired CAs
//!   still inside their overlap window ([`lifecycle::trust_bundle`](marin3r_certs::lifecycle::trust_bundle));
//! - a leaf signed by a CA Secret: the same bundle, computed from the CA Secret's
//!   `tls.crt`, `retired-ca.crt` and annotation at this pass (so that a leaf drops an
//!   expired retired CA on time even before the CA's own pass); a CA Secret without the
//!   annotation (e.g. made by hand) gives its `ca.crt`, or its `tls.crt` when it has
//!   none;
//! - a self-signed leaf: its own certificate.
//!
//! A certificate that is fine but whose Secret is not what it should be (another
//! `ca.crt`, missing labels or owner, an expired retired CA still present) has its Secret
//! re-applied with the same certificate and key: this is how the overlap bundle reaches
//! every leaf and how the old CA is later dropped.
//!
//! # Rules
//!
//! - The profile comes from the spec ([`profile`]): common name, `hosts` (default
//!   `[commonName]`; the DiscoveryService controller puts the server SANs of Q8 there),
//!   usage (`isCA` → CA, `server` → serverAuth, else clientAuth), validity `validFor`
//!   seconds, ECDSA P-256.
//! - A certificate is re-issued (new key) per [`lifecycle::check`](marin3r_certs::lifecycle::check): no Secret, no or
//!   garbage `tls.crt`/`tls.key` (Q7: healed, never a panic loop), a key that is not the
//!   certificate's, anything differing from the profile (CN, SANs, usage, key type,
//!   lifetime), not signed by the CA Secret's **current** `tls.crt`, expired, or less than
//!   20 % of its lifetime left (renewal on, the default). With renewal off an expired
//!   certificate is reported (`Ready=False`, reason `Expired`) and left alone.
//! - Signer (`caSigned`): the CA Secret `caSecretRef.name` in `caSecretRef.namespace`,
//!   empty meaning the DSC's namespace (Q16). Another namespace is refused (condition
//!   reason `CrossNamespaceSigner`, nothing written, no retry until the DSC changes).
//!   A missing or unusable CA Secret is a wait, not an error: `Ready=False`, reason
//!   `SignerNotReady`, looked at again in [`SIGNER_RETRY`]; the leaf's Secret is not
//!   touched meanwhile.
//! - CA rotation with overlap (Q6), in three phases:
//!   1. *bundle*: when a CA is re-issued, its previous certificate (if it parsed) joins
//!      `retired-ca.crt`, with the retired CAs still in their window. Its leaves keep
//!      their certificates (still signed by a CA every peer trusts) and get the bundle
//!      `new + old` as `ca.crt` at once (a Secret re-apply, no re-issue);
//!   2. *switch*: [`PROPAGATION`] (two kubelet syncs) after the rotation, when every
//!      mounted `ca.crt` holds the bundle, the leaves fail the "signed by the current CA"
//!      check and are re-issued by the new CA. Peers with old files still present
//!      old-CA certificates, which the bundle accepts; no handshake fails on either side
//!      (the TLS test in `operator/tests/certificate.rs` shows a direct switch would);
//!   3. *drop*: at `rotation + PROPAGATION + overlap(longest validFor of the DSCs it
//!      signs, 2 × 60 s kubelet sync)` ([`lifecycle::overlap`](marin3r_certs::lifecycle::overlap)) the old CA leaves every
//!      bundle. Both the CA and its leaves schedule a pass at each phase's end.
//!
//!   A CA whose Secret was deleted or whose `tls.crt` is damaged has nothing to retire
//!   by itself: the shell reads the Secrets of the DSCs it signs and the CA certificates
//!   still valid in their `ca.crt` are retired instead ([`trusted_cas`],
//!   [`plan_recovering`]), so that rotation has the same three phases.
//! - Status: `ready`, `notBefore`, `notAfter` (RFC 3339), `certificateHash` (FNV-1a 64
//!   of `tls.crt`, 16 hex digits), and the condition `Ready` (True, reason
//!   `CertificateValid`; or False with a reason and a message naming the problem). The
//!   condition's `observedGeneration` is the DSC's generation (the status type has no
//!   top-level `observedGeneration`). Key material is never logged nor written to a
//!   status.
//! - When to look again: at the certificate's renewal time (or expiry + 1 s with renewal
//!   off), or at the end of an overlap window if sooner, clamped to 1 s–1 h
//!   ([`lifecycle::requeue_after`](marin3r_certs::lifecycle::requeue_after), Q15).
//!
//! # Watches
//!
//! `For(DSC)`; `Owns(Secret)` selected on [`marin3r_wire::app_labels::MANAGED_BY_OPERATOR`]; and every event of a
//! CA DSC reconciles the DSCs it signs **in the same namespace** (Q9: namespace and
//! name, [`signed_by`]).

mod controller;
#[cfg(test)]
mod fixtures;
mod plan;

pub use controller::{Context, controller, reconcile, reconcile_at, run, signed_by};
pub use plan::{
    KUBELET_SYNC, PROPAGATION, Plan, REASON_CERTIFICATE_VALID, REASON_CROSS_NAMESPACE_SIGNER,
    REASON_EXPIRED, REASON_ISSUE_FAILED, REASON_SIGNER_NOT_READY, RETIRED_CA_CRT, SECRET_TYPE,
    SIGNER_RETRY, certificate_hash, needs_recovery, plan, plan_recovering, profile,
    signer_secret_name, trusted_cas,
};
