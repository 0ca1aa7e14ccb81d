//! Harness for driving the discovery service against a real Envoy: the service
//! in-process ([`Xds`]: [`crate::in_process`] with the local backend, a config folder in
//! a temp dir, certificates from `marin3r_certs::issue`), an Envoy child
//! process bootstrapped like `marin3r init-manager` does it ([`Envoy`]), atomic config
//! edits, and TLS GETs (on the test kit's HTTP client) with polling until a deadline.
//!
//! [`Xds::start_process`] runs the `marin3r` binary instead (signals, exit).
//!
//! Used by `tests/tests/xds_e2e.rs` and `tests/benches/edit_to_serve.rs`. Every address is
//! on 127.0.0.1. Nothing here panics: failures come back as `Err(String)` (the message is
//! meant for a human), so a bench can report them and exit non-zero while the
//! [`KillOnDrop`] in [`Envoy`] still kills Envoy.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use marin3r_certs::{Bundle, IssueOptions, issue};
use marin3r_control_plane::status::{EnvoyConfigReport, StatusReport};
use marin3r_sidecar::bootstrap::{ApiType, BootstrapOptions, write_files};
use marin3r_testkit::free_port;
use marin3r_testkit::http::Request;
use marin3r_testkit::wait::{POLL, poll_ok};
use marin3r_xds::AdsConfig;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};

use crate::in_process::{CertFiles, InProcess, bind_localhost};
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
    issue_bundle_for(&[])
}

/// [`issue_bundle`] with `more` names in the server certificate too.
pub fn issue_bundle_for(more: &[&str]) -> Result<Bundle, String> {
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    hosts.extend(more.iter().map(|h| h.to_string()));
    issue(&IssueOptions {
        hosts,
        ..IssueOptions::default()
    })
    .map_err(|e| format!("issue certificates: {e}"))
}

// ---------------------------------------------------------------------------------------
// The discovery service, in-process.

/// The discovery service running as a task of the current tokio runtime ([`InProcess`]),
/// serving a config folder in a temp dir (removed on drop; the task is aborted on drop).
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
    /// `None` when the service is a process ([`Xds::start_process`]) or stopped
    /// ([`Xds::stop_serving`]).
    server: Option<InProcess>,
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
        self.server
            .take()
            .ok_or("the discovery service is not running in-process")?
            .stop(Duration::from_secs(10))
            .await
    }
}

impl Xds {
    /// The `/status` report (local mode).
    pub async fn status(&self) -> Result<StatusReport, String> {
        let r = get(self.metrics, "/status").await?;
        if r.status != 200 {
            return Err(format!("GET /status: {} {}", r.status, r.body));
        }
        serde_json::from_str(&r.body).map_err(|e| format!("GET /status: {e}: {}", r.body))
    }

    /// The `/status` report (local mode) of the EnvoyConfig of `node_id`.
    pub async fn status_of(&self, node_id: &str) -> Result<EnvoyConfigReport, String> {
        let report = self.status().await?;
        report
            .envoy_configs
            .iter()
            .find(|ec| ec.node_id == node_id)
            .cloned()
            .ok_or_else(|| format!("no EnvoyConfig for {node_id} in {report:?}"))
    }

    /// `Ok` once the EnvoyConfig of `node_id` waits for a missing dependency (a Secret):
    /// its `CacheOutOfSync` condition says so.
    pub async fn waits_for_dependencies(&self, node_id: &str) -> Result<(), String> {
        let ec = self.status_of(node_id).await?;
        if ec
            .conditions
            .iter()
            .any(|c| c.status == "True" && c.message.contains("waits for its dependencies"))
        {
            Ok(())
        } else {
            Err(format!("not waiting: {:?}", ec.conditions))
        }
    }

