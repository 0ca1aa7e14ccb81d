//! HTTP shells over the admission core: the HTTPS admission router, the plain probe
//! router and the metrics router. Each is a `Router` testable with `oneshot`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use marin3r_sidecar::Defaults;

use crate::admission::{self, Outcome};
use crate::metrics::Metrics;

/// Largest AdmissionReview body accepted: the API server caps objects at 3 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Path of the Pod mutating webhook.
pub const MUTATE_PATH: &str = "/pod-v1-mutate";

/// Shared state of the admission router.
#[derive(Debug)]
pub struct AppState {
    pub defaults: Defaults,
    pub metrics: Arc<Metrics>,
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn bad_request(state: &AppState, started: Instant, message: String) -> Response {
    state.metrics.observe(None, started.elapsed().as_secs_f64());
    tracing::warn!(error = %message, "rejected admission request");
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({"error": message, "code": 400}),
    )
}

async fn read_body(req: Request) -> Result<Bytes, String> {
    let too_big = || format!("request body exceeds {MAX_BODY_BYTES} bytes (3 MiB)");
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_big());
    }
    axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            // `to_bytes` reports the limit as a generic error; both cases are client errors.
            if std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit"))
            {
                too_big()
            } else {
                format!("cannot read request body: {e}")
            }
        })
}

async fn mutate(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(msg) => return bad_request(&state, started, msg),
    };
    match admission::review(&body, &state.defaults) {
        Err(e) => bad_request(&state, started, e.0),
        Ok((out, outcome)) => {
            let elapsed = started.elapsed().as_secs_f64();
            state.metrics.observe(Some(&outcome), elapsed);
            match &outcome {
                Outcome::Denied => tracing::info!(
                    uid = %out.response.uid,
                    message = out.response.status.as_ref().map(|s| s.message.as_str()).unwrap_or_default(),
                    "denied pod"
                ),
                Outcome::Injected => {
                    tracing::info!(uid = %out.response.uid, seconds = elapsed, "injected sidecar")
                }
                Outcome::Skipped(s) => {
                    tracing::debug!(uid = %out.response.uid, reason = s.as_str(), "skipped")
                }
            }
            match serde_json::to_value(&out) {
                Ok(v) => json_response(StatusCode::OK, &v),
                Err(e) => json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &json!({"error": format!("cannot serialise response: {e}")}),
                ),
            }
        }
    }
}

/// The HTTPS admission router (`POST /pod-v1-mutate`).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Plain-HTTP probe router: `/healthz` (process alive) and `/readyz` (TLS listener up).
pub fn probe_router(ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.load(Ordering::Acquire);
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
}

/// Prometheus text exposition on `/metrics`.
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                match metrics.encode() {
                    Ok(text) => Response::builder()
                        .header(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )
                        .body(Body::from(text))
                        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }
        }),
    )
}
