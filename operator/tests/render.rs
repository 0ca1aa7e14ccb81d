//! Golden tests of `marin3r operator render` (the operator's generators): every
//! `operator/tests/fixtures/operator-render/<case>/input.yaml` renders exactly
//! `expected.yaml` (the objects, a YAML stream) and `problems.txt` (what cannot be
//! rendered, one per line). Every generated container passes Pod Security `restricted`,
//! and every rendered pod template OpenShift's SCC admission (`marin3r_testkit::scc`):
//! restricted-v2 in a namespace the input gives with its uid-range annotations (and for
//! every discovery service, which sets no user), nonroot-v2 for Envoy pods elsewhere
//! (their numeric image users).
//!
//! `UPDATE_GOLDEN=1 cargo test -p marin3r-operator --test render` rewrites
//! the expected files; review every diff before committing it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use marin3r_operator::Images;
use marin3r_operator::render::render;
use marin3r_testkit::golden;
use marin3r_testkit::pod_security::{container_violations, volume_violations};
use marin3r_testkit::scc::{self, Scc};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/operator-render")
}

fn images() -> Images {
    Images {
        marin3r: "quay.io/marin3r-rs/marin3r:v0.1.0".into(),
        envoy: "envoyproxy/envoy:v1.40.0".into(),
    }
}

fn render_case(dir: &Path) -> (Vec<Value>, Vec<String>) {
    let text = std::fs::read_to_string(dir.join("input.yaml")).unwrap();
    let docs = marin3r_envoyconfig::manifest::documents(&text).unwrap();
    let rendered = render(&docs, &images());
    (rendered.objects, rendered.problems)
}

fn yaml_stream(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_saphyr::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Why the containers and volumes of every Deployment in `objects` break Pod Security
/// `restricted` (or our read-only root filesystem rule), and how many were checked.
fn restricted_breaches(objects: &[Value]) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut out = Vec::new();
    for d in objects.iter().filter(|o| o["kind"] == "Deployment") {
        let spec = &d["spec"]["template"]["spec"];
        out.extend(volume_violations(spec));
        for key in ["containers", "initContainers"] {
            for c in spec[key].as_array().into_iter().flatten() {
                checked += 1;
                out.extend(container_violations(c, &spec["securityContext"]));
                if c["securityContext"]["readOnlyRootFilesystem"] != true {
                    out.push(format!("{}: readOnlyRootFilesystem is not true", c["name"]));
                }
            }
        }
    }
    (checked, out)
}

/// The annotations of the Namespaces among the input documents, by name.
fn namespaces(dir: &Path) -> std::collections::BTreeMap<String, Value> {
    let text = std::fs::read_to_string(dir.join("input.yaml")).unwrap();
    marin3r_envoyconfig::manifest::documents(&text)
        .unwrap()
        .into_iter()
        .filter(|d| d["kind"] == "Namespace")
        .map(|d| {
            let name = d["metadata"]["name"].as_str().unwrap().to_string();
            (name, d["metadata"]["annotations"].clone())
        })
        .collect()
}

/// Whether a pod template sets a user, group or fsGroup anywhere.
fn names_a_user(template: &Value) -> bool {
    let spec = &template["spec"];
    let fields = ["runAsUser", "runAsGroup", "fsGroup"];
    fields.iter().any(|f| !spec["securityContext"][f].is_null())
        || ["containers", "initContainers"].iter().any(|k| {
            spec[*k]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| fields.iter().any(|f| !c["securityContext"][f].is_null()))
        })
}

