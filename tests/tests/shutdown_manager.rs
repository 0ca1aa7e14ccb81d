//! End-to-end tests of the shutdown manager against a real Envoy (design.md §5,
//! walkthrough 3).
//!
//! Each test starts its own Envoy (admin, an HTTP listener with a direct response and a
//! TCP proxy listener in front of a local echo server, all on 127.0.0.1 port 0: Envoy
//! picks the ports and the test reads them back) and runs the shutdown manager
//! in-process on port 0 with short intervals. Envoy is killed on drop, also when a test
//! fails; its log is printed then.
//!
//! Timing is not bounded here (a real Envoy under load is not a clock): these tests check
//! behaviour and order through the shutdown manager's logs, and the exact timing of the
//! same logic is checked on tokio's paused clock in `shutdown-manager/src/tests.rs`.

// Test-only file: clippy's allow-*-in-tests does not cover the helper functions here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use marin3r_shutdown_manager::{Config, DRAIN_RESULT_HEADER, ShutdownManagerError, serve};
use marin3r_testkit::http::{Request, Response, get};
use marin3r_testkit::{free_port, wait_until, wait_until_some};
use marin3r_tests::{KillOnDrop, envoy_bin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------------------
// Captured JSON logs (one global subscriber for the whole test binary; tests filter by
// their own Envoy admin address or ready file path).

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn init_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::INFO)
            .with_writer(|| LogWriter)
            .init();
    });
}

/// Parsed JSON log lines that mention `needle` (anywhere, spans included).
fn logs_mentioning(needle: &str) -> Vec<serde_json::Value> {
    let logs = LOGS.lock().unwrap();
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| l.contains(needle))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn message(line: &serde_json::Value) -> &str {
    line["fields"]["message"].as_str().unwrap_or_default()
}

/// How many of `lines` have `message`.
fn count(lines: &[serde_json::Value], message_text: &str) -> usize {
    lines.iter().filter(|l| message(l) == message_text).count()
}

/// Index of the first of `lines` with `message` (panics when none has it).
fn position(lines: &[serde_json::Value], message_text: &str) -> usize {
    lines
        .iter()
        .position(|l| message(l) == message_text)
        .unwrap_or_else(|| panic!("no log {message_text:?}"))
}

/// The drain ended at the first poll after the connections closed: every poll but the
/// last saw `open`, the last saw none.
fn assert_ended_at_first_empty_poll(counts: &[u64], open: u64) {
    let (last, before) = counts.split_last().expect("no polls");
    assert_eq!(*last, 0, "{counts:?}");
    assert!(before.iter().all(|&n| n == open), "{counts:?}");
}

/// The `open_connections` values of the "polled open connections" logs of the drain
/// against `admin_url`, checking `min_connections` on the way.
fn polled_counts(admin_url: &str, min_connections: u64) -> Vec<u64> {
    logs_mentioning(&format!("\"envoy_admin\":\"{admin_url}\""))
        .iter()
        .filter(|l| message(l) == "polled open connections")
        .map(|l| {
            assert_eq!(l["fields"]["min_connections"], min_connections, "{l}");
            assert_eq!(l["level"], "INFO", "{l}");
            l["fields"]["open_connections"].as_u64().unwrap()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Envoy.

struct Envoy {
    process: KillOnDrop,
    admin: SocketAddr,
    http: SocketAddr,
    tcp: SocketAddr,
    log: PathBuf,
    _echo: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Envoy {
    fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// Envoy's `/ready`: (status, body).
    async fn ready(&self) -> (u16, String) {
        let r = get(self.admin, "/ready").await.unwrap();
        (r.status, r.body)
    }

    /// Open connections Envoy counts on its HTTP listener.
    async fn http_connections(&self) -> u64 {
        // The listener's stat_prefix (its address would say port 0).
        let gauge = "listener.http.downstream_cx_active: ";
        let stats = get(self.admin, "/stats?filter=downstream_cx_active")
            .await
            .unwrap()
            .body;
        stats
            .lines()
            .find_map(|l| l.strip_prefix(gauge))
            .map(|n| n.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no {gauge:?} in {stats}"))
    }

    fn kill(&mut self) {
        self.process.child.kill().unwrap();
        self.process.child.wait().unwrap();
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("---- envoy log ----\n{log}\n-------------------");
        }
    }
}

/// A TCP echo server (the TCP proxy's upstream).
async fn start_echo() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, task)
}

/// Every address on port 0: Envoy binds free ports itself (see [`start_envoy`]).
fn envoy_yaml(echo: SocketAddr) -> String {
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:
  - name: http
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    enable_reuse_port: false
    stat_prefix: http
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress_http
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                direct_response: {{status: 200, body: {{inline_string: "ok"}}}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: tcp
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    enable_reuse_port: false
    stat_prefix: tcp
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: tcp
          cluster: echo
  clusters:
  - name: echo
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: echo
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {echo_port}}}}}}}
"#,
        echo_port = echo.port()
    )
}

