//! Replacing an upstream MARIN3R (Go) install in place (docs/migrating.md): the
//! EnvoyConfig and EnvoyConfigRevisions its discovery service left in the API server,
//! shaped as upstream's reconcilers write them (names `<nodeID>-<envoyAPI>-<version>`
//! with upstream's version hash, the node-id/config-version/envoy-api labels, the
//! controller owner reference and finalizer, `published`/`tainted`, `lastPublishedAt`,
//! `providesVersions` and upstream's condition reasons), are adopted by one discovery
//! service in Kubernetes mode against the stateful fake API server: no duplicate
//! revision for a spec upstream already has one for, the taint and the published
//! revision kept, and history trimmed to the same ten revisions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use marin3r_testkit::wait::{POLL, poll_ok};
use marin3r_tests::Must as _;
use marin3r_tests::configs::{direct, http_listener, resource};
use marin3r_tests::ha::{Fleet, FleetOptions, NS, api_server, envoyconfig};
use marin3r_tests::xds::CONVERGE;
use serde_json::{Value, json};

const NODE: &str = "kuard";
/// The published upstream revision; the tainted one.
const PUBLISHED: usize = 10;
const TAINTED: usize = 7;

/// The resources of config `n` (its listener's port tells them apart; nothing binds it).
fn resources(n: usize) -> Value {
    let cluster = json!({"name": "upstream", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]}});
    let port = u16::try_from(20_000 + n).unwrap();
    json!([
        resource("cluster", cluster),
        resource(
            "listener",
            http_listener("http", port, direct("hello\n"), None)
        ),
    ])
}

fn spec(n: usize) -> Value {
    json!({"nodeID": NODE, "envoyAPI": "v3", "resources": resources(n)})
}

/// Upstream's version of config `n`: a hash of its Go structures as
/// `rand.SafeEncodeString` spells it, which we cannot recompute (so it is made up here).
fn upstream_version(n: usize) -> String {
    let safe = b"bcdfghjklmnpqrstvwxz2456789";
    format!("5b7d6f8c{}", char::from(safe[n % safe.len()]))
}

fn upstream_name(n: usize) -> String {
    format!("{NODE}-v3-{}", upstream_version(n))
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2024-11-08T10:00:00Z"})
}

