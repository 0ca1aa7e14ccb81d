//! The ClusterLoadAssignment generated from EndpointSlices (`generateFromEndpointSlices`),
//! built as a typed message: no JSON and no registry decode on this path, which runs on
//! every EndpointSlice change of every EnvoyConfig reading it (it was half of the
//! discovery service's CPU under endpoint churn when it went through protojson and the
//! registry).
//!
//! The result is the same [`Resource`] the registry path gives for the same assignment
//! (the same canonical bytes and the same digest, so versions do not change across an
//! upgrade and replicas of different builds agree): `envoyconfig/tests/endpoints.rs`
//! checks that against the registry for generated slices.

use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use prost::Message;
use prost_types::Any;

use crate::resource::{Resource, ResourceType, fnv1a64};

/// `envoy.config.core.v3.HealthStatus` values the assignment uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Unknown = 0,
    Healthy = 1,
    Unhealthy = 2,
    Draining = 3,
}

impl Health {
    /// Its name in Envoy's enum.
    fn name(self) -> &'static str {
        match self {
            Health::Unknown => "UNKNOWN",
            Health::Healthy => "HEALTHY",
            Health::Unhealthy => "UNHEALTHY",
            Health::Draining => "DRAINING",
        }
    }

    /// Its protojson name; `None` for the default (UNKNOWN), which protojson omits.
    fn json_name(self) -> Option<&'static str> {
        (self != Health::Unknown).then(|| self.name())
    }

    /// Terminating → DRAINING, else serving (or ready, when serving is unset) →
    /// HEALTHY/UNHEALTHY, else UNKNOWN.
    fn of(conditions: Option<&k8s_openapi::api::discovery::v1::EndpointConditions>) -> Self {
        if conditions.and_then(|c| c.terminating) == Some(true) {
            return Health::Draining;
        }
        match conditions.and_then(|c| c.serving.or(c.ready)) {
            Some(true) => Health::Healthy,
            Some(false) => Health::Unhealthy,
            None => Health::Unknown,
        }
    }
}

// The subset of Envoy's messages the assignment fills, with Envoy's field numbers
// (envoy/config/endpoint/v3/endpoint.proto, endpoint_components.proto,
// envoy/config/core/v3/address.proto). Fields are encoded in field-number order, which
// is the canonical encoding of `crate::canonical`.

#[derive(Clone, PartialEq, Message)]
struct ClusterLoadAssignment {
    #[prost(string, tag = "1")]
    cluster_name: String,
    #[prost(message, repeated, tag = "2")]
    endpoints: Vec<LocalityLbEndpoints>,
}

#[derive(Clone, PartialEq, Message)]
struct LocalityLbEndpoints {
    #[prost(message, repeated, tag = "2")]
    lb_endpoints: Vec<LbEndpoint>,
}

#[derive(Clone, PartialEq, Message)]
struct LbEndpoint {
    /// `oneof host_identifier { Endpoint endpoint = 1; … }`
    #[prost(message, optional, tag = "1")]
    endpoint: Option<Endpoint>,
    #[prost(int32, tag = "2")]
    health_status: i32,
}

#[derive(Clone, PartialEq, Message)]
struct Endpoint {
    #[prost(message, optional, tag = "1")]
    address: Option<Address>,
}

#[derive(Clone, PartialEq, Message)]
struct Address {
    /// `oneof address { SocketAddress socket_address = 1; … }`
    #[prost(message, optional, tag = "1")]
    socket_address: Option<SocketAddress>,
}

#[derive(Clone, PartialEq, Message)]
struct SocketAddress {
    #[prost(string, tag = "2")]
    address: String,
    /// `oneof port_specifier { uint32 port_value = 3; … }`: set, so encoded even when 0.
    #[prost(uint32, optional, tag = "3")]
    port_value: Option<u32>,
}

/// One endpoint of the assignment.
#[derive(Debug)]
struct Row<'a> {
    ip: IpAddr,
    port: u32,
    health: Health,
    /// The address as the slice spells it (what is served).
    address: &'a str,
}

impl Row<'_> {
    /// The canonical order: IP, port, health by name, then the spelling.
    fn key(&self) -> (IpAddr, u32, &'static str, &str) {
        (self.ip, self.port, self.health.name(), self.address)
    }
}

