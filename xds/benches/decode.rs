//! Decoding cost: one 100-resource EnvoyConfig (50 clusters, 25 listeners with an
//! HttpConnectionManager + Router, 25 routes) through `resolve`, and a single listener
//! through `decode_resource`.
//!
//! `cargo bench -p marin3r-xds --bench decode`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use marin3r_xds::decode::decode_resource;
use marin3r_xds::envoyconfig::{EnvoyConfigSpec, NoSecrets, resolve};
use marin3r_xds::resource::ResourceType;
use serde_json::{Value, json};

fn listener(i: usize) -> Value {
    json!({
        "name": format!("listener-{i}"),
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10000 + i}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("l{i}"),
                "rds": {"route_config_name": format!("route-{i}"), "config_source": {"ads": {}, "resource_api_version": "V3"}},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    })
}

fn spec() -> EnvoyConfigSpec {
    let mut resources = Vec::new();
    for i in 0..50 {
        resources.push(json!({"type": "cluster", "value": {
            "name": format!("cluster-{i}"), "connect_timeout": "1s", "type": "STRICT_DNS",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": {"cluster_name": format!("cluster-{i}"), "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}]}]}
        }}));
    }
    for i in 0..25 {
        resources.push(json!({"type": "listener", "value": listener(i)}));
        resources.push(json!({"type": "route", "value": {"name": format!("route-{i}"), "virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": format!("cluster-{i}"), "timeout": "15s"}}]
        }]}}));
    }
    serde_json::from_value(json!({"nodeID": "bench", "resources": resources})).unwrap()
}

fn bench(c: &mut Criterion) {
    let spec = spec();
    // Load the registry outside the measurement.
    assert_eq!(resolve(&spec, &NoSecrets).unwrap().len(), 100);
    c.bench_function("resolve 100-resource EnvoyConfig", |b| {
        b.iter(|| resolve(&spec, &NoSecrets).unwrap())
    });
    let one = listener(0);
    c.bench_function("decode_resource listener (HCM + Router)", |b| {
        b.iter(|| decode_resource(ResourceType::Listener, &one).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
