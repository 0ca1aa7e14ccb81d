//! AdmissionReview v1 request bodies shaped like the ones the API server sends: the Pod
//! CREATE of the mutating (injection) path and the EnvoyConfig CREATE/UPDATE/DELETE of
//! the validating path. One shape for both; tests change single fields of the JSON to
//! build broken reviews.

use serde_json::{Value, json};

/// The `request.uid` unless [`Review::uid`] sets another.
pub const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

/// An AdmissionReview request under construction.
#[derive(Debug, Clone)]
pub struct Review {
    uid: String,
    operation: String,
    namespace: String,
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    resource: &'static str,
    object: Value,
    old_object: Value,
}

impl Review {
    /// The CREATE of `pod` in namespace `default` (what the mutating webhook receives).
    pub fn pod(pod: Value) -> Self {
        Self {
            uid: UID.to_string(),
            operation: "CREATE".to_string(),
            namespace: "default".to_string(),
            group: "",
            version: "v1",
            kind: "Pod",
            resource: "pods",
            object: pod,
            old_object: Value::Null,
        }
    }

    /// `operation` (`CREATE`, `UPDATE`, `DELETE`) of an EnvoyConfig in namespace
    /// `default`: `object` is the new object (null for DELETE), `old_object` the previous
    /// one (null for CREATE).
    pub fn envoy_config(operation: &str, object: Value, old_object: Value) -> Self {
        Self {
            uid: UID.to_string(),
            operation: operation.to_string(),
            namespace: "default".to_string(),
            group: "marin3r.3scale.net",
            version: "v1alpha1",
            kind: "EnvoyConfig",
            resource: "envoyconfigs",
            object,
            old_object,
        }
    }

    /// A CREATE/UPDATE/DELETE review of an `operator.marin3r.3scale.net/v1alpha1`
    /// EnvoyDeployment.
    pub fn envoy_deployment(operation: &str, object: Value, old_object: Value) -> Self {
        Self {
            group: "operator.marin3r.3scale.net",
            kind: "EnvoyDeployment",
            resource: "envoydeployments",
            ..Self::envoy_config(operation, object, old_object)
        }
    }

    /// Another `request.uid`.
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = uid.to_string();
        self
    }

    /// Another namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_string();
        self
    }

    /// The review as JSON.
    pub fn json(&self) -> Value {
        let kind = json!({"group": self.group, "version": self.version, "kind": self.kind});
        let resource =
            json!({"group": self.group, "version": self.version, "resource": self.resource});
        let options = match self.operation.as_str() {
            "CREATE" => "CreateOptions",
            "UPDATE" => "UpdateOptions",
            _ => "DeleteOptions",
        };
        let name = [&self.object, &self.old_object]
            .iter()
            .find_map(|o| o["metadata"]["name"].as_str())
            .unwrap_or_default()
            .to_string();
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": self.uid,
                "kind": kind,
                "resource": resource,
                "requestKind": kind,
                "requestResource": resource,
                "name": name,
                "namespace": self.namespace,
                "operation": self.operation,
                "userInfo": {
                    "username": "kubernetes-admin",
                    "groups": ["system:masters", "system:authenticated"]
                },
                "object": self.object,
                "oldObject": self.old_object,
                "dryRun": false,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": options}
            }
        })
    }

    /// The review as a JSON body.
    pub fn bytes(&self) -> Vec<u8> {
        self.json().to_string().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_review_shape() {
        let r = Review::pod(json!({"metadata": {"name": "p"}}))
            .uid("abc")
            .namespace("ns")
            .json();
        assert_eq!(r["request"]["uid"], "abc");
        assert_eq!(r["request"]["namespace"], "ns");
        assert_eq!(r["request"]["name"], "p");
        assert_eq!(r["request"]["kind"]["kind"], "Pod");
        assert_eq!(r["request"]["resource"]["resource"], "pods");
        assert_eq!(r["request"]["operation"], "CREATE");
        assert_eq!(r["request"]["options"]["kind"], "CreateOptions");
        assert!(r["request"]["oldObject"].is_null());
    }

    #[test]
    fn envoy_config_review_shape() {
        let old = json!({"metadata": {"name": "c"}});
        let r = Review::envoy_config("DELETE", Value::Null, old.clone()).json();
        assert_eq!(r["request"]["uid"], UID);
        assert_eq!(r["request"]["kind"]["group"], "marin3r.3scale.net");
        assert_eq!(r["request"]["requestResource"]["resource"], "envoyconfigs");
        assert_eq!(r["request"]["name"], "c");
        assert_eq!(r["request"]["oldObject"], old);
        assert_eq!(r["request"]["options"]["kind"], "DeleteOptions");
    }
}
