//! In-process tests of the HTTP handlers against a fake Envoy admin. End-to-end tests
//! with a real Envoy live in `tests/tests/shutdown_manager.rs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;

/// A fake Envoy admin: counts `POST /healthcheck/fail` (failing the first
/// `healthcheck_failures` with 503) and answers `/stats` from a script (the last entry
/// repeats).
#[derive(Default)]
struct FakeAdmin {
    healthcheck_calls: AtomicU32,
    healthcheck_failures: u32,
    stats_calls: AtomicU32,
    stats: Mutex<VecDeque<String>>,
}

impl FakeAdmin {
    fn new(healthcheck_failures: u32, stats: &[&str]) -> Arc<Self> {
        Arc::new(Self {
            healthcheck_failures,
            stats: Mutex::new(stats.iter().map(|s| s.to_string()).collect()),
            ..Self::default()
        })
    }

    fn healthcheck_calls(&self) -> u32 {
        self.healthcheck_calls.load(Ordering::SeqCst)
    }

    fn stats_calls(&self) -> u32 {
        self.stats_calls.load(Ordering::SeqCst)
    }
}

fn listener_stats(open: u64) -> String {
    format!(
        "listener.127.0.0.1_8080.downstream_cx_active: {open}\n\
         listener.127.0.0.1_8080.worker_0.downstream_cx_active: {open}\n\
         listener.admin.downstream_cx_active: 1\n"
    )
}

async fn start_fake_admin(fake: Arc<FakeAdmin>) -> String {
    let app = axum::Router::new()
        .route(
            "/healthcheck/fail",
            post(
                |axum::extract::State(f): axum::extract::State<Arc<FakeAdmin>>| async move {
                    let n = f.healthcheck_calls.fetch_add(1, Ordering::SeqCst);
                    if n < f.healthcheck_failures {
                        (StatusCode::SERVICE_UNAVAILABLE, "not yet")
                    } else {
                        (StatusCode::OK, "OK\n")
                    }
                },
            ),
        )
        .route(
            "/stats",
            get(
                |axum::extract::State(f): axum::extract::State<Arc<FakeAdmin>>| async move {
                    f.stats_calls.fetch_add(1, Ordering::SeqCst);
                    let mut script = f.stats.lock().unwrap();
                    if script.len() > 1 {
                        script.pop_front().unwrap()
                    } else {
                        script.front().cloned().unwrap_or_default()
                    }
                },
            ),
        )
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn fast_config(admin: &str, dir: &tempfile::TempDir) -> Config {
    Config {
        port: 0,
        bind_address: "127.0.0.1".parse().unwrap(),
        envoy_admin_address: admin.to_string(),
        ready_file: dir.path().join("shutdown-ok"),
        check_ready_interval: Duration::from_millis(20),
        check_drain_interval: Duration::from_millis(20),
        start_drain_delay: Duration::ZERO,
        check_drain_delay: Duration::ZERO,
        drain_timeout: Duration::from_secs(10),
        ready_timeout: Duration::from_secs(10),
        ..Config::default()
    }
}

async fn get_path(app: axum::Router, path: &str) -> (StatusCode, String, Option<String>) {
    let response = app
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let header = response
        .headers()
        .get(DRAIN_RESULT_HEADER)
        .map(|v| v.to_str().unwrap().to_string());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap(), header)
}

/// An address where nothing listens.
async fn dead_address() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

#[test]
fn defaults_match_the_flag_defaults() {
    let c = Config::default();
    assert_eq!(c.port, 8090);
    assert_eq!(c.bind_address.to_string(), "0.0.0.0");
    assert_eq!(c.envoy_admin_address, "http://localhost:9901");
    assert_eq!(c.ready_file, std::path::Path::new("/tmp/shutdown-ok"));
    assert_eq!(c.check_ready_interval, Duration::from_secs(1));
    assert_eq!(c.check_drain_interval, Duration::from_secs(5));
    assert_eq!(c.start_drain_delay, Duration::ZERO);
    assert_eq!(c.check_drain_delay, Duration::from_secs(15));
    assert_eq!(c.min_open_connections, 0);
    assert_eq!(c.min_drain_duration, Duration::ZERO);
    assert_eq!(c.drain_timeout, Duration::from_secs(300));
    assert_eq!(c.ready_timeout, Duration::from_secs(330));
    assert_eq!(c.envoy_gone_after, 3);
}

#[test]
fn invalid_configs_are_rejected() {
    let zero_ready = Config {
        check_ready_interval: Duration::ZERO,
        ..Config::default()
    };
    assert!(matches!(
        AppState::new(zero_ready),
        Err(ShutdownManagerError::InvalidConfig(_))
    ));
    let zero_drain = Config {
        check_drain_interval: Duration::ZERO,
        ..Config::default()
    };
    assert!(AppState::new(zero_drain).is_err());
    let https = Config {
        envoy_admin_address: "https://localhost:9901".into(),
        ..Config::default()
    };
    assert!(matches!(
        AppState::new(https),
        Err(ShutdownManagerError::InvalidAdminAddress { .. })
    ));
}

