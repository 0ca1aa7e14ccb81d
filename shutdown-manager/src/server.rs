//! The HTTP server: `/healthz`, `/drain`, `/shutdown`, and the async drain driver that
//! feeds Envoy's stats into [`crate::drain::decide`].

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use marin3r_wire::http_paths;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, error, info, info_span, warn};

use crate::drain::{Decision, DoneReason, DrainSettings, DrainState, PollResult, backoff_delay};
use crate::envoy::{Admin, AdminClient};
use crate::{Config, ShutdownManagerError, format_duration};

/// Timeout of every single call to Envoy's admin (connect, request and body).
pub const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts of `POST /healthcheck/fail` before the drain goes on without it.
pub const HEALTHCHECK_FAIL_ATTEMPTS: u32 = 5;
/// First retry delay of `POST /healthcheck/fail`; doubles per retry up to
/// [`HEALTHCHECK_FAIL_MAX_BACKOFF`] (100 ms, 200 ms, 400 ms, 800 ms: 1.5 s in all).
pub const HEALTHCHECK_FAIL_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Largest retry delay of `POST /healthcheck/fail`.
pub const HEALTHCHECK_FAIL_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Response header of `/drain` naming why the drain finished:
/// `drained`, `timeout` or `envoy-gone`.
pub const DRAIN_RESULT_HEADER: &str = "x-marin3r-drain-result";

/// Bounds of the HTTP listener, for a container of 32 Mi whose only clients are the
/// kubelet (preStop hooks and probes): at most 64 connections at once (one more is
/// closed as soon as it is accepted; a preStop `/drain` or `/shutdown` holds one for the
/// whole drain), each closed when it has not sent a request's headers within 5 s (from
/// its start, or from its previous answer), with at most 16 KiB of them buffered, so
/// that hostile or stuck clients hold at most ~1 MiB of buffers. Without them 3,000
/// connections that never finished their headers took the process from 5.7 to 58.7 MB,
/// and none was closed. The same limits as every plain-HTTP listener of marin3r
/// ([`marin3r_process::HttpLimits::DEFAULT`]).
pub const HTTP_LIMITS: marin3r_process::HttpLimits = marin3r_process::HttpLimits::DEFAULT;

/// Shared state of the HTTP handlers; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    admin: Arc<dyn Admin>,
    drain: watch::Sender<DrainStatus>,
    shutdown: watch::Sender<bool>,
}

#[derive(Clone, Debug)]
enum DrainStatus {
    Idle,
    Running,
    Finished(DrainOutcome),
}

#[derive(Clone, Debug)]
enum DrainOutcome {
    Done(DoneReason),
    ReadyFileFailed(String),
    Aborted,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// Validates `config` and builds the state (no I/O happens here).
    pub fn new(config: Config) -> Result<Self, ShutdownManagerError> {
        if config.check_ready_interval.is_zero() {
            return Err(ShutdownManagerError::InvalidConfig(
                "check-ready-interval must be greater than zero".to_string(),
            ));
        }
        if config.check_drain_interval.is_zero() {
            return Err(ShutdownManagerError::InvalidConfig(
                "check-drain-interval must be greater than zero".to_string(),
            ));
        }
        let admin = AdminClient::new(&config.envoy_admin_address, ADMIN_REQUEST_TIMEOUT)?;
        Ok(Self::with_admin(config, Arc::new(admin)))
    }

