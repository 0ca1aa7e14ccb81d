//! The monitoring component (`manifests/observability/`) against a real Prometheus
//! (Debian's `prometheus` package, `scripts/ensure-prometheus`; `$PROMETHEUS_BIN`): the
//! test fails without it, never skips.
//!
//! It runs, all on 127.0.0.1: the discovery service in local mode (in-process) with a
//! real Envoy connected, the webhook (in-process, HTTPS) answering a few admission
//! reviews, and the operator (in-process, against the in-memory fake API server holding
//! one self-signed DiscoveryServiceCertificate, which it issues: its reconcile counters
//! and the issued certificate's expiry have data). Prometheus scrapes the three every
//! second under the jobs the PodMonitors set, and loads the alert rules. A config Envoy
//! rejects is written once Prometheus scrapes, so the NACK panels have data and
//! self-healing taints it and rolls back (the revision, rollback and cacheState panels).
//! Then, through Prometheus' HTTP API:
//! - every dashboard panel query parses and returns data, except those of metrics this
//!   setup cannot have (`EXTERNAL_METRICS`: cert-manager's; the HA
//!   series of a replicated discovery service in Kubernetes mode), which must parse;
//! - every alert expression evaluates, and each of its selectors returns data (same
//!   exceptions), and Prometheus loaded every rule with health `ok`;
//! - every metric name a query uses exists in Prometheus (a renamed or removed metric
//!   fails here, and in `manifests/tests/observability.rs` against the code's
//!   registries).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use marin3r_testkit::free_port;
use marin3r_testkit::http::{Request, get};
use marin3r_testkit::observability::{
    self, EXTERNAL_METRICS, HA_METRIC_PREFIXES, JOBS, KUBERNETES_CLIENT_METRIC_PREFIX, Query,
    metric_names, selectors,
};
use marin3r_tests::configs::{direct, envoy_config, http_listener, resource};
use marin3r_tests::xds::{
    CONVERGE, Serving, Xds, init_tracing, localhost, metric_sum, pod_name, write_atomic,
};
use marin3r_tests::{KillOnDrop, Must, workspace_root};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// How long Prometheus gets to scrape enough samples for every query (scrapes every
/// second; a `rate` over 1 m needs two samples).
const SETTLE: Duration = Duration::from_secs(30);

fn prometheus_bin() -> std::path::PathBuf {
    observability::find_tool("PROMETHEUS_BIN", "prometheus").unwrap_or_else(|e| panic!("{e}"))
}