/// Revision `n` of upstream's history (1 oldest … 10 published last), as upstream's
/// EnvoyConfig and EnvoyConfigRevision reconcilers leave it.
fn upstream_revision(n: usize, owner_uid: &str) -> Value {
    let version = upstream_version(n);
    let published_at = format!("2024-11-08T10:{n:02}:00Z");
    let mut conditions = Vec::new();
    let status = if n == PUBLISHED {
        conditions.push(condition(
            "RevisionPublished",
            "True",
            "VersionPublished",
            &format!("Version '{version}' has been published"),
        ));
        conditions.push(condition(
            "ResourcesInSync",
            "True",
            "ResourcesSynced",
            "EnvoyConfigRevision resources successfully synced with xDS server cache",
        ));
        json!({"published": true, "tainted": false})
    } else if n == TAINTED {
        conditions.push(condition(
            "RevisionTainted",
            "True",
            "ResourcesFailing",
            "EnvoyConfigRevision resources are being rejected by more than 100% of the Envoy clients",
        ));
        json!({"published": false, "tainted": true})
    } else {
        json!({"published": false, "tainted": false})
    };
    let mut status = status;
    status["lastPublishedAt"] = json!(published_at);
    status["providesVersions"] =
        json!({"clusters": format!("{version}-c"), "listeners": format!("{version}-l")});
    status["conditions"] = json!(conditions);
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfigRevision",
        "metadata": {
            "name": upstream_name(n),
            "namespace": NS,
            "creationTimestamp": format!("2024-11-08T09:{n:02}:00Z"),
            "labels": {
                "marin3r.3scale.net/node-id": NODE,
                "marin3r.3scale.net/config-version": version,
                "marin3r.3scale.net/envoy-api": "v3",
            },
            "finalizers": ["finalizer.marin3r.3scale.net"],
            "ownerReferences": [{
                "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                "name": NODE, "uid": owner_uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"nodeID": NODE, "version": version, "envoyAPI": "v3", "resources": resources(n)},
        "status": status,
    })
}

fn names(revisions: &[Value]) -> BTreeSet<String> {
    revisions
        .iter()
        .map(|r| {
            r["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn revision(fleet: &Fleet, n: usize) -> Value {
    fleet
        .api
        .get("envoyconfigrevisions", NS, &upstream_name(n))
        .unwrap_or_else(|| panic!("upstream revision {n} is gone"))
}

fn condition_of<'a>(object: &'a Value, type_: &str) -> &'a Value {
    object["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// Polls until the EnvoyConfig's status has `field` == `value` and our controller wrote
/// it (upstream writes no `CacheOutOfSync` condition while in sync; ours always does).
async fn wait_status(fleet: &Fleet, field: &str, value: &str) -> Value {
    poll_ok(
        format!("EnvoyConfig status {field} = {value}"),
        CONVERGE,
        POLL,
        || async {
            let ec = fleet.envoyconfig(NODE).ok_or("no EnvoyConfig")?;
            if ec["status"][field] == value && !condition_of(&ec, "CacheOutOfSync").is_null() {
                Ok(ec)
            } else {
                Err(ec["status"].to_string())
            }
        },
    )
    .await
    .must()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_install_is_adopted_without_duplicates_keeping_taints_and_publication() {
    let api = api_server();
    let mut ec = envoyconfig(NODE, spec(PUBLISHED));
    ec["status"] = json!({
        "cacheState": "InSync",
        "desiredVersion": upstream_version(PUBLISHED),
        "publishedVersion": upstream_version(PUBLISHED),
        "revisions": (1..=10).map(|n| json!({"version": upstream_version(n), "ref": {
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigRevision",
            "name": upstream_name(n), "namespace": NS}})).collect::<Vec<_>>(),
    });
    let ec = api.put(ec).expect("put the EnvoyConfig");
    let uid = ec["metadata"]["uid"].as_str().unwrap().to_string();
    for n in 1..=10 {
        api.put(upstream_revision(n, &uid))
            .expect("put an upstream revision");
    }
    let upstream_names = names(&api.list("envoyconfigrevisions"));
    let published_at = api
        .get("envoyconfigrevisions", NS, &upstream_name(PUBLISHED))
        .unwrap()["status"]["lastPublishedAt"]
        .clone();

    let fleet = Fleet::start(api, 1, FleetOptions::default()).await.must();
    fleet.wait_leader(CONVERGE).await.must();

    // Adopted: the spec's upstream revision is the desired and published one.
    let ec = wait_status(&fleet, "publishedVersion", &upstream_version(PUBLISHED)).await;
    assert_eq!(ec["status"]["desiredVersion"], upstream_version(PUBLISHED));
    assert_eq!(ec["status"]["cacheState"], "InSync");
    poll_ok(
        "our publication of the upstream revision",
        CONVERGE,
        POLL,
        || async {
            let r = revision(&fleet, PUBLISHED);
            let in_sync = condition_of(&r, "ResourcesInSync");
            // Ours has no message; upstream's says "successfully synced".
            if in_sync["status"] == "True" && in_sync["message"] == "" {
                Ok(())
            } else {
                Err(r["status"].to_string())
            }
        },
    )
    .await
    .must();
    assert_eq!(
        names(&fleet.revisions()),
        upstream_names,
        "no revision added or removed"
    );
    let published = revision(&fleet, PUBLISHED);
    assert_eq!(published["status"]["published"], true);
    assert_eq!(
        published["status"]["lastPublishedAt"], published_at,
        "still the same publication"
    );
    let tainted = revision(&fleet, TAINTED);
    assert_eq!(tainted["status"]["tainted"], true, "the taint is kept");
    assert_eq!(condition_of(&tainted, "RevisionTainted")["status"], "True");
    assert_eq!(tainted["status"]["published"], false);

    // Re-applying the tainted spec moves upstream's tainted revision up: a rollback to
    // the last good one, no new revision.
    fleet.apply(NODE, spec(TAINTED)).must();
    let ec = wait_status(&fleet, "desiredVersion", &upstream_version(TAINTED)).await;
    assert_eq!(ec["status"]["cacheState"], "Rollback");
    assert_eq!(names(&fleet.revisions()), upstream_names);
    assert_eq!(revision(&fleet, PUBLISHED)["status"]["published"], true);

    // A new spec: one revision of ours; the oldest upstream revision goes (ten kept).
    fleet.apply(NODE, spec(11)).must();
    poll_ok("ten revisions, the oldest gone", CONVERGE, POLL, || async {
        let now = names(&fleet.revisions());
        let added: Vec<&String> = now.difference(&upstream_names).collect();
        let removed: Vec<&String> = upstream_names.difference(&now).collect();
        if now.len() == 10 && added.len() == 1 && removed == [&upstream_name(1)] {
            Ok(())
        } else {
            Err(format!("added {added:?}, removed {removed:?}"))
        }
    })
    .await
    .must();
    let ec = wait_status(&fleet, "cacheState", "InSync").await;
    assert_ne!(ec["status"]["desiredVersion"], upstream_version(TAINTED));
    assert_eq!(revision(&fleet, TAINTED)["status"]["tainted"], true);
}
