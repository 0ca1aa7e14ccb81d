//! Leader election of `marin3r operator` against a mock API server that keeps one Lease
//! (create, get, server-side apply and strategic merge patches, as the API server
//! applies them): the controllers start only once the Lease is held by this pod, and
//! stop before the Lease is released on shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kube_mock;

use std::sync::{Arc, Mutex};

use kube_mock::*;
use marin3r_control_plane::operator::leader::{LEASE_NAME, run_while_leader};
use serde_json::{Value, json};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/marin3r-system/leases";

/// Merges `patch` into `target` (JSON merge semantics: `null` removes a field).
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Serves the Lease until the client goes away; records `method uri` of each request.
async fn lease_server(mut api: ApiServer, log: Arc<Mutex<Vec<(String, Value)>>>) {
    let mut lease: Option<Value> = None;
    while let Some((request, send)) = api.0.next_request().await {
        let got = read(request).await;
        log.lock().unwrap().push((
            format!("{} {}", got.method, got.uri.split('?').next().unwrap()),
            got.body.clone(),
        ));
        let (status, body) = match got.method.as_str() {
            "GET" => match &lease {
                Some(l) => (200, l.clone()),
                None => (404, status_failure(404, "NotFound", "lease not found")),
            },
            "POST" => {
                let mut created = got.body.clone();
                created["metadata"]["resourceVersion"] = json!("1");
                lease = Some(created.clone());
                (201, created)
            }
            "PATCH" => match &mut lease {
                Some(l) => {
                    merge(&mut l["spec"], &got.body["spec"]);
                    (200, l.clone())
                }
                None => (404, status_failure(404, "NotFound", "lease not found")),
            },
            other => panic!("unexpected {other} {}", got.uri),
        };
        send.send_response(json_response(status, &body));
    }
}

#[tokio::test]
async fn the_controllers_run_only_while_the_lease_is_held_and_it_is_released_after_them() {
    let (client, api) = mock_client();
    let log = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(lease_server(api, log.clone()));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Mutex::new(Some(started_tx));
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = Arc::new(Mutex::new(false));
    let changes = Arc::new(Mutex::new(Vec::new()));
    let (stopped2, changes2, log2) = (stopped.clone(), changes.clone(), log.clone());
    let work = move |stop: tokio::sync::oneshot::Receiver<()>| {
        let started = started_tx.lock().unwrap().take();
        let (stopped, log) = (stopped2.clone(), log2.clone());
        async move {
            // The lease is held by this pod when the controllers start.
            let held = log.lock().unwrap().iter().any(|(what, body)| {
                what == &format!("PATCH {LEASES}/{LEASE_NAME}")
                    && body["spec"]["holderIdentity"] == "operator-pod-1"
            });
            assert!(held, "controllers started before the lease was taken");
            if let Some(s) = started {
                let _ = s.send(());
            }
            let _ = stop.await;
            *stopped.lock().unwrap() = true;
        }
    };
    let run = run_while_leader(
        client,
        "marin3r-system",
        "operator-pod-1",
        work,
        move |leader| changes2.lock().unwrap().push(leader),
        async {
            let _ = shutdown_rx.await;
        },
    );
    let driver = async {
        tokio::time::timeout(TIMEOUT, started_rx)
            .await
            .unwrap()
            .unwrap();
        assert!(!*stopped.lock().unwrap());
        shutdown_tx.send(()).unwrap();
    };
    let (result, ()) = tokio::time::timeout(TIMEOUT, async { tokio::join!(run, driver) })
        .await
        .unwrap();
    result.unwrap();
    assert!(*stopped.lock().unwrap(), "the controllers were stopped");
    assert_eq!(*changes.lock().unwrap(), [true, false]);
    let log = log.lock().unwrap().clone();
    let what: Vec<&str> = log.iter().map(|(w, _)| w.as_str()).collect();
    let lease = format!("{LEASES}/{LEASE_NAME}");
    assert_eq!(what[0], format!("GET {lease}"), "{what:?}");
    assert_eq!(
        what[1],
        format!("POST {LEASES}"),
        "created when missing: {what:?}"
    );
    assert_eq!(log[1].1["metadata"]["name"], LEASE_NAME);
    // The lock: holder and duration.
    let lock = log
        .iter()
        .find(|(w, b)| {
            *w == format!("PATCH {lease}") && b["spec"]["holderIdentity"] == "operator-pod-1"
        })
        .unwrap();
    assert_eq!(lock.1["spec"]["leaseDurationSeconds"], 15);
    // The last write releases it.
    let release = log
        .iter()
        .rev()
        .find(|(w, _)| w.starts_with("PATCH"))
        .unwrap();
    assert!(release.1["spec"]["holderIdentity"].is_null(), "{release:?}");
    assert!(
        release.1["spec"]
            .as_object()
            .unwrap()
            .contains_key("holderIdentity")
    );
    drop(log);
    server.abort();
}
