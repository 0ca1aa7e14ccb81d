//! Every object `marin3r operator render` prints is one the API server accepts and that can
//! run: a property test over generated inputs (names at and past their bounds, colliding
//! ports, HPA, probe, quantity, budget, image and lifetime values, valid or not). Whatever
//! the input, each rendered object must pass Kubernetes' own rules, checked here
//! independently of `validate()`: object names (DNS-1035 for Services, DNS-1123 subdomain
//! otherwise), label values, Service port names and numbers, container names and ports
//! unique in the pod, probe, HPA and PodDisruptionBudget values, quantities, image
//! references and certificate lifetimes; and every pod template must pass Pod Security
//! `restricted` and OpenShift's SCC admission (restricted-v2 when the input gives the
//! namespace's uid-range). An input the rules refuse must be reported, not rendered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use marin3r_operator::Images;
use marin3r_operator::render::render;
use marin3r_sidecar::validate::{image, quantity};
use marin3r_wire::{dns1035_label, dns1123_label, dns1123_subdomain, label_value, port_name};
use proptest::prelude::*;
use serde_json::{Value, json};

fn images() -> Images {
    Images::default()
}

/// Why `object` (as rendered) breaks a rule the API server or the kubelet applies.
fn violations(object: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    let mut check = |what: &str, result: Result<(), String>| {
        if let Err(why) = result {
            out.push(format!("{kind} {name:?}: {what}: {why}"));
        }
    };
    if kind == "Service" {
        check("metadata.name", dns1035_label(name));
    } else {
        check("metadata.name", dns1123_subdomain(name));
    }
    check(
        "metadata.namespace",
        dns1123_label(object["metadata"]["namespace"].as_str().unwrap_or_default()),
    );
    for (path, value) in label_values(object, "") {
        check(&path, label_value(&value));
    }
    let spec = &object["spec"];
    match kind {
        "Service" => {
            let mut names = BTreeSet::new();
            let mut numbers = BTreeSet::new();
            for p in spec["ports"].as_array().into_iter().flatten() {
                let port_name = p["name"].as_str().unwrap_or_default();
                check("Service port name", dns1123_label(port_name));
                let number = p["port"].as_i64().unwrap_or(0);
                check("Service port", in_range(number, 1, 65535));
                if !names.insert(port_name.to_string()) {
                    check("Service port name", Err(format!("{port_name} twice")));
                }
                let key = (number, p["protocol"].as_str().unwrap_or("TCP").to_string());
                if !numbers.insert(key.clone()) {
                    check("Service port", Err(format!("{key:?} twice")));
                }
            }
        }
        "Deployment" => pod(&spec["template"]["spec"], &mut check),
        "HorizontalPodAutoscaler" => {
            let max = spec["maxReplicas"].as_i64().unwrap_or(0);
            check("maxReplicas", in_range(max, 1, i64::from(i32::MAX)));
            if let Some(min) = spec["minReplicas"].as_i64() {
                check("minReplicas", in_range(min, 1, max));
            }
            check(
                "scaleTargetRef.name",
                dns1123_subdomain(spec["scaleTargetRef"]["name"].as_str().unwrap_or_default()),
            );
        }
        "PodDisruptionBudget" => {
            for field in ["minAvailable", "maxUnavailable"] {
                match &spec[field] {
                    Value::Null => {}
                    Value::Number(n) => {
                        check(field, in_range(n.as_i64().unwrap_or(-1), 0, i64::MAX))
                    }
                    Value::String(s) => check(
                        field,
                        s.strip_suffix('%')
                            .and_then(|d| d.parse::<u32>().ok())
                            .filter(|p| *p <= 100)
                            .map(|_| ())
                            .ok_or_else(|| format!("{s:?} is not a percentage 0-100%")),
                    ),
                    other => check(field, Err(format!("{other}"))),
                }
            }
            if !spec["minAvailable"].is_null() && !spec["maxUnavailable"].is_null() {
                check("podDisruptionBudget", Err("both set".into()));
            }
        }
        "DiscoveryServiceCertificate" => {
            // 1 h to 100 years: a shorter one is reissued endlessly.
            check(
                "validFor",
                in_range(spec["validFor"].as_i64().unwrap_or(0), 3600, 876_000 * 3600),
            );
            check(
                "secretRef.name",
                dns1123_subdomain(spec["secretRef"]["name"].as_str().unwrap_or_default()),
            );
        }
        _ => {}
    }
    // RoleBinding and Role keep their fields at the top level.
    if kind == "RoleBinding" {
        check(
            "roleRef.name",
            dns1123_subdomain(object["roleRef"]["name"].as_str().unwrap_or_default()),
        );
    }
    out
}

