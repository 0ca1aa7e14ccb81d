//! Local mode's async shell: scans the folder, feeds the [`Engine`], carries out its
//! [`Effect`]s (snapshot cache, NACK statistics, state files) and serves the status
//! routes.
//!
//! Every file system call (the scan, the state files' writes and their `fsync`) and every
//! wait on the engine's lock runs on tokio's blocking pool ([`blocking`]), never on the
//! runtime's workers: a slow or stuck file system never freezes `/status`, `/readyz` or
//! the ADS streams.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use super::engine::{Effect, Engine, Options};
use super::folder::{Key, LocalSource};
use super::state;

/// How often the folder is scanned without an inotify wake-up. With inotify such a scan
/// looks only at files still being written (the whole folder is listed every
/// [`super::folder::FULL_RESCAN`]); without it, it lists the folder and `stat`s every
/// manifest (files are re-read only when their fingerprint changes), so an edit waits
/// 0–50 ms to be noticed.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How often the NACK statistics are checked for a taint verdict.
pub const EVALUATE_INTERVAL: Duration = Duration::from_millis(250);

/// Local mode as a [`crate::Backend`]: loads the folder (and the state dir) at start,
/// then re-scans the folder when inotify reports a change and every [`POLL_INTERVAL`],
/// and evaluates NACKs every
/// [`EVALUATE_INTERVAL`]; serves `GET /status` and
/// `DELETE /status/revisions/{namespace}/{name}/{version}` on the metrics listener.
#[derive(Debug)]
pub struct LocalBackend {
    dir: PathBuf,
    source: Arc<Mutex<LocalSource>>,
    engine: Arc<Mutex<Engine>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every engine and source method leaves it consistent, so a poisoned lock is usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on tokio's blocking pool: `None` only when the runtime is shutting down (a
/// panic in `f` is carried on).
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Some(v),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}

/// One scan of the folder and, when something changed, its reconcile and effects.
/// Blocking: run it with [`blocking`].
fn scan_and_apply(
    source: &Mutex<LocalSource>,
    engine: &Mutex<Engine>,
    ctx: &crate::Context,
) -> std::io::Result<bool> {
    let mut source = lock(source);
    let changed = source.scan()?;
    if changed {
        let manifests = source.manifests();
        drop(source);
        let mut engine = lock(engine);
        let effects = engine.reconcile(&manifests, &ctx.stats, SystemTime::now());
        apply(&mut engine, effects, ctx);
    }
    Ok(changed)
}

impl LocalBackend {
    /// Serves `dir` with the default [`Options`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_options(dir, Options::default())
    }

    pub fn with_options(dir: impl Into<PathBuf>, options: Options) -> Self {
        let dir = dir.into();
        Self {
            source: Arc::new(Mutex::new(LocalSource::new(&dir))),
            dir,
            engine: Arc::new(Mutex::new(Engine::new(options))),
        }
    }

    fn options(&self) -> Options {
        lock(&self.engine).options().clone()
    }

    /// NACKs per pod before a version counts as rejected (`--nack-threshold`, ≥ 1).
    pub fn with_nack_threshold(self, nack_threshold: u64) -> Self {
        let options = Options {
            nack_threshold,
            ..self.options()
        };
        Self::with_options(self.dir, options)
    }

    /// Persists revisions under `dir` (`--state-dir`).
    pub fn with_state_dir(self, dir: impl Into<PathBuf>) -> Self {
        let options = Options {
            state_dir: Some(dir.into()),
            ..self.options()
        };
        Self::with_options(self.dir, options)
    }

    /// The engine (what `/status` shows), e.g. for tests.
    pub fn engine(&self) -> Arc<Mutex<Engine>> {
        self.engine.clone()
    }
}

#[derive(Clone)]
struct RouteState {
    engine: Arc<Mutex<Engine>>,
    ctx: crate::Context,
}

/// The answer when the runtime is shutting down under a route.
fn shutting_down() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(serde_json::json!({"error": "shutting down"})),
    )
        .into_response()
}

