//! What Envoy 1.40 reads beyond strict protojson, and its twins that Envoy refuses.
//!
//! Every example was checked with the real Envoy (`envoy --mode validate -c` on a static
//! bootstrap holding the resource; Envoy 1.40.0, 9e5580933739775e8bce696a57a2e1bc99368f23);
//! the verdict is in the comment above each case. A positive case decodes here; its
//! negative twin is refused with the field path of the problem.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use marin3r_envoyconfig::decode::{Serialization, decode_resource, decode_str, to_json};
use marin3r_envoyconfig::resource::{Resource, ResourceType};
use prost::Message;
use serde_json::{Value, json};

const LUA: &str = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

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

fn cluster(extra: Value) -> Value {
    let mut c = json!({"name": "c", "load_assignment": {"cluster_name": "c", "endpoints": [
        {"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
            "address": "127.0.0.1", "port_value": 1}}}}]}]}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
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

// --- 2. cncf/xds types -------------------------------------------------------------

fn http_listener(http_filter: Value) -> Value {
    json!({"name": "l",
    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
    "filter_chains": [{"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "h",
            "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
            "http_filters": [http_filter, {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
        }
    }]}]})
}

fn typed_struct(type_url: &str, value: Value) -> Value {
    http_listener(json!({"name": "envoy.filters.http.lua", "typed_config": {
        "@type": type_url, "type_url": LUA, "value": value}}))
}

/// Envoy: ACCEPT (a Lua filter configured through `xds.type.v3.TypedStruct` and through
/// `udpa.type.v1.TypedStruct`).
#[test]
fn typed_structs_decode() {
    let lua = json!({"default_source_code": {"inline_string": "function envoy_on_request(h) end"}});
    for url in [
        "type.googleapis.com/xds.type.v3.TypedStruct",
        "type.googleapis.com/udpa.type.v1.TypedStruct",
    ] {
        let r = ok(ResourceType::Listener, &typed_struct(url, lua.clone()));
        let back = to_json(&r).unwrap();
        let filter = &back["filterChains"][0]["filters"][0]["typedConfig"]["httpFilters"][0];
        assert_eq!(filter["typedConfig"]["@type"], url);
        assert_eq!(filter["typedConfig"]["typeUrl"], LUA);
    }
}

