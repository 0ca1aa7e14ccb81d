//! Pod Security Standards, `restricted` profile (Kubernetes 1.32), checked on a container
//! as JSON: what the API server's `restricted` admission would refuse, so that tests can
//! assert it on every container marin3r generates.

use serde_json::Value;

/// Volume types the `restricted` profile allows.
pub const RESTRICTED_VOLUME_TYPES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Why `container` (a Pod's container or init container) breaks the `restricted`
/// profile's securityContext rules, given the Pod's `spec.securityContext`
/// (`Value::Null` when it has none). Empty when it complies. Each reason names the
/// field. Host ports (baseline) are not checked here: injection adds them only when a
/// user asks for them (`host-port-mappings`).
pub fn container_violations(container: &Value, pod_security_context: &Value) -> Vec<String> {
    let name = container["name"].as_str().unwrap_or("?");
    let sc = &container["securityContext"];
    let pod = pod_security_context;
    let mut out = Vec::new();
    let mut fail = |field: &str, rule: &str| {
        out.push(format!("container {name}: securityContext.{field} {rule}"));
    };
    if sc["privileged"] == Value::Bool(true) {
        fail("privileged", "must not be true");
    }
    if sc["allowPrivilegeEscalation"] != Value::Bool(false) {
        fail("allowPrivilegeEscalation", "must be false");
    }
    let dropped = sc["capabilities"]["drop"]
        .as_array()
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !dropped {
        fail("capabilities.drop", "must include ALL");
    }
    let added_ok = sc["capabilities"]["add"]
        .as_array()
        .is_none_or(|a| a.iter().all(|c| c == "NET_BIND_SERVICE"));
    if !added_ok {
        fail("capabilities.add", "may only add NET_BIND_SERVICE");
    }
    let non_root = match &sc["runAsNonRoot"] {
        Value::Bool(b) => *b,
        _ => pod["runAsNonRoot"] == Value::Bool(true),
    };
    if !non_root {
        fail("runAsNonRoot", "must be true (on the container or the Pod)");
    }
    if sc["runAsUser"] == 0 || (sc["runAsUser"].is_null() && pod["runAsUser"] == 0) {
        fail("runAsUser", "must not be 0");
    }
    let seccomp = match sc["seccompProfile"]["type"].as_str() {
        Some(t) => Some(t),
        None => pod["seccompProfile"]["type"].as_str(),
    };
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        fail(
            "seccompProfile.type",
            "must be RuntimeDefault or Localhost (on the container or the Pod)",
        );
    }
    out
}

/// Why the volumes of a PodSpec break the `restricted` profile (a volume type outside
/// [`RESTRICTED_VOLUME_TYPES`]).
pub fn volume_violations(pod_spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for v in pod_spec["volumes"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("?");
        for key in v.as_object().into_iter().flat_map(|o| o.keys()) {
            if key != "name" && !RESTRICTED_VOLUME_TYPES.contains(&key.as_str()) {
                out.push(format!("volume {name}: type {key} is not allowed"));
            }
        }
    }
    out
}

/// Why a whole PodSpec breaks the `restricted` profile (its baseline part included):
/// every container's securityContext ([`container_violations`]), the volumes
/// ([`volume_violations`]), host namespaces and host ports. For pod templates of
/// Deployments and the like, where no host port is expected.
pub fn pod_violations(pod_spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod_spec[key] == Value::Bool(true) {
            out.push(format!("spec.{key} must not be true"));
        }
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in pod_spec[list].as_array().into_iter().flatten() {
            out.extend(container_violations(c, &pod_spec["securityContext"]));
            for p in c["ports"].as_array().into_iter().flatten() {
                if p["hostPort"].as_i64().is_some_and(|hp| hp != 0) {
                    let name = c["name"].as_str().unwrap_or("?");
                    out.push(format!(
                        "container {name}: ports.hostPort must be unset or 0"
                    ));
                }
            }
        }
    }
    out.extend(volume_violations(pod_spec));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compliant() -> Value {
        json!({
            "name": "c",
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": true,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        })
    }

    #[test]
    fn a_compliant_container_passes_and_each_breach_is_named() {
        assert_eq!(
            container_violations(&compliant(), &Value::Null),
            Vec::<String>::new()
        );
        let breaches: [(&[&str], Value, &str); 6] = [
            (
                &["allowPrivilegeEscalation"],
                json!(true),
                "allowPrivilegeEscalation",
            ),
            (
                &["capabilities", "drop"],
                json!(["NET_RAW"]),
                "capabilities.drop",
            ),
            (&["privileged"], json!(true), "privileged"),
            (&["runAsNonRoot"], json!(false), "runAsNonRoot"),
            (
                &["seccompProfile", "type"],
                json!("Unconfined"),
                "seccompProfile",
            ),
            (&["runAsUser"], json!(0), "runAsUser"),
        ];
        for (path, value, field) in breaches {
            let mut c = compliant();
            let mut at = &mut c["securityContext"];
            for key in path {
                at = &mut at[*key];
            }
            *at = value;
            let v = container_violations(&c, &Value::Null);
            assert_eq!(v.len(), 1, "{path:?}: {v:?}");
            assert!(v[0].contains(field), "{v:?}");
        }
        // The Pod's securityContext counts where the container sets nothing.
        let bare = json!({"name": "c", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}});
        assert_eq!(container_violations(&bare, &Value::Null).len(), 2);
        let pod = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
        assert!(container_violations(&bare, &pod).is_empty());
    }

    #[test]
    fn a_pod_spec_is_checked_whole() {
        let spec = json!({"containers": [compliant()], "initContainers": [compliant()]});
        assert_eq!(pod_violations(&spec), Vec::<String>::new());
        let mut bad = spec.clone();
        bad["hostNetwork"] = json!(true);
        bad["initContainers"][0]["securityContext"]["runAsUser"] = json!(0);
        bad["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}]);
        bad["volumes"] = json!([{"name": "h", "hostPath": {"path": "/"}}]);
        assert_eq!(pod_violations(&bad).len(), 4, "{:?}", pod_violations(&bad));
    }

    #[test]
    fn only_restricted_volume_types_pass() {
        let spec = json!({"volumes": [
            {"name": "a", "secret": {"secretName": "s"}},
            {"name": "b", "emptyDir": {}},
            {"name": "c", "hostPath": {"path": "/"}},
        ]});
        assert_eq!(
            volume_violations(&spec),
            ["volume c: type hostPath is not allowed"]
        );
    }
}
