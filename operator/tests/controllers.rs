//! The DiscoveryService and EnvoyDeployment controllers against kube-rs' mock API server
//! (no cluster): every request a reconcile makes is asserted (method, path and query,
//! server-side apply body, status body) and answered as the API server would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use kube::runtime::reflector;
use kube::runtime::watcher;
use marin3r_kube::Lenient;
use marin3r_operator::envoy_deployment_controller as ed_ctl;
use marin3r_operator::{Images, discovery_service_controller as dsc_ctl};
use marin3r_operator_api::{DiscoveryService, EnvoyDeployment};
use marin3r_testkit::kube::*;
use serde_json::{Value, json};

const OPERATOR: &str = "/apis/operator.marin3r.3scale.net/v1alpha1/namespaces/default";
const APPLY: &str = "?&force=true&fieldManager=marin3r-operator";

fn images() -> Images {
    Images {
        marin3r: "quay.io/marin3r-rs/marin3r:v0.1.0".into(),
        envoy: "envoyproxy/envoy:v1.40.0".into(),
    }
}

fn not_found(what: &str) -> Value {
    status_failure(404, "NotFound", &format!("{what} not found"))
}

fn discovery_service(name: &str, created: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryService",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "generation": 1,
                     "creationTimestamp": created, "resourceVersion": "1"},
        "spec": {},
    })
}

fn lenient<K: serde::de::DeserializeOwned>(v: &Value) -> Arc<Lenient<K>> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn ds_context(client: kube::Client, all: &[&Value]) -> Arc<dsc_ctl::Context> {
    let (store, mut writer) = reflector::store();
    for d in all {
        writer.apply_watcher_event(&watcher::Event::Apply(
            serde_json::from_value::<Lenient<DiscoveryService>>((*d).clone()).unwrap(),
        ));
    }
    Arc::new(dsc_ctl::Context {
        client,
        discovery_services: store,
        images: images(),
    })
}

/// Answers a server-side apply with the applied object (plus `status`, if given) and
/// checks the request is one.
async fn expect_apply(api: &mut ApiServer, path: &str, status: Option<Value>) -> Value {
    let got = api
        .expect("PATCH", &format!("{path}{APPLY}"), 200, |b| {
            let mut obj = b.clone();
            obj["metadata"]["uid"] = json!("uid-applied");
            if let Some(s) = &status {
                obj["status"] = s.clone();
            }
            obj
        })
        .await;
    assert_eq!(got.content_type, "application/apply-patch+yaml", "{path}");
    got.body
}

/// The DiscoveryService's fixed objects, in order: certificates, account, Role,
/// RoleBinding, Service.
async fn expect_ds_objects(api: &mut ApiServer, ds: &str) -> Vec<Value> {
    let mut bodies = Vec::new();
    for dsc in [
        format!("marin3r-ca-cert-{ds}"),
        format!("marin3r-server-cert-{ds}"),
        "envoy-sidecar-client-cert".to_string(),
    ] {
        bodies.push(
            expect_apply(
                api,
                &format!("{OPERATOR}/discoveryservicecertificates/{dsc}"),
                None,
            )
            .await,
        );
    }
    for path in [
        format!("/api/v1/namespaces/default/serviceaccounts/marin3r-{ds}"),
        format!("/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/marin3r-{ds}"),
        format!("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/marin3r-{ds}"),
        format!("/api/v1/namespaces/default/services/marin3r-{ds}"),
    ] {
        bodies.push(expect_apply(api, &path, None).await);
    }
    bodies
}

const DS_PDB: &str =
    "/apis/policy/v1/namespaces/default/poddisruptionbudgets/marin3r-discoveryservice";

