//! Resource decoding: protojson spellings, well-known types, nested `Any`, canonical
//! bytes and digests, and error paths.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use marin3r_envoyconfig::decode::{Serialization, decode_resource, decode_str, to_json};
use marin3r_envoyconfig::resource::{Resource, ResourceType};
use prost::Message;
use serde_json::{Value, json};

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

fn listener(typed_config: Value) -> Value {
    json!({
        "name": "https",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": typed_config
        }]}]
    })
}

fn hcm() -> Value {
    json!({
        "@type": HCM,
        "stat_prefix": "https",
        "route_config": {"name": "local", "virtual_hosts": [{
            "name": "kuard", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "kuard"}}]
        }]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    })
}

fn err(kind: ResourceType, value: Value) -> String {
    decode_resource(kind, &value).unwrap_err().to_string()
}

#[test]
fn listener_with_nested_any_decodes() {
    let r = decode_resource(ResourceType::Listener, &listener(hcm())).unwrap();
    assert_eq!(r.kind, ResourceType::Listener);
    assert_eq!(r.name, "https");
    assert_eq!(r.body.type_url, ResourceType::Listener.type_url());

    // The typed Envoy message decodes, and its Any holds the HCM, whose Any holds Router.
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    let l = Listener::decode(r.body.value.as_slice()).unwrap();
    let any = l.filter_chains[0].filters[0].config_type.clone().unwrap();
    let envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any) = any
    else {
        panic!("not a typed_config")
    };
    assert_eq!(any.type_url, HCM);
    let h = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    assert_eq!(h.stat_prefix, "https");
    let router = &h.http_filters[0];
    let Some(
        envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(inner),
    ) = &router.config_type
    else {
        panic!("router has no typed_config")
    };
    assert_eq!(inner.type_url, ROUTER);

    let back = to_json(&r).unwrap();
    assert_eq!(
        back["filterChains"][0]["filters"][0]["typedConfig"]["httpFilters"][0]["typedConfig"]["@type"],
        ROUTER
    );
}

#[test]
fn camel_case_and_snake_case_are_identical() {
    let snake = listener(hcm());
    let camel = json!({
        "name": "https",
        "address": {"socketAddress": {"address": "0.0.0.0", "portValue": 8443}},
        "filterChains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typedConfig": {
                "@type": HCM,
                "statPrefix": "https",
                "routeConfig": {"name": "local", "virtualHosts": [{
                    "name": "kuard", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "kuard"}}]
                }]},
                "httpFilters": [{"name": "envoy.filters.http.router", "typedConfig": {"@type": ROUTER}}]
            }
        }]}]
    });
    let a = decode_resource(ResourceType::Listener, &snake).unwrap();
    let b = decode_resource(ResourceType::Listener, &camel).unwrap();
    assert_eq!(a.body, b.body);
    assert_eq!(a.digest, b.digest);
    assert_eq!(a, b);
}

#[test]
fn yaml_and_json_give_the_same_digest() {
    let json_text = r#"{"name": "kuard", "connect_timeout": "0.25s", "type": "STRICT_DNS",
        "lb_policy": "ROUND_ROBIN"}"#;
    let yaml_text =
        "name: kuard\nconnectTimeout: 0.250s\ntype: STRICT_DNS\nlbPolicy: ROUND_ROBIN\n";
    let a = decode_str(ResourceType::Cluster, json_text, Serialization::Json).unwrap();
    let b = decode_str(ResourceType::Cluster, yaml_text, Serialization::Yaml).unwrap();
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.body, b.body);
    // Different content, different digest.
    let c = decode_str(
        ResourceType::Cluster,
        &yaml_text.replace("0.250s", "1s"),
        Serialization::Yaml,
    )
    .unwrap();
    assert_ne!(a.digest, c.digest);
}

