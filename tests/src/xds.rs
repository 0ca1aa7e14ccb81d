//! Harness for driving the discovery service against a real Envoy: the service
//! in-process ([`Xds`]: `marin3r_control_plane::serve_with` and the local backend on 127.0.0.1:0 listeners, a
//! config folder in a temp dir, certificates from `marin3r_certs::issue`), an Envoy child
//! process bootstrapped like `marin3r init-manager` does it ([`Envoy`]), atomic config
//! edits, and TLS GETs (on the test kit's HTTP client) with polling until a deadline.
//!
//! [`Xds::start_process`] runs the `marin3r` binary instead (signals, exit).
//!
//! Used by `tests/xds_e2e.rs` and `benches/edit_to_serve.rs`. Every address is on
//! 127.0.0.1. Nothing here panics: failures come back as `Err(String)` (the message is
//! meant for a human), so a bench can report them and exit non-zero while the
//! [`KillOnDrop`] in [`Envoy`] still kills Envoy.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use marin3r_certs::{Bundle, IssueOptions, issue};
use marin3r_control_plane::{Config, Listeners};
use marin3r_sidecar::bootstrap::{ApiType, BootstrapOptions, write_files};
use marin3r_testkit::free_port;
use marin3r_testkit::http::Request;
use marin3r_xds::AdsConfig;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{KillOnDrop, envoy_bin, workspace_root};

/// How long Envoy gets to connect, fetch and apply a config (2 cores, parallel tests).
pub const CONVERGE: Duration = Duration::from_secs(20);
/// Bound of one HTTP request or TLS handshake.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Routes `tracing` output (INFO and up) through the test harness's capture; idempotent.
pub fn init_tracing() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_test_writer()
            .try_init();
    });
}

/// `127.0.0.1:port`.
pub fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Replaces `path` atomically (hidden temp file in the same folder, then rename), the way
/// editors and `kubectl cp` do; the discovery service skips hidden files.
pub fn write_atomic(path: &Path, contents: &str) -> Result<(), String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    std::fs::write(&tmp, contents).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| format!("rename {} → {}: {e}", tmp.display(), path.display()))
}

/// A fresh CA with server and client certificates for `localhost` and `127.0.0.1`.
pub fn issue_bundle() -> Result<Bundle, String> {
    issue(&IssueOptions {
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        ..IssueOptions::default()
    })
    .map_err(|e| format!("issue certificates: {e}"))
}

// ---------------------------------------------------------------------------------------
// The discovery service, in-process.

/// The discovery service running as a task of the current tokio runtime, serving a config
/// folder in a temp dir (removed on drop; the task is aborted on drop).
pub struct Xds {
    /// The ADS gRPC (mTLS) listener.
    pub xdss: SocketAddr,
    /// The Prometheus `/metrics` listener.
    pub metrics: SocketAddr,
    /// The `/healthz` and `/readyz` listener.
    pub health: SocketAddr,
    pub config_dir: PathBuf,
    /// `ca/`, `server/` and `client/` (`tls.crt`, `tls.key`) of [`Xds::bundle`].
    pub certs_dir: PathBuf,
    pub bundle: Bundle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), marin3r_control_plane::Error>>>,
    _dir: tempfile::TempDir,
}

impl Xds {
    /// Writes `files` (name, contents) into a fresh config folder and serves it in local
    /// mode.
    pub async fn start(files: &[(&str, String)]) -> Result<Self, String> {
        Self::start_with(files, |dir: &Path| {
            marin3r_control_plane::local::LocalBackend::new(dir)
        })
        .await
    }