/// `application/x-www-form-urlencoded` / URL query encoding of `s`.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server (killed on drop) scraping `targets` (job, address) every second
/// and evaluating the component's alert rules.
struct Prometheus {
    addr: SocketAddr,
    process: KillOnDrop,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[(&str, SocketAddr)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("rules.yaml"),
            observability::rules_file().unwrap(),
        )
        .unwrap();
        let scrape_configs: Vec<Value> = targets
            .iter()
            .map(|(job, addr)| {
                json!({"job_name": job, "metrics_path": "/metrics",
                       "static_configs": [{"targets": [addr.to_string()]}]})
            })
            .collect();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [dir.path().join("rules.yaml")],
            "scrape_configs": scrape_configs,
        });
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config.to_string()).unwrap();
        let addr = localhost(free_port().unwrap());
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let mut cmd = Command::new(prometheus_bin());
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        let process = KillOnDrop::spawn("prometheus", &mut cmd).unwrap();
        Self { addr, process, dir }
    }

    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `GET path` as JSON `data`; an error unless `status` is `success`.
    async fn api(&self, path: &str) -> Result<Value, String> {
        let r = get(self.addr, path).await?;
        let body: Value = serde_json::from_str(&r.body)
            .map_err(|e| format!("GET {path}: {} {e}: {}", r.status, r.body))?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(format!(
                "GET {path}: {}: {}",
                body["errorType"], body["error"]
            ))
        }
    }

    /// The result vector of an instant query.
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", urlencode(expr)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Ok(r) = get(self.addr, "/-/ready").await
                && r.status == 200
            {
                return;
            }
            if let Some(status) = self.process.try_wait() {
                panic!("prometheus exited with {status}:\n{}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether this setup cannot have data for `q`: it only uses metrics of others
/// (cert-manager) or of a replicated discovery service.
fn without_data_here(q: &Query) -> bool {
    metric_names(&q.expr).iter().all(|m| not_here(m))
}

fn not_here(metric: &str) -> bool {
    let external = EXTERNAL_METRICS
        .iter()
        .any(|(m, _)| *m == metric && *m != "up");
    external || HA_METRIC_PREFIXES.iter().any(|p| metric.starts_with(p))
}

// ---------------------------------------------------------------------------------------
// The webhook, in-process.

struct Webhook {
    https: SocketAddr,
    metrics: SocketAddr,
    ca_pem: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), marin3r_webhook::Error>>,
    _dir: tempfile::TempDir,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Webhook {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bundle = marin3r_tests::xds::issue_bundle().must();
        std::fs::write(dir.path().join("tls.crt"), &bundle.server.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &bundle.server.key_pem).unwrap();
        let any = localhost(0);
        let config = marin3r_webhook::Config {
            webhook_addr: any,
            tls: marin3r_certs::ServingFiles::pair(
                dir.path().join("tls.crt"),
                dir.path().join("tls.key"),
            ),
            health_addr: any,
            metrics_addr: any,
            defaults: marin3r_sidecar::Defaults::default(),
        };
        let listeners = marin3r_webhook::Listeners::bind(&config).await.unwrap();
        let https = listeners.https.local_addr().unwrap();
        let metrics = listeners.metrics.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(marin3r_webhook::serve(config, listeners, async move {
            let _ = stopped.await;
        }));
        Self {
            https,
            metrics,
            ca_pem: bundle.ca.cert_pem,
            _stop: stop,
            task,
            _dir: dir,
        }
    }

    /// POSTs `body` to `path` over HTTPS; the status.
    async fn post(&self, path: &str, body: Vec<u8>) -> u16 {
        let config = marin3r_testkit::tls::client_config(&self.ca_pem)
            .alpn(b"http/1.1")
            .build()
            .unwrap();
        let connector = tokio_rustls::TlsConnector::from(config);
        let tcp = TcpStream::connect(self.https).await.unwrap();
        let tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        Request::post_json(path, body)
            .host("localhost")
            .send_over(tls)
            .await
            .must()
            .status
    }

    /// One review of each kind: a Pod injected, one left alone (an UPDATE), one denied
    /// (an invalid annotation), a bad request, and an EnvoyConfig validation.
    async fn answer_reviews(&self) {
        let path = workspace_root().join("examples/admission-review.json");
        let review: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mutate = marin3r_webhook::MUTATE_PATH;
        assert_eq!(
            self.post(mutate, review.to_string().into_bytes()).await,
            200
        );
        let mut update = review.clone();
        update["request"]["operation"] = json!("UPDATE");
        assert_eq!(
            self.post(mutate, update.to_string().into_bytes()).await,
            200
        );
        let mut denied = review.clone();
        denied["request"]["object"]["metadata"]["annotations"]["marin3r.3scale.net/ports"] =
            json!("not a port");
        assert_eq!(
            self.post(mutate, denied.to_string().into_bytes()).await,
            200
        );
        assert_eq!(self.post(mutate, b"not a review".to_vec()).await, 400);
        let envoyconfig = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "observability-e2e",
                "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
                "resource": {"group": "marin3r.3scale.net", "version": "v1alpha1", "resource": "envoyconfigs"},
                "namespace": "default", "operation": "CREATE",
                "object": {
                    "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                    "metadata": {"name": "broken", "namespace": "default"},
                    "spec": {"nodeID": "broken", "resources": [{"type": "listener", "value": {"name": 1}}]}
                }
            }
        });
        assert_eq!(
            self.post(
                marin3r_webhook::VALIDATE_ENVOYCONFIG_PATH,
                envoyconfig.to_string().into_bytes()
            )
            .await,
            200
        );
    }
}

// ---------------------------------------------------------------------------------------
// The operator, in-process.

/// The operator without leader election, against a fake API server holding one
/// self-signed CA DiscoveryServiceCertificate; its metrics listener on `metrics`.
fn start_operator(
    metrics: SocketAddr,
) -> (
    tokio::task::JoinHandle<()>,
    marin3r_testkit::apiserver::FakeApiServer,
) {
    use marin3r_testkit::apiserver::{FakeApiServer, ResourceKind};
    let api = FakeApiServer::new();
    for (plural, kind) in [
        ("discoveryservices", "DiscoveryService"),
        (
            "discoveryservicecertificates",
            "DiscoveryServiceCertificate",
        ),
        ("envoydeployments", "EnvoyDeployment"),
    ] {
        api.register(
            ResourceKind::new("operator.marin3r.3scale.net", "v1alpha1", plural, kind)
                .with_status(),
        );
    }
    api.put(json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": "observability-ca", "namespace": "default"},
        "spec": {"commonName": "observability-ca", "isCA": true, "validFor": 86400,
                 "signer": {"selfSigned": {}}, "secretRef": {"name": "observability-ca"}}
    }))
    .unwrap();
    // Through the liveness layer, as the operator binary builds its client (its
    // `marin3r_kube_*` series then exist).
    let client = marin3r_kube::client::bounded(api.service(), "default");
    let config = marin3r_operator::OperatorConfig {
        metrics_addr: metrics,
        health_addr: localhost(0),
        namespaces: Vec::new(),
        images: marin3r_operator::Images::default(),
        leader: None,
    };
    let task = tokio::spawn(async move {
        let _ = marin3r_operator::serve(client, config, std::future::pending()).await;
    });
    (task, api)
}

// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_alert_expression_has_data_in_a_real_prometheus() {
    init_tracing();
    let started = Instant::now();
    let prometheus_bin = prometheus_bin();
    let node = "observability-e2e";
    let port = free_port().unwrap();
    let listener = |route: Value| {
        envoy_config(
            node,
            vec![resource(
                "listener",
                http_listener("http", port, route, None),
            )],
        )
    };
    let Serving { xds, mut envoy } = Serving::start(
        Xds::start(&[("config.json", listener(direct("up\n")))])
            .await
            .must(),
        node,
        port,
        "up\n",
    )
    .await
    .must();

    let webhook = Webhook::start().await;
    let operator_metrics = localhost(free_port().unwrap());
    let (operator, _api) = start_operator(operator_metrics);

    let mut prometheus = Prometheus::start(&[
        (JOBS[0], webhook.metrics),
        (JOBS[1], xds.metrics),
        (JOBS[2], operator_metrics),
    ]);
    prometheus.wait_ready().await;
    eprintln!(
        "prometheus {} ready at {} after {:?}",
        prometheus_bin.display(),
        prometheus.addr,
        started.elapsed()
    );

    // Traffic once Prometheus scrapes every target: reviews, and a config Envoy rejects
    // (a route to a cluster that does not exist), NACKed and re-pushed on the backoff
    // until self-healing rolls back (~1.5 s: so the scrapes see the counter grow).
    let deadline = Instant::now() + SETTLE;
    loop {
        let up = prometheus.query("up == 1").await.unwrap_or_default();
        if up.len() == JOBS.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "targets not all up: {up:?}\n{}",
            prometheus.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    webhook.answer_reviews().await;
    write_atomic(
        &xds.file("config.json"),
        &listener(json!({"route": {"cluster": "does-not-exist"}})),
    )
    .must();
    let pod = pod_name(node);
    envoy
        .eventually("a NACK", CONVERGE, || async {
            let text = xds.metrics_text().await?;
            let n = metric_sum(
                &text,
                "marin3r_xdss_discovery_nack_total",
                &[("node_id", node), ("pod_name", pod.as_str())],
            );
            if n >= 1.0 {
                Ok(())
            } else {
                Err(format!("{n} NACKs"))
            }
        })
        .await
        .must();

    let panels = observability::all_panel_queries().unwrap();
    let alerts = observability::alert_queries().unwrap();
    assert!(!panels.is_empty() && !alerts.is_empty());

    // Every panel query with data (polling until the scrapes have enough samples).
    let deadline = Instant::now() + SETTLE;
    let nacks_of_node = format!(
        "sum by (node_id) (rate(marin3r_xdss_discovery_nack_total{{job=\"{}\",node_id=\"{node}\"}}[1m])) > 0",
        JOBS[1]
    );
    let missing = loop {
        let mut missing = Vec::new();
        for q in panels.iter().filter(|q| !without_data_here(q)) {
            match prometheus.query(&q.expr).await {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => missing.push(format!("{}: no data: {}", q.source, q.expr)),
                Err(e) => missing.push(format!("{}: {e}", q.source)),
            }
        }
        if prometheus
            .query(&nacks_of_node)
            .await
            .unwrap_or_default()
            .is_empty()
        {
            let samples = prometheus
                .query("marin3r_xdss_discovery_nack_total[1m]")
                .await;
            missing.push(format!(
                "no NACK rate for {node}: {nacks_of_node}; samples: {samples:?}"
            ));
        }
        // The series of what this setup provoked: a taint and a rollback of the node's
        // EnvoyConfig (its cacheState Rollback), the certificates the webhook and the
        // discovery service serve and the one the operator issued, the operator's
        // successful reconciles of it.
        let ds = JOBS[1];
        for expected in [
            format!(
                "sum(marin3r_envoyconfig_revisions_tainted_total{{job=\"{ds}\",node_id=\"{node}\",reason=\"RejectedByEnvoy\"}}) > 0"
            ),
            format!(
                "sum(marin3r_envoyconfig_rollbacks_total{{job=\"{ds}\",node_id=\"{node}\"}}) > 0"
            ),
            format!(
                "sum(marin3r_envoyconfig_revisions_published_total{{job=\"{ds}\",node_id=\"{node}\"}}) >= 2"
            ),
            format!(
                "marin3r_envoyconfig_cache_state{{job=\"{ds}\",node_id=\"{node}\",state=\"Rollback\"}} == 1"
            ),
            format!(
                "marin3r_envoyconfig_cache_state{{job=\"{ds}\",node_id=\"{node}\",state=\"InSync\"}} == 0"
            ),
            format!(
                "marin3r_certificate_expiration_timestamp_seconds{{job=\"{}\",certificate=\"webhook-serving\"}} > time()",
                JOBS[0]
            ),
            format!(
                "marin3r_certificate_expiration_timestamp_seconds{{job=\"{ds}\",certificate=\"discovery-service-server\"}} > time()"
            ),
            format!(
                "marin3r_certificate_expiration_timestamp_seconds{{job=\"{ds}\",certificate=\"discovery-service-ca\"}} > time()"
            ),
            format!(
                "marin3r_certificate_expiration_timestamp_seconds{{job=\"{}\",certificate=\"discoveryservicecertificate/default/observability-ca\"}} > time()",
                JOBS[2]
            ),
            format!(
                "controller_runtime_reconcile_total{{job=\"{}\",controller=\"discoveryservicecertificate\",result=\"success\"}} > 0",
                JOBS[2]
            ),
            format!(
                "marin3r_webhook_denials_total{{job=\"{}\",reason=\"invalid_annotations\"}} > 0",
                JOBS[0]
            ),
        ] {
            if prometheus
                .query(&expected)
                .await
                .unwrap_or_default()
                .is_empty()
            {
                missing.push(format!("no data: {expected}"));
            }
        }
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        envoy.check_running().must();
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        missing.is_empty(),
        "{}\nprometheus log:\n{}",
        missing.join("\n"),
        prometheus.log_tail()
    );
    eprintln!("every panel query has data after {:?}", started.elapsed());

    let mut errors = Vec::new();
    // The queries this setup has no data for still parse and evaluate.
    for q in panels.iter().chain(&alerts) {
        if let Err(e) = prometheus.query(&q.expr).await {
            errors.push(format!("{}: {e}", q.source));
        }
    }
    // Each selector of an alert matches series (the alert itself is silent here).
    for q in &alerts {
        for sel in selectors(&q.expr) {
            let name = sel.split('{').next().unwrap_or_default();
            // The discovery service runs in local mode here: no API client.
            let local_mode = sel.contains(&format!("job=\"{}\"", JOBS[1]));
            if not_here(name) || (local_mode && name.starts_with(KUBERNETES_CLIENT_METRIC_PREFIX)) {
                continue;
            }
            match prometheus.query(&sel).await {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => errors.push(format!("{}: {sel} matches no series", q.source)),
                Err(e) => errors.push(format!("{}: {sel}: {e}", q.source)),
            }
        }
    }
    // Every metric a query names exists in Prometheus.
    let names: BTreeSet<String> = prometheus
        .api("/api/v1/label/__name__/values")
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    for q in panels.iter().chain(&alerts) {
        for m in metric_names(&q.expr) {
            if !not_here(&m) && !names.contains(&m) {
                errors.push(format!(
                    "{}: metric {m} does not exist (renamed or removed?)",
                    q.source
                ));
            }
        }
    }
    // Prometheus loaded every rule, and evaluates each without error.
    let rules = prometheus.api("/api/v1/rules").await.unwrap();
    let loaded: Vec<(String, String)> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["health"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(loaded.len(), alerts.len(), "{loaded:?}");
    for (name, health) in &loaded {
        if health != "ok" {
            errors.push(format!("rule {name}: health {health}"));
        }
    }
    assert!(
        errors.is_empty(),
        "{}\nprometheus log:\n{}",
        errors.join("\n"),
        prometheus.log_tail()
    );
    eprintln!(
        "{} panel queries and {} alert expressions checked in {:?}",
        panels.len(),
        alerts.len(),
        started.elapsed()
    );
    operator.abort();
    drop(prometheus);
    drop(envoy);
    xds.stop().await.must();
}