/// Why OpenShift's SCC admission refuses the pod template of a rendered Deployment, and
/// how many templates were admitted under restricted-v2: in a namespace the input gives
/// (its annotations) and for the discovery service anywhere (an OpenShift namespace's
/// annotations), restricted-v2; for Envoy pods in a namespace without uid-range and
/// pods whose spec overrides the user, nonroot-v2 (any numeric non-root user).
fn scc_refusals(
    objects: &[Value],
    namespaces: &std::collections::BTreeMap<String, Value>,
) -> (usize, Vec<String>) {
    let mut restricted_v2 = 0;
    let mut out = Vec::new();
    for d in objects.iter().filter(|o| o["kind"] == "Deployment") {
        let name = d["metadata"]["name"].as_str().unwrap();
        let ns = d["metadata"]["namespace"].as_str().unwrap();
        let component = &d["metadata"]["labels"]["app.kubernetes.io/component"];
        let (annotations, scc) = match namespaces.get(ns) {
            Some(a) => (a.clone(), Scc::RestrictedV2),
            // A discovery service names no user unless its spec overrides one.
            None if component == "discovery-service" && !names_a_user(&d["spec"]["template"]) => {
                (scc::example_namespace(), Scc::RestrictedV2)
            }
            None => (scc::example_namespace(), Scc::NonrootV2),
        };
        match scc::admit_template(&d["spec"]["template"], &annotations, scc) {
            Ok(_) if scc == Scc::RestrictedV2 => restricted_v2 += 1,
            Ok(_) => {}
            Err(e) => out.push(format!("{ns}/{name} under {}: {e:?}", scc.name())),
        }
    }
    (restricted_v2, out)
}

#[test]
fn golden_render_cases() {
    let dirs = golden::cases(&fixtures());
    assert!(dirs.len() >= 8, "{} cases", dirs.len());
    let mut failures = Vec::new();
    let mut containers = 0;
    let mut restricted_v2 = 0;
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let (objects, problems) = render_case(dir);
        let yaml = yaml_stream(&objects);
        let problems = problems
            .iter()
            .map(|p| format!("{p}\n"))
            .collect::<String>();
        for (file, got) in [("expected.yaml", &yaml), ("problems.txt", &problems)] {
            if let Err(e) = golden::check(&dir.join(file), got) {
                failures.push(format!("{name}: {e}"));
            }
        }
        let (checked, breaches) = restricted_breaches(&objects);
        containers += checked;
        if !breaches.is_empty() {
            failures.push(format!("{name}: not Pod Security restricted: {breaches:?}"));
        }
        let (admitted, refusals) = scc_refusals(&objects, &namespaces(dir));
        restricted_v2 += admitted;
        if !refusals.is_empty() {
            failures.push(format!("{name}: refused by SCC: {refusals:?}"));
        }
    }
    assert!(containers >= 12, "only {containers} containers checked");
    assert!(
        restricted_v2 >= 10,
        "only {restricted_v2} pods under restricted-v2"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container_names(pod: &Value, key: &str) -> Vec<String> {
    pod[key]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn extra_volumes_are_mounted_read_only_into_envoy_only() {
    let (objects, problems) = render_case(&fixtures().join("11-extra-volumes"));
    assert!(problems.is_empty(), "{problems:?}");
    let pod =
        &find(&objects, "Deployment", "marin3r-envoydeployment-gw")["spec"]["template"]["spec"];
    let envoy = &pod["containers"][0];
    assert_eq!(envoy["name"], "envoy");
    let mounts: Vec<(&str, &str, bool)> = envoy["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
                m["readOnly"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("envoy-tls", "/etc/envoy/tls/client", true),
            ("envoy-bootstrap", "/etc/envoy/bootstrap", true),
            ("envoy-extra-secret-0", "/etc/envoy/oauth/token", true),
            ("envoy-extra-secret-1", "/etc/envoy/oauth/hmac", true),
            ("envoy-extra-configmap-0", "/etc/envoy/lua", true),
        ]
    );
    let volumes = pod["volumes"].as_array().unwrap();
    assert_eq!(
        volumes[2..],
        [
            serde_json::json!({"name": "envoy-extra-secret-0",
                "secret": {"secretName": "oauth-token", "defaultMode": 420}}),
            serde_json::json!({"name": "envoy-extra-secret-1",
                "secret": {"secretName": "oauth-hmac", "defaultMode": 420}}),
            serde_json::json!({"name": "envoy-extra-configmap-0",
                "configMap": {"name": "lua-scripts", "defaultMode": 420}}),
        ]
    );
    // The init manager writes the bootstrap; it needs none of them.
    let init_mounts = pod["initContainers"][0]["volumeMounts"].as_array().unwrap();
    assert_eq!(init_mounts.len(), 2, "{init_mounts:?}");
    // A spec that breaks the rule renders nothing for the EnvoyDeployment.
    let (objects, problems) = render_case(&fixtures().join("12-invalid-extra-volumes"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("spec.extraVolumes[1].mountPath"),
        "{problems:?}"
    );
    assert!(
        !objects
            .iter()
            .any(|o| o["metadata"]["name"] == "marin3r-envoydeployment-gw")
    );
}

#[test]
fn the_walkthrough_envoydeployment_has_envoy_and_the_shutdown_manager_with_a_300_s_grace() {
    let (objects, problems) = render_case(&fixtures().join("02-walkthrough-shutdown-manager"));
    assert!(problems.is_empty(), "{problems:?}");
    let d = find(&objects, "Deployment", "marin3r-envoydeployment-envoy");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(
        container_names(pod, "containers"),
        ["envoy", "envoy-shtdn-mgr"]
    );
    assert_eq!(container_names(pod, "initContainers"), ["envoy-init-mgr"]);
    assert_eq!(pod["terminationGracePeriodSeconds"], 300);
    assert_eq!(d["spec"]["replicas"], 1);
    let envoy = &pod["containers"][0];
    assert_eq!(
        envoy["lifecycle"]["preStop"]["httpGet"]["path"],
        "/shutdown"
    );
    let args: Vec<&str> = envoy["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--drain-time-s", "300"]),
        "{args:?}"
    );
    let init = &pod["initContainers"][0]["args"];
    let init: Vec<&str> = init
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        init.windows(2)
            .any(|w| w == ["--xdss-host", "marin3r-discoveryservice.default.svc"])
    );
    assert!(init.windows(2).any(|w| w == ["--xdss-port", "18000"]));
    assert!(init.windows(2).any(|w| w == ["--node-id", "envoy"]));
    // The client certificate: signed by the DiscoveryService's CA, 48 h.
    let dsc = find(
        &objects,
        "DiscoveryServiceCertificate",
        "envoy-client-cert-envoy",
    );
    assert_eq!(
        dsc["spec"]["signer"]["caSigned"]["caSecretRef"]["name"],
        "marin3r-ca-cert-discoveryservice"
    );
    assert_eq!(dsc["spec"]["validFor"], 172_800);
}