    /// The path of `name` in the config folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.config_dir.join(name)
    }

    /// The Prometheus text of `/metrics` (an error unless it answers 200).
    pub async fn metrics_text(&self) -> Result<String, String> {
        let r = get(self.metrics, "/metrics").await?;
        if r.status == 200 {
            Ok(r.body)
        } else {
            Err(format!("GET /metrics: status {}: {}", r.status, r.body))
        }
    }

    /// Stops the server and checks it ended cleanly (Envoys must be gone: open ADS
    /// streams hold a graceful stop).
    pub async fn stop(mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self
            .task
            .take()
            .ok_or("the discovery service task is gone")?;
        let result = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .map_err(|_| "the discovery service did not stop within 10 s".to_string())?
            .map_err(|e| format!("the discovery service task failed: {e}"))?;
        result.map_err(|e| format!("serve failed: {e:?}"))
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
pub fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
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

/// An Envoy child process talking ADS (mTLS) to an [`Xds`]; killed on drop, and its log
/// tail is printed when dropped during a panic.
pub struct Envoy {
    pub process: KillOnDrop,
    pub node_id: String,
    /// Envoy's admin listener (127.0.0.1, a free port).
    pub admin: SocketAddr,
    /// Envoy's stderr.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Writes the bootstrap for `node_id` (admin on a free 127.0.0.1 port) and starts
    /// Envoy with it.
    pub fn start(xds: &Xds, node_id: &str, api_type: ApiType) -> Result<Self, String> {
        Self::start_as(xds, node_id, &pod_name(node_id), api_type, None)
    }

    /// The last `lines` lines of Envoy's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The last `lines` lines of Envoy's log, framed and named, for failure reports.
    pub fn log_report(&self, lines: usize) -> String {
        format!(
            "---- envoy {} log (tail) ----\n{}\n-------------------",
            self.node_id,
            self.log_tail(lines)
        )
    }

    /// An error if Envoy has exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.process.try_wait() {
            Some(status) => Err(format!("envoy {} exited: {status}", self.node_id)),
            None => Ok(()),
        }
    }

    /// Polls `probe` every `interval` until it returns `Ok`, checking before each probe
    /// that Envoy is still up; after `timeout` the error names `what` and the probe's
    /// last error.
    pub async fn eventually<T, F, Fut>(
        &mut self,
        what: &str,
        timeout: Duration,
        interval: Duration,
        mut probe: F,
    ) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            let last = match probe().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!("{what}: not within {timeout:?}; last: {last}"));
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Polls `GET http://addr/` every `interval` until it answers 200 with `body`.
    pub async fn wait_body(
        &mut self,
        addr: SocketAddr,
        body: &str,
        timeout: Duration,
        interval: Duration,
    ) -> Result<Response, String> {
        let what = format!("GET {addr}/ → 200 {body:?}");
        self.eventually(&what, timeout, interval, || async {
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
            eprintln!("{}", self.log_report(80));
        }
    }
}

/// The pod name [`Envoy::start`] puts in the bootstrap for `node_id`.
pub fn pod_name(node_id: &str) -> String {
    format!("{node_id}-pod")
}

// ---------------------------------------------------------------------------------------
// HTTP (the test kit's client).

pub use marin3r_testkit::http::{Response, get};

/// The body of `GET http://127.0.0.1:port/` when it answers 200, else the status.
pub async fn body_at(port: u16) -> Result<String, String> {
    let r = get(localhost(port), "/").await?;
    if r.status == 200 {
        Ok(r.body)
    } else {
        Err(format!("status {}", r.status))
    }
}

/// A TLS handshake with `addr` (SNI `localhost`) trusting only `ca_pem`, then `GET /`:
/// the leaf certificate Envoy presented and the response.
pub async fn get_tls(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<(CertificateDer<'static>, Response), String> {
    let config = marin3r_testkit::tls::client_config(ca_pem)
        .alpn(b"http/1.1")
        .build()?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let server_name = ServerName::try_from("localhost").map_err(|e| format!("server name: {e}"))?;
    let handshake = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        connector
            .connect(server_name, tcp)
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
    let resp = Request::get("/")
        .host("localhost")
        .timeout(REQUEST_TIMEOUT)
        .send_over(tls)
        .await?;
    Ok((leaf, resp))
}

// ---------------------------------------------------------------------------------------
// Configs.

/// The walkthrough's direct-response EnvoyConfig (`examples/local/direct-response.yaml`)
/// for `node_id`, listening on 127.0.0.1:`port` and answering `body`.
pub fn direct_response_yaml(node_id: &str, port: u16, body: &str) -> Result<String, String> {
    let path = workspace_root().join("examples/local/direct-response.yaml");
    let example =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let replace = |text: String, from: &str, to: &str| {
        if text.contains(from) {
            Ok(text.replace(from, to))
        } else {
            Err(format!("the example lost {from:?}"))
        }
    };
    let yaml = replace(example, "nodeID: example", &format!("nodeID: {node_id}"))?;
    let yaml = replace(yaml, "name: example", &format!("name: {node_id}"))?;
    let yaml = replace(yaml, "port_value: 8080", &format!("port_value: {port}"))?;
    replace(
        yaml,
        r#"inline_string: "Hello from marin3r-rs\n""#,
        &format!("inline_string: {body:?}"),
    )
}

// ---------------------------------------------------------------------------------------
// Custom backends, several Envoys per node, other HTTP methods (self-healing tests).

impl Xds {
    /// Like [`Xds::start`], but serves the config folder with the backend `backend`
    /// builds from its path (e.g. `LocalBackend::new(dir).with_nack_threshold(3)`).
    pub async fn start_with<B, F>(files: &[(&str, String)], backend: F) -> Result<Self, String>
    where
        B: marin3r_control_plane::Backend,
        F: FnOnce(&Path) -> B,
    {
        let (dir, bundle, certs_dir, config_dir) = workspace(files)?;
        let bind = || async {
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("bind 127.0.0.1:0: {e}"))
        };
        let listeners = Listeners {
            xdss: bind().await?,
            metrics: bind().await?,
            health: bind().await?,
        };
        let addr = |l: &TcpListener| l.local_addr().map_err(|e| format!("local_addr: {e}"));
        let xdss = addr(&listeners.xdss)?;
        let metrics = addr(&listeners.metrics)?;
        let health = addr(&listeners.health)?;
        let config = Config {
            xdss_addr: xdss,
            server_cert: certs_dir.join("server/tls.crt"),
            server_key: certs_dir.join("server/tls.key"),
            ca_file: marin3r_certs::ca_file_in_dir(certs_dir.join("ca")),
            metrics_addr: metrics,
            health_addr: health,
            ads: AdsConfig::default(),
        };
        let backend = backend(&config_dir);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(marin3r_control_plane::serve_with(
            config,
            listeners,
            backend,
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            xdss,
            metrics,
            health,
            config_dir,
            certs_dir,
            bundle,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        })
    }
}

