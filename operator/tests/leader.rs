//! Leader election of `marin3r operator` against the stateful fake API server
//! (resourceVersion preconditions, merge patches, the Lease watch):
//! the controllers run only while this replica holds the Lease and stop before it is
//! released; they stop when the Lease is lost, when renewals fail and when they hang —
//! before the Lease expires; a follower neither starts them nor writes the Lease; two
//! replicas racing for a free Lease never both run them.
//!
//! Real time: the replicas run as they would in a cluster (the paused-clock tests of the
//! election are `marin3r-kube`'s, `kube/tests/lease.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use marin3r_operator::leader::{
    LEASE_DURATION_SECONDS, LEASE_GRACE_SECONDS, LEASE_NAME, LeaseError, lease_field_manager,
    lease_settings, run_while_leader,
};
use marin3r_testkit::apiserver::{FakeApiServer, Fault, Verb};
use marin3r_testkit::kube::TIMEOUT;
use marin3r_testkit::wait_until;
use serde_json::{Value, json};
use tokio::sync::oneshot;

const NS: &str = "marin3r-system";
const POD_1: &str = "operator-pod-1";
const POD_2: &str = "operator-pod-2";
/// How often the holder renews the Lease.
const RENEW_EVERY: Duration = Duration::from_secs(LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS);
/// How long a lock lasts without renewal.
const LEASE_DURATION: Duration = Duration::from_secs(LEASE_DURATION_SECONDS);

fn lease(server: &FakeApiServer) -> Option<Lease> {
    let lease = server.get("leases", NS, LEASE_NAME)?;
    Some(serde_json::from_value(lease).unwrap())
}

fn holder(server: &FakeApiServer) -> Option<String> {
    lease(server)?.spec?.holder_identity
}

/// `spec.renewTime` of the Lease.
fn renewed(server: &FakeApiServer) -> SystemTime {
    let renew = lease(server).unwrap().spec.unwrap().renew_time.unwrap();
    SystemTime::from(renew.0)
}

fn now() -> Value {
    serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now())).unwrap()
}

/// How many replicas run the controllers, now and at most.
#[derive(Default)]
struct Leaders {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// The terms (controllers started, then stopped) of one replica.
#[derive(Default)]
struct Terms {
    started: AtomicUsize,
    ended: AtomicUsize,
    /// The Lease's holder when each term started and when its controllers stopped.
    holders: Mutex<Vec<(&'static str, Option<String>)>>,
    /// When the controllers of each term stopped.
    stopped_at: Mutex<Vec<SystemTime>>,
    /// What `on_change` was told.
    changes: Mutex<Vec<bool>>,
}

impl Terms {
    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    fn ended(&self) -> usize {
        self.ended.load(Ordering::SeqCst)
    }

