//! The operator's ClusterRole table (`operator::rbac::cluster_role_access`) covers what
//! the three controllers really request: `operator::run` (every controller, cluster
//! scope and one namespace) against a permissive API server that holds a small world
//! (a DiscoveryService, an EnvoyConfig, EnvoyDeployments with dynamic and static
//! replicas, a CA certificate), answers every request plausibly and records it. Each
//! request is turned into the RBAC attributes the API server authorizes (incl. `update`
//! on the owner's `finalizers` for `blockOwnerDeletion`) and must be granted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use marin3r_operator::{self as operator, Images};
use marin3r_testkit::kube::*;
use marin3r_testkit::wait_until;
use serde_json::{Value, json};

use marin3r_testkit::rbac::{Access, is_watch, parse};

#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    uri: String,
    body: Value,
}

fn accesses(r: &Recorded) -> Vec<Access> {
    marin3r_testkit::rbac::accesses(&r.method, &r.uri, &r.body)
}

fn meta(kind_api: (&str, &str), name: &str, uid: &str) -> Value {
    json!({"apiVersion": kind_api.0, "kind": kind_api.1,
           "metadata": {"name": name, "namespace": "default", "uid": uid, "generation": 1,
                        "resourceVersion": "1", "creationTimestamp": "2025-01-01T00:00:00Z"}})
}

/// The seeded world: (resource plural, object).
fn world() -> Vec<(&'static str, Value)> {
    const OP: &str = "operator.marin3r.3scale.net/v1alpha1";
    let mut ds = meta((OP, "DiscoveryService"), "discoveryservice", "uid-ds");
    ds["spec"] = json!({});
    let mut ec = meta(
        ("marin3r.3scale.net/v1alpha1", "EnvoyConfig"),
        "envoy",
        "uid-ec",
    );
    ec["spec"] = json!({"nodeID": "envoy", "resources": []});
    let mut dynamic = meta((OP, "EnvoyDeployment"), "envoy", "uid-ed");
    dynamic["spec"] = json!({
        "discoveryServiceRef": "discoveryservice", "envoyConfigRef": "envoy",
        "ports": [{"name": "http", "port": 8080}],
        "replicas": {"dynamic": {"minReplicas": 2, "maxReplicas": 4}},
        "podDisruptionBudget": {"minAvailable": 1},
        "shutdownManager": {},
    });
    let mut fixed = meta((OP, "EnvoyDeployment"), "envoy-static", "uid-ed2");
    fixed["spec"] = json!({
        "discoveryServiceRef": "discoveryservice", "envoyConfigRef": "envoy",
        "replicas": {"static": 1},
    });
    let mut ca = meta(
        (OP, "DiscoveryServiceCertificate"),
        "marin3r-ca-cert-discoveryservice",
        "uid-ca",
    );
    ca["spec"] = json!({
        "commonName": "marin3r-ca-cert-discoveryservice", "isCA": true,
        "validFor": 86400, "signer": {"selfSigned": {}},
        "secretRef": {"name": "marin3r-ca-cert-discoveryservice"},
    });
    vec![
        ("discoveryservices", ds),
        ("envoyconfigs", ec),
        ("envoydeployments", dynamic),
        ("envoydeployments", fixed),
        ("discoveryservicecertificates", ca),
    ]
}

