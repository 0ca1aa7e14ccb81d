//! Replicas of one discovery service against one stateful fake API server, read with a
//! plain ADS client (no Envoy): `docs/ha.md` §1 and §2.
//!
//! - two replicas fed the same objects serve byte-identical resources and versions (an
//!   Envoy that moves between them gets a no-op);
//! - a replica that does not hold the Lease serves but writes nothing besides its own
//!   report; once it wins the Lease it reconciles everything and writes what nobody
//!   wrote (the edit made while no one led).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use marin3r_certs::Bundle;
use marin3r_testkit::apiserver::Verb;
use marin3r_testkit::free_port;
use marin3r_testkit::wait::{POLL, poll_ok};
use marin3r_tests::Must as _;
use marin3r_tests::configs::{direct, http_listener, resource};
use marin3r_tests::ha::{DS, Fleet, FleetOptions, NS, api_server};
use marin3r_tests::xds::CONVERGE;
use marin3r_xds::NodeInfo;
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const NODE: &str = "kuard";
const TYPES: [&str; 3] = [
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
    "type.googleapis.com/envoy.service.runtime.v3.Runtime",
];

fn spec(port: u16) -> Value {
    let cluster = json!({"name": "upstream", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]}});
    json!({"nodeID": NODE, "resources": [
        resource("cluster", cluster),
        resource("listener", http_listener("http", port, direct("hello\n"), None)),
    ]})
}

/// What a replica serves `NODE`: per type URL, the version and each resource's bytes.
type Served = BTreeMap<String, (String, Vec<Vec<u8>>)>;

/// Subscribes to clusters, listeners and the runtime layer on `addr` and returns the
/// first response of each.
async fn fetch(addr: SocketAddr, bundle: &Bundle) -> Result<Served, String> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&bundle.ca.cert_pem))
        .identity(Identity::from_pem(
            &bundle.client.cert_pem,
            &bundle.client.key_pem,
        ))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e:?}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    for (i, type_url) in TYPES.iter().enumerate() {
        let names = if type_url.ends_with("Runtime") {
            vec!["runtime".to_string()]
        } else {
            vec![]
        };
        tx.send(DiscoveryRequest {
            node: (i == 0).then(|| {
                NodeInfo {
                    id: NODE.into(),
                    pod_name: "probe".into(),
                }
                .to_node()
            }),
            type_url: (*type_url).into(),
            resource_names: names,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|e| format!("stream: {e:?}"))?
        .into_inner();
    let mut served = Served::new();
    while served.len() < TYPES.len() {
        let response = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .map_err(|_| format!("no response from {addr}; got {:?}", served.keys()))?
            .map_err(|e| format!("{e:?}"))?
            .ok_or("stream closed")?;
        served.insert(
            response.type_url.clone(),
            (
                response.version_info,
                response.resources.iter().map(|a| a.value.clone()).collect(),
            ),
        );
    }
    Ok(served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_fed_the_same_objects_serve_the_same_bytes() {
    let mut fleet = Fleet::start(api_server(), 1, FleetOptions::default())
        .await
        .must();
    fleet.wait_leader(CONVERGE).await.must();
    fleet.apply(NODE, spec(free_port().unwrap())).must();
    poll_ok("the revision is published", CONVERGE, POLL, || async {
        let status = fleet.envoyconfig(NODE).ok_or("no EnvoyConfig")?["status"].clone();
        if status["cacheState"] == "InSync"
            && status["desiredVersion"] == status["publishedVersion"]
        {
            Ok(())
        } else {
            Err(status.to_string())
        }
    })
    .await
    .must();
    // The second replica starts from what is in the API server (warm start).
    fleet.add_replica().await.must();
    let addrs: Vec<SocketAddr> = fleet.replicas.values().map(|r| r.server.xdss).collect();
    let a = fetch(addrs[0], &fleet.bundle).await.must();
    let b = fetch(addrs[1], &fleet.bundle).await.must();
    assert_eq!(a.len(), 3);
    for (type_url, (version, resources)) in &a {
        assert!(
            !version.is_empty() && !resources.is_empty(),
            "{type_url} served"
        );
    }
    assert_eq!(a, b, "byte-identical resources and versions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_lead_writes_nothing_until_it_wins_the_lease() {
    let api = api_server();
    // Another replica holds the Lease and stops renewing it (it died): ours may take
    // it once it expires, six seconds from now.
    let lease_seconds = 6;
    api.put(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": marin3r_wire::object_names::discovery_service_lease(DS), "namespace": NS},
        "spec": {"holderIdentity": "ds-gone", "leaseDurationSeconds": lease_seconds,
                 "acquireTime": k8s_now(), "renewTime": k8s_now()},
    }))
    .unwrap();
    let fleet = Fleet::start(
        api,
        1,
        FleetOptions {
            lease_seconds,
            ..FleetOptions::default()
        },
    )
    .await
    .must();
    let mark = fleet.api.mark();
    fleet.apply(NODE, spec(free_port().unwrap())).must();
    // It is not the leader: the edit waits (no revision, no status), but its report is
    // written.
    poll_ok("the replica reports", CONVERGE, POLL, || async {
        if fleet.reports().len() == 1 {
            Ok(())
        } else {
            Err("no report")
        }
    })
    .await
    .must();
    // The EnvoyConfig controller has seen the edit by now; what matters is that nothing
    // follows it (a negative: a short wait, while the other replica's Lease still holds).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fleet.lease_holder().as_deref(),
        Some("ds-gone"),
        "taken over too early to tell"
    );
    let leader_writes: Vec<_> = fleet
        .api
        .requests_since(mark)
        .into_iter()
        .filter(|r| {
            r.is_write() && matches!(r.resource.as_str(), "envoyconfigs" | "envoyconfigrevisions")
        })
        .collect();
    assert!(
        leader_writes.is_empty(),
        "a replica that does not lead wrote: {leader_writes:?}"
    );
    assert!(
        fleet.revisions().is_empty(),
        "no revision while no one leads"
    );

    // The Lease expires; the replica takes it, reconciles everything and writes.
    let leader = fleet.wait_leader(CONVERGE).await.must();
    assert_eq!(fleet.lease_holder().as_deref(), Some(leader.as_str()));
    poll_ok(
        "the edit is finished by the new leader",
        CONVERGE,
        POLL,
        || async {
            let status = fleet.envoyconfig(NODE).ok_or("no EnvoyConfig")?["status"].clone();
            if status["cacheState"] == "InSync" && fleet.revisions().len() == 1 {
                Ok(())
            } else {
                Err(status.to_string())
            }
        },
    )
    .await
    .must();
    let writes = fleet.api.requests_since(mark);
    assert!(
        writes
            .iter()
            .any(|r| r.verb == Some(Verb::Create) && r.resource == "envoyconfigrevisions"),
        "the leader created the revision"
    );
}

/// Now as a Kubernetes `MicroTime`.
fn k8s_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}
