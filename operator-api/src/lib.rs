//! The MARIN3R operator API, `operator.marin3r.3scale.net/v1alpha1`
//! (operator-design.md §2): [`DiscoveryService`], [`DiscoveryServiceCertificate`] and
//! [`EnvoyDeployment`].
//!
//! - Every upstream field name is accepted (camelCase JSON, including the misspelt
//!   `pkiConfg`); optional where upstream is optional, required where its CRD requires.
//! - Defaults are not persisted (except the DSC's, through
//!   [`DiscoveryServiceCertificateSpec::with_defaults`]); getter methods compute them, as
//!   upstream's do. Images the operator chooses (`MARIN3R_IMAGE`) are passed in by the
//!   caller: this crate reads no environment.
//! - The CRD schemas validate no more than upstream v0.13's did on upstream's fields (so
//!   that ours are a safe upgrade of upstream's, docs/olm.md): the checks upstream made in
//!   a webhook, port ranges and enums are `validate()`'s, which reports every rule as a
//!   list of [`FieldError`]s with JSON paths. [`DiscoveryService::validate`] and
//!   [`EnvoyDeployment::validate`] add the object's name rules: the one check the
//!   EnvoyDeployment webhook, `marin3r operator render` and the controllers run, so that
//!   no object generated from a valid resource is one the API server rejects.
//!
//! The CustomResourceDefinitions are generated from these types by `marin3r-manifests`
//! ([`crds`]).
#![forbid(unsafe_code)]

pub mod conditions;
pub mod discoveryservice;
pub mod discoveryservicecertificate;
pub mod duration;
pub mod envoydeployment;
mod schema;
pub mod validate;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;

pub use discoveryservice::{DiscoveryService, DiscoveryServiceSpec, DiscoveryServiceStatus};
pub use discoveryservicecertificate::{
    DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec, DiscoveryServiceCertificateStatus,
};
pub use duration::parse_go_duration;
pub use envoydeployment::{EnvoyDeployment, EnvoyDeploymentSpec, EnvoyDeploymentStatus};
pub use validate::{
    FieldError, MAX_CERTIFICATE_LIFETIME, MIN_CERTIFICATE_LIFETIME, Rule, certificate_lifetime,
    unknown_fields,
};

/// Errors of this crate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A Go duration string that does not parse (or is negative).
    #[error("{field}: invalid duration {value:?}: {reason}")]
    Duration {
        /// JSON path of the field, e.g. `spec.duration`.
        field: String,
        /// The value found.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A port outside 1–65535.
    #[error("{field}: port {value} is outside 1-65535")]
    Port {
        /// JSON path of the field, e.g. `spec.adminPort`.
        field: String,
        /// The value found.
        value: i64,
    },
    /// A spec that breaks one or more rules (every problem, in field order).
    #[error("{}", validate::join(.0))]
    Invalid(Vec<FieldError>),
}

/// The three CustomResourceDefinitions of the operator API, in a stable order:
/// DiscoveryService, DiscoveryServiceCertificate, EnvoyDeployment.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        DiscoveryService::crd(),
        DiscoveryServiceCertificate::crd(),
        EnvoyDeployment::crd(),
    ]
}

/// `value` if set, else `default`: every image getter (`spec.image`,
/// `initManager.image`, `shutdownManager.image`) defaults this way. The operator passes
/// its own image (`MARIN3R_IMAGE`, or the image it was built for) as `default`.
pub fn image_or<'a>(value: Option<&'a str>, default: &'a str) -> &'a str {
    value.filter(|s| !s.is_empty()).unwrap_or(default)
}