#[test]
fn scaling_to_zero_changes_only_the_replicas() {
    let (zero, _) = render_case(&fixtures().join("05-static-zero"));
    let (one, _) = render_case(&fixtures().join("02-walkthrough-shutdown-manager"));
    let mut zero = find(&zero, "Deployment", "marin3r-envoydeployment-envoy").clone();
    let one = find(&one, "Deployment", "marin3r-envoydeployment-envoy");
    assert_eq!(zero["spec"]["replicas"], 0);
    zero["spec"]["replicas"] = 1.into();
    assert_eq!(&zero, one);
}

#[test]
fn dynamic_replicas_leave_the_deployment_replicas_to_the_hpa() {
    let (objects, problems) = render_case(&fixtures().join("03-dynamic-replicas-pdb-affinity"));
    assert!(problems.is_empty(), "{problems:?}");
    let d = find(&objects, "Deployment", "marin3r-envoydeployment-instance");
    assert!(d["spec"].get("replicas").is_none(), "{}", d["spec"]);
    let hpa = find(
        &objects,
        "HorizontalPodAutoscaler",
        "marin3r-envoydeployment-instance",
    );
    assert_eq!(hpa["spec"]["minReplicas"], 2);
    assert_eq!(hpa["spec"]["maxReplicas"], 4);
    assert_eq!(
        hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
        60
    );
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        "marin3r-envoydeployment-instance"
    );
    let pdb = find(
        &objects,
        "PodDisruptionBudget",
        "marin3r-envoydeployment-instance",
    );
    assert_eq!(pdb["spec"]["minAvailable"], 1);
}

