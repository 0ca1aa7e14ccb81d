//! The objects of the churn bench in the fake API server: EnvoyConfigs (some generating
//! their endpoints from EndpointSlices), the Services' EndpointSlices and their
//! mutations, and the injected Pods of the swarm's streams.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use marin3r_control_plane::kubernetes::{POD_NODE_ID_ANNOTATION, POD_SELECTOR};

use crate::ads::marker_ip;

/// The namespace of everything.
pub const NS: &str = "default";
/// The EndpointSlices' port name (the EnvoyConfigs' `targetPort`).
const PORT_NAME: &str = "http";
/// Endpoints one slice holds at most (besides its marker).
const MAX_ENDPOINTS: usize = 12;
/// Endpoints of a new slice (besides its marker).
const INITIAL_ENDPOINTS: usize = 4;

/// How the objects are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// EnvoyConfigs (one node each).
    pub configs: usize,
    /// Of those, the first ones generate their endpoints from EndpointSlices.
    pub eds_configs: usize,
    /// EndpointSlices over the Services.
    pub slices: usize,
    /// EnvoyConfigs per Service (the slices' readers).
    pub configs_per_service: usize,
}

impl Layout {
    /// Services the EDS EnvoyConfigs read (at least one).
    pub fn services(&self) -> usize {
        self.eds_configs
            .div_ceil(self.configs_per_service.max(1))
            .max(1)
    }

    /// The node id of EnvoyConfig `i`.
    pub fn node_id(i: usize) -> String {
        format!("churn-{i:04}")
    }

    pub fn node_ids(&self) -> Vec<String> {
        (0..self.configs).map(Self::node_id).collect()
    }

    /// The Service EnvoyConfig `i` reads, if it generates endpoints.
    pub fn service_of_config(&self, i: usize) -> Option<usize> {
        (i < self.eds_configs).then(|| i % self.services())
    }

    /// The Service of slice `j` (consecutive slices belong to different Services, so a
    /// round-robin over the slices spreads the writes over them).
    pub fn service_of_slice(&self, j: usize) -> usize {
        j % self.services()
    }

    /// Per EDS node id, the cluster its streams subscribe to (its Service's name).
    pub fn eds_subscriptions(&self) -> BTreeMap<String, Vec<String>> {
        (0..self.configs)
            .filter_map(|i| {
                self.service_of_config(i)
                    .map(|s| (Self::node_id(i), vec![service_name(s)]))
            })
            .collect()
    }
}

/// The name of Service `s` (also the cluster and ClusterLoadAssignment name).
pub fn service_name(s: usize) -> String {
    format!("svc-{s:03}")
}

/// EnvoyConfig `i` of `layout`: a cluster and a direct-response listener; an EDS one's
/// cluster takes its endpoints over ADS, generated from its Service's EndpointSlices.
pub fn envoyconfig(layout: &Layout, i: usize) -> Value {
    let node = Layout::node_id(i);
    let listener = marin3r_tests::configs::http_listener(
        "http",
        8080,
        json!({"direct_response": {"status": 200, "body": {"inline_string": format!("{node}\n")}}}),
        None,
    );
    let mut resources = vec![marin3r_tests::configs::resource("listener", listener)];
    match layout.service_of_config(i) {
        Some(s) => {
            let name = service_name(s);
            resources.push(marin3r_tests::configs::resource(
                "cluster",
                json!({
                    "name": name,
                    "connect_timeout": "1s",
                    "type": "EDS",
                    "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}},
                }),
            ));
            resources.push(json!({"type": "endpoint", "generateFromEndpointSlices": {
                "clusterName": name,
                "targetPort": PORT_NAME,
                "selector": {"matchLabels": {"kubernetes.io/service-name": name}},
            }}));
        }
        None => resources.push(marin3r_tests::configs::resource(
            "cluster",
            json!({
                "name": "backend",
                "connect_timeout": "1s",
                "type": "STATIC",
                "load_assignment": {
                    "cluster_name": "backend",
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                        "socket_address": {"address": "127.0.0.1", "port_value": 20000}}}}]}],
                },
            }),
        )),
    }
    marin3r_tests::ha::envoyconfig(&node, json!({"nodeID": node, "resources": resources}))
}

/// An injected Pod of `node_id` named `name` (what the discovery service's Pod watch
/// selects).
pub fn pod(node_id: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {POD_SELECTOR.0: POD_SELECTOR.1},
            "annotations": {POD_NODE_ID_ANNOTATION: node_id},
        },
        "spec": {"containers": [{"name": "envoy", "image": "envoy"}]},
    })
}

/// What one EndpointSlice write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    Added,
    Removed,
    NotReady,
    Ready,
}

/// One EndpointSlice as the bench keeps it: its endpoints (host number, ready) and the
/// marker of its last write ([`marker_ip`]).
#[derive(Debug, Clone)]
pub struct Slice {
    pub index: usize,
    pub service: usize,
    endpoints: Vec<(usize, bool)>,
    next_host: usize,
    marker: u64,
}

impl Slice {
    pub fn new(layout: &Layout, index: usize) -> Self {
        Self {
            index,
            service: layout.service_of_slice(index),
            endpoints: (1..=INITIAL_ENDPOINTS).map(|h| (h, true)).collect(),
            next_host: INITIAL_ENDPOINTS + 1,
            marker: 0,
        }
    }

