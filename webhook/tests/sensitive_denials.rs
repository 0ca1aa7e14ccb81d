//! The EnvoyConfig validating webhook never shows a value written at a field Envoy marks
//! sensitive, in its denial message or in its log line about the denial, however it was
//! spelled: a private key as a plain PEM string (instead of `{inline_string: …}`), a
//! TLS `password`, a BasicAuth filter's htpasswd `users`, session ticket `keys` with bad
//! base64. The denial still names each field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

mod common;

use marin3r_testkit::admission::Review;
use marin3r_webhook::VALIDATE_ENVOYCONFIG_PATH;

/// A recognisable (not real) PEM private key of 26 lines.
fn pem() -> String {
    let mut out = String::from("-----BEGIN PRIVATE KEY-----\n");
    for i in 0..24 {
        out.push_str(&format!("MIIEvQ{i:02}hookNeedleLine{}\n", "A".repeat(42)));
    }
    out.push_str("-----END PRIVATE KEY-----\n");
    out
}

fn tls_socket(certificate: Value) -> Value {
    json!({"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {"tls_certificates": [certificate]},
    }})
}

fn listener(name: &str, socket: Option<Value>, filter: Value) -> Value {
    let mut chain = json!({"filters": [filter]});
    if let Some(socket) = socket {
        chain["transport_socket"] = socket;
    }
    json!({"type": "listener", "value": {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
        "filter_chains": [chain],
    }})
}

fn echo() -> Value {
    json!({"name": "envoy.filters.network.echo", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo"}})
}

#[tokio::test]
async fn denials_and_their_log_lines_never_show_sensitive_values() {
    let buf = common::LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let key = pem();
    let basic_auth = json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "users",
        "route_config": {"name": "r"},
        "http_filters": [{"name": "envoy.filters.http.basic_auth", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth",
            "users": {"inlineString": "alice:{SHA}hookHtpasswdNeedle=", "inline_strin": "x"},
        }}],
    }});
    let config = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "secrets", "namespace": "default"},
        "spec": {"nodeID": "secrets", "resources": [
            listener("key", Some(tls_socket(json!({"privateKey": key}))), echo()),
            listener("password", Some(tls_socket(json!({
                "private_key": {"inline_string": "k"}, "password": 7_319_004_218_u64}))), echo()),
            listener("users", None, basic_auth),
            listener("tickets", Some(json!({"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "session_ticket_keys": {"keys": [{"inline_bytes": "hookTicketNeedle!!"}]}}})), echo()),
        ]},
    });
    let review = Review::envoy_config("CREATE", config, Value::Null);
    let (_, out) = common::post(common::state(), VALIDATE_ENVOYCONFIG_PATH, review.bytes()).await;
    assert_eq!(out["response"]["allowed"], false, "{out}");
    let denial = out["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    let logged = buf.text();
    assert!(
        logged.contains("denied"),
        "the denial is logged: {logged:?}"
    );

    let mut needles: Vec<String> = key
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::to_string)
        .collect();
    needles.extend(
        [
            "PRIVATE KEY",
            "7319004218",
            "hookHtpasswdNeedle",
            "hookTicketNeedle",
        ]
        .map(String::from),
    );
    for (what, text) in [("denial", &denial), ("log", &logged)] {
        for needle in &needles {
            assert!(
                !text.contains(needle.as_str()),
                "{needle:?} in the {what}: {text}"
            );
        }
    }
    for named in [
        "tls_certificates[0].privateKey: expected a DataSource object, found a string",
        "tls_certificates[0].password: expected a DataSource object, found a number",
        "typed_config.users: unknown field",
        "session_ticket_keys.keys[0].inline_bytes: invalid base64",
    ] {
        assert!(denial.contains(named), "{named:?} not in {denial}");
    }
}