#[test]
fn admin_and_shutdown_manager_ports_are_honoured() {
    let (objects, problems) = render_case(&fixtures().join("04-ports-and-pki"));
    assert!(problems.is_empty(), "{problems:?}");
    let d = find(&objects, "Deployment", "marin3r-envoydeployment-gw");
    let pod = &d["spec"]["template"]["spec"];
    let sm = &pod["containers"][1];
    assert_eq!(sm["name"], "envoy-shtdn-mgr");
    let args: Vec<&str> = sm["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "shutdown-manager",
            "--port",
            "8091",
            "--envoy-admin-address",
            "http://127.0.0.1:9902"
        ]
    );
    assert_eq!(
        pod["containers"][0]["lifecycle"]["preStop"]["httpGet"]["port"],
        8091
    );
    assert_eq!(
        pod["containers"][0]["readinessProbe"]["httpGet"]["port"],
        9902
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 60);
    // The DiscoveryService's xDS port, also reachable on the conventional 18000.
    let svc = find(&objects, "Service", "marin3r-ds");
    let ports: Vec<(String, i64)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["port"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("discovery".to_string(), 19000),
            ("discovery-default".to_string(), 18000),
            ("metrics".to_string(), 19001)
        ]
    );
    let init: Vec<&str> = pod["initContainers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(init.windows(2).any(|w| w == ["--xdss-port", "19000"]));
    // pkiConfg durations are used, its secret names are not.
    let ca = find(
        &objects,
        "DiscoveryServiceCertificate",
        "marin3r-ca-cert-ds",
    );
    assert_eq!(ca["spec"]["validFor"], 8760 * 3600);
    let server = find(
        &objects,
        "DiscoveryServiceCertificate",
        "marin3r-server-cert-ds",
    );
    assert_eq!(server["spec"]["validFor"], 720 * 3600);
    assert_eq!(
        server["spec"]["hosts"],
        serde_json::json!([
            "marin3r-ds",
            "marin3r-ds.edge",
            "marin3r-ds.edge.svc",
            "marin3r-ds.edge.svc.cluster.local"
        ])
    );
}

#[test]
fn the_discovery_service_mounts_the_trust_bundle_never_the_ca_key_and_has_no_hash_label() {
    let (objects, _) = render_case(&fixtures().join("01-readme-discoveryservice"));
    let d = find(&objects, "Deployment", "marin3r-discoveryservice");
    let pod = &d["spec"]["template"]["spec"];
    let ca = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "ca-cert")
        .unwrap();
    assert_eq!(
        ca["secret"]["secretName"],
        "marin3r-ca-cert-discoveryservice"
    );
    assert_eq!(
        ca["secret"]["items"],
        serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}])
    );
    let labels = d["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    assert!(
        labels.keys().all(|k| k.starts_with("app.kubernetes.io/")),
        "{labels:?}"
    );
    // Three replicas by default (docs/ha.md §6; manifests/tests/install.rs checks every
    // setting), with their budget.
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
    // The Role is the discovery service's RBAC tables, nothing more.
    let role = find(&objects, "Role", "marin3r-discoveryservice");
    assert_eq!(
        role["rules"].as_array().unwrap().len(),
        marin3r_kube::rbac::discovery_service(true).count()
    );
    let names: Vec<&str> = objects
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "marin3r-ca-cert-discoveryservice",
            "marin3r-server-cert-discoveryservice",
            "envoy-sidecar-client-cert",
            "marin3r-discoveryservice",
            "marin3r-discoveryservice",
            "marin3r-discoveryservice",
            "marin3r-discoveryservice",
            "marin3r-discoveryservice",
            "marin3r-discoveryservice",
        ]
    );
    assert_eq!(objects.last().unwrap()["kind"], "PodDisruptionBudget");
}

