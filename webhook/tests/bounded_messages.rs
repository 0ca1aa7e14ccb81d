//! Every request value the webhook echoes in an answer is bounded (`marin3r_wire::quote`,
//! the function the logs use too): a megabyte annotation, EnvoyConfig field or body field
//! gives a denial (or a 400 body) of a few KiB that still names the field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use axum::http::StatusCode;
use marin3r_wire::DOMAIN;
use serde_json::{Value, json};

mod common;

use marin3r_sidecar::annotations::keys;
use marin3r_testkit::admission::Review;
use marin3r_webhook::{MUTATE_PATH, VALIDATE_ENVOYCONFIG_PATH, VALIDATE_ENVOYDEPLOYMENT_PATH};

const MIB: usize = 1 << 20;
/// "A few KiB": what an answer quoting one huge value may weigh at most.
const SMALL: usize = 4 * 1024;

fn huge(c: char) -> String {
    c.to_string().repeat(MIB)
}

/// A 1 MiB value `key` refuses. Most refuse any long run of `X`; the free-text ones
/// (ids, extra args) need a control character or an open quote.
fn bad_value(key: &str) -> String {
    match key {
        keys::NODE_ID | keys::CLUSTER_ID => format!("{}\u{7}", huge('X')),
        keys::ENVOY_EXTRA_ARGS => format!("\"{}", huge('X')),
        _ => huge('X'),
    }
}

/// Posts a Pod review and returns the denial message.
async fn denial(annotations: Value) -> String {
    let mut pod = common::labelled_pod();
    for (k, v) in annotations.as_object().unwrap() {
        pod["metadata"]["annotations"][k] = v.clone();
    }
    let body = common::pod_review("u-1", pod).to_string().into_bytes();
    let (status, out) = common::post(common::state(), MUTATE_PATH, body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["response"]["allowed"], false, "{out}");
    out["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_megabyte_value_of_any_annotation_gives_a_small_denial_naming_it() {
    let mut echoed = 0;
    for key in keys::ALL {
        // The shutdown-manager annotations are read only when it is on.
        let mut annotations = json!({format!("{DOMAIN}/{key}"): bad_value(key)});
        if key.starts_with("shutdown-manager.") && *key != keys::SHTDN_ENABLED {
            annotations[format!("{DOMAIN}/{}", keys::SHTDN_ENABLED)] = json!("true");
        }
        let message = denial(annotations).await;
        assert!(
            message.len() <= SMALL,
            "{key}: a {} byte message: {}…",
            message.len(),
            &message[..200]
        );
        assert!(message.contains(&format!("{key}: ")), "{key}: {message}");
        if message.contains(&format!("… ({} bytes)", MIB)) {
            echoed += 1;
        }
    }
    // Most annotations quote the value they refuse: those quotes were cut, not dropped.
    assert!(echoed >= 20, "only {echoed} messages quote the cut value");

    // The status annotation the webhook writes, with a megabyte field name.
    let status = format!("{{\"{}\":[]}}", huge('x'));
    let message = denial(json!({marin3r_wire::SIDECAR_STATUS_ANNOTATION: status})).await;
    assert!(message.len() <= SMALL, "{} bytes", message.len());
    assert!(message.contains("sidecar-status: "), "{message}");

    // A megabyte annotation key with a value that is not a string.
    let mut pod = common::labelled_pod();
    pod["metadata"]["annotations"][huge('k')] = json!(1);
    let body = common::pod_review("u-1", pod).to_string().into_bytes();
    let (_, out) = common::post(common::state(), MUTATE_PATH, body).await;
    let message = out["response"]["status"]["message"].as_str().unwrap();
    assert!(message.len() <= SMALL, "{} bytes", message.len());
    assert!(message.contains("metadata.annotations["), "{message}");
}

#[tokio::test]
async fn a_list_annotation_with_many_bad_entries_lists_the_first_ones() {
    // 100 000 bad entries, each quoted: only the first few are, the rest counted.
    let entries = vec!["X"; 100_000].join(",");
    for key in [keys::PORTS, keys::HOST_PORT_MAPPINGS] {
        let message = denial(json!({format!("{DOMAIN}/{key}"): entries})).await;
        assert!(message.len() <= SMALL, "{key}: {} bytes", message.len());
        assert!(message.contains("(and 99990 more)"), "{key}: {message}");
    }
    let message = denial(json!({
        format!("{DOMAIN}/{}", keys::SHTDN_ENABLED): "true",
        format!("{DOMAIN}/{}", keys::SHTDN_HOOKS): (0..100_000).map(|i| format!("c{i}")).collect::<Vec<_>>().join(","),
    }))
    .await;
    assert!(message.len() <= SMALL, "{} bytes", message.len());
    assert!(message.contains("(and 99990 more)"), "{message}");
}

fn envoy_config(resources: Value) -> Value {
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"nodeID": "n", "resources": resources}
    })
}