/// Starts Envoy and waits until its admin says LIVE and both listeners accept.
///
/// Envoy binds port 0 everywhere and the test reads the ports back (admin from
/// `--admin-address-path`, listeners from `/listeners?format=json`). Ports picked by the
/// test with `free_port` were a race: Envoy binds listeners with `SO_REUSEPORT` by
/// default, so when two tests' Envoys got the same free port both started and the kernel
/// spread connections between them; a test's client connection could then be open on the
/// other test's Envoy while its own Envoy counted none.
async fn start_envoy() -> Envoy {
    let dir = tempfile::tempdir().unwrap();
    let (echo, echo_task) = start_echo().await;
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, envoy_yaml(echo)).unwrap();
    let admin_path = dir.path().join("admin-address");
    let log = dir.path().join("envoy.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut process = KillOnDrop::spawn(
        "envoy",
        Command::new(envoy_bin())
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args([
                "--use-dynamic-base-id",
                "--disable-hot-restart",
                "--concurrency",
                "2",
                "--log-level",
                "info",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file)),
    )
    .unwrap();
    let within = Duration::from_secs(30);
    let admin: SocketAddr = wait_until_some("envoy's admin address", within, || {
        if let Some(status) = process.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("envoy exited early: {status}\n{log}");
        }
        std::fs::read_to_string(&admin_path)
            .ok()?
            .trim()
            .parse()
            .ok()
    })
    .await;
    let listeners = Arc::new(Mutex::new(None));
    marin3r_testkit::wait_until_async("envoy ready with both listeners", within, || {
        let found = listeners.clone();
        async move {
            let ready = get(admin, "/ready").await.is_ok_and(|r| r.status == 200);
            let bound = get(admin, "/listeners?format=json")
                .await
                .ok()
                .and_then(|l| listener_addresses(&l.body));
            let done = ready && bound.is_some();
            *found.lock().unwrap() = bound;
            done
        }
    })
    .await;
    let (http, tcp) = listeners.lock().unwrap().unwrap();
    assert!(port_open(http).await && port_open(tcp).await);
    Envoy {
        process,
        admin,
        http,
        tcp,
        log,
        _echo: echo_task,
        _dir: dir,
    }
}

/// The bound addresses of the `http` and `tcp` listeners in `/listeners?format=json`.
fn listener_addresses(json: &str) -> Option<(SocketAddr, SocketAddr)> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let address = |name: &str| -> Option<SocketAddr> {
        let l = v["listener_statuses"]
            .as_array()?
            .iter()
            .find(|l| l["name"] == name)?;
        let a = &l["local_address"]["socket_address"];
        let port = u16::try_from(a["port_value"].as_u64()?).ok()?;
        let ip = a["address"].as_str()?.parse().ok()?;
        (port != 0).then(|| SocketAddr::new(ip, port))
    };
    Some((address("http")?, address("tcp")?))
}

async fn port_open(addr: SocketAddr) -> bool {
    TcpStream::connect(addr).await.is_ok()
}

