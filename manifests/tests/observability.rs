//! The monitoring component `manifests/observability/`: its alert rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`, one test that
//! fires and one that stays silent per alert), every alert has a runbook in
//! `docs/alerts.md`, every metric a dashboard or an alert uses is one the code exports
//! (or a listed external one), the queries select on the jobs the PodMonitors set, and
//! the component renders the PodMonitors (selecting the pods of the install bases and of
//! the operator), the PrometheusRule and one ConfigMap per dashboard.
//!
//! `promtool` comes from Debian's `prometheus` package (`scripts/ensure-prometheus`,
//! `$PROMTOOL_BIN`): the tests fail without it, never skip. Rendering needs `kubectl`
//! (kustomize v5) like the install tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use marin3r_manifests::kustomize;
use marin3r_testkit::observability::{
    self, EXTERNAL_METRICS, HA_METRIC_PREFIXES, JOBS, Query, exported_names, metric_names,
    selectors,
};
use serde_json::Value;

fn promtool() -> PathBuf {
    observability::find_tool("PROMTOOL_BIN", "promtool").unwrap_or_else(|e| panic!("{e}"))
}

fn repo_root() -> PathBuf {
    kustomize::manifests_dir().parent().unwrap().to_path_buf()
}

/// The alert rules as `rules.yaml` in a fresh temp dir.
fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        observability::rules_file().unwrap(),
    )
    .unwrap();
    dir
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_the_alert_rules() {
    let dir = rules_dir();
    let out = run(Command::new(promtool())
        .args(["check", "rules"])
        .arg(dir.path().join("rules.yaml")));
    let alerts = observability::alerts().unwrap().len();
    assert!(
        out.contains(&format!("SUCCESS: {alerts} rules found")),
        "{out}"
    );
}

fn alerts_test_file() -> PathBuf {
    kustomize::manifests_dir().join("tests/data/observability/alerts-test.yaml")
}

#[test]
fn every_alert_fires_on_its_series_and_stays_silent_on_healthy_ones() {
    // Every alert has a test that expects it and one that expects silence.
    let tests: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(alerts_test_file()).unwrap()).unwrap();
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for t in tests["tests"].as_array().unwrap() {
        for case in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_string();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                firing.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let mut missing = Vec::new();
    for a in observability::alerts().unwrap() {
        if !firing.contains(&a.name) {
            missing.push(format!("{}: no test where it fires", a.name));
        }
        if !silent.contains(&a.name) {
            missing.push(format!("{}: no test where it stays silent", a.name));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));

    // And promtool runs them against the rules.
    let dir = rules_dir();
    let test = dir.path().join("alerts-test.yaml");
    std::fs::copy(alerts_test_file(), &test).unwrap();
    let out = run(Command::new(promtool())
        .args(["test", "rules"])
        .arg(&test)
        .current_dir(dir.path()));
    assert!(out.contains("SUCCESS"), "{out}");
}

