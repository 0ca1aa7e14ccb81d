//! Leader election of `marin3r operator` against a mock API server that keeps one Lease
//! (create, get, server-side apply and strategic merge patches, as the API server
//! applies them): the controllers start only once the Lease is held by this pod, and
//! stop before the Lease is released on shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use marin3r_operator::leader::{
    LEASE_DURATION_SECONDS, LEASE_GRACE_SECONDS, LEASE_NAME, lease_field_manager, run_while_leader,
};
use marin3r_testkit::kube::*;
use marin3r_testkit::wait_until;
use serde_json::{Value, json};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/marin3r-system/leases";

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
                    json_patch::merge(&mut l["spec"], &got.body["spec"]);
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

// ---------------------------------------------------------------------------------------
// Losing the lease: to another holder, or because renewals fail. A one-Lease server
// whose Lease a test can take over, and whose patches it can make fail.

/// The Lease and what the server does with writes.
#[derive(Default)]
struct Cluster {
    lease: Option<Value>,
    /// Answer every PATCH with 500 (an API server that cannot write).
    fail_patches: bool,
    /// `METHOD path` of every request.
    log: Vec<String>,
    /// The field manager owning `spec.holderIdentity` (server-side apply semantics: an
    /// apply by another manager that changes it is a 409 Conflict; any write setting it
    /// takes it over, clearing it drops the owner).
    holder_owner: Option<String>,
    /// Applies refused with 409.
    conflicts: usize,
    /// Called on an apply that takes an orphaned lease, before it is processed: a test
    /// lands another replica's write first.
    before_take: Option<BeforeTake>,
}

type SharedCluster = Arc<Mutex<Cluster>>;

/// A write landed by another replica: (the Lease, the owner of its holder).
type BeforeTake = Box<dyn FnMut(&mut Option<Value>, &mut Option<String>) + Send>;

fn cluster_server(mut api: ApiServer, cluster: SharedCluster) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some((request, send)) = api.0.next_request().await {
            let got = read(request).await;
            let mut c = cluster.lock().unwrap();
            c.log.push(format!(
                "{} {}",
                got.method,
                got.uri.split('?').next().unwrap()
            ));
            let manager = got
                .uri
                .split(['?', '&'])
                .find_map(|p| p.strip_prefix("fieldManager="))
                .unwrap_or_default()
                .to_string();
            let apply = got.content_type.contains("apply-patch");
            let wanted = got.body["spec"].get("holderIdentity").cloned();
            if apply
                && wanted.as_ref().is_some_and(Value::is_string)
                && c.lease
                    .as_ref()
                    .is_some_and(|l| l["spec"]["holderIdentity"].is_null())
                && let Some(mut hook) = c.before_take.take()
            {
                let Cluster {
                    lease,
                    holder_owner,
                    ..
                } = &mut *c;
                hook(lease, holder_owner);
            }
            let current = c
                .lease
                .as_ref()
                .map(|l| l["spec"]["holderIdentity"].clone())
                .unwrap_or(Value::Null);
            let conflict = apply
                && wanted.as_ref().is_some_and(|w| *w != current)
                && !current.is_null()
                && c.holder_owner.as_deref().is_some_and(|o| o != manager);
            if conflict {
                c.conflicts += 1;
            }
            let (status, body) = match got.method.as_str() {
                "PATCH" if conflict => (
                    409,
                    status_failure(
                        409,
                        "Conflict",
                        "Apply failed with 1 conflict: conflict with \"other\": .spec.holderIdentity",
                    ),
                ),
                "PATCH" if c.fail_patches => (
                    500,
                    status_failure(500, "InternalError", "etcd is unavailable"),
                ),
                "GET" => match &c.lease {
                    Some(l) => (200, l.clone()),
                    None => (404, status_failure(404, "NotFound", "lease not found")),
                },
                "POST" => {
                    let mut created = got.body.clone();
                    created["metadata"]["resourceVersion"] = json!("1");
                    c.lease = Some(created.clone());
                    (201, created)
                }
                "PATCH" => {
                    match &wanted {
                        Some(Value::Null) => c.holder_owner = None,
                        Some(_) => c.holder_owner = Some(manager.clone()),
                        None => {}
                    }
                    match &mut c.lease {
                        Some(l) => {
                            json_patch::merge(&mut l["spec"], &got.body["spec"]);
                            (200, l.clone())
                        }
                        None => (404, status_failure(404, "NotFound", "lease not found")),
                    }
                }
                other => panic!("unexpected {other} {}", got.uri),
            };
            drop(c);
            send.send_response(json_response(status, &body));
        }
    })
}