/// The DiscoveryService's PodDisruptionBudget step: applied (several replicas; returns
/// the body) or its deletion asked (one replica; answered as if it `existed`).
async fn expect_ds_pdb(api: &mut ApiServer, applied: bool, existed: bool) -> Option<Value> {
    if applied {
        return Some(expect_apply(api, DS_PDB, None).await);
    }
    api.expect(
        "DELETE",
        &format!("{DS_PDB}?"),
        if existed { 200 } else { 404 },
        |_| {
            if existed {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})
            } else {
                not_found("pdb")
            }
        },
    )
    .await;
    None
}

/// The Deployment's gate: the server certificate's Secret is read, then the Deployment
/// (`None`: 404).
async fn expect_gate(api: &mut ApiServer, secret: Option<&Value>, deployment: Option<&Value>) {
    for (path, object, what) in [
        (
            "/api/v1/namespaces/default/secrets/marin3r-server-cert-discoveryservice",
            secret,
            "secret",
        ),
        (
            "/apis/apps/v1/namespaces/default/deployments/marin3r-discoveryservice",
            deployment,
            "deployment",
        ),
    ] {
        match object {
            Some(o) => api.expect("GET", path, 200, |_| o.clone()).await,
            None => api.expect("GET", path, 404, |_| not_found(what)).await,
        };
    }
}

fn server_secret(ds: &str, ca_pem: &str) -> Value {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": format!("marin3r-server-cert-{ds}"), "namespace": "default"},
        "data": {"tls.crt": b64("cert"), "tls.key": b64("key"), "ca.crt": b64(ca_pem)},
    })
}

#[tokio::test]
async fn the_readme_discoveryservice_waits_for_its_server_certificate_then_deploys() {
    let ds = discovery_service("discoveryservice", "2026-01-01T00:00:00Z", "uid-ds");
    let (client, mut api) = mock_client();
    let ctx = ds_context(client, &[&ds]);
    let status_path = format!("{OPERATOR}/discoveryservices/discoveryservice/status");

    // First pass: no server Secret yet → everything but the Deployment.
    let (action, status) = run(dsc_ctl::reconcile(lenient(&ds), ctx.clone()), async {
        let bodies = expect_ds_objects(&mut api, "discoveryservice").await;
        let ca = &bodies[0];
        assert_eq!(ca["spec"]["isCA"], true);
        assert_eq!(ca["metadata"]["ownerReferences"][0]["uid"], "uid-ds");
        assert_eq!(ca["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            bodies[1]["spec"]["hosts"][2],
            "marin3r-discoveryservice.default.svc"
        );
        assert_eq!(bodies[6]["spec"]["ports"][0]["port"], 18000);
        expect_gate(&mut api, None, None).await;
        // Three replicas by default: their budget, even before the Deployment.
        expect_ds_pdb(&mut api, true, false).await;
        let got = api
            .expect("PATCH", &format!("{status_path}{APPLY}"), 200, |b| {
                with_status(&ds, b)
            })
            .await;
        got.body["status"].clone()
    })
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::requeue(dsc_ctl::RECHECK)
    );
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("CertificateNotReady"))
    );
    assert_eq!(status["deploymentName"], "marin3r-discoveryservice");
    assert_eq!(status["observedGeneration"], 1);

    // Second pass: the certificate controller wrote the Secret → the Deployment.
    let mut with_status_ds = ds.clone();
    with_status_ds["status"] = status.clone();
    let secret = server_secret("discoveryservice", "CA");
    let (action, deployment) = run(
        dsc_ctl::reconcile(lenient(&with_status_ds), ctx.clone()),
        async {
            expect_ds_objects(&mut api, "discoveryservice").await;
            expect_gate(&mut api, Some(&secret), None).await;
            let deployment = expect_apply(
                &mut api,
                "/apis/apps/v1/namespaces/default/deployments/marin3r-discoveryservice",
                Some(json!({"availableReplicas": 1, "readyReplicas": 1, "replicas": 1})),
            )
            .await;
            expect_ds_pdb(&mut api, true, false).await;
            let got = api
                .expect("PATCH", &format!("{status_path}{APPLY}"), 200, |b| {
                    with_status(&with_status_ds, b)
                })
                .await;
            let ready = condition(&got.body["status"], "Ready");
            assert_eq!(
                (ready["status"].as_str(), ready["reason"].as_str()),
                (Some("True"), Some("DeploymentAvailable"))
            );
            assert_eq!(got.body["status"]["deploymentStatus"]["readyReplicas"], 1);
            deployment
        },
    )
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::await_change()
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["args"][0], "discovery-service");
    assert_eq!(pod["serviceAccountName"], "marin3r-discoveryservice");
}

