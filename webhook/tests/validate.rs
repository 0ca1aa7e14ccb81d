//! The EnvoyConfig validating webhook through the router (`oneshot`), as the API server
//! calls it: CREATE and UPDATE are decoded like `marin3r validate`, every error listed
//! with its path in one denial; other kinds, DELETE and bad bodies as documented.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

mod common;

use common::{admit_envoy_deployment, state};
use marin3r_testkit::admission::{Review, UID};
use marin3r_webhook::server::{VALIDATION_WAIT, ValidationSlots};
use marin3r_webhook::{AppState, MAX_BODY_BYTES, VALIDATE_ENVOYCONFIG_PATH};

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoyconfig")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

async fn post_to(state: Arc<AppState>, body: Vec<u8>) -> (StatusCode, Value) {
    common::post(state, VALIDATE_ENVOYCONFIG_PATH, body).await
}

/// Posts a review and returns its `response`, checking the envelope.
async fn admit(state: Arc<AppState>, review: &Value) -> Value {
    let (status, out) = post_to(state, serde_json::to_vec(review).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(out["response"]["uid"], UID);
    out["response"].clone()
}

fn allowed() -> Value {
    json!({"uid": UID, "allowed": true})
}

/// A config with one problem of each sort, at known paths.
fn broken() -> Value {
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "kuard", "namespace": "default"},
        "spec": {
            "nodeID": "kuard",
            "resources": [
                {"type": "listener", "value": {"name": "https", "filter_chains": [{"bogus": 1}]}},
                {"type": "listener", "value": {"name": "other", "filter_chains": [{"filters": [
                    {"name": "x", "typed_config": {"@type": "type.googleapis.com/foo.Bar"}}
                ]}]}},
                // A Secret the stateless webhook cannot see: not an error.
                {"type": "secret", "generateFromTlsSecret": "in-the-cluster"},
                {"type": "cluster"},
                {"type": "cluster", "value": {"name": "kuard", "connect_timeout": "2 seconds"}},
                {"type": "route", "value": {"virtual_hosts": []}},
                {"type": "cluster", "value": {"name": "echo", "connect_timeout": "1s"}},
                {"type": "cluster", "value": {"name": "echo"}}
            ]
        }
    })
}

const BROKEN_MESSAGE: &str = concat!(
    "invalid EnvoyConfig: ",
    r#"listener "https": spec.resources[0].value.filter_chains[0]: unknown field "bogus"; "#,
    r#"listener "other": spec.resources[1].value.filter_chains[0].filters[0].typed_config: unknown type URL type.googleapis.com/foo.Bar; "#,
    "spec.resources[3].value: type cluster needs value; ",
    r#"cluster "kuard": spec.resources[4].value.connect_timeout: "#,
);

#[tokio::test]
async fn kuard_walkthrough_config_is_allowed() {
    // generateFromTlsSecret names a Secret the webhook cannot read: still allowed.
    let config = fixture("kuard_tls.yaml");
    let response = admit(
        state(),
        &Review::envoy_config("CREATE", config, Value::Null).json(),
    )
    .await;
    assert_eq!(response, allowed());
}

#[tokio::test]
async fn deprecated_envoy_resources_form_is_allowed() {
    let config = fixture("kuard_tls_deprecated.yaml");
    assert!(config["spec"]["envoyResources"].is_object());
    let response = admit(
        state(),
        &Review::envoy_config("CREATE", config.clone(), Value::Null).json(),
    )
    .await;
    assert_eq!(response, allowed());

    // The strings of the deprecated form are decoded too.
    let mut bad = config;
    bad["spec"]["envoyResources"]["clusters"][0]["value"] = json!("name: kuard\nbogus: 1\n");
    let response = admit(
        state(),
        &Review::envoy_config("CREATE", bad, Value::Null).json(),
    )
    .await;
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["status"]["message"],
        r#"invalid EnvoyConfig: cluster "kuard": spec.envoyResources.clusters[0].value: unknown field "bogus""#
    );
}

