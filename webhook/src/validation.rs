//! The sans-I/O validations: EnvoyConfig
//! (`/validate-marin3r-3scale-net-v1alpha1-envoyconfig`) and EnvoyDeployment
//! (`/validate-operator-marin3r-3scale-net-v1alpha1-envoydeployment`,
//! operator-design.md §5.8: its spec's `validate()`, which includes upstream's two rules
//! with their messages — `static` xor `dynamic` replicas, `minAvailable` xor
//! `maxUnavailable` — and reports every field error with its path).
//!
//! CREATE and UPDATE of a `marin3r.3scale.net/v1alpha1` EnvoyConfig are decoded with the
//! decoder of `marin3r validate` ([`validate_envoy_config`]): every resource of either
//! form (`spec.resources`, deprecated `spec.envoyResources`) must be a valid Envoy v3
//! message, names unique per type, entries well-formed. The webhook is stateless and
//! cannot read Secrets or EndpointSlices, so a referenced Secret is not checked (that
//! is the discovery service's job, which taints a revision it cannot build).
//!
//! Every other review is allowed: another kind, a subresource, DELETE/CONNECT, and an
//! UPDATE that leaves `spec` as it is (so finalizers, labels and the deletion of an
//! EnvoyConfig stored before the webhook existed are never blocked).

use serde_json::Value;

use marin3r_envoyconfig::envoyconfig::{NoSecrets, validate_envoy_config};
use marin3r_wire::quote::{MAX_MESSAGE_BYTES, bounded, bounded_to, listed};

use crate::admission::{BadRequest, ReviewOut, parse};

/// Kind validated by this path.
pub const KIND: &str = "EnvoyConfig";

/// Why a review was allowed without validation (a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `request.kind` is not the kind of the path (e.g. `marin3r.3scale.net/v1alpha1,
    /// EnvoyConfig`).
    NotAnEnvoyConfig,
    /// A request on a subresource (`status`).
    Subresource,
    /// Neither CREATE nor UPDATE.
    Operation,
    /// An UPDATE whose `spec` equals the stored one.
    SpecUnchanged,
}

impl Pass {
    /// Stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Pass::NotAnEnvoyConfig => "not_an_envoyconfig",
            Pass::Subresource => "subresource",
            Pass::Operation => "not_create_or_update",
            Pass::SpecUnchanged => "spec_unchanged",
        }
    }
}

/// What happened to one validation review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The EnvoyConfig was decoded without errors.
    Allowed,
    /// The EnvoyConfig was denied (code 400).
    Denied,
    /// Allowed without looking at the object.
    Skipped(Pass),
}

/// A kind a validating path checks: its group, version, kind and the check of one
/// object (the denial message on failure).
pub struct Validated {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub check: fn(&Value) -> Result<(), String>,
}

/// The EnvoyConfig path: decoded as `marin3r validate` does.
pub const ENVOYCONFIG: Validated = Validated {
    group: marin3r_wire::DOMAIN,
    version: marin3r_wire::API_VERSION,
    kind: KIND,
    check: |object| {
        validate_envoy_config(object, &NoSecrets).map_err(|errors| {
            let errors = errors.iter().map(|e| bounded(&e.to_string()).into_owned());
            format!("invalid EnvoyConfig: {}", listed(errors, "; "))
        })
    },
};

/// The EnvoyDeployment path: the object decodes and passes
/// `marin3r_operator_api::EnvoyDeployment::validate` (its name and spec).
pub const ENVOYDEPLOYMENT: Validated = Validated {
    group: marin3r_wire::OPERATOR_GROUP,
    version: marin3r_wire::API_VERSION,
    kind: "EnvoyDeployment",
    check: |object| {
        let ed: marin3r_operator_api::EnvoyDeployment = serde_path_to_error::deserialize(object)
            .map_err(|e| {
                format!(
                    "invalid EnvoyDeployment: {}: {}",
                    bounded(&e.path().to_string()),
                    bounded(&e.inner().to_string())
                )
            })?;
        // The one check `marin3r operator render` and the controller run too.
        ed.validate().map_err(|e| {
            format!(
                "invalid EnvoyDeployment: {}",
                bounded_to(&e.to_string(), MAX_MESSAGE_BYTES)
            )
        })
    },
};

/// Handles one AdmissionReview body of the EnvoyConfig validating webhook.
pub fn validate(body: &[u8]) -> Result<(ReviewOut, Verdict), BadRequest> {
    validate_as(body, &ENVOYCONFIG)
}

