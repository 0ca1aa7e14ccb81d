//! End-to-end tests of the discovery service (SPEC §2–§4) against a real Envoy 1.40.
//!
//! Every test runs the discovery service in-process (`marin3r_xds::serve` in local mode on
//! listeners bound to 127.0.0.1:0, config folder in a temp dir, certificates from
//! `marin3r_certs::issue`) and starts its own Envoy as a child process with the bootstrap
//! `marin3r init-manager` writes (`marin3r_sidecar::bootstrap::write_files`), so Envoy
//! talks ADS to us over mTLS exactly like an injected sidecar. Every address is on
//! 127.0.0.1 with a free port; node ids are unique per test, so the tests run in parallel.
//! Envoy is killed on drop, also when a test fails; its log tail is printed then.
//!
//! Covered (the issue's "Done when"): the walkthrough's direct-response listener (SotW
//! and Delta), the kuard-style proxy to an upstream, config edits picked up without an
//! Envoy restart (SotW and Delta, with the measured edit → serve time), a TLS listener
//! whose certificate comes from a Secret manifest through SDS-over-ADS and follows its
//! replacement, mTLS refusing clients without a (valid) client certificate, and a
//! rejected config: NACKs counted in `/metrics`, re-pushed only on the backoff schedule,
//! while the previous config keeps serving.

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use marin3r_certs::{Bundle, IssueOptions, issue};
use marin3r_sidecar::bootstrap::{ApiType, BootstrapOptions, write_files};
use marin3r_tests::{KillOnDrop, envoy_bin, free_port, workspace_root};
use marin3r_xds::{AdsConfig, Config, Listeners, serve};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long Envoy gets to connect, fetch and apply a config (2 cores, parallel tests).
const CONVERGE: Duration = Duration::from_secs(20);
/// Bound of one HTTP request or TLS handshake.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn init_tracing() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_test_writer()
            .try_init();
    });
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Replaces `path` atomically (hidden temp file in the same folder, then rename), the way
/// editors and `kubectl cp` do; the discovery service skips hidden files.
fn write_atomic(path: &Path, contents: &str) {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn issue_bundle() -> Bundle {
    issue(&IssueOptions {
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        ..IssueOptions::default()
    })
    .unwrap()
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

// ---------------------------------------------------------------------------------------
// The discovery service, in-process.

struct Xds {
    xdss: SocketAddr,
    metrics: SocketAddr,
    health: SocketAddr,
    config_dir: PathBuf,
    certs_dir: PathBuf,
    bundle: Bundle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), marin3r_xds::Error>>>,
    _dir: tempfile::TempDir,
}

impl Xds {
    /// Writes `files` (name, contents) into a fresh config folder and serves it.
    async fn start(files: &[(&str, String)]) -> Self {
        init_tracing();
        let dir = tempfile::tempdir().unwrap();
        let certs_dir = dir.path().join("certs");
        let bundle = issue_bundle();
        bundle.write_to(&certs_dir).unwrap();
        let config_dir = dir.path().join("config");
        std::fs::create_dir_all(&config_dir).unwrap();
        for (name, contents) in files {
            std::fs::write(config_dir.join(name), contents).unwrap();
        }
        let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
        let listeners = Listeners {
            xdss: bind().await,
            metrics: bind().await,
            health: bind().await,
        };
        let xdss = listeners.xdss.local_addr().unwrap();
        let metrics = listeners.metrics.local_addr().unwrap();
        let health = listeners.health.local_addr().unwrap();
        let config = Config {
            xdss_addr: xdss,
            server_cert: certs_dir.join("server/tls.crt"),
            server_key: certs_dir.join("server/tls.key"),
            ca_file: marin3r_certs::ca_file_in_dir(certs_dir.join("ca")),
            metrics_addr: metrics,
            health_addr: health,
            config_dir: config_dir.clone(),
            ads: AdsConfig::default(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(config, listeners, async move {
            let _ = stopped.await;
        }));
        Self {
            xdss,
            metrics,
            health,
            config_dir,
            certs_dir,
            bundle,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.config_dir.join(name)
    }

    /// The Prometheus text of `/metrics`.
    async fn metrics_text(&self) -> String {
        let r = get(self.metrics, "/metrics").await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    /// Stops the server (Envoys must be gone: open ADS streams hold a graceful stop).
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the discovery service did not stop within 10 s")
            .unwrap();
        assert!(result.is_ok(), "serve failed: {result:?}");
    }
}

impl Drop for Xds {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Sum of the samples of `metric` whose labels include every `labels` pair.
fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(metric)?.strip_prefix('{'))
        .filter_map(|rest| {
            let (set, value) = rest.split_once('}')?;
            labels
                .iter()
                .all(|(k, v)| set.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.split_whitespace().next()?.parse::<f64>().ok())?
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// Envoy, bootstrapped like `marin3r init-manager` does it.

struct Envoy {
    process: KillOnDrop,
    node_id: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Envoy {
    fn start(xds: &Xds, node_id: &str, api_type: ApiType) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let admin = free_port().unwrap();
        let opts = BootstrapOptions {
            xdss_host: "127.0.0.1".into(),
            xdss_port: xds.xdss.port(),
            node_id: node_id.into(),
            cluster_id: node_id.into(),
            admin_bind_address: format!("127.0.0.1:{admin}"),
            admin_access_log_path: dir.path().join("admin.log").display().to_string(),
            client_certificate_path: xds.certs_dir.join("client"),
            config_file: dir.path().join("bootstrap/config.json"),
            resources_path: dir.path().join("bootstrap"),
            envoy_image: "envoyproxy/envoy:v1.40.0".into(),
            api_type,
            pod_name: pod_name(node_id),
            pod_namespace: "default".into(),
            host_name: "e2e-host".into(),
            ..BootstrapOptions::default()
        };
        write_files(&opts).unwrap();
        let log = dir.path().join("envoy.log");
        let process = KillOnDrop::spawn(
            "envoy",
            Command::new(envoy_bin())
                .arg("-c")
                .arg(&opts.config_file)
                .args([
                    "--use-dynamic-base-id",
                    "--disable-hot-restart",
                    "--concurrency",
                    "1",
                    "--log-level",
                    "info",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(&log).unwrap())),
        )
        .unwrap();
        Self {
            process,
            node_id: node_id.into(),
            log,
            _dir: dir,
        }
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.process.try_wait() {
            panic!("envoy {} exited: {status}", self.node_id);
        }
    }

    /// Polls `probe` (every 20 ms, Envoy must stay up) until it returns `Ok`; panics with
    /// the last error after `timeout`.
    async fn eventually<T, F, Fut>(&mut self, what: &str, timeout: Duration, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running();
            let last = match probe().await {
                Ok(v) => return v,
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}; last: {last}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `GET http://addr/` answers 200 with `body`.
    async fn wait_body(&mut self, addr: SocketAddr, body: &str) -> Resp {
        self.eventually(&format!("GET {addr}/ → 200 {body:?}"), CONVERGE, || async {
            let r = get(addr, "/").await?;
            if r.status == 200 && r.body == body {
                Ok(r)
            } else {
                Err(format!("status {} body {:?}", r.status, r.body))
            }
        })
        .await
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- envoy {} log (tail) ----\n{}\n-------------------",
                self.node_id,
                self.log_tail(80)
            );
        }
    }
}

fn pod_name(node_id: &str) -> String {
    format!("{node_id}-pod")
}

// ---------------------------------------------------------------------------------------
// HTTP.

struct Resp {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// `GET path` over `io` (HTTP/1.1), bounded by [`REQUEST_TIMEOUT`].
async fn get_over<I>(io: I, host: &str, path: &str) -> Result<Resp, String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let fut = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = hyper::Request::get(path)
            .header("host", host)
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Resp {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| format!("GET {host}{path} timed out"))?
}

/// `GET path` on a fresh plain-TCP connection.
async fn get(addr: SocketAddr, path: &str) -> Result<Resp, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    get_over(stream, &addr.to_string(), path).await
}

/// A TLS handshake with `addr` (SNI `localhost`) trusting only `ca_pem`, then `GET /`:
/// the leaf certificate Envoy presented and the response.
async fn get_tls(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<(CertificateDer<'static>, Resp), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(ca_pem)).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| format!("TLS handshake with {addr}: {e}"))
    };
    let tls = tokio::time::timeout(REQUEST_TIMEOUT, handshake)
        .await
        .map_err(|_| format!("TLS handshake with {addr} timed out"))??;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no peer certificate")?
        .clone()
        .into_owned();
    let resp = get_over(tls, "localhost", "/").await?;
    Ok((leaf, resp))
}

/// A tiny HTTP/1.1 upstream (keep-alive aware) answering every request with `body`,
/// `server: e2e-upstream` and `x-upstream: kuard`; counts the requests it served.
async fn start_upstream(body: &'static str) -> (SocketAddr, Arc<AtomicU32>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicU32::new(0));
    let counter = served.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // Requests through the router are GETs without a body.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        counter.fetch_add(1, Ordering::SeqCst);
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nserver: e2e-upstream\r\nx-upstream: kuard\r\n\r\n{body}",
                            body.len()
                        );
                        if stream.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, served, task)
}

// ---------------------------------------------------------------------------------------
// Configs.

/// The walkthrough's direct-response EnvoyConfig (`examples/local/direct-response.yaml`)
/// for `node_id`, listening on 127.0.0.1:`port` and answering `body`.
fn direct_response_yaml(node_id: &str, port: u16, body: &str) -> String {
    let example =
        std::fs::read_to_string(workspace_root().join("examples/local/direct-response.yaml"))
            .unwrap();
    let replace = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "the example lost {from:?}");
        text.replace(from, to)
    };
    let yaml = replace(example, "nodeID: example", &format!("nodeID: {node_id}"));
    let yaml = replace(yaml, "name: example", &format!("name: {node_id}"));
    let yaml = replace(yaml, "port_value: 8080", &format!("port_value: {port}"));
    replace(
        yaml,
        r#"inline_string: "Hello from marin3r-rs\n""#,
        &format!("inline_string: {body:?}"),
    )
}

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const DOWNSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";