fn holder(cluster: &SharedCluster) -> Option<String> {
    cluster
        .lock()
        .unwrap()
        .lease
        .as_ref()
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
}

fn now() -> Value {
    serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now())).unwrap()
}

/// Terms started and ended (controllers stopped) of one `run_while_leader`.
#[derive(Default)]
struct Terms {
    started: AtomicUsize,
    ended: AtomicUsize,
}

/// Runs leader election as `operator-pod-1` until the returned sender fires.
fn elect(
    client: kube::Client,
) -> (
    Arc<Terms>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let terms = Arc::new(Terms::default());
    let (stop_all, stopped_all) = tokio::sync::oneshot::channel::<()>();
    let t = terms.clone();
    let task = tokio::spawn(async move {
        let work = move |stop: tokio::sync::oneshot::Receiver<()>| {
            let t = t.clone();
            t.started.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = stop.await;
                t.ended.fetch_add(1, Ordering::SeqCst);
            }
        };
        run_while_leader(
            client,
            "marin3r-system",
            "operator-pod-1",
            work,
            |_| {},
            async {
                let _ = stopped_all.await;
            },
        )
        .await
        .unwrap();
    });
    (terms, stop_all, task)
}

#[tokio::test]
async fn losing_the_lease_to_another_holder_stops_the_controllers_until_it_is_won_back() {
    let (client, api) = mock_client();
    let cluster = SharedCluster::default();
    let server = cluster_server(api, cluster.clone());
    let (terms, stop_all, task) = elect(client);
    wait_until("the first term", Duration::from_secs(10), || {
        terms.started.load(Ordering::SeqCst) == 1
    })
    .await;
    // Another replica holds it now (as after a partition healed).
    {
        let mut c = cluster.lock().unwrap();
        let spec = &mut c.lease.as_mut().unwrap()["spec"];
        spec["holderIdentity"] = json!("operator-pod-2");
        spec["renewTime"] = now();
    }
    // Seen at the next renewal (every LEASE_DURATION - LEASE_GRACE seconds).
    let renew_every = LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS;
    wait_until(
        "the controllers stopped",
        Duration::from_secs(renew_every + 2),
        || terms.ended.load(Ordering::SeqCst) == 1,
    )
    .await;
    assert_eq!(terms.started.load(Ordering::SeqCst), 1);
    assert_eq!(holder(&cluster).as_deref(), Some("operator-pod-2"));
    // operator-pod-2 stops renewing: its lock expires, ours again, a new term.
    wait_until(
        "the lease won back",
        Duration::from_secs(LEASE_DURATION_SECONDS + 5),
        || terms.started.load(Ordering::SeqCst) == 2,
    )
    .await;
    assert_eq!(holder(&cluster).as_deref(), Some("operator-pod-1"));
    stop_all.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, task).await.unwrap().unwrap();
    assert_eq!(terms.ended.load(Ordering::SeqCst), 2);
    assert_eq!(holder(&cluster), None, "released on shutdown");
    server.abort();
}

#[tokio::test]
async fn failing_renewals_stop_the_controllers_before_the_lease_expires() {
    let (client, api) = mock_client();
    let cluster = SharedCluster::default();
    let server = cluster_server(api, cluster.clone());
    let (terms, stop_all, task) = elect(client);
    wait_until("the first term", Duration::from_secs(10), || {
        terms.started.load(Ordering::SeqCst) == 1
    })
    .await;
    // From now on no renewal succeeds. Another replica may take the lease once it
    // expires, LEASE_DURATION_SECONDS after the last renewal it records: the controllers
    // must be stopped by then, which is the bound of the wait.
    let expires = {
        let mut c = cluster.lock().unwrap();
        c.fail_patches = true;
        let renewed: k8s_openapi::jiff::Timestamp = c.lease.as_ref().unwrap()["spec"]["renewTime"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        std::time::SystemTime::from(renewed) + Duration::from_secs(LEASE_DURATION_SECONDS)
    };
    wait_until(
        "the controllers stopped while renewals fail, before the lease expires",
        expires
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
        || terms.ended.load(Ordering::SeqCst) == 1,
    )
    .await;
    // The API server recovers: the lease is still ours, a new term starts.
    cluster.lock().unwrap().fail_patches = false;
    wait_until("a new term", Duration::from_secs(40), || {
        terms.started.load(Ordering::SeqCst) == 2
    })
    .await;
    stop_all.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, task).await.unwrap().unwrap();
    assert_eq!(holder(&cluster), None, "released on shutdown");
    server.abort();
}

