//! The EnvoyDeployment webhook denies, through its router, the specs `marin3r operator
//! render` refuses: one check (`marin3r_operator_api::EnvoyDeployment::validate`) for
//! both, so no EnvoyDeployment is admitted whose generated objects the API server would
//! reject ("Hostile input, round 3").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

mod common;

use marin3r_testkit::admission::Review;

fn envoy_deployment(name: &str, extra: Value) -> Value {
    let mut spec = json!({"discoveryServiceRef": "discoveryservice", "envoyConfigRef": "envoy"});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "EnvoyDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    })
}

async fn admit(object: Value) -> Value {
    common::admit_envoy_deployment(Review::envoy_deployment("CREATE", object, Value::Null)).await
}

#[tokio::test]
async fn the_specs_render_refuses_are_denied_naming_the_field() {
    let probe = json!({"initialDelaySeconds": 1, "timeoutSeconds": 1, "periodSeconds": 1,
        "successThreshold": 3, "failureThreshold": 1});
    let cases = [
        (
            envoy_deployment(&"e".repeat(64), json!({})),
            "metadata.name",
        ),
        (
            envoy_deployment(
                "e",
                json!({"replicas": {"dynamic": {"minReplicas": 0, "maxReplicas": 2}}}),
            ),
            "spec.replicas.dynamic.minReplicas",
        ),
        (
            envoy_deployment("e", json!({"livenessProbe": probe})),
            "spec.livenessProbe.successThreshold",
        ),
        (
            envoy_deployment("e", json!({"resources": {"limits": {"memory": "lots"}}})),
            "spec.resources.limits.memory",
        ),
        (
            envoy_deployment("e", json!({"resources": {"requests": {"memory": "-1Gi"}}})),
            "spec.resources.requests.memory",
        ),
        (
            envoy_deployment(
                "e",
                json!({"podDisruptionBudget": {"minAvailable": "1000%"}}),
            ),
            "spec.podDisruptionBudget.minAvailable",
        ),
        (
            envoy_deployment("e", json!({"podDisruptionBudget": {"maxUnavailable": -1}})),
            "spec.podDisruptionBudget.maxUnavailable",
        ),
        (
            envoy_deployment("e", json!({"image": "envoyproxy/envoy: v1.40.0"})),
            "spec.image",
        ),
        (
            envoy_deployment("e", json!({"duration": "1s"})),
            "spec.duration",
        ),
        (
            envoy_deployment("e", json!({"duration": "2562047h"})),
            "spec.duration",
        ),
        (
            envoy_deployment(
                "e",
                json!({"ports": [{"name": "a", "port": 8080}, {"name": "b", "port": 8080}]}),
            ),
            "spec.ports[1].port",
        ),
    ];
    for (object, field) in cases {
        let response = admit(object.clone()).await;
        assert_eq!(response["allowed"], false, "{object}: {response}");
        assert_eq!(response["status"]["code"], 400);
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("invalid EnvoyDeployment: ")
                && message.contains(&format!("{field}: ")),
            "{field}: {message}"
        );
    }
    // The neighbours at the bounds are allowed.
    let fine = envoy_deployment(
        &"e".repeat(63),
        json!({"replicas": {"dynamic": {"minReplicas": 1, "maxReplicas": 2}},
               "podDisruptionBudget": {"minAvailable": "100%"}, "duration": "1h"}),
    );
    assert_eq!(admit(fine).await["allowed"], true);
}
