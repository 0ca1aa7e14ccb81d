//! In-process tests of the HTTP handlers. The drain and `/shutdown` tests run on tokio's
//! paused clock against an in-memory fake Envoy admin (no socket), so every interval,
//! backoff and timeout is checked exactly in virtual time. The admin client and `serve`
//! are tested over real sockets, without timing bounds. End-to-end tests with a real
//! Envoy live in `tests/tests/shutdown_manager.rs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use marin3r_testkit::http::get_url;
use tokio::time::Instant;
use tower::ServiceExt;

use super::*;
use crate::envoy::{Admin, AdminCall};

/// A fake Envoy admin: counts `POST /healthcheck/fail` (failing the first
/// `healthcheck_failures`) and answers `/stats` from a script (the last entry repeats),
/// parsed by the real stats parser. `gone` fails every call, like an Envoy that exited.
#[derive(Default)]
struct FakeAdmin {
    healthcheck_calls: AtomicU32,
    healthcheck_failures: u32,
    stats_calls: AtomicU32,
    stats: Mutex<VecDeque<String>>,
    gone: bool,
}

impl FakeAdmin {
    fn new(healthcheck_failures: u32, stats: &[&str]) -> Arc<Self> {
        Arc::new(Self {
            healthcheck_failures,
            stats: Mutex::new(stats.iter().map(|s| s.to_string()).collect()),
            ..Self::default()
        })
    }

    fn gone() -> Arc<Self> {
        Arc::new(Self {
            gone: true,
            ..Self::default()
        })
    }

    fn healthcheck_calls(&self) -> u32 {
        self.healthcheck_calls.load(Ordering::SeqCst)
    }

    fn stats_calls(&self) -> u32 {
        self.stats_calls.load(Ordering::SeqCst)
    }

    /// Whether this `POST /healthcheck/fail` succeeds.
    fn healthcheck(&self) -> bool {
        let n = self.healthcheck_calls.fetch_add(1, Ordering::SeqCst);
        !self.gone && n >= self.healthcheck_failures
    }

    /// A scripted error status instead of the next `/stats` body (`status:503`).
    fn next_status(&self) -> Option<u16> {
        let script = self.stats.lock().unwrap();
        let status = script.front()?.strip_prefix("status:")?.parse().ok()?;
        drop(script);
        self.next_stats();
        Some(status)
    }

    /// The next `/stats` body.
    fn next_stats(&self) -> String {
        self.stats_calls.fetch_add(1, Ordering::SeqCst);
        let mut script = self.stats.lock().unwrap();
        if script.len() > 1 {
            script.pop_front().unwrap()
        } else {
            script.front().cloned().unwrap_or_default()
        }
    }

    fn unavailable() -> ShutdownManagerError {
        ShutdownManagerError::AdminStatus {
            url: "fake".into(),
            status: 503,
            body: "not yet".into(),
        }
    }
}

impl Admin for FakeAdmin {
    fn base(&self) -> &str {
        "http://fake-admin"
    }
    fn fail_healthcheck(&self) -> AdminCall<'_, ()> {
        let ok = self.healthcheck();
        Box::pin(async move { if ok { Ok(()) } else { Err(Self::unavailable()) } })
    }
    fn open_connections(&self) -> AdminCall<'_, u64> {
        let result = if self.gone {
            self.stats_calls.fetch_add(1, Ordering::SeqCst);
            Err(ShutdownManagerError::AdminTimeout {
                url: "fake".into(),
                timeout: Duration::from_secs(1),
            })
        } else if let Some(status) = self.next_status() {
            Err(ShutdownManagerError::AdminStatus {
                url: "fake".into(),
                status,
                body: "<html>Service Unavailable</html>".into(),
            })
        } else {
            crate::stats::open_connections(&self.next_stats())
        };
        Box::pin(async move { result })
    }
}