#[tokio::test]
async fn a_renewed_server_certificate_restarts_nothing() {
    // The Deployment applied with two different server Secrets (a renewal) is the same
    // object: no certificate hash in the pod template, so no rollout.
    let ds = discovery_service("discoveryservice", "2026-01-01T00:00:00Z", "uid-ds");
    let (client, mut api) = mock_client();
    let ctx = ds_context(client, &[&ds]);
    let mut applied = Vec::new();
    for ca in ["CA before renewal", "CA after renewal"] {
        let (_, (body, _)) = run(
            dsc_ctl::reconcile(lenient(&ds), ctx.clone()),
            ds_pass(&mut api, &ds, ca, true, false),
        )
        .await;
        applied.push(body);
    }
    assert_eq!(applied[0], applied[1]);
    let template = &applied[0]["spec"]["template"]["metadata"];
    assert!(template.get("annotations").is_none());
    assert!(
        template["labels"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.starts_with("app.kubernetes.io/")),
        "{template}"
    );
}

/// One pass of `ds` with the server certificate (CA `ca_pem`) ready and the Deployment
/// present; returns the applied Deployment and the PodDisruptionBudget (`None`: its
/// deletion was asked, answered as if it `existed`).
async fn ds_pass(
    api: &mut ApiServer,
    ds: &Value,
    ca_pem: &str,
    pdb: bool,
    existed: bool,
) -> (Value, Option<Value>) {
    let secret = server_secret("discoveryservice", ca_pem);
    let existing = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "marin3r-discoveryservice", "namespace": "default"}, "spec": {"selector": {}, "template": {}}});
    let objects = expect_ds_objects(api, "discoveryservice").await;
    // The Role: the Lease rules only with several replicas.
    let leases = objects[4]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["resources"] == json!(["leases"]));
    assert_eq!(leases, pdb, "{}", objects[4]);
    expect_gate(api, Some(&secret), Some(&existing)).await;
    let deployment = expect_apply(
        api,
        "/apis/apps/v1/namespaces/default/deployments/marin3r-discoveryservice",
        None,
    )
    .await;
    let budget = expect_ds_pdb(api, pdb, existed).await;
    api.expect(
        "PATCH",
        &format!("{OPERATOR}/discoveryservices/discoveryservice/status{APPLY}"),
        200,
        |b| with_status(ds, b),
    )
    .await;
    (deployment, budget)
}