/// Answers everything plausibly; records every request.
fn permissive_server(mut api: ApiServer, log: Arc<Mutex<Vec<Recorded>>>) {
    tokio::spawn(async move {
        // (resource, name) → object
        let mut objects: BTreeMap<(String, String), Value> = world()
            .into_iter()
            .map(|(r, o)| {
                (
                    (
                        r.to_string(),
                        o["metadata"]["name"].as_str().unwrap().into(),
                    ),
                    o,
                )
            })
            .collect();
        let mut held = Vec::new();
        let mut version = 10;
        while let Some((request, send)) = api.0.next_request().await {
            let got = read(request).await;
            log.lock().unwrap().push(Recorded {
                method: got.method.clone(),
                uri: got.uri.clone(),
                body: got.body.clone(),
            });
            let target = parse(&got.uri);
            let (resource, name) = (target.resource, target.name);
            version += 1;
            let (status, answer) = match (got.method.as_str(), name) {
                ("GET", None) if is_watch(&got.uri) => {
                    held.push(send);
                    continue;
                }
                ("GET", None) => {
                    let items: Vec<Value> = objects
                        .iter()
                        .filter(|((r, _), _)| *r == resource)
                        .map(|(_, o)| o.clone())
                        .collect();
                    (
                        200,
                        json!({"apiVersion": "v1", "kind": "List",
                               "metadata": {"resourceVersion": version.to_string()}, "items": items}),
                    )
                }
                ("GET", Some(n)) => match objects.get(&(resource.clone(), n.clone())) {
                    Some(o) => (200, o.clone()),
                    None => (404, status_failure(404, "NotFound", "not found")),
                },
                ("PATCH" | "POST" | "PUT", n) => {
                    let n = n
                        .or_else(|| got.body["metadata"]["name"].as_str().map(String::from))
                        .unwrap_or_default();
                    let entry = objects
                        .entry((resource.clone(), n.clone()))
                        .or_insert_with(|| json!({}));
                    json_patch::merge(entry, &got.body);
                    entry["metadata"]["name"] = json!(n);
                    entry["metadata"]["namespace"] = json!("default");
                    if entry["metadata"]["uid"].is_null() {
                        entry["metadata"]["uid"] = json!(format!("uid-{resource}-{n}"));
                        entry["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:01Z");
                    }
                    entry["metadata"]["resourceVersion"] = json!(version.to_string());
                    (if got.method == "POST" { 201 } else { 200 }, entry.clone())
                }
                ("DELETE", Some(n)) => match objects.remove(&(resource.clone(), n)) {
                    Some(_) => (
                        200,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                    ),
                    None => (404, status_failure(404, "NotFound", "not found")),
                },
                (m, _) => panic!("unexpected {m} {}", got.uri),
            };
            send.send_response(json_response(status, &answer));
        }
    });
}

async fn exercise(namespaces: &[String]) -> Vec<Recorded> {
    let (client, api) = mock_client();
    let log = Arc::new(Mutex::new(Vec::new()));
    permissive_server(api, log.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let namespaces = namespaces.to_vec();
        async move {
            operator::run(
                client,
                &namespaces,
                Images::default(),
                Default::default(),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
        }
    });
    // Until every reconciler went through the seeded world: the status of each seeded
    // object with one was written (the last write of a reconcile).
    let statuses: Vec<String> = world()
        .iter()
        .filter(|(resource, _)| *resource != "envoyconfigs")
        .map(|(resource, o)| {
            format!(
                "/{resource}/{}/status",
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    wait_until(
        "the status of every seeded object",
        Duration::from_secs(30),
        || {
            let log = log.lock().unwrap();
            statuses.iter().all(|status| {
                log.iter().any(|r| {
                    r.method == "PATCH" && r.uri.split('?').next().unwrap().ends_with(status)
                })
            })
        },
    )
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    log.lock().unwrap().clone()
}

async fn check(namespaces: &[String]) {
    let requests = exercise(namespaces).await;
    let used: BTreeSet<Access> = requests.iter().flat_map(accesses).collect();
    let granted = operator::rbac::cluster_role_access();
    let missing: Vec<&Access> = used.difference(&granted).collect();
    let unused: Vec<&Access> = granted.difference(&used).collect();
    eprintln!(
        "scope {namespaces:?}: {} requests; granted but not exercised here: {unused:?}",
        requests.len()
    );
    for (what, method) in [("apply", "PATCH"), ("delete", "DELETE"), ("watch", "GET")] {
        assert!(
            requests.iter().any(|r| r.method == method),
            "the scenario made no {what}"
        );
    }
    assert!(
        missing.is_empty(),
        "requested but not in the operator's ClusterRole: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_the_controllers_is_granted_in_cluster_scope() {
    check(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_the_controllers_is_granted_in_one_namespace() {
    check(&["default".to_string()]).await;
}
