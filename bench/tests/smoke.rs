//! A smoke run of the bench harness with tiny numbers (no timing is asserted): the load
//! generator against the webhook and the echo server, 20 ADS streams against the
//! in-process discovery service through one config change, the CPU cores once, and the
//! HA taint and API-write figures on three replicas.

use std::time::{Duration, Instant};

use bytes::Bytes;
use marin3r_bench::ads::{Swarm, SwarmConfig, swarm_config_yaml};
use marin3r_bench::echo::EchoServer;
use marin3r_bench::loadgen::{self, Load, Rate, Target};
use marin3r_bench::webhook::{WebhookServer, check_injected, realistic_review};
use marin3r_tests::xds::{Xds, issue_bundle, write_atomic};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_and_echo_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = issue_bundle().unwrap();
    bundle.write_to(dir.path()).unwrap();
    let cert = dir.path().join("server/tls.crt");
    let key = dir.path().join("server/tls.key");
    let webhook = WebhookServer::start(&cert, &key).await.unwrap();
    let echo = EchoServer::start(&cert, &key).await.unwrap();
    let body = Bytes::from(serde_json::to_vec(&realistic_review()).unwrap());
    let ca = &bundle.ca.cert_pem;
    let w = Target::new(webhook.addr, ca, marin3r_webhook::MUTATE_PATH, body.clone()).unwrap();
    let e = Target::new(echo.addr, ca, "/", body.clone()).unwrap();

    let (status, answer) = loadgen::once(&w).await.unwrap();
    assert_eq!(status, 200);
    check_injected(&answer).unwrap();
    assert!(check_injected(&body).is_err(), "a review is not an answer");
    assert_eq!(loadgen::once(&e).await.unwrap(), (200, body.clone()));

    let max = Load {
        concurrency: 4,
        rate: Rate::Max,
        warmup: Duration::ZERO,
        duration: Duration::from_secs(5),
        max_requests: Some(100),
    };
    for target in [&w, &e] {
        let r = loadgen::run(target, max).await.unwrap();
        assert_eq!((r.requests, r.errors), (100, 0));
        assert!(r.rps() > 0.0);
        assert!(r.latency.p50 <= r.latency.p99 && r.latency.p99 <= r.latency.max);
    }
    // Fixed rate: 100 requests due over 0.5 s.
    let fixed = Load {
        concurrency: 2,
        rate: Rate::Fixed(200.0),
        warmup: Duration::ZERO,
        duration: Duration::from_millis(500),
        max_requests: None,
    };
    let started = Instant::now();
    let r = loadgen::run(&w, fixed).await.unwrap();
    assert_eq!((r.requests, r.errors), (100, 0));
    assert!(started.elapsed() >= Duration::from_millis(450));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ads_swarm_sees_a_config_change() {
    let xds = Xds::start(&[("swarm.yaml", swarm_config_yaml("swarm", 0))])
        .await
        .unwrap();
    let config = SwarmConfig {
        targets: vec![xds.xdss],
        ca_pem: xds.bundle.ca.cert_pem.clone(),
        client_cert_pem: xds.bundle.client.cert_pem.clone(),
        client_key_pem: xds.bundle.client.key_pem.clone(),
        node_ids: vec!["swarm".into()],
        streams: 20,
        connect_parallelism: 8,
        reconnect: false,
        eds: Default::default(),
        api: Default::default(),
    };
    let started = Instant::now();
    let mut swarm = Swarm::connect(&config).unwrap();
    assert_eq!(swarm.len(), 20);
    swarm
        .wait_converged(started, Duration::from_secs(20))
        .await
        .unwrap();
    let file = xds.file("swarm.yaml");
    let fanout = swarm
        .measure_change(
            || write_atomic(&file, &swarm_config_yaml("swarm", 1)).map_err(anyhow::Error::msg),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(fanout.first <= fanout.median && fanout.median <= fanout.all);
    swarm.shutdown().await;
    xds.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_taint_and_writes_with_tiny_numbers() {
    let servers = tokio::runtime::Handle::current();
    let taint = marin3r_bench::ha::taint::measure(&servers, 3, 1)
        .await
        .unwrap();
    let run = &taint.runs[0];
    assert!(run.min_nacks_per_stream >= 5, "{run:?}");
    assert!(run.last_nack_to_taint <= run.edit_to_taint, "{run:?}");
    assert_eq!(taint.disconnects, 0);

    let steady = Duration::from_secs(1);
    let writes = marin3r_bench::ha::writes::measure(&servers, 2, 6, 1, steady)
        .await
        .unwrap();
    let edit = &writes.edits[0];
    assert!(
        edit.writes
            .iter()
            .any(|w| w.what == "create envoyconfigrevisions"),
        "{edit:?}"
    );
    assert!(!edit.status_changes.is_empty(), "{edit:?}");
    assert!(
        writes
            .steady
            .iter()
            .all(|w| w.kind() != marin3r_bench::ha::writes::Kind::Other),
        "{:?}",
        writes.steady
    );
    let report = marin3r_bench::ha::report::render(
        &marin3r_bench::ha::report::HaResults {
            taint: Some(taint),
            writes: Some(writes),
            ..Default::default()
        },
        1,
    );
    assert!(report.contains("| 1 |"), "{report}");
}

#[test]
fn cores_run() {
    let d = Duration::from_millis(20);
    assert!(marin3r_bench::cores::injection(d).unwrap() > Duration::ZERO);
    assert!(marin3r_bench::cores::admission_review(d).unwrap() > Duration::ZERO);
    assert!(marin3r_bench::cores::decode(d).unwrap() > Duration::ZERO);
}