    fn first_stop(&self) -> SystemTime {
        self.stopped_at.lock().unwrap()[0]
    }
}

/// A replica running `run_while_leader` with controllers that record their terms.
struct Replica {
    terms: Arc<Terms>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), LeaseError>>,
}

fn start(server: &FakeApiServer, identity: &'static str, leaders: &Arc<Leaders>) -> Replica {
    let terms = Arc::new(Terms::default());
    let work = {
        let (terms, leaders, server) = (terms.clone(), leaders.clone(), server.clone());
        move |stop: oneshot::Receiver<()>| {
            terms.started.fetch_add(1, Ordering::SeqCst);
            let running = leaders.now.fetch_add(1, Ordering::SeqCst) + 1;
            leaders.most.fetch_max(running, Ordering::SeqCst);
            terms
                .holders
                .lock()
                .unwrap()
                .push(("start", holder(&server)));
            let (terms, leaders, server) = (terms.clone(), leaders.clone(), server.clone());
            async move {
                let _ = stop.await;
                terms.stopped_at.lock().unwrap().push(SystemTime::now());
                terms
                    .holders
                    .lock()
                    .unwrap()
                    .push(("stop", holder(&server)));
                leaders.now.fetch_sub(1, Ordering::SeqCst);
                terms.ended.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let on_change = {
        let terms = terms.clone();
        move |leading| terms.changes.lock().unwrap().push(leading)
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let client = server.client();
    let task = tokio::spawn(async move {
        run_while_leader(client, NS, identity, work, on_change, async {
            let _ = stopped.await;
        })
        .await
    });
    Replica { terms, stop, task }
}

impl Replica {
    /// Signals shutdown and waits for `run_while_leader` to return `Ok`.
    async fn shut_down(self) -> Arc<Terms> {
        self.stop.send(()).unwrap();
        tokio::time::timeout(TIMEOUT, self.task)
            .await
            .expect("run_while_leader did not return after shutdown")
            .unwrap()
            .unwrap();
        self.terms
    }
}

/// operator-pod-1 alone, once its first term has started.
async fn first_term(server: &FakeApiServer) -> Replica {
    let replica = start(server, POD_1, &Arc::default());
    wait_until("the first term", TIMEOUT, || replica.terms.started() == 1).await;
    replica
}

/// Lease writes with `identity`'s field manager since `mark`.
fn lease_writes_by(
    server: &FakeApiServer,
    mark: marin3r_testkit::apiserver::Mark,
    identity: &str,
) -> Vec<String> {
    let manager = lease_field_manager(identity);
    server
        .requests_since(mark)
        .into_iter()
        .filter(|r| r.resource == "leases" && r.is_write())
        .filter(|r| r.field_manager.as_deref() == Some(manager.as_str()))
        .map(|r| format!("{} {} {}", r.method, r.content_type, r.code))
        .collect()
}

#[tokio::test]
async fn the_controllers_run_only_while_the_lease_is_held_and_stop_before_it_is_released() {
    let server = FakeApiServer::new();
    let replica = first_term(&server).await;
    let lock = lease(&server).unwrap().spec.unwrap();
    assert_eq!(lock.lease_duration_seconds, Some(15));
    assert_eq!(lock.holder_identity.as_deref(), Some(POD_1));
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.resource == "leases" && r.verb == Some(Verb::Create)),
        "created when missing"
    );
    assert!(
        requests
            .iter()
            .filter(|r| r.resource == "leases" && r.verb == Some(Verb::Patch))
            .all(|r| r.field_manager.as_deref() == Some(lease_field_manager(POD_1).as_str())),
        "every Lease patch under the replica's own field manager"
    );

    let terms = replica.shut_down().await;
    assert_eq!(terms.ended(), 1, "the controllers were stopped");
    assert_eq!(
        *terms.holders.lock().unwrap(),
        [
            ("start", Some(POD_1.to_string())),
            ("stop", Some(POD_1.to_string()))
        ],
        "started once the Lease was held; stopped before it was released"
    );
    assert_eq!(holder(&server), None, "released on shutdown");
    assert_eq!(*terms.changes.lock().unwrap(), [true, false]);
}

#[tokio::test]
async fn losing_the_lease_to_another_holder_stops_the_controllers_until_it_is_won_back() {
    let server = FakeApiServer::new();
    let replica = first_term(&server).await;
    let terms = replica.terms.clone();
    // Another replica takes the lock over (as after a partition healed: it found the
    // lock expired by its clock).
    let leases: Api<Lease> = Api::namespaced(server.client(), NS);
    let take_over = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "spec": {"holderIdentity": POD_2, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                 "acquireTime": now(), "renewTime": now()}
    });
    let manager = lease_field_manager(POD_2);
    leases
        .patch(
            LEASE_NAME,
            &PatchParams::apply(&manager).force(),
            &Patch::Apply(take_over),
        )
        .await
        .unwrap();
    wait_until("the controllers stopped", RENEW_EVERY, || {
        terms.ended() == 1
    })
    .await;
    assert_eq!(terms.started(), 1);
    assert_eq!(holder(&server).as_deref(), Some(POD_2));
    // POD_2 never renews: its lock expires, operator-pod-1 takes it back, a new term.
    wait_until(
        "the lease won back",
        LEASE_DURATION + RENEW_EVERY + Duration::from_secs(10),
        || terms.started() == 2,
    )
    .await;
    assert_eq!(holder(&server).as_deref(), Some(POD_1));
    let terms = replica.shut_down().await;
    assert_eq!(terms.ended(), 2);
    assert_eq!(holder(&server), None, "released on shutdown");
    assert_eq!(*terms.changes.lock().unwrap(), [true, false, true, false]);
}

#[tokio::test]
async fn failing_renewals_stop_the_controllers_before_the_lease_expires() {
    let server = FakeApiServer::new();
    let replica = first_term(&server).await;
    let terms = replica.terms.clone();
    // From now on every Lease request fails. Another replica may take the lock once it
    // expires, LEASE_DURATION after the last renewal: the controllers must be stopped by
    // then.
    server.inject(Fault::fail(500).resource("leases"));
    wait_until("the controllers stopped", LEASE_DURATION, || {
        terms.ended() == 1
    })
    .await;
    // Nothing is confirmed while the API server fails: no new term.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(terms.started(), 1);
    assert!(
        terms.first_stop() < renewed(&server) + LEASE_DURATION,
        "the controllers stopped after the lease expired"
    );
    // The API server recovers: the lease is still, or again, ours; a new term starts.
    server.clear_faults();
    wait_until("a new term", Duration::from_secs(40), || {
        terms.started() == 2
    })
    .await;
    let terms = replica.shut_down().await;
    assert_eq!(terms.ended(), 2);
    assert_eq!(holder(&server), None, "released on shutdown");
}

#[tokio::test]
async fn a_hanging_renewal_stops_the_controllers_before_the_lease_expires() {
    let server = FakeApiServer::new();
    let replica = first_term(&server).await;
    let terms = replica.terms.clone();
    // Renewals are accepted and never answered: kube-lease-manager waits and reports
    // nothing, and the last renewal seen grows old.
    server.inject(
        Fault::delay(Duration::from_secs(600))
            .verb(Verb::Patch)
            .resource("leases"),
    );
    wait_until("the controllers stopped", LEASE_DURATION, || {
        terms.ended() == 1
    })
    .await;
    let (stopped, last_renewal) = (terms.first_stop(), renewed(&server));
    assert!(
        stopped < last_renewal + LEASE_DURATION,
        "the controllers stopped after the lease expired"
    );
    let window = lease_settings(NS, POD_1).write_window();
    assert!(
        stopped >= last_renewal + window,
        "stopped within the write window after a renewal: a holder would stop between renewals"
    );
    assert_eq!(holder(&server).as_deref(), Some(POD_1), "never lost");
    server.clear_faults();
    let terms = replica.shut_down().await;
    assert_eq!(terms.started(), 1);
}

#[tokio::test]
async fn a_follower_never_starts_the_controllers_nor_writes_the_lease() {
    let server = FakeApiServer::new();
    let leaders = Arc::default();
    let leader = start(&server, POD_2, &leaders);
    let leader_terms = leader.terms.clone();
    wait_until("the leader's term", TIMEOUT, || leader_terms.started() == 1).await;
    let mark = server.mark();
    let follower = start(&server, POD_1, &leaders);
    // The follower reads the Lease and watches it; it waits for the lock to expire (it
    // never does: it is renewed). Its watch sees the leader renew; a wrong start or
    // write would have followed at once.
    wait_until("the follower read the lease", TIMEOUT, || {
        server
            .requests_since(mark)
            .iter()
            .any(|r| r.resource == "leases" && r.verb == Some(Verb::Get))
    })
    .await;
    let read = renewed(&server);
    wait_until("a renewal by the leader", RENEW_EVERY * 2, || {
        renewed(&server) > read
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let follower_terms = follower.shut_down().await;
    assert_eq!(follower_terms.started(), 0);
    assert!(follower_terms.changes.lock().unwrap().is_empty());
    assert_eq!(
        lease_writes_by(&server, mark, POD_1),
        Vec::<String>::new(),
        "the follower wrote the Lease"
    );
    assert_eq!(holder(&server).as_deref(), Some(POD_2));
    assert_eq!(leader.shut_down().await.ended(), 1);
    assert_eq!(leaders.most.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn two_replicas_racing_for_a_free_lease_never_both_run_the_controllers() {
    let server = FakeApiServer::new();
    // A free Lease (as after a release).
    server
        .put(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": LEASE_NAME, "namespace": NS},
            "spec": {"leaseTransitions": 3}
        }))
        .unwrap();
    // operator-pod-1's patch taking the lock is held back; operator-pod-2 reads the Lease
    // free meanwhile and takes it first.
    server.inject(
        Fault::delay(Duration::from_secs(1))
            .verb(Verb::Patch)
            .resource("leases")
            .times(1),
    );
    let leaders = Arc::default();
    let pod_1 = start(&server, POD_1, &leaders);
    // The Lease read free, then the patch taking it sent (and held back).
    wait_until("operator-pod-1 read the lease free", TIMEOUT, || {
        let reads = server.requests();
        let reads = reads
            .iter()
            .filter(|r| r.resource == "leases" && r.verb == Some(Verb::Get));
        reads.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pod_2 = start(&server, POD_2, &leaders);
    let pod_2_terms = pod_2.terms.clone();
    wait_until("operator-pod-2 leads", TIMEOUT, || {
        pod_2_terms.started() == 1
    })
    .await;
    // operator-pod-1's patch lands on operator-pod-2's lock. It must conflict (it is
    // preconditioned on the resourceVersion it read); operator-pod-1 then reads the
    // Lease again and waits until it has seen no change for the lock's duration (it
    // never does: it is renewed). A wrong start or overwrite would follow at once.
    let applies = || {
        let requests = server.requests();
        let applies = requests
            .iter()
            .filter(|r| r.resource == "leases" && r.verb == Some(Verb::Patch));
        applies.map(|r| r.code).collect::<Vec<_>>()
    };
    wait_until("both takes answered", TIMEOUT, || applies().len() >= 2).await;
    let read = renewed(&server);
    wait_until("a renewal by operator-pod-2", RENEW_EVERY * 2, || {
        renewed(&server) > read
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        pod_1.terms.started(),
        0,
        "operator-pod-1 overwrote operator-pod-2's fresh lock: two leaders"
    );
    assert_eq!(
        leaders.most.load(Ordering::SeqCst),
        1,
        "two leaders at once"
    );
    assert_eq!(holder(&server).as_deref(), Some(POD_2));
    assert_eq!(applies()[..2], [200, 409], "the second take conflicted");
    pod_1.shut_down().await;
    pod_2.shut_down().await;
}
