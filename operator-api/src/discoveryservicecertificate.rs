//! DiscoveryServiceCertificate (operator-design.md §2.2): a certificate the operator issues
//! into a `kubernetes.io/tls` Secret, self-signed or signed by a CA Secret. An internal
//! resource of the operator; direct use is discouraged.

use k8s_openapi::api::core::v1::SecretReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::validate::{Errors, Rule};

/// Desired state of a DiscoveryServiceCertificate.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.marin3r.3scale.net",
    version = "v1alpha1",
    kind = "DiscoveryServiceCertificate",
    plural = "discoveryservicecertificates",
    namespaced,
    status = "DiscoveryServiceCertificateStatus",
    derive = "PartialEq",
    doc = "DiscoveryServiceCertificate is an internal resource of the MARIN3R operator: a \
           certificate issued into a kubernetes.io/tls Secret. Direct use is discouraged.",
    printcolumn = r#"{"name": "Ready", "type": "boolean", "jsonPath": ".status.ready"}"#,
    printcolumn = r#"{"name": "Not Before", "type": "string", "format": "date-time", "jsonPath": ".status.notBefore"}"#,
    printcolumn = r#"{"name": "Not After", "type": "string", "format": "date-time", "jsonPath": ".status.notAfter"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceCertificateSpec {
    /// The certificate's subject common name.
    pub common_name: String,
    /// A server certificate (extended key usage serverAuth). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<bool>,
    /// A CA certificate. Default false.
    #[serde(rename = "isCA", default, skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
    /// Validity in seconds.
    pub valid_for: i64,
    /// Subject alternative names (IP addresses or DNS names). Default: `[commonName]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Who signs the certificate: exactly one of `selfSigned` and `caSigned`.
    pub signer: Signer,
    /// The Secret to write; it is always in the certificate's namespace.
    pub secret_ref: SecretReference,
    /// Automatic renewal (default enabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_renewal: Option<CertificateRenewal>,
}

const SIGNER_MESSAGE: &str = "exactly one of 'selfSigned' or 'caSigned' must be set";

/// `signer`: exactly one of `selfSigned` and `caSigned`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Signer {
    /// A self-signed certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<SelfSigned>,
    /// A certificate signed by the CA in a `kubernetes.io/tls` Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_signed: Option<CaSigned>,
}

/// `signer.selfSigned`: an empty object.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SelfSigned {}

/// `signer.caSigned`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaSigned {
    /// The CA Secret (`tls.crt`, `tls.key`). An empty namespace means the certificate's.
    pub ca_secret_ref: SecretReference,
}

/// `certificateRenewal`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct CertificateRenewal {
    /// Re-issue the certificate before it expires (at 80% of its lifetime).
    pub enabled: bool,
}

impl Default for CertificateRenewal {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Observed state of a DiscoveryServiceCertificate.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceCertificateStatus {
    /// Whether the certificate in the Secret is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Start of the certificate's validity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,
    /// End of the certificate's validity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Time>,
    /// A hash of the certificate (changes on every issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_hash: Option<String>,
    /// Conditions of the certificate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Who signs a certificate, with defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Issuer<'a> {
    /// Self-signed.
    SelfSigned,
    /// Signed by the CA Secret `name` in `namespace`.
    CaSigned {
        /// The CA Secret's name.
        name: &'a str,
        /// Its namespace (the certificate's own when the reference has none).
        namespace: &'a str,
    },
}

impl DiscoveryServiceCertificateSpec {
    /// `server`, default false.
    pub fn is_server(&self) -> bool {
        self.server.unwrap_or(false)
    }

    /// `isCA`, default false.
    pub fn is_ca(&self) -> bool {
        self.is_ca.unwrap_or(false)
    }

    /// `hosts`, default (unset or empty) `[commonName]`.
    pub fn hosts(&self) -> Vec<String> {
        match &self.hosts {
            Some(hosts) if !hosts.is_empty() => hosts.clone(),
            _ => vec![self.common_name.clone()],
        }
    }

