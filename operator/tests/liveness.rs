//! Every watch of the operator has a liveness bound (`marin3r_kube::client`): against the
//! stateful fake API server hanging for 20 s (`Outage::Hang`: open watches go silent
//! without a close, requests are never answered), every watch the operator (its three
//! controllers and its Lease) held open before the hang is open again within the bound
//! after it, and the leader runs its controllers again. Tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use marin3r_kube::client::{RESPONSE_TIMEOUT, SILENCE, bounded};
use marin3r_testkit::apiserver::{FakeApiServer, Mark, Outage, ResourceKind};

#[tokio::test(start_paused = true)]
async fn every_watch_of_the_operator_is_re_established_after_a_hang() {
    let api = FakeApiServer::new();
    for (plural, kind) in [
        ("discoveryservices", "DiscoveryService"),
        ("envoydeployments", "EnvoyDeployment"),
        (
            "discoveryservicecertificates",
            "DiscoveryServiceCertificate",
        ),
    ] {
        api.register(
            ResourceKind::new(marin3r_wire::OPERATOR_GROUP, "v1alpha1", plural, kind).with_status(),
        );
    }
    let start = api.mark();
    let leading = Arc::new(AtomicBool::new(false));
    let client = bounded(api.service(), "default");
    let operator = tokio::spawn({
        let (client, leading) = (client.clone(), leading.clone());
        async move {
            marin3r_operator::leader::run_while_leader(
                client.clone(),
                "marin3r-system",
                "operator-pod",
                move |stop| {
                    let client = client.clone();
                    async move {
                        marin3r_operator::run(
                            client,
                            &[],
                            marin3r_operator::Images::default(),
                            marin3r_operator::Metrics::default(),
                            async {
                                let _ = stop.await;
                            },
                        )
                        .await;
                    }
                },
                move |leader| leading.store(leader, Ordering::SeqCst),
                std::future::pending(),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(leading.load(Ordering::SeqCst), "leading");
    let watches = |since: Mark| -> BTreeSet<String> {
        api.requests_since(since)
            .iter()
            .filter(|r| r.code == 200)
            .filter_map(|r| r.watch_key())
            .collect()
    };
    let open = watches(start);
    // The controllers' own kinds and what they own, and the Lease.
    assert!(open.len() >= 8, "{open:#?}");
    api.set_outage(Outage::Hang);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        !leading.load(Ordering::SeqCst),
        "no renewal for 20 s: controllers stopped"
    );
    let back = api.mark();
    api.set_outage(Outage::None);
    tokio::time::sleep(SILENCE + RESPONSE_TIMEOUT).await;
    let again = watches(back);
    let missing: Vec<&String> = open.difference(&again).collect();
    assert!(missing.is_empty(), "not watched again: {missing:#?}");
    eprintln!(
        "{} watches re-established after the hang: {open:#?}",
        open.len()
    );
    assert!(leading.load(Ordering::SeqCst), "leading again");
    operator.abort();
}
