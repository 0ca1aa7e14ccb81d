//! The encoded size of a fleet-wide answer, for BENCHMARKS.md:
//! `cargo test -p marin3r-xds --lib --release csds::size -- --ignored --nocapture`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use envoy_types::pb::envoy::service::status::v3::ClientStatusRequest;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;

use crate::events::Api;
use crate::snapshot::{Snapshot, SnapshotCache};
use crate::stats::StreamId;
use marin3r_envoyconfig::resource::{Resource, ResourceType};

use super::bounds::{MAX_ANSWER_BYTES, MAX_PATTERN_BYTES, MAX_STRING_MATCHERS};
use super::fetch::fetch;
use super::registry::{ClientNode, ClientStatusRegistry, Registration, SharedView};
use super::view::Clock;
use crate::sotw::SotwStream;
use crate::tracking::AdsConfig;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use marin3r_envoyconfig::resource::fnv1a64;
use prost::Message as _;

/// `streams` SotW streams of node `swarm` (the benchmark's swarm: pod `swarm-N`, one
/// cluster and one listener, both ACKed).
fn fleet(streams: usize) -> (ClientStatusRegistry, Vec<Registration>, SnapshotCache) {
    let resource = |kind: ResourceType, name: &str| Resource {
        kind,
        name: name.to_string(),
        body: prost_types::Any {
            type_url: kind.type_url().to_string(),
            value: vec![0; 200],
        },
        digest: fnv1a64(name.as_bytes()),
    };
    let snapshot = Snapshot::new(vec![
        resource(ResourceType::Cluster, "backend"),
        resource(ResourceType::Listener, "http"),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let cache = SnapshotCache::new();
    cache.set("swarm", snapshot.clone());
    let registry = ClientStatusRegistry::new();
    let now = Instant::now();
    let guards = (0..streams)
        .map(|i| {
            let node = crate::NodeInfo {
                id: "swarm".into(),
                pod_name: format!("swarm-{i}"),
            }
            .to_node();
            let mut st = SotwStream::new(AdsConfig::default());
            for t in [ResourceType::Cluster, ResourceType::Listener] {
                let mut req = DiscoveryRequest {
                    node: Some(node.clone()),
                    type_url: t.type_url().into(),
                    ..Default::default()
                };
                let nonce = st.handle_request(req.clone(), &snapshot, now).responses[0]
                    .nonce
                    .clone();
                req.response_nonce = nonce;
                st.handle_request(req, &snapshot, now);
            }
            let view: SharedView = Arc::new(Mutex::new(st));
            registry.register(
                StreamId(i as u64),
                ClientNode::from_node(&node, Api::Sotw),
                view,
            )
        })
        .collect();
    (registry, guards, cache)
}

/// CPU of one query with `matchers` `contains` node id matchers (none matches) over
/// `streams` streams with 1 KiB node ids, as the report's attack sent it
/// (`MATCHERS=200000 STREAMS=500`):
/// `MATCHERS=… STREAMS=… cargo test -p marin3r-xds --lib csds::size::matcher_cpu -- --ignored --nocapture`.
#[test]
#[ignore = "prints a figure for the report"]
fn matcher_cpu() {
    use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher};
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (matchers, streams) = (env("MATCHERS", 200_000), env("STREAMS", 500));
    let registry = ClientStatusRegistry::new();
    let cache = SnapshotCache::new();
    let _guards: Vec<Registration> = (0..streams)
        .map(|i| {
            let view: SharedView = Arc::new(Mutex::new(SotwStream::new(AdsConfig::default())));
            registry.register(
                StreamId(i as u64),
                ClientNode {
                    id: format!("{i:08}-{}", "n".repeat(1000)),
                    pod_name: format!("swarm-{i}"),
                    ..Default::default()
                },
                view,
            )
        })
        .collect();
    // The attack's 12-byte patterns; within the bounds, the longest allowed.
    let pattern_len = if matchers > MAX_STRING_MATCHERS {
        12
    } else {
        MAX_PATTERN_BYTES / matchers.max(1)
    };
    let req = ClientStatusRequest {
        node_matchers: (0..matchers)
            .map(|i| NodeMatcher {
                node_id: Some(StringMatcher {
                    match_pattern: Some(MatchPattern::Contains(format!(
                        "{:z>width$}",
                        i,
                        width = pattern_len
                    ))),
                    ignore_case: false,
                }),
                node_metadatas: vec![],
            })
            .collect(),
        ..Default::default()
    };
    let size = req.encoded_len();
    let started = Instant::now();
    let answer = fetch(&registry, &cache, &req, Clock::now(), MAX_ANSWER_BYTES);
    println!(
        "{matchers} contains matchers ({size} bytes) over {streams} streams: {:?}, {}",
        started.elapsed(),
        match answer {
            Ok(a) => format!("{} matched", a.config.len()),
            Err(e) => format!("refused: {e}"),
        }
    );
}

#[test]
#[ignore = "prints a figure for BENCHMARKS.md"]
fn fleet_wide_answer_size() {
    for streams in [1_000, 10_000] {
        let (registry, _guards, cache) = fleet(streams);
        let started = Instant::now();
        let answer = fetch(
            &registry,
            &cache,
            &ClientStatusRequest::default(),
            Clock::now(),
            usize::MAX,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let built = started.elapsed();
        let size = answer.encoded_len();
        println!(
            "{streams} streams (one cluster, one listener each): fleet-wide answer {size} bytes ({:.0} bytes per stream), built in {built:?}; within the {MAX_ANSWER_BYTES}-byte limit: {}",
            size as f64 / streams as f64,
            size <= MAX_ANSWER_BYTES
        );
    }
}