    /// `certificateRenewal.enabled`, default true.
    pub fn renewal_enabled(&self) -> bool {
        self.certificate_renewal
            .as_ref()
            .is_none_or(|renewal| renewal.enabled)
    }

    /// The Secret's name (`secretRef.namespace` is ignored: the Secret is always in the
    /// certificate's namespace).
    pub fn secret_name(&self) -> &str {
        self.secret_ref.name.as_deref().unwrap_or_default()
    }

    /// The issuer; an empty `caSecretRef.namespace` means `namespace` (the certificate's,
    /// operator-design.md §8 Q16). A spec with both or neither signer gives `None` (see
    /// [`Self::validate`]).
    pub fn issuer<'a>(&'a self, namespace: &'a str) -> Option<Issuer<'a>> {
        match (&self.signer.self_signed, &self.signer.ca_signed) {
            (Some(_), None) => Some(Issuer::SelfSigned),
            (None, Some(ca)) => Some(Issuer::CaSigned {
                name: ca.ca_secret_ref.name.as_deref().unwrap_or_default(),
                namespace: marin3r_wire::namespace_or(
                    ca.ca_secret_ref.namespace.as_deref(),
                    namespace,
                ),
            }),
            _ => None,
        }
    }

    /// The spec with upstream's `Default()` applied: `server` and `isCA` false, `hosts`
    /// `[commonName]`, `certificateRenewal {enabled: true}`. Generators apply it so the
    /// desired object equals the persisted one.
    pub fn with_defaults(mut self) -> Self {
        self.server = Some(self.is_server());
        self.is_ca = Some(self.is_ca());
        self.hosts = Some(self.hosts());
        self.certificate_renewal = Some(CertificateRenewal {
            enabled: self.renewal_enabled(),
        });
        self
    }

    /// Every problem of the spec, or `Ok`.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errors = Errors::default();
        errors.non_empty("spec.commonName", &self.common_name);
        errors.at_least("spec.validFor", Some(self.valid_for), 1);
        let max = crate::validate::MAX_CERTIFICATE_LIFETIME.as_secs();
        if u64::try_from(self.valid_for).is_ok_and(|v| v > max) {
            errors.push(
                "spec.validFor",
                Rule::Range,
                format!(
                    "{} seconds is longer than the maximum certificate lifetime {max} (100 years)",
                    self.valid_for
                ),
            );
        }
        for (i, host) in self.hosts.iter().flatten().enumerate() {
            errors.non_empty(format!("spec.hosts[{i}]"), host);
        }
        match (&self.signer.self_signed, &self.signer.ca_signed) {
            (Some(_), None) => {}
            (None, Some(ca)) => errors.non_empty(
                "spec.signer.caSigned.caSecretRef.name",
                ca.ca_secret_ref.name.as_deref().unwrap_or_default(),
            ),
            _ => errors.push("spec.signer", Rule::ExactlyOne, SIGNER_MESSAGE),
        }
        errors.non_empty("spec.secretRef.name", self.secret_name());
        errors.into_result()
    }
}