fn in_range(value: i64, min: i64, max: i64) -> Result<(), String> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!("{value} is outside {min}-{max}"))
    }
}

/// Every label value of `value`: `labels`, `matchLabels` and a Service's `selector`.
fn label_values(value: &Value, path: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let at = format!("{path}.{key}");
                let is_labels = matches!(key.as_str(), "labels" | "matchLabels")
                    || (key == "selector" && path == ".spec" && v.get("matchLabels").is_none());
                if is_labels && let Some(labels) = v.as_object() {
                    for (k, l) in labels {
                        out.push((
                            format!("{at}.{k}"),
                            l.as_str().unwrap_or("<not a string>").to_string(),
                        ));
                    }
                } else {
                    out.extend(label_values(v, &at));
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                out.extend(label_values(v, &format!("{path}[{i}]")));
            }
        }
        _ => {}
    }
    out
}

/// A pod: container names, ports (names and numbers unique over the pod: its containers
/// share one network namespace), probes, images, quantities, referenced names.
fn pod(spec: &Value, check: &mut impl FnMut(&str, Result<(), String>)) {
    let mut containers = BTreeSet::new();
    let mut port_names = BTreeSet::new();
    let mut port_numbers = BTreeSet::new();
    for key in ["initContainers", "containers"] {
        for c in spec[key].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or_default();
            check("container name", dns1123_label(name));
            if !containers.insert(name.to_string()) {
                check("container name", Err(format!("{name} twice")));
            }
            check("image", image(c["image"].as_str().unwrap_or_default()));
            for p in c["ports"].as_array().into_iter().flatten() {
                if let Some(port) = p["name"].as_str() {
                    check("container port name", port_name(port));
                    if !port_names.insert(port.to_string()) {
                        check("container port name", Err(format!("{port} twice")));
                    }
                }
                let number = p["containerPort"].as_i64().unwrap_or(0);
                check("containerPort", in_range(number, 1, 65535));
                let key = (number, p["protocol"].as_str().unwrap_or("TCP").to_string());
                if !port_numbers.insert(key.clone()) {
                    check(
                        "containerPort",
                        Err(format!("{key:?} bound twice in the pod")),
                    );
                }
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                let p = &c[probe];
                for field in [
                    "initialDelaySeconds",
                    "timeoutSeconds",
                    "periodSeconds",
                    "successThreshold",
                    "failureThreshold",
                ] {
                    if let Some(v) = p[field].as_i64() {
                        check(
                            &format!("{probe}.{field}"),
                            in_range(v, 0, i64::from(i32::MAX)),
                        );
                    }
                }
                if probe != "readinessProbe"
                    && let Some(v) = p["successThreshold"].as_i64()
                {
                    check(&format!("{probe}.successThreshold"), in_range(v, 0, 1));
                }
            }
            let resources = &c["resources"];
            for kind in ["requests", "limits"] {
                for (resource, q) in resources[kind].as_object().into_iter().flatten() {
                    let parsed = quantity(q.as_str().unwrap_or_default());
                    check(
                        &format!("resources.{kind}.{resource}"),
                        parsed.clone().map(|_| ()),
                    );
                    if kind == "requests"
                        && let (Ok(request), Some(Ok(limit))) =
                            (parsed, resources["limits"][resource].as_str().map(quantity))
                        && request > limit
                    {
                        check(
                            &format!("resources.requests.{resource}"),
                            Err("above its limit".into()),
                        );
                    }
                }
            }
        }
    }
    for field in ["serviceAccountName", "priorityClassName"] {
        if let Some(v) = spec[field].as_str() {
            check(field, dns1123_subdomain(v));
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        check(
            "volume name",
            dns1123_label(v["name"].as_str().unwrap_or_default()),
        );
        if let Some(secret) = v["secret"]["secretName"].as_str() {
            check("secretName", dns1123_subdomain(secret));
        }
    }
}

fn discovery_service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "DiscoveryService",
           "metadata": {"name": name, "namespace": "apps"}, "spec": spec})
}

fn envoy_deployment(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "EnvoyDeployment",
           "metadata": {"name": name, "namespace": "apps"}, "spec": spec})
}