#[test]
fn one_replica_has_no_lease_and_no_budget_and_the_lease_follows_the_name() {
    let (one, problems) = render_case(&fixtures().join("09-single-replica"));
    assert!(problems.is_empty(), "{problems:?}");
    let d = find(&one, "Deployment", "marin3r-discoveryservice");
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    assert!(one.iter().all(|o| o["kind"] != "PodDisruptionBudget"));
    let role = find(&one, "Role", "marin3r-discoveryservice");
    assert_eq!(
        role["rules"].as_array().unwrap().len(),
        marin3r_kube::rbac::DISCOVERY_SERVICE.len()
    );
    // Apart from the replicas, the rollout, the Lease flags, the Role and the budget,
    // one replica renders like the default three.
    let (three, _) = render_case(&fixtures().join("01-readme-discoveryservice"));
    let mut ha = find(&three, "Deployment", "marin3r-discoveryservice").clone();
    ha["spec"]["replicas"] = 1.into();
    ha["spec"]["strategy"] = serde_json::json!({"type": "Recreate"});
    ha["spec"]
        .as_object_mut()
        .unwrap()
        .remove("minReadySeconds");
    let args = ha["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap();
    args.retain(|a| a != "--leader-elect" && a != "--discovery-service-name=discoveryservice");
    assert_eq!(&ha, d);

    let (edge, problems) = render_case(&fixtures().join("10-replicas-name-and-priority"));
    assert!(problems.is_empty(), "{problems:?}");
    let role = find(&edge, "Role", "marin3r-edge");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resourceNames"] == serde_json::json!(["marin3r-edge-leader"])),
        "{role}"
    );
    let d = find(&edge, "Deployment", "marin3r-edge");
    assert_eq!(d["spec"]["replicas"], 5);
    let pod = &d["spec"]["template"]["spec"];
    assert!(pod.get("priorityClassName").is_none(), "\"\" sets none");
    find(&edge, "PodDisruptionBudget", "marin3r-edge");
}

/// The YAML blocks of `docs/walkthrough-operator.md` are what the operator renders
/// without a problem: the DiscoveryService, then the EnvoyConfig and EnvoyDeployment.
#[test]
fn the_operator_walkthrough_renders() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/walkthrough-operator.md"),
    )
    .unwrap();
    let blocks: Vec<&str> = doc
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(
        blocks.len(),
        2,
        "the DiscoveryService, then the EnvoyDeployment"
    );
    let docs = marin3r_envoyconfig::manifest::documents(&blocks.join("---\n")).unwrap();
    let rendered = render(&docs, &images());
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    let kinds: Vec<&str> = rendered
        .objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "Deployment").count(),
        2,
        "{kinds:?}"
    );
    // The same EnvoyDeployment as the walkthrough fixture.
    let (fixture, _) = render_case(&fixtures().join("02-walkthrough-shutdown-manager"));
    assert_eq!(
        find(
            &rendered.objects,
            "Deployment",
            "marin3r-envoydeployment-envoy"
        ),
        find(&fixture, "Deployment", "marin3r-envoydeployment-envoy")
    );
}

fn operator_object(kind: &str, name: &str, spec: Value) -> Value {
    serde_json::json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": kind,
        "metadata": {"name": name, "namespace": "apps"}, "spec": spec,
    })
}

fn envoy_config(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
        "metadata": {"name": name, "namespace": "apps"},
        "spec": {"nodeID": name, "resources": []},
    })
}

