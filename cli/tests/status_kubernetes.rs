//! `marin3r status` in Kubernetes mode: the EnvoyConfigs read through the API server (the
//! test kit's fake one, holding what three real discovery service replicas in Kubernetes
//! mode wrote), and the Envoys of each replica from its CSDS, rows labelled by replica:
//! asked at given `--csds-address`es, and (no address given) at every Pod the Service
//! selects, each through a port-forward by the API server. Real Envoys 1.40, each
//! connected to one replica. The client certificate is the sidecars' Secret
//! (`envoy-sidecar-client-cert`) read through the same client, as the command does by
//! default. Compared with `cli/tests/golden/status/kubernetes.txt` and
//! `kubernetes-port-forward.txt` (`UPDATE_GOLDEN=1` rewrites them); versions and ports
//! normalised.

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use base64::Engine as _;
use marin3r_cli::status::csds::CertificateFiles;
use marin3r_cli::status::run::{self, Format, Options};
use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::free_port;
use marin3r_tests::configs::{answering_listener, rejected_listener, resource};
use marin3r_tests::ha::{DS, Fleet, FleetOptions, NS, api_server, envoyconfig};
use marin3r_tests::xds::{Envoy, EnvoyExtras, XdsTarget, init_tracing};
use serde_json::json;

mod support;
use support::{golden, normalise};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_mode_lists_envoyconfigs_and_each_replicas_envoys() {
    init_tracing();
    let api = api_server();
    let (kuard_port, broken_port) = (free_port().unwrap(), free_port().unwrap());
    for (name, spec) in [
        (
            "kuard",
            json!({"nodeID": "kuard", "resources": [
                resource("cluster", json!({"name": "upstream", "connect_timeout": "1s"})),
                answering_listener(kuard_port, "kuard\n"),
            ]}),
        ),
        (
            "broken",
            json!({"nodeID": "broken", "resources": [rejected_listener(broken_port)]}),
        ),
        ("idle", json!({"nodeID": "idle", "resources": []})),
    ] {
        api.put(envoyconfig(name, spec)).unwrap();
    }
    let fleet = Fleet::start(
        api,
        3,
        FleetOptions {
            threshold: 1_000_000,
            ..FleetOptions::default()
        },
    )
    .await
    .unwrap();
    // The sidecars' client certificate Secret, as a DiscoveryService creates it.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    fleet
        .api
        .put(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "envoy-sidecar-client-cert", "namespace": NS},
            "data": {
                "tls.crt": b64(&fleet.bundle.client.cert_pem),
                "tls.key": b64(&fleet.bundle.client.key_pem),
                "ca.crt": b64(&fleet.bundle.ca.cert_pem),
            },
        }))
        .unwrap();

    let replica = |name: &str| fleet.replicas[name].server.xdss;
    let (ds0, ds1) = (replica("ds-0"), replica("ds-1"));
    let envoy = |addr: std::net::SocketAddr, node: &str, pod: &str, api: ApiType| {
        let target = XdsTarget {
            port: addr.port(),
            certs_dir: fleet.certs_dir(),
        };
        Envoy::start_at(&target, node, pod, api, None, &EnvoyExtras::default()).unwrap()
    };
    let _kuard_a = envoy(ds0, "kuard", "kuard-a", ApiType::Sotw);
    let _kuard_b = envoy(ds1, "kuard", "kuard-b", ApiType::Delta);
    let _broken = envoy(ds0, "broken", "broken-a", ApiType::Sotw);

    let options = Options {
        node: None,
        revisions: false,
        format: Format::Table,
        csds_addresses: vec![ds0.to_string(), ds1.to_string()],
        certificate: CertificateFiles::default(),
        server_name: Some("localhost".into()),
        discovery_service: DS.into(),
        timeout: Duration::from_secs(5),
    };
    let client = fleet.api.client();
    let text = settle(&client, &options).await;
    // The replicas by name, as wide as their addresses (the column stays aligned).
    let mut text = text;
    for (name, addr) in [("ds-0", ds0), ("ds-1", ds1)] {
        let addr = addr.to_string();
        text = text.replace(&addr, &format!("{name:<width$}", width = addr.len()));
    }
    golden(
        "kubernetes.txt",
        &normalise(&text, &[kuard_port, broken_port]),
    );

    // --revisions: each EnvoyConfig's EnvoyConfigRevisions from the API server.
    let with_revisions = run::kubernetes(
        &client,
        None,
        NS,
        &Options {
            revisions: true,
            ..options.clone()
        },
    )
    .await
    .unwrap();
    assert!(
        with_revisions
            .text
            .contains("\nRevisions of default/kuard (node ID kuard):\nVERSION "),
        "{}",
        with_revisions.text
    );

    // One replica down: the other's rows, a line naming the missing one, exit code 3.
    let closed = free_port().unwrap();
    let partial = run::kubernetes(
        &client,
        Some(NS),
        NS,
        &Options {
            csds_addresses: vec![ds0.to_string(), format!("127.0.0.1:{closed}")],
            ..options.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(partial.code, run::EXIT_ENVOYS_MISSING, "{}", partial.text);
    assert!(
        partial.text.contains(&format!(
            "Envoys of 127.0.0.1:{closed} not shown: CSDS 127.0.0.1:{closed}: cannot connect"
        )),
        "{}",
        partial.text
    );
    assert!(partial.text.contains("kuard-a"), "{}", partial.text);

    // No --csds-address: every running Pod the Service selects (three replicas, the
    // third with no Envoy), each through a port-forward; rows labelled by Pod.
    let forwarded = Options {
        csds_addresses: Vec::new(),
        server_name: None,
        ..options.clone()
    };
    let mark = fleet.api.mark();
    let text = settle(&client, &forwarded).await;
    golden(
        "kubernetes-port-forward.txt",
        &normalise(&text, &[kuard_port, broken_port]),
    );
    let forwards: Vec<String> = fleet
        .api
        .requests_since(mark)
        .into_iter()
        .filter(|r| r.subresource.as_deref() == Some("portforward"))
        .map(|r| format!("{} {}", r.name.unwrap_or_default(), r.code))
        .collect();
    for pod in ["ds-0", "ds-1", "ds-2"] {
        assert!(
            forwards.contains(&format!("{pod} 101")),
            "{pod} not forwarded: {forwards:?}"
        );
    }

    // A replica whose port cannot be reached: the kubelet's error names it, the others
    // are shown, exit code 3.
    fleet
        .api
        .put(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ds-9", "namespace": NS, "labels": {
                "app.kubernetes.io/name": "marin3r",
                "app.kubernetes.io/component": "discoveryservice"}},
            "spec": {"containers": [{"name": "discovery-service", "image": "marin3r"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap();
    let unreachable = run::kubernetes(&client, Some(NS), NS, &forwarded)
        .await
        .unwrap();
    assert_eq!(
        unreachable.code,
        run::EXIT_ENVOYS_MISSING,
        "{}",
        unreachable.text
    );
    assert!(
        unreachable
            .text
            .contains("Envoys of pod/ds-9 not shown: CSDS pod/ds-9: cannot connect"),
        "{}",
        unreachable.text
    );
    assert!(
        unreachable
            .text
            .contains("error forwarding port 18000 to pod"),
        "{}",
        unreachable.text
    );
    assert!(
        unreachable.text.contains("pod/ds-1 "),
        "{}",
        unreachable.text
    );
    fleet.api.delete("pods", NS, "ds-9").unwrap();

    // No Service of that name: the EnvoyConfigs, and why the Envoys are missing.
    let no_service = run::kubernetes(
        &client,
        Some(NS),
        NS,
        &Options {
            discovery_service: "elsewhere".into(),
            ..forwarded.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(no_service.code, run::EXIT_ENVOYS_MISSING);
    assert!(
        no_service.text.contains(
            "Envoys not shown: cannot read the Service default/marin3r-elsewhere of the \
             discovery service"
        ),
        "{}",
        no_service.text
    );
    assert!(no_service.text.contains("kuard"), "{}", no_service.text);
}

/// Asks until two answers in a row are the same and show every Envoy in sync: three
/// EnvoyConfigs InSync, kuard's listener and cluster ACKed by both of its Envoys, broken's
/// listener NACKed.
async fn settle(client: &kube::Client, options: &Options) -> String {
    let mut last = String::new();
    for _ in 0..300 {
        let outcome = run::kubernetes(client, Some(NS), NS, options)
            .await
            .unwrap();
        let text = outcome.text;
        let rows = |node: &str, ty: &str, status: &str| {
            text.lines()
                .filter(|l| {
                    l.contains(&format!(" {node} "))
                        && l.contains(&format!(" {ty} "))
                        && l.contains(&format!(" {status} "))
                })
                .count()
        };
        let in_sync = text.lines().filter(|l| l.ends_with(" InSync")).count() == 3;
        if text == last
            && outcome.code == 0
            && in_sync
            && rows("kuard", "listener", "ACKED") == 2
            && rows("kuard", "cluster", "ACKED") == 2
            && rows("broken", "listener", "NACKED") == 1
        {
            eprintln!("---- marin3r status ----\n{text}------------------------");
            return text;
        }
        last = text;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never settled; last status:\n{last}");
}
