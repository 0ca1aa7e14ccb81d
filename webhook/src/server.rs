//! The HTTP shell over the admission core: the HTTPS admission router, a `Router`
//! testable with `oneshot`. The probe and metrics routers are `marin3r-process`'s.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use marin3r_sidecar::Defaults;

use crate::admission::{self, BadRequest, Outcome, ReviewOut};
use crate::metrics::Metrics;
use crate::validation::{self, Verdict};
use marin3r_wire::quote::bounded;
use marin3r_wire::quote::{MAX_MESSAGE_BYTES, bounded_to};

/// Largest AdmissionReview body accepted: the API server caps objects at 3 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Path of the Pod mutating webhook.
pub const MUTATE_PATH: &str = "/pod-v1-mutate";
/// Path of the EnvoyConfig validating webhook (upstream's path).
pub const VALIDATE_ENVOYCONFIG_PATH: &str = "/validate-marin3r-3scale-net-v1alpha1-envoyconfig";
/// Path of the EnvoyDeployment validating webhook (upstream's path,
/// operator-design.md §5.8).
pub const VALIDATE_ENVOYDEPLOYMENT_PATH: &str =
    "/validate-operator-marin3r-3scale-net-v1alpha1-envoydeployment";

pub mod slots;

pub use slots::{VALIDATION_QUEUE, VALIDATION_SLOTS, VALIDATION_WAIT, ValidationSlots};

/// Shared state of the admission router.
#[derive(Debug)]
pub struct AppState {
    pub defaults: Defaults,
    pub metrics: Arc<Metrics>,
    /// Slots for EnvoyConfig and EnvoyDeployment validations, which run on tokio's
    /// blocking pool so they never hold the async workers Pod injection runs on. A
    /// validation that finds no free slot waits for one in a bounded queue for a bounded
    /// time ([`ValidationSlots`]), then is answered 429.
    pub validation_slots: ValidationSlots,
}

impl AppState {
    /// State with the default validation slots, queue and wait.
    pub fn new(defaults: Defaults, metrics: Arc<Metrics>) -> Self {
        Self::with_validation_slots(defaults, metrics, ValidationSlots::default())
    }

    /// State with the given validation slots.
    pub fn with_validation_slots(
        defaults: Defaults,
        metrics: Arc<Metrics>,
        validation_slots: ValidationSlots,
    ) -> Self {
        Self {
            defaults,
            metrics,
            validation_slots,
        }
    }
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    bytes_response(status, body.to_string().into_bytes())
}

fn bytes_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
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

/// The 400 JSON answer for a bad request, or the 200 AdmissionReview answer.
fn respond<O>(result: Result<(ReviewOut, O), BadRequest>) -> Response {
    match result {
        Err(BadRequest(message)) => {
            tracing::warn!(error = %bounded(&message), "rejected admission request");
            // The message can quote the body (a decoder's error): bounded like a denial.
            json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": bounded_to(&message, MAX_MESSAGE_BYTES), "code": 400}),
            )
        }
        Ok((out, _)) => match out.to_json() {
            Ok(body) => bytes_response(StatusCode::OK, body),
            Err(e) => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"error": format!("cannot serialise response: {e}")}),
            ),
        },
    }
}

/// Reads the body (at most [`MAX_BODY_BYTES`]) and hands it to an admission core.
async fn admit<O>(
    req: Request,
    core: impl FnOnce(&[u8]) -> Result<(ReviewOut, O), BadRequest>,
) -> Result<(ReviewOut, O), BadRequest> {
    let body = read_body(req).await.map_err(BadRequest)?;
    core(&body)
}

fn denial_message(out: &ReviewOut) -> &str {
    out.response
        .status
        .as_ref()
        .map(|s| s.message.as_str())
        .unwrap_or_default()
}

