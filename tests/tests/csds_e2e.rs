//! The client status service (CSDS) of the discovery service against real Envoys 1.40
//! (SotW and Delta), in local mode, everything on 127.0.0.1:
//! - (a) per Envoy, the ACKed resources and their versions equal what the Envoy's admin
//!   `/config_dump` shows as active dynamic resources, also after an update that changes
//!   only some resources (SotW Envoys keep the older version of unchanged ones);
//! - (b) after a NACK the changed resource is NACKED with Envoy's message and keeps the
//!   ACKed version; after the rollback (self-healing) it is ACKED again;
//! - (c) a node matcher returns only its Envoys; too many matchers are refused;
//! - (d) a stream that closed disappears;
//! - (e) a Secret's key never appears in an answer, even a targeted one with contents;
//! - (f) a listener's inline TLS key shows `[redacted]` in the targeted answer, as in
//!   the Envoy's own `/config_dump`.

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher};
use marin3r_control_plane::local::LocalBackend;
use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::{free_port, wait_ok};
use marin3r_tests::Must;
use marin3r_tests::configs::{
    direct, envoy_config, http_listener, rejected_listener, resource, sds_tls, tls_secret_yaml,
};
use marin3r_tests::xds::{CONVERGE, Envoy, Xds, get, init_tracing, localhost, write_atomic};
use prost::Message as _;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// The client.

async fn fetch(xds: &Xds, req: ClientStatusRequest) -> Result<ClientStatusResponse, tonic::Status> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&xds.bundle.ca.cert_pem))
        .identity(Identity::from_pem(
            &xds.bundle.client.cert_pem,
            &xds.bundle.client.key_pem,
        ))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{}", xds.xdss))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    let mut client = ClientStatusDiscoveryServiceClient::new(channel);
    tokio::time::timeout(Duration::from_secs(15), client.fetch_client_status(req))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("fetch timed out"))?
        .map(tonic::Response::into_inner)
}

fn exact(node_id: &str) -> NodeMatcher {
    NodeMatcher {
        node_id: Some(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(node_id.into())),
            ignore_case: false,
        }),
        node_metadatas: vec![],
    }
}

fn prefix(p: &str) -> NodeMatcher {
    NodeMatcher {
        node_id: Some(StringMatcher {
            match_pattern: Some(MatchPattern::Prefix(p.into())),
            ignore_case: false,
        }),
        node_metadatas: vec![],
    }
}

fn meta(node: &Node, key: &str) -> String {
    marin3r_xds::node::metadata_string(node, key)
        .unwrap_or_default()
        .to_string()
}

fn pod_of(cc: &ClientConfig) -> String {
    meta(cc.node.as_ref().unwrap(), "pod_name")
}

/// Short kind of a type URL (`…listener.v3.Listener` → `listener`).
fn kind(type_url: &str) -> &'static str {
    match type_url.rsplit('.').next().unwrap_or_default() {
        "Listener" => "listener",
        "Cluster" => "cluster",
        "RouteConfiguration" => "route",
        "ClusterLoadAssignment" => "endpoint",
        "Secret" => "secret",
        // RTDS (the bootstrap's runtime layer): not in /config_dump.
        "Runtime" => "runtime",
        other => panic!("unexpected type {other}"),
    }
}

/// `(kind, name) → version` of the ACKED resources of one Envoy's `ClientConfig`
/// (but the runtime layer, which `/config_dump` does not show).
fn acked(cc: &ClientConfig) -> BTreeMap<(String, String), String> {
    cc.generic_xds_configs
        .iter()
        .filter(|g| g.client_status == ClientResourceStatus::Acked as i32)
        .filter(|g| kind(&g.type_url) != "runtime")
        .map(|g| {
            (
                (kind(&g.type_url).to_string(), g.name.clone()),
                g.version_info.clone(),
            )
        })
        .collect()
}

/// The `ClientConfig` of the Envoy of pod `pod` (an error while its stream is not
/// listed, e.g. before it sent its node).
fn of_pod<'a>(resp: &'a ClientStatusResponse, pod: &str) -> Result<&'a ClientConfig, String> {
    resp.config
        .iter()
        .find(|cc| pod_of(cc) == pod)
        .ok_or_else(|| format!("no ClientConfig of pod {pod}: {resp:?}"))
}