/// The SRE's hostile inputs ("round 3"): each used to render with exit 0. Each is now a
/// problem naming the field (so `marin3r operator render` exits 1), and nothing is
/// rendered for the resource it concerns; the same input without the fault renders.
#[test]
fn hostile_specs_are_refused_naming_the_field() {
    let ds = |name: &str, spec: Value| operator_object("DiscoveryService", name, spec);
    let ed = |name: &str, spec: Value| {
        let mut s = serde_json::json!({"discoveryServiceRef": "ds", "envoyConfigRef": "ec"});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        operator_object("EnvoyDeployment", name, s)
    };
    let good_ds = ds("ds", serde_json::json!({}));
    let with_ds = |doc: Value| vec![good_ds.clone(), envoy_config("ec"), doc];
    let long_ds = "d".repeat(56);
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        (
            "DiscoveryService name of 56 characters",
            vec![ds(&long_ds, serde_json::json!({}))],
            "metadata.name",
        ),
        (
            "DiscoveryService name with dots",
            vec![ds("my.ds", serde_json::json!({}))],
            "metadata.name",
        ),
        (
            "EnvoyDeployment name of 64 characters",
            with_ds(ed(&"e".repeat(64), serde_json::json!({}))),
            "metadata.name",
        ),
        (
            "xdsServerPort = metricsPort",
            vec![ds("ds", serde_json::json!({"xdsServerPort": 8383}))],
            "spec.metricsPort",
        ),
        (
            "metricsPort 18000, xdsServerPort moved",
            vec![ds(
                "ds",
                serde_json::json!({"xdsServerPort": 19000, "metricsPort": 18000}),
            )],
            "spec.metricsPort",
        ),
        (
            "probePort = metricsPort",
            vec![ds("ds", serde_json::json!({"probePort": 8383}))],
            "spec.probePort",
        ),
        (
            "HPA minReplicas 0",
            with_ds(ed(
                "e",
                serde_json::json!({"replicas": {"dynamic": {"minReplicas": 0, "maxReplicas": 3}}}),
            )),
            "spec.replicas.dynamic.minReplicas",
        ),
        (
            "liveness successThreshold 3",
            with_ds(ed(
                "e",
                serde_json::json!({"livenessProbe": {"initialDelaySeconds": 1, "timeoutSeconds": 1, "periodSeconds": 1, "successThreshold": 3, "failureThreshold": 1}}),
            )),
            "spec.livenessProbe.successThreshold",
        ),
        (
            "memory lots",
            with_ds(ed(
                "e",
                serde_json::json!({"resources": {"limits": {"memory": "lots"}}}),
            )),
            "spec.resources.limits.memory",
        ),
        (
            "memory -1Gi",
            with_ds(ed(
                "e",
                serde_json::json!({"resources": {"requests": {"memory": "-1Gi"}}}),
            )),
            "spec.resources.requests.memory",
        ),
        (
            "discovery service memory lots",
            vec![ds(
                "ds",
                serde_json::json!({"resources": {"limits": {"memory": "lots"}}}),
            )],
            "spec.resources.limits.memory",
        ),
        (
            "PDB 1000%",
            with_ds(ed(
                "e",
                serde_json::json!({"podDisruptionBudget": {"minAvailable": "1000%"}}),
            )),
            "spec.podDisruptionBudget.minAvailable",
        ),
        (
            "PDB -1",
            with_ds(ed(
                "e",
                serde_json::json!({"podDisruptionBudget": {"maxUnavailable": -1}}),
            )),
            "spec.podDisruptionBudget.maxUnavailable",
        ),
        (
            "image with spaces",
            with_ds(ed(
                "e",
                serde_json::json!({"image": "envoyproxy/envoy: v1.40.0"}),
            )),
            "spec.image",
        ),
        (
            "discovery service image with spaces",
            vec![ds("ds", serde_json::json!({"image": "marin3r :v1"}))],
            "spec.image",
        ),
        (
            "CA lifetime 0s",
            vec![ds(
                "ds",
                serde_json::json!({"pkiConfg": {"rootCertificateAuthority": {"secretName": "a", "duration": "0s"}, "serverCertificate": {"secretName": "b", "duration": "2160h"}}}),
            )],
            "spec.pkiConfg.rootCertificateAuthority.duration",
        ),
        (
            "server lifetime 1s",
            vec![ds(
                "ds",
                serde_json::json!({"pkiConfg": {"rootCertificateAuthority": {"secretName": "a", "duration": "26280h"}, "serverCertificate": {"secretName": "b", "duration": "1s"}}}),
            )],
            "spec.pkiConfg.serverCertificate.duration",
        ),
        (
            "CA lifetime 292 years",
            vec![ds(
                "ds",
                serde_json::json!({"pkiConfg": {"rootCertificateAuthority": {"secretName": "a", "duration": "2562047h"}, "serverCertificate": {"secretName": "b", "duration": "2160h"}}}),
            )],
            "spec.pkiConfg.rootCertificateAuthority.duration",
        ),
        (
            "client lifetime 1s",
            with_ds(ed("e", serde_json::json!({"duration": "1s"}))),
            "spec.duration",
        ),
        (
            "unknown field replicas.statik",
            with_ds(ed("e", serde_json::json!({"replicas": {"statik": 2}}))),
            "spec.replicas.statik",
        ),
        (
            "unknown field in a DiscoveryService",
            vec![ds("ds", serde_json::json!({"replica": 2}))],
            "spec.replica",
        ),
    ];
    for (case, docs, field) in cases {
        let rendered = render(&docs, &images());
        assert!(
            rendered
                .problems
                .iter()
                .any(|p| p.contains(&format!("{field}: "))),
            "{case}: {:?}",
            rendered.problems
        );
        // Nothing is rendered for the refused resource: a refused DiscoveryService gives
        // no object at all, a refused EnvoyDeployment no envoy-deployment object.
        let refused_component = if docs.len() == 1 {
            "discovery-service"
        } else {
            "envoy-deployment"
        };
        let leaked: Vec<&Value> = rendered
            .objects
            .iter()
            .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/component"] == refused_component)
            .collect();
        assert!(leaked.is_empty(), "{case}: {leaked:?}");
    }
    // Control: the well-formed neighbours render without a problem.
    let fine = render(
        &with_ds(ed(
            &"e".repeat(63),
            serde_json::json!({"replicas": {"dynamic": {"minReplicas": 1, "maxReplicas": 3}}}),
        )),
        &images(),
    );
    assert!(fine.problems.is_empty(), "{:?}", fine.problems);
    let fine = render(&[ds(&"d".repeat(55), serde_json::json!({}))], &images());
    assert!(fine.problems.is_empty(), "{:?}", fine.problems);
}