async fn mutate(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    let result = admit(req, |body| admission::mutate(body, &state.defaults)).await;
    let elapsed = started.elapsed().as_secs_f64();
    state
        .metrics
        .observe(result.as_ref().ok().map(|(_, o)| o), elapsed);
    if let Ok((out, outcome)) = &result {
        let uid = bounded(&out.response.uid);
        match outcome {
            Outcome::Denied(reason) => {
                tracing::info!(%uid, reason = reason.as_str(), denial = %bounded(denial_message(out)), "denied pod")
            }
            Outcome::Injected => tracing::info!(%uid, seconds = elapsed, "injected sidecar"),
            Outcome::Skipped(s) => tracing::debug!(%uid, reason = s.as_str(), "skipped"),
        }
    }
    respond(result)
}

/// The 429 answer when a validation got no slot.
fn validations_busy(kind: &str, refused: slots::Refused) -> Response {
    tracing::warn!(kind, %refused, "validation refused; answered 429");
    json_response(
        StatusCode::TOO_MANY_REQUESTS,
        &json!({
            "error": format!("{kind} validation refused: {refused}; retry the request"),
            "code": 429
        }),
    )
}

/// Runs a validation (CPU-heavy for megabyte configs) on the blocking pool once it has a
/// validation slot ([`ValidationSlots::acquire`]).
async fn validate_in_slot(
    state: &AppState,
    body: Bytes,
    what: &'static validation::Validated,
) -> Result<Result<(ReviewOut, Verdict), BadRequest>, slots::Refused> {
    let permit = state.validation_slots.acquire().await?;
    let handled = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        validation::validate_as(&body, what)
    })
    .await;
    Ok(handled.unwrap_or_else(|e| Err(BadRequest(format!("validation failed: {e}")))))
}

async fn validate(State(state): State<Arc<AppState>>, req: Request) -> Response {
    validate_kind(&state, req, &validation::ENVOYCONFIG).await
}

async fn validate_envoydeployment(State(state): State<Arc<AppState>>, req: Request) -> Response {
    validate_kind(&state, req, &validation::ENVOYDEPLOYMENT).await
}

/// One validation review of `what`'s kind, in a validation slot (EnvoyConfig and
/// EnvoyDeployment validations share the slots and the metrics).
async fn validate_kind(
    state: &AppState,
    req: Request,
    what: &'static validation::Validated,
) -> Response {
    let kind = what.kind;
    let started = Instant::now();
    let result = match read_body(req).await {
        Err(message) => Err(BadRequest(message)),
        Ok(body) => match validate_in_slot(state, body, what).await {
            Ok(result) => result,
            Err(refused) => return validations_busy(kind, refused),
        },
    };
    let elapsed = started.elapsed().as_secs_f64();
    state
        .metrics
        .observe_validation(result.as_ref().ok().map(|(_, v)| v), elapsed);
    if let Ok((out, verdict)) = &result {
        let uid = bounded(&out.response.uid);
        match verdict {
            Verdict::Denied => {
                tracing::info!(%uid, kind, denial = %bounded(denial_message(out)), "denied")
            }
            Verdict::Allowed => {
                tracing::debug!(%uid, kind, seconds = elapsed, "valid")
            }
            Verdict::Skipped(p) => {
                tracing::debug!(%uid, kind, reason = p.as_str(), "validation skipped")
            }
        }
    }
    respond(result)
}

/// Runs `handling` (body read and answer of one request) for at most `limit`; past it
/// the client gets 408 with a JSON error and the connection is closed.
pub async fn with_timeout(
    limit: std::time::Duration,
    handling: impl std::future::Future<Output = Response>,
) -> Response {
    match tokio::time::timeout(limit, handling).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                seconds = limit.as_secs_f64(),
                "request not received and answered in time"
            );
            let mut response = json_response(
                StatusCode::REQUEST_TIMEOUT,
                &json!({"error": format!("request not received within {limit:?}"), "code": 408}),
            );
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// The HTTPS admission router: `POST /pod-v1-mutate` (Pod sidecar injection),
/// `POST /validate-marin3r-3scale-net-v1alpha1-envoyconfig` (EnvoyConfig validation) and
/// `POST /validate-operator-marin3r-3scale-net-v1alpha1-envoydeployment`
/// (EnvoyDeployment validation).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_ENVOYCONFIG_PATH, post(validate))
        .route(
            VALIDATE_ENVOYDEPLOYMENT_PATH,
            post(validate_envoydeployment),
        )
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}