/// A listener `name` on 127.0.0.1:`port` whose HttpConnectionManager routes `/` with
/// `action` (`{"route": …}` or `{"direct_response": …}`), optionally behind TLS.
fn http_listener(name: &str, port: u16, action: Value, transport_socket: Option<Value>) -> Value {
    let mut route = json!({"match": {"prefix": "/"}});
    for (k, v) in action.as_object().unwrap() {
        route[k] = v.clone();
    }
    let mut chain = json!({
        "filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM_TYPE,
                "stat_prefix": name,
                "route_config": {
                    "name": format!("{name}_route"),
                    "virtual_hosts": [{"name": "any", "domains": ["*"], "routes": [route]}],
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": ROUTER_TYPE},
                }],
            },
        }],
    });
    if let Some(ts) = transport_socket {
        chain["transport_socket"] = ts;
    }
    json!({
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [chain],
    })
}

fn direct(body: &str) -> Value {
    json!({"direct_response": {"status": 200, "body": {"inline_string": body}}})
}

/// An EnvoyConfig manifest (JSON, which the folder accepts like YAML).
fn envoy_config(node_id: &str, resources: Vec<Value>) -> String {
    serde_json::to_string_pretty(&json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": node_id, "namespace": "default"},
        "spec": {"nodeID": node_id, "envoyAPI": "v3", "resources": resources},
    }))
    .unwrap()
}