#[tokio::test]
async fn the_budget_follows_the_replicas_created_with_several_deleted_with_one() {
    let with_replicas = |n: Option<i64>| {
        let mut ds = discovery_service("discoveryservice", "2026-01-01T00:00:00Z", "uid-ds");
        if let Some(n) = n {
            ds["spec"]["replicas"] = json!(n);
        }
        ds
    };
    let (client, mut api) = mock_client();
    let default = with_replicas(None);
    let ctx = ds_context(client, &[&default]);
    // Default (3): the budget, one voluntary disruption at a time.
    let (_, (deployment, budget)) = run(
        dsc_ctl::reconcile(lenient(&default), ctx.clone()),
        ds_pass(&mut api, &default, "CA", true, false),
    )
    .await;
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    let budget = budget.unwrap();
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert_eq!(budget["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(budget["metadata"]["ownerReferences"][0]["uid"], "uid-ds");
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    // Down to one: the budget is deleted, the single replica is recreated on changes.
    let one = with_replicas(Some(1));
    let (_, (deployment, budget)) = run(
        dsc_ctl::reconcile(lenient(&one), ctx.clone()),
        ds_pass(&mut api, &one, "CA", false, true),
    )
    .await;
    assert!(budget.is_none());
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(
        !args.as_array().unwrap().contains(&json!("--leader-elect")),
        "{args}"
    );
    // Already gone: the deletion's 404 is fine.
    run(
        dsc_ctl::reconcile(lenient(&one), ctx.clone()),
        ds_pass(&mut api, &one, "CA", false, false),
    )
    .await
    .0
    .unwrap();
    // Back to five: the budget again.
    let five = with_replicas(Some(5));
    let (_, (deployment, budget)) = run(
        dsc_ctl::reconcile(lenient(&five), ctx),
        ds_pass(&mut api, &five, "CA", true, false),
    )
    .await;
    assert_eq!(deployment["spec"]["replicas"], 5);
    assert!(budget.is_some());
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(
        args.as_array().unwrap().contains(&json!("--leader-elect")),
        "{args}"
    );
}

/// A pass of `ds` that writes its status and nothing else; returns the status.
async fn expect_only_status(api: &mut ApiServer, ds: &Value) -> Value {
    let name = ds["metadata"]["name"].as_str().unwrap();
    let got = api
        .expect(
            "PATCH",
            &format!("{OPERATOR}/discoveryservices/{name}/status{APPLY}"),
            200,
            |b| with_status(ds, b),
        )
        .await;
    got.body["status"].clone()
}

#[tokio::test]
async fn replicas_below_one_are_an_invalid_spec_and_nothing_is_applied() {
    let mut ds = discovery_service("discoveryservice", "2026-01-01T00:00:00Z", "uid-ds");
    ds["spec"]["replicas"] = json!(0);
    let (client, mut api) = mock_client();
    let ctx = ds_context(client, &[&ds]);
    let (action, status) = run(
        dsc_ctl::reconcile(lenient(&ds), ctx),
        expect_only_status(&mut api, &ds),
    )
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::await_change()
    );
    let ready = condition(&status, "Ready");
    assert_eq!(ready["reason"], "InvalidSpec");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("spec.replicas: 0 is less than 1"),
        "{ready}"
    );
}

#[tokio::test]
async fn a_second_discoveryservice_in_a_namespace_gets_a_condition_and_nothing_else() {
    let first = discovery_service("first", "2026-01-01T00:00:00Z", "uid-1");
    let second = discovery_service("second", "2026-02-01T00:00:00Z", "uid-2");
    let (client, mut api) = mock_client();
    let ctx = ds_context(client, &[&first, &second]);
    let (action, status) = run(
        dsc_ctl::reconcile(lenient(&second), ctx),
        expect_only_status(&mut api, &second),
    )
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::requeue(dsc_ctl::DUPLICATE_RECHECK)
    );
    let ready = condition(&status, "Ready");
    assert_eq!(ready["reason"], "DuplicateDiscoveryService");
    assert!(ready["message"].as_str().unwrap().contains("first"));
}

// ---------------------------------------------------------------- EnvoyDeployment

fn envoy_deployment(spec: Value) -> Value {
    json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyDeployment",
        "metadata": {"name": "envoy", "namespace": "default", "uid": "uid-ed", "generation": 2, "resourceVersion": "5"},
        "spec": spec,
    })
}

fn walkthrough_spec() -> Value {
    json!({
        "discoveryServiceRef": "discoveryservice",
        "envoyConfigRef": "envoy",
        "ports": [{"name": "http", "port": 8080}],
        "replicas": {"static": 1},
        "shutdownManager": {},
    })
}

fn envoy_config() -> Value {
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
        "metadata": {"name": "envoy", "namespace": "default"},
        "spec": {"nodeID": "envoy", "resources": []},
    })
}