#[tokio::test]
async fn broken_config_is_denied_with_every_error() {
    let response = admit(
        state(),
        &Review::envoy_config("CREATE", broken(), Value::Null).json(),
    )
    .await;
    assert_eq!(response["allowed"], false);
    let status = &response["status"];
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["code"], 400);
    assert_eq!(status["reason"], "BadRequest");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(BROKEN_MESSAGE),
        "got  {message:?}\nwant {BROKEN_MESSAGE:?}…"
    );
    // One entry per problem, in spec order, each with its path; the missing Secret is
    // not among them.
    let errors: Vec<&str> = message
        .trim_start_matches("invalid EnvoyConfig: ")
        .split("; ")
        .collect();
    assert_eq!(errors.len(), 6, "{errors:#?}");
    for (error, path) in errors.iter().zip([
        "spec.resources[0].value",
        "spec.resources[1].value",
        "spec.resources[3].value",
        "spec.resources[4].value",
        "spec.resources[5].value",
        "spec.resources[7].value",
    ]) {
        assert!(error.contains(path), "{error:?} should name {path}");
    }
    assert!(errors[4].contains("missing resource name"), "{errors:#?}");
    assert!(
        errors[5].ends_with(r#"duplicate cluster name "echo" (first at spec.resources[6].value)"#),
        "{errors:#?}"
    );
    assert!(!message.contains("in-the-cluster"), "{message}");
}

#[tokio::test]
async fn schema_errors_are_denied_with_their_path() {
    let mut wrong_blueprint = fixture("kuard_tls.yaml");
    wrong_blueprint["spec"]["resources"][0]["blueprint"] = json!("certificate");
    let response = admit(
        state(),
        &Review::envoy_config("CREATE", wrong_blueprint, Value::Null).json(),
    )
    .await;
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "invalid EnvoyConfig: spec.resources[0].blueprint: unknown variant `certificate`"
        ),
        "{message}"
    );

    let mut both = fixture("kuard_tls.yaml");
    both["spec"]["envoyResources"] = json!({});
    let response = admit(
        state(),
        &Review::envoy_config("CREATE", both, Value::Null).json(),
    )
    .await;
    assert_eq!(
        response["status"]["message"],
        "invalid EnvoyConfig: spec: set either resources or the deprecated envoyResources, not both"
    );

    let not_a_map = admit(
        state(),
        &Review::envoy_config("CREATE", json!("kuard"), Value::Null).json(),
    )
    .await;
    assert_eq!(not_a_map["allowed"], false);
    assert_eq!(not_a_map["status"]["code"], 400);
}

#[tokio::test]
async fn update_is_validated() {
    let good = fixture("kuard_tls.yaml");

    // A valid config turned invalid: denied.
    let response = admit(
        state(),
        &Review::envoy_config("UPDATE", broken(), good.clone()).json(),
    )
    .await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with(BROKEN_MESSAGE)
    );

    // An invalid config fixed: allowed.
    let response = admit(
        state(),
        &Review::envoy_config("UPDATE", good.clone(), broken()).json(),
    )
    .await;
    assert_eq!(response, allowed());

    // A valid change: allowed.
    let mut changed = good.clone();
    changed["spec"]["resources"][1]["value"]["connect_timeout"] = json!("5s");
    let response = admit(
        state(),
        &Review::envoy_config("UPDATE", changed, good).json(),
    )
    .await;
    assert_eq!(response, allowed());

    // Metadata-only UPDATE of a config stored before the webhook (finalizer removal,
    // labels): the unchanged spec is not re-validated, so it is never blocked.
    let mut finalizer_removed = broken();
    finalizer_removed["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    let mut stored = broken();
    stored["metadata"]["finalizers"] = json!(["marin3r.3scale.net/finalizer"]);
    let response = admit(
        state(),
        &Review::envoy_config("UPDATE", finalizer_removed, stored).json(),
    )
    .await;
    assert_eq!(response, allowed());
}

