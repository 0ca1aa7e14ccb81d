//! Faults that used to break a running Envoy (issue "Hold under faults"), each with a
//! real Envoy 1.40 and the discovery service in local mode:
//!
//! - a restart of the discovery service while a node's config cannot be resolved (its
//!   Secret file is gone) must not wipe the Envoy: the node has no published snapshot,
//!   so its stream is held, and Envoy keeps serving what it had;
//! - a Secret that disappears for a second, or is written after its EnvoyConfig, is a
//!   wait, never a taint: certificate rotation goes on, and new Envoys get the secret;
//! - SIGTERM to the `marin3r discovery-service` process: not ready at once, serving on
//!   for `--drain-delay`, then the Envoys' connections are closed (GOAWAY, streams ended
//!   with UNAVAILABLE) over `--drain-time`, the process exits by itself, and the Envoys
//!   keep serving throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::free_port;
use marin3r_testkit::tls::cert_der;
use marin3r_testkit::wait_ok;
use marin3r_tests::Must;
use marin3r_tests::configs::{
    direct, envoy_config, http_listener, resource, sds_tls, tls_secret_yaml,
};
use marin3r_tests::xds::{
    CONVERGE, Envoy, Serving, Xds, body_at, get_tls, init_tracing, issue_bundle, localhost,
    write_atomic,
};
use serde_json::json;