#[test]
fn well_known_types_and_enums() {
    let cluster = json!({
        "name": "kuard",
        "connect_timeout": "1.5s",
        "type": "STRICT_DNS",
        "lb_policy": "LEAST_REQUEST",
        "per_connection_buffer_limit_bytes": 32768,
        "metadata": {"filter_metadata": {"envoy.lb": {"canary": true, "weight": 3, "tags": ["a", "b"], "none": null}}},
        "common_http_protocol_options": {"idle_timeout": "300s"},
        "ignore_health_on_host_removal": true
    });
    let r = decode_resource(ResourceType::Cluster, &cluster).unwrap();
    let back = to_json(&r).unwrap();
    assert_eq!(back["connectTimeout"], "1.500s");
    assert_eq!(back["type"], "STRICT_DNS");
    assert_eq!(back["lbPolicy"], "LEAST_REQUEST");
    assert_eq!(back["perConnectionBufferLimitBytes"], 32768);
    assert_eq!(
        back["metadata"]["filterMetadata"]["envoy.lb"],
        json!({"canary": true, "weight": 3.0, "tags": ["a", "b"], "none": null})
    );
    assert_eq!(back["commonHttpProtocolOptions"]["idleTimeout"], "300s");

    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    let c = Cluster::decode(r.body.value.as_slice()).unwrap();
    assert_eq!(c.connect_timeout.unwrap().nanos, 500_000_000);
    assert_eq!(c.per_connection_buffer_limit_bytes.unwrap().value, 32768);
    assert_eq!(c.lb_policy, 1); // LEAST_REQUEST

    // Enums also by number; unknown names are errors at their path.
    let by_number = json!({"name": "kuard", "lb_policy": 1});
    let n = decode_resource(ResourceType::Cluster, &by_number).unwrap();
    assert_eq!(to_json(&n).unwrap()["lbPolicy"], "LEAST_REQUEST");
    let e = err(
        ResourceType::Cluster,
        json!({"name": "kuard", "lb_policy": "FASTEST"}),
    );
    assert!(e.starts_with(r#"cluster "kuard": lb_policy: "#), "{e}");
    assert!(e.contains("FASTEST"), "{e}");
}

#[test]
fn maps_encode_canonically() {
    // prost-reflect keeps maps in HashMaps with per-instance seeds: without the
    // canonical re-encoding two decodes of this would differ in byte order.
    let fields: serde_json::Map<String, Value> =
        (0..40).map(|i| (format!("key{i}"), json!(i))).collect();
    let cluster = json!({"name": "c", "metadata": {"filter_metadata": {
        "a": fields.clone(), "b": fields.clone(), "c": fields
    }}});
    let first = decode_resource(ResourceType::Cluster, &cluster).unwrap();
    for _ in 0..10 {
        let again = decode_resource(ResourceType::Cluster, &cluster).unwrap();
        assert_eq!(again.body.value, first.body.value);
        assert_eq!(again.digest, first.digest);
    }
}

#[test]
fn unknown_field_names_its_path() {
    let mut l = listener(hcm());
    l["filter_chains"][0]["bogus"] = json!(1);
    assert_eq!(
        err(ResourceType::Listener, l),
        r#"listener "https": filter_chains[0]: unknown field "bogus""#
    );

    // Inside an Any inside an Any.
    let mut h = hcm();
    h["http_filters"][0]["typed_config"]["bogus_option"] = json!(true);
    assert_eq!(
        err(ResourceType::Listener, listener(h)),
        r#"listener "https": filter_chains[0].filters[0].typed_config.http_filters[0].typed_config: unknown field "bogus_option""#
    );

    assert_eq!(
        err(ResourceType::Cluster, json!({"name": "c", "nmae": "x"})),
        r#"cluster "c": unknown field "nmae""#
    );
}

#[test]
fn unknown_type_url_names_its_path() {
    assert_eq!(
        err(
            ResourceType::Listener,
            listener(json!({"@type": "type.googleapis.com/foo.Bar", "x": 1}))
        ),
        r#"listener "https": filter_chains[0].filters[0].typed_config: unknown type URL type.googleapis.com/foo.Bar"#
    );
    let mut h = hcm();
    h["http_filters"][0]["typed_config"]["@type"] =
        json!("type.googleapis.com/envoy.extensions.filters.http.nope.v3.Nope");
    assert_eq!(
        err(ResourceType::Listener, listener(h)),
        r#"listener "https": filter_chains[0].filters[0].typed_config.http_filters[0].typed_config: unknown type URL type.googleapis.com/envoy.extensions.filters.http.nope.v3.Nope"#
    );
}

#[test]
fn invalid_values_name_their_path() {
    let e = err(
        ResourceType::Cluster,
        json!({"name": "c", "connect_timeout": "soon"}),
    );
    assert!(e.starts_with(r#"cluster "c": connect_timeout: "#), "{e}");
    let e = err(
        ResourceType::Cluster,
        json!({"name": "c", "load_assignment": {"cluster_name": "c", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "1.2.3.4", "port_value": "http"}}}}
        ]}]}}),
    );
    assert!(
        e.starts_with(r#"cluster "c": load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value: "#),
        "{e}"
    );
    let e = err(ResourceType::Listener, json!("not an object"));
    assert!(e.starts_with("listener: "), "{e}");
}