    /// The state over another admin client (the in-crate tests use an in-memory fake, so
    /// they run on tokio's paused clock). `config` is assumed valid.
    pub(crate) fn with_admin(config: Config, admin: Arc<dyn Admin>) -> Self {
        let (drain, _) = watch::channel(DrainStatus::Idle);
        let (shutdown, _) = watch::channel(false);
        Self {
            inner: Arc::new(Inner {
                config,
                admin,
                drain,
                shutdown,
            }),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Tells blocked `/drain` and `/shutdown` requests and a running drain that the server
    /// stops: they answer at once (`/shutdown` still answers 200 if the ready file
    /// exists, otherwise 503) so graceful shutdown does not wait for them.
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    fn settings(&self) -> DrainSettings {
        let c = &self.inner.config;
        DrainSettings {
            min_open_connections: c.min_open_connections,
            min_drain_duration: c.min_drain_duration,
            drain_timeout: c.drain_timeout,
            check_drain_interval: c.check_drain_interval,
            envoy_gone_after: c.envoy_gone_after,
        }
    }

    /// Resolves once shutdown has begun.
    async fn shutting_down(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        // An error means the sender is gone, which also means we are going away.
        let _ = rx.wait_for(|stopping| *stopping).await;
    }

    fn is_shutting_down(&self) -> bool {
        *self.inner.shutdown.borrow()
    }

    /// Starts the drain task unless a drain already ran or runs.
    fn start_drain(&self) {
        let first = self.inner.drain.send_if_modified(|status| {
            if matches!(status, DrainStatus::Idle) {
                *status = DrainStatus::Running;
                true
            } else {
                false
            }
        });
        if first {
            let span = info_span!("drain", envoy_admin = %self.inner.admin.base());
            tokio::spawn(drain_task(self.clone(), Instant::now()).instrument(span));
        } else {
            info!("drain already requested, joining it");
        }
    }
}

/// The routes: `GET /healthz`, `GET /drain`, `GET /shutdown`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(http_paths::HEALTHZ, get(healthz))
        .route(http_paths::DRAIN, get(drain))
        .route(http_paths::SHUTDOWN, get(shutdown))
        .with_state(state)
}

/// Serves on an already bound listener until `shutdown` resolves, then stops gracefully:
/// blocked requests are answered (see [`AppState::begin_shutdown`]), in-flight ones
/// finish, idle connections close. Bounded by [`HTTP_LIMITS`]; every connection has
/// `TCP_NODELAY` (`marin3r_process::serve_http`).
///
/// A ready file left over from an earlier run is removed first: the file means "this
/// process finished draining".
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ShutdownManagerError> {
    let state = AppState::new(config)?;
    remove_stale_ready_file(&state.config().ready_file).await;
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(
        address = %address,
        envoy_admin = %state.inner.admin.base(),
        ready_file = %state.config().ready_file.display(),
        "shutdown manager listening"
    );
    let app = router(state.clone());
    let signal_state = state.clone();
    marin3r_process::serve_http(listener, app, HTTP_LIMITS, async move {
        shutdown.await;
        info!("stop requested, shutting down");
        signal_state.begin_shutdown();
    })
    .await;
    info!("shutdown manager stopped");
    Ok(())
}

/// Binds `config.bind_address:config.port` and [`serve`]s.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ShutdownManagerError> {
    let address = SocketAddr::new(config.bind_address, config.port);
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| ShutdownManagerError::Bind { address, source })?;
    serve(listener, config, shutdown).await
}

async fn remove_stale_ready_file(path: &Path) {
    match tokio::fs::remove_file(path).await {
        Ok(()) => info!(ready_file = %path.display(), "removed stale ready file"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!(
            ready_file = %path.display(),
            error = %e,
            "cannot remove stale ready file"
        ),
    }
}

async fn healthz() -> &'static str {
    "OK"
}

/// `GET /drain`: starts the drain (or joins the one in progress) and answers when it
/// finished. A drain runs once per process; later requests get the same answer at once.
async fn drain(State(state): State<AppState>) -> Response {
    if state.is_shutting_down() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    state.start_drain();
    let mut status = state.inner.drain.subscribe();
    let finished = tokio::select! {
        result = status.wait_for(|s| matches!(s, DrainStatus::Finished(_))) => match result {
            Ok(s) => match &*s {
                DrainStatus::Finished(outcome) => Some(outcome.clone()),
                DrainStatus::Idle | DrainStatus::Running => None,
            },
            Err(_) => None,
        },
        () = state.shutting_down() => None,
    };
    match finished {
        Some(DrainOutcome::Done(reason)) => {
            let mut response = (StatusCode::OK, "OK").into_response();
            response.headers_mut().insert(
                HeaderName::from_static(DRAIN_RESULT_HEADER),
                HeaderValue::from_static(reason.as_str()),
            );
            response
        }
        Some(DrainOutcome::ReadyFileFailed(message)) => {
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
        Some(DrainOutcome::Aborted) | None => {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
        }
    }
}

/// `GET /shutdown`: waits for the ready file; 200 `OK` once it exists, 500 after the
/// ready timeout.
async fn shutdown(State(state): State<AppState>) -> Response {
    let config = &state.inner.config;
    let span = info_span!("shutdown", ready_file = %config.ready_file.display());
    wait_for_ready_file(&state).instrument(span).await
}

async fn wait_for_ready_file(state: &AppState) -> Response {
    let config = &state.inner.config;
    let path = &config.ready_file;
    let deadline = Instant::now() + config.ready_timeout;
    let interval = format_duration(config.check_ready_interval);
    loop {
        if file_exists(path).await {
            info!("ready file exists, envoy may shut down");
            return (StatusCode::OK, "OK").into_response();
        }
        let now = Instant::now();
        if now >= deadline {
            let message = format!(
                "file {} did not appear within {}",
                path.display(),
                format_duration(config.ready_timeout)
            );
            warn!("{message}");
            return (StatusCode::INTERNAL_SERVER_ERROR, message).into_response();
        }
        info!(
            "file {} does not exist, recheck in {interval}",
            path.display()
        );
        let next = (now + config.check_ready_interval).min(deadline);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = state.shutting_down() => {
                return if file_exists(path).await {
                    (StatusCode::OK, "OK").into_response()
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
                };
            }
        }
    }
}

async fn file_exists(path: &Path) -> bool {
    tokio::fs::try_exists(path).await.unwrap_or(false)
}

/// Runs one drain to its end and publishes the outcome to all `/drain` waiters.
async fn drain_task(state: AppState, started: Instant) {
    let outcome = tokio::select! {
        reason = drain_until_deadline(&state, started) => finish(&state, reason).await,
        () = state.shutting_down() => {
            info!("shutting down, drain abandoned");
            DrainOutcome::Aborted
        }
    };
    state
        .inner
        .drain
        .send_replace(DrainStatus::Finished(outcome));
}

