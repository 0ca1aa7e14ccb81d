//! Scenario tests of client status: real SotW and Delta state machines, the registry, the
//! matchers and the query together.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::{
    ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::path_segment::Segment;
use envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern as ValuePattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher};
use envoy_types::pb::google::protobuf::{Timestamp, value::Kind};

use crate::events::Api;
use crate::snapshot::{Snapshot, SnapshotCache};
use crate::stats::StreamId;
use marin3r_envoyconfig::resource::{Resource, ResourceType};
use marin3r_wire::POD_NAME_METADATA_KEY;

use super::bounds::{CsdsError, MAX_ANSWER_BYTES, MAX_PATTERN_BYTES, MAX_STRING_MATCHERS};
use super::fetch::fetch;
use super::matcher::NodeFilter;
use super::registry::{
    API_METADATA_KEY, ClientNode, ClientStatusRegistry, Registration, SharedView,
};
use super::view::{ClientView, Clock, ViewInput};
use crate::delta::DeltaStream;
use crate::node::NodeInfo;
use crate::snapshot::tests::snap;
use crate::sotw::SotwStream;
use crate::tracking::AdsConfig;
use ResourceType::*;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::PathSegment;
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StructMatcher, ValueMatcher};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message as _;
use std::time::Duration;

fn envoy_node(id: &str, pod: &str) -> Node {
    NodeInfo {
        id: id.into(),
        pod_name: pod.into(),
    }
    .to_node()
}

fn clock(at: Instant) -> Clock {
    Clock {
        system: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
        instant: at,
    }
}

fn view<V: ClientView>(v: &V, now: Instant) -> Vec<GenericXdsConfig> {
    v.generic_xds_configs(&ViewInput {
        clock: clock(now),
        contents: None,
    })
}

fn one<'a>(gs: &'a [GenericXdsConfig], name: &str) -> &'a GenericXdsConfig {
    gs.iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("no {name} in {gs:?}"))
}

fn statuses(g: &GenericXdsConfig) -> (ClientResourceStatus, ConfigStatus) {
    (
        ClientResourceStatus::try_from(g.client_status).unwrap(),
        ConfigStatus::try_from(g.config_status).unwrap(),
    )
}

