//! Local mode's async shell: scans the folder, feeds the [`Engine`], carries out its
//! [`Effect`]s (snapshot cache, NACK statistics, state files) and serves the status
//! routes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use super::engine::{Effect, Engine, Options};
use super::folder::{Key, LocalSource};
use super::state;
use crate::status::StatusReport;

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
    source: LocalSource,
    engine: Arc<Mutex<Engine>>,
}

fn lock(engine: &Mutex<Engine>) -> MutexGuard<'_, Engine> {
    // Every engine method leaves it consistent, so a poisoned lock is usable.
    engine.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LocalBackend {
    /// Serves `dir` with the default [`Options`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_options(dir, Options::default())
    }

    pub fn with_options(dir: impl Into<PathBuf>, options: Options) -> Self {
        Self {
            source: LocalSource::new(dir),
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
        Self::with_options(self.source.dir, options)
    }

    /// Persists revisions under `dir` (`--state-dir`).
    pub fn with_state_dir(self, dir: impl Into<PathBuf>) -> Self {
        let options = Options {
            state_dir: Some(dir.into()),
            ..self.options()
        };
        Self::with_options(self.source.dir, options)
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

async fn get_status(
    axum::extract::State(s): axum::extract::State<RouteState>,
) -> axum::Json<StatusReport> {
    axum::Json(lock(&s.engine).report())
}

async fn delete_revision(
    axum::extract::State(s): axum::extract::State<RouteState>,
    axum::extract::Path((namespace, name, version)): axum::extract::Path<(String, String, String)>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let mut engine = lock(&s.engine);
    let result =
        engine.remove_revision(&namespace, &name, &version, &s.ctx.stats, SystemTime::now());
    match result {
        Ok((report, effects)) => {
            apply(&mut engine, effects, &s.ctx);
            (axum::http::StatusCode::OK, axum::Json(report)).into_response()
        }
        Err(e) => (
            axum::http::StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

impl crate::Backend for LocalBackend {
    async fn start(&mut self, ctx: &crate::Context) -> Result<(), crate::Error> {
        self.source
            .scan()
            .map_err(|source| crate::Error::ConfigDir {
                dir: self.source.dir.clone(),
                source,
            })?;
        let manifests = self.source.manifests();
        let mut engine = lock(&self.engine);
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
            dir = %self.source.dir.display(),
            nack_threshold = engine.options().nack_threshold,
            state_dir = ?engine.options().state_dir,
            restored,
            "local mode: serving the config folder"
        );
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

    async fn run(mut self, ctx: crate::Context, shutdown: crate::Shutdown) {
        let mut shutdown = shutdown;
        let mut scan = tokio::time::interval(POLL_INTERVAL);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut evaluate = tokio::time::interval(EVALUATE_INTERVAL);
        evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut folder_error = RepeatedError::default();
        // A change in the folder wakes the scan at once (inotify); the tick still scans
        // every POLL_INTERVAL (no inotify, a watch lost with the folder).
        let events = self.source.readiness();
        let changed = || async {
            match &events {
                Some(fd) => match fd.readable().await {
                    Ok(mut ready) => ready.clear_ready(),
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        loop {
            let scan_now = tokio::select! {
                () = &mut shutdown => return,
                _ = scan.tick() => true,
                () = changed() => true,
                _ = evaluate.tick() => false,
            };
            if !scan_now {
                let mut engine = lock(&self.engine);
                let effects = engine.evaluate(&ctx.stats, SystemTime::now());
                apply(&mut engine, effects, &ctx);
                continue;
            }
            match self.source.scan() {
                Ok(changed) if folder_error.clear() => {
                    tracing::info!(dir = %self.source.dir.display(), "config folder readable again");
                    if changed {
                        let manifests = self.source.manifests();
                        let mut engine = lock(&self.engine);
                        let effects = engine.reconcile(&manifests, &ctx.stats, SystemTime::now());
                        apply(&mut engine, effects, &ctx);
                    }
                }
                Ok(false) => {}
                Ok(true) => {
                    let manifests = self.source.manifests();
                    let mut engine = lock(&self.engine);
                    let effects = engine.reconcile(&manifests, &ctx.stats, SystemTime::now());
                    apply(&mut engine, effects, &ctx);
                }
                Err(e) => {
                    if folder_error.should_log(&e.to_string(), std::time::Instant::now()) {
                        tracing::error!(dir = %self.source.dir.display(), error = %e, "cannot read config folder; serving what was read last (logged again in a minute if it persists)");
                    }
                }
            }
        }
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
