//! The discovery service stops within 2 s of its shutdown signal, in both modes, and in
//! Kubernetes mode even when the API server accepts requests but never answers them:
//! while it still waits for the first lists, and once it serves without them.
//!
//! Everything runs on tokio's paused clock (the listeners of the in-process launcher are
//! bound but no socket is connected; the API server is kube-rs' in-memory mock), so
//! "2 s" is virtual time and the timers the process could wait on (the 30 s
//! initial-sync timeout, the drain, the grace) cost nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use marin3r_control_plane::Backend;
use marin3r_control_plane::kubernetes::KubernetesBackend;
use marin3r_control_plane::local::LocalBackend;
use marin3r_testkit::kube::{ApiServer, mock_client};
use marin3r_tests::in_process::{CertFiles, InProcess, bind_localhost};
use marin3r_tests::xds::issue_bundle;
use marin3r_xds::AdsConfig;
use tokio::time::Instant;

/// How long the process may take once signalled.
const WITHIN: Duration = Duration::from_secs(2);
/// How long Kubernetes mode waits for the first lists before serving anyway.
const INITIAL_SYNC: Duration = Duration::from_secs(30);

/// Receives every request and never answers it (the answers are kept pending); counts
/// them.
fn never_answering(mut api: ApiServer) -> Arc<AtomicUsize> {
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        let mut pending = Vec::new();
        while let Some((_request, answer)) = api.0.next_request().await {
            pending.push(answer);
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    received
}

/// The discovery service serving `backend` in-process, with certificates in `dir`.
async fn start(dir: &Path, backend: impl Backend) -> InProcess {
    issue_bundle().unwrap().write_to(dir).unwrap();
    let xdss = bind_localhost().await.unwrap();
    InProcess::launch(xdss, &CertFiles::in_dir(dir), AdsConfig::default(), backend)
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn kubernetes_mode_stops_while_waiting_for_the_first_lists() {
    let dir = tempfile::tempdir().unwrap();
    let (client, api) = mock_client();
    let received = never_answering(api);
    let started = Instant::now();
    let running = start(dir.path(), KubernetesBackend::new(client, "", 5)).await;
    // The lists of EnvoyConfigs, EnvoyConfigRevisions, Secrets and EndpointSlices were
    // asked for, and stay unanswered.
    marin3r_testkit::wait_until("the first lists requested", Duration::from_secs(5), || {
        received.load(Ordering::SeqCst) >= 4
    })
    .await;
    assert!(
        started.elapsed() < INITIAL_SYNC,
        "still waiting for the first lists"
    );
    running.stop(WITHIN).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn kubernetes_mode_stops_when_serving_without_the_first_lists() {
    let dir = tempfile::tempdir().unwrap();
    let (client, api) = mock_client();
    let received = never_answering(api);
    let running = start(dir.path(), KubernetesBackend::new(client, "", 5)).await;
    // Past the initial-sync timeout: the backend runs its controllers, not ready.
    tokio::time::sleep(INITIAL_SYNC + Duration::from_secs(1)).await;
    assert!(received.load(Ordering::SeqCst) >= 4);
    running.stop(WITHIN).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn local_mode_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    let running = start(dir.path(), LocalBackend::new(&config_dir)).await;
    // Serving: the first scan applied, the folder polled.
    tokio::time::sleep(Duration::from_secs(3)).await;
    running.stop(WITHIN).await.unwrap();
}

/// One of several replicas (`--leader-elect`): the Lease, its report and its farewell (a
/// last report, its deletion, the Lease released) all go to an API server that never
/// answers; each is bounded, side by side.
#[tokio::test(start_paused = true)]
async fn a_replica_of_several_stops_when_the_api_server_never_answers() {
    use marin3r_control_plane::kubernetes::ha::HaConfig;
    let dir = tempfile::tempdir().unwrap();
    let (client, api) = mock_client();
    let received = never_answering(api);
    let ha = HaConfig::new(
        "discoveryservice",
        "default",
        "ds-0",
        Some("uid-0".into()),
        15,
    );
    let running = start(
        dir.path(),
        KubernetesBackend::new(client, "", 5).with_ha(ha),
    )
    .await;
    tokio::time::sleep(INITIAL_SYNC + Duration::from_secs(1)).await;
    // The four kinds, the reports, the Service's EndpointSlices and the Lease.
    assert!(received.load(Ordering::SeqCst) >= 7, "{received:?}");
    running.stop(WITHIN).await.unwrap();
}