fn envoy_config() -> Value {
    json!({"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
           "metadata": {"name": "ec", "namespace": "apps"}, "spec": {"nodeID": "ec", "resources": []}})
}

/// Renders `docs`: the number of objects, every violation of every rendered object, and
/// the problems reported.
fn rendered_violations(docs: &[Value]) -> (usize, Vec<String>, Vec<String>) {
    let rendered = render(docs, &images());
    let violations = rendered.objects.iter().flat_map(violations).collect();
    (rendered.objects.len(), violations, rendered.problems)
}

#[test]
fn names_at_their_bounds_give_valid_objects_and_one_past_them_nothing() {
    let ed_spec = json!({"discoveryServiceRef": "d".repeat(55), "envoyConfigRef": "ec",
        "replicas": {"dynamic": {"maxReplicas": 3}}, "podDisruptionBudget": {"maxUnavailable": "100%"},
        "shutdownManager": {}, "ports": [{"name": "http", "port": 8080}]});
    let docs = [
        discovery_service(&"d".repeat(55), json!({"xdsServerPort": 19000})),
        envoy_config(),
        envoy_deployment(&"e".repeat(63), ed_spec.clone()),
        envoy_deployment(&format!("{}.b", "e".repeat(61)), ed_spec.clone()),
    ];
    let (objects, violations, problems) = rendered_violations(&docs);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(violations.is_empty(), "{violations:?}");
    // DS: 3 certificates, account, Role, RoleBinding, Service, Deployment, PDB; each ED:
    // certificate, Deployment, HPA, PDB.
    assert_eq!(objects, 9 + 2 * 4);

    let docs = [
        discovery_service(&"d".repeat(56), json!({})),
        envoy_config(),
        envoy_deployment(&"e".repeat(64), ed_spec),
    ];
    let (objects, _, problems) = rendered_violations(&docs);
    assert_eq!(objects, 0);
    assert!(
        problems
            .iter()
            .filter(|p| p.contains("metadata.name: "))
            .count()
            == 2,
        "{problems:?}"
    );
}

/// A name: mostly short, sometimes dotted, often within one character of `bound` (the
/// longest name that gives valid objects), on either side.
fn name(bound: usize) -> impl Strategy<Value = String> {
    let re = |p: &str| proptest::string::string_regex(p).unwrap();
    prop_oneof![
        2 => re("[a-z][a-z0-9]{0,6}"),
        1 => re("[a-z0-9]{1,4}\\.[a-z0-9]{1,4}"),
        1 => re("[a-z][a-z0-9]{0,3}-[a-z0-9]{1,4}"),
        3 => re(&format!("[a-z][a-z0-9]{{{},{}}}", bound - 2, bound)),
    ]
}

/// Mostly one of `good`, sometimes one of `bad`.
fn mostly<T: std::fmt::Debug + Clone + 'static>(
    good: Vec<T>,
    bad: Vec<T>,
) -> impl Strategy<Value = T> {
    prop_oneof![
        5 => proptest::sample::select(good),
        1 => proptest::sample::select(bad),
    ]
}

fn maybe<T: std::fmt::Debug + Clone + 'static>(
    good: Vec<T>,
    bad: Vec<T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(mostly(good, bad))
}

fn lifetime() -> impl Strategy<Value = Option<&'static str>> {
    maybe(
        vec!["1h", "48h", "2160h", "876000h"],
        vec!["0s", "1s", "59m", "876001h", "2562047h"],
    )
}

fn resources() -> impl Strategy<Value = Option<Value>> {
    let memory = || maybe(vec!["64Mi", "1Gi", "0"], vec!["lots", "-1Gi"]);
    let cpu = || maybe(vec!["100m", "2", "1.5"], vec!["a lot", "-1"]);
    proptest::option::of(
        (memory(), memory(), cpu(), cpu()).prop_map(|(rm, lm, rc, lc)| {
            let map = |m: Option<&str>, c: Option<&str>| {
                let mut o = serde_json::Map::new();
                if let Some(m) = m {
                    o.insert("memory".into(), json!(m));
                }
                if let Some(c) = c {
                    o.insert("cpu".into(), json!(c));
                }
                Value::Object(o)
            };
            json!({"requests": map(rm, rc), "limits": map(lm, lc)})
        }),
    )
}

fn set(spec: &mut Value, key: &str, value: Option<Value>) {
    if let Some(v) = value {
        spec[key] = v;
    }
}