#[tokio::test]
async fn a_follower_never_starts_the_controllers_nor_writes_the_lease() {
    let (client, api) = mock_client();
    let cluster = SharedCluster::default();
    cluster.lock().unwrap().lease = Some(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": "marin3r-system", "resourceVersion": "1"},
        "spec": {"holderIdentity": "operator-pod-2", "leaseDurationSeconds": 15,
                 "acquireTime": now(), "renewTime": now(), "leaseTransitions": 3}
    }));
    let server = cluster_server(api, cluster.clone());
    // operator-pod-2 keeps renewing.
    let renewer = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut c = cluster.lock().unwrap();
                c.lease.as_mut().unwrap()["spec"]["renewTime"] = now();
            }
        })
    };
    let (terms, stop_all, task) = elect(client);
    // The follower reads the lease, finds it held and waits for it to expire (it never
    // does: it is renewed). A wrong start or write would follow that read at once: a
    // negative, so a short fixed window after it.
    wait_until("the follower read the lease", TIMEOUT, || {
        cluster
            .lock()
            .unwrap()
            .log
            .iter()
            .any(|r| r.starts_with("GET"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_all.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, task).await.unwrap().unwrap();
    renewer.abort();
    assert_eq!(terms.started.load(Ordering::SeqCst), 0);
    assert_eq!(holder(&cluster).as_deref(), Some("operator-pod-2"));
    let log = cluster.lock().unwrap().log.clone();
    assert!(log.iter().all(|r| r.starts_with("GET")), "{log:?}");
    server.abort();
}

#[tokio::test]
async fn two_replicas_racing_for_a_free_lease_never_both_run_the_controllers() {
    let (client, api) = mock_client();
    let cluster = SharedCluster::default();
    // A free Lease (as after a release).
    cluster.lock().unwrap().lease = Some(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": "marin3r-system", "resourceVersion": "1"},
        "spec": {"leaseTransitions": 3}
    }));
    // operator-pod-2 saw it free too, and its apply lands just before ours.
    cluster.lock().unwrap().before_take = Some(Box::new(|lease, owner| {
        let spec = &mut lease.as_mut().unwrap()["spec"];
        spec["holderIdentity"] = json!("operator-pod-2");
        spec["leaseDurationSeconds"] = json!(LEASE_DURATION_SECONDS);
        spec["acquireTime"] = now();
        spec["renewTime"] = now();
        *owner = Some(lease_field_manager("operator-pod-2"));
    }));
    let server = cluster_server(api, cluster.clone());
    // operator-pod-2 keeps renewing once it holds the lock.
    let renewer = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut c = cluster.lock().unwrap();
                let spec = &mut c.lease.as_mut().unwrap()["spec"];
                if spec["holderIdentity"] == "operator-pod-2" {
                    spec["renewTime"] = now();
                }
            }
        })
    };
    let (terms, stop_all, task) = elect(client);
    // Our apply conflicts; we read the lease again, find operator-pod-2 holding it and
    // wait for it to expire (it never does: it is renewed). A wrong start or overwrite
    // would follow that read at once: a negative, so a short fixed window after it.
    wait_until(
        "the lease read again after our conflicting apply",
        TIMEOUT,
        || {
            let c = cluster.lock().unwrap();
            let first_patch = c.log.iter().position(|r| r.starts_with("PATCH"));
            let last_get = c.log.iter().rposition(|r| r.starts_with("GET"));
            c.conflicts >= 1 && first_patch.is_some_and(|p| last_get.is_some_and(|g| g > p))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        terms.started.load(Ordering::SeqCst),
        0,
        "operator-pod-1 overwrote operator-pod-2's fresh lock: two leaders"
    );
    assert_eq!(holder(&cluster).as_deref(), Some("operator-pod-2"));
    assert!(
        cluster.lock().unwrap().conflicts >= 1,
        "our apply conflicted with operator-pod-2's field manager"
    );
    stop_all.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, task).await.unwrap().unwrap();
    renewer.abort();
    server.abort();
}
