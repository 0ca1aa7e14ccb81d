//! The HTTP routers every process serves: probes and Prometheus metrics.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use marin3r_wire::http_paths;
use prometheus_client::registry::Registry;

use crate::Readiness;

/// The `Content-Type` of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Plain-HTTP probe router: `/healthz` answers 200 `ok` while the process runs; `/readyz`
/// answers 200 `ok` while `readiness` [is ready](Readiness::is_ready), else 503
/// `not ready`.
pub fn probe_router(readiness: Readiness) -> Router {
    Router::new()
        .route(http_paths::HEALTHZ, get(|| async { "ok" }))
        .route(
            http_paths::READYZ,
            get(move || {
                let ready = readiness.is_ready();
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

/// The OpenMetrics text exposition of `registry`.
pub fn encode_metrics(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

/// `GET /metrics`: `registry` in the OpenMetrics text format ([`OPENMETRICS_CONTENT_TYPE`]);
/// 500 with an empty body if it cannot be encoded.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move {
                match encode_metrics(&registry) {
                    Ok(text) => (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                        text,
                    ),
                    Err(_) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [(header::CONTENT_TYPE, "text/plain")],
                        String::new(),
                    ),
                }
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt as _;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt as _;

    async fn get(router: Router, path: &str) -> (StatusCode, Option<String>, String) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn probes_follow_the_readiness() {
        let readiness = Readiness::new();
        let router = probe_router(readiness.clone());
        assert_eq!(get(router.clone(), "/healthz").await.0, StatusCode::OK);
        let (status, _, body) = get(router.clone(), "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "not ready")
        );
        readiness.set_synced();
        let (status, _, body) = get(router.clone(), "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
        readiness.set_stopping();
        let (status, _, body) = get(router.clone(), "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "not ready")
        );
        assert_eq!(
            get(router, "/healthz").await.0,
            StatusCode::OK,
            "alive while stopping"
        );
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text() {
        let mut registry = Registry::with_prefix("demo");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things seen", counter.clone());
        counter.inc();
        let (status, content_type, body) =
            get(metrics_router(Arc::new(registry)), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type.as_deref(), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(body.contains("demo_things_total 1\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
}
