//! Leader election against the stateful fake API server: a Lease its holder releases
//! (a rolling update, a drained node) is taken by a waiting process at once, not when
//! the released lock would have expired.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use marin3r_kube::lease::{Leadership, LeaseSettings, POLL, elect};
use marin3r_testkit::apiserver::{FakeApiServer, Outage};

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: "default".into(),
        name: "marin3r-discoveryservice-leader".into(),
        identity: identity.into(),
        manager: "marin3r".into(),
        duration: 15,
        grace: 5,
    }
}

async fn until_current(who: &Leadership, within: Duration) {
    tokio::time::timeout(within, who.until_current())
        .await
        .expect("not leading in time");
}

/// On tokio's paused clock (the fake API server is an in-process `tower::Service`), so the
/// time b takes to lead is measured, not bounded by the wall clock.
#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_once() {
    let api = FakeApiServer::new();
    let a = Leadership::new(settings("a").write_window());
    let (stop_a, a_stopped) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn(elect(api.client(), settings("a"), a.clone(), async move {
        let _ = a_stopped.await;
    }));
    until_current(&a, Duration::from_secs(10)).await;

    let b = Leadership::new(settings("b").write_window());
    let second = tokio::spawn(elect(
        api.client(),
        settings("b"),
        b.clone(),
        std::future::pending(),
    ));
    // b follows: the lock is a's for 15 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_current());

    stop_a.send(()).unwrap();
    first.await.unwrap().unwrap();
    let released = tokio::time::Instant::now();
    // Without cutting b's wait short, it would take the lock only when a's expired,
    // about 14.5 s from here (15 s after a's last renewal), whatever its polls see.
    until_current(&b, Duration::from_secs(30)).await;
    let took = released.elapsed();
    assert!(
        took < POLL,
        "b took the released lease after {took:?}, not at once"
    );
    let lease = api
        .get("leases", "default", "marin3r-discoveryservice-leader")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    second.abort();
}

fn short(identity: &str) -> LeaseSettings {
    settings(identity)
}

/// Runs `identity`'s election on `api` (a bounded client, as the processes use) until
/// the returned sender fires or is dropped.
fn run(
    api: &FakeApiServer,
    identity: &str,
) -> (
    Leadership,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), marin3r_kube::lease::LeaseError>>,
) {
    let leadership = Leadership::new(short(identity).write_window());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(elect(
        marin3r_kube::client::bounded(api.service(), "default"),
        short(identity),
        leadership.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    (leadership, stop, task)
}

/// A Lease held by `holder`, renewed at `renew` (RFC 3339), as another process wrote it.
fn lease_of(holder: &str, renew: &str, duration: u64) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "marin3r-discoveryservice-leader", "namespace": "default"},
        "spec": {"holderIdentity": holder, "renewTime": renew, "acquireTime": renew,
                 "leaseDurationSeconds": duration, "leaseTransitions": 1}
    })
}

/// Finding: a replica whose clock ran 40 s ahead took the Lease from the healthy holder
/// at start. A holder renewing every 10 s keeps the Lease whatever the dates it writes
/// (40 s behind, 40 s ahead, 2099: as a skewed clock sees them), and a holder that stops
/// renewing loses it after the duration, on the waiting process's clock — also when its
/// last renewal is dated 2099 and it claims a duration of 30 years.
#[tokio::test(start_paused = true)]
async fn skewed_holders_keep_the_lease_while_they_renew_and_lose_it_when_they_stop() {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let to_2099 = Timestamp::from_second(4_070_908_800)
        .unwrap()
        .duration_since(Timestamp::now());
    for (skew, duration) in [
        (SignedDuration::from_secs(-40), 15),
        (SignedDuration::from_secs(40), 15),
        (to_2099, 15),
        (to_2099, 1_000_000_000),
    ] {
        let api = FakeApiServer::new();
        let renew = |i: i64| (Timestamp::now() + skew + SignedDuration::from_secs(i)).to_string();
        api.put(lease_of("a", &renew(0), duration)).unwrap();
        let (b, stop, task) = run(&api, "b");
        // "a" renews every 10 s for 100 s: b never leads.
        for i in 1..=10 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            assert!(!b.is_current(), "skew {skew}: b took a live holder's lease");
            api.put(lease_of("a", &renew(i), duration)).unwrap();
        }
        // "a" stops: b takes it once it has seen no change for the duration.
        let stopped = tokio::time::Instant::now();
        until_current(&b, Duration::from_secs(20)).await;
        let took = stopped.elapsed();
        assert!(
            took >= Duration::from_secs(15) && took <= Duration::from_secs(15) + POLL,
            "skew {skew}: taken after {took:?}"
        );
        let lease = api
            .get("leases", "default", "marin3r-discoveryservice-leader")
            .unwrap();
        assert_eq!(lease["spec"]["holderIdentity"], "b");
        assert_eq!(lease["spec"]["leaseTransitions"], 2);
        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }
}

/// Two processes of ours: the second never takes the lease from a live first one, and
/// takes it at once when the first releases it at shutdown.
#[tokio::test(start_paused = true)]
async fn a_live_leader_keeps_the_lease_and_a_released_one_is_taken_at_once() {
    let api = FakeApiServer::new();
    let (a, stop_a, task_a) = run(&api, "a");
    until_current(&a, Duration::from_secs(5)).await;
    let (b, _stop_b, _task_b) = run(&api, "b");
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(a.is_current(), "the leader renews in time");
        assert!(!b.is_current(), "never two leaders");
    }
    stop_a.send(()).unwrap();
    task_a.await.unwrap().unwrap();
    let released = tokio::time::Instant::now();
    until_current(&b, Duration::from_secs(5)).await;
    assert!(
        released.elapsed() < Duration::from_millis(100),
        "{:?}",
        released.elapsed()
    );
}

/// Finding: after a 20 s API server hang the leader never wrote again (its requests and
/// its Lease watch hung for ever). Every Lease request is bounded now: once the server
/// answers again a leader writes again within the response timeout and a renewal, and
/// no two processes ever lead at once.
#[tokio::test(start_paused = true)]
async fn after_a_hang_of_20_s_a_leader_writes_again_within_the_bound() {
    let api = FakeApiServer::new();
    let (a, _stop_a, _task_a) = run(&api, "a");
    until_current(&a, Duration::from_secs(5)).await;
    let (b, _stop_b, _task_b) = run(&api, "b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.set_outage(Outage::Hang);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!(a.is_current() && b.is_current()), "two leaders");
    }
    assert!(
        !a.is_current(),
        "no renewal for 20 s: the leader stopped writing"
    );
    api.set_outage(Outage::None);
    let back = tokio::time::Instant::now();
    let bound = marin3r_kube::client::RESPONSE_TIMEOUT + POLL + Duration::from_secs(2);
    tokio::time::timeout(bound, async {
        while !(a.is_current() || b.is_current()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no leader within {bound:?} after the hang"));
    let recovered = back.elapsed();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(a.is_current() != b.is_current(), "exactly one leader");
    }
    eprintln!("a leader writes again {recovered:?} after the hang ended");
}