/// GitHub's anchor of a markdown heading made of letters, digits, spaces and dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_with_a_command_in_docs_alerts_md() {
    let text = std::fs::read_to_string(repo_root().join("docs/alerts.md")).unwrap();
    // Section title → body.
    let mut sections = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            current = Some(h.trim().to_string());
            sections.insert(h.trim().to_string(), String::new());
        } else if let Some(c) = &current {
            let body = sections.get_mut(c).unwrap();
            body.push_str(line);
            body.push('\n');
        }
    }
    let mut errors = Vec::new();
    for a in observability::alerts().unwrap() {
        let Some(body) = sections.get(&a.name) else {
            errors.push(format!("{}: no `## {}` section", a.name, a.name));
            continue;
        };
        let want = format!("docs/alerts.md#{}", anchor(&a.name));
        if a.runbook_url != want {
            errors.push(format!(
                "{}: runbook_url is {}, not {want}",
                a.name, a.runbook_url
            ));
        }
        for part in ["**What it means**", "**Why**", "**What to do**", "```"] {
            if !body.contains(part) {
                errors.push(format!("{}: its runbook has no {part}", a.name));
            }
        }
        if !["critical", "warning"].contains(&a.severity.as_str()) {
            errors.push(format!("{}: severity {}", a.name, a.severity));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Every query of the component: panels, then alerts.
fn queries() -> Vec<Query> {
    let mut q = observability::all_panel_queries().unwrap();
    q.extend(observability::alert_queries().unwrap());
    q
}

/// The sample names the code's registries declare: the discovery service's
/// (`XdsMetrics`, the self-healing `RevisionMetrics`), the webhook's, the HA series of a
/// replicated discovery service (`HaMetrics`), the reconcile counters every controller
/// feeds (`marin3r_kube::watch`), the certificate expiry (the operator's issued
/// certificates; the served ones share the name) and `marin3r_ready`. prometheus-client leaves out families
/// without samples, so every family gets one through the code's own entry points.
fn exported_by_the_code() -> BTreeSet<String> {
    use marin3r_control_plane::kubernetes::ha::{Ha, HaConfig, HaMetrics};
    use marin3r_envoyconfig::resource::ResourceType;
    use marin3r_xds::stats::{Api, StreamEvent, XdsMetrics};

    let mut registry = prometheus_client::registry::Registry::default();
    let xds = XdsMetrics::register(&mut registry);
    let (node_id, pod_name) = ("n".to_string(), "p".to_string());
    xds.stream_opened(&node_id, Api::Sotw);
    xds.record(&StreamEvent::Request {
        node_id: node_id.clone(),
        pod_name: pod_name.clone(),
        resource_type: Some(ResourceType::Cluster),
    });
    xds.record(&StreamEvent::Ack {
        node_id: node_id.clone(),
        pod_name: pod_name.clone(),
        resource_type: ResourceType::Cluster,
        version: "1".into(),
    });
    xds.record(&StreamEvent::Nack {
        node_id: node_id.clone(),
        pod_name,
        resource_type: ResourceType::Cluster,
        version: "2".into(),
        message: "no".into(),
    });
    xds.observe_push_latency(ResourceType::Cluster, std::time::Duration::from_micros(10));

    let ha = Ha::new(
        HaConfig::new("ds", "ns", "replica-1", None, 15),
        marin3r_kube::lease::Leadership::new(std::time::Duration::from_secs(5)),
        kube::runtime::reflector::store::Writer::default().as_reader(),
        kube::runtime::reflector::store::Writer::default().as_reader(),
        HaMetrics::register(&mut registry),
    );
    ha.count_vetoes(&[(
        node_id,
        "replica-2".into(),
        marin3r_control_plane::fleet::Veto::Lagging,
    )]);
    let digest = serde_json::from_value(serde_json::json!({"nodeID": "n", "pods": 1})).unwrap();
    ha.observe(&ha.fleet(vec![digest], std::time::SystemTime::now()), 1);

    let revisions = marin3r_control_plane::metrics::RevisionMetrics::register(&mut registry);
    let mut r = marin3r_control_plane::revisions::Revisions::new("n");
    let spec = |port: u64| {
        std::sync::Arc::new(
            serde_json::from_value(serde_json::json!({"nodeID": "n", "resources": [
                {"type": "cluster", "value": {"name": format!("c{port}"), "connect_timeout": "1s"}}]}))
            .unwrap(),
        )
    };
    let v1 = r.apply(&spec(1), std::time::SystemTime::UNIX_EPOCH);
    r.apply(&spec(2), std::time::SystemTime::UNIX_EPOCH);
    revisions.tainted(
        "n",
        marin3r_control_plane::nacks::TaintCause::RejectedByEnvoy,
    );
    revisions.published(&r, &v1);
    revisions.cache_state(
        "ns",
        "ec",
        "n",
        Some(marin3r_envoyconfig::envoyconfig::CacheState::Rollback),
    );
    revisions.replicas_in_sync("ns", "ec", "n", true);
    let reconciles = marin3r_kube::watch::ReconcileMetrics::default();
    reconciles.register(&mut registry);
    reconciles.count("Observability", marin3r_kube::watch::ReconcileResult::Error);
    marin3r_kube::client::register_metrics(&mut registry);
    let issued = marin3r_process::IssuedCertificates::default();
    issued.register(&mut registry);
    issued.set("DiscoveryServiceCertificate", "ns", "n", 1);
    marin3r_process::register_ready_metric(&mut registry, marin3r_process::Readiness::new());

    // The API client's liveness series exist once a watch went through the client.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::new(),
                )))
            });
            let client = marin3r_kube::client::bounded(service, "default");
            let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::all(client);
            let _ = api.watch(&kube::api::WatchParams::default(), "0").await;
        });
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let webhook = marin3r_webhook::metrics::Metrics::new();
    let skipped =
        marin3r_webhook::admission::Outcome::Skipped(marin3r_webhook::admission::Skip::NotCreate);
    webhook.observe(Some(&skipped), 0.0);
    text.push_str(&webhook.encode().unwrap());
    exported_names(&text)
}

