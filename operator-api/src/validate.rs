//! Validation results: every problem of a spec with its JSON path and the rule it breaks.
//!
//! The rules that the CRD schemas also enforce (CEL and OpenAPI) are reported with the same
//! wording, so the EnvoyDeployment webhook (operator-design.md §5.8), `marin3r operator
//! render` and the API server agree. `validate()` adds checks a schema cannot express well
//! (Go durations, uniqueness with a readable message), and every rule the API server
//! applies to the objects generated from a spec (names and label values derived from
//! `metadata.name`, port collisions, HPA, probe, quantity and PodDisruptionBudget
//! values, image references), so that no spec that validates gives an object the API
//! server rejects or a container that cannot start.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PodSecurityContext, ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use marin3r_sidecar::validate::{Quantity, image, quantity};
use serde_json::Value;

use crate::Error;

/// Shortest certificate lifetime a DiscoveryService or EnvoyDeployment may ask for
/// (`pkiConfg.*.duration`, `spec.duration`): 1 h, cert-manager's minimum. Renewal runs at
/// 80% of the lifetime; a shorter one would keep the operator reissuing.
pub const MIN_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(3600);
/// Longest certificate lifetime: 100 years (876000h).
pub const MAX_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(876_000 * 3600);

/// A certificate lifetime (a Go duration) for `field`: it must parse and lie within
/// [`MIN_CERTIFICATE_LIFETIME`]–[`MAX_CERTIFICATE_LIFETIME`]. The getters
/// (`root_certificate_authority`, `server_certificate`, `client_certificate_duration`)
/// and `validate()` both use it.
pub fn certificate_lifetime(field: &str, value: &str) -> Result<Duration, Error> {
    let d = crate::parse_go_duration(field, value)?;
    let problem = if d < MIN_CERTIFICATE_LIFETIME {
        format!("certificate lifetime {value:?} is shorter than the minimum 1h")
    } else if d > MAX_CERTIFICATE_LIFETIME {
        format!("certificate lifetime {value:?} is longer than the maximum 876000h (100 years)")
    } else {
        return Ok(d);
    };
    Err(Error::Invalid(vec![FieldError {
        path: field.to_string(),
        rule: Rule::Range,
        message: problem,
    }]))
}

/// Fields of `input` (a manifest as written) that decoding dropped: every path present in
/// `input` and absent from `decoded` (the decoded object serialised again), as
/// `unknown field` errors. A `null` value counts as absent. What the API server's strict
/// field validation reports for a structural schema; `marin3r operator render` refuses
/// them rather than ignoring them.
pub fn unknown_fields(input: &Value, decoded: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    walk_unknown(input, decoded, "", &mut out);
    out
}