/// An EnvoyConfig serving `body` on a plain HTTP listener, plus (`tls`) a TLS listener
/// on `tls_port` whose certificate is the Secret `secret` (generateFromTlsSecret).
fn config(node: &str, port: u16, body: &str, secret: &str, tls_port: Option<u16>) -> String {
    let mut resources = vec![
        json!({"type": "secret", "generateFromTlsSecret": secret, "blueprint": "tlsCertificate"}),
        resource("listener", http_listener("http", port, direct(body), None)),
    ];
    if let Some(tls_port) = tls_port {
        resources.push(resource(
            "listener",
            http_listener("https", tls_port, direct(body), Some(sds_tls(secret))),
        ));
    }
    envoy_config(node, resources)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_secret_missing_never_wipes_envoy() {
    init_tracing();
    let node = "fault-restart";
    let secret = "fault-restart-cert";
    let port = free_port().unwrap();
    let bundle = issue_bundle().must();
    let cert = tls_secret_yaml(secret, &bundle.server.cert_pem, &bundle.server.key_pem);
    let Serving { mut xds, mut envoy } = Serving::start(
        Xds::start(&[
            ("config.json", config(node, port, "before", secret, None)),
            ("secret.yaml", cert.clone()),
        ])
        .await
        .must(),
        node,
        port,
        "before",
    )
    .await
    .must();

    // While the discovery service is down its Secret file goes away: after the restart
    // the node's config cannot be resolved, so the node has no published snapshot.
    xds.stop_serving().await.must();
    let secret_file = xds.file("secret.yaml");
    std::fs::remove_file(&secret_file).unwrap();
    xds.serve_again(|dir| marin3r_control_plane::local::LocalBackend::new(dir))
        .await
        .must();
    // Envoy reconnects (within its 2 s ADS backoff cap) and its stream is held, not
    // answered with an empty config.
    wait_ok("Envoy's stream on the new server", CONVERGE, || {
        xds.has_streams(node)
    })
    .await;
    // A negative (no answer wipes the listener), so a short fixed window: an empty
    // config would be the answer to Envoy's first request, right after it connected.
    tokio::time::sleep(Duration::from_millis(500)).await;
    envoy.check_running().must();
    assert_eq!(
        body_at(port).await.as_deref(),
        Ok("before"),
        "{}",
        envoy.log_report(30)
    );

    // The Secret comes back with an edit: the node is published again and served.
    write_atomic(&secret_file, &cert).must();
    write_atomic(
        &xds.file("config.json"),
        &config(node, port, "after", secret, None),
    )
    .must();
    envoy
        .wait_body(localhost(port), "after", CONVERGE)
        .await
        .must();
    drop(envoy);
    xds.stop().await.must();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_second_secret_gap_does_not_stop_certificate_rotation() {
    init_tracing();
    let node = "fault-gap";
    let secret = "fault-gap-cert";
    let (port, tls_port) = (free_port().unwrap(), free_port().unwrap());
    let first = issue_bundle().must();
    let second = issue_bundle().must();
    let xds = Xds::start(&[
        (
            "config.json",
            config(node, port, node, secret, Some(tls_port)),
        ),
        (
            "secret.yaml",
            tls_secret_yaml(secret, &first.server.cert_pem, &first.server.key_pem),
        ),
    ])
    .await
    .must();
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw).must();
    let addr = localhost(tls_port);
    let (leaf, _) = envoy
        .eventually("the first certificate", CONVERGE, || {
            get_tls(addr, &first.ca.cert_pem)
        })
        .await
        .must();
    assert_eq!(leaf, cert_der(&first.server.cert_pem).must());

    // rm, a scan of the folder without the Secret (the revision waits for it), then the
    // rotated Secret: it is served (the revision waited, it was never tainted).
    std::fs::remove_file(xds.file("secret.yaml")).unwrap();
    wait_ok("the revision waits for its Secret", CONVERGE, || {
        xds.waits_for_dependencies(node)
    })
    .await;
    assert_eq!(body_at(port).await.as_deref(), Ok(node), "still serving");
    write_atomic(
        &xds.file("secret.yaml"),
        &tls_secret_yaml(secret, &second.server.cert_pem, &second.server.key_pem),
    )
    .must();
    let (leaf, _) = envoy
        .eventually("the rotated certificate", CONVERGE, || {
            get_tls(addr, &second.ca.cert_pem)
        })
        .await
        .must();
    assert_eq!(leaf, cert_der(&second.server.cert_pem).must());
    drop(envoy);
    xds.stop().await.must();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoyconfig_written_before_its_secret_is_served_once_the_secret_exists() {
    init_tracing();
    let node = "fault-late-secret";
    let secret = "fault-late-cert";
    let (port, tls_port) = (free_port().unwrap(), free_port().unwrap());
    let bundle = issue_bundle().must();
    let xds = Xds::start(&[(
        "config.json",
        config(node, port, node, secret, Some(tls_port)),
    )])
    .await
    .must();
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw).must();
    // Envoy subscribed while its config waits for the Secret.
    wait_ok("Envoy's stream", CONVERGE, || xds.has_streams(node)).await;
    wait_ok("the revision waits for its Secret", CONVERGE, || {
        xds.waits_for_dependencies(node)
    })
    .await;
    write_atomic(
        &xds.file("secret.yaml"),
        &tls_secret_yaml(secret, &bundle.server.cert_pem, &bundle.server.key_pem),
    )
    .must();
    let addr = localhost(tls_port);
    let (leaf, resp) = envoy
        .eventually("the TLS listener with the late Secret", CONVERGE, || {
            get_tls(addr, &bundle.ca.cert_pem)
        })
        .await
        .must();
    assert_eq!(leaf, cert_der(&bundle.server.cert_pem).must());
    assert_eq!((resp.status, resp.body.as_str()), (200, node));
    drop(envoy);
    xds.stop().await.must();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_streams_and_envoy_keeps_serving() {
    use marin3r_testkit::wait::{POLL, poll_ok};
    use marin3r_tests::xds::{direct_response_yaml, get};
    init_tracing();
    let nodes = ["drain-a", "drain-b", "drain-c"];
    let ports: Vec<u16> = nodes.iter().map(|_| free_port().unwrap()).collect();
    let files: Vec<(String, String)> = nodes
        .iter()
        .zip(&ports)
        .map(|(node, port)| {
            (
                format!("{node}.yaml"),
                direct_response_yaml(node, *port, &format!("{node} served\n")).unwrap(),
            )
        })
        .collect();
    let files: Vec<(&str, String)> = files.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
    let drain_delay = Duration::from_secs(1);
    let (xds, mut process, log) =
        Xds::start_process(&files, &["--drain-time", "3s", "--drain-delay", "1s"])
            .await
            .must();
    let report = |what: &str| {
        format!(
            "{what}\n---- marin3r log ----\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    };
    let mut envoys: Vec<Envoy> = nodes
        .iter()
        .map(|node| Envoy::start(&xds, node, ApiType::Sotw).unwrap())
        .collect();
    for ((envoy, port), node) in envoys.iter_mut().zip(&ports).zip(&nodes) {
        envoy
            .wait_body(localhost(*port), &format!("{node} served\n"), CONVERGE)
            .await
            .unwrap_or_else(|e| panic!("{}", report(&e)));
    }
    let readyz = get(xds.health, "/readyz").await.unwrap();
    assert_eq!(readyz.status, 200, "{}", report("ready once synced"));

    let sent = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &process.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Not ready at once (observed before the process is gone: the drain takes a while
    // with three streams).
    let not_ready = poll_ok("/readyz 503 during the drain", CONVERGE, POLL, || async {
        match get(xds.health, "/readyz").await {
            Ok(r) if r.status == 503 => Ok(r.body),
            Ok(r) => Err(format!("status {}", r.status)),
            Err(e) => Err(e),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{}", report(&e)));
    assert_eq!(not_ready, "not ready", "{}", report("/readyz body"));

    // Every Envoy keeps serving while the service drains and after it exited, and the
    // process exits by itself.
    let mut probes = 0;
    let exit = poll_ok(
        "the discovery service's exit",
        Duration::from_secs(60),
        POLL,
        || std::future::ready(process.try_wait().ok_or("still running")),
    );
    let keep_probing = async {
        loop {
            for ((envoy, port), node) in envoys.iter_mut().zip(&ports).zip(&nodes) {
                envoy.check_running().unwrap();
                let body = body_at(*port)
                    .await
                    .unwrap_or_else(|e| panic!("{}", report(&e)));
                assert_eq!(body, format!("{node} served\n"));
                probes += 1;
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let status = tokio::select! {
        status = exit => status,
        never = keep_probing => never,
    }
    .unwrap_or_else(|e| panic!("{}", report(&e)));
    let exited_after = sent.elapsed();
    assert!(
        status.success(),
        "{}",
        report(&format!("exit status {status}"))
    );
    assert!(
        exited_after >= drain_delay,
        "{}",
        report(&format!(
            "exited {exited_after:?} after SIGTERM, before the drain delay with Envoys connected"
        ))
    );
    for ((envoy, port), node) in envoys.iter_mut().zip(&ports).zip(&nodes) {
        envoy.check_running().unwrap();
        assert_eq!(body_at(*port).await.unwrap(), format!("{node} served\n"));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let closed = text.matches("stream closed").count();
    eprintln!(
        "exited {exited_after:?} after SIGTERM (drain delay 1 s, drain 3 s, 3 connections); {probes} listener probes OK meanwhile; {closed} 'stream closed' lines"
    );
    for line in text
        .lines()
        .filter(|l| l.contains("stream closed") || l.contains("SIGTERM"))
    {
        eprintln!("  {line}");
    }
    assert!(closed >= nodes.len(), "{}", report("every stream closed"));
}