impl DiscoveryServiceCertificate {
    /// `status.ready`, false when unset.
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().and_then(|s| s.ready).unwrap_or(false)
    }

    /// `status.certificateHash`, `""` when unset.
    pub fn certificate_hash(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.certificate_hash.as_deref())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn spec(json: serde_json::Value) -> DiscoveryServiceCertificateSpec {
        serde_json::from_value(json).unwrap()
    }

    fn minimal() -> DiscoveryServiceCertificateSpec {
        spec(serde_json::json!({
            "commonName": "test",
            "validFor": 10,
            "signer": {"selfSigned": {}},
            "secretRef": {"name": "secret"}
        }))
    }

    // Mirrors upstream discoveryservicecertificate_types_test.go (operator-design.md §9.2).
    #[test]
    fn getters_default_like_upstream() {
        let spec = minimal();
        assert!(!spec.is_server());
        assert!(!spec.is_ca());
        assert_eq!(spec.hosts(), ["test"]);
        assert!(spec.renewal_enabled());
        assert_eq!(spec.secret_name(), "secret");
        assert_eq!(spec.issuer("ns"), Some(Issuer::SelfSigned));
        let dsc = DiscoveryServiceCertificate::new("test", spec.clone());
        assert!(!dsc.is_ready());
        assert_eq!(dsc.certificate_hash(), "");
        assert_eq!(spec.validate(), Ok(()));
    }

    #[test]
    fn with_defaults_persists_upstream_defaults() {
        let defaulted = serde_json::to_value(minimal().with_defaults()).unwrap();
        assert_eq!(
            defaulted,
            serde_json::json!({
                "commonName": "test",
                "server": false,
                "isCA": false,
                "validFor": 10,
                "hosts": ["test"],
                "signer": {"selfSigned": {}},
                "secretRef": {"name": "secret"},
                "certificateRenewal": {"enabled": true}
            })
        );
        // Idempotent, and explicit values are kept.
        let explicit = spec(serde_json::json!({
            "commonName": "test", "server": true, "isCA": true, "validFor": 10,
            "hosts": ["a", "10.0.0.1"], "signer": {"selfSigned": {}},
            "secretRef": {"name": "secret"}, "certificateRenewal": {"enabled": false}
        }));
        assert_eq!(explicit.clone().with_defaults(), explicit);
        assert!(!explicit.renewal_enabled());
        assert_eq!(explicit.hosts(), ["a", "10.0.0.1"]);
    }

    #[test]
    fn ca_signed_issuer_defaults_to_the_certificate_namespace() {
        let mut s = minimal();
        s.signer = Signer {
            self_signed: None,
            ca_signed: Some(CaSigned {
                ca_secret_ref: SecretReference {
                    name: Some("marin3r-ca-cert-instance".into()),
                    namespace: None,
                },
            }),
        };
        assert_eq!(
            s.issuer("default"),
            Some(Issuer::CaSigned {
                name: "marin3r-ca-cert-instance",
                namespace: "default"
            })
        );
        s.signer.ca_signed = Some(CaSigned {
            ca_secret_ref: SecretReference {
                name: Some("ca".into()),
                namespace: Some("other".into()),
            },
        });
        assert_eq!(
            s.issuer("default"),
            Some(Issuer::CaSigned {
                name: "ca",
                namespace: "other"
            })
        );
    }

    #[test]
    fn status_getters_read_the_status() {
        let mut dsc = DiscoveryServiceCertificate::new("test", minimal());
        dsc.status = Some(DiscoveryServiceCertificateStatus {
            ready: Some(true),
            certificate_hash: Some("5c78c58c76".into()),
            ..Default::default()
        });
        assert!(dsc.is_ready());
        assert_eq!(dsc.certificate_hash(), "5c78c58c76");
    }

    #[test]
    fn validate_reports_every_problem_with_its_path() {
        let bad = spec(serde_json::json!({
            "commonName": "",
            "validFor": 0,
            "hosts": ["ok", " "],
            "signer": {"selfSigned": {}, "caSigned": {"caSecretRef": {"name": "ca"}}},
            "secretRef": {}
        }));
        let Err(Error::Invalid(errors)) = bad.validate() else {
            panic!("expected errors")
        };
        let got: Vec<(&str, Rule)> = errors.iter().map(|e| (e.path.as_str(), e.rule)).collect();
        assert_eq!(
            got,
            [
                ("spec.commonName", Rule::Required),
                ("spec.validFor", Rule::Range),
                ("spec.hosts[1]", Rule::Required),
                ("spec.signer", Rule::ExactlyOne),
                ("spec.secretRef.name", Rule::Required),
            ]
        );
        assert_eq!(bad.issuer("ns"), None);
        let neither = spec(serde_json::json!({
            "commonName": "x", "validFor": 1, "signer": {}, "secretRef": {"name": "s"}
        }));
        assert_eq!(
            neither.validate().unwrap_err().to_string(),
            "spec.signer: exactly one of 'selfSigned' or 'caSigned' must be set"
        );
    }
}