/// The drain steps, cut short by the drain timeout wherever they are (delays and
/// health-check retries included).
async fn drain_until_deadline(state: &AppState, started: Instant) -> DoneReason {
    let deadline = started + state.inner.config.drain_timeout;
    tokio::select! {
        biased;
        reason = drain_steps(state, started) => reason,
        () = tokio::time::sleep_until(deadline) => DoneReason::TimedOut,
    }
}

async fn drain_steps(state: &AppState, started: Instant) -> DoneReason {
    let config = &state.inner.config;
    let settings = state.settings();
    info!(
        start_drain_delay = %format_duration(config.start_drain_delay),
        check_drain_delay = %format_duration(config.check_drain_delay),
        check_drain_interval = %format_duration(config.check_drain_interval),
        drain_timeout = %format_duration(config.drain_timeout),
        min_drain_duration = %format_duration(config.min_drain_duration),
        min_connections = config.min_open_connections,
        "drain started"
    );
    tokio::time::sleep(config.start_drain_delay).await;
    if fail_healthcheck(state.inner.admin.as_ref()).await {
        tokio::time::sleep(config.check_drain_delay).await;
    }
    let mut drain = DrainState::new(started.into_std());
    loop {
        let poll = match state.inner.admin.open_connections().await {
            Ok(open) => {
                info!(
                    open_connections = open,
                    min_connections = config.min_open_connections,
                    "polled open connections"
                );
                PollResult::Open(open)
            }
            // Envoy answered, but not with a count we can read: unknown, not gone.
            Err(
                e @ (ShutdownManagerError::AdminStatus { .. }
                | ShutdownManagerError::InvalidStats { .. }),
            ) => {
                warn!(
                    error = %marin3r_wire::error_chain(&e),
                    "envoy admin answered, but the open connections are unknown; polling on"
                );
                PollResult::Unknown
            }
            Err(e) => {
                warn!(
                    error = %marin3r_wire::error_chain(&e),
                    consecutive_failures = drain.consecutive_failures() + 1,
                    "cannot poll open connections from envoy admin"
                );
                PollResult::Failed
            }
        };
        match crate::drain::decide(&mut drain, poll, Instant::now().into_std(), &settings) {
            Decision::Done(reason) => return reason,
            Decision::KeepPolling { next_poll } => {
                tokio::time::sleep_until(Instant::from_std(next_poll)).await;
            }
        }
    }
}

/// `POST /healthcheck/fail` with bounded exponential backoff. Returns whether Envoy
/// acknowledged it; when it never did, Envoy is most likely gone, so the caller skips
/// the check-drain delay and lets the polls decide.
async fn fail_healthcheck(admin: &dyn Admin) -> bool {
    for attempt in 0..HEALTHCHECK_FAIL_ATTEMPTS {
        match admin.fail_healthcheck().await {
            Ok(()) => {
                info!("envoy health check set to failing, envoy is draining");
                return true;
            }
            Err(e) if attempt + 1 < HEALTHCHECK_FAIL_ATTEMPTS => {
                let delay = backoff_delay(
                    HEALTHCHECK_FAIL_INITIAL_BACKOFF,
                    HEALTHCHECK_FAIL_MAX_BACKOFF,
                    attempt,
                );
                warn!(
                    error = %marin3r_wire::error_chain(&e),
                    attempt = attempt + 1,
                    retry_in = %format_duration(delay),
                    "cannot fail envoy health check, retrying"
                );
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                warn!(
                    error = %marin3r_wire::error_chain(&e),
                    attempts = HEALTHCHECK_FAIL_ATTEMPTS,
                    "cannot fail envoy health check, giving up and polling connections"
                );
            }
        }
    }
    false
}

/// Logs the end of the drain and creates the ready file.
async fn finish(state: &AppState, reason: DoneReason) -> DrainOutcome {
    let path = &state.inner.config.ready_file;
    match reason {
        DoneReason::Drained { open_connections } => info!(
            result = reason.as_str(),
            open_connections, "drain finished: connections drained"
        ),
        DoneReason::TimedOut => warn!(
            result = reason.as_str(),
            drain_timeout = %format_duration(state.inner.config.drain_timeout),
            "drain finished: drain timeout expired"
        ),
        DoneReason::EnvoyGone {
            consecutive_failures,
        } => warn!(
            result = reason.as_str(),
            consecutive_failures, "drain finished: envoy admin unreachable, envoy is gone"
        ),
    }
    match tokio::fs::write(path, b"").await {
        Ok(()) => {
            info!(ready_file = %path.display(), "ready file created");
            DrainOutcome::Done(reason)
        }
        Err(source) => {
            let e = ShutdownManagerError::ReadyFile {
                path: path.clone(),
                source,
            };
            let message = marin3r_wire::error_chain(&e);
            error!(error = %message, "drain finished but the ready file cannot be created");
            DrainOutcome::ReadyFileFailed(message)
        }
    }
}
