//! Local mode restarted on a corrupt `--state-dir` file (issue "Hostile input, round 3"),
//! with a real Envoy 1.40 and the discovery service in-process: the taint that was the
//! state file's last change survives (the file's copy holds it), and the first
//! publication of the new process already honours it, so the known-bad listener is never
//! pushed to the connected Envoy again (before the fix: five pushes, until five fresh
//! NACKs tainted it again).

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use marin3r_control_plane::local::LocalBackend;
use marin3r_envoyconfig::envoyconfig::CacheState;
use marin3r_testkit::{free_port, wait_ok};
use marin3r_tests::Must;
use marin3r_tests::configs::{answering_listener, envoy_config, rejected_listener};
use marin3r_tests::xds::{
    CONVERGE, Serving, Xds, init_tracing, localhost, metric_sum, pod_name, write_atomic,
};

/// A config Envoy accepts: `GET http://127.0.0.1:port/` answers 200 `body`.
fn good(node_id: &str, port: u16, body: &str) -> String {
    envoy_config(node_id, vec![answering_listener(port, body)])
}

/// A listener Envoy rejects: it routes to a cluster that does not exist.
fn broken(node_id: &str, port: u16) -> String {
    envoy_config(node_id, vec![rejected_listener(port)])
}

/// `marin3r_xdss_discovery_{kind}_total` of one pod for listeners.
async fn listener_counter(xds: &Xds, kind: &str, node_id: &str) -> f64 {
    let text = xds.metrics_text().await.must();
    metric_sum(
        &text,
        &format!("marin3r_xdss_discovery_{kind}_total"),
        &[
            ("node_id", node_id),
            ("resource_type", "listener"),
            ("pod_name", &pod_name(node_id)),
        ],
    )
}

async fn wait_state(xds: &Xds, node_id: &str, state: CacheState) {
    wait_ok(format!("cacheState {state}"), CONVERGE, || async {
        let ec = xds.status_of(node_id).await?;
        if ec.cache_state == Some(state) {
            Ok(())
        } else {
            Err(format!("{:?}: {ec:?}", ec.cache_state))
        }
    })
    .await
}

fn backend(state_dir: PathBuf) -> impl FnOnce(&Path) -> LocalBackend {
    move |dir| {
        LocalBackend::new(dir)
            .with_nack_threshold(1)
            .with_state_dir(state_dir)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_corrupt_state_file_never_pushes_the_known_bad_listener_again() {
    init_tracing();
    let node = "e2e-state-corrupt";
    let (port, moved) = (free_port().unwrap(), free_port().unwrap());
    let state = tempfile::tempdir().unwrap();
    let file = format!("{node}.json");
    let Serving { mut xds, mut envoy } = Serving::start(
        Xds::start_with(
            &[(&file, good(node, port, "good\n"))],
            backend(state.path().to_path_buf()),
        )
        .await
        .must(),
        node,
        port,
        "good\n",
    )
    .await
    .must();

    // The bad listener is NACKed and tainted: the taint is the state file's last change.
    write_atomic(&xds.file(&file), &broken(node, moved)).must();
    wait_state(&xds, node, CacheState::Rollback).await;
    assert!(listener_counter(&xds, "nack", node).await >= 1.0);

    // Down, the state file is corrupted; the folder still holds the bad listener.
    xds.stop_serving().await.must();
    let state_file = state.path().join(format!("default_{node}.json"));
    assert!(state_file.is_file());
    std::fs::write(&state_file, "{").unwrap();
    xds.serve_again(backend(state.path().to_path_buf()))
        .await
        .must();

    // Envoy's first ACK on the new server: had the bad listener been pushed first, its
    // NACK would have come before (it is what taints it again), so none may be counted.
    wait_ok(
        "Envoy ACKs a listener on the new server",
        CONVERGE,
        || async {
            let acks = listener_counter(&xds, "ack", node).await;
            if acks >= 1.0 {
                Ok(())
            } else {
                Err(format!("{acks} ACKs"))
            }
        },
    )
    .await;
    assert_eq!(
        listener_counter(&xds, "nack", node).await,
        0.0,
        "the known-bad listener was pushed again after the restart"
    );
    wait_state(&xds, node, CacheState::Rollback).await;
    envoy
        .wait_body(localhost(port), "good\n", CONVERGE)
        .await
        .must();
    drop(envoy);
    xds.stop().await.must();
}
