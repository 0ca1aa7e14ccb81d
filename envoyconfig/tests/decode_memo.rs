//! The decode memo (`resolve_cached`): an unchanged spec entry is decoded once, a changed
//! one again; generated endpoints follow the slices; errors read the same with and
//! without the memo; the memo stays bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use marin3r_envoyconfig::envoyconfig::{
    EnvoyConfigSpec, NoSecrets, SecretData, SecretSource, resolve, resolve_cached,
};
use marin3r_envoyconfig::memo::{DecodeMemo, MIN_SWEEP_ENTRIES};
use marin3r_envoyconfig::{DecodeError, Resource, ResourceType};
use serde_json::{Value, json};

fn spec(v: Value) -> EnvoyConfigSpec {
    serde_json::from_value(v).unwrap()
}

fn listener(name: &str, port: u16) -> Value {
    json!({"type": "listener", "value": {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "http",
                "rds": {"route_config_name": "r0", "config_source": {"ads": {}, "resource_api_version": "V3"}},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    }})
}

fn cluster(name: &str, timeout: &str) -> Value {
    json!({"type": "cluster", "value": {
        "name": name, "connect_timeout": timeout, "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}
    }})
}

fn route(name: &str) -> Value {
    json!({"type": "route", "value": {"name": name, "virtual_hosts": [{
        "name": "any", "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "c0"}}]
    }]}})
}

/// 20 resources: a listener, 14 clusters, 5 route configurations.
fn twenty(timeout: &str) -> Vec<Value> {
    let mut entries = vec![listener("http", 8080)];
    entries.extend((0..14).map(|i| cluster(&format!("c{i}"), timeout)));
    entries.extend((0..5).map(|i| route(&format!("r{i}"))));
    entries
}

fn resources(entries: Vec<Value>) -> EnvoyConfigSpec {
    spec(json!({"nodeID": "n", "resources": entries}))
}