/// The same object twice in the input is refused the second time (it was printed twice).
#[test]
fn the_same_object_given_twice_is_refused() {
    let ds = operator_object("DiscoveryService", "ds", serde_json::json!({}));
    let ed = operator_object(
        "EnvoyDeployment",
        "e",
        serde_json::json!({"discoveryServiceRef": "ds", "envoyConfigRef": "ec"}),
    );
    let docs = [
        ds.clone(),
        envoy_config("ec"),
        ed.clone(),
        ed,
        ds,
        envoy_config("ec"),
    ];
    let rendered = render(&docs, &images());
    assert_eq!(
        rendered.problems,
        [
            "document 4 (EnvoyDeployment e): EnvoyDeployment apps/e is already defined by document 3; the same object given twice is refused",
            "document 5 (DiscoveryService ds): DiscoveryService apps/ds is already defined by document 1; the same object given twice is refused",
            "document 6 (EnvoyConfig ec): EnvoyConfig apps/ec is already defined by document 2; the same object given twice is refused",
        ]
    );
    let deployments = rendered
        .objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .count();
    assert_eq!(deployments, 2, "one per object, not per document");
}

/// On OpenShift the Envoy pods run as the Namespace's first UID (read by the controller,
/// given to render as a Namespace document), with no group of their own, and
/// restricted-v2 admits them; without the Namespace they keep the images' users, which
/// restricted-v2 refuses in OpenShift's words.
#[test]
fn envoy_pods_run_as_the_namespace_uid_range_start() {
    let dir = fixtures().join("13-openshift-namespace-uid-range");
    let (objects, problems) = render_case(&dir);
    assert!(problems.is_empty(), "{problems:?}");
    let ed = find(&objects, "Deployment", "marin3r-envoydeployment-envoy");
    let spec = &ed["spec"]["template"]["spec"];
    let mut seen = 0;
    for key in ["containers", "initContainers"] {
        for c in spec[key].as_array().unwrap() {
            assert_eq!(
                c["securityContext"]["runAsUser"], 1_000_680_000,
                "{}",
                c["name"]
            );
            assert!(
                c["securityContext"]["runAsGroup"].is_null(),
                "{}",
                c["name"]
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 3, "envoy, shutdown manager, init manager");
    let ns = &namespaces(&dir)["team"];
    scc::admit_template(&ed["spec"]["template"], ns, Scc::RestrictedV2).unwrap();

    // Without the Namespace document: Envoy as 101, refused by restricted-v2.
    let text = std::fs::read_to_string(dir.join("input.yaml")).unwrap();
    let docs: Vec<Value> = marin3r_envoyconfig::manifest::documents(&text)
        .unwrap()
        .into_iter()
        .filter(|d| d["kind"] != "Namespace")
        .collect();
    let rendered = render(&docs, &images());
    let ed = find(
        &rendered.objects,
        "Deployment",
        "marin3r-envoydeployment-envoy",
    );
    let errors = scc::admit_template(&ed["spec"]["template"], ns, Scc::RestrictedV2).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e
                .ends_with("Invalid value: 101: must be in the ranges: [1000680000, 1000689999]")),
        "{errors:?}"
    );
}