prop_compose! {
    fn ds_spec()(
        xds in maybe(vec![18000, 19000], vec![8383, 8384]),
        metrics in maybe(vec![8383, 9383], vec![18000, 19000]),
        probe in maybe(vec![8384, 9384], vec![8383, 18000, 19000]),
        replicas in maybe(vec![1, 3], vec![0]),
        ca in lifetime(),
        server in lifetime(),
        resources in resources(),
        image in maybe(vec!["quay.io/marin3r-rs/marin3r:v1", ""], vec!["bad image", "UPPER/case"]),
        priority in maybe(vec!["", "high"], vec!["Not A Class"]),
    ) -> Value {
        let mut spec = json!({});
        set(&mut spec, "xdsServerPort", xds.map(|p| json!(p)));
        set(&mut spec, "metricsPort", metrics.map(|p| json!(p)));
        set(&mut spec, "probePort", probe.map(|p| json!(p)));
        set(&mut spec, "replicas", replicas.map(|p| json!(p)));
        set(&mut spec, "resources", resources);
        set(&mut spec, "image", image.map(|i| json!(i)));
        set(&mut spec, "podPriorityClass", priority.map(|i| json!(i)));
        if ca.is_some() || server.is_some() {
            spec["pkiConfg"] = json!({
                "rootCertificateAuthority": {"secretName": "a", "duration": ca.unwrap_or("26280h")},
                "serverCertificate": {"secretName": "b", "duration": server.unwrap_or("2160h")},
            });
        }
        spec
    }
}

prop_compose! {
    fn ed_spec(ds: String)(
        ports in proptest::collection::vec(
            (mostly(vec!["own"], vec!["admin", "first", "Bad_Name"]),
             mostly(vec![None], vec![Some(9901), Some(8090), Some(8000)]),
             maybe(vec!["TCP", "UDP"], vec!["SCTP"])),
            0..3),
        admin in maybe(vec![9901, 9902], vec![8000, 8090]),
        shutdown in maybe(vec![None, Some(8090), Some(8091)], vec![Some(9901), Some(8000)]),
        replicas in prop_oneof![
            maybe(vec![0, 1, 3], vec![-1]).prop_map(|s| s.map(|n| json!({"static": n}))),
            (maybe(vec![1, 2], vec![0]), mostly(vec![2, 3], vec![0, 1]))
                .prop_map(|(min, max)| Some(match min {
                    Some(min) => json!({"dynamic": {"minReplicas": min, "maxReplicas": max}}),
                    None => json!({"dynamic": {"maxReplicas": max}}),
                })),
        ],
        success in mostly(vec![0, 1], vec![3]),
        readiness_success in mostly(vec![1, 3], vec![-1]),
        pdb in maybe(
            vec![json!({"minAvailable": 0}), json!({"minAvailable": "50%"}),
                 json!({"maxUnavailable": 1}), json!({"maxUnavailable": "100%"})],
            vec![json!({"maxUnavailable": -1}), json!({"minAvailable": "1000%"}),
                 json!({"maxUnavailable": "abc"}), json!({"minAvailable": 1, "maxUnavailable": 1})]),
        resources in resources(),
        image in maybe(vec!["envoyproxy/envoy:v1.40.0", ""], vec!["envoyproxy/envoy: v1"]),
        init_image in maybe(vec!["quay.io/marin3r-rs/marin3r:v1"], vec!["bad image"]),
        duration in lifetime(),
    ) -> Value {
        let mut spec = json!({"discoveryServiceRef": ds, "envoyConfigRef": "ec"});
        spec["ports"] = ports.into_iter().enumerate().map(|(i, (name, port, protocol))| {
            let name = match name {
                "own" => format!("p{i}"),
                "first" => "p0".to_string(),
                other => other.to_string(),
            };
            let port = port.unwrap_or(8000 + i32::try_from(i).unwrap());
            match protocol {
                Some(p) => json!({"name": name, "port": port, "protocol": p}),
                None => json!({"name": name, "port": port}),
            }
        }).collect();
        set(&mut spec, "adminPort", admin.map(|p| json!(p)));
        set(&mut spec, "shutdownManager", shutdown.map(|p| match p {
            Some(port) => json!({"serverPort": port}),
            None => json!({}),
        }));
        set(&mut spec, "replicas", replicas);
        spec["livenessProbe"] = json!({"initialDelaySeconds": 1, "timeoutSeconds": 1,
            "periodSeconds": 1, "successThreshold": success, "failureThreshold": 1});
        spec["readinessProbe"] = json!({"initialDelaySeconds": 1, "timeoutSeconds": 1,
            "periodSeconds": 1, "successThreshold": readiness_success, "failureThreshold": 1});
        set(&mut spec, "podDisruptionBudget", pdb);
        set(&mut spec, "resources", resources);
        set(&mut spec, "image", image.map(|i| json!(i)));
        set(&mut spec, "initManager", init_image.map(|i| json!({"image": i})));
        set(&mut spec, "duration", duration.map(|d| json!(d)));
        spec
    }
}