#[test]
fn name_is_required() {
    assert_eq!(
        err(ResourceType::Cluster, json!({"type": "STATIC"})),
        "cluster: missing resource name (field name)"
    );
    assert_eq!(
        err(ResourceType::Endpoint, json!({"cluster_name": ""})),
        "endpoint: missing resource name (field cluster_name)"
    );
}

#[test]
fn syntax_errors_are_reported() {
    let e = decode_str(ResourceType::Cluster, "{name: [", Serialization::Yaml).unwrap_err();
    assert!(e.to_string().starts_with("cluster: invalid yaml: "), "{e}");
    let e = decode_str(ResourceType::Cluster, "name: x", Serialization::Json).unwrap_err();
    assert!(e.to_string().starts_with("cluster: invalid json: "), "{e}");
}

#[test]
fn every_resource_type_decodes() {
    let cases: [(ResourceType, Value, &str); 8] = [
        (ResourceType::Cluster, json!({"name": "c"}), "c"),
        (
            ResourceType::Endpoint,
            json!({"cluster_name": "c", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}}]}]}),
            "c",
        ),
        (ResourceType::Listener, listener(hcm()), "https"),
        (
            ResourceType::Route,
            json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]}),
            "r",
        ),
        (
            ResourceType::ScopedRoute,
            json!({"name": "s", "route_configuration_name": "r", "key": {"fragments": [{"string_key": "a"}]}}),
            "s",
        ),
        (
            ResourceType::Secret,
            json!({"name": "k", "generic_secret": {"secret": {"inline_string": "x"}}}),
            "k",
        ),
        (
            ResourceType::Runtime,
            json!({"name": "runtime", "layer": {"envoy.reloadable_features.x": true, "n": 5}}),
            "runtime",
        ),
        (
            ResourceType::ExtensionConfig,
            json!({"name": "router", "typed_config": {"@type": ROUTER}}),
            "router",
        ),
    ];
    for (kind, value, name) in cases {
        let r: Resource = decode_resource(kind, &value).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(r.name, name);
        assert_eq!(r.body.type_url, kind.type_url());
    }
}

#[test]
fn wrappers_and_any_with_well_known_payload() {
    // An Any holding a well-known type uses {"@type", "value"}.
    let ext = json!({"name": "e", "typed_config": {
        "@type": "type.googleapis.com/google.protobuf.Struct",
        "value": {"a": 1}
    }});
    let r = decode_resource(ResourceType::ExtensionConfig, &ext).unwrap();
    assert_eq!(
        to_json(&r).unwrap()["typedConfig"]["value"],
        json!({"a": 1.0})
    );

    let route = json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
        "retry_policy": {"num_retries": 3, "per_try_timeout": "0.5s"}}]});
    let r = decode_resource(ResourceType::Route, &route).unwrap();
    let back = to_json(&r).unwrap();
    assert_eq!(back["virtualHosts"][0]["retryPolicy"]["numRetries"], 3);
    assert_eq!(
        back["virtualHosts"][0]["retryPolicy"]["perTryTimeout"],
        "0.500s"
    );
}