fn listener_stats(open: u64) -> String {
    format!(
        "listener.127.0.0.1_8080.downstream_cx_active: {open}\n\
         listener.127.0.0.1_8080.worker_0.downstream_cx_active: {open}\n\
         listener.admin.downstream_cx_active: 1\n"
    )
}

/// Serves `fake` over HTTP (for the tests of the real admin client).
async fn start_fake_admin(fake: Arc<FakeAdmin>) -> String {
    let app = axum::Router::new()
        .route(
            "/healthcheck/fail",
            post(
                |axum::extract::State(f): axum::extract::State<Arc<FakeAdmin>>| async move {
                    if f.healthcheck() {
                        (StatusCode::OK, "OK\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not yet")
                    }
                },
            ),
        )
        .route(
            "/stats",
            get(
                |axum::extract::State(f): axum::extract::State<Arc<FakeAdmin>>| async move {
                    f.next_stats()
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

/// The router over `fake` with `config` (tweaked by the test).
fn app(fake: &Arc<FakeAdmin>, config: Config) -> axum::Router {
    router(AppState::with_admin(config, fake.clone()))
}

/// Status, body and drain-result header of an answer.
type Answer = (StatusCode, String, Option<String>);

async fn get_path(app: axum::Router, path: &str) -> Answer {
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

/// `GET path` in a task; also returns how long (in tokio time) it took from `start`.
fn spawn_get(
    app: axum::Router,
    path: &'static str,
    start: Instant,
) -> tokio::task::JoinHandle<(Answer, Duration)> {
    tokio::spawn(async move {
        let answer = get_path(app, path).await;
        (answer, start.elapsed())
    })
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
        marin3r_wire::error_chain(&e),
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

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_ready_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config("http://127.0.0.1:1", &dir);
    let interval = config.check_ready_interval;
    let file = config.ready_file.clone();
    let waiter = spawn_get(app(&FakeAdmin::gone(), config), "/shutdown", Instant::now());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!waiter.is_finished());
    std::fs::write(&file, "").unwrap();
    let written = Instant::now();
    let ((status, body, _), _) = waiter.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
    // Noticed at the next check.
    assert!(written.elapsed() <= interval, "{:?}", written.elapsed());
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_500_after_the_ready_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        ready_timeout: Duration::from_millis(300),
        check_ready_interval: Duration::from_millis(200),
        ..fast_config("http://127.0.0.1:1", &dir)
    };
    let start = Instant::now();
    let (status, body, _) = get_path(app(&FakeAdmin::gone(), config), "/shutdown").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("did not appear within 300ms"), "{body}");
    // Checks at 0 and 200 ms, the last one moved up to the timeout.
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn drain_polls_until_connections_are_gone() {
    let fake = FakeAdmin::new(
        0,
        &[&listener_stats(2), &listener_stats(1), &listener_stats(0)],
    );
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config("http://fake", &dir);
    let interval = config.check_drain_interval;
    let file = config.ready_file.clone();
    let start = Instant::now();
    let (status, body, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 1);
    assert_eq!(fake.stats_calls(), 3);
    // Polls at 0, 1 and 2 intervals; the one that saw 0 ended the drain.
    assert_eq!(start.elapsed(), interval * 2);
    assert!(file.exists());
}

/// What the end-to-end test's idle keep-alive connection shows against a real Envoy:
/// the drain ends at the first poll after the connection closed, and `/shutdown` (waiting
/// meanwhile) answers within one ready-check interval after that.
#[tokio::test(start_paused = true)]
async fn drain_and_shutdown_end_within_one_interval_of_the_close() {
    let open = listener_stats(1);
    let fake = FakeAdmin::new(0, &[&open, &open, &open, &listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let interval = Duration::from_secs(1);
    let ready_interval = Duration::from_millis(200);
    let config = Config {
        check_drain_interval: interval,
        check_ready_interval: ready_interval,
        ..fast_config("http://fake", &dir)
    };
    let app = app(&fake, config);
    let start = Instant::now();
    let drain = spawn_get(app.clone(), "/drain", start);
    let shutdown = spawn_get(app, "/shutdown", start);
    let ((status, _, header), drain_took) = drain.await.unwrap();
    assert_eq!(
        (status, header.as_deref()),
        (StatusCode::OK, Some("drained"))
    );
    // The count dropped between the polls at 2 s and 3 s.
    assert_eq!(drain_took, interval * 3);
    let ((status, body, _), shutdown_took) = shutdown.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
    assert!(
        drain_took <= shutdown_took && shutdown_took <= drain_took + ready_interval,
        "drain {drain_took:?}, shutdown {shutdown_took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn min_open_connections_ends_the_drain_early() {
    let fake = FakeAdmin::new(0, &[&listener_stats(5), &listener_stats(2)]);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        min_open_connections: 2,
        ..fast_config("http://fake", &dir)
    };
    let (status, _, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.stats_calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn min_drain_duration_holds_the_drain() {
    let fake = FakeAdmin::new(0, &[&listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        min_drain_duration: Duration::from_millis(400),
        check_drain_interval: Duration::from_secs(5),
        ..fast_config("http://fake", &dir)
    };
    let start = Instant::now();
    let (status, _, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    // Held for exactly the minimum duration: the poll was moved up to its end instead of
    // waiting for the 5 s interval.
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert_eq!(fake.stats_calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn healthcheck_fail_is_retried() {
    let fake = FakeAdmin::new(2, &[&listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let (status, _, header) =
        get_path(app(&fake, fast_config("http://fake", &dir)), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 3);
    // Backoff 100 ms + 200 ms, then the first poll.
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn healthcheck_fail_retries_are_bounded() {
    let fake = FakeAdmin::new(u32::MAX, &[&listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        // Skipped because the health check never failed.
        check_drain_delay: Duration::from_secs(60),
        ..fast_config("http://fake", &dir)
    };
    let start = Instant::now();
    let (status, _, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), HEALTHCHECK_FAIL_ATTEMPTS);
    // 100 + 200 + 400 + 800 ms of backoff, no check-drain delay.
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
}

#[tokio::test(start_paused = true)]
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
    let dir = tempfile::tempdir().unwrap();
    let app = app(&fake, fast_config("http://fake", &dir));
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
    let start = Instant::now();
    let (status, _, header) = get_path(app, "/drain").await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("drained"));
    assert_eq!(fake.healthcheck_calls(), 1);
    assert_eq!(fake.stats_calls(), polls);
}

#[tokio::test(start_paused = true)]
async fn drain_timeout_finishes_the_drain() {
    let fake = FakeAdmin::new(0, &[&listener_stats(3)]);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        drain_timeout: Duration::from_millis(300),
        ..fast_config("http://fake", &dir)
    };
    let file = config.ready_file.clone();
    let start = Instant::now();
    let (status, _, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("timeout"));
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    // Polls every 20 ms from 0 to 300 ms; the one at the deadline decides.
    assert_eq!(fake.stats_calls(), 16);
    assert!(file.exists());
}

#[tokio::test(start_paused = true)]
async fn drain_timeout_cuts_the_delays_short() {
    let fake = FakeAdmin::new(0, &[&listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        drain_timeout: Duration::from_millis(200),
        check_drain_delay: Duration::from_secs(60),
        ..fast_config("http://fake", &dir)
    };
    let start = Instant::now();
    let (status, _, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("timeout"));
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(fake.stats_calls(), 0);
}

/// The timing the end-to-end test against a missing Envoy sees: 1.5 s of health-check
/// retries, then three failed polls one interval apart.
#[tokio::test(start_paused = true)]
async fn a_gone_envoy_ends_the_drain_after_the_retries_and_three_polls() {
    let fake = FakeAdmin::gone();
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        check_drain_interval: Duration::from_millis(200),
        ..fast_config("http://fake", &dir)
    };
    let start = Instant::now();
    let (status, _, header) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header.as_deref(), Some("envoy-gone"));
    assert_eq!(fake.healthcheck_calls(), HEALTHCHECK_FAIL_ATTEMPTS);
    assert_eq!(fake.stats_calls(), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(1500 + 2 * 200));
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

/// An admin that answers, but not with a readable count (HTML, an error status, a
/// negative count): Envoy is there, so the drain is never "envoy-gone"; it waits for a
/// count, or its timeout.
#[tokio::test(start_paused = true)]
async fn unreadable_stats_are_unknown_not_envoy_gone() {
    for stats in [
        "<html>not envoy</html>",
        "status:503",
        "listener.x.downstream_cx_active: -5",
    ] {
        let fake = FakeAdmin::new(0, &[stats]);
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            drain_timeout: Duration::from_secs(1),
            ..fast_config("http://fake", &dir)
        };
        let (status, _, header) = get_path(app(&fake, config), "/drain").await;
        assert_eq!(status, StatusCode::OK, "{stats}");
        assert_eq!(header.as_deref(), Some("timeout"), "{stats}");
        assert!(
            fake.stats_calls() > 3,
            "{stats}: polled on, {}",
            fake.stats_calls()
        );
    }
    // Unknown answers between readable ones: the readable zero still ends the drain.
    let fake = FakeAdmin::new(0, &["<html>x</html>", "status:503", &listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let (_, _, header) = get_path(app(&fake, fast_config("http://fake", &dir)), "/drain").await;
    assert_eq!(header.as_deref(), Some("drained"));
}

#[tokio::test(start_paused = true)]
async fn unwritable_ready_file_answers_500() {
    let fake = FakeAdmin::new(0, &[&listener_stats(0)]);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        ready_file: dir.path().join("missing-dir").join("shutdown-ok"),
        ..fast_config("http://fake", &dir)
    };
    let (status, body, _) = get_path(app(&fake, config), "/drain").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("cannot create ready file"), "{body}");
}

/// What SIGTERM does through `serve`: blocked `/drain` and `/shutdown` answer 503 at
/// once, without waiting for the drain or ready timeouts.
#[tokio::test(start_paused = true)]
async fn begin_shutdown_answers_blocked_requests_at_once() {
    let fake = FakeAdmin::new(0, &[&listener_stats(1)]);
    let dir = tempfile::tempdir().unwrap();
    let state = AppState::with_admin(fast_config("http://fake", &dir), fake.clone());
    let start = Instant::now();
    let drain = spawn_get(router(state.clone()), "/drain", start);
    let shutdown = spawn_get(router(state.clone()), "/shutdown", start);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!drain.is_finished() && !shutdown.is_finished());
    assert!(fake.stats_calls() > 1);
    state.begin_shutdown();
    for task in [drain, shutdown] {
        let ((status, body, _), took) = task.await.unwrap();
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
        );
        assert_eq!(took, Duration::from_millis(100));
    }
    assert!(!dir.path().join("shutdown-ok").exists());
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

/// `GET url` on a fresh connection: (status, body).
async fn http_get(url: String) -> (u16, String) {
    let r = get_url(&url).await.unwrap();
    (r.status, r.body)
}

#[tokio::test]
async fn serve_stops_gracefully_and_answers_blocked_requests() {
    let dir = tempfile::tempdir().unwrap();
    // Timeouts far beyond the test's bounds: an answer cannot come from them.
    let config = Config {
        drain_timeout: Duration::from_secs(3600),
        ready_timeout: Duration::from_secs(3600),
        ..fast_config(&dead_address().await, &dir)
    };
    let (url, stop, task) = start_server(config).await;
    assert_eq!(http_get(format!("{url}/healthz")).await, (200, "OK".into()));
    let waiting = tokio::spawn(http_get(format!("{url}/shutdown")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    stop.send(()).unwrap();
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status, body.as_str()), (503, "shutting down"));
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn stale_ready_file_is_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = fast_config(&dead_address().await, &dir);
    std::fs::write(&config.ready_file, "").unwrap();
    let file = config.ready_file.clone();
    let (url, stop, task) = start_server(config).await;
    assert_eq!(http_get(format!("{url}/healthz")).await.0, 200);
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

// ------------------------------------------------------------- hostile HTTP clients

/// Reads until the server closes `conn`; what it sent meanwhile.
async fn read_until_closed(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    match conn.read_to_end(&mut got).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("reading: {e}"),
    }
    got
}

/// Guards socket tests that would hang without the bounds (never reached with them).
const GUARD: Duration = Duration::from_secs(60);

/// The address `serve` listens on, from its base URL.
fn socket_addr(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// The socket the server accepted (seen from its side) has `TCP_NODELAY`.
#[tokio::test]
async fn accepted_connections_have_tcp_nodelay() {
    let dir = tempfile::tempdir().unwrap();
    let (url, stop, task) = start_server(fast_config(&dead_address().await, &dir)).await;
    let addr = socket_addr(&url);
    let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(marin3r_testkit::sockets::server_side_nodelay(addr, conn.local_addr().unwrap()).await);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// 3,000 connections that never finished their headers took the process from 5.7 to
/// 58.7 MB and none was closed: now each is closed 5 s after it opened, silent or with
/// its headers trickled, and the server serves on.
#[tokio::test(start_paused = true)]
async fn connections_that_never_finish_their_headers_are_closed_after_5s() {
    use tokio::io::AsyncWriteExt as _;
    assert_eq!(HTTP_LIMITS.header_read, Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    let (url, stop, task) = start_server(fast_config(&dead_address().await, &dir)).await;
    let addr = socket_addr(&url);
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut trickled = tokio::net::TcpStream::connect(addr).await.unwrap();
    for part in ["GET /healthz HTTP/1.1\r\n", "host: x\r\n", "x: y\r\n"] {
        trickled.write_all(part.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for conn in [&mut silent, &mut trickled] {
        let answer = tokio::time::timeout(GUARD, read_until_closed(conn))
            .await
            .expect("a connection without complete headers was kept");
        assert_eq!(answer, b"");
    }
    assert_eq!(started.elapsed(), HTTP_LIMITS.header_read);
    assert_eq!(http_get(format!("{url}/healthz")).await, (200, "OK".into()));
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// At 64 connections held (each a `/shutdown` waiting for the ready file, as preStop
/// hooks do), a new connection is closed at once; below the limit a request is served;
/// once a held connection closes, requests are served again.
#[tokio::test]
async fn beyond_64_connections_new_ones_are_closed_at_once() {
    use tokio::io::AsyncWriteExt as _;
    assert_eq!(HTTP_LIMITS.max_connections, 64);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        ready_timeout: Duration::from_secs(3600),
        ..fast_config(&dead_address().await, &dir)
    };
    let (url, stop, task) = start_server(config).await;
    let addr = socket_addr(&url);
    let hold = || async move {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /shutdown HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        conn
    };
    let mut held = Vec::new();
    for _ in 0..HTTP_LIMITS.max_connections - 1 {
        held.push(hold().await);
    }
    // The 64th: served.
    assert_eq!(http_get(format!("{url}/healthz")).await, (200, "OK".into()));

    held.push(hold().await);
    // Accepted after the 64 held ones (accept order): closed at once, unanswered.
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = over
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let answer = tokio::time::timeout(GUARD, read_until_closed(&mut over))
        .await
        .expect("a connection over the limit was kept");
    assert_eq!(answer, b"", "served over the limit");

    drop(held.pop());
    marin3r_testkit::wait_until_async("served below the limit again", GUARD, || async {
        get_url(&format!("{url}/healthz"))
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    // Every held `/shutdown` was answered on the shutdown (no ready file: 503).
    for mut conn in held {
        let answer = tokio::time::timeout(GUARD, read_until_closed(&mut conn))
            .await
            .unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 503"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
}
