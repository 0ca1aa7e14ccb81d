//! The operator stops within 2 s of its shutdown signal when the API server accepts
//! requests but never answers them: without leader election (the controllers' lists
//! hang), with leader election before the Lease was ever read (its first read and the
//! Lease watch hang), and as the leader whose Lease release then hangs.
//!
//! Everything runs on tokio's paused clock (the probe and metrics listeners are bound
//! but nobody connects; the API server is kube-rs' in-memory mock), so "2 s" is virtual
//! time and the timers the operator could wait on cost nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use marin3r_operator::leader::{LEASE_DURATION_SECONDS, LEASE_NAME};
use marin3r_operator::{Images, LeaderConfig, OperatorConfig};
use marin3r_testkit::kube::{ApiServer, json_response, mock_client};
use serde_json::json;

const NAMESPACE: &str = "marin3r-system";
const IDENTITY: &str = "operator-pod-1";

/// `method path` of every request the mock API server received.
type Log = Arc<Mutex<Vec<String>>>;

/// Never answers, except (with `lease_held`) reads of the leader Lease — the object and
/// the list the Lease watch starts with — answered with the Lease held by [`IDENTITY`]
/// and just renewed, and its renewals (the watch itself, and the release, hang).
fn api_server(mut api: ApiServer, lease_held: bool) -> Log {
    let log = Log::default();
    let seen = log.clone();
    tokio::spawn(async move {
        let mut pending = Vec::new();
        while let Some((request, answer)) = api.0.next_request().await {
            let path = request.uri().path().to_string();
            let method = request.method().to_string();
            seen.lock().unwrap().push(format!("{method} {path}"));
            let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases");
            let watching = request
                .uri()
                .query()
                .unwrap_or_default()
                .contains("watch=true");
            let body = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let renewed = MicroTime(k8s_openapi::jiff::Timestamp::now());
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": LEASE_NAME, "namespace": NAMESPACE, "resourceVersion": "1"},
                "spec": {"holderIdentity": IDENTITY, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                         "acquireTime": renewed, "renewTime": renewed}
            });
            // A renewal (it names this replica): answered. A release (it clears the
            // holder) hangs, like everything else.
            let renewal = method == "PATCH"
                && path == format!("{leases}/{LEASE_NAME}")
                && body["spec"]["holderIdentity"] == IDENTITY;
            if lease_held
                && (renewal || (method == "GET" && path == format!("{leases}/{LEASE_NAME}")))
            {
                answer.send_response(json_response(200, &lease));
            } else if lease_held && method == "GET" && path == leases && !watching {
                answer.send_response(json_response(
                    200,
                    &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                            "metadata": {"resourceVersion": "1"}, "items": [lease]}),
                ));
            } else {
                pending.push(answer);
            }
        }
    });
    log
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), marin3r_operator::Error>>,
}

fn start(client: kube::Client, leader_election: bool) -> Running {
    let localhost = "127.0.0.1:0".parse().unwrap();
    let config = OperatorConfig {
        metrics_addr: localhost,
        health_addr: localhost,
        namespaces: Vec::new(),
        images: Images::default(),
        leader: leader_election.then(|| LeaderConfig {
            namespace: NAMESPACE.into(),
            identity: IDENTITY.into(),
        }),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(marin3r_operator::serve(client, config, async move {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    /// Signals shutdown; the operator must return `Ok` within 2 s.
    async fn stops_within_two_seconds(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(2), self.task)
            .await
            .expect("the operator did not stop within 2 s of its shutdown signal")
            .unwrap()
            .unwrap();
    }
}

async fn wait_for_requests(log: &Log, what: &str, condition: impl Fn(&[String]) -> bool) {
    marin3r_testkit::wait_until(what, Duration::from_secs(5), || {
        condition(&log.lock().unwrap())
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn without_leader_election_the_operator_stops_while_its_lists_hang() {
    let (client, api) = mock_client();
    let log = api_server(api, false);
    let running = start(client, false);
    // The three controllers asked for their lists.
    wait_for_requests(&log, "the controllers' lists", |log| log.len() >= 3).await;
    running.stops_within_two_seconds().await;
}

#[tokio::test(start_paused = true)]
async fn with_leader_election_the_operator_stops_while_the_lease_read_hangs() {
    let (client, api) = mock_client();
    let log = api_server(api, false);
    let running = start(client, true);
    wait_for_requests(&log, "the lease read", |log| {
        log.iter().any(|r| r.contains("/leases/"))
    })
    .await;
    running.stops_within_two_seconds().await;
    assert!(
        log.lock().unwrap().iter().all(|r| r.contains("/leases")),
        "no controller ran without the lease"
    );
}

#[tokio::test(start_paused = true)]
async fn the_leader_stops_although_its_lease_release_hangs() {
    let (client, api) = mock_client();
    let log = api_server(api, true);
    let running = start(client, true);
    // Leading: the controllers started and asked for their lists.
    wait_for_requests(&log, "the controllers' lists", |log| {
        log.iter().filter(|r| !r.contains("/leases/")).count() >= 3
    })
    .await;
    let signalled = log.lock().unwrap().len();
    running.stops_within_two_seconds().await;
    let after: Vec<String> = log.lock().unwrap()[signalled..].to_vec();
    assert!(
        after
            .iter()
            .any(|r| r.starts_with("PATCH") && r.contains("/leases/")),
        "the lease release was attempted: {after:?}"
    );
}