/// A client connection that made one keep-alive request through Envoy's HTTP listener
/// and now sits idle, like the walkthrough's telnet session.
async fn idle_keepalive_connection(envoy: &Envoy) -> TcpStream {
    let mut stream = TcpStream::connect(envoy.http).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: example.com\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !(buf.starts_with(b"HTTP/1.1 200") && buf.ends_with(b"\r\n\r\nok")) {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "envoy closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
    // This Envoy holds it (not only the kernel's accept queue): the drain must see it.
    assert_eq!(envoy.http_connections().await, 1);
    stream
}

/// A connection through Envoy's TCP proxy to the echo server, verified by an echo.
async fn tcp_proxy_connection(envoy: &Envoy) -> TcpStream {
    let mut stream = TcpStream::connect(envoy.tcp).await.unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ping");
    stream
}

// ---------------------------------------------------------------------------------------
// The shutdown manager, in-process.

struct Manager {
    addr: SocketAddr,
    ready_file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ShutdownManagerError>>>,
    _dir: tempfile::TempDir,
}

impl Manager {
    /// `GET path` in the background (`/drain` and `/shutdown` block; bounded by 60 s).
    fn spawn_get(&self, path: &'static str) -> JoinHandle<Result<Response, String>> {
        let request = Request::get(path).timeout(Duration::from_secs(60));
        tokio::spawn(request.send(self.addr))
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("graceful stop")
                .unwrap()
                .unwrap();
        }
    }
}

/// Test defaults: fast polls, no delays; `tweak` adjusts.
async fn start_manager(envoy_admin: &str, tweak: impl FnOnce(&mut Config)) -> Manager {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        port: 0,
        bind_address: "127.0.0.1".parse().unwrap(),
        envoy_admin_address: envoy_admin.to_string(),
        ready_file: dir.path().join("shutdown-ok"),
        check_ready_interval: Duration::from_millis(200),
        check_drain_interval: Duration::from_millis(200),
        start_drain_delay: Duration::ZERO,
        check_drain_delay: Duration::ZERO,
        drain_timeout: Duration::from_secs(60),
        ready_timeout: Duration::from_secs(90),
        ..Config::default()
    };
    tweak(&mut config);
    let ready_file = config.ready_file.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, config, async move {
        let _ = stopped.await;
    }));
    Manager {
        addr,
        ready_file,
        stop: Some(stop),
        task: Some(task),
        _dir: dir,
    }
}

async fn join<T>(task: JoinHandle<Result<T, String>>, within: Duration) -> T {
    tokio::time::timeout(within, task)
        .await
        .expect("request did not finish in time")
        .unwrap()
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// Tests.

/// Journey 3: an idle keep-alive connection holds `/drain` and `/shutdown`; Envoy's
/// `/ready` is 503 meanwhile; closing it finishes both within one check interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keepalive_connection_holds_drain_and_shutdown_until_closed() {
    let envoy = start_envoy().await;
    let interval = Duration::from_secs(1);
    let ready_interval = Duration::from_millis(200);
    let manager = start_manager(&envoy.admin_url(), |c| {
        c.check_drain_interval = interval;
        c.check_ready_interval = ready_interval;
    })
    .await;
    let client = idle_keepalive_connection(&envoy).await;

    let drain = manager.spawn_get("/drain");
    let shutdown = manager.spawn_get("/shutdown");
    wait_until(
        "two polls that see the connection",
        Duration::from_secs(10),
        || polled_counts(&envoy.admin_url(), 0).len() >= 2,
    )
    .await;
    assert!(polled_counts(&envoy.admin_url(), 0).iter().all(|&n| n == 1));
    assert!(!drain.is_finished(), "/drain must block");
    assert!(!shutdown.is_finished(), "/shutdown must block");
    assert!(!manager.ready_file.exists());
    assert_eq!(envoy.ready().await, (503, "DRAINING\n".to_string()));
    let waiting = format!(
        "file {} does not exist, recheck in 200ms",
        manager.ready_file.display()
    );
    assert!(
        logs_mentioning(&manager.ready_file.display().to_string())
            .iter()
            .any(|l| message(l) == waiting),
        "missing log {waiting:?}"
    );

    drop(client);
    let drained = join(drain, Duration::from_secs(10)).await;
    assert_eq!((drained.status, drained.body.as_str()), (200, "OK"));
    assert_eq!(drained.header(DRAIN_RESULT_HEADER), Some("drained"));
    // Finished at the first poll after the close (the timing, within one interval, is
    // `drain_and_shutdown_end_within_one_interval_of_the_close` on the paused clock).
    assert_ended_at_first_empty_poll(&polled_counts(&envoy.admin_url(), 0), 1);
    let shut = join(shutdown, Duration::from_secs(10)).await;
    assert_eq!((shut.status, shut.body.as_str()), (200, "OK"));
    assert!(manager.ready_file.exists());
    // `/shutdown` answered because the drain created the file, not before.
    let ready_file_logs = logs_mentioning(&manager.ready_file.display().to_string());
    assert!(
        position(&ready_file_logs, "ready file created")
            < position(&ready_file_logs, "ready file exists, envoy may shut down")
    );
    manager.stop().await;
}