// ---------------------------------------------------------------------------------------
// Envoy's own view.

async fn config_dump(admin: SocketAddr) -> Result<Value, String> {
    let r = get(admin, "/config_dump?include_eds").await?;
    if r.status != 200 {
        return Err(format!("config_dump: {}", r.status));
    }
    serde_json::from_str(&r.body).map_err(|e| format!("config_dump: {e}"))
}

/// `(kind, name) → version` of the active dynamic resources in a `/config_dump`.
fn dumped(dump: &Value) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    for c in dump["configs"].as_array().into_iter().flatten() {
        let t = c["@type"].as_str().unwrap_or_default();
        if t.ends_with("ListenersConfigDump") {
            for l in c["dynamic_listeners"].as_array().into_iter().flatten() {
                if !l["active_state"].is_null() {
                    out.insert(
                        ("listener".into(), s(&l["name"])),
                        s(&l["active_state"]["version_info"]),
                    );
                }
            }
        } else if t.ends_with("ClustersConfigDump") {
            for cl in c["dynamic_active_clusters"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.insert(
                    ("cluster".into(), s(&cl["cluster"]["name"])),
                    s(&cl["version_info"]),
                );
            }
        } else if t.ends_with("RoutesConfigDump") {
            for r in c["dynamic_route_configs"].as_array().into_iter().flatten() {
                out.insert(
                    ("route".into(), s(&r["route_config"]["name"])),
                    s(&r["version_info"]),
                );
            }
        } else if t.ends_with("SecretsConfigDump") {
            for sec in c["dynamic_active_secrets"].as_array().into_iter().flatten() {
                // The bootstrap's own certificate is SDS from a file (no version), not
                // from the discovery service.
                if !s(&sec["version_info"]).is_empty() {
                    out.insert(("secret".into(), s(&sec["name"])), s(&sec["version_info"]));
                }
            }
        } else if t.ends_with("EndpointsConfigDump") {
            for e in c["dynamic_endpoint_configs"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.insert(
                    ("endpoint".into(), s(&e["endpoint_config"]["cluster_name"])),
                    s(&e["version_info"]),
                );
            }
        }
    }
    // Endpoints over EDS only (a static cluster's own endpoints are listed too).
    let eds: Vec<String> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c["dynamic_active_clusters"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter(|cl| cl["cluster"]["type"] == "EDS")
        .map(|cl| s(&cl["cluster"]["name"]))
        .collect();
    out.retain(|(kind, name), _| kind != "endpoint" || eds.contains(name));
    out
}

/// Waits until CSDS's ACKED resources of pod `pod` equal Envoy's `/config_dump`, and
/// returns them. `in_place`: a listener whose filter chains only changed, with its
/// previous version: Envoy updates such a listener in place and its `/config_dump`
/// keeps the previous `version_info` while it runs the new content; CSDS reports the
/// version of the content (the one difference, see the README).
async fn wait_consistent(
    xds: &Xds,
    envoy: &mut Envoy,
    pod: &str,
    in_place: Option<(&str, &str)>,
) -> BTreeMap<(String, String), String> {
    let admin = envoy.admin;
    envoy
        .eventually("CSDS equals /config_dump", CONVERGE, || async move {
            let resp = fetch(xds, ClientStatusRequest::default())
                .await
                .map_err(|e| e.to_string())?;
            let cc = of_pod(&resp, pod)?;
            let mut ours = acked(cc);
            // Envoy's `/config_dump` shows no version for endpoints (EDS): names only.
            for ((kind, _), version) in ours.iter_mut() {
                if kind == "endpoint" {
                    version.clear();
                }
            }
            let mut theirs = dumped(&config_dump(admin).await?);
            if let Some((listener, previous)) = in_place {
                let key = ("listener".to_string(), listener.to_string());
                if theirs.get(&key).map(String::as_str) == Some(previous)
                    && ours.get(&key).is_some_and(|v| v != previous)
                {
                    eprintln!("{pod}: /config_dump keeps {previous} for the listener {listener} updated in place");
                    theirs.insert(key.clone(), ours[&key].clone());
                }
            }
            if ours == theirs && !ours.is_empty() {
                Ok(ours)
            } else {
                Err(format!("CSDS {ours:?}\n!= config_dump {theirs:?}"))
            }
        })
        .await
        .must()
}