#[test]
fn error_chain_includes_sources() {
    let e = ShutdownManagerError::ReadyFile {
        path: "/x/y".into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such dir"),
    };
    assert_eq!(
        error_chain(&e),
        "cannot create ready file /x/y: no such dir"
    );
}

#[tokio::test]
async fn healthz_answers_ok() {
    let app = router(AppState::new(Config::default()).unwrap());
    let (status, body, _) = get_path(app, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "OK");
}

#[tokio::test]
async fn unknown_paths_are_404() {
    let app = router(AppState::new(Config::default()).unwrap());
    let (status, _, _) = get_path(app, "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn shutdown_answers_ok_when_the_ready_file_exists() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config("http://127.0.0.1:1", &dir);
    std::fs::write(&config.ready_file, "").unwrap();
    let (status, body, _) = get_path(router(AppState::new(config).unwrap()), "/shutdown").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
}

#[tokio::test]
async fn shutdown_waits_for_the_ready_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config("http://127.0.0.1:1", &dir);
    let file = config.ready_file.clone();
    let app = router(AppState::new(config).unwrap());
    let waiter = tokio::spawn(get_path(app, "/shutdown"));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!waiter.is_finished());
    std::fs::write(&file, "").unwrap();
    let (status, body, _) = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
}

#[tokio::test]
async fn shutdown_answers_500_after_the_ready_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        ready_timeout: Duration::from_millis(300),
        check_ready_interval: Duration::from_millis(200),
        ..fast_config("http://127.0.0.1:1", &dir)
    };
    let app = router(AppState::new(config).unwrap());
    let start = Instant::now();
    let (status, body, _) = get_path(app, "/shutdown").await;
    let took = start.elapsed();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("did not appear within 300ms"), "{body}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

#[tokio::test]
async fn drain_polls_until_connections_are_gone() {
    let fake = FakeAdmin::new(
        0,
        &[&listener_stats(2), &listener_stats(1), &listener_stats(0)],
    );
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config(&admin, &dir);
    let file = config.ready_file.clone();
    let (status, body, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 1);
    assert_eq!(fake.stats_calls(), 3);
    assert!(file.exists());
}

#[tokio::test]
async fn min_open_connections_ends_the_drain_early() {
    let fake = FakeAdmin::new(0, &[&listener_stats(5), &listener_stats(2)]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        min_open_connections: 2,
        ..fast_config(&admin, &dir)
    };
    let (status, _, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.stats_calls(), 2);
}