/// Connections through a TCP proxy listener count as open connections too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_proxy_connections_are_counted() {
    let envoy = start_envoy().await;
    let interval = Duration::from_millis(300);
    let manager = start_manager(&envoy.admin_url(), |c| c.check_drain_interval = interval).await;
    let first = tcp_proxy_connection(&envoy).await;
    let second = tcp_proxy_connection(&envoy).await;

    let drain = manager.spawn_get("/drain");
    wait_until(
        "two polls that see both connections",
        Duration::from_secs(10),
        || polled_counts(&envoy.admin_url(), 0).len() >= 2,
    )
    .await;
    assert!(polled_counts(&envoy.admin_url(), 0).iter().all(|&n| n == 2));
    drop(first);
    wait_until(
        "a poll that sees one connection",
        Duration::from_secs(5),
        || polled_counts(&envoy.admin_url(), 0).last() == Some(&1),
    )
    .await;
    assert!(!drain.is_finished());
    let before_close = polled_counts(&envoy.admin_url(), 0).len();
    drop(second);
    let drained = join(drain, Duration::from_secs(5)).await;
    assert_eq!(drained.status, 200);
    assert_eq!(drained.header(DRAIN_RESULT_HEADER), Some("drained"));
    // Finished at the first poll after the second close.
    let counts = polled_counts(&envoy.admin_url(), 0);
    assert_ended_at_first_empty_poll(&counts[before_close - 1..], 1);
    assert!(manager.ready_file.exists());
    manager.stop().await;
}

/// The drain timeout ends the drain with the connection still open; `/shutdown` follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_finishes_with_a_connection_open() {
    let envoy = start_envoy().await;
    let timeout = Duration::from_millis(1500);
    let manager = start_manager(&envoy.admin_url(), |c| c.drain_timeout = timeout).await;
    let _client = idle_keepalive_connection(&envoy).await;

    let start = Instant::now();
    let drain = manager.spawn_get("/drain");
    let shutdown = manager.spawn_get("/shutdown");
    let drained = join(drain, Duration::from_secs(10)).await;
    let took = start.elapsed();
    assert_eq!(drained.status, 200);
    assert_eq!(drained.header(DRAIN_RESULT_HEADER), Some("timeout"));
    // Not earlier than the timeout (that it ends exactly there is
    // `drain_timeout_finishes_the_drain` on the paused clock).
    assert!(took >= timeout, "{took:?}");
    assert_eq!(
        count(
            &logs_mentioning(&format!("\"envoy_admin\":\"{}\"", envoy.admin_url())),
            "drain finished: drain timeout expired"
        ),
        1
    );
    assert!(manager.ready_file.exists());
    let shut = join(shutdown, Duration::from_secs(2)).await;
    assert_eq!(shut.status, 200);
    // Every poll still saw the connection.
    let counts = polled_counts(&envoy.admin_url(), 0);
    assert!(
        !counts.is_empty() && counts.iter().all(|&n| n == 1),
        "{counts:?}"
    );
    manager.stop().await;
}