fn ed_context(client: kube::Client) -> Arc<ed_ctl::Context> {
    Arc::new(ed_ctl::Context {
        client,
        images: images(),
    })
}

const DS_GET: &str = "/apis/operator.marin3r.3scale.net/v1alpha1/namespaces/default/discoveryservices/discoveryservice";
const EC_GET: &str = "/apis/marin3r.3scale.net/v1alpha1/namespaces/default/envoyconfigs/envoy";
const NS_GET: &str = "/api/v1/namespaces/default";
const CERT: &str = "/apis/operator.marin3r.3scale.net/v1alpha1/namespaces/default/discoveryservicecertificates/envoy-client-cert-envoy";

/// Answers the controller's read of the Namespace: `Ok(uid-range)` a Namespace with
/// OpenShift's annotation (or without any: `Ok(None)`), `Err(code)` that error.
async fn expect_namespace(api: &mut ApiServer, answer: Result<Option<&str>, u16>) {
    match answer {
        Ok(range) => {
            let mut ns =
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
            if let Some(range) = range {
                ns["metadata"]["annotations"] = json!({"openshift.io/sa.scc.uid-range": range});
            }
            api.expect("GET", NS_GET, 200, |_| ns).await;
        }
        Err(code) => {
            api.expect("GET", NS_GET, code, |_| {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": code})
            })
            .await;
        }
    }
}
const DEPLOYMENT: &str =
    "/apis/apps/v1/namespaces/default/deployments/marin3r-envoydeployment-envoy";
const HPA: &str = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/marin3r-envoydeployment-envoy";
const PDB: &str =
    "/apis/policy/v1/namespaces/default/poddisruptionbudgets/marin3r-envoydeployment-envoy";
const ED_STATUS: &str =
    "/apis/operator.marin3r.3scale.net/v1alpha1/namespaces/default/envoydeployments/envoy/status";

/// One full pass with the references present and the certificate ready; returns the
/// applied Deployment and the status body. `hpa`: whether an HPA is applied (else its
/// deletion is asked, answered `hpa_exists`).
async fn ed_pass(
    api: &mut ApiServer,
    ed: &Value,
    deployment_exists: bool,
    hpa: bool,
    hpa_exists: bool,
) -> (Value, Value) {
    ed_pass_in(api, ed, Ok(None), deployment_exists, hpa, hpa_exists).await
}

/// [`ed_pass`] with the Namespace answered as `namespace` says ([`expect_namespace`]).
async fn ed_pass_in(
    api: &mut ApiServer,
    ed: &Value,
    namespace: Result<Option<&str>, u16>,
    deployment_exists: bool,
    hpa: bool,
    hpa_exists: bool,
) -> (Value, Value) {
    let ds = discovery_service("discoveryservice", "2026-01-01T00:00:00Z", "uid-ds");
    api.expect("GET", DS_GET, 200, |_| ds.clone()).await;
    api.expect("GET", EC_GET, 200, |_| envoy_config()).await;
    expect_namespace(api, namespace).await;
    let cert = expect_apply(api, CERT, Some(json!({"ready": true}))).await;
    assert_eq!(
        cert["spec"]["signer"]["caSigned"]["caSecretRef"]["name"],
        "marin3r-ca-cert-discoveryservice"
    );
    if deployment_exists {
        api.expect("GET", DEPLOYMENT, 200, |_| json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "marin3r-envoydeployment-envoy", "namespace": "default"}, "spec": {"selector": {}, "template": {}}})).await;
    } else {
        api.expect("GET", DEPLOYMENT, 404, |_| not_found("deployment"))
            .await;
    }
    let deployment = expect_apply(
        api,
        DEPLOYMENT,
        Some(json!({"availableReplicas": 1, "replicas": 1})),
    )
    .await;
    if hpa {
        expect_apply(api, HPA, None).await;
    } else {
        let code = if hpa_exists { 200 } else { 404 };
        api.expect("DELETE", &format!("{HPA}?"), code, |_| {
            if hpa_exists {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})
            } else {
                not_found("hpa")
            }
        })
        .await;
    }
    api.expect("DELETE", &format!("{PDB}?"), 404, |_| not_found("pdb"))
        .await;
    let got = api
        .expect("PATCH", &format!("{ED_STATUS}{APPLY}"), 200, |b| {
            with_status(ed, b)
        })
        .await;
    (deployment, got.body["status"].clone())
}