// ---------------------------------------------------------------------------------------
// Configs.

/// Three listeners (two TLS with a Secret each over SDS, one routing over RDS to an
/// EDS cluster), two Secrets, a route configuration, two clusters (one EDS) and the
/// endpoints. `body` changes the route configuration, the `https-b` listener and the
/// static cluster; the rest stays the same.
fn full_config(node: &str, ports: [u16; 4], body: &str, secrets: [&str; 2]) -> String {
    let [http, https_a, https_b, upstream] = ports;
    let eds_cluster = json!({
        "name": "backend",
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}},
    });
    let timeout = if body == "one" { "1s" } else { "2s" };
    let static_cluster = json!({
        "name": "static",
        "type": "STATIC",
        "connect_timeout": timeout,
        "load_assignment": {"cluster_name": "static", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream}}}},
        ]}]},
    });
    let endpoints = json!({
        "cluster_name": "backend",
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
            "address": "127.0.0.1", "port_value": upstream,
        }}}}]}],
    });
    let route = json!({
        "name": "rds_route",
        "virtual_hosts": [{"name": "any", "domains": ["*"], "routes": [
            {"match": {"prefix": "/upstream"}, "route": {"cluster": "backend"}},
            {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": body}}},
        ]}],
    });
    let mut rds_listener = http_listener("http", http, direct(body), None);
    rds_listener["filter_chains"][0]["filters"][0]["typed_config"]
        .as_object_mut()
        .unwrap()
        .remove("route_config");
    rds_listener["filter_chains"][0]["filters"][0]["typed_config"]["rds"] = json!({
        "route_config_name": "rds_route",
        "config_source": {"ads": {}, "resource_api_version": "V3"},
    });
    let mut resources = vec![
        resource("cluster", eds_cluster),
        resource("cluster", static_cluster),
        resource("endpoint", endpoints),
        resource("route", route),
        resource("listener", rds_listener),
        resource(
            "listener",
            http_listener("https-a", https_a, direct("tls"), Some(sds_tls(secrets[0]))),
        ),
        resource(
            "listener",
            http_listener("https-b", https_b, direct(body), Some(sds_tls(secrets[1]))),
        ),
    ];
    for secret in secrets {
        resources.push(
            json!({"type": "secret", "generateFromTlsSecret": secret, "blueprint": "tlsCertificate"}),
        );
    }
    envoy_config(node, resources)
}

/// The discovery service on `files`; a version is rolled back after `nack_threshold`
/// NACKs of every Envoy of its node.
async fn start_with_threshold(files: &[(&str, String)], nack_threshold: u64) -> Xds {
    init_tracing();
    Xds::start_with(files, |dir| {
        LocalBackend::new(dir).with_nack_threshold(nack_threshold)
    })
    .await
    .must()
}