/// The `apps` Namespace as OpenShift annotates it: the Envoy pods then run as its first
/// UID.
fn openshift_namespace() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": "apps", "annotations": marin3r_testkit::scc::example_namespace()}})
}

fn input() -> impl Strategy<Value = Vec<Value>> {
    (name(55), name(63), any::<bool>()).prop_flat_map(|(ds_name, ed_name, openshift)| {
        (ds_spec(), ed_spec(ds_name.clone())).prop_map(move |(ds, ed)| {
            let mut docs = vec![
                discovery_service(&ds_name, ds),
                envoy_config(),
                envoy_deployment(&ed_name, ed),
            ];
            if openshift {
                docs.push(openshift_namespace());
            }
            docs
        })
    })
}

/// Why OpenShift's SCC admission (`marin3r_testkit::scc`) or Pod Security `restricted`
/// refuses the pod template of a rendered Deployment: with the `apps` Namespace in the
/// input, restricted-v2 for every pod; without it, restricted-v2 for the discovery
/// service (it names no user) and nonroot-v2 for the Envoy pods (their images' numeric
/// users).
fn pod_refusals(object: &Value, openshift: bool) -> Vec<String> {
    use marin3r_testkit::scc::{Scc, admit_template, example_namespace};
    if object["kind"] != "Deployment" {
        return Vec::new();
    }
    let template = &object["spec"]["template"];
    let discovery_service =
        object["metadata"]["labels"]["app.kubernetes.io/component"] == "discovery-service";
    let scc = if openshift || discovery_service {
        Scc::RestrictedV2
    } else {
        Scc::NonrootV2
    };
    let mut out = marin3r_testkit::pod_security::pod_violations(&template["spec"]);
    if let Err(e) = admit_template(template, &example_namespace(), scc) {
        out.extend(e);
    }
    out
}

/// The property over generated inputs; also counts how many inputs rendered each
/// resource, so the property is not vacuous (every input refused).
#[test]
fn every_rendered_object_is_valid_for_the_api_server() {
    use proptest::test_runner::{Config, TestRunner};
    use std::cell::Cell;

    let mut runner = TestRunner::new(Config {
        cases: 1024,
        failure_persistence: None,
        ..Config::default()
    });
    let (discovery_services, envoy_deployments) = (Cell::new(0), Cell::new(0));
    let result = runner.run(&input(), |docs| {
        let rendered = render(&docs, &images());
        let openshift = docs.iter().any(|d| d["kind"] == "Namespace");
        let violations: Vec<String> = rendered
            .objects
            .iter()
            .flat_map(|o| violations(o).into_iter().chain(pod_refusals(o, openshift)))
            .collect();
        let component = |c: &str| {
            rendered.objects.iter().any(|o| {
                o["kind"] == "Deployment"
                    && o["metadata"]["labels"]["app.kubernetes.io/component"] == c
            })
        };
        discovery_services
            .set(discovery_services.get() + usize::from(component("discovery-service")));
        envoy_deployments.set(envoy_deployments.get() + usize::from(component("envoy-deployment")));
        prop_assert!(
            violations.is_empty(),
            "{violations:#?}\nproblems: {:#?}\ninput: {:#}",
            rendered.problems,
            Value::Array(docs.clone())
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!(
        "rendered {} DiscoveryServices and {} EnvoyDeployments of 1024 inputs",
        discovery_services.get(),
        envoy_deployments.get()
    );
    // Enough inputs pass validation for the property to say something.
    assert!(
        discovery_services.get() >= 150 && envoy_deployments.get() >= 25,
        "rendered {} DiscoveryServices and {} EnvoyDeployments of 1024 inputs",
        discovery_services.get(),
        envoy_deployments.get()
    );
}