/// Builds the ClusterLoadAssignment for `cluster_name` from EndpointSlices: one
/// locality with every endpoint's first address and the port named `target_port` (or
/// with that number), health from the endpoint conditions (terminating → DRAINING,
/// else serving/ready → HEALTHY/UNHEALTHY, else UNKNOWN). FQDN slices are rejected;
/// addresses that are not IPs are skipped. No slices give an empty assignment.
///
/// Canonical: the endpoints are sorted (IP, port, health), so the order of the
/// slices' endpoints, or an endpoint moving to another slice of the Service, gives the
/// same assignment and version, and nothing is pushed; only the fields read here count
/// (a slice's labels, annotations or resourceVersion change nothing).
///
/// Errors name the slice and the rule; `cluster_name` must not be empty (the caller
/// checks it against the spec first).
pub fn cluster_load_assignment<'a>(
    cluster_name: &str,
    target_port: &str,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Result<Resource, String> {
    if cluster_name.is_empty() {
        return Err("clusterName must not be empty".to_string());
    }
    let mut rows = Vec::new();
    for slice in slices {
        let slice_name = || slice.metadata.name.as_deref().unwrap_or_default();
        if slice.address_type == "FQDN" {
            return Err("unsupported EndpointSlice address type FQDN".to_string());
        }
        let port = slice.ports.iter().flatten().find_map(|p| {
            let by_name = p.name.as_deref() == Some(target_port);
            let by_number = p.port.is_some_and(|n| n.to_string() == target_port);
            (by_name || by_number).then_some(p.port).flatten()
        });
        let Some(port) = port else {
            return Err(format!(
                "EndpointSlice {:?} has no port named {target_port:?}",
                slice_name()
            ));
        };
        // Envoy's rule for `port_value` (lte: 65535); Kubernetes allows no other anyway.
        let port = u32::try_from(port)
            .ok()
            .filter(|p| *p <= 65_535)
            .ok_or_else(|| {
                format!(
                    "EndpointSlice {:?} port {target_port:?} is {port}, outside 0-65535",
                    slice_name()
                )
            })?;
        for endpoint in slice.endpoints.iter().flatten() {
            let Some(address) = endpoint.addresses.first() else {
                continue;
            };
            let Ok(ip) = address.parse::<IpAddr>() else {
                continue;
            };
            rows.push(Row {
                ip,
                port,
                health: Health::of(endpoint.conditions.as_ref()),
                address: address.as_str(),
            });
        }
    }
    rows.sort_unstable_by(|a, b| a.key().cmp(&b.key()));
    Ok(resource(cluster_name, &rows))
}

/// The resource of sorted `rows`: canonical protobuf bytes and the digest of the
/// canonical protojson (sorted keys, lowerCamelCase names, defaults omitted), as
/// `decode::finish` computes them for a decoded message.
fn resource(cluster_name: &str, rows: &[Row<'_>]) -> Resource {
    let lb_endpoints = rows
        .iter()
        .map(|row| LbEndpoint {
            endpoint: Some(Endpoint {
                address: Some(Address {
                    socket_address: Some(SocketAddress {
                        address: row.address.to_string(),
                        port_value: Some(row.port),
                    }),
                }),
            }),
            health_status: row.health as i32,
        })
        .collect();
    let message = ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints: vec![LocalityLbEndpoints { lb_endpoints }],
    };
    Resource {
        kind: ResourceType::Endpoint,
        name: cluster_name.to_string(),
        body: Any {
            type_url: ResourceType::Endpoint.type_url().to_string(),
            value: message.encode_to_vec(),
        },
        digest: fnv1a64(canonical_json(cluster_name, rows).as_bytes()),
    }
}

/// `{"clusterName":…,"endpoints":[{"lbEndpoints":[{"endpoint":{"address":{"socketAddress":
/// {"address":…,"portValue":…}}},"healthStatus":…}]}]}`, keys sorted; an empty
/// locality is `{}`, an UNKNOWN health is omitted (protojson's defaults).
fn canonical_json(cluster_name: &str, rows: &[Row<'_>]) -> String {
    let mut out = String::with_capacity(48 + rows.len() * 96);
    out.push_str("{\"clusterName\":");
    push_json_string(&mut out, cluster_name);
    out.push_str(",\"endpoints\":[{");
    if !rows.is_empty() {
        out.push_str("\"lbEndpoints\":[");
        for (i, row) in rows.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"endpoint\":{\"address\":{\"socketAddress\":{\"address\":");
            push_json_string(&mut out, row.address);
            out.push_str(",\"portValue\":");
            out.push_str(&row.port.to_string());
            out.push_str("}}}");
            if let Some(health) = row.health.json_name() {
                out.push_str(",\"healthStatus\":\"");
                out.push_str(health);
                out.push('"');
            }
            out.push('}');
        }
        out.push(']');
    }
    out.push_str("}]}");
    out
}

/// A JSON string literal, escaped as serde_json (and so the canonical writer) does.
fn push_json_string(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        // Serialising a `str` cannot fail; keep the output well-formed regardless.
        Err(_) => out.push_str("\"\""),
    }
}
