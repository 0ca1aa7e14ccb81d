//! EnvoyConfig, listener and Secret manifests the end-to-end tests serve.

use base64::Engine as _;
use serde_json::{Value, json};

pub const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
pub const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
pub const DOWNSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
pub const UPSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// A listener `name` on 127.0.0.1:`port` whose HttpConnectionManager routes `/` with
/// `action` (`{"route": …}` or `{"direct_response": …}`), optionally behind TLS.
pub fn http_listener(
    name: &str,
    port: u16,
    action: Value,
    transport_socket: Option<Value>,
) -> Value {
    let mut route = json!({"match": {"prefix": "/"}});
    for (k, v) in action.as_object().into_iter().flatten() {
        route[k] = v.clone();
    }
    let mut chain = json!({
        "filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM_TYPE,
                "stat_prefix": name,
                "route_config": {
                    "name": format!("{name}_route"),
                    "virtual_hosts": [{"name": "any", "domains": ["*"], "routes": [route]}],
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": ROUTER_TYPE},
                }],
            },
        }],
    });
    if let Some(ts) = transport_socket {
        chain["transport_socket"] = ts;
    }
    json!({
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [chain],
    })
}

/// A downstream TLS transport socket whose certificate is the SDS secret `secret`,
/// fetched over ADS.
pub fn sds_tls(secret: &str) -> Value {
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": DOWNSTREAM_TLS_TYPE,
            "common_tls_context": {
                "tls_certificate_sds_secret_configs": [{
                    "name": secret,
                    "sds_config": {"ads": {}, "resource_api_version": "V3"},
                }],
            },
        },
    })
}

pub fn direct(body: &str) -> Value {
    json!({"direct_response": {"status": 200, "body": {"inline_string": body}}})
}

/// An EnvoyConfig manifest (JSON, which the folder accepts like YAML).
pub fn envoy_config(node_id: &str, resources: Vec<Value>) -> String {
    serde_json::to_string_pretty(&json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": node_id, "namespace": "default"},
        "spec": {"nodeID": node_id, "envoyAPI": "v3", "resources": resources},
    }))
    .unwrap_or_default()
}

pub fn resource(kind: &str, value: Value) -> Value {
    json!({"type": kind, "value": value})
}

/// A listener resource Envoy accepts: `GET http://127.0.0.1:port/` answers 200 `body`.
pub fn answering_listener(port: u16, body: &str) -> Value {
    resource("listener", http_listener("http", port, direct(body), None))
}

/// Walkthrough 2's broken listener resource: it routes to a cluster that does not exist,
/// so every Envoy rejects it.
pub fn rejected_listener(port: u16) -> Value {
    let action = json!({"route": {"cluster": "does-not-exist"}});
    resource("listener", http_listener("http", port, action, None))
}

/// A `kubernetes.io/tls` Secret manifest (YAML, base64 `data`).
pub fn tls_secret_yaml(name: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        b64(cert_pem),
        b64(key_pem)
    )
}
