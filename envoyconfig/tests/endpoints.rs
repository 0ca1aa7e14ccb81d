//! The typed ClusterLoadAssignment (`endpoints::cluster_load_assignment`) is the resource
//! the registry gives for the same assignment written as protojson: the same name, the
//! same canonical bytes and the same digest (so versions do not move across an upgrade),
//! for generated slices of every shape the function reads; its errors where the
//! registry would refuse the assignment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use marin3r_envoyconfig::decode::{decode_resource, to_json};
use marin3r_envoyconfig::endpoints::cluster_load_assignment;
use marin3r_envoyconfig::{Resource, ResourceType};
use proptest::prelude::*;
use serde_json::{Value, json};

/// The oracle, written apart from the code under test: the assignment as protojson
/// (snake_case, as a user would write it), endpoints in the documented canonical order
/// (IP, port, health name, spelling), decoded through the registry.
fn through_the_registry(
    cluster: &str,
    target_port: &str,
    slices: &[EndpointSlice],
) -> Option<Resource> {
    let mut rows = Vec::new();
    for slice in slices {
        if slice.address_type == "FQDN" {
            return None;
        }
        let port = slice.ports.iter().flatten().find_map(|p| {
            let hit = p.name.as_deref() == Some(target_port)
                || p.port.is_some_and(|n| n.to_string() == target_port);
            hit.then_some(p.port).flatten()
        })?;
        for endpoint in slice.endpoints.iter().flatten() {
            let Some(address) = endpoint.addresses.first() else {
                continue;
            };
            let Ok(ip) = address.parse::<std::net::IpAddr>() else {
                continue;
            };
            let c = endpoint.conditions.as_ref();
            let health = if c.and_then(|c| c.terminating) == Some(true) {
                "DRAINING"
            } else {
                match c.and_then(|c| c.serving.or(c.ready)) {
                    Some(true) => "HEALTHY",
                    Some(false) => "UNHEALTHY",
                    None => "UNKNOWN",
                }
            };
            rows.push((ip, port, health, address.clone()));
        }
    }
    rows.sort();
    let lb: Vec<Value> = rows
        .into_iter()
        .map(|(_, port, health, address)| {
            json!({
                "endpoint": {"address": {"socket_address": {"address": address, "port_value": port}}},
                "health_status": health,
            })
        })
        .collect();
    let body = json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": lb}]});
    decode_resource(ResourceType::Endpoint, &body).ok()
}

fn endpoint(
    ip: &str,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready,
            serving,
            terminating,
        }),
        ..Default::default()
    }
}