/// A port field as `u16`, or [`Error::Port`] naming the field (`validate()` keeps it in
/// 1–65535; this guards objects that bypassed it).
pub fn port(field: &str, value: i32) -> Result<u16, Error> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Error::Port {
            field: field.to_string(),
            value: i64::from(value),
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::{Value, json};

    use super::*;

    /// The schema node at `path` (dot-separated, `[]` for items) of `kind`'s spec.
    fn schema(kind: &str, path: &str) -> Value {
        let crd = crds()
            .into_iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap();
        let mut node =
            serde_json::to_value(crd).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                ["properties"]["spec"]
                .clone();
        for part in path.split('.') {
            let (name, items) = part.strip_suffix("[]").map_or((part, false), |n| (n, true));
            node = node["properties"][name].clone();
            if items {
                node = node["items"].clone();
            }
        }
        assert!(!node.is_null(), "{kind} {path}");
        node
    }

    fn errors(kind: &str, spec: Value) -> Vec<FieldError> {
        let result = match kind {
            "EnvoyDeployment" => serde_json::from_value::<EnvoyDeploymentSpec>(spec)
                .unwrap()
                .validate(),
            "DiscoveryServiceCertificate" => {
                serde_json::from_value::<DiscoveryServiceCertificateSpec>(spec)
                    .unwrap()
                    .validate()
            }
            _ => serde_json::from_value::<DiscoveryServiceSpec>(spec)
                .unwrap()
                .validate(),
        };
        match result {
            Err(Error::Invalid(errors)) => errors,
            other => panic!("{kind}: expected errors, got {other:?}"),
        }
    }

    /// What kube's `Api<K>` and `Controller<K>` ask of a resource type.
    fn api_ready<K>()
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + kube::CustomResourceExt
            + serde::de::DeserializeOwned
            + serde::Serialize
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let ar = K::api_resource();
        assert_eq!(
            (ar.group.as_str(), ar.version.as_str()),
            (marin3r_wire::OPERATOR_GROUP, marin3r_wire::API_VERSION)
        );
        assert_eq!(ar.kind, K::kind(&()));
        assert_eq!(
            K::crd_name(),
            format!("{}.{}", K::plural(&()), marin3r_wire::OPERATOR_GROUP)
        );
        assert!(K::shortnames().is_empty());
    }

    #[test]
    fn the_three_kinds_are_namespaced_api_resources() {
        api_ready::<DiscoveryService>();
        api_ready::<DiscoveryServiceCertificate>();
        api_ready::<EnvoyDeployment>();
        assert_eq!(
            <DiscoveryService as kube::Resource>::api_version(&()),
            "operator.marin3r.3scale.net/v1alpha1"
        );
    }

    // The rules upstream's schemas did not have are validate()'s only (the schemas stay a
    // safe upgrade of upstream's, docs/olm.md); the one CEL rule left is on a field
    // upstream lacks (`extraVolumes`) and has a validate() twin with the same message.
    #[test]
    fn every_rule_is_validate_s_and_the_schemas_keep_only_new_field_rules() {
        let ed = |extra: Value| {
            let mut spec = json!({"envoyConfigRef": "c", "discoveryServiceRef": "d"});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            spec
        };
        let signer = "exactly one of 'selfSigned' or 'caSigned' must be set";
        let cases = [
            (
                "EnvoyDeployment",
                "replicas",
                ed(json!({"replicas": {"static": 1, "dynamic": {"maxReplicas": 2}}})),
                "only one of 'spec.replicas.static' or 'spec.replicas.dynamic' is allowed",
                false,
            ),
            (
                "EnvoyDeployment",
                "replicas.dynamic",
                ed(json!({"replicas": {"dynamic": {"minReplicas": 3, "maxReplicas": 2}}})),
                "minReplicas must not be greater than maxReplicas",
                false,
            ),
            (
                "EnvoyDeployment",
                "podDisruptionBudget",
                ed(json!({"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}})),
                "only one of 'spec.podDisruptionBudget.minAvailable' or 'spec.podDisruptionBudget.maxUnavailable' is allowed",
                false,
            ),
            (
                "EnvoyDeployment",
                "replicas.static",
                ed(json!({"replicas": {"static": -1}})),
                "-1 is less than 0",
                false,
            ),
            (
                "EnvoyDeployment",
                "shutdownManager.drainTime",
                ed(json!({"shutdownManager": {"drainTime": -1}})),
                "-1 is less than 0",
                false,
            ),
            (
                "EnvoyDeployment",
                "extraVolumes[]",
                ed(json!({"extraVolumes": [{"mountPath": "/etc/envoy/x"}]})),
                "exactly one of 'secret' or 'configMap' is required in an extra volume",
                true,
            ),
            (
                "DiscoveryServiceCertificate",
                "signer",
                json!({"commonName": "a", "validFor": 1, "secretRef": {"name": "s"},
                       "signer": {"selfSigned": {}, "caSigned": {"caSecretRef": {"name": "ca"}}}}),
                signer,
                false,
            ),
            (
                "DiscoveryServiceCertificate",
                "signer",
                json!({"commonName": "a", "validFor": 1, "secretRef": {"name": "s"}, "signer": {}}),
                signer,
                false,
            ),
            (
                "DiscoveryService",
                "serviceConfig.type",
                json!({"serviceConfig": {"type": "NodePort"}}),
                "\"NodePort\" is not one of ClusterIP, LoadBalancer, Headless",
                false,
            ),
        ];
        let mut in_schema = 0;
        for (kind, path, spec, message, cel) in cases {
            let node = schema(kind, path);
            let rules = node["x-kubernetes-validations"].clone();
            for keyword in ["minimum", "maximum", "enum"] {
                assert!(node.get(keyword).is_none(), "{kind} {path}: {keyword}");
            }
            if cel {
                assert_eq!(rules[0]["message"], message, "{kind} {path}");
                in_schema += rules.as_array().unwrap().len();
            } else {
                assert!(rules.is_null(), "{kind} {path}: {rules}");
            }
            let errors = errors(kind, spec);
            assert!(
                errors
                    .iter()
                    .any(|e| e.path == format!("spec.{}", path.replace("[]", "[0]"))
                        && e.message == message),
                "{kind} {path}: {errors:?} lacks {message:?}"
            );
        }
        // Every rule in the schemas is in the table above.
        let total: usize = crds()
            .iter()
            .map(|c| {
                serde_json::to_string(c)
                    .unwrap()
                    .matches("x-kubernetes-validations")
                    .count()
            })
            .sum();
        assert_eq!(in_schema, total);
    }

    // The CRDs leave `spec` optional, as upstream's (docs/olm.md): a DiscoveryService
    // without one is the default one (upstream's README applies it so); an
    // EnvoyDeployment or DiscoveryServiceCertificate without one does not decode, and the
    // error names `spec` (the webhook denies it, the controllers' lenient watches skip it).
    #[test]
    fn an_object_without_spec_is_defaulted_or_refused_naming_spec() {
        let object = |kind: &str| {
            json!({"apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": kind,
                   "metadata": {"name": "x", "namespace": "default"}})
        };
        let ds: DiscoveryService = serde_json::from_value(object("DiscoveryService")).unwrap();
        assert_eq!(ds.spec, DiscoveryServiceSpec::default());
        assert!(ds.validate().is_ok());
        let ed = serde_json::from_value::<EnvoyDeployment>(object("EnvoyDeployment")).unwrap_err();
        assert!(ed.to_string().contains("missing field `spec`"), "{ed}");
        let dsc = serde_json::from_value::<DiscoveryServiceCertificate>(object(
            "DiscoveryServiceCertificate",
        ))
        .unwrap_err();
        assert!(dsc.to_string().contains("missing field `spec`"), "{dsc}");
    }

    #[test]
    fn every_port_range_is_validate_s_not_the_schema_s() {
        let ed = json!({"envoyConfigRef": "c", "discoveryServiceRef": "d",
            "adminPort": 0, "ports": [{"name": "http", "port": 65536}],
            "shutdownManager": {"serverPort": -1}});
        let ds = json!({"xdsServerPort": 0, "metricsPort": 0, "probePort": 0});
        for (kind, spec, paths) in [
            (
                "EnvoyDeployment",
                ed,
                vec!["adminPort", "ports[].port", "shutdownManager.serverPort"],
            ),
            (
                "DiscoveryService",
                ds,
                vec!["xdsServerPort", "metricsPort", "probePort"],
            ),
        ] {
            let errors = errors(kind, spec);
            for path in paths {
                let node = schema(kind, path);
                // Upstream's schemas have no range: adding one is an unsafe upgrade.
                assert_eq!(
                    (node["minimum"].as_f64(), node["maximum"].as_f64()),
                    (None, None),
                    "{kind} {path}"
                );
                let want = format!("spec.{}", path.replace("[]", "[0]"));
                assert!(
                    errors
                        .iter()
                        .any(|e| e.path == want && e.rule == Rule::Range),
                    "{kind} {want}: {errors:?}"
                );
            }
        }
    }
}
