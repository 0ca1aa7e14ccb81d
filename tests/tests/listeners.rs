//! Every listener marin3r owns sets `TCP_NODELAY` on every socket it accepts: each
//! process runs in-process on 127.0.0.1 (port 0, or a free port where the process binds
//! itself), a client connects, and the server's side of that connection — found among
//! the process's sockets by its addresses (`marin3r_testkit::sockets`) — is checked.
//! Without it a small first answer on a fresh connection waited ~40 ms (Nagle's
//! algorithm against the client's delayed ACK).
//!
//! The listeners: the webhook's HTTPS admission, probes and metrics; the discovery
//! service's ADS gRPC, metrics and probes; the operator's metrics and probes; the
//! shutdown manager's HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;

use marin3r_tests::in_process::{CertFiles, InProcess, bind_localhost};
use marin3r_tests::xds::issue_bundle;

/// Connects to `addr`; whether the server's side of the connection has `TCP_NODELAY`.
async fn accepted_with_nodelay(addr: SocketAddr) -> bool {
    let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    marin3r_testkit::sockets::server_side_nodelay(addr, conn.local_addr().unwrap()).await
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[tokio::test]
async fn every_listener_sets_tcp_nodelay_on_accepted_sockets() {
    let dir = tempfile::tempdir().unwrap();
    issue_bundle().unwrap().write_to(dir.path()).unwrap();
    let certs = CertFiles::in_dir(dir.path());
    let mut listeners: Vec<(&str, SocketAddr)> = Vec::new();

    // The discovery service (local mode).
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    let discovery = InProcess::launch(
        bind_localhost().await.unwrap(),
        &certs,
        marin3r_xds::AdsConfig::default(),
        marin3r_control_plane::local::LocalBackend::new(&config_dir),
    )
    .await
    .unwrap();
    listeners.extend([
        ("discovery service ADS (gRPC, mTLS)", discovery.xdss),
        ("discovery service metrics", discovery.metrics),
        ("discovery service probes", discovery.health),
    ]);

    // The webhook.
    let https = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    https.set_nonblocking(true).unwrap();
    let webhook_listeners = marin3r_webhook::Listeners {
        https,
        probes: bind_localhost().await.unwrap(),
        metrics: bind_localhost().await.unwrap(),
    };
    let webhook_config = marin3r_webhook::Config {
        webhook_addr: webhook_listeners.https.local_addr().unwrap(),
        tls: marin3r_certs::ServingFiles::pair(&certs.server_cert, &certs.server_key),
        health_addr: webhook_listeners.probes.local_addr().unwrap(),
        metrics_addr: webhook_listeners.metrics.local_addr().unwrap(),
        defaults: marin3r_sidecar::Defaults::default(),
    };
    listeners.extend([
        ("webhook admission (HTTPS)", webhook_config.webhook_addr),
        ("webhook probes", webhook_config.health_addr),
        ("webhook metrics", webhook_config.metrics_addr),
    ]);
    let webhook = tokio::spawn(marin3r_webhook::serve(
        webhook_config,
        webhook_listeners,
        std::future::pending(),
    ));

    // The operator (it binds its own addresses), its API server a mock that never
    // answers.
    let (client, mut api) = marin3r_testkit::kube::mock_client();
    let api_held = tokio::spawn(async move {
        let mut pending = Vec::new();
        while let Some((_, answer)) = api.0.next_request().await {
            pending.push(answer);
        }
    });
    let operator_config = marin3r_operator::OperatorConfig {
        metrics_addr: localhost(marin3r_testkit::free_port().unwrap()),
        health_addr: localhost(marin3r_testkit::free_port().unwrap()),
        namespaces: Vec::new(),
        images: marin3r_operator::Images::default(),
        leader: None,
    };
    listeners.extend([
        ("operator metrics", operator_config.metrics_addr),
        ("operator probes", operator_config.health_addr),
    ]);
    let operator = tokio::spawn(marin3r_operator::serve(
        client,
        operator_config,
        std::future::pending(),
    ));

    // The shutdown manager.
    let shutdown_listener = bind_localhost().await.unwrap();
    listeners.push(("shutdown manager", shutdown_listener.local_addr().unwrap()));
    let shutdown_manager = tokio::spawn(marin3r_shutdown_manager::serve(
        shutdown_listener,
        marin3r_shutdown_manager::Config {
            bind_address: "127.0.0.1".parse().unwrap(),
            ready_file: dir.path().join("shutdown-ok"),
            ..marin3r_shutdown_manager::Config::default()
        },
        std::future::pending(),
    ));

    // The operator binds in its task: wait until it listens.
    for (name, addr) in &listeners {
        marin3r_testkit::wait_until_async(
            format!("{name} listening"),
            std::time::Duration::from_secs(30),
            || async { tokio::net::TcpStream::connect(addr).await.is_ok() },
        )
        .await;
    }
    let without: Vec<&str> = {
        let mut without = Vec::new();
        for (name, addr) in &listeners {
            if !accepted_with_nodelay(*addr).await {
                without.push(*name);
            }
        }
        without
    };
    assert!(
        without.is_empty(),
        "accepted without TCP_NODELAY: {without:?}"
    );
    assert_eq!(listeners.len(), 9);

    for task in [webhook.abort_handle(), operator.abort_handle()] {
        task.abort();
    }
    shutdown_manager.abort();
    api_held.abort();
    drop(discovery);
}