#[tokio::test]
async fn min_drain_duration_holds_the_drain() {
    let fake = FakeAdmin::new(0, &[&listener_stats(0)]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        min_drain_duration: Duration::from_millis(400),
        check_drain_interval: Duration::from_secs(5),
        ..fast_config(&admin, &dir)
    };
    let start = Instant::now();
    let (status, _, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    let took = start.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    // Held for the minimum duration, and the poll was moved up to its end instead of
    // waiting for the 5 s interval.
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(fake.stats_calls(), 2);
}

#[tokio::test]
async fn healthcheck_fail_is_retried() {
    let fake = FakeAdmin::new(2, &[&listener_stats(0)]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let (status, _, header) = get_path(
        router(AppState::new(fast_config(&admin, &dir)).unwrap()),
        "/drain",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 3);
    // Backoff 100 ms + 200 ms.
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn healthcheck_fail_retries_are_bounded() {
    let fake = FakeAdmin::new(u32::MAX, &[&listener_stats(0)]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        // Skipped because the health check never failed.
        check_drain_delay: Duration::from_secs(60),
        ..fast_config(&admin, &dir)
    };
    let (status, _, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), HEALTHCHECK_FAIL_ATTEMPTS);
}

#[tokio::test]
async fn concurrent_drains_join_one_drain() {
    let fake = FakeAdmin::new(
        0,
        &[
            &listener_stats(1),
            &listener_stats(1),
            &listener_stats(1),
            &listener_stats(0),
        ],
    );
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let app = router(AppState::new(fast_config(&admin, &dir)).unwrap());
    let first = tokio::spawn(get_path(app.clone(), "/drain"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = tokio::spawn(get_path(app.clone(), "/drain"));
    let (a, b) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(a.0, StatusCode::OK);
    assert_eq!(b.0, StatusCode::OK);
    assert_eq!(a.2.as_deref(), Some("drained"));
    assert_eq!(b.2.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 1);
    let polls = fake.stats_calls();
    // A drain after the finished one answers at once with the same result.
    let (status, _, header) = get_path(app, "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 1);
    assert_eq!(fake.stats_calls(), polls);
}

#[tokio::test]
async fn drain_timeout_finishes_the_drain() {
    let fake = FakeAdmin::new(0, &[&listener_stats(3)]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        drain_timeout: Duration::from_millis(300),
        ..fast_config(&admin, &dir)
    };
    let file = config.ready_file.clone();
    let start = Instant::now();
    let (status, _, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("timeout"));
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(file.exists());
}

#[tokio::test]
async fn drain_timeout_cuts_the_delays_short() {
    let fake = FakeAdmin::new(0, &[&listener_stats(0)]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        drain_timeout: Duration::from_millis(200),
        check_drain_delay: Duration::from_secs(60),
        ..fast_config(&admin, &dir)
    };
    let start = Instant::now();
    let (status, _, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("timeout"));
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(fake.stats_calls(), 0);
}

#[tokio::test]
async fn unreachable_admin_means_envoy_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config(&dead_address().await, &dir);
    let file = config.ready_file.clone();
    let (status, _, header) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("envoy-gone"));
    assert!(file.exists());
}

#[tokio::test]
async fn garbage_stats_count_as_failed_polls() {
    let fake = FakeAdmin::new(0, &["<html>not envoy</html>"]);
    let admin = start_fake_admin(fake.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let (status, _, header) = get_path(
        router(AppState::new(fast_config(&admin, &dir)).unwrap()),
        "/drain",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("envoy-gone"));
    assert_eq!(fake.stats_calls(), 3);
}

#[tokio::test]
async fn unwritable_ready_file_answers_500() {
    let fake = FakeAdmin::new(0, &[&listener_stats(0)]);
    let admin = start_fake_admin(fake).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        ready_file: dir.path().join("missing-dir").join("shutdown-ok"),
        ..fast_config(&admin, &dir)
    };
    let (status, body, _) = get_path(router(AppState::new(config).unwrap()), "/drain").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("cannot create ready file"), "{body}");
}

#[tokio::test]
async fn admin_client_reads_open_connections() {
    let fake = FakeAdmin::new(0, &[&listener_stats(7)]);
    let admin = start_fake_admin(fake).await;
    let client = AdminClient::new(&admin, Duration::from_secs(1)).unwrap();
    assert_eq!(client.open_connections().await.unwrap(), 7);
    client.fail_healthcheck().await.unwrap();
}

#[tokio::test]
async fn admin_client_times_out() {
    // Accepts connections but never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = listener.accept().await.unwrap();
            held.push(s);
        }
    });
    let client = AdminClient::new(&addr.to_string(), Duration::from_millis(200)).unwrap();
    let err = client.open_connections().await.unwrap_err();
    assert!(
        matches!(err, ShutdownManagerError::AdminTimeout { .. }),
        "{err}"
    );
    holder.abort();
}

#[tokio::test]
async fn admin_client_reports_bad_status() {
    let fake = FakeAdmin::new(1, &[]);
    let admin = start_fake_admin(fake).await;
    let client = AdminClient::new(&admin, Duration::from_secs(1)).unwrap();
    let err = client.fail_healthcheck().await.unwrap_err();
    assert!(
        matches!(err, ShutdownManagerError::AdminStatus { status: 503, .. }),
        "{err}"
    );
}

/// Serves on port 0 with a stop channel; returns the base URL, the stop sender and the
/// server task.
async fn start_server(
    config: Config,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), ShutdownManagerError>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, config, async move {
        let _ = rx.await;
    }));
    (url, tx, task)
}

/// A plain GET on a fresh connection.
async fn http_get(url: &str) -> (u16, String) {
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(
            Request::get(path)
                .header("host", "x")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn serve_stops_gracefully_and_answers_blocked_requests() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config(&dead_address().await, &dir);
    let (url, stop, task) = start_server(config).await;
    assert_eq!(
        http_get(&format!("{url}/healthz")).await,
        (200, "OK".into())
    );
    let waiting = tokio::spawn(http_get_owned(format!("{url}/shutdown")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    let start = Instant::now();
    stop.send(()).unwrap();
    let (status, body) = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status, body.as_str()), (503, "shutting down"));
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(1));
}

async fn http_get_owned(url: String) -> (u16, String) {
    http_get(&url).await
}

#[tokio::test]
async fn stale_ready_file_is_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config(&dead_address().await, &dir);
    std::fs::write(&config.ready_file, "").unwrap();
    let file = config.ready_file.clone();
    let (url, stop, task) = start_server(config).await;
    assert_eq!(http_get(&format!("{url}/healthz")).await.0, 200);
    assert!(!file.exists());
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn run_reports_bind_errors() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Config {
        port: taken.local_addr().unwrap().port(),
        bind_address: "127.0.0.1".parse().unwrap(),
        ..Config::default()
    };
    let err = run(config, async {}).await.unwrap_err();
    assert!(matches!(err, ShutdownManagerError::Bind { .. }), "{err}");
}