fn walk_unknown(input: &Value, decoded: &Value, path: &str, out: &mut Vec<FieldError>) {
    match (input, decoded) {
        (Value::Object(given), Value::Object(kept)) => {
            for (key, value) in given {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match kept.get(key) {
                    _ if value.is_null() => {}
                    Some(k) => walk_unknown(value, k, &at, out),
                    None => out.push(FieldError {
                        path: at,
                        rule: Rule::Unknown,
                        message: "unknown field".into(),
                    }),
                }
            }
        }
        (Value::Array(given), Value::Array(kept)) => {
            for (i, (value, k)) in given.iter().zip(kept).enumerate() {
                walk_unknown(value, k, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The kind of rule a field breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Two fields that must not be set together (`static` and `dynamic`).
    MutuallyExclusive,
    /// Exactly one of several fields must be set (`selfSigned` or `caSigned`).
    ExactlyOne,
    /// A number outside its allowed range.
    Range,
    /// A string outside its allowed values.
    Enum,
    /// A list key that appears twice.
    Unique,
    /// A Go duration that does not parse.
    Duration,
    /// A required value that is missing or empty.
    Required,
    /// Two values in the wrong order (`minReplicas` > `maxReplicas`).
    Order,
    /// A string that is not well-formed (e.g. a port name).
    Format,
    /// A field the type does not have (a typo such as `replicas.statik`).
    Unknown,
}

impl Rule {
    /// Stable name of the rule (for logs, metrics and tests).
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::MutuallyExclusive => "mutually-exclusive",
            Rule::ExactlyOne => "exactly-one",
            Rule::Range => "range",
            Rule::Enum => "enum",
            Rule::Unique => "unique",
            Rule::Duration => "duration",
            Rule::Required => "required",
            Rule::Order => "order",
            Rule::Format => "format",
            Rule::Unknown => "unknown-field",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found by `validate()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the offending field, e.g. `spec.replicas` or `spec.ports[1].port`.
    pub path: String,
    /// The rule it breaks.
    pub rule: Rule,
    /// A human-readable explanation.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// `a; b; c`, the display of [`Error::Invalid`].
pub(crate) fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Collects [`FieldError`]s.
#[derive(Debug, Default)]
pub(crate) struct Errors(pub(crate) Vec<FieldError>);

impl Errors {
    pub(crate) fn push(&mut self, path: impl Into<String>, rule: Rule, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            rule,
            message: message.into(),
        });
    }

    /// A port must be in 1–65535 (the schema's `minimum`/`maximum`).
    pub(crate) fn port(&mut self, path: impl Into<String>, value: Option<i32>) {
        if let Some(v) = value
            && !(1..=65535).contains(&v)
        {
            self.push(path, Rule::Range, format!("port {v} is outside 1-65535"));
        }
    }

    /// A number must be at least `min`.
    pub(crate) fn at_least(&mut self, path: impl Into<String>, value: Option<i64>, min: i64) {
        if let Some(v) = value
            && v < min
        {
            self.push(path, Rule::Range, format!("{v} is less than {min}"));
        }
    }

    /// A certificate lifetime must parse and be within the bounds
    /// ([`certificate_lifetime`]).
    pub(crate) fn certificate_lifetime(&mut self, path: &str, value: Option<&str>) {
        if let Some(v) = value {
            match certificate_lifetime(path, v) {
                Ok(_) => {}
                Err(Error::Duration { reason, .. }) => self.push(
                    path,
                    Rule::Duration,
                    format!("invalid duration {v:?}: {reason}"),
                ),
                Err(Error::Invalid(errors)) => self.0.extend(errors),
                Err(other) => self.push(path, Rule::Duration, other.to_string()),
            }
        }
    }

    /// The securityContext fields a spec sets over the generated ones
    /// (`spec.podSecurityContext`, `spec.securityContext`), as the API server checks the
    /// merged result: user and group IDs in 0–2147483647, and no `privileged: true` or
    /// added `CAP_SYS_ADMIN` while `allowPrivilegeEscalation` stays false (the generated
    /// value: set it to true as well).
    pub(crate) fn security_contexts(
        &mut self,
        pod: Option<&PodSecurityContext>,
        container: Option<&SecurityContext>,
    ) {
        let mut id = |path: &str, value: Option<i64>| {
            if let Some(v) = value
                && !(0..=i64::from(i32::MAX)).contains(&v)
            {
                self.push(
                    path,
                    Rule::Range,
                    format!("{v} must be between 0 and 2147483647, inclusive"),
                );
            }
        };
        if let Some(p) = pod {
            id("spec.podSecurityContext.runAsUser", p.run_as_user);
            id("spec.podSecurityContext.runAsGroup", p.run_as_group);
            id("spec.podSecurityContext.fsGroup", p.fs_group);
            for (i, g) in p.supplemental_groups.iter().flatten().enumerate() {
                id(
                    &format!("spec.podSecurityContext.supplementalGroups[{i}]"),
                    Some(*g),
                );
            }
        }
        let Some(c) = container else {
            return;
        };
        id("spec.securityContext.runAsUser", c.run_as_user);
        id("spec.securityContext.runAsGroup", c.run_as_group);
        if c.allow_privilege_escalation == Some(true) {
            return;
        }
        if c.privileged == Some(true) {
            self.push(
                "spec.securityContext.privileged",
                Rule::MutuallyExclusive,
                "cannot set `allowPrivilegeEscalation` to false and `privileged` to true: the generated securityContext sets allowPrivilegeEscalation false, set it to true as well",
            );
        }
        let adds = c.capabilities.as_ref().and_then(|c| c.add.as_ref());
        if adds.is_some_and(|a| a.iter().any(|c| c == "CAP_SYS_ADMIN")) {
            self.push(
                "spec.securityContext.capabilities.add",
                Rule::MutuallyExclusive,
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.add` CAP_SYS_ADMIN: the generated securityContext sets allowPrivilegeEscalation false, set it to true as well",
            );
        }
    }

    /// An image reference (when set and not empty: empty means the default image) must
    /// be one a container runtime can pull (the sidecar annotations' rule).
    pub(crate) fn image(&mut self, path: &str, value: Option<&str>) {
        if let Some(v) = value.filter(|v| !v.is_empty())
            && let Err(why) = image(v)
        {
            self.push(path, Rule::Format, why);
        }
    }

    /// `metadata.name` (required, a DNS-1123 subdomain as every object name) and
    /// `metadata.namespace` (when given, a DNS-1123 label).
    pub(crate) fn object_meta(&mut self, meta: &ObjectMeta) {
        match meta.name.as_deref() {
            None | Some("") => self.push("metadata.name", Rule::Required, "must not be empty"),
            Some(name) => {
                if let Err(why) = marin3r_wire::dns1123_subdomain(name) {
                    self.push("metadata.name", Rule::Format, why);
                }
            }
        }
        if let Some(ns) = marin3r_wire::given_namespace(meta.namespace.as_deref())
            && let Err(why) = marin3r_wire::dns1123_label(ns)
        {
            self.push("metadata.namespace", Rule::Format, why);
        }
    }

    /// A container's `resources`: every resource name standard (`cpu`, `memory`,
    /// `ephemeral-storage`, `hugepages-<size>`) or domain-qualified, every quantity a
    /// valid non-negative Kubernetes quantity, and no request above its limit (the API
    /// server's rules).
    pub(crate) fn resources(&mut self, path: &str, value: Option<&ResourceRequirements>) {
        let Some(r) = value else { return };
        let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
        let mut requests: Vec<(&str, Quantity)> = Vec::new();
        for (kind, map) in [("limits", &r.limits), ("requests", &r.requests)] {
            for (name, q) in map.iter().flatten() {
                let at = format!("{path}.{kind}.{name}");
                if let Err(why) = resource_name(name) {
                    self.push(&at, Rule::Format, why);
                }
                match quantity(&q.0) {
                    Ok(parsed) if kind == "limits" => {
                        limits.insert(name, parsed);
                    }
                    Ok(parsed) => requests.push((name, parsed)),
                    Err(why) => self.push(at, Rule::Format, why),
                }
            }
        }
        for (name, request) in requests {
            if let Some(limit) = limits.get(name)
                && request > *limit
            {
                self.push(
                    format!("{path}.requests.{name}"),
                    Rule::Order,
                    format!(
                        "request {} is greater than the limit {}",
                        request.text, limit.text
                    ),
                );
            }
        }
    }

    /// A PodDisruptionBudget's `minAvailable` / `maxUnavailable`: an integer ≥ 0 or a
    /// percentage `0%`–`100%`.
    pub(crate) fn int_or_percent(&mut self, path: &str, value: Option<&IntOrString>) {
        match value {
            Some(IntOrString::Int(n)) if *n < 0 => {
                self.push(path, Rule::Range, format!("{n} is less than 0"));
            }
            Some(IntOrString::String(s)) => {
                let percent = s
                    .strip_suffix('%')
                    .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
                match percent.map(|d| d.trim_start_matches('0')) {
                    None => self.push(
                        path,
                        Rule::Format,
                        format!("{s:?} is neither an integer nor a percentage such as 25%"),
                    ),
                    Some(d) if d.len() > 3 || d.parse::<u32>().is_ok_and(|p| p > 100) => {
                        self.push(path, Rule::Range, format!("{s:?} is more than 100%"))
                    }
                    Some(_) => {}
                }
            }
            _ => {}
        }
    }

    /// Each of `ports` (`(path, number)`) must differ from every one before it: they are
    /// ports of one container or of one Service. The later one is reported.
    pub(crate) fn distinct_ports(&mut self, ports: &[(&str, i32)]) {
        for (i, (path, port)) in ports.iter().enumerate() {
            if let Some((first, _)) = ports[..i].iter().find(|(_, p)| p == port) {
                self.push(
                    *path,
                    Rule::Unique,
                    format!("port {port} is already used by {first}"),
                );
            }
        }
    }

    /// A required string must be non-empty.
    pub(crate) fn non_empty(&mut self, path: impl Into<String>, value: &str) {
        if value.trim().is_empty() {
            self.push(path, Rule::Required, "must not be empty");
        }
    }

    pub(crate) fn into_result(self) -> Result<(), Error> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(self.0))
        }
    }
}