/// Envoy: REFUSE ("Protobuf message (type envoy.extensions.filters.http.lua.v3.Lua reason
/// INVALID_ARGUMENT: invalid JSON …": `bogus` in the value), and REFUSE (`bogus` beside
/// `type_url`).
#[test]
fn typed_struct_value_is_checked_against_its_type() {
    let e = err(
        ResourceType::Listener,
        &typed_struct(
            "type.googleapis.com/xds.type.v3.TypedStruct",
            json!({"default_source_code": {"inline_string": "x"}, "bogus": 1}),
        ),
    );
    assert_eq!(
        e,
        r#"listener "l": filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.value: unknown field "bogus""#
    );
    let mut outer = typed_struct("type.googleapis.com/udpa.type.v1.TypedStruct", json!({}));
    outer["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]["typed_config"]["bogus"] =
        json!(1);
    let e = err(ResourceType::Listener, &outer);
    assert!(e.contains("http_filters[0].typed_config"), "{e}");
    assert!(e.contains("bogus"), "{e}");
    // A type the registry does not know stays a free-form struct (Envoy then needs an
    // extension of that type, which is not the decoder's business).
    let unknown = json!({"name": "x", "typed_config": {
        "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
        "type_url": "type.googleapis.com/example.Unknown", "value": {"a": 1}}});
    ok(ResourceType::ExtensionConfig, &unknown);
}

fn ip_matcher_listener(range: Value) -> Value {
    json!({"name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
        "filter_chain_matcher": {"matcher_tree": {
            "input": {"name": "ip", "typed_config": {"@type":
                "type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.SourceIPInput"}},
            "custom_match": {"name": "ip-matcher", "typed_config": {
                "@type": "type.googleapis.com/xds.type.matcher.v3.IPMatcher",
                "range_matchers": [{"ranges": [range], "on_match": {"keep_matching": false,
                    "action": {"name": "a", "typed_config": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue", "value": "fc"}}}}]}}}},
        "filter_chains": [{"name": "fc", "filters": [{"name": "envoy.filters.network.tcp_proxy",
            "typed_config": {"@type": TCP_PROXY, "stat_prefix": "t", "cluster": "c"}}]}]})
}

/// Envoy: ACCEPT (`xds.type.matcher.v3.IPMatcher` as a listener's filter chain matcher,
/// with `keep_matching`); REFUSE (`bogus` in a range).
#[test]
fn ip_matcher() {
    ok(
        ResourceType::Listener,
        &ip_matcher_listener(json!({"address_prefix": "10.0.0.0", "prefix_len": 8})),
    );
    let e = err(
        ResourceType::Listener,
        &ip_matcher_listener(json!({"address_prefix": "10.0.0.0", "prefix_len": 8, "bogus": 1})),
    );
    assert_eq!(
        e,
        r#"listener "l": filter_chain_matcher.matcher_tree.custom_match.typed_config.range_matchers[0].ranges[0]: unknown field "bogus""#
    );
}

fn cel_listener(expr: Value) -> Value {
    http_listener(json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "matcher": {"matcher_list": {"matchers": [{
            "predicate": {"single_predicate": {
                "input": {"name": "cel", "typed_config": {
                    "@type": "type.googleapis.com/xds.type.matcher.v3.HttpAttributesCelMatchInput"}},
                "custom_match": {"name": "cel", "typed_config": {
                    "@type": "type.googleapis.com/xds.type.matcher.v3.CelMatcher",
                    "expr_match": {"cel_expr_parsed": expr}}}}},
            "on_match": {"action": {"name": "allow", "typed_config": {
                "@type": "type.googleapis.com/envoy.config.rbac.v3.Action",
                "name": "allow", "action": "ALLOW"}}}}]}}}}))
}

/// Envoy: ACCEPT (an RBAC matcher with `xds.type.matcher.v3.CelMatcher`); REFUSE (`bogus`
/// in the parsed expression).
#[test]
fn cel_matcher() {
    ok(
        ResourceType::Listener,
        &cel_listener(json!({"expr": {"id": 1, "const_expr": {"bool_value": true}}})),
    );
    let e = err(
        ResourceType::Listener,
        &cel_listener(json!({"bogus": 1, "expr": {"id": 1}})),
    );
    assert!(
        e.contains(".expr_match.cel_expr_parsed: unknown field \"bogus\""),
        "{e}"
    );
}

// --- 4. Envoy's YAML leniencies ------------------------------------------------------

/// Envoy: ACCEPT (`type: strict_dns`, `lb_policy: round_robin`; also `Strict_Dns`,
/// `Least_Request`).
#[test]
fn enums_in_any_case() {
    let r = ok(
        ResourceType::Cluster,
        &cluster(json!({"type": "strict_dns", "lb_policy": "least_request"})),
    );
    let back = to_json(&r).unwrap();
    assert_eq!(back["type"], "STRICT_DNS");
    assert_eq!(back["lbPolicy"], "LEAST_REQUEST");
    let mixed = ok(
        ResourceType::Cluster,
        &cluster(json!({"type": "Strict_Dns", "lb_policy": "Least_Request"})),
    );
    assert_eq!(r.digest, mixed.digest);
    let upper = ok(
        ResourceType::Cluster,
        &cluster(json!({"type": "STRICT_DNS", "lb_policy": "LEAST_REQUEST"})),
    );
    assert_eq!(r.body.value, upper.body.value);
    // Envoy: ACCEPT (`dns_lookup_family: "1"`, a number as a string).
    let n = ok(
        ResourceType::Cluster,
        &cluster(json!({"dns_lookup_family": "1"})),
    );
    assert_eq!(to_json(&n).unwrap()["dnsLookupFamily"], "V4_ONLY");
}

/// Envoy: REFUSE ("unknown enum value: 'round_robbin'").
#[test]
fn unknown_enum_names_are_refused() {
    let e = err(
        ResourceType::Cluster,
        &cluster(json!({"lb_policy": "round_robbin"})),
    );
    assert!(e.starts_with(r#"cluster "c": lb_policy: "#), "{e}");
}

/// Envoy: ACCEPT (`filter_chains: {filters: {name: …, typed_config: …}}`, and
/// `endpoints: {lb_endpoints: {…}}`; `domains: "*"`).
#[test]
fn one_value_where_a_list_is_expected() {
    let single = json!({"name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
        "filter_chains": {"filters": {"name": "envoy.filters.network.tcp_proxy",
            "typed_config": {"@type": TCP_PROXY, "stat_prefix": "t", "cluster": "c"}}}});
    let listed = json!({"name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy",
            "typed_config": {"@type": TCP_PROXY, "stat_prefix": "t", "cluster": "c"}}]}]});
    let a = ok(ResourceType::Listener, &single);
    let b = ok(ResourceType::Listener, &listed);
    assert_eq!(a.body.value, b.body.value);
    assert_eq!(a.digest, b.digest);

    let route = json!({"name": "r", "virtual_hosts": {"name": "v", "domains": "*"}});
    let back = to_json(&ok(ResourceType::Route, &route)).unwrap();
    assert_eq!(back["virtualHosts"][0]["domains"], json!(["*"]));

    // Envoy: ACCEPT (`filter_chains: [[{…}]]`: a list in a list is flattened).
    let nested = json!({"name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
        "filter_chains": [[{"filters": [{"name": "envoy.filters.network.tcp_proxy",
            "typed_config": {"@type": TCP_PROXY, "stat_prefix": "t", "cluster": "c"}}]}]]});
    assert_eq!(ok(ResourceType::Listener, &nested).body.value, b.body.value);
}

/// Envoy: REFUSE (a single filter with an unknown field `nme`; `filter_chains: "x"`).
#[test]
fn one_bad_value_where_a_list_is_expected_is_refused() {
    let bad = json!({"name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
        "filter_chains": {"filters": {"nme": "envoy.filters.network.tcp_proxy"}}});
    let e = err(ResourceType::Listener, &bad);
    assert!(e.contains("filter_chains[0].filters[0]"), "{e}");
    assert!(e.contains("nme"), "{e}");
    let e = err(
        ResourceType::Listener,
        &json!({"name": "l", "filter_chains": "x"}),
    );
    assert!(e.contains("filter_chains[0]"), "{e}");
}

/// Envoy: ACCEPT (`connect_timeout: {seconds: 5}`, `{seconds: 5, nanos: 500000000}`,
/// `{seconds: "5"}`).
#[test]
fn duration_as_an_object() {
    let a = ok(
        ResourceType::Cluster,
        &cluster(json!({"connect_timeout": {"seconds": 5}})),
    );
    let b = ok(
        ResourceType::Cluster,
        &cluster(json!({"connect_timeout": "5s"})),
    );
    assert_eq!(a.body.value, b.body.value);
    assert_eq!(a.digest, b.digest);
    let c = ok(
        ResourceType::Cluster,
        &cluster(json!({"connect_timeout": {"seconds": "5", "nanos": 500_000_000}})),
    );
    assert_eq!(to_json(&c).unwrap()["connectTimeout"], "5.500s");
}

/// Envoy: REFUSE (`connect_timeout: {seconds: 5, minutes: 1}`).
#[test]
fn duration_object_with_another_field_is_refused() {
    let e = err(
        ResourceType::Cluster,
        &cluster(json!({"connect_timeout": {"seconds": 5, "minutes": 1}})),
    );
    assert_eq!(
        e,
        r#"cluster "c": connect_timeout: unknown field "minutes""#
    );
}

/// Envoy: ACCEPT (`per_connection_buffer_limit_bytes: {value: 1024}`,
/// `respect_dns_ttl: "yes"`); REFUSE (`respect_dns_ttl: "maybe"`).
#[test]
fn wrappers_as_objects_and_quoted_booleans() {
    let a = ok(
        ResourceType::Cluster,
        &cluster(
            json!({"per_connection_buffer_limit_bytes": {"value": 1024}, "respect_dns_ttl": "yes"}),
        ),
    );
    let b = ok(
        ResourceType::Cluster,
        &cluster(json!({"per_connection_buffer_limit_bytes": 1024, "respect_dns_ttl": true})),
    );
    assert_eq!(a.body.value, b.body.value);
    let e = err(
        ResourceType::Cluster,
        &cluster(json!({"respect_dns_ttl": "maybe"})),
    );
    assert!(e.starts_with(r#"cluster "c": respect_dns_ttl: "#), "{e}");
}

/// Envoy's parser reads `null` in a list as the default element: with
/// `request_headers_to_remove: ["x-a", null]` on a route configuration Envoy 1.40
/// ACCEPTs (an empty header name is allowed there); with
/// `response_headers_to_remove: ["x-a", null]` on a virtual host it REFUSEs with its
/// field constraint error on element `[1]` ("ResponseHeadersToRemove[1]: value length
/// must be at least 1 characters"), i.e. after parsing an empty string there. marin3r
/// reads and checks it the same way.
#[test]
fn null_in_a_list_is_the_default_element() {
    let route = json!({"name": "r", "request_headers_to_remove": ["x-a", null],
        "virtual_hosts": [{"name": "v", "domains": ["*"]}]});
    let back = to_json(&ok(ResourceType::Route, &route)).unwrap();
    assert_eq!(back["requestHeadersToRemove"], json!(["x-a", ""]));

    let route = json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
        "response_headers_to_remove": ["x-a", null]}]});
    assert_eq!(
        err(ResourceType::Route, &route),
        r#"route "r": virtual_hosts[0].response_headers_to_remove[1]: value length must be at least 1 characters"#
    );
}

// --- 5. YAML scalars -----------------------------------------------------------------
//
// Envoy turns YAML into JSON with yaml-cpp before protobuf's parser sees it
// (`source/common/protobuf/yaml_utility.cc`): a plain scalar is a boolean if yaml-cpp
// reads it as one (`true`, `yes`, `on`, `y`, … in three cases), else a number if it
// reads as a C++ `int64` (decimal, `0x` hex, and legacy octal with a leading `0`; a
// value outside the `int32` range becomes its decimal text), else the scalar's text.
// Checked with Envoy 1.40 on `per_connection_buffer_limit_bytes` (UInt32Value) and
// `alt_stat_name` (string) of a static cluster, reading the value back from
// `/config_dump` for the accepted ones.

fn yaml_cluster(field: &str, scalar: &str) -> Result<Resource, String> {
    let text = format!(
        "name: c\n{field}: {scalar}\nload_assignment: {{cluster_name: c, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 1}}}}}}}}]}}]}}\n"
    );
    decode_str(ResourceType::Cluster, &text, Serialization::Yaml).map_err(|e| e.to_string())
}

fn buffer_limit(scalar: &str) -> Result<Value, String> {
    yaml_cluster("per_connection_buffer_limit_bytes", scalar)
        .map(|r| to_json(&r).unwrap()["perConnectionBufferLimitBytes"].clone())
}

fn alt_stat_name(scalar: &str) -> Result<Value, String> {
    yaml_cluster("alt_stat_name", scalar).map(|r| to_json(&r).unwrap()["altStatName"].clone())
}

/// Envoy: ACCEPT `per_connection_buffer_limit_bytes: 010` as 8, `0777` as 511,
/// `0010` as 8 (yaml-cpp reads a leading `0` as octal, like YAML 1.1), `08` and `09`
/// as 8 and 9 (not octal: text, which protobuf reads as decimal), `0x1F` as 31.
/// marin3r read `010` as 10 before (YAML 1.2). Twin: `-010` is -8, REFUSEd for an
/// unsigned field by both.
#[test]
fn integers_with_a_leading_zero_are_octal() {
    for (scalar, value) in [
        ("010", 8),
        ("0777", 511),
        ("0010", 8),
        ("08", 8),
        ("09", 9),
        ("0x1F", 31),
        ("1000", 1000),
    ] {
        assert_eq!(buffer_limit(scalar), Ok(json!(value)), "{scalar}");
    }
    let e = buffer_limit("-010").unwrap_err();
    assert!(
        e.starts_with(r#"cluster "c": per_connection_buffer_limit_bytes: "#),
        "{e}"
    );
}

/// Envoy: ACCEPT `alt_stat_name: 1_000` as the text "1_000" (yaml-cpp knows no
/// underscores in numbers), and `0x1_0`, `1_0.5` likewise. Twin: REFUSE
/// `per_connection_buffer_limit_bytes: 1_000` ("invalid JSON … per_connection_buffer_limit_bytes:
/// message google.protobuf.UInt32Value"); marin3r read it as 1000 before (YAML 1.2).
#[test]
fn numbers_with_underscores_are_text() {
    for scalar in ["1_000", "0x1_0", "1_0.5"] {
        assert_eq!(alt_stat_name(scalar), Ok(json!(scalar)), "{scalar}");
    }
    for scalar in ["1_000", "0x1_0"] {
        let e = buffer_limit(scalar).unwrap_err();
        assert!(
            e.starts_with(r#"cluster "c": per_connection_buffer_limit_bytes: "#),
            "{scalar}: {e}"
        );
    }
}

/// Envoy: REFUSE an untagged integer in the `int32` range or a boolean given to a
/// string field (`alt_stat_name: 123`, `-5`, `0x1F`, `010`, `true`, `yes`, `on`, `y`,
/// `Off`: "invalid JSON … alt_stat_name: string"); ACCEPT it quoted (`'123'`, `"true"`).
/// marin3r refuses and accepts the same, with the field path.
#[test]
fn integers_and_booleans_in_string_fields_are_refused() {
    for scalar in ["123", "-5", "0x1F", "010", "true", "yes", "on", "y", "Off"] {
        let e = alt_stat_name(scalar).unwrap_err();
        assert!(
            e.starts_with(r#"cluster "c": alt_stat_name: "#),
            "{scalar}: {e}"
        );
    }
    assert_eq!(alt_stat_name("'123'"), Ok(json!("123")));
    assert_eq!(alt_stat_name("\"true\""), Ok(json!("true")));
}

/// Known differences, pinned so that a change is noticed. Envoy ACCEPTs these untagged
/// scalars in a string field as their text (`alt_stat_name: 1.50` is "1.50"), marin3r
/// refuses them: its YAML parser types them as numbers (`1.5`, `1.50`, `1e3`, `1.0`,
/// `.5`, `08`; `0o17`, `0b101` are YAML 1.2 integers) and the text is gone before the
/// decoder sees the value; the same number from JSON is refused by Envoy too. Likewise
/// an integer outside the `int32` range (`12345678901`, which Envoy reads as the text
/// "12345678901" from YAML, and refuses from JSON). Quoting them works everywhere.
/// In a numeric field, `0o17` and `0b101` are REFUSEd by Envoy (text) and read as 15
/// and 5 by marin3r.
#[test]
fn yaml_scalars_read_differently() {
    for scalar in [
        "1.5",
        "1.50",
        "1e3",
        "1.0",
        ".5",
        "08",
        "0o17",
        "0b101",
        "12345678901",
    ] {
        let e = alt_stat_name(scalar).unwrap_err();
        assert!(
            e.starts_with(r#"cluster "c": alt_stat_name: "#),
            "{scalar}: {e}"
        );
        assert_eq!(alt_stat_name(&format!("'{scalar}'")), Ok(json!(scalar)));
    }
    assert_eq!(buffer_limit("0o17"), Ok(json!(15)));
    assert_eq!(buffer_limit("0b101"), Ok(json!(5)));
}