/// Handles one AdmissionReview body of the validating webhook of `what`: CREATE, and
/// UPDATE of `spec`, of `what`'s kind are checked; anything else is allowed.
pub fn validate_as(body: &[u8], what: &Validated) -> Result<(ReviewOut, Verdict), BadRequest> {
    let request = parse(body)?;
    let uid = request.uid.clone();
    let skip = |pass| Ok((ReviewOut::allow(uid.clone()), Verdict::Skipped(pass)));
    if !request.is_kind(what.group, what.version, what.kind) {
        return skip(Pass::NotAnEnvoyConfig);
    }
    if request.is_subresource() {
        return skip(Pass::Subresource);
    }
    let update = match request.operation.as_deref() {
        Some("CREATE") => false,
        Some("UPDATE") => true,
        _ => return skip(Pass::Operation),
    };
    let Some(object @ Value::Object(_)) = &request.object else {
        return Ok((
            ReviewOut::deny(
                uid,
                400,
                format!("request.object must be an {} object", what.kind),
            ),
            Verdict::Denied,
        ));
    };
    if update
        && request
            .old_object
            .as_ref()
            .is_some_and(|old| old.get("spec") == object.get("spec"))
    {
        return skip(Pass::SpecUnchanged);
    }
    match (what.check)(object) {
        Ok(()) => Ok((ReviewOut::allow(uid), Verdict::Allowed)),
        Err(message) => Ok((ReviewOut::deny(uid, 400, message), Verdict::Denied)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_testkit::admission::Review;
    use serde_json::json;

    fn config(resources: Value) -> Value {
        json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"nodeID": "n", "resources": resources}
        })
    }

    fn cluster(name: &str) -> Value {
        json!({"type": "cluster", "value": {"name": name, "connect_timeout": "1s"}})
    }

    #[test]
    fn allows_a_valid_config_and_denies_every_error() {
        let ok = config(json!([cluster("a")]));
        let (out, verdict) = validate(
            &Review::envoy_config("CREATE", ok, Value::Null)
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Allowed);
        assert_eq!(out.response.uid, "u-1");
        assert!(out.response.allowed && out.response.status.is_none());

        let bad = config(json!([
            {"type": "cluster", "value": {"name": "a", "bogus": 1}},
            cluster("b"),
            cluster("b"),
        ]));
        let (out, verdict) = validate(
            &Review::envoy_config("CREATE", bad, Value::Null)
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Denied);
        let status = out.response.status.unwrap();
        assert_eq!(status.code, 400);
        assert_eq!(
            status.message,
            "invalid EnvoyConfig: cluster \"a\": spec.resources[0].value: unknown field \"bogus\"; \
             cluster \"b\": spec.resources[2].value: duplicate cluster name \"b\" (first at spec.resources[1].value)"
        );
    }

    #[test]
    fn missing_secrets_are_not_errors() {
        let c = config(json!([{"type": "secret", "generateFromTlsSecret": "in-the-cluster"}]));
        let (_, verdict) = validate(
            &Review::envoy_config("CREATE", c, Value::Null)
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Allowed);
    }

    #[test]
    fn skips() {
        let bad = config(json!([{"type": "cluster"}]));
        let (out, verdict) = validate(
            &Review::envoy_config("DELETE", Value::Null, bad.clone())
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Skipped(Pass::Operation));
        assert!(out.response.allowed);

        // An UPDATE that keeps an (already stored) invalid spec: finalizers can go.
        let mut updated = bad.clone();
        updated["metadata"]["finalizers"] = json!([]);
        let (_, verdict) = validate(
            &Review::envoy_config("UPDATE", updated, bad.clone())
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Skipped(Pass::SpecUnchanged));

        let mut other = serde_json::from_slice::<Value>(
            &Review::envoy_config("CREATE", bad, Value::Null)
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        other["request"]["kind"]["version"] = json!("v1alpha2");
        let (_, verdict) = validate(&serde_json::to_vec(&other).unwrap()).unwrap();
        assert_eq!(verdict, Verdict::Skipped(Pass::NotAnEnvoyConfig));
    }

    // The CRDs leave `spec` optional, as upstream's (docs/olm.md): an object without one
    // is denied here, naming the field, rather than admitted.
    #[test]
    fn an_object_without_spec_is_denied_naming_it() {
        let object = |kind: &str, group: &str| {
            json!({"apiVersion": format!("{group}/v1alpha1"), "kind": kind,
                   "metadata": {"name": "x", "namespace": "default"}})
        };
        for (review, what) in [
            (
                Review::envoy_config(
                    "CREATE",
                    object("EnvoyConfig", "marin3r.3scale.net"),
                    Value::Null,
                ),
                &ENVOYCONFIG,
            ),
            (
                Review::envoy_deployment(
                    "CREATE",
                    object("EnvoyDeployment", "operator.marin3r.3scale.net"),
                    Value::Null,
                ),
                &ENVOYDEPLOYMENT,
            ),
        ] {
            let (out, verdict) = validate_as(&review.bytes(), what).unwrap();
            assert_eq!(verdict, Verdict::Denied, "{}", what.kind);
            let message = out.response.status.unwrap().message;
            assert!(message.contains("spec"), "{}: {message}", what.kind);
        }
    }

    #[test]
    fn an_object_that_is_not_a_map_is_denied() {
        let (out, verdict) = validate(
            &Review::envoy_config("CREATE", json!("x"), Value::Null)
                .uid("u-1")
                .bytes(),
        )
        .unwrap();
        assert_eq!(verdict, Verdict::Denied);
        assert!(!out.response.allowed);
    }
}