fn resource(kind: &str, value: Value) -> Value {
    json!({"type": kind, "value": value})
}

/// A `kubernetes.io/tls` Secret manifest (YAML, base64 `data`).
fn tls_secret_yaml(name: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        b64(cert_pem),
        b64(key_pem)
    )
}

// ---------------------------------------------------------------------------------------
// 1 + 4: the walkthrough's direct-response listener over mTLS ADS.

async fn serves_direct_response(api: ApiType) {
    let node = format!("e2e-direct-{api}");
    let port = free_port().unwrap();
    let xds = Xds::start(&[(
        "direct-response.yaml",
        direct_response_yaml(&node, port, "Hello from marin3r-rs\n"),
    )])
    .await;
    let mut envoy = Envoy::start(&xds, &node, api);
    envoy
        .wait_body(localhost(port), "Hello from marin3r-rs\n")
        .await;

    // The stream is counted under its node and API flavour, and Envoy ACKed the
    // listener under its pod name.
    let text = xds.metrics_text().await;
    let streams = metric_sum(
        &text,
        "marin3r_xdss_streams",
        &[("node_id", &node), ("api", api.as_str())],
    );
    assert_eq!(streams, 1.0, "{text}");
    let pod = pod_name(&node);
    let labels = [
        ("node_id", node.as_str()),
        ("resource_type", "listener"),
        ("pod_name", pod.as_str()),
    ];
    assert!(
        metric_sum(&text, "marin3r_xdss_discovery_ack_total", &labels) >= 1.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "marin3r_xdss_discovery_nack_total", &labels),
        0.0,
        "{text}"
    );

    // Envoy gone, the server stops cleanly.
    drop(envoy);
    xds.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_envoy_serves_the_direct_response_listener() {
    serves_direct_response(ApiType::Sotw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_envoy_serves_the_direct_response_listener() {
    serves_direct_response(ApiType::Delta).await;
}

// ---------------------------------------------------------------------------------------
// 3 + 4: editing the file changes what Envoy serves, without an Envoy restart.

async fn edit_is_served_without_restart(api: ApiType) {
    let node = format!("e2e-edit-{api}");
    let port = free_port().unwrap();
    let xds = Xds::start(&[("config.yaml", direct_response_yaml(&node, port, "v1\n"))]).await;
    let mut envoy = Envoy::start(&xds, &node, api);
    envoy.wait_body(localhost(port), "v1\n").await;
    let pid = envoy.process.id();

    write_atomic(
        &xds.file("config.yaml"),
        &direct_response_yaml(&node, port, "v2\n"),
    );
    let written = Instant::now();
    envoy.wait_body(localhost(port), "v2\n").await;
    let took = written.elapsed();
    eprintln!("[{api}] edit → Envoy serves the new body: {took:?}");

    envoy.assert_running();
    assert_eq!(envoy.process.id(), pid, "envoy was restarted");
    // Still the new body (no flapping back).
    let r = get(localhost(port), "/").await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "v2\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_edit_is_served_without_restarting_envoy() {
    edit_is_served_without_restart(ApiType::Sotw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_edit_is_served_without_restarting_envoy() {
    edit_is_served_without_restart(ApiType::Delta).await;
}

// ---------------------------------------------------------------------------------------
// 2: the kuard-style proxy to an upstream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kuard_style_config_proxies_to_the_upstream() {
    let node = "e2e-kuard";
    let body = "hello from the kuard upstream\n";
    let (upstream, served, _upstream_task) = start_upstream(body).await;
    let port = free_port().unwrap();
    let cluster = json!({
        "name": "kuard",
        "type": "STRICT_DNS",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": "kuard",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": upstream.port(),
            }}}}]}],
        },
    });
    let listener = http_listener("http", port, json!({"route": {"cluster": "kuard"}}), None);
    let xds = Xds::start(&[(
        "kuard.json",
        envoy_config(
            node,
            vec![resource("cluster", cluster), resource("listener", listener)],
        ),
    )])
    .await;
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw);
    let r = envoy.wait_body(localhost(port), body).await;
    assert_eq!(r.header("server"), Some("envoy"));
    assert_eq!(r.header("x-upstream"), Some("kuard"));
    assert!(served.load(Ordering::SeqCst) >= 1);
}