/// A container resource name: a standard one (`cpu`, `memory`, `ephemeral-storage`,
/// `hugepages-<size>`) or a domain-qualified extended resource (`example.com/gpu`).
fn resource_name(name: &str) -> Result<(), String> {
    if matches!(name, "cpu" | "memory" | "ephemeral-storage")
        || name
            .strip_prefix("hugepages-")
            .is_some_and(|size| quantity(size).is_ok())
    {
        return Ok(());
    }
    let qualified = name.split_once('/').is_some_and(|(prefix, rest)| {
        marin3r_wire::is_dns1123_subdomain(prefix)
            && !rest.is_empty()
            && rest.len() <= 63
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && rest.as_bytes()[0].is_ascii_alphanumeric()
            && rest.as_bytes()[rest.len() - 1].is_ascii_alphanumeric()
    });
    if qualified {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a resource name (cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified name)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_fields_are_the_paths_decoding_dropped() {
        let input = json!({"spec": {"replicas": {"statik": 2}, "ports": [{"name": "a", "nmae": "b"}],
            "image": null}, "metadata": {"name": "x"}});
        let decoded =
            json!({"spec": {"replicas": {}, "ports": [{"name": "a"}]}, "metadata": {"name": "x"}});
        let paths: Vec<(String, Rule)> = unknown_fields(&input, &decoded)
            .into_iter()
            .map(|e| (e.path, e.rule))
            .collect();
        assert_eq!(
            paths,
            [
                ("spec.ports[0].nmae".to_string(), Rule::Unknown),
                ("spec.replicas.statik".to_string(), Rule::Unknown),
            ]
        );
        assert!(unknown_fields(&decoded, &decoded).is_empty());
    }

    #[test]
    fn certificate_lifetime_bounds_are_inclusive() {
        assert_eq!(
            certificate_lifetime("f", "1h"),
            Ok(MIN_CERTIFICATE_LIFETIME)
        );
        assert_eq!(
            certificate_lifetime("f", "876000h"),
            Ok(MAX_CERTIFICATE_LIFETIME)
        );
        assert!(certificate_lifetime("f", "3599s").is_err());
        assert!(certificate_lifetime("f", "876000h1s").is_err());
    }
}