#[tokio::test]
async fn delete_and_other_kinds_are_allowed() {
    let response = admit(
        state(),
        &Review::envoy_config("DELETE", Value::Null, broken()).json(),
    )
    .await;
    assert_eq!(response, allowed());

    // Another kind sent to this path (a misconfigured rule): allowed unchanged.
    for kind in [
        json!({"group": "", "version": "v1", "kind": "Pod"}),
        json!({"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfigRevision"}),
    ] {
        let mut r =
            Review::envoy_config("CREATE", json!({"metadata": {"name": "x"}}), Value::Null).json();
        r["request"]["kind"] = kind;
        let response = admit(state(), &r).await;
        assert_eq!(response, allowed());
    }

    // The status subresource is not validated.
    let mut status = Review::envoy_config("UPDATE", broken(), fixture("kuard_tls.yaml")).json();
    status["request"]["subResource"] = json!("status");
    let response = admit(state(), &status).await;
    assert_eq!(response, allowed());
}

#[tokio::test]
async fn bad_bodies_get_400_with_a_json_error() {
    let huge = {
        let mut r = Review::envoy_config("CREATE", fixture("kuard_tls.yaml"), Value::Null).json();
        r["request"]["object"]["metadata"]["annotations"] =
            json!({"x": "a".repeat(MAX_BODY_BYTES)});
        serde_json::to_vec(&r).unwrap()
    };
    let mut wrong_version =
        Review::envoy_config("CREATE", fixture("kuard_tls.yaml"), Value::Null).json();
    wrong_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_uid = Review::envoy_config("CREATE", fixture("kuard_tls.yaml"), Value::Null).json();
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage",
            b"\x00\xffnot json at all".to_vec(),
            "not an AdmissionReview",
        ),
        ("empty", Vec::new(), "not an AdmissionReview"),
        (
            "wrong apiVersion",
            serde_json::to_vec(&wrong_version).unwrap(),
            "expected apiVersion",
        ),
        (
            "missing uid",
            serde_json::to_vec(&no_uid).unwrap(),
            "request.uid is missing",
        ),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "has no request",
        ),
        ("huge body", huge, "exceeds"),
    ];
    for (name, body, msg) in cases {
        let (status, v) = post_to(state(), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}");
        assert_eq!(v["code"], 400, "{name}");
        let err = v["error"].as_str().unwrap_or_default();
        assert!(err.contains(msg), "{name}: {err:?} should contain {msg:?}");
    }
}

