//! What every long-running marin3r server (webhook, discovery service, shutdown manager)
//! shares:
//!
//! - [`shutdown_signal`]: resolves on SIGTERM or Ctrl-C;
//! - [`probe_router`]: `/healthz` (process alive) and `/readyz` (200 once ready, 503
//!   before and while stopping);
//! - [`metrics_router`]: Prometheus `/metrics` in the OpenMetrics text format.
//!
//! Each router is a plain `axum::Router`, testable with `tower::ServiceExt::oneshot`.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus_client::registry::Registry;

/// The `Content-Type` of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Failures of a process's listeners.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{server} server failed")]
    Serve {
        server: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Binds a TCP listener on `addr`, with an error naming the address.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C): the shutdown future the CLI passes to every
/// server's `run`.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    () = ctrl_c() => tracing::info!("SIGINT received"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM, only SIGINT stops the server");
                ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    ctrl_c().await;
}

/// Ctrl-C; never resolves if the handler cannot be installed.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Plain-HTTP probe router: `/healthz` answers 200 `ok` while the process runs; `/readyz`
/// answers 200 `ok` while `ready` is set, else 503 `not ready`.
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
    async fn probes_follow_the_ready_flag() {
        let ready = Arc::new(AtomicBool::new(false));
        let router = probe_router(ready.clone());
        assert_eq!(get(router.clone(), "/healthz").await.0, StatusCode::OK);
        let (status, _, body) = get(router.clone(), "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "not ready")
        );
        ready.store(true, Ordering::Release);
        let (status, _, body) = get(router, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
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