/// The operator's only metric is registered inside `marin3r_operator::serve`; the
/// end-to-end test (tests/tests/observability_e2e.rs) runs the operator and finds it in
/// Prometheus.
const OPERATOR_METRICS: [&str; 1] = ["marin3r_operator_leader"];

#[test]
fn every_metric_a_dashboard_or_an_alert_uses_is_exported() {
    let exported = exported_by_the_code();
    let external: BTreeSet<&str> = EXTERNAL_METRICS.iter().map(|(m, _)| *m).collect();
    let mut errors = Vec::new();
    for q in queries() {
        let names = metric_names(&q.expr);
        if names.is_empty() {
            errors.push(format!("{}: no metric in {}", q.source, q.expr));
        }
        for name in names {
            let known = exported.contains(&name)
                || external.contains(name.as_str())
                || OPERATOR_METRICS.contains(&name.as_str());
            if !known {
                errors.push(format!(
                    "{}: {name} is not exported by marin3r (renamed or removed?) nor listed in EXTERNAL_METRICS",
                    q.source
                ));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    // The HA prefixes name what the code exports.
    for prefix in HA_METRIC_PREFIXES {
        assert!(exported.iter().any(|n| n.starts_with(prefix)), "{prefix}");
    }
}

#[test]
fn every_query_of_marin3r_or_up_selects_a_podmonitor_job() {
    let jobs: Vec<String> = JOBS.iter().map(|j| format!("job=\"{j}\"")).collect();
    let mut errors = Vec::new();
    for q in queries() {
        for sel in selectors(&q.expr) {
            let ours = sel.starts_with("marin3r_") || sel.starts_with("up{") || sel == "up";
            if ours && !jobs.iter().any(|j| sel.contains(j.as_str())) {
                errors.push(format!("{}: {sel} selects no job of {JOBS:?}", q.source));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

fn render(dir: &str) -> Vec<Value> {
    kustomize::render(&kustomize::manifests_dir().join(dir)).unwrap_or_else(|e| panic!("{e}"))
}

fn pod_labels(deployment: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(deployment["spec"]["template"]["metadata"]["labels"].clone()).unwrap()
}

/// Whether a label selector (matchLabels, matchExpressions In/NotIn/Exists) selects
/// `labels`.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let value = labels.get(e["key"].as_str().unwrap());
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap() {
                "In" => value.is_some_and(|v| values.contains(&v.as_str())),
                "NotIn" => value.is_none_or(|v| !values.contains(&v.as_str())),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                other => panic!("operator {other}"),
            }
        });
    by_labels && by_expressions
}

fn metrics_port_is_named_metrics(deployment: &Value) -> bool {
    kustomize::containers(deployment).iter().any(|c| {
        c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == "metrics")
    })
}

#[test]
fn the_podmonitors_scrape_every_marin3r_process_under_its_job() {
    let objs = render("observability");
    let monitors: BTreeMap<&str, &Value> = objs
        .iter()
        .filter(|o| o["kind"] == "PodMonitor")
        .map(|o| (o["metadata"]["name"].as_str().unwrap(), o))
        .collect();
    assert_eq!(monitors.keys().copied().collect::<Vec<_>>(), {
        let mut j = JOBS.to_vec();
        j.sort();
        j
    });
    for (name, m) in &monitors {
        let endpoints = m["spec"]["podMetricsEndpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 1, "{name}");
        assert_eq!(endpoints[0]["port"], "metrics", "{name}");
        assert_eq!(endpoints[0]["path"], "/metrics", "{name}");
        let job: Vec<&Value> = endpoints[0]["relabelings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["targetLabel"] == "job")
            .collect();
        assert_eq!(job.len(), 1, "{name}");
        assert_eq!(job[0]["replacement"], *name, "{name}: the job is its name");
        assert_eq!(m["spec"]["namespaceSelector"]["any"], true, "{name}");
    }
    // Each selects the pods of its process, and only those.
    let deployment = |dir: &str, name: &str| {
        render(dir)
            .into_iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Deployment {name} in manifests/{dir}"))
    };
    let operator_ds = BTreeMap::from_iter(marin3r_operator::objects::labels(
        marin3r_operator::objects::DISCOVERY_SERVICE_COMPONENT,
        "ds",
    ));
    let pods = [
        (
            "marin3r-webhook",
            pod_labels(&deployment("default", "marin3r-webhook")),
        ),
        (
            "marin3r-discovery-service",
            pod_labels(&deployment("discovery-service", "marin3r-discoveryservice")),
        ),
        ("marin3r-discovery-service", operator_ds),
        (
            "marin3r-operator",
            pod_labels(&deployment("operator", "marin3r-operator")),
        ),
    ];
    for (job, labels) in &pods {
        for (name, m) in &monitors {
            assert_eq!(
                selects(&m["spec"]["selector"], labels),
                name == job,
                "PodMonitor {name} on the pods of {job} ({labels:?})"
            );
        }
    }
    for (dir, name) in [
        ("default", "marin3r-webhook"),
        ("discovery-service", "marin3r-discoveryservice"),
        ("operator", "marin3r-operator"),
    ] {
        assert!(
            metrics_port_is_named_metrics(&deployment(dir, name)),
            "{dir}/{name}: no container port named metrics"
        );
    }
}

#[test]
fn the_component_renders_the_rules_and_one_configmap_per_dashboard() {
    let objs = render("observability");
    let rule = objs
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    assert_eq!(
        rule["spec"],
        observability::prometheus_rule().unwrap()["spec"]
    );

    let dashboards = observability::dashboards().unwrap();
    assert!(dashboards.len() >= 4, "{dashboards:?}");
    let maps: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "ConfigMap").collect();
    assert_eq!(maps.len(), dashboards.len());
    let mut uids = BTreeSet::new();
    for (file, json) in &dashboards {
        let stem = Path::new(file).file_stem().unwrap().to_str().unwrap();
        assert_eq!(json["uid"], stem, "{file}: uid is the file name");
        assert!(uids.insert(stem.to_string()));
        assert!(
            json["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("marin3r / "))
        );
        let map = maps
            .iter()
            .find(|m| m["data"][file.as_str()].is_string())
            .unwrap_or_else(|| panic!("no ConfigMap holds {file}"));
        assert_eq!(
            map["metadata"]["labels"]["grafana_dashboard"], "1",
            "{file}"
        );
        let on_disk =
            std::fs::read_to_string(observability::dir().join("dashboards").join(file)).unwrap();
        assert_eq!(map["data"][file.as_str()], on_disk.as_str(), "{file}");
        // Every panel uses the data source variable.
        for panel in json["panels"].as_array().unwrap() {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{file}: {}",
                panel["title"]
            );
        }
    }
}