// ---------------------------------------------------------------------------------------
// (a) (e)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csds_versions_equal_config_dump_for_sotw_and_delta_and_never_carry_key_bytes() {
    // One node per API, the same resources on their own ports: each Envoy is probed
    // on its own listener.
    let (node_s, node_d) = ("csds-dump-sotw", "csds-dump-delta");
    let secrets = ["csds-dump-a", "csds-dump-b"];
    let four = || -> [u16; 4] { std::array::from_fn(|_| free_port().unwrap()) };
    let (ports_s, ports_d) = (four(), four());
    let bundle = marin3r_tests::xds::issue_bundle().must();
    let secret_file = |name: &str, b: &marin3r_certs::Bundle| {
        tls_secret_yaml(name, &b.server.cert_pem, &b.server.key_pem)
    };
    let xds = start_with_threshold(
        &[
            ("sotw.json", full_config(node_s, ports_s, "one", secrets)),
            ("delta.json", full_config(node_d, ports_d, "one", secrets)),
            ("secret-a.yaml", secret_file(secrets[0], &bundle)),
            ("secret-b.yaml", secret_file(secrets[1], &bundle)),
        ],
        1,
    )
    .await;
    let mut sotw = Envoy::start_as(&xds, node_s, "pod-sotw", ApiType::Sotw, None).must();
    let mut delta = Envoy::start_as(&xds, node_d, "pod-delta", ApiType::Delta, None).must();
    sotw.wait_body(localhost(ports_s[0]), "one", CONVERGE)
        .await
        .must();
    delta
        .wait_body(localhost(ports_d[0]), "one", CONVERGE)
        .await
        .must();
    let s1 = wait_consistent(&xds, &mut sotw, "pod-sotw", None).await;
    let d1 = wait_consistent(&xds, &mut delta, "pod-delta", None).await;
    for kind in ["listener", "cluster", "route", "secret", "endpoint"] {
        assert!(s1.keys().any(|(k, _)| k == kind), "{kind} in {s1:?}");
        assert!(d1.keys().any(|(k, _)| k == kind), "{kind} in {d1:?}");
    }

    // Change one resource of each type but the endpoints (the route configuration, the
    // `https-b` listener, the static cluster, Secret b): in SotW the unchanged ones of
    // a changed type keep their older version in Envoy's view, and in ours.
    let second = marin3r_tests::xds::issue_bundle().must();
    write_atomic(
        &xds.file("secret-b.yaml"),
        &secret_file(secrets[1], &second),
    )
    .must();
    write_atomic(
        &xds.file("sotw.json"),
        &full_config(node_s, ports_s, "two", secrets),
    )
    .must();
    write_atomic(
        &xds.file("delta.json"),
        &full_config(node_d, ports_d, "two", secrets),
    )
    .must();
    sotw.wait_body(localhost(ports_s[0]), "two", CONVERGE)
        .await
        .must();
    delta
        .wait_body(localhost(ports_d[0]), "two", CONVERGE)
        .await
        .must();
    let https_b = |m: &BTreeMap<(String, String), String>| {
        m[&("listener".to_string(), "https-b".to_string())].clone()
    };
    let (sb, db) = (https_b(&s1), https_b(&d1));
    let s2 = wait_consistent(&xds, &mut sotw, "pod-sotw", Some(("https-b", &sb))).await;
    let d2 = wait_consistent(&xds, &mut delta, "pod-delta", Some(("https-b", &db))).await;
    let key = |k: &str, n: &str| (k.to_string(), n.to_string());
    for (before, after) in [(&s1, &s2), (&d1, &d2)] {
        for changed in [
            key("route", "rds_route"),
            key("listener", "https-b"),
            key("cluster", "static"),
        ] {
            assert_ne!(after[&changed], before[&changed], "{changed:?}");
        }
        for same in [key("listener", "https-a"), key("cluster", "backend")] {
            assert_eq!(after[&same], before[&same], "{same:?}");
        }
    }
    eprintln!("SotW before {s1:?}\nafter {s2:?}\nDelta before {d1:?}\nafter {d2:?}");

    // The Delta and SotW Envoys are told apart.
    let all = fetch(&xds, ClientStatusRequest::default()).await.unwrap();
    let api = |pod: &str| {
        meta(
            of_pod(&all, pod).unwrap().node.as_ref().unwrap(),
            "marin3r_api",
        )
    };
    assert_eq!(
        (api("pod-sotw"), api("pod-delta")),
        ("sotw".into(), "delta".into())
    );

    // (e) No answer carries the key: fleet-wide, targeted with contents.
    let key_lines: Vec<String> = [&bundle, &second]
        .iter()
        .flat_map(|b| b.server.key_pem.lines())
        .filter(|l| !l.starts_with("-----") && l.len() >= 32)
        .map(str::to_string)
        .collect();
    assert!(!key_lines.is_empty());
    let targeted = fetch(
        &xds,
        ClientStatusRequest {
            node_matchers: vec![exact(node_s), exact(node_d)],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // The targeted answer carries the resources themselves, but not the Secret.
    let with_contents: Vec<&str> = targeted
        .config
        .iter()
        .flat_map(|cc| &cc.generic_xds_configs)
        .filter(|g| g.xds_config.is_some())
        .map(|g| kind(&g.type_url))
        .collect();
    assert!(with_contents.contains(&"listener"), "{with_contents:?}");
    assert!(!with_contents.contains(&"secret"), "{with_contents:?}");
    assert!(
        all.config
            .iter()
            .flat_map(|cc| &cc.generic_xds_configs)
            .all(|g| g.xds_config.is_none())
    );
    for answer in [&all, &targeted] {
        let bytes = answer.encode_to_vec();
        let text = String::from_utf8_lossy(&bytes);
        for line in &key_lines {
            assert!(!text.contains(line.as_str()), "key bytes in an answer");
        }
        assert!(!text.contains("PRIVATE KEY"));
    }
    drop((sotw, delta));
}

// ---------------------------------------------------------------------------------------
// (b)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_shows_envoys_message_and_the_acked_version_then_acked_after_the_rollback() {
    let node = "csds-nack";
    let port = free_port().unwrap();
    let good = envoy_config(
        node,
        vec![resource(
            "listener",
            http_listener("http", port, direct("ok"), None),
        )],
    );
    // Five NACKs (re-sent after 100, 200, 400, 800 ms) before the rollback: the NACKED
    // state lasts long enough to be seen.
    let xds = start_with_threshold(&[("config.json", good)], 5).await;
    let xds = &xds;
    for api in [ApiType::Sotw, ApiType::Delta] {
        let pod = format!("pod-{api:?}");
        let mut envoy = Envoy::start_as(xds, node, &pod, api, None).must();
        envoy
            .wait_body(localhost(port), "ok", CONVERGE)
            .await
            .must();
        let before = wait_consistent(xds, &mut envoy, &pod, None).await;
        let key = ("listener".to_string(), "http".to_string());
        let acked_version = before[&key].clone();

        write_atomic(
            &xds.file("config.json"),
            // A new port each time: a new revision (the previous one is tainted).
            &envoy_config(node, vec![rejected_listener(free_port().unwrap())]),
        )
        .must();
        // NACKED with Envoy's message and the previously ACKed version; Envoy's own
        // record of the failure (config_dump's error_state of the listener) has the same
        // message, read in the same probe (the rollback clears both soon).
        let admin = envoy.admin;
        let (details, version, rejected, envoys) = envoy
            .eventually("NACKED in CSDS and in config_dump", CONVERGE, || {
                let pod = pod.clone();
                async move {
                    let resp = fetch(xds, ClientStatusRequest::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let dump = config_dump(admin).await?;
                    let g = of_pod(&resp, &pod)?
                        .generic_xds_configs
                        .iter()
                        .find(|g| g.name == "http")
                        .cloned()
                        .ok_or("no listener http")?;
                    if g.client_status != ClientResourceStatus::Nacked as i32 {
                        return Err(format!("{g:?}"));
                    }
                    let e = g.error_state.clone().ok_or("no error_state")?;
                    let envoys = dump["configs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|c| c["dynamic_listeners"].as_array().into_iter().flatten())
                        .find(|l| l["name"] == "http")
                        .and_then(|l| l["error_state"]["details"].as_str())
                        .ok_or("no error_state in config_dump")?
                        .to_string();
                    Ok::<_, String>((e.details, g.version_info, e.version_info, envoys))
                }
            })
            .await
            .must();
        assert_eq!(version, acked_version, "the ACKed version stays");
        assert_ne!(rejected, acked_version);
        // Envoy's NACK names the listener around the listener's own error.
        assert_eq!(
            details,
            format!("Error adding/updating listener(s) http: {envoys}\n"),
            "Envoy's NACK message"
        );

        // Self-healing rolls back: ACKED again, the ACKed version.
        let back = envoy
            .eventually("ACKED after the rollback", CONVERGE, || {
                let pod = pod.clone();
                async move {
                    let resp = fetch(xds, ClientStatusRequest::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let g = of_pod(&resp, &pod)?
                        .generic_xds_configs
                        .iter()
                        .find(|g| g.name == "http")
                        .cloned()
                        .ok_or("no listener http")?;
                    if g.client_status == ClientResourceStatus::Acked as i32
                        && g.error_state.is_none()
                    {
                        Ok(g.version_info)
                    } else {
                        Err(format!("{g:?}"))
                    }
                }
            })
            .await
            .must();
        assert_eq!(back, acked_version);
        let after = wait_consistent(xds, &mut envoy, &pod, None).await;
        assert_eq!(after[&key], acked_version);
        drop(envoy);
        // Restore the good config for the next API's Envoy.
        write_atomic(
            &xds.file("config.json"),
            &envoy_config(
                node,
                vec![resource(
                    "listener",
                    http_listener("http", port, direct("ok"), None),
                )],
            ),
        )
        .must();
        wait_ok("no stream left", CONVERGE, || async {
            let r = fetch(xds, ClientStatusRequest::default())
                .await
                .map_err(|e| e.to_string())?;
            if r.config.is_empty() {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        })
        .await;
    }
}

// ---------------------------------------------------------------------------------------
// (c) (d)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matchers_select_envoys_and_closed_streams_disappear() {
    let ports = [
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    ];
    let nodes = ["csds-m-a1", "csds-m-a2", "csds-m-b"];
    let files: Vec<(String, String)> = nodes
        .iter()
        .zip(ports)
        .map(|(n, p)| {
            (
                format!("{n}.json"),
                envoy_config(
                    n,
                    vec![resource(
                        "listener",
                        http_listener("http", p, direct(n), None),
                    )],
                ),
            )
        })
        .collect();
    let refs: Vec<(&str, String)> = files.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
    let xds = start_with_threshold(&refs, 1).await;
    let mut envoys = Vec::new();
    for (n, p) in nodes.iter().zip(ports) {
        let api = if n.ends_with('2') {
            ApiType::Delta
        } else {
            ApiType::Sotw
        };
        let mut e = Envoy::start(&xds, n, api).must();
        e.wait_body(localhost(p), n, CONVERGE).await.must();
        envoys.push(e);
    }
    let ids = |r: &ClientStatusResponse| -> Vec<String> {
        r.config
            .iter()
            .map(|cc| cc.node.as_ref().unwrap().id.clone())
            .collect()
    };
    let all = fetch(&xds, ClientStatusRequest::default()).await.unwrap();
    assert_eq!(ids(&all), nodes, "sorted by node id");
    let a = fetch(
        &xds,
        ClientStatusRequest {
            node_matchers: vec![prefix("csds-m-a")],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(ids(&a), ["csds-m-a1", "csds-m-a2"]);
    let or = fetch(
        &xds,
        ClientStatusRequest {
            node_matchers: vec![exact("csds-m-b"), exact("csds-m-a1")],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(ids(&or), ["csds-m-a1", "csds-m-b"]);
    // A regex is refused naming the field.
    let refused = fetch(
        &xds,
        ClientStatusRequest {
            node_matchers: vec![NodeMatcher {
                node_id: Some(StringMatcher {
                    match_pattern: Some(MatchPattern::SafeRegex(Default::default())),
                    ignore_case: false,
                }),
                node_metadatas: vec![],
            }],
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("node_matchers[0].node_id.safe_regex"),
        "{}",
        refused.message()
    );

    // A query whose matchers multiply the work (the report's 200,000 `contains`
    // matchers, 2.4 MB) is refused naming the limit, before any matching.
    let flood = fetch(
        &xds,
        ClientStatusRequest {
            node_matchers: (0..200_000)
                .map(|i| NodeMatcher {
                    node_id: Some(StringMatcher {
                        match_pattern: Some(MatchPattern::Contains(format!("zz{i:06}"))),
                        ignore_case: false,
                    }),
                    node_metadatas: vec![],
                })
                .collect(),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(flood.code(), tonic::Code::InvalidArgument);
    assert!(
        flood
            .message()
            .contains("200000 string matchers, over the limit of 64"),
        "{}",
        flood.message()
    );

    // (d) Envoy b goes away: its stream disappears.
    let mut b = envoys.pop().unwrap();
    b.process.terminate(Duration::from_secs(5));
    wait_ok("b's stream gone", CONVERGE, || async {
        let r = fetch(&xds, ClientStatusRequest::default())
            .await
            .map_err(|e| e.to_string())?;
        if ids(&r) == ["csds-m-a1", "csds-m-a2"] {
            Ok(())
        } else {
            Err(format!("{:?}", ids(&r)))
        }
    })
    .await;
    drop(envoys);
}

// ---------------------------------------------------------------------------------------
// (f)

/// The TLS socket of a listener with its certificate and key inline (not over SDS).
fn inline_tls(cert_pem: &str, key_pem: &str) -> Value {
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"tls_certificates": [{
                "certificate_chain": {"inline_string": cert_pem},
                "private_key": {"inline_string": key_pem},
            }]},
        },
    })
}

/// The first TLS certificate of a listener's first filter chain, in either spelling
/// (`/config_dump`: proto names; our protojson: lowerCamelCase).
fn first_tls_certificate(listener: &Value) -> Value {
    let pick = |v: &Value, snake: &str, camel: &str| {
        if v[snake].is_null() {
            v[camel].clone()
        } else {
            v[snake].clone()
        }
    };
    let chain = pick(listener, "filter_chains", "filterChains")[0].clone();
    let socket = pick(&chain, "transport_socket", "transportSocket");
    let typed = pick(&socket, "typed_config", "typedConfig");
    let common = pick(&typed, "common_tls_context", "commonTlsContext");
    pick(&common, "tls_certificates", "tlsCertificates")[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_key_shows_redacted_in_csds_as_in_envoys_config_dump() {
    let node = "csds-inline-key";
    let port = free_port().unwrap();
    let bundle = marin3r_tests::xds::issue_bundle().must();
    let listener = http_listener(
        "https-inline",
        port,
        direct("inline"),
        Some(inline_tls(&bundle.server.cert_pem, &bundle.server.key_pem)),
    );
    let xds = start_with_threshold(
        &[(
            "inline.json",
            envoy_config(node, vec![resource("listener", listener)]),
        )],
        1,
    )
    .await;
    let mut envoy = Envoy::start_as(&xds, node, "pod-inline", ApiType::Sotw, None).must();
    let admin = envoy.admin;
    // Envoy's own view of the listener it runs.
    let theirs = envoy
        .eventually("the listener is active", CONVERGE, || async move {
            let dump = config_dump(admin).await?;
            dump["configs"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["dynamic_listeners"].as_array().into_iter().flatten())
                .find(|l| l["name"] == "https-inline" && !l["active_state"].is_null())
                .map(|l| l["active_state"]["listener"].clone())
                .ok_or_else(|| "no active listener https-inline".to_string())
        })
        .await
        .must();
    // Ours: the targeted answer with the contents.
    let targeted = fetch(
        &xds,
        ClientStatusRequest {
            node_matchers: vec![exact(node)],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let any = targeted.config[0]
        .generic_xds_configs
        .iter()
        .find(|g| g.name == "https-inline")
        .and_then(|g| g.xds_config.clone())
        .expect("the listener's content");
    let ours = marin3r_envoyconfig::decode::to_json(&marin3r_envoyconfig::Resource {
        kind: marin3r_envoyconfig::ResourceType::Listener,
        name: "https-inline".into(),
        body: prost_types::Any {
            type_url: any.type_url.clone(),
            value: any.value.clone(),
        },
        digest: 0,
    })
    .unwrap();
    let (theirs, ours) = (first_tls_certificate(&theirs), first_tls_certificate(&ours));
    eprintln!("config_dump: {theirs}\nCSDS: {ours}");
    assert_eq!(
        theirs["private_key"],
        json!({"inline_string": "[redacted]"})
    );
    assert_eq!(ours["privateKey"], json!({"inlineString": "[redacted]"}));
    // The certificate (not sensitive) is shown by both.
    assert_eq!(
        theirs["certificate_chain"]["inline_string"],
        ours["certificateChain"]["inlineString"]
    );
    let text = String::from_utf8_lossy(&targeted.encode_to_vec()).into_owned();
    assert!(!text.contains("PRIVATE KEY"));
    for line in bundle
        .server
        .key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
    {
        assert!(!text.contains(line), "key bytes in the answer");
    }
    drop(envoy);
}