impl Xds {
    /// Like [`Xds::start`], but the discovery service is the `marin3r discovery-service`
    /// binary ([`crate::marin3r_bin`]; `cargo build -p marin3r --bin marin3r` first, `cargo test
    /// --workspace` builds it) in local mode on 127.0.0.1, with `extra_args`. The process
    /// is killed when the returned handle drops; its stderr goes to `<temp>/marin3r.log`
    /// (the returned path).
    pub async fn start_process(
        files: &[(&str, String)],
        extra_args: &[&str],
    ) -> Result<(Self, KillOnDrop, PathBuf), String> {
        let (dir, bundle, certs_dir, config_dir) = workspace(files)?;
        let port = || free_port().map_err(|e| format!("free port: {e}"));
        let (xdss, metrics, health) = (localhost(port()?), localhost(port()?), localhost(port()?));
        let bin = crate::marin3r_bin();
        if !bin.exists() {
            return Err(format!(
                "{} is missing: run `cargo build -p marin3r --bin marin3r` (with the same CARGO_TARGET_DIR) first",
                bin.display()
            ));
        }
        let log = dir.path().join("marin3r.log");
        let stderr =
            std::fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("discovery-service")
            .args(["--xdss-bind-address", "127.0.0.1"])
            .args(["--xdss-port", &xdss.port().to_string()])
            .arg("--server-certificate-path")
            .arg(certs_dir.join("server"))
            .arg("--ca-certificate-path")
            .arg(certs_dir.join("ca"))
            .arg("--config-dir")
            .arg(&config_dir)
            .args(["--metrics-bind-address", &metrics.to_string()])
            .args(["--health-probe-bind-address", &health.to_string()])
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr));
        let process = KillOnDrop::spawn("marin3r discovery-service", &mut cmd)
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        Ok((
            Self {
                xdss,
                metrics,
                health,
                config_dir,
                certs_dir,
                bundle,
                stop: None,
                task: None,
                _dir: dir,
            },
            process,
            log,
        ))
    }
}

impl Envoy {
    /// Like [`Envoy::start`], with an explicit pod name (node metadata `pod_name`, so
    /// several Envoys of one node count as several pods) and optionally another working
    /// directory (relative file names in the config resolve against it).
    pub fn start_as(
        xds: &Xds,
        node_id: &str,
        pod_name: &str,
        api_type: ApiType,
        current_dir: Option<&Path>,
    ) -> Result<Self, String> {
        Self::start_with(
            xds,
            node_id,
            pod_name,
            api_type,
            current_dir,
            &EnvoyExtras::default(),
        )
    }

    /// Like [`Envoy::start_as`], with [`EnvoyExtras`]: more command-line arguments and
    /// top-level bootstrap fields.
    pub fn start_with(
        xds: &Xds,
        node_id: &str,
        pod_name: &str,
        api_type: ApiType,
        current_dir: Option<&Path>,
        extras: &EnvoyExtras,
    ) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let admin = free_port().map_err(|e| format!("free port: {e}"))?;
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
            pod_name: pod_name.into(),
            pod_namespace: "default".into(),
            host_name: "e2e-host".into(),
            ..BootstrapOptions::default()
        };
        write_files(&opts).map_err(|e| format!("write the Envoy bootstrap: {e}"))?;
        if !extras.bootstrap.is_empty() {
            merge_bootstrap(&opts.config_file, &extras.bootstrap)?;
        }
        let log = dir.path().join("envoy.log");
        let stderr =
            std::fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let bin = envoy_bin();
        let mut cmd = Command::new(&bin);
        cmd.arg("-c")
            .arg(&opts.config_file)
            .args([
                "--use-dynamic-base-id",
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "--log-level",
                "info",
            ])
            .args(&extras.args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr));
        if let Some(cwd) = current_dir {
            cmd.current_dir(cwd);
        }
        let process = KillOnDrop::spawn("envoy", &mut cmd)
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        Ok(Self {
            process,
            node_id: node_id.into(),
            admin: localhost(admin),
            log,
            _dir: dir,
        })
    }
}