async fn validation_denial(path: &str, review: Review) -> String {
    let (status, out) = common::post(common::state(), path, review.bytes()).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["response"]["allowed"], false, "{out}");
    out["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn an_envoyconfig_with_huge_bad_values_gives_a_small_denial_naming_the_path() {
    let name = huge('n');
    let field = huge('f');
    for (label, resources, names) in [
        (
            "a megabyte resource name",
            json!([{"type": "cluster", "value": {"name": name, "bogus": 1}}]),
            "spec.resources[0].value",
        ),
        (
            "a megabyte unknown field",
            json!([{"type": "cluster", "value": {"name": "a", field.as_str(): 1}}]),
            "spec.resources[0].value",
        ),
        (
            "a megabyte string where a duration goes",
            json!([{"type": "cluster", "value": {"name": "a", "connect_timeout": name}}]),
            "spec.resources[0].value",
        ),
    ] {
        let message = validation_denial(
            VALIDATE_ENVOYCONFIG_PATH,
            Review::envoy_config("CREATE", envoy_config(resources), Value::Null),
        )
        .await;
        assert!(message.len() <= SMALL, "{label}: {} bytes", message.len());
        assert!(message.contains(names), "{label}: {message}");
    }

    // 20 000 bad resources: the first errors are listed, the others counted.
    let many: Vec<Value> = (0..20_000)
        .map(|i| json!({"type": "cluster", "value": {"name": format!("c{i}"), "bogus": 1}}))
        .collect();
    let message = validation_denial(
        VALIDATE_ENVOYCONFIG_PATH,
        Review::envoy_config("CREATE", envoy_config(json!(many)), Value::Null),
    )
    .await;
    assert!(message.len() <= SMALL, "{} bytes", message.len());
    assert!(message.contains("(and 19990 more)"), "{message}");

    // An EnvoyDeployment with a megabyte string where a number goes.
    let deployment = json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "EnvoyDeployment",
        "metadata": {"name": "envoy", "namespace": "default"},
        "spec": {"discoveryServiceRef": "ds", "envoyConfigRef": "ec", "adminPort": name},
    });
    let message = validation_denial(
        VALIDATE_ENVOYDEPLOYMENT_PATH,
        Review::envoy_deployment("CREATE", deployment, Value::Null),
    )
    .await;
    assert!(message.len() <= SMALL, "{} bytes", message.len());
    assert!(message.contains("spec.adminPort"), "{message}");
}

#[tokio::test]
async fn a_bad_body_with_a_huge_field_gets_a_small_400() {
    for path in [MUTATE_PATH, VALIDATE_ENVOYCONFIG_PATH] {
        for body in [
            // Echoed by our own message.
            json!({"apiVersion": huge('v'), "kind": "AdmissionReview", "request": {"uid": "u"}}),
            // Echoed by the JSON decoder's error.
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"uid": "u", "kind": huge('k')}}),
        ] {
            let (status, out) =
                common::post(common::state(), path, body.to_string().into_bytes()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
            let error = out["error"].as_str().unwrap();
            assert!(
                error.len() <= 2 * SMALL + 64,
                "{path}: {} bytes",
                error.len()
            );
        }
    }
}