#[tokio::test]
async fn the_walkthrough_envoydeployment_creates_envoy_with_the_shutdown_manager() {
    let ed = envoy_deployment(walkthrough_spec());
    let (client, mut api) = mock_client();
    let (action, (deployment, status)) = run(
        ed_ctl::reconcile(lenient(&ed), ed_context(client)),
        ed_pass(&mut api, &ed, false, false, false),
    )
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::await_change()
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["envoy", "envoy-shtdn-mgr"]);
    assert_eq!(pod["terminationGracePeriodSeconds"], 300);
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        deployment["metadata"]["ownerReferences"][0]["uid"],
        "uid-ed"
    );
    // Server-side apply owns only what it sends: no annotations are claimed, so
    // `kubectl rollout restart` (a pod-template annotation) and user annotations stay.
    assert!(deployment["metadata"].get("annotations").is_none());
    assert!(
        deployment["spec"]["template"]["metadata"]
            .get("annotations")
            .is_none()
    );
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("DeploymentAvailable"))
    );
    assert_eq!(status["observedGeneration"], 2);
}

/// The Envoy pods run as the first UID of the Namespace's OpenShift uid-range, with no
/// group of their own; without the annotation, or without the right to read the
/// Namespace (a warning), as the images' users.
#[tokio::test]
async fn the_envoy_pods_run_as_the_namespace_uid_range_start() {
    let ed = envoy_deployment(walkthrough_spec());
    for (answer, uid, gid) in [
        (
            Ok(Some("1000680000/10000")),
            json!(1_000_680_000),
            Value::Null,
        ),
        (Ok(None), json!(101), json!(101)),
        (Err(403), json!(101), json!(101)),
    ] {
        let (client, mut api) = mock_client();
        let (action, (deployment, _)) = run(
            ed_ctl::reconcile(lenient(&ed), ed_context(client)),
            ed_pass_in(&mut api, &ed, answer, false, false, false),
        )
        .await;
        action.unwrap();
        let envoy = &deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        assert_eq!(
            (&envoy["runAsUser"], &envoy["runAsGroup"]),
            (&uid, &gid),
            "{answer:?}"
        );
    }
}

#[tokio::test]
async fn static_zero_applies_zero_replicas() {
    let mut spec = walkthrough_spec();
    spec["replicas"] = json!({"static": 0});
    let ed = envoy_deployment(spec);
    let (client, mut api) = mock_client();
    let (_, (deployment, _)) = run(
        ed_ctl::reconcile(lenient(&ed), ed_context(client)),
        ed_pass(&mut api, &ed, true, false, false),
    )
    .await;
    assert_eq!(deployment["spec"]["replicas"], 0);
}

#[tokio::test]
async fn dynamic_static_dynamic_deletes_and_recreates_the_hpa_and_never_applies_replicas_under_it()
{
    let dynamic = {
        let mut s = walkthrough_spec();
        s["replicas"] = json!({"dynamic": {"minReplicas": 2, "maxReplicas": 5, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}});
        envoy_deployment(s)
    };
    let fixed = envoy_deployment(walkthrough_spec());
    let (client, mut api) = mock_client();
    let ctx = ed_context(client);
    let (_, (deployment, _)) = run(
        ed_ctl::reconcile(lenient(&dynamic), ctx.clone()),
        ed_pass(&mut api, &dynamic, true, true, false),
    )
    .await;
    assert!(
        deployment["spec"].get("replicas").is_none(),
        "the HPA owns replicas"
    );
    let (_, (deployment, _)) = run(
        ed_ctl::reconcile(lenient(&fixed), ctx.clone()),
        ed_pass(&mut api, &fixed, true, false, true),
    )
    .await;
    assert_eq!(deployment["spec"]["replicas"], 1);
    let (_, (deployment, _)) = run(
        ed_ctl::reconcile(lenient(&dynamic), ctx),
        ed_pass(&mut api, &dynamic, true, true, false),
    )
    .await;
    assert!(deployment["spec"].get("replicas").is_none());
}