/// What [`Envoy::start_with`] adds to the Envoy that [`Envoy::start_as`] starts.
#[derive(Debug, Clone, Default)]
pub struct EnvoyExtras {
    /// Appended to Envoy's command line (e.g. `--drain-time-s 1`).
    pub args: Vec<String>,
    /// Top-level bootstrap fields, set over those of the injected bootstrap (e.g.
    /// `typed_dns_resolver_config`).
    pub bootstrap: serde_json::Map<String, serde_json::Value>,
}

/// Sets the top-level `fields` in the JSON bootstrap at `path`.
fn merge_bootstrap(
    path: &Path,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let mut bootstrap: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("parse {}: {e}", path.display()))?;
    let top = bootstrap
        .as_object_mut()
        .ok_or_else(|| format!("{} is not a JSON object", path.display()))?;
    for (k, v) in fields {
        top.insert(k.clone(), v.clone());
    }
    let text = serde_json::to_string_pretty(&bootstrap)
        .map_err(|e| format!("serialize {}: {e}", path.display()))?;
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------
// Restarting the discovery service in place (hardening tests).

impl Xds {
    /// Stops the running discovery service (its open ADS streams end with UNAVAILABLE)
    /// and starts a new one on the **same** ADS port, certificates and config folder, with
    /// the backend `backend` builds (metrics and probes move to new ports). `downtime`
    /// is waited between the two. Returns how long the stop took.
    pub async fn restart_with<B, F>(
        &mut self,
        downtime: Duration,
        backend: F,
    ) -> Result<Duration, String>
    where
        B: marin3r_control_plane::Backend,
        F: FnOnce(&Path) -> B,
    {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self
            .task
            .take()
            .ok_or("the discovery service task is gone")?;
        let stopping = Instant::now();
        tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .map_err(|_| "the discovery service did not stop within 15 s".to_string())?
            .map_err(|e| format!("the discovery service task failed: {e}"))?
            .map_err(|e| format!("serve failed: {e:?}"))?;
        let stopped_in = stopping.elapsed();
        tokio::time::sleep(downtime).await;
        let xdss = TcpListener::bind(self.xdss)
            .await
            .map_err(|e| format!("bind {} again: {e}", self.xdss))?;
        let bind = || async {
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("bind 127.0.0.1:0: {e}"))
        };
        let listeners = Listeners {
            xdss,
            metrics: bind().await?,
            health: bind().await?,
        };
        let addr = |l: &TcpListener| l.local_addr().map_err(|e| format!("local_addr: {e}"));
        self.metrics = addr(&listeners.metrics)?;
        self.health = addr(&listeners.health)?;
        let config = Config {
            xdss_addr: self.xdss,
            server_cert: self.certs_dir.join("server/tls.crt"),
            server_key: self.certs_dir.join("server/tls.key"),
            ca_file: marin3r_certs::ca_file_in_dir(self.certs_dir.join("ca")),
            metrics_addr: self.metrics,
            health_addr: self.health,
            ads: AdsConfig::default(),
        };
        let backend = backend(&self.config_dir);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        self.task = Some(tokio::spawn(marin3r_control_plane::serve_with(
            config,
            listeners,
            backend,
            async move {
                let _ = stopped.await;
            },
        )));
        self.stop = Some(stop);
        Ok(stopped_in)
    }
}

/// A temp dir with a fresh certificate bundle in `certs/` and `files` in `config/`:
/// `(dir, bundle, certs dir, config dir)`.
fn workspace(
    files: &[(&str, String)],
) -> Result<(tempfile::TempDir, Bundle, PathBuf, PathBuf), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let certs_dir = dir.path().join("certs");
    let bundle = issue_bundle()?;
    bundle
        .write_to(&certs_dir)
        .map_err(|e| format!("write certificates to {}: {e}", certs_dir.display()))?;
    let config_dir = dir.path().join("config");
    std::fs::create_dir_all(&config_dir)
        .map_err(|e| format!("create {}: {e}", config_dir.display()))?;
    for (name, contents) in files {
        let path = config_dir.join(name);
        std::fs::write(&path, contents).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok((dir, bundle, certs_dir, config_dir))
}