/// `/shutdown` answers 500 after the ready timeout while the drain is still held open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_timeout_answers_500() {
    let envoy = start_envoy().await;
    let timeout = Duration::from_millis(800);
    let manager = start_manager(&envoy.admin_url(), |c| c.ready_timeout = timeout).await;
    let client = idle_keepalive_connection(&envoy).await;

    let drain = manager.spawn_get("/drain");
    let start = Instant::now();
    let shut = join(manager.spawn_get("/shutdown"), Duration::from_secs(5)).await;
    let took = start.elapsed();
    assert_eq!(shut.status, 500);
    assert!(
        shut.body.contains("did not appear within 800ms"),
        "{}",
        shut.body
    );
    // Not earlier than the timeout (that it answers exactly there is
    // `shutdown_answers_500_after_the_ready_timeout` on the paused clock).
    assert!(took >= timeout, "{took:?}");
    assert!(!drain.is_finished());
    assert!(!manager.ready_file.exists());

    drop(client);
    assert_eq!(join(drain, Duration::from_secs(5)).await.status, 200);
    manager.stop().await;
}

/// No Envoy at the admin address: the drain treats Envoy as gone and still finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_not_running_finishes_the_drain() {
    let nobody = format!("http://127.0.0.1:{}", free_port().unwrap());
    let manager = start_manager(&nobody, |c| c.envoy_gone_after = 3).await;
    let drained = join(manager.spawn_get("/drain"), Duration::from_secs(10)).await;
    assert_eq!(drained.status, 200);
    assert_eq!(drained.header(DRAIN_RESULT_HEADER), Some("envoy-gone"));
    assert!(manager.ready_file.exists());
    let shut = join(manager.spawn_get("/shutdown"), Duration::from_secs(2)).await;
    assert_eq!(shut.status, 200);
    // Every health-check retry, then three failed polls (the timing, 1.5 s of retries
    // and two intervals, is `a_gone_envoy_ends_the_drain_after_the_retries_and_three_polls`
    // on the paused clock).
    let drain_logs = logs_mentioning(&format!("\"envoy_admin\":\"{nobody}\""));
    assert_eq!(
        count(&drain_logs, "cannot fail envoy health check, retrying"),
        4
    );
    assert_eq!(
        count(
            &drain_logs,
            "cannot fail envoy health check, giving up and polling connections"
        ),
        1
    );
    assert_eq!(
        count(&drain_logs, "cannot poll open connections from envoy admin"),
        3
    );
    manager.stop().await;
}

/// Envoy exiting in the middle of a drain (connections still open) ends the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_exiting_during_the_drain_finishes_it() {
    let mut envoy = start_envoy().await;
    let manager = start_manager(&envoy.admin_url(), |_| {}).await;
    let _client = idle_keepalive_connection(&envoy).await;
    let drain = manager.spawn_get("/drain");
    wait_until("a poll", Duration::from_secs(10), || {
        !polled_counts(&envoy.admin_url(), 0).is_empty()
    })
    .await;
    assert!(!drain.is_finished());
    envoy.kill();
    let drained = join(drain, Duration::from_secs(5)).await;
    assert_eq!(drained.status, 200);
    assert_eq!(drained.header(DRAIN_RESULT_HEADER), Some("envoy-gone"));
    assert!(manager.ready_file.exists());
    manager.stop().await;
}