fn sotw_req(t: ResourceType, names: &[&str], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(envoy_node("n1", "pod-a")),
        type_url: t.type_url().into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn nack(mut req: DiscoveryRequest, msg: &str) -> DiscoveryRequest {
    req.error_detail = Some(RpcStatus {
        code: 3,
        message: msg.into(),
        details: vec![],
    });
    req
}

fn first_response(out: crate::SotwOutcome) -> DiscoveryResponse {
    out.responses.into_iter().next().unwrap()
}

#[test]
fn sotw_ack_nack_and_rollback_per_resource() {
    let t0 = Instant::now();
    let s1 = snap(&[(Listener, "a", "1"), (Listener, "b", "1")]);
    let mut st = SotwStream::new(AdsConfig::default());
    let r1 = first_response(st.handle_request(sotw_req(Listener, &[], ""), &s1, t0));
    // Sent, not answered: REQUESTED and STALE, no version yet.
    let g = view(&st, t0);
    assert_eq!(
        statuses(one(&g, "a")),
        (ClientResourceStatus::Requested, ConfigStatus::Stale)
    );
    assert_eq!(one(&g, "a").version_info, "");
    let t1 = t0 + Duration::from_secs(1);
    st.handle_request(sotw_req(Listener, &[], &r1.nonce), &s1, t1);
    let g = view(&st, t1);
    for name in ["a", "b"] {
        assert_eq!(
            statuses(one(&g, name)),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
        assert_eq!(one(&g, name).version_info, r1.version_info);
        assert_eq!(
            one(&g, name).last_updated,
            clock(t1).timestamp(t1),
            "when it was ACKed"
        );
    }
    // Only b changes: b is STALE until answered; then a keeps the older version
    // (as Envoy shows it), b has the new one.
    let s2 = snap(&[(Listener, "a", "1"), (Listener, "b", "2")]);
    let t2 = t1 + Duration::from_secs(1);
    let r2 = first_response(st.handle_snapshot(&s2, t2));
    let g = view(&st, t2);
    assert_eq!(
        statuses(one(&g, "a")),
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    );
    assert_eq!(
        statuses(one(&g, "b")),
        (ClientResourceStatus::Acked, ConfigStatus::Stale)
    );
    st.handle_request(sotw_req(Listener, &[], &r2.nonce), &s2, t2);
    let g = view(&st, t2);
    assert_eq!(one(&g, "a").version_info, r1.version_info);
    assert_eq!(one(&g, "a").last_updated, clock(t2).timestamp(t1));
    assert_eq!(one(&g, "b").version_info, r2.version_info);

    // b changes again and is rejected: NACKED / ERROR with Envoy's message, the
    // rejected version and the time; the version stays the ACKed one; a is not
    // concerned.
    let s3 = snap(&[(Listener, "a", "1"), (Listener, "b", "3")]);
    let t3 = t2 + Duration::from_secs(1);
    let r3 = first_response(st.handle_snapshot(&s3, t3));
    st.handle_request(
        nack(sotw_req(Listener, &[], &r3.nonce), "b: unknown cluster 'x'"),
        &s3,
        t3,
    );
    let g = view(&st, t3);
    let b = one(&g, "b");
    assert_eq!(
        statuses(b),
        (ClientResourceStatus::Nacked, ConfigStatus::Error)
    );
    assert_eq!(b.version_info, r2.version_info);
    assert_eq!(
        b.error_state,
        Some(UpdateFailureState {
            failed_configuration: None,
            last_update_attempt: clock(t3).timestamp(t3),
            details: "b: unknown cluster 'x'".into(),
            version_info: r3.version_info.clone(),
        })
    );
    assert_eq!(
        statuses(one(&g, "a")),
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    );

    // Rolled back to s2: the re-sent b (the digest it runs) is ACKed: no error.
    let t4 = t3 + Duration::from_secs(1);
    let r4 = first_response(st.handle_snapshot(&s2, t4));
    st.handle_request(sotw_req(Listener, &[], &r4.nonce), &s2, t4);
    let g = view(&st, t4);
    let b = one(&g, "b");
    assert_eq!(
        statuses(b),
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    );
    assert_eq!(b.error_state, None);
    assert_eq!(b.version_info, r2.version_info, "unchanged since r2");

    // a is removed from the snapshot: gone once the client ACKs.
    let s5 = snap(&[(Listener, "b", "2")]);
    let r5 = first_response(st.handle_snapshot(&s5, t4));
    assert_eq!(
        statuses(one(&view(&st, t4), "a")),
        (ClientResourceStatus::Acked, ConfigStatus::Stale)
    );
    st.handle_request(sotw_req(Listener, &[], &r5.nonce), &s5, t4);
    let g = view(&st, t4);
    assert_eq!(g.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["b"]);
}

#[test]
fn sotw_names_not_served_are_requested_then_do_not_exist() {
    let t0 = Instant::now();
    let held = Snapshot::placeholder();
    let mut st = SotwStream::new(AdsConfig::default());
    st.handle_request(sotw_req(Route, &["r1", "r9"], ""), &held, t0);
    let g = view(&st, t0);
    assert_eq!(
        statuses(one(&g, "r9")),
        (ClientResourceStatus::Requested, ConfigStatus::NotSent)
    );
    let s1 = snap(&[(Route, "r1", "1")]);
    let r = first_response(st.handle_snapshot(&s1, t0));
    st.handle_request(sotw_req(Route, &["r1", "r9"], &r.nonce), &s1, t0);
    let g = view(&st, t0);
    assert_eq!(
        statuses(one(&g, "r9")),
        (ClientResourceStatus::DoesNotExist, ConfigStatus::Synced)
    );
    assert_eq!(
        statuses(one(&g, "r1")),
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    );
}

fn delta_req(t: ResourceType, sub: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(envoy_node("n1", "pod-a")),
        type_url: t.type_url().into(),
        resource_names_subscribe: sub.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn delta_first(out: crate::DeltaOutcome) -> DeltaDiscoveryResponse {
    out.responses.into_iter().next().unwrap()
}

#[test]
fn delta_versions_are_per_resource_and_removals_disappear() {
    let t0 = Instant::now();
    let s1 = snap(&[(Cluster, "c1", "1"), (Cluster, "c2", "1")]);
    let mut st = DeltaStream::new(AdsConfig::default());
    let r1 = delta_first(st.handle_request(delta_req(Cluster, &[], ""), &s1, t0));
    st.handle_request(delta_req(Cluster, &[], &r1.nonce), &s1, t0);
    let g = view(&st, t0);
    for name in ["c1", "c2"] {
        let sent = r1.resources.iter().find(|r| r.name == name).unwrap();
        assert_eq!(one(&g, name).version_info, sent.version);
        assert_eq!(
            statuses(one(&g, name)),
            (ClientResourceStatus::Acked, ConfigStatus::Synced)
        );
    }
    // c2 removed, c1 changed and rejected: c2 STALE until the answer; c1 NACKED
    // with its rejected resource version, keeps its ACKed one.
    let s2 = snap(&[(Cluster, "c1", "2")]);
    let r2 = delta_first(st.handle_snapshot(&s2, t0));
    assert_eq!(
        statuses(one(&view(&st, t0), "c2")),
        (ClientResourceStatus::Acked, ConfigStatus::Stale)
    );
    let mut rejected = delta_req(Cluster, &[], &r2.nonce);
    rejected.error_detail = Some(RpcStatus {
        code: 3,
        message: "bad c1".into(),
        details: vec![],
    });
    st.handle_request(rejected, &s2, t0);
    let g = view(&st, t0);
    let c1 = one(&g, "c1");
    assert_eq!(
        statuses(c1),
        (ClientResourceStatus::Nacked, ConfigStatus::Error)
    );
    assert_eq!(c1.version_info, r1.resources[0].version);
    assert_eq!(
        c1.error_state.as_ref().map(|e| e.version_info.as_str()),
        Some(r2.resources[0].version.as_str())
    );
    // The re-send after the backoff is ACKed: c1 at its new version, c2 gone.
    let r3 = delta_first(st.poll_timers(&s2, t0 + Duration::from_secs(1)));
    st.handle_request(delta_req(Cluster, &[], &r3.nonce), &s2, t0);
    let g = view(&st, t0);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(
        statuses(&g[0]),
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    );
    assert_eq!(g[0].version_info, r2.resources[0].version);
    assert_eq!(g[0].error_state, None);
}

#[test]
fn a_nack_message_is_redacted_and_bounded_as_the_stats_store_it() {
    let t0 = Instant::now();
    let s1 = snap(&[(Secret, "s", "1")]);
    let mut st = SotwStream::new(AdsConfig::default());
    let r1 = first_response(st.handle_request(sotw_req(Secret, &["s"], ""), &s1, t0));
    let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7".repeat(3);
    let message = format!(
        "private_key: \"-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----\" {}",
        "no such cluster; ".repeat(1_000)
    );
    st.handle_request(nack(sotw_req(Secret, &["s"], &r1.nonce), &message), &s1, t0);
    let g = view(&st, t0);
    let details = &one(&g, "s").error_state.as_ref().unwrap().details;
    assert_eq!(details, &crate::tracking::stored_nack_message(&message));
    assert!(!details.contains(&body[..40]));
    assert_eq!(details.len(), crate::acknack::MAX_NACK_MESSAGE_BYTES);
}

// -- matchers --------------------------------------------------------------------

fn string(p: MatchPattern, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(p),
        ignore_case,
    }
}

fn by_id(p: MatchPattern, ignore_case: bool) -> NodeMatcher {
    NodeMatcher {
        node_id: Some(string(p, ignore_case)),
        node_metadatas: vec![],
    }
}

fn by_meta(key: &str, p: MatchPattern) -> NodeMatcher {
    NodeMatcher {
        node_id: None,
        node_metadatas: vec![StructMatcher {
            path: vec![PathSegment {
                segment: Some(Segment::Key(key.into())),
            }],
            value: Some(ValueMatcher {
                match_pattern: Some(ValuePattern::StringMatch(string(p, false))),
            }),
        }],
    }
}

fn client(id: &str, pod: &str, ns: &str) -> ClientNode {
    ClientNode {
        id: id.into(),
        pod_name: pod.into(),
        pod_namespace: ns.into(),
        ..Default::default()
    }
}

#[test]
fn node_matchers_select_by_id_and_pod_and_refuse_what_is_not_supported() {
    use MatchPattern::*;
    let gw = client("gateway-eu", "gw-0", "prod");
    let other = client("Sidecar-1", "app-0", "dev");
    let f = |ms: Vec<NodeMatcher>| NodeFilter::compile(&ms).unwrap();
    assert!(f(vec![]).matches(&gw) && f(vec![]).matches(&other));
    assert!(!f(vec![]).is_targeted());
    for (m, gw_in, other_in) in [
        (by_id(Exact("gateway-eu".into()), false), true, false),
        (by_id(Exact("GATEWAY-EU".into()), false), false, false),
        (by_id(Exact("GATEWAY-EU".into()), true), true, false),
        (by_id(Prefix("gateway".into()), false), true, false),
        (by_id(Prefix("sidecar".into()), true), false, true),
        (by_id(Suffix("-eu".into()), false), true, false),
        (by_id(Contains("car".into()), false), false, true),
        (by_meta("pod_name", Prefix("gw-".into())), true, false),
        (by_meta("pod_namespace", Exact("dev".into())), false, true),
    ] {
        let filter = f(vec![m.clone()]);
        assert_eq!(
            (filter.matches(&gw), filter.matches(&other)),
            (gw_in, other_in),
            "{m:?}"
        );
    }
    // OR of matchers; AND within one.
    let either = f(vec![
        by_id(Exact("gateway-eu".into()), false),
        by_id(Exact("Sidecar-1".into()), false),
    ]);
    assert!(either.matches(&gw) && either.matches(&other));
    assert!(either.is_targeted());
    let mut both = by_id(Prefix("gateway".into()), false);
    both.node_metadatas = by_meta("pod_namespace", Exact("dev".into())).node_metadatas;
    assert!(!f(vec![both]).matches(&gw));
    assert!(!f(vec![by_id(Prefix("g".into()), false)]).is_targeted());

    let refused = |m: NodeMatcher| NodeFilter::compile(&[by_id(Exact("x".into()), false), m]);
    assert_eq!(
        refused(by_id(SafeRegex(RegexMatcher::default()), false))
            .unwrap_err()
            .to_string(),
        "node_matchers[1].node_id.safe_regex: not supported: use exact, prefix, suffix or contains"
    );
    assert_eq!(
        refused(by_meta("labels", Exact("x".into())))
            .unwrap_err()
            .to_string(),
        "node_matchers[1].node_metadatas[0].path: must be a single key, pod_name or pod_namespace"
    );
    let mut bool_value = by_meta("pod_name", Exact("x".into()));
    bool_value.node_metadatas[0].value = Some(ValueMatcher {
        match_pattern: Some(ValuePattern::BoolMatch(true)),
    });
    assert_eq!(
        refused(bool_value).unwrap_err().to_string(),
        "node_matchers[1].node_metadatas[0].value: must be a string_match"
    );
}

// -- the query -------------------------------------------------------------------

/// A registry with an ACKed SotW stream per `(node, pod)` serving `snapshot`.
fn registry_with(
    streams: &[(&str, &str)],
    snapshot: &Snapshot,
    cache: &SnapshotCache,
) -> (ClientStatusRegistry, Vec<Registration>) {
    let registry = ClientStatusRegistry::new();
    let mut guards = Vec::new();
    let t0 = Instant::now();
    for (i, (id, pod)) in streams.iter().enumerate() {
        cache.set(id, snapshot.clone());
        let mut st = SotwStream::new(AdsConfig::default());
        for t in [Cluster, Listener, Secret] {
            let mut req = sotw_req(t, if t == Secret { &["s"] } else { &[] }, "");
            req.node = Some(envoy_node(id, pod));
            if let Some(r) = st
                .handle_request(req.clone(), snapshot, t0)
                .responses
                .first()
            {
                req.response_nonce = r.nonce.clone();
                st.handle_request(req, snapshot, t0);
            }
        }
        let view: SharedView = Arc::new(Mutex::new(st));
        let node = ClientNode::from_node(&envoy_node(id, pod), Api::Sotw);
        guards.push(registry.register(StreamId(i as u64), node, view));
    }
    (registry, guards)
}

/// A P-256 key made for these tests.
const KEY_LINE: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQggn38lrYNOeHoEtpZ";

fn decoded(kind: ResourceType, yaml: &str) -> Resource {
    marin3r_envoyconfig::decode_str(kind, yaml, marin3r_envoyconfig::Serialization::Yaml).unwrap()
}

/// Cluster `c`, listener `l` whose TLS key is inline, Secret `s`.
fn snapshot() -> Snapshot {
    let cluster = decoded(Cluster, "name: c\nconnect_timeout: 1s\n");
    let listener = decoded(
        Listener,
        &format!(
            r#"name: l
address: {{socket_address: {{address: 0.0.0.0, port_value: 8443}}}}
filter_chains:
- filters:
  - name: tcp
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
      stat_prefix: tcp
      cluster: c
  transport_socket:
    name: envoy.transport_sockets.tls
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
      common_tls_context:
        tls_certificates:
        - certificate_chain: {{filename: /etc/envoy/tls.crt}}
          private_key:
            inline_string: |
              -----BEGIN PRIVATE KEY-----
              {KEY_LINE}
              ORKmMC83m2eEU9DfhbkhlULqagShRANCAAQV7LtfEZpm4h6J5eSnfG4suXaOJeUM
              zAiGOwxEXf3x0jOlarx5NMg8ABmkpPRrUSZFzLcjJarpeSoU2gYDPgob
              -----END PRIVATE KEY-----
"#
        ),
    );
    let mut resources = vec![cluster, listener];
    resources.push(crate::snapshot::tests::res(Secret, "s", "KEY-MATERIAL"));
    Snapshot::new(resources).unwrap()
}

#[test]
fn contents_only_for_targeted_queries_and_never_for_secrets() {
    let cache = SnapshotCache::new();
    let (registry, _guards) = registry_with(
        &[("b", "pod-1"), ("a", "pod-2"), ("a", "pod-1")],
        &snapshot(),
        &cache,
    );
    let q = |matchers: Vec<NodeMatcher>, exclude: bool| {
        fetch(
            &registry,
            &cache,
            &ClientStatusRequest {
                node_matchers: matchers,
                exclude_resource_contents: exclude,
                ..Default::default()
            },
            Clock::now(),
            MAX_ANSWER_BYTES,
        )
        .unwrap()
    };
    let all = q(vec![], false);
    // Sorted by node id, then pod name.
    let order: Vec<(String, String)> = all
        .config
        .iter()
        .map(|cc| {
            let n = cc.node.as_ref().unwrap();
            let pod = match n.metadata.as_ref().unwrap().fields[POD_NAME_METADATA_KEY]
                .kind
                .as_ref()
            {
                Some(Kind::StringValue(s)) => s.clone(),
                _ => String::new(),
            };
            (n.id.clone(), pod)
        })
        .collect();
    assert_eq!(
        order,
        [
            ("a".to_string(), "pod-1".to_string()),
            ("a".into(), "pod-2".into()),
            ("b".into(), "pod-1".into())
        ]
    );
    // (name, the content as Envoy's config dump shows it)
    let contents = |r: &ClientStatusResponse| -> Vec<(String, String)> {
        r.config
            .iter()
            .flat_map(|cc| &cc.generic_xds_configs)
            .filter_map(|g| {
                g.xds_config.as_ref().map(|a| {
                    let kind = ResourceType::from_type_url(&a.type_url).unwrap();
                    let shown = Resource {
                        kind,
                        name: g.name.clone(),
                        body: prost_types::Any {
                            type_url: a.type_url.clone(),
                            value: a.value.clone(),
                        },
                        digest: 0,
                    };
                    let json = marin3r_envoyconfig::decode::to_json(&shown).unwrap();
                    (g.name.clone(), json.to_string())
                })
            })
            .collect()
    };
    assert!(contents(&all).is_empty(), "fleet-wide: no contents");
    let exact_a = by_id(MatchPattern::Exact("a".into()), false);
    let targeted = q(vec![exact_a.clone()], false);
    assert_eq!(targeted.config.len(), 2);
    let shown = contents(&targeted);
    assert_eq!(
        shown.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["c", "l", "c", "l"],
        "never the Secret"
    );
    assert_eq!(shown[0].1, r#"{"connectTimeout":"1s","name":"c"}"#);
    // The inline key of the listener shows as Envoy's config dump shows it.
    let listener = &shown[1].1;
    assert!(
        listener.contains(r#""privateKey":{"inlineString":"[redacted]"}"#),
        "{listener}"
    );
    assert!(listener.contains("/etc/envoy/tls.crt"), "{listener}");
    let encoded = String::from_utf8_lossy(&targeted.encode_to_vec()).into_owned();
    for needle in [KEY_LINE, "PRIVATE KEY"] {
        assert!(!encoded.contains(needle), "{needle} in the answer");
    }
    // The Secret is listed with its name and version only.
    let s = one(&targeted.config[0].generic_xds_configs, "s");
    assert_eq!(
        statuses(s),
        (ClientResourceStatus::Acked, ConfigStatus::Synced)
    );
    assert!(s.xds_config.is_none() && !s.version_info.is_empty());
    assert!(!String::from_utf8_lossy(&targeted.encode_to_vec()).contains("KEY-MATERIAL"));
    assert!(contents(&q(vec![exact_a], true)).is_empty(), "excluded");
    assert!(
        contents(&q(
            vec![by_id(MatchPattern::Prefix("a".into()), false)],
            false
        ))
        .is_empty(),
        "a prefix is not targeted"
    );
    // The node and API of each stream.
    let n = all.config[0].node.as_ref().unwrap();
    assert!(matches!(
        n.metadata.as_ref().unwrap().fields[API_METADATA_KEY].kind.as_ref(),
        Some(Kind::StringValue(s)) if s == "sotw"
    ));
}

#[test]
fn an_answer_over_the_limit_is_refused_before_it_is_all_built() {
    let cache = SnapshotCache::new();
    let streams: Vec<(String, String)> = (0..50)
        .map(|i| (format!("node-{i:02}"), "pod".to_string()))
        .collect();
    let refs: Vec<(&str, &str)> = streams
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (registry, _guards) = registry_with(&refs, &snapshot(), &cache);
    let req = ClientStatusRequest::default();
    let full = fetch(&registry, &cache, &req, Clock::now(), MAX_ANSWER_BYTES).unwrap();
    let size = full.encoded_len();
    assert_eq!(
        fetch(&registry, &cache, &req, Clock::now(), size).map(|r| r.config.len()),
        Ok(50),
        "at the limit"
    );
    let err = fetch(&registry, &cache, &req, Clock::now(), size / 2).unwrap_err();
    let CsdsError::TooLarge {
        matched,
        size: counted,
        limit,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((*matched, *limit), (50, size / 2));
    // It stopped at the first stream over the limit.
    assert!(
        *counted > size / 2 && *counted < size / 2 + size / 50 + 1,
        "{counted}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the status of the 50 Envoys matched is over {counted} bytes, over the limit of {} bytes: narrow node_matchers (e.g. a node id prefix)",
            size / 2
        )
    );
}

fn contains_id(p: &str) -> NodeMatcher {
    by_id(MatchPattern::Contains(p.into()), false)
}

#[test]
fn a_query_over_the_matcher_bounds_is_refused_naming_the_limit() {
    let cache = SnapshotCache::new();
    let (registry, _guards) = registry_with(&[("a", "p1")], &snapshot(), &cache);
    let query = |node_matchers: Vec<NodeMatcher>| {
        fetch(
            &registry,
            &cache,
            &ClientStatusRequest {
                node_matchers,
                ..Default::default()
            },
            Clock::now(),
            MAX_ANSWER_BYTES,
        )
    };
    // At the bounds: answered.
    let mut at_count: Vec<NodeMatcher> = (0..MAX_STRING_MATCHERS - 1)
        .map(|i| contains_id(&format!("x{i}")))
        .collect();
    at_count.push(contains_id("a"));
    assert_eq!(query(at_count.clone()).map(|r| r.config.len()), Ok(1));
    let mut at_bytes = by_meta("pod_name", MatchPattern::Contains("p".repeat(100)));
    at_bytes.node_id = Some(string(
        MatchPattern::Prefix("a".repeat(MAX_PATTERN_BYTES - 100 - "pod_name".len())),
        false,
    ));
    assert_eq!(query(vec![at_bytes.clone()]).map(|r| r.config.len()), Ok(0));

    // One over: refused, naming the limit; node_metadatas count too.
    let mut over_count = at_count;
    over_count[0]
        .node_metadatas
        .push(by_meta("pod_name", MatchPattern::Exact("p1".into())).node_metadatas[0].clone());
    let err = query(over_count).unwrap_err();
    assert_eq!(
        err,
        CsdsError::TooManyMatchers {
            what: "string matchers",
            count: MAX_STRING_MATCHERS + 1,
            limit: MAX_STRING_MATCHERS
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "node_matchers: {} string matchers, over the limit of {MAX_STRING_MATCHERS}: ask for fewer nodes per query (e.g. a node id prefix)",
            MAX_STRING_MATCHERS + 1
        )
    );
    let mut over_bytes = at_bytes;
    over_bytes.node_metadatas[0].value = Some(ValueMatcher {
        match_pattern: Some(ValuePattern::StringMatch(string(
            MatchPattern::Contains("p".repeat(101)),
            false,
        ))),
    });
    assert_eq!(
        query(vec![over_bytes]).unwrap_err(),
        CsdsError::TooManyMatchers {
            what: "bytes of patterns",
            count: MAX_PATTERN_BYTES + 1,
            limit: MAX_PATTERN_BYTES
        }
    );
    // The query of the report: 200,000 `contains` matchers (2.4 MB).
    let flood: Vec<NodeMatcher> = (0..200_000)
        .map(|i| contains_id(&format!("zz{i:06}")))
        .collect();
    assert!(matches!(
        query(flood),
        Err(CsdsError::TooManyMatchers { count: 200_000, .. })
    ));
}

#[test]
fn matchers_run_without_the_registry_lock_a_stream_registers_meanwhile() {
    let cache = SnapshotCache::new();
    let (registry, _guards) = registry_with(&[("a", "p1"), ("b", "p2")], &snapshot(), &cache);
    let mut registered = Vec::new();
    let found = registry.matching(|node| {
        // While the query matches, the registry is free: a new Envoy's stream
        // registers at once instead of waiting for the query.
        assert!(
            registry.0.try_lock().is_ok(),
            "the registry is locked while matching {}",
            node.id
        );
        if registered.is_empty() {
            let view: SharedView = Arc::new(Mutex::new(SotwStream::new(AdsConfig::default())));
            registered.push(registry.register(
                StreamId(99),
                ClientNode::from_node(&envoy_node("new", "p3"), Api::Sotw),
                view,
            ));
        }
        true
    });
    assert_eq!(found.len(), 2, "the streams of when the query started");
    assert_eq!(registry.len(), 3, "the new stream registered");
    // And a query through `fetch` sees it next time.
    let all = fetch(
        &registry,
        &cache,
        &ClientStatusRequest::default(),
        Clock::now(),
        MAX_ANSWER_BYTES,
    )
    .unwrap();
    assert_eq!(all.config.len(), 3);
}

#[test]
fn a_stream_leaves_the_registry_when_its_registration_drops() {
    let cache = SnapshotCache::new();
    let (registry, mut guards) = registry_with(&[("a", "p1"), ("b", "p2")], &snapshot(), &cache);
    assert_eq!(registry.len(), 2);
    drop(guards.remove(0));
    assert_eq!(registry.len(), 1);
    let left = fetch(
        &registry,
        &cache,
        &ClientStatusRequest::default(),
        Clock::now(),
        MAX_ANSWER_BYTES,
    )
    .unwrap();
    assert_eq!(left.config[0].node.as_ref().unwrap().id, "b");
    drop(guards);
    assert!(registry.is_empty());
}

#[test]
fn timestamps_are_wall_time_of_the_instants() {
    let now = Instant::now();
    let c = clock(now);
    assert_eq!(
        c.timestamp(now - Duration::from_millis(1500)),
        Some(Timestamp {
            seconds: 999_998,
            nanos: 500_000_000
        })
    );
    assert_eq!(
        c.timestamp(now + Duration::from_secs(5)),
        c.timestamp(now),
        "no future"
    );
}
