//! Leader election against the stateful fake API server: a Lease its holder releases
//! (a rolling update, a drained node) is taken by a waiting process at once, not when
//! the released lock would have expired.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use marin3r_kube::lease::{Leadership, LeaseSettings, elect};
use marin3r_testkit::apiserver::FakeApiServer;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let released = Instant::now();
    // Without cutting b's wait short, it would take the lock only when a's expired,
    // up to 15 s after a's last renewal.
    until_current(&b, Duration::from_secs(5)).await;
    assert!(released.elapsed() < Duration::from_secs(5));
    second.abort();
}