/// Envoy's admin on a non-default port, given in the accepted address forms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_default_admin_port_in_all_address_forms() {
    let envoy = start_envoy().await;
    assert_ne!(envoy.admin.port(), 9901);
    for address in [
        envoy.admin_url(),
        format!("{}/", envoy.admin_url()),
        envoy.admin.to_string(),
    ] {
        let manager = start_manager(&address, |_| {}).await;
        let client = idle_keepalive_connection(&envoy).await;
        let drain = manager.spawn_get("/drain");
        wait_until(
            format!("a poll through {address} that sees the connection"),
            Duration::from_secs(10),
            || polled_counts(&envoy.admin_url(), 0).last() == Some(&1),
        )
        .await;
        assert_eq!(envoy.ready().await.0, 503, "{address}");
        drop(client);
        let drained = join(drain, Duration::from_secs(5)).await;
        assert_eq!(
            drained.header(DRAIN_RESULT_HEADER),
            Some("drained"),
            "{address}"
        );
        manager.stop().await;
    }
}

/// While draining under a steady request load (fresh and keep-alive connections), no
/// request fails; Envoy answers `connection: close` once draining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_fails_while_draining_under_load() {
    let envoy = start_envoy().await;
    // The load (~2 s) runs entirely inside the minimum drain duration.
    let manager = start_manager(&envoy.admin_url(), |c| {
        c.min_drain_duration = Duration::from_secs(3);
    })
    .await;

    let ok = Arc::new(AtomicU32::new(0));
    let closes = Arc::new(AtomicU32::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for worker in 0..4u32 {
        let (ok, closes, failures) = (ok.clone(), closes.clone(), failures.clone());
        let target = envoy.http;
        workers.push(tokio::spawn(async move {
            let keepalive: hyper_util::client::legacy::Client<_, Empty<Bytes>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http();
            for i in 0..50 {
                let result = if worker % 2 == 0 {
                    get(target, "/").await
                } else {
                    let uri: hyper::Uri = format!("http://{target}/").parse().unwrap();
                    match keepalive.get(uri).await {
                        Ok(r) => Response::read(r).await,
                        Err(e) => Err(format!("{e:?}")),
                    }
                };
                match result {
                    Ok(r) if r.status == 200 && r.body == "ok" => {
                        ok.fetch_add(1, Ordering::SeqCst);
                        if r.connection_close() {
                            closes.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Ok(r) => failures
                        .lock()
                        .unwrap()
                        .push(format!("worker {worker} #{i}: status {}", r.status)),
                    Err(e) => failures
                        .lock()
                        .unwrap()
                        .push(format!("worker {worker} #{i}: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        }));
    }
    // The load is running (as many requests answered as there are workers) before the
    // drain begins.
    wait_until("the load running", Duration::from_secs(10), || {
        ok.load(Ordering::SeqCst) + failures.lock().unwrap().len() as u32 >= 4
    })
    .await;
    let drain = manager.spawn_get("/drain");
    for w in workers {
        w.await.unwrap();
    }
    assert!(!drain.is_finished(), "the load must run inside the drain");
    let drained = join(drain, Duration::from_secs(10)).await;
    assert_eq!(drained.header(DRAIN_RESULT_HEADER), Some("drained"));
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert_eq!(ok.load(Ordering::SeqCst), 200);
    assert!(
        closes.load(Ordering::SeqCst) > 0,
        "envoy never answered `connection: close`: was it draining?"
    );
    manager.stop().await;
}

/// Stopping the server (what SIGTERM does through the CLI) answers blocked requests and
/// returns promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_answers_blocked_requests() {
    let envoy = start_envoy().await;
    let manager = start_manager(&envoy.admin_url(), |_| {}).await;
    let _client = idle_keepalive_connection(&envoy).await;
    let drain = manager.spawn_get("/drain");
    let shutdown = manager.spawn_get("/shutdown");
    wait_until("a poll", Duration::from_secs(10), || {
        !polled_counts(&envoy.admin_url(), 0).is_empty()
    })
    .await;
    let ready_file = manager.ready_file.clone();
    // Answers without waiting for the 60 s drain timeout (that it is at once is
    // `begin_shutdown_answers_blocked_requests_at_once` on the paused clock).
    manager.stop().await;
    assert_eq!(join(drain, Duration::from_secs(2)).await.status, 503);
    assert_eq!(join(shutdown, Duration::from_secs(2)).await.status, 503);
    assert!(!ready_file.exists());
}
