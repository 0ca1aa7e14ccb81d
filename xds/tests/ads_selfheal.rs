//! The pieces the tonic shell wires together, driven with a virtual clock: a snapshot
//! cache, one SotW and one Delta stream (two pods of one node) that keep rejecting a
//! listener, and the stats the self-healing engine reads.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use marin3r_envoyconfig::resource::fnv1a64;
use marin3r_xds::{
    AdsConfig, Api, DeltaStream, NodeInfo, Resource, ResourceType, SharedStats, Snapshot,
    SnapshotCache, SotwStream,
};
use prost_types::Any;

fn node(pod: &str) -> Node {
    NodeInfo {
        id: "gateway".into(),
        pod_name: pod.into(),
    }
    .to_node()
}

fn listener(content: &str) -> Snapshot {
    let t = ResourceType::Listener;
    Snapshot::new(vec![Resource {
        kind: t,
        name: "http".into(),
        body: Any {
            type_url: t.type_url().into(),
            value: content.as_bytes().to_vec(),
        },
        digest: fnv1a64(content.as_bytes()),
    }])
    .unwrap()
}

fn rejected() -> Option<Status> {
    Some(Status {
        code: 3,
        message: "invalid listener".into(),
        details: vec![],
    })
}

#[test]
fn persistent_rejection_reaches_the_taint_threshold_and_a_fix_goes_out_at_once() {
    let cache = SnapshotCache::new();
    let stats = SharedStats::new();
    let t = ResourceType::Listener;
    let mut rx = cache.subscribe("gateway");
    cache.set("gateway", listener("bad"));
    let snap = rx.borrow_and_update().clone();
    let bad = snap.version(t).to_string();

    let mut sotw = SotwStream::new(AdsConfig::default());
    let mut delta = DeltaStream::new(AdsConfig::default());
    let t0 = Instant::now();

    let first = DiscoveryRequest {
        node: Some(node("pod-a")),
        type_url: t.type_url().into(),
        ..Default::default()
    };
    sotw.observe_node(first.node.as_ref());
    let sotw_id = stats.stream_opened(sotw.node().unwrap(), Api::Sotw);
    let out = sotw.handle_request(first, &snap, t0);
    stats.record(&out.events);
    let mut sotw_nonce = Some(out.responses[0].nonce.clone());

    let first = DeltaDiscoveryRequest {
        node: Some(node("pod-b")),
        type_url: t.type_url().into(),
        ..Default::default()
    };
    delta.observe_node(first.node.as_ref());
    stats.stream_opened(delta.node().unwrap(), Api::Delta);
    let out = delta.handle_request(first, &snap, t0);
    stats.record(&out.events);
    let mut delta_nonce = Some(out.responses[0].nonce.clone());

    // Both Envoys NACK whatever they get; time advances to the next timer.
    let mut now = t0;
    let mut responses = 0;
    while !stats.rejected_by_all_pods("gateway", t, &bad, 5) {
        if let Some(n) = sotw_nonce.take() {
            let nack = DiscoveryRequest {
                type_url: t.type_url().into(),
                response_nonce: n,
                error_detail: rejected(),
                ..Default::default()
            };
            stats.record(&sotw.handle_request(nack, &snap, now).events);
        }
        if let Some(n) = delta_nonce.take() {
            let nack = DeltaDiscoveryRequest {
                type_url: t.type_url().into(),
                response_nonce: n,
                error_detail: rejected(),
                ..Default::default()
            };
            stats.record(&delta.handle_request(nack, &snap, now).events);
        }
        if stats.rejected_by_all_pods("gateway", t, &bad, 5) {
            break;
        }
        now = [sotw.next_timer(), delta.next_timer()]
            .into_iter()
            .flatten()
            .min()
            .unwrap();
        let out = sotw.poll_timers(&snap, now);
        responses += out.responses.len();
        sotw_nonce = out.responses.first().map(|r| r.nonce.clone());
        let out = delta.poll_timers(&snap, now);
        responses += out.responses.len();
        delta_nonce = out.responses.first().map(|r| r.nonce.clone());
        assert!(
            now - t0 < Duration::from_secs(5),
            "threshold not reached in time"
        );
    }
    assert_eq!(responses, 8, "4 re-sends per stream, no more");
    assert!(now - t0 <= Duration::from_millis(1500));
    assert_eq!(
        stats.nacks("gateway", t, &bad),
        [("pod-a".to_string(), 5), ("pod-b".to_string(), 5)].into()
    );

    // The fix is pushed at once to both, despite the pending backoff.
    assert!(cache.set("gateway", listener("good")));
    assert!(rx.has_changed().unwrap());
    let fixed = rx.borrow_and_update().clone();
    assert!(fixed.published_at().is_some());
    assert_eq!(sotw.handle_snapshot(&fixed, now).responses.len(), 1);
    assert_eq!(delta.handle_snapshot(&fixed, now).responses.len(), 1);

    stats.stream_closed(sotw.node().unwrap(), Api::Sotw, sotw_id);
    assert_eq!(stats.pods_for_node("gateway"), ["pod-b".to_string()].into());
}