async fn get_status(
    axum::extract::State(s): axum::extract::State<RouteState>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let engine = s.engine.clone();
    match blocking(move || lock(&engine).report()).await {
        Some(report) => axum::Json(report).into_response(),
        None => shutting_down(),
    }
}

async fn delete_revision(
    axum::extract::State(s): axum::extract::State<RouteState>,
    axum::extract::Path((namespace, name, version)): axum::extract::Path<(String, String, String)>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let result = blocking(move || {
        let mut engine = lock(&s.engine);
        let result =
            engine.remove_revision(&namespace, &name, &version, &s.ctx.stats, SystemTime::now());
        result.map(|(report, effects)| {
            apply(&mut engine, effects, &s.ctx);
            report
        })
    })
    .await;
    match result {
        Some(Ok(report)) => (axum::http::StatusCode::OK, axum::Json(report)).into_response(),
        Some(Err(e)) => (
            axum::http::StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
        None => shutting_down(),
    }
}

impl crate::Backend for LocalBackend {
    async fn start(&mut self, ctx: &crate::Context) -> Result<(), crate::Error> {
        lock(&self.engine).set_metrics(ctx.revisions.clone());
        let (source, engine, dir, ctx2) = (
            self.source.clone(),
            self.engine.clone(),
            self.dir.clone(),
            ctx.clone(),
        );
        let started = blocking(move || start_blocking(&source, &engine, &dir, &ctx2)).await;
        started.unwrap_or_else(|| {
            Err(crate::Error::ConfigDir {
                dir: self.dir.clone(),
                source: std::io::Error::other("the runtime is shutting down"),
            })
        })?;
        // The first scan is applied and its snapshots published.
        ctx.ready.set_synced();
        Ok(())
    }

    fn routes(&self, ctx: &crate::Context) -> axum::Router {
        let state = RouteState {
            engine: self.engine.clone(),
            ctx: ctx.clone(),
        };
        axum::Router::new()
            .route("/status", axum::routing::get(get_status))
            .route(
                "/status/revisions/{namespace}/{name}/{version}",
                axum::routing::delete(delete_revision),
            )
            .with_state(state)
    }

    async fn run(self, ctx: crate::Context, shutdown: crate::Shutdown) {
        let Self {
            dir,
            source,
            engine,
        } = self;
        let mut shutdown = shutdown;
        let mut scan = tokio::time::interval(POLL_INTERVAL);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut evaluate = tokio::time::interval(EVALUATE_INTERVAL);
        evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut folder_error = RepeatedError::default();
        // A change in the folder wakes the scan at once (inotify); the tick still scans
        // every POLL_INTERVAL (no inotify, a watch being set up again). A watch set up
        // again (the folder swapped, the queue lost) is waited on from then on.
        let (mut generation, mut events) = {
            let source = lock(&source);
            (source.watch_generation(), source.readiness())
        };
        loop {
            let scan_now = tokio::select! {
                () = &mut shutdown => return,
                _ = scan.tick() => true,
                () = folder_changed(events.as_ref()) => true,
                _ = evaluate.tick() => false,
            };
            let job = {
                let (source, engine, ctx) = (source.clone(), engine.clone(), ctx.clone());
                move || {
                    if scan_now {
                        Some(scan_and_apply(&source, &engine, &ctx))
                    } else {
                        let mut engine = lock(&engine);
                        let effects = engine.evaluate(&ctx.stats, SystemTime::now());
                        apply(&mut engine, effects, &ctx);
                        None
                    }
                }
            };
            let scanned = tokio::select! {
                () = &mut shutdown => return,
                done = blocking(job) => match done {
                    Some(scanned) => scanned,
                    None => return,
                },
            };
            match scanned {
                None => continue,
                Some(Ok(_)) if folder_error.clear() => {
                    tracing::info!(dir = %dir.display(), "config folder readable again");
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    if folder_error.should_log(&e.to_string(), std::time::Instant::now()) {
                        tracing::error!(dir = %dir.display(), error = %e, "cannot read config folder; serving what was read last (logged again in a minute if it persists)");
                    }
                }
            }
            {
                let folder = lock(&source);
                if folder.watch_generation() != generation {
                    generation = folder.watch_generation();
                    events = folder.readiness();
                }
            }
        }
    }
}

/// The first load, blocking: the folder's first scan, the state dir, their reconcile and
/// its effects, all before anything is published.
fn start_blocking(
    source: &Mutex<LocalSource>,
    engine: &Mutex<Engine>,
    dir: &Path,
    ctx: &crate::Context,
) -> Result<(), crate::Error> {
    let mut source = lock(source);
    source.scan().map_err(|e| crate::Error::ConfigDir {
        dir: dir.to_path_buf(),
        source: e,
    })?;
    let manifests = source.manifests();
    drop(source);
    let mut engine = lock(engine);
    let mut restored = 0;
    if let Some(dir) = engine.options().state_dir.clone() {
        let (states, errors) = state::load(&dir).map_err(|source| crate::Error::StateDir {
            dir: dir.clone(),
            source,
        })?;
        for error in errors {
            tracing::error!(error = %error, "cannot read a state file; ignored");
        }
        restored = engine.restore(states);
    }
    let effects = engine.reconcile(&manifests, &ctx.stats, SystemTime::now());
    apply(&mut engine, effects, ctx);
    tracing::info!(
        dir = %dir.display(),
        nack_threshold = engine.options().nack_threshold,
        state_dir = ?engine.options().state_dir,
        restored,
        "local mode: serving the config folder"
    );
    Ok(())
}

/// Completes when the folder's inotify queue is readable (never without one).
async fn folder_changed(events: Option<&tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>) {
    match events {
        Some(fd) => match fd.readable().await {
            Ok(mut ready) => ready.clear_ready(),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// How often an error that keeps happening is logged again.
pub const REPEAT_ERROR_LOG: Duration = Duration::from_secs(60);

/// Rate limit for one cause of error polled many times a second (the config folder
/// disappearing): logged when it starts or changes, then once per
/// [`REPEAT_ERROR_LOG`].
#[derive(Debug, Default)]
struct RepeatedError {
    last: Option<(String, std::time::Instant)>,
}

impl RepeatedError {
    /// Whether `error`, happening at `now`, is to be logged.
    fn should_log(&mut self, error: &str, now: std::time::Instant) -> bool {
        let log = match &self.last {
            Some((last, at)) => last != error || now.duration_since(*at) >= REPEAT_ERROR_LOG,
            None => true,
        };
        if log {
            self.last = Some((error.to_string(), now));
        }
        log
    }

    /// The error is over; returns whether there was one.
    fn clear(&mut self) -> bool {
        self.last.take().is_some()
    }
}

/// Carries out the engine's effects: the snapshot cache and NACK statistics of `ctx`, and
/// the state files. A state file that cannot be written is logged and written again with
/// the next change.
pub fn apply(engine: &mut Engine, effects: Vec<Effect>, ctx: &crate::Context) {
    let state_dir = engine.options().state_dir.clone();
    let mut failed: Vec<Key> = Vec::new();
    for effect in effects {
        match effect {
            Effect::Publish {
                envoyconfig,
                version,
                node_id,
                snapshot,
                reset_nacks,
            } => {
                for (t, v) in reset_nacks.iter().flatten() {
                    ctx.stats.reset_version(&node_id, *t, v);
                }
                if ctx.cache.set(&node_id, *snapshot) {
                    tracing::info!(envoyconfig = %envoyconfig, node_id = %node_id, version = %version, "published new snapshot");
                }
            }
            Effect::Forget { node_id } => {
                ctx.cache.remove(&node_id);
                ctx.stats.clear_node(&node_id);
            }
            Effect::Save { key, json } => {
                let Some(dir) = &state_dir else { continue };
                let path = state::path_of(dir, &key);
                if let Err(e) = state::write_atomic(&path, &json) {
                    tracing::error!(file = %path.display(), error = %e, "cannot write the state file");
                    failed.push(key);
                }
            }
            Effect::Unsave { key } => {
                let Some(dir) = &state_dir else { continue };
                let path = state::path_of(dir, &key);
                remove_file(&path);
                remove_file(&state::previous_of(&path));
            }
        }
    }
    if !failed.is_empty() {
        engine.save_failed(&failed);
    }
}

fn remove_file(path: &Path) {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::error!(file = %path.display(), error = %e, "cannot delete the state file")
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Liveness guard for the steps below (not a timing assertion: without the fix they
    /// block for ever on the FIFO).
    const STUCK: Duration = Duration::from_secs(60);

    async fn status_files(engine: &Arc<Mutex<Engine>>, ctx: &crate::Context) -> Vec<String> {
        let state = RouteState {
            engine: engine.clone(),
            ctx: ctx.clone(),
        };
        let response = get_status(axum::extract::State(state)).await;
        assert_eq!(response.status(), axum::http::StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
        report["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| format!("{}: {}", f["path"], f["error"]))
            .collect()
    }

    /// The SRE's FIFO named `*.yaml`, at start and created while running: the first load
    /// completes (ready), the folder keeps being served and `/status` lists both FIFOs.
    #[test]
    fn a_fifo_in_the_folder_never_stalls_the_backend() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(fifo_in_the_folder());
        }));
        // A scan stuck on a FIFO (without the fix) must not hold the test's end.
        rt.shutdown_background();
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    async fn fifo_in_the_folder() {
        use crate::Backend as _;
        let dir = tempfile::tempdir().unwrap();
        let mkfifo = |name: &str| {
            let made = std::process::Command::new("mkfifo")
                .arg(dir.path().join(name))
                .status();
            made.is_ok_and(|s| s.success())
        };
        if !mkfifo("early.yaml") {
            return; // no mkfifo here
        }
        std::fs::write(
            dir.path().join("kuard.yaml"),
            "apiVersion: marin3r.3scale.net/v1alpha1\nkind: EnvoyConfig\nmetadata:\n  name: kuard\nspec:\n  nodeID: kuard\n  resources: []\n",
        )
        .unwrap();
        let mut backend = LocalBackend::new(dir.path());
        let engine = backend.engine();
        let ctx = crate::Context::new(marin3r_xds::SharedStats::new());
        tokio::time::timeout(STUCK, backend.start(&ctx))
            .await
            .expect("the first load completes")
            .unwrap();
        assert!(ctx.ready.is_ready());
        assert!(ctx.cache.get("kuard").is_some(), "the folder is served");
        let files = status_files(&engine, &ctx).await;
        assert!(
            files.len() == 1 && files[0].contains("early.yaml") && files[0].contains("FIFO"),
            "{files:?}"
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(backend.run(
            ctx.clone(),
            Box::pin(async move {
                let _ = stopped.await;
            }),
        ));
        assert!(mkfifo("late.yaml"));
        tokio::time::timeout(STUCK, async {
            while status_files(&engine, &ctx).await.len() < 2 {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        })
        .await
        .expect("the FIFO created while running is reported");
        let _ = stop.send(());
        tokio::time::timeout(STUCK, running)
            .await
            .expect("the backend stops")
            .unwrap();
    }

    #[test]
    fn a_repeated_error_is_logged_when_it_starts_changes_or_each_minute() {
        let mut e = RepeatedError::default();
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(e.should_log("gone", at(0)));
        // Polled 20 times a second: not logged again within the minute.
        assert!((1..1200).all(|i| !e.should_log("gone", at(i * 50))));
        assert!(e.should_log("gone", at(60_000)));
        assert!(
            e.should_log("permission denied", at(60_050)),
            "another cause"
        );
        assert!(e.clear());
        assert!(!e.clear());
        assert!(
            e.should_log("permission denied", at(60_100)),
            "starts again"
        );
    }
}