fn slice(
    name: &str,
    ports: Vec<(Option<&str>, Option<i32>)>,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ports: Some(
            ports
                .into_iter()
                .map(|(name, port)| EndpointPort {
                    name: name.map(str::to_string),
                    port,
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

#[test]
fn a_typical_assignment_equals_the_registry_one() {
    let slices = [
        slice(
            "kuard-a",
            vec![(Some("http"), Some(8080))],
            vec![
                endpoint("10.0.0.3", Some(true), None, Some(true)),
                endpoint("10.0.0.1", Some(true), None, None),
                endpoint("fd00::1", None, Some(false), None),
                endpoint("not-an-ip", Some(true), None, None),
                endpoint("10.0.0.2", None, None, None),
            ],
        ),
        slice(
            "kuard-b",
            vec![(Some("http"), Some(8080))],
            vec![endpoint("10.0.0.0", Some(false), None, None)],
        ),
    ];
    let typed = cluster_load_assignment("kuard", "http", &slices).unwrap();
    assert_eq!(
        Some(&typed),
        through_the_registry("kuard", "http", &slices).as_ref()
    );
    let served = to_json(&typed).unwrap();
    let health: Vec<&str> = served["endpoints"][0]["lbEndpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["healthStatus"].as_str().unwrap_or("UNKNOWN"))
        .collect();
    assert_eq!(
        health,
        ["UNHEALTHY", "HEALTHY", "UNKNOWN", "DRAINING", "UNHEALTHY"]
    );
    // The port by number works as by name.
    let by_number = cluster_load_assignment("kuard", "8080", &slices).unwrap();
    assert_eq!(by_number, typed);
}

#[test]
fn no_slices_and_no_endpoints_give_the_registrys_empty_assignment() {
    let empty = cluster_load_assignment("c", "http", &[]).unwrap();
    assert_eq!(
        Some(&empty),
        through_the_registry("c", "http", &[]).as_ref()
    );
    assert_eq!(
        to_json(&empty).unwrap(),
        json!({"clusterName": "c", "endpoints": [{}]})
    );
    let no_endpoints = [slice("s", vec![(Some("http"), Some(80))], vec![])];
    assert_eq!(
        cluster_load_assignment("c", "http", &no_endpoints).unwrap(),
        empty
    );
}

#[test]
fn errors_name_the_slice_and_the_rule() {
    let fqdn = EndpointSlice {
        address_type: "FQDN".into(),
        ..slice("s", vec![(Some("http"), Some(80))], vec![])
    };
    assert_eq!(
        cluster_load_assignment("c", "http", [&fqdn]).unwrap_err(),
        "unsupported EndpointSlice address type FQDN"
    );
    let other_port = slice("web", vec![(Some("grpc"), Some(80))], vec![]);
    assert_eq!(
        cluster_load_assignment("c", "http", [&other_port]).unwrap_err(),
        r#"EndpointSlice "web" has no port named "http""#
    );
    // Where the registry refuses the assignment (Envoy's `port_value` lte 65535), the
    // typed path refuses it too, naming the slice.
    for port in [-1, 65_536, i32::MAX] {
        let bad = slice(
            "web",
            vec![(Some("http"), Some(port))],
            vec![endpoint("10.0.0.1", Some(true), None, None)],
        );
        assert!(
            through_the_registry("c", "http", std::slice::from_ref(&bad)).is_none(),
            "{port}"
        );
        let e = cluster_load_assignment("c", "http", [&bad]).unwrap_err();
        assert!(
            e.contains(r#"EndpointSlice "web""#) && e.contains("0-65535"),
            "{e}"
        );
    }
    assert!(cluster_load_assignment("", "http", &[]).is_err());
}

fn arb_endpoint() -> impl Strategy<Value = Endpoint> {
    let ip = prop_oneof![
        (0u8..4, 0u8..4).prop_map(|(a, b)| format!("10.0.{a}.{b}")),
        (0u16..4).prop_map(|a| format!("fd00::{a:x}")),
        Just("not-an-ip".to_string()),
        Just("010.0.0.1".to_string()),
    ];
    let cond = proptest::option::of(any::<bool>());
    (ip, cond.clone(), cond.clone(), cond, any::<bool>()).prop_map(
        |(ip, ready, serving, terminating, no_conditions)| {
            let mut e = endpoint(&ip, ready, serving, terminating);
            if no_conditions {
                e.conditions = None;
            }
            e
        },
    )
}

fn arb_slice() -> impl Strategy<Value = EndpointSlice> {
    let port = prop_oneof![
        Just(Some(8080)),
        Just(Some(0)),
        Just(Some(65_535)),
        Just(None),
        (1i32..3).prop_map(Some)
    ];
    let name = prop_oneof![Just(Some("http")), Just(Some("other")), Just(None)];
    (
        proptest::collection::vec((name, port), 0..3),
        proptest::collection::vec(arb_endpoint(), 0..6),
        0u8..3,
    )
        .prop_map(|(ports, endpoints, n)| slice(&format!("s{n}"), ports, endpoints))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever the slices, the typed path gives exactly the registry's resource (bytes
    /// and digest), or fails exactly where the oracle has no assignment.
    #[test]
    fn the_typed_assignment_is_the_registrys(
        slices in proptest::collection::vec(arb_slice(), 0..4),
        target in prop_oneof![Just("http"), Just("8080"), Just("0")],
        cluster in prop_oneof![Just("kuard"), Just("a \"quoted\" ü cluster\n")],
    ) {
        let typed = cluster_load_assignment(cluster, target, &slices).ok();
        prop_assert_eq!(typed, through_the_registry(cluster, target, &slices));
    }
}