    pub fn name(&self) -> String {
        format!("{}-{:04}", service_name(self.service), self.index)
    }

    /// Write `seq` (≥ 1): endpoints added, removed or turning (not) ready in turn, and
    /// the marker set to `seq`.
    pub fn mutate(&mut self, seq: u64) -> Mutation {
        self.marker = seq;
        let ready = self.endpoints.iter().filter(|e| e.1).count();
        match seq % 4 {
            0 if self.endpoints.len() < MAX_ENDPOINTS => self.add(),
            1 if self.endpoints.len() > 1 && ready > 1 => {
                self.endpoints.remove(0);
                Mutation::Removed
            }
            2 if ready > 1 => {
                if let Some(e) = self.endpoints.iter_mut().find(|e| e.1) {
                    e.1 = false;
                }
                Mutation::NotReady
            }
            _ => match self.endpoints.iter_mut().find(|e| !e.1) {
                Some(e) => {
                    e.1 = true;
                    Mutation::Ready
                }
                None => self.add(),
            },
        }
    }

    fn add(&mut self) -> Mutation {
        self.endpoints.push((self.next_host, true));
        // Host numbers stay below 250 (the last address byte).
        self.next_host = self.next_host % 249 + 1;
        Mutation::Added
    }

    /// The address of host `h` of this slice (below `10.128.0.0`, the markers' range).
    fn address(&self, h: usize) -> String {
        format!(
            "10.{}.{}.{}",
            (self.index >> 8) & 0x7f,
            self.index & 0xff,
            h
        )
    }

    /// The EndpointSlice object.
    pub fn object(&self) -> Value {
        let condition =
            |ready: bool| json!({"ready": ready, "serving": ready, "terminating": false});
        let mut endpoints: Vec<Value> = self
            .endpoints
            .iter()
            .map(|&(h, ready)| json!({"addresses": [self.address(h)], "conditions": condition(ready)}))
            .collect();
        endpoints
            .push(json!({"addresses": [marker_ip(self.marker)], "conditions": condition(true)}));
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {
                "name": self.name(), "namespace": NS,
                "labels": {"kubernetes.io/service-name": service_name(self.service)},
            },
            "ports": [{"name": PORT_NAME, "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::endpoint_marker;

    const LAYOUT: Layout = Layout {
        configs: 10,
        eds_configs: 6,
        slices: 12,
        configs_per_service: 3,
    };

    #[test]
    fn services_spread_over_configs_and_slices() {
        assert_eq!(LAYOUT.services(), 2);
        assert_eq!(LAYOUT.service_of_config(0), Some(0));
        assert_eq!(LAYOUT.service_of_config(5), Some(1));
        assert_eq!(LAYOUT.service_of_config(6), None);
        assert_eq!(LAYOUT.eds_subscriptions().len(), 6);
        assert_eq!(
            (LAYOUT.service_of_slice(0), LAYOUT.service_of_slice(1)),
            (0, 1)
        );
    }

    #[test]
    fn every_write_changes_the_endpoints_and_carries_its_marker() {
        let mut slice = Slice::new(&LAYOUT, 7);
        let mut seen = std::collections::BTreeSet::new();
        let mut before = slice.object();
        for seq in 1..=200 {
            seen.insert(format!("{:?}", slice.mutate(seq)));
            let after = slice.object();
            assert_ne!(after["endpoints"], before["endpoints"], "write {seq}");
            let eps = after["endpoints"].as_array().unwrap();
            assert!(eps.len() >= 2 && eps.len() <= MAX_ENDPOINTS + 1);
            assert!(
                eps.iter().any(|e| e["conditions"]["ready"] == true),
                "a ready endpoint is left"
            );
            // The generated ClusterLoadAssignment carries the marker, ready endpoints
            // healthy and the others not.
            let slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice> =
                vec![serde_json::from_value(after.clone()).unwrap()];
            let cla =
                marin3r_envoyconfig::endpoints::cluster_load_assignment("svc-001", "http", &slices)
                    .unwrap();
            let cla = marin3r_envoyconfig::decode::to_json(&cla).unwrap();
            let lb = cla["endpoints"][0]["lbEndpoints"].as_array().unwrap();
            assert_eq!(lb.len(), eps.len());
            assert!(lb.iter().any(|e| {
                e["endpoint"]["address"]["socketAddress"]["address"] == marker_ip(seq).as_str()
                    && e["healthStatus"] == "HEALTHY"
            }));
            before = after;
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn markers_round_trip() {
        use envoy_types::pb::envoy::config::core::v3::{
            Address, SocketAddress, address, socket_address,
        };
        use envoy_types::pb::envoy::config::endpoint::v3::{
            ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
        };
        let ep = |ip: String| LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: ip,
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(8080)),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        for (seqs, want) in [
            (vec![1, 70_000, 5], 70_000),
            (vec![0], 0),
            (vec![crate::ads::MAX_MARKER], crate::ads::MAX_MARKER),
        ] {
            let mut lb: Vec<LbEndpoint> = seqs.into_iter().map(|s| ep(marker_ip(s))).collect();
            lb.push(ep("10.127.255.9".into()));
            let cla = ClusterLoadAssignment {
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: lb,
                    ..Default::default()
                }],
                ..Default::default()
            };
            assert_eq!(endpoint_marker(&cla), want);
        }
    }
}
