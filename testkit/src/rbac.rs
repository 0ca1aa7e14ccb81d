//! The RBAC attributes Kubernetes authorizes an API request against, so that tests can
//! check a component's Role or ClusterRole table against the requests it really makes
//! (recorded from a mock API server). A request it cannot classify panics: in a test,
//! an unknown request is a failure.
#![allow(clippy::panic)]

use serde_json::Value;

/// One permission: `(API group, resource or resource/subresource, verb)`.
pub type Access = (String, String, String);

/// What a request path addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub group: String,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Parses an API path with its query (`/apis/apps/v1/namespaces/ns/deployments/d?…`).
/// Panics on anything else (a test helper).
pub fn parse(uri: &str) -> Target {
    let path = uri.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("not an API path: {uri}"),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    Target {
        group: group.to_string(),
        resource: rest
            .first()
            .unwrap_or_else(|| panic!("no resource: {uri}"))
            .to_string(),
        name: rest.get(1).map(|s| s.to_string()),
        subresource: rest.get(2).map(|s| s.to_string()),
    }
}

/// Whether the request is a watch (`?watch=true`).
pub fn is_watch(uri: &str) -> bool {
    uri.split(['?', '&']).any(|p| p == "watch=true")
}

/// The permissions a request (`method`, path with query, JSON body) needs: its verb on
/// its resource, plus `update` on the `finalizers` of every owner a body's
/// `blockOwnerDeletion` owner reference names (OwnerReferencesPermissionEnforcement;
/// plurals taken as `<lowercase kind>s`).
pub fn accesses(method: &str, uri: &str, body: &Value) -> Vec<Access> {
    let t = parse(uri);
    let verb = match (method, &t.name) {
        ("GET", None) if is_watch(uri) => "watch",
        ("GET", None) => "list",
        ("GET", Some(_)) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", None) => "deletecollection",
        ("DELETE", Some(_)) => "delete",
        (m, _) => panic!("unexpected method {m} {uri}"),
    };
    let resource = match &t.subresource {
        Some(sub) => format!("{}/{sub}", t.resource),
        None => t.resource.clone(),
    };
    let mut out = vec![(t.group.clone(), resource, verb.to_string())];
    for owner in body["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["blockOwnerDeletion"] == true)
    {
        let group = owner["apiVersion"]
            .as_str()
            .and_then(|v| v.rsplit_once('/'))
            .map(|(g, _)| g.to_string())
            .unwrap_or_default();
        let plural = format!(
            "{}s",
            owner["kind"].as_str().unwrap_or_default().to_lowercase()
        );
        out.push((group, format!("{plural}/finalizers"), "update".to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_map_to_their_permissions() {
        let a = |m, u| accesses(m, u, &Value::Null);
        let t = |g: &str, r: &str, v: &str| (g.to_string(), r.to_string(), v.to_string());
        assert_eq!(
            a("GET", "/api/v1/namespaces/d/secrets?watch=true&x=1"),
            [t("", "secrets", "watch")]
        );
        assert_eq!(
            a("GET", "/api/v1/secrets?limit=500"),
            [t("", "secrets", "list")]
        );
        assert_eq!(
            a("GET", "/apis/apps/v1/namespaces/d/deployments/x"),
            [t("apps", "deployments", "get")]
        );
        assert_eq!(
            a(
                "PATCH",
                "/apis/g.io/v1/namespaces/d/things/x/status?force=true"
            ),
            [t("g.io", "things/status", "patch")]
        );
        assert_eq!(
            a(
                "DELETE",
                "/apis/policy/v1/namespaces/d/poddisruptionbudgets/x"
            ),
            [t("policy", "poddisruptionbudgets", "delete")]
        );
        let owned = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "g.io/v1", "kind": "Thing", "blockOwnerDeletion": true},
            {"apiVersion": "g.io/v1", "kind": "Other"},
        ]}});
        assert_eq!(
            accesses("POST", "/api/v1/namespaces/d/secrets", &owned),
            [
                t("", "secrets", "create"),
                t("g.io", "things/finalizers", "update")
            ]
        );
    }
}
