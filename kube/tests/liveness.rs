//! Every watch and request of the shared client has a liveness bound
//! (`marin3r_kube::client`): against the stateful fake API server hanging (`Outage::Hang`:
//! open watches go silent without a close, new requests are never answered), a watch
//! is re-established within `SILENCE` of its last byte, a request fails after
//! `RESPONSE_TIMEOUT`, and a watch that stays down is reported stale until it is back.
//! Tokio's paused clock: the bounds are measured, not waited for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use marin3r_kube::client::{RESPONSE_TIMEOUT, SILENCE, bounded, watch_is_stale};
use marin3r_kube::watch::{drive, watch};
use marin3r_testkit::apiserver::{FakeApiServer, Outage};
use marin3r_testkit::wait::wait_until;
use serde_json::json;
use tokio::time::Instant;

fn object(kind: &str, name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "default"}})
}

/// A reflector of `K` through a bounded client. (The stale watches are the process's:
/// each test watches its own kind.)
async fn reflect<K>(api: &FakeApiServer) -> Store<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let client = bounded(api.service(), "default");
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watch(Api::<K>::all(client), watcher::Config::default()),
    );
    tokio::spawn(drive("test", stream, |_| async {}));
    reader.wait_until_ready().await.unwrap();
    reader
}

/// Waits (paused clock) until `store` has `name`; returns how long that took.
async fn until_seen<K: kube::Resource + Clone>(
    store: &Store<K>,
    name: &str,
    bound: Duration,
) -> Duration
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    let start = Instant::now();
    wait_until(format!("{name} seen"), bound, || {
        store
            .state()
            .iter()
            .any(|c| c.meta().name.as_deref() == Some(name))
    })
    .await;
    start.elapsed()
}

/// Finding: after a 20 s hang no edit ever reached the watchers again (400 s observed).
#[tokio::test(start_paused = true)]
async fn a_watch_silent_for_20_s_is_re_established_within_the_bound() {
    let api = FakeApiServer::new();
    let store = reflect::<ConfigMap>(&api).await;
    api.set_outage(Outage::Hang);
    tokio::time::sleep(Duration::from_secs(20)).await;
    api.set_outage(Outage::None);
    api.put(object("ConfigMap", "after-the-hang")).unwrap();
    // The watch went silent 20 s ago: it is failed SILENCE after its last byte (at the
    // latest 10 s from now), then resumed after the watch backoff (0.8 s).
    let took = until_seen(&store, "after-the-hang", SILENCE).await;
    assert!(
        took <= SILENCE - Duration::from_secs(20) + Duration::from_secs(2),
        "{took:?}"
    );
}

/// While the API server stays silent, the watch is reported stale (the gauge behind
/// `marin3r_kube_watches_stale`) and every silent request counted; once it answers, the
/// watch is re-established and no longer stale.
#[tokio::test(start_paused = true)]
async fn a_watch_that_stays_down_is_reported_stale_until_it_is_back() {
    let api = FakeApiServer::new();
    let store = reflect::<Secret>(&api).await;
    let mut registry = prometheus_client::registry::Registry::default();
    marin3r_kube::client::register_metrics(&mut registry);
    assert!(!watch_is_stale("secrets"));
    api.set_outage(Outage::Hang);
    tokio::time::sleep(SILENCE + Duration::from_secs(1)).await;
    assert!(watch_is_stale("secrets"), "silent for {SILENCE:?}: stale");
    // The watcher keeps trying; every attempt is failed after RESPONSE_TIMEOUT.
    tokio::time::sleep(RESPONSE_TIMEOUT * 3).await;
    assert!(watch_is_stale("secrets"));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.lines().any(
            |l| l.starts_with("marin3r_kube_watches_stale{resource=\"secrets\"} ")
                && !l.ends_with(" 0")
        ),
        "{text}"
    );
    let silent = text
        .lines()
        .find(|l| l.starts_with("marin3r_kube_silent_requests_total{resource=\"secrets\"} "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(silent >= 2, "the silent watch and a silent retry: {silent}");

    api.set_outage(Outage::None);
    api.put(object("Secret", "after-the-long-hang")).unwrap();
    // The attempt in flight is failed within RESPONSE_TIMEOUT, the next one (after the
    // watch backoff, at most 30 s) is answered.
    until_seen(
        &store,
        "after-the-long-hang",
        RESPONSE_TIMEOUT + Duration::from_secs(31),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!watch_is_stale("secrets"), "re-established");
}

/// A request the API server never answers fails after RESPONSE_TIMEOUT instead of
/// waiting for ever (a Lease renewal, a report, a status write).
#[tokio::test(start_paused = true)]
async fn a_request_without_an_answer_fails_after_the_response_timeout() {
    let api = FakeApiServer::new();
    let client = bounded(api.service(), "default");
    api.set_outage(Outage::Hang);
    let start = Instant::now();
    let got = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, "default")
        .get_opt("x")
        .await;
    assert!(got.is_err());
    assert_eq!(start.elapsed(), RESPONSE_TIMEOUT);
}