    /// `Ok` once ADS streams of `node_id` are open, as `/metrics` counts them.
    pub async fn has_streams(&self, node_id: &str) -> Result<(), String> {
        let text = self.metrics_text().await?;
        let streams = metric_sum(&text, "marin3r_xdss_streams", &[("node_id", node_id)]);
        if streams >= 1.0 {
            Ok(())
        } else {
            Err(format!("{streams} streams of {node_id}"))
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

/// The prelude of the end-to-end tests: a started discovery service and an Envoy (SotW)
/// that serves a first answer.
pub struct Serving {
    pub xds: Xds,
    pub envoy: Envoy,
}

impl Serving {
    /// Starts an Envoy of `node` on `xds` and waits (up to [`CONVERGE`]) until
    /// `http://127.0.0.1:port/` answers `body`.
    pub async fn start(xds: Xds, node: &str, port: u16, body: &str) -> Result<Self, String> {
        let mut envoy = Envoy::start(&xds, node, ApiType::Sotw)?;
        envoy.wait_body(localhost(port), body, CONVERGE).await?;
        Ok(Self { xds, envoy })
    }
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

    /// Polls `probe` (the test kit's [`poll_ok`], every [`POLL`]) until it returns `Ok`,
    /// checking before each probe that Envoy is still up (an exit fails at once); after
    /// `timeout` the error names `what` and the probe's last error.
    pub async fn eventually<T, F, Fut>(
        &mut self,
        what: &str,
        timeout: Duration,
        probe: F,
    ) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        self.eventually_every(what, timeout, POLL, probe).await
    }

    /// [`Envoy::eventually`], probing every `every` (a benchmark's resolution).
    pub async fn eventually_every<T, F, Fut>(
        &mut self,
        what: &str,
        timeout: Duration,
        every: Duration,
        mut probe: F,
    ) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        // `Ok(Err(exit))` ends the polling: Envoy is gone, waiting longer is pointless.
        poll_ok(what, timeout, every, || {
            let step = self.check_running().map(|()| probe());
            async move {
                match step {
                    Err(exited) => Ok(Err(exited)),
                    Ok(probed) => probed.await.map(Ok),
                }
            }
        })
        .await?
    }

    /// Polls `GET http://addr/` until it answers 200 with `body`.
    pub async fn wait_body(
        &mut self,
        addr: SocketAddr,
        body: &str,
        timeout: Duration,
    ) -> Result<Response, String> {
        self.wait_body_every(addr, body, timeout, POLL).await
    }

    /// [`Envoy::wait_body`], probing every `every` (a benchmark's resolution).
    pub async fn wait_body_every(
        &mut self,
        addr: SocketAddr,
        body: &str,
        timeout: Duration,
        every: Duration,
    ) -> Result<Response, String> {
        let what = format!("GET {addr}/ → 200 {body:?}");
        self.eventually_every(&what, timeout, every, || async {
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
        let server = InProcess::launch(
            bind_localhost().await?,
            &CertFiles::in_dir(&certs_dir),
            AdsConfig::default(),
            backend(&config_dir),
        )
        .await?;
        Ok(Self {
            xdss: server.xdss,
            metrics: server.metrics,
            health: server.health,
            config_dir,
            certs_dir,
            bundle,
            server: Some(server),
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
                server: None,
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
        let target = XdsTarget {
            port: xds.xdss.port(),
            certs_dir: xds.certs_dir.clone(),
        };
        Self::start_at(&target, node_id, pod_name, api_type, current_dir, extras)
    }

    /// [`Envoy::start_with`] against any discovery service on 127.0.0.1: `target`'s port
    /// and certificates (several replicas behind a balancer, say).
    pub fn start_at(
        target: &XdsTarget,
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
            xdss_port: target.port,
            node_id: node_id.into(),
            cluster_id: node_id.into(),
            admin_bind_address: format!("127.0.0.1:{admin}"),
            admin_access_log_path: dir.path().join("admin.log").display().to_string(),
            client_certificate_path: target.certs_dir.join("client"),
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

/// Where an Envoy finds its discovery service: the ADS port on 127.0.0.1 and the folder
/// of certificates (`client/`, `ca/`, as `marin3r certs` writes them).
#[derive(Debug, Clone)]
pub struct XdsTarget {
    pub port: u16,
    pub certs_dir: PathBuf,
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
// Restarting the discovery service in place (hardening and fault tests).

impl Xds {
    /// Stops the in-process discovery service (its open ADS streams end with
    /// UNAVAILABLE; Envoys keep what they have and reconnect with their backoff), and
    /// returns how long the stop took. [`Xds::serve_again`] starts the next one; a test
    /// changes the config folder in between.
    pub async fn stop_serving(&mut self) -> Result<Duration, String> {
        let server = self
            .server
            .take()
            .ok_or("the discovery service is not running in-process")?;
        let stopping = Instant::now();
        server.stop(Duration::from_secs(15)).await?;
        Ok(stopping.elapsed())
    }

    /// Starts a new discovery service on the **same** ADS port, certificates and config
    /// folder, with the backend `backend` builds (metrics and probes move to new ports).
    pub async fn serve_again<B, F>(&mut self, backend: F) -> Result<(), String>
    where
        B: marin3r_control_plane::Backend,
        F: FnOnce(&Path) -> B,
    {
        if self.server.is_some() {
            return Err("the discovery service is still running".into());
        }
        let xdss = TcpListener::bind(self.xdss)
            .await
            .map_err(|e| format!("bind {} again: {e}", self.xdss))?;
        let server = InProcess::launch(
            xdss,
            &CertFiles::in_dir(&self.certs_dir),
            AdsConfig::default(),
            backend(&self.config_dir),
        )
        .await?;
        self.metrics = server.metrics;
        self.health = server.health;
        self.server = Some(server);
        Ok(())
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