#[tokio::test]
async fn validations_are_counted() {
    let state = state();
    let good = fixture("kuard_tls.yaml");
    admit(
        state.clone(),
        &Review::envoy_config("CREATE", good.clone(), Value::Null).json(),
    )
    .await;
    admit(
        state.clone(),
        &Review::envoy_config("UPDATE", good.clone(), good.clone()).json(),
    )
    .await;
    admit(
        state.clone(),
        &Review::envoy_config("CREATE", broken(), Value::Null).json(),
    )
    .await;
    admit(
        state.clone(),
        &Review::envoy_config("DELETE", Value::Null, good).json(),
    )
    .await;
    let (status, _) = post_to(state.clone(), b"nope".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let text = state.metrics.encode().unwrap();
    for line in [
        r#"marin3r_webhook_validations_total{result="allowed"} 1"#,
        r#"marin3r_webhook_validations_total{result="denied"} 1"#,
        r#"marin3r_webhook_validations_total{result="skipped"} 2"#,
        r#"marin3r_webhook_validations_total{result="bad_request"} 1"#,
        "marin3r_webhook_validation_duration_seconds_count 5",
        // The Pod path's metrics are untouched.
        r#"marin3r_webhook_requests_total{result="bad_request"} 0"#,
        r#"marin3r_webhook_requests_total{result="denied"} 0"#,
        r#"marin3r_webhook_denials_total{reason="invalid_annotations"} 0"#,
        "marin3r_webhook_request_duration_seconds_count 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

/// `marin3r validate` (`validate_file`) and the webhook give the same verdict on what
/// Envoy 1.40 reads beyond protojson (an empty `Any`, cncf/xds types, lower-case enums,
/// one value for a list, `{seconds}` durations), on each one's negative twin, and on
/// upstream MARIN3R's example EnvoyConfigs.
#[tokio::test]
async fn same_verdicts_as_marin3r_validate() {
    let lua = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua";
    let typed_struct = |value: Value| {
        json!({"type": "listener", "value": {"name": "l",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "h", "route_config": {"name": "r"},
                    "http_filters": [{"name": "envoy.filters.http.lua", "typed_config": {
                        "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
                        "type_url": lua, "value": value}}]}}]}]}})
    };
    let route = |config: Value| {
        json!({"type": "route", "value": {"name": "r", "virtual_hosts": [{"name": "v",
            "domains": ["*"], "routes": [{"match": {"prefix": "/"},
            "direct_response": {"status": 200},
            "typed_per_filter_config": {"envoy.filters.http.lua": {
                "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                "config": config}}}]}]}})
    };
    let cluster = |extra: Value| {
        let mut c = json!({"name": "c"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        json!({"type": "cluster", "value": c})
    };
    let tcp = |filters: Value| {
        json!({"type": "listener", "value": {"name": "t",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10001}},
            "filter_chains": {"filters": filters}}})
    };
    let tcp_proxy = json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": "t", "cluster": "c"}});
    let cases = [
        ("empty Any", route(json!({})), true),
        (
            "Any without @type",
            route(json!({"source_code": "x"})),
            false,
        ),
        (
            "TypedStruct",
            typed_struct(json!({"default_source_code": {"inline_string": "x"}})),
            true,
        ),
        (
            "TypedStruct, bad value",
            typed_struct(json!({"bogus": 1})),
            false,
        ),
        (
            "lower-case enums",
            cluster(json!({"type": "strict_dns", "lb_policy": "round_robin"})),
            true,
        ),
        (
            "unknown enum",
            cluster(json!({"lb_policy": "round_robbin"})),
            false,
        ),
        ("one value for a list", tcp(tcp_proxy.clone()), true),
        ("one bad value for a list", tcp(json!({"nme": "x"})), false),
        (
            "duration object",
            cluster(json!({"connect_timeout": {"seconds": 5}})),
            true,
        ),
        (
            "bad duration object",
            cluster(json!({"connect_timeout": {"seconds": 5, "minutes": 1}})),
            false,
        ),
    ];
    for (label, resource, expected) in cases {
        let config = json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": "kuard", "namespace": "default"},
            "spec": {"nodeID": "kuard", "resources": [resource]}
        });
        let cli = marin3r_envoyconfig::envoyconfig::validate_file(&config.to_string());
        assert_eq!(cli.is_ok(), expected, "{label}: {cli:?}");
        let response = admit(
            state(),
            &Review::envoy_config("CREATE", config, Value::Null).json(),
        )
        .await;
        assert_eq!(response["allowed"] == true, expected, "{label}: {response}");
    }

    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoyconfig/tests/corpus/marin3r");
    let mut files = 0;
    for entry in std::fs::read_dir(corpus).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let cli = marin3r_envoyconfig::envoyconfig::validate_file(&text).is_ok();
        for doc in marin3r_envoyconfig::manifest::documents(&text).unwrap() {
            if doc["kind"] != "EnvoyConfig" {
                continue;
            }
            files += 1;
            let response = admit(
                state(),
                &Review::envoy_config("CREATE", doc, Value::Null).json(),
            )
            .await;
            assert_eq!(response["allowed"] == true, cli, "{response}");
        }
    }
    assert!(files >= 7);
}

fn state_with_slots(slots: usize, queue: usize, wait: Duration) -> Arc<AppState> {
    Arc::new(AppState::with_validation_slots(
        marin3r_sidecar::Defaults::default(),
        Arc::new(marin3r_webhook::metrics::Metrics::new()),
        ValidationSlots::new(slots, queue, wait),
    ))
}

/// Yields until `n` validations wait for a slot (no clock); panics if they never do.
async fn until_waiting(state: &AppState, n: usize) {
    for _ in 0..100_000 {
        if state.validation_slots.waiting() == n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "{} validations wait for a slot, not {n}",
        state.validation_slots.waiting()
    );
}

/// Starts `n` validations of `config` that will wait for a slot, one after the other.
async fn queue_validations(
    state: &Arc<AppState>,
    config: &Value,
    n: usize,
) -> Vec<tokio::task::JoinHandle<(StatusCode, Value)>> {
    let mut waiting = Vec::new();
    for i in 0..n {
        let body = serde_json::to_vec(config).unwrap();
        waiting.push(tokio::spawn(post_to(state.clone(), body)));
        until_waiting(state, i + 1).await;
    }
    waiting
}

#[tokio::test]
async fn a_burst_of_validations_waits_for_the_slots_and_all_are_answered() {
    // Two slots held by validations in progress, eight more arrive: they wait (the wait
    // is long here, and nothing measures time) and are all answered once the slots free.
    let state = state_with_slots(2, 32, Duration::from_secs(3600));
    let config = Review::envoy_config("CREATE", fixture("kuard_tls.yaml"), Value::Null).json();
    let held = [
        state.validation_slots.try_hold().unwrap(),
        state.validation_slots.try_hold().unwrap(),
    ];
    let waiting = queue_validations(&state, &config, 8).await;
    drop(held);
    for answer in waiting {
        let (status, out) = answer.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["response"]["allowed"], true, "{out}");
    }
    assert_eq!(state.validation_slots.free(), 2);
    assert_eq!(state.validation_slots.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_validation_queue_answers_429_at_once_and_never_holds_injection() {
    use marin3r_webhook::MUTATE_PATH;

    let state = state_with_slots(1, 2, Duration::from_secs(2));
    let config = Review::envoy_config("CREATE", fixture("kuard_tls.yaml"), Value::Null).json();
    // A validation in progress holds the only slot and two more wait: a deterministic
    // gate, on tokio's paused clock.
    let running = state.validation_slots.try_hold().unwrap();
    let waiting = queue_validations(&state, &config, 2).await;
    let before = tokio::time::Instant::now();
    let (status, out) = post_to(state.clone(), serde_json::to_vec(&config).unwrap()).await;
    assert_eq!(before.elapsed(), Duration::ZERO, "refused without waiting");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{out}");
    assert_eq!(out["code"], 429);
    assert_eq!(
        out["error"],
        "EnvoyConfig validation refused: too many validations in progress \
         (1 running, 2 waiting); retry the request"
    );
    // Pod injection does not go through the validation slots.
    let pod = common::pod_review(UID, common::labelled_pod());
    let (status, out) =
        common::post(state.clone(), MUTATE_PATH, pod.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"]["patch"].is_string(), "{out}");
    assert_eq!(state.validation_slots.waiting(), 2);
    // Once the slot is free, the waiting validations run, then new ones.
    drop(running);
    for answer in waiting {
        let (status, out) = answer.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["response"]["allowed"], true);
    }
    assert_eq!(admit(state.clone(), &config).await["allowed"], true);
    assert_eq!(state.validation_slots.free(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_validation_that_waits_past_the_wait_gets_429() {
    let state = state_with_slots(1, 32, Duration::from_secs(2));
    let config = Review::envoy_config("CREATE", fixture("kuard_tls.yaml"), Value::Null).json();
    let _running = state.validation_slots.try_hold().unwrap();
    let before = tokio::time::Instant::now();
    let (status, out) = post_to(state.clone(), serde_json::to_vec(&config).unwrap()).await;
    assert_eq!(before.elapsed(), Duration::from_secs(2));
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{out}");
    assert_eq!(
        out["error"],
        "EnvoyConfig validation refused: no validation slot freed within 2s (1 running); \
         retry the request"
    );
    assert_eq!(state.validation_slots.waiting(), 0);
}

#[test]
fn the_validation_wait_is_well_inside_the_webhook_timeout() {
    // The API server gives each validating webhook `timeoutSeconds`; a refusal after the
    // wait must reach it as our answer, with time left for the validation itself.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/default/webhooks.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut checked = 0;
    for doc in marin3r_envoyconfig::manifest::documents(&text).unwrap() {
        if doc["kind"] != "ValidatingWebhookConfiguration" {
            continue;
        }
        for webhook in doc["webhooks"].as_array().unwrap() {
            let timeout = Duration::from_secs(webhook["timeoutSeconds"].as_u64().unwrap());
            assert!(
                VALIDATION_WAIT * 2 <= timeout,
                "{}: wait {VALIDATION_WAIT:?}, timeout {timeout:?}",
                webhook["name"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} validating webhooks found");
}

// ---------------------------------------- EnvoyDeployment (operator-design.md §5.8)

fn envoy_deployment(spec: Value) -> Value {
    json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "EnvoyDeployment",
        "metadata": {"name": "envoy", "namespace": "default"},
        "spec": spec,
    })
}

#[tokio::test]
async fn envoydeployments_are_validated_with_upstreams_messages_and_every_field_named() {
    let good = envoy_deployment(json!({
        "discoveryServiceRef": "discoveryservice", "envoyConfigRef": "envoy",
        "ports": [{"name": "http", "port": 8080}], "replicas": {"static": 1}, "shutdownManager": {},
    }));
    assert_eq!(
        admit_envoy_deployment(Review::envoy_deployment(
            "CREATE",
            good.clone(),
            Value::Null
        ))
        .await,
        allowed()
    );
    // Upstream's two rules, with upstream's messages.
    let both = envoy_deployment(json!({
        "discoveryServiceRef": "ds", "envoyConfigRef": "ec",
        "replicas": {"static": 1, "dynamic": {"maxReplicas": 2}},
        "podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1},
    }));
    let denied =
        admit_envoy_deployment(Review::envoy_deployment("UPDATE", both, good.clone())).await;
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["status"]["code"], 400);
    let message = denied["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("invalid EnvoyDeployment: "),
        "{message}"
    );
    assert!(
        message
            .contains("only one of 'spec.replicas.static' or 'spec.replicas.dynamic' is allowed"),
        "{message}"
    );
    assert!(message.contains("only one of 'spec.podDisruptionBudget.minAvailable' or 'spec.podDisruptionBudget.maxUnavailable' is allowed"), "{message}");
    // A spec that does not even decode is denied naming the field.
    let mistyped = envoy_deployment(
        json!({"discoveryServiceRef": "ds", "envoyConfigRef": "ec", "adminPort": "x"}),
    );
    let denied =
        admit_envoy_deployment(Review::envoy_deployment("CREATE", mistyped, Value::Null)).await;
    assert!(
        denied["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.adminPort"),
        "{denied}"
    );
    // A status update or an unchanged spec is never blocked.
    assert_eq!(
        admit_envoy_deployment(Review::envoy_deployment("UPDATE", good.clone(), good)).await,
        allowed()
    );
    // An EnvoyConfig sent to this path is not judged by it.
    assert_eq!(
        admit_envoy_deployment(Review::envoy_config(
            "CREATE",
            json!({"spec": {}}),
            Value::Null
        ))
        .await,
        allowed()
    );
}