/// The discovery service's pod names no user, group or fsGroup and mounts its Secrets
/// readable by any user (0444): OpenShift assigns the user, the image's numeric USER
/// is it elsewhere.
#[test]
fn the_discovery_service_pod_names_no_user_and_its_secrets_are_world_readable() {
    let (objects, _) = render_case(&fixtures().join("02-walkthrough-shutdown-manager"));
    let ds = find(&objects, "Deployment", "marin3r-discoveryservice");
    let spec = &ds["spec"]["template"]["spec"];
    for sc in [
        &spec["securityContext"],
        &spec["containers"][0]["securityContext"],
    ] {
        for field in ["runAsUser", "runAsGroup", "fsGroup"] {
            assert!(sc[field].is_null(), "{field}: {sc}");
        }
        assert_eq!(sc["runAsNonRoot"], true);
    }
    for v in spec["volumes"].as_array().unwrap() {
        assert_eq!(v["secret"]["defaultMode"], 0o444, "{v}");
    }
}

/// `podSecurityContext` and `securityContext` set their fields over the generated ones
/// on the discovery service pod and on every container of the Envoy pod.
#[test]
fn security_context_overrides_set_their_fields_and_keep_the_rest() {
    let (objects, problems) = render_case(&fixtures().join("14-security-context-override"));
    assert!(problems.is_empty(), "{problems:?}");
    let ds = &find(&objects, "Deployment", "marin3r-discoveryservice")["spec"]["template"]["spec"];
    assert_eq!(ds["securityContext"]["fsGroup"], 2000);
    assert_eq!(ds["securityContext"]["runAsUser"], 1001);
    assert_eq!(
        ds["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &ds["containers"][0]["securityContext"];
    assert_eq!(
        (c["runAsUser"].clone(), c["runAsGroup"].clone()),
        (1001.into(), 1001.into())
    );
    assert_eq!(c["capabilities"]["drop"][0], "ALL");
    let ed =
        &find(&objects, "Deployment", "marin3r-envoydeployment-envoy")["spec"]["template"]["spec"];
    assert_eq!(ed["securityContext"]["fsGroup"], 2000);
    assert_eq!(ed["securityContext"]["runAsNonRoot"], true);
    for key in ["containers", "initContainers"] {
        for c in ed[key].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["runAsUser"], 1001, "{}", c["name"]);
            assert_eq!(sc["runAsGroup"], 1001, "{}", c["name"]);
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", c["name"]);
        }
    }
}
