//! What Envoy 1.40 reads beyond strict protojson, and its twins that Envoy refuses.
//!
//! Every example was checked with the real Envoy (`envoy --mode validate -c` on a static
//! bootstrap holding the resource; Envoy 1.40.0, 9e5580933739775e8bce696a57a2e1bc99368f23);
//! the verdict is in the comment above each case. A positive case decodes here; its
//! negative twin is refused with the field path of the problem.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use marin3r_envoyconfig::decode::{decode_resource, to_json};
use marin3r_envoyconfig::resource::{Resource, ResourceType};
use prost::Message;
use serde_json::{Value, json};

const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

fn ok(kind: ResourceType, value: &Value) -> Resource {
    decode_resource(kind, value).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn err(kind: ResourceType, value: &Value) -> String {
    match decode_resource(kind, value) {
        Ok(_) => panic!("{kind} decoded: {value}"),
        Err(e) => e.to_string(),
    }
}

fn route_with_per_filter_config(config: Value) -> Value {
    json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [{
        "match": {"prefix": "/"}, "direct_response": {"status": 200},
        "typed_per_filter_config": {"envoy.filters.http.lua": {
            "@type": FILTER_CONFIG, "config": config
        }}
    }]}]})
}

// --- 1. Empty Any --------------------------------------------------------------------

/// Envoy: ACCEPT (`config: {}` in a route's `FilterConfig`).
#[test]
fn empty_any_is_an_empty_any() {
    let r = ok(
        ResourceType::Route,
        &route_with_per_filter_config(json!({})),
    );
    use envoy_types::pb::envoy::config::route::v3::{FilterConfig, RouteConfiguration};
    let rc = RouteConfiguration::decode(r.body.value.as_slice()).unwrap();
    let any = &rc.virtual_hosts[0].routes[0].typed_per_filter_config["envoy.filters.http.lua"];
    assert_eq!(any.type_url, FILTER_CONFIG);
    let fc = FilterConfig::decode(any.value.as_slice()).unwrap();
    let config = fc.config.expect("config is set");
    assert_eq!(config.type_url, "");
    assert!(config.value.is_empty());

    let back = to_json(&r).unwrap();
    assert_eq!(
        back["virtualHosts"][0]["routes"][0]["typedPerFilterConfig"]["envoy.filters.http.lua"]["config"],
        json!({})
    );
    // Stable: the same digest for the same content, and a different one without it.
    let again = ok(
        ResourceType::Route,
        &route_with_per_filter_config(json!({})),
    );
    assert_eq!(r.digest, again.digest);
    assert_eq!(r.body.value, again.body.value);
}

/// Envoy: REFUSE ("invalid JSON … missing @type in Any is only allowed for an empty
/// object").
#[test]
fn any_without_type_but_with_fields_is_refused() {
    let e = err(
        ResourceType::Route,
        &route_with_per_filter_config(json!({"source_code": "x"})),
    );
    assert!(
        e.contains(
            r#"virtual_hosts[0].routes[0].typed_per_filter_config["envoy.filters.http.lua"].config"#
        ),
        "{e}"
    );
    assert!(e.contains("@type"), "{e}");
}

/// The placeholder type marin3r decodes `{}` with is not a type users can name.
#[test]
fn the_empty_any_placeholder_is_not_a_type() {
    let e = err(
        ResourceType::Route,
        &route_with_per_filter_config(
            json!({"@type": "type.googleapis.com/marin3r.internal.EmptyAny"}),
        ),
    );
    assert!(e.contains("unknown type URL"), "{e}");
    assert!(e.contains("].config: "), "{e}");
}