// ---------------------------------------------------------------------------------------
// 5: a TLS listener whose certificate comes from a Secret manifest, via SDS over ADS.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_serves_the_secret_and_follows_its_replacement() {
    let node = "e2e-tls";
    let secret = "e2e-certificate";
    let first = issue_bundle();
    let second = issue_bundle();
    let port = free_port().unwrap();
    let tls = json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": DOWNSTREAM_TLS_TYPE,
            "common_tls_context": {
                "tls_certificate_sds_secret_configs": [{
                    "name": secret,
                    "sds_config": {"ads": {}, "resource_api_version": "V3"},
                }],
            },
        },
    });
    let config = envoy_config(
        node,
        vec![
            json!({"type": "secret", "generateFromTlsSecret": secret, "blueprint": "tlsCertificate"}),
            resource(
                "listener",
                http_listener("https", port, direct(node), Some(tls)),
            ),
        ],
    );
    let xds = Xds::start(&[
        ("envoyconfig.json", config),
        (
            "secret.yaml",
            tls_secret_yaml(secret, &first.server.cert_pem, &first.server.key_pem),
        ),
    ])
    .await;
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw);
    let addr = localhost(port);

    let (leaf, resp) = envoy
        .eventually("TLS listener with the first certificate", CONVERGE, || {
            get_tls(addr, &first.ca.cert_pem)
        })
        .await;
    assert_eq!(leaf, der(&first.server.cert_pem));
    assert_eq!((resp.status, resp.body.as_str()), (200, node));

    // Replace the Secret manifest: new handshakes get the new certificate.
    write_atomic(
        &xds.file("secret.yaml"),
        &tls_secret_yaml(secret, &second.server.cert_pem, &second.server.key_pem),
    );
    let written = Instant::now();
    let (leaf, resp) = envoy
        .eventually("TLS listener with the second certificate", CONVERGE, || {
            get_tls(addr, &second.ca.cert_pem)
        })
        .await;
    eprintln!(
        "secret replaced → Envoy serves the new certificate: {:?}",
        written.elapsed()
    );
    assert_eq!(leaf, der(&second.server.cert_pem));
    assert_eq!((resp.status, resp.body.as_str()), (200, node));
    // The old CA no longer verifies what is served.
    assert!(get_tls(addr, &first.ca.cert_pem).await.is_err());
}

