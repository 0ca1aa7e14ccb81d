//! Property tests: decoding arbitrary JSON values and arbitrary text never panics, and
//! whatever decodes round-trips to the same digest.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use marin3r_envoyconfig::decode::{Serialization, decode_resource, decode_str, to_json};
use marin3r_envoyconfig::envoyconfig::{EnvoyConfigSpec, NoSecrets, resolve, validate_file};
use marin3r_envoyconfig::resource::ResourceType;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Field names that exist in Envoy messages (both spellings), so that generated values
/// reach deep into the schema, plus some that do not.
const KEYS: &[&str] = &[
    "name",
    "cluster_name",
    "clusterName",
    "address",
    "socket_address",
    "socketAddress",
    "port_value",
    "portValue",
    "filter_chains",
    "filterChains",
    "filters",
    "typed_config",
    "typedConfig",
    "@type",
    "value",
    "connect_timeout",
    "type",
    "lb_policy",
    "metadata",
    "filter_metadata",
    "load_assignment",
    "endpoints",
    "lb_endpoints",
    "endpoint",
    "virtual_hosts",
    "routes",
    "match",
    "prefix",
    "layer",
    "tls_certificate",
    "generic_secret",
    "secret",
    "inline_bytes",
    "bogus",
];

const STRINGS: &[&str] = &[
    "",
    "x",
    "1s",
    "-3.5s",
    "STRICT_DNS",
    "ROUND_ROBIN",
    "0.0.0.0",
    "AAAA",
    "!!",
    "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "type.googleapis.com/google.protobuf.Struct",
    "type.googleapis.com/google.protobuf.Duration",
    "type.googleapis.com/foo.Bar",
    "foo",
    "/",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(STRINGS).prop_map(|s| json!(s)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(KEYS).prop_map(str::to_string),
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decode_never_panics(value in json_value(), kind in prop::sample::select(ResourceType::ALL.to_vec())) {
        if let Ok(r) = decode_resource(kind, &value) {
            // What decodes re-serialises and decodes again to the same resource.
            let back = to_json(&r).unwrap();
            let again = decode_resource(kind, &back).unwrap();
            prop_assert_eq!(again.digest, r.digest);
            prop_assert_eq!(again.body, r.body);
        }
    }

    #[test]
    fn decode_str_never_panics(text in ".{0,64}", kind in prop::sample::select(ResourceType::ALL.to_vec())) {
        let _ = decode_str(kind, &text, Serialization::Yaml);
        let _ = decode_str(kind, &text, Serialization::Json);
        let _ = validate_file(&text);
    }

    #[test]
    fn resolve_never_panics(value in json_value()) {
        let spec = json!({"nodeID": "n", "resources": [{"type": "listener", "value": value.clone()}],});
        let spec: EnvoyConfigSpec = serde_json::from_value(spec).unwrap();
        let _ = resolve(&spec, &NoSecrets);
        if let Some(text) = value.as_str() {
            let deprecated = json!({"nodeID": "n", "serialization": "yaml",
                "envoyResources": {"clusters": [{"value": text}]}});
            let spec: EnvoyConfigSpec = serde_json::from_value(deprecated).unwrap();
            let _ = resolve(&spec, &NoSecrets);
        }
    }
}