fn texts(errors: &[DecodeError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn resolving_the_same_spec_twice_decodes_once() {
    let memo = DecodeMemo::new();
    let s = resources(twenty("1s"));
    let first = resolve_cached(&s, &NoSecrets, &memo).unwrap();
    assert_eq!(memo.stats().misses, 20);
    assert_eq!(memo.stats().hits, 0);
    let second = resolve_cached(&s, &NoSecrets, &memo).unwrap();
    assert_eq!(memo.stats().misses, 20, "nothing decoded again");
    assert_eq!(memo.stats().hits, 20);
    assert_eq!(first, second);
    assert_eq!(first, resolve(&s, &NoSecrets).unwrap());
}

#[test]
fn a_changed_entry_decodes_again() {
    let memo = DecodeMemo::new();
    let mut entries = twenty("1s");
    resolve_cached(&resources(entries.clone()), &NoSecrets, &memo).unwrap();
    entries[3] = cluster("c2", "2s");
    let changed = resources(entries);
    let got = resolve_cached(&changed, &NoSecrets, &memo).unwrap();
    assert_eq!(memo.stats().misses, 21, "only the changed cluster");
    assert_eq!(memo.stats().hits, 19);
    assert_eq!(got, resolve(&changed, &NoSecrets).unwrap());

    // The same text of another type, or with another serialization, is another entry.
    let memo = DecodeMemo::new();
    let text = r#"{"name": "x", "layer": {}}"#;
    let deprecated = |serialization: &str| {
        spec(json!({"nodeID": "n", "serialization": serialization,
            "envoyResources": {"runtimes": [{"value": text}]}}))
    };
    resolve_cached(&deprecated("json"), &NoSecrets, &memo).unwrap();
    resolve_cached(&deprecated("yaml"), &NoSecrets, &memo).unwrap();
    assert_eq!(memo.stats().misses, 2);
    resolve_cached(&deprecated("yaml"), &NoSecrets, &memo).unwrap();
    assert_eq!(memo.stats().hits, 1);
}

struct Slices(Vec<EndpointSlice>);

impl SecretSource for Slices {
    fn get(&self, _: &str) -> Option<SecretData> {
        None
    }
    fn endpoint_slices(&self, _: Option<&LabelSelector>) -> Option<Vec<Arc<EndpointSlice>>> {
        Some(self.0.iter().cloned().map(Arc::new).collect())
    }
}

fn slice(ips: &[&str]) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: ips
            .iter()
            .map(|ip| Endpoint {
                addresses: vec![(*ip).into()],
                ..Default::default()
            })
            .collect::<Vec<_>>()
            .into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn endpoint(resources: &[Resource]) -> &Resource {
    resources
        .iter()
        .find(|r| r.kind == ResourceType::Endpoint)
        .unwrap()
}

#[test]
fn generated_endpoints_still_follow_the_slices() {
    let memo = DecodeMemo::new();
    let s = spec(json!({"nodeID": "n", "resources": [
        cluster("kuard", "1s"),
        {"type": "endpoint", "generateFromEndpointSlices": {"clusterName": "kuard", "targetPort": "http"}}
    ]}));
    let one = Slices(vec![slice(&["10.0.0.1"])]);
    let two = Slices(vec![slice(&["10.0.0.1", "10.0.0.2"])]);
    let a = resolve_cached(&s, &one, &memo).unwrap();
    let b = resolve_cached(&s, &two, &memo).unwrap();
    assert_ne!(endpoint(&a).digest, endpoint(&b).digest);
    assert_eq!(b, resolve(&s, &two).unwrap());
    assert_eq!(
        resolve_cached(&s, &one, &memo).unwrap(),
        a,
        "back to one endpoint"
    );
    // Only the cluster went through the memo.
    assert_eq!(memo.stats().entries, 1);
    assert_eq!(memo.stats().misses, 1);
    assert_eq!(memo.stats().hits, 2);
}

#[test]
fn errors_are_identical_with_and_without_the_memo() {
    let bad = json!({"type": "cluster", "value": {"name": "b", "bogus": 1}});
    let no_name = json!({"type": "cluster", "value": {"connect_timeout": "1s"}});
    let good = cluster("c", "1s");
    let specs = [
        resources(vec![good.clone(), bad.clone(), no_name.clone()]),
        resources(vec![bad.clone(), no_name, good.clone()]),
        // The same entry twice: the second is a duplicate name, at its own path.
        resources(vec![good.clone(), bad, good.clone()]),
        resources(vec![route("r"), good.clone(), good]),
        spec(json!({"nodeID": "n", "serialization": "yaml",
            "envoyResources": {"clusters": [{"value": "name: c\nconnect_timeout: 1s"}]}})),
        spec(json!({"nodeID": "n",
            "envoyResources": {"clusters": [{"value": "name: c\nconnect_timeout: 1s"}]}})),
    ];
    let memo = DecodeMemo::new();
    for round in 0..2 {
        for (i, s) in specs.iter().enumerate() {
            let without = resolve(s, &NoSecrets);
            let with = resolve_cached(s, &NoSecrets, &memo);
            match (without, with) {
                (Err(a), Err(b)) => assert_eq!(texts(&a), texts(&b), "spec {i}, round {round}"),
                (Ok(a), Ok(b)) => assert_eq!(a, b, "spec {i}, round {round}"),
                (a, b) => panic!("spec {i}, round {round}: {a:?} vs {b:?}"),
            }
        }
    }
    assert!(memo.stats().hits > 0, "the second round used the memo");
    // Its `Debug` shows counters, never the resources' text.
    let debug = format!("{memo:?}");
    assert!(
        debug.contains("hits") && !debug.contains("connect_timeout"),
        "{debug}"
    );
}

#[test]
fn the_memo_stays_bounded_and_forgets_deleted_configs() {
    let memo = DecodeMemo::new();
    let runtime = |i: usize| {
        spec(json!({"nodeID": "n", "resources": [
            {"type": "runtime", "value": {"name": format!("rt{i}"), "layer": {"k": i}}}
        ]}))
    };
    let mut largest = 0;
    for i in 0..10_000 {
        resolve_cached(&runtime(i), &NoSecrets, &memo).unwrap();
        largest = largest.max(memo.stats().entries);
    }
    // Each sweep keeps what the last period inserted (about MIN_SWEEP_ENTRIES).
    assert!(
        largest <= 2 * MIN_SWEEP_ENTRIES + 8,
        "{largest} entries at most"
    );
    assert_eq!(memo.stats().misses, 10_000);
    // The first config is gone: resolving it again decodes.
    resolve_cached(&runtime(0), &NoSecrets, &memo).unwrap();
    assert_eq!(memo.stats().misses, 10_001);

    // A live config resolved all along keeps its entries through sweeps.
    let memo = DecodeMemo::with_bounds(16, 1000);
    let live = resources(twenty("1s"));
    for i in 0..200 {
        resolve_cached(&live, &NoSecrets, &memo).unwrap();
        resolve_cached(&runtime(i), &NoSecrets, &memo).unwrap();
    }
    assert_eq!(
        memo.stats().misses,
        20 + 200,
        "the live config decoded once"
    );

    // Churn next to a live set raises the sweep threshold; the hard bound holds anyway.
    let memo = DecodeMemo::with_bounds(16, 64);
    for i in 0..2000 {
        resolve_cached(&live, &NoSecrets, &memo).unwrap();
        resolve_cached(&runtime(i), &NoSecrets, &memo).unwrap();
        assert!(
            memo.stats().entries <= 64 + 1,
            "round {i}: {:?}",
            memo.stats()
        );
    }
}

/// A rough figure, not an assertion: time per resolution of a 20-resource spec with and
/// without the memo (debug build unless run with `--release`). `--nocapture` shows it.
#[test]
fn time_per_resolution_with_and_without_the_memo() {
    let s = resources(twenty("1s"));
    let memo = DecodeMemo::new();
    resolve_cached(&s, &NoSecrets, &memo).unwrap();
    let rounds = 20;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        resolve(&s, &NoSecrets).unwrap();
    }
    let without = start.elapsed() / rounds;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        resolve_cached(&s, &NoSecrets, &memo).unwrap();
    }
    let with = start.elapsed() / rounds;
    println!("20-resource EnvoyConfig: {without:?} per resolution without the memo, {with:?} with");
}