// ---------------------------------------------------------------------------------------
// 6: mTLS — the gRPC server refuses clients without a valid client certificate.

/// `grpc.health.v1.Health/Check` for `service` over TLS trusting `ca_pem`, presenting
/// `identity` (cert, key PEM) if any.
async fn health_check(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    service: &str,
) -> Result<i32, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let call = async {
        let channel = Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| format!("endpoint: {e}"))?
            .tls_config(tls)
            .map_err(|e| format!("tls config: {e}"))?
            .connect_timeout(REQUEST_TIMEOUT)
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let response = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .map_err(|e| format!("check: {e:?}"))?;
        Ok(response.into_inner().status)
    };
    tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .map_err(|_| "health check timed out".to_string())?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requires_a_client_certificate_from_the_ca() {
    use tonic_health::pb::health_check_response::ServingStatus;

    let xds = Xds::start(&[]).await;
    let ca = xds.bundle.ca.cert_pem.clone();
    let client = (
        xds.bundle.client.cert_pem.as_str(),
        xds.bundle.client.key_pem.as_str(),
    );
    let serving = ServingStatus::Serving as i32;

    // The right client certificate: SERVING, for the server and for ADS.
    assert_eq!(
        health_check(xds.xdss, &ca, Some(client), "").await,
        Ok(serving)
    );
    assert_eq!(
        health_check(
            xds.xdss,
            &ca,
            Some(client),
            "envoy.service.discovery.v3.AggregatedDiscoveryService"
        )
        .await,
        Ok(serving)
    );

    // No client certificate.
    let refused = health_check(xds.xdss, &ca, None, "").await;
    assert!(refused.is_err(), "no client cert: {refused:?}");
    eprintln!("no client certificate: {}", refused.unwrap_err());

    // A client certificate from another CA (the client still trusts the server's CA).
    let other = issue_bundle();
    let refused = health_check(
        xds.xdss,
        &ca,
        Some((&other.client.cert_pem, &other.client.key_pem)),
        "",
    )
    .await;
    assert!(refused.is_err(), "foreign client cert: {refused:?}");
    eprintln!("foreign client certificate: {}", refused.unwrap_err());

    // The right certificate still works afterwards; the probes are plain HTTP.
    assert_eq!(
        health_check(xds.xdss, &ca, Some(client), "").await,
        Ok(serving)
    );
    for path in ["/healthz", "/readyz"] {
        let r = get(xds.health, path).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
}

// ---------------------------------------------------------------------------------------
// 7: a config Envoy rejects is NACKed, re-pushed on the backoff schedule only, and the
// previous config keeps serving.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_config_is_nacked_with_backoff_and_the_old_one_keeps_serving() {
    let node = "e2e-nack";
    let old_port = free_port().unwrap();
    let new_port = free_port().unwrap();
    let good = |body: &str| {
        envoy_config(
            node,
            vec![resource(
                "listener",
                http_listener("http", old_port, direct(body), None),
            )],
        )
    };
    let xds = Xds::start(&[("config.json", good("good\n"))]).await;
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw);
    envoy.wait_body(localhost(old_port), "good\n").await;

    // Walkthrough 2: the listener moves to another port and routes to a cluster that does
    // not exist.
    let broken = envoy_config(
        node,
        vec![resource(
            "listener",
            http_listener(
                "http",
                new_port,
                json!({"route": {"cluster": "does-not-exist"}}),
                None,
            ),
        )],
    );
    write_atomic(&xds.file("config.json"), &broken);
    let pod = pod_name(node);
    let labels = [
        ("node_id", node),
        ("resource_type", "listener"),
        ("pod_name", pod.as_str()),
    ];
    let nacks = |text: &str| metric_sum(text, "marin3r_xdss_discovery_nack_total", &labels);
    let first = envoy
        .eventually("first NACK in /metrics", CONVERGE, || async {
            let n = nacks(&xds.metrics_text().await);
            if n >= 1.0 {
                Ok(n)
            } else {
                Err(format!("{n} NACKs"))
            }
        })
        .await;

    // Sample the counter for 3 s: the rejected version is re-sent on the 100 ms doubling
    // backoff (≈ 4 more NACKs in 3 s), not in a tight loop.
    let window = Duration::from_secs(3);
    let start = Instant::now();
    let mut samples = vec![(Duration::ZERO, first)];
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        samples.push((start.elapsed(), nacks(&xds.metrics_text().await)));
    }
    let last = samples.last().unwrap().1;
    let grew = last - first;
    eprintln!("NACK counter over {window:?}: {samples:?}");
    assert!(
        (2.0..=7.0).contains(&grew),
        "expected 2..=7 re-sent NACKs in {window:?}, got {grew}: {samples:?}"
    );

    // It was Envoy that rejected the listener update.
    let log = std::fs::read_to_string(&envoy.log).unwrap();
    let rejected = log
        .lines()
        .find(|l| l.contains("envoy.config.listener.v3.Listener rejected"))
        .unwrap_or_else(|| panic!("no listener rejection in the envoy log"));
    eprintln!("envoy: {rejected}");

    // The previous config keeps serving; the rejected listener never came up.
    envoy.assert_running();
    let r = get(localhost(old_port), "/").await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "good\n"));
    assert!(get(localhost(new_port), "/").await.is_err());

    // A newer (good) version goes out at once, not on the backoff schedule.
    write_atomic(&xds.file("config.json"), &good("fixed\n"));
    let written = Instant::now();
    envoy.wait_body(localhost(old_port), "fixed\n").await;
    eprintln!("fix written → served: {:?}", written.elapsed());
    let after_fix = nacks(&xds.metrics_text().await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        nacks(&xds.metrics_text().await),
        after_fix,
        "NACKs continued after the fix"
    );
}