#[tokio::test]
async fn a_missing_discoveryservice_is_a_condition_and_a_recheck_not_an_error() {
    let ed = envoy_deployment(walkthrough_spec());
    let (client, mut api) = mock_client();
    let (action, status) = run(ed_ctl::reconcile(lenient(&ed), ed_context(client)), async {
        api.expect("GET", DS_GET, 404, |_| not_found("discoveryservice"))
            .await;
        let got = api
            .expect("PATCH", &format!("{ED_STATUS}{APPLY}"), 200, |b| {
                with_status(&ed, b)
            })
            .await;
        got.body["status"].clone()
    })
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::requeue(dsc_ctl::RECHECK)
    );
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("DiscoveryServiceNotFound"))
    );

    // When the DiscoveryService appears, the mapper wakes this EnvoyDeployment (and not
    // a same-named one in another namespace).
    let (store, mut writer) = reflector::store();
    let mut other = ed.clone();
    other["metadata"]["namespace"] = json!("other");
    for e in [&ed, &other] {
        writer.apply_watcher_event(&watcher::Event::Apply(
            serde_json::from_value::<Lenient<EnvoyDeployment>>(e.clone()).unwrap(),
        ));
    }
    let woken = ed_ctl::referencing(&store, Some("default"), "discoveryservice", |e| {
        &e.spec.discovery_service_ref
    });
    assert_eq!(woken.len(), 1);
    assert_eq!(woken[0].namespace.as_deref(), Some("default"));
    assert!(
        ed_ctl::referencing(&store, Some("default"), "envoy", |e| &e
            .spec
            .envoy_config_ref)
        .len()
            == 1
    );
    assert!(
        ed_ctl::referencing(&store, Some("default"), "other-ec", |e| &e
            .spec
            .envoy_config_ref)
        .is_empty()
    );
}

#[tokio::test]
async fn the_deployment_waits_for_its_client_certificate() {
    let ed = envoy_deployment(walkthrough_spec());
    let (client, mut api) = mock_client();
    let ds = discovery_service("discoveryservice", "2026-01-01T00:00:00Z", "uid-ds");
    let (action, status) = run(ed_ctl::reconcile(lenient(&ed), ed_context(client)), async {
        api.expect("GET", DS_GET, 200, |_| ds.clone()).await;
        api.expect("GET", EC_GET, 200, |_| envoy_config()).await;
        expect_namespace(&mut api, Ok(None)).await;
        expect_apply(&mut api, CERT, Some(json!({"ready": false}))).await;
        api.expect("GET", DEPLOYMENT, 404, |_| not_found("deployment"))
            .await;
        api.expect("DELETE", &format!("{HPA}?"), 404, |_| not_found("hpa"))
            .await;
        api.expect("DELETE", &format!("{PDB}?"), 404, |_| not_found("pdb"))
            .await;
        let got = api
            .expect("PATCH", &format!("{ED_STATUS}{APPLY}"), 200, |b| {
                with_status(&ed, b)
            })
            .await;
        got.body["status"].clone()
    })
    .await;
    assert_eq!(
        action.unwrap(),
        kube::runtime::controller::Action::requeue(ed_ctl::CERTIFICATE_RECHECK)
    );
    assert_eq!(condition(&status, "Ready")["reason"], "CertificateNotReady");
}
