//! Helpers shared by the webhook's integration tests: the router without a socket, a
//! real HTTPS server on 127.0.0.1 port 0, certificates and AdmissionReview bodies.
//! Each test binary uses a subset.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use rustls_pki_types::CertificateDer;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tower::ServiceExt as _;

use marin3r_certs::{Bundle, IssueOptions, issue};
use marin3r_sidecar::Defaults;
use marin3r_testkit::admission::Review;
use marin3r_webhook::metrics::Metrics;
use marin3r_webhook::{AppState, Config, Listeners, Timeouts, router, serve_with_timeouts};

pub fn state_with(defaults: Defaults) -> Arc<AppState> {
    Arc::new(AppState::new(defaults, Arc::new(Metrics::new())))
}

/// An in-memory log: a `tracing_subscriber` writer (`with_writer(move || log.clone())`)
/// whose lines a test reads back with [`LogBuf::text`].
#[derive(Clone, Default)]
pub struct LogBuf(Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuf {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for LogBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn state() -> Arc<AppState> {
    state_with(Defaults::default())
}

/// POSTs `body` to `path` through the router (no socket); every answer must be JSON.
pub async fn post(state: Arc<AppState>, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = router(state).oneshot(req).await.unwrap();
    let status = resp.status();
    assert_eq!(
        resp.headers()["content-type"],
        "application/json",
        "every answer is JSON"
    );
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// POSTs an EnvoyDeployment `review` to the EnvoyDeployment validation path; the answer
/// must be 200 with the review's uid. Returns its `response`.
pub async fn admit_envoy_deployment(review: Review) -> Value {
    let (status, out) = post(
        state(),
        marin3r_webhook::VALIDATE_ENVOYDEPLOYMENT_PATH,
        review.bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["response"]["uid"], marin3r_testkit::admission::UID);
    out["response"].clone()
}

/// A Pod with the injection label and the one required annotation (node-id `kuard`).
pub fn labelled_pod() -> Value {
    json!({
        "metadata": {"name": "p", "labels": {"marin3r.3scale.net/status": "enabled"},
                     "annotations": {"marin3r.3scale.net/node-id": "kuard"}},
        "spec": {"containers": [{"name": "app", "image": "app"}]}
    })
}

/// A minimal AdmissionReview v1 for the CREATE of `pod` in namespace `default`.
pub fn pod_review(uid: &str, pod: Value) -> Value {
    Review::pod(pod).uid(uid).json()
}

/// A CA with a server certificate for `localhost` and `127.0.0.1`.
pub fn bundle() -> Bundle {
    issue(&IssueOptions {
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        ..IssueOptions::default()
    })
    .unwrap()
}

/// The first certificate of a PEM text.
pub fn cert_der(pem: &str) -> CertificateDer<'static> {
    use rustls_pki_types::pem::PemObject as _;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// A webhook server (`serve_with_timeouts`) on 127.0.0.1 port 0 for the HTTPS listener,
/// the probes and the metrics. Dropping it aborts the server task.
pub struct Running {
    pub https: SocketAddr,
    pub probes: SocketAddr,
    pub metrics: SocketAddr,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<Result<(), marin3r_webhook::Error>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the webhook with the certificate `dir/tls.crt` and key `dir/tls.key`.
pub async fn start(dir: &Path, timeouts: Timeouts) -> Running {
    let files = marin3r_certs::ServingFiles::pair(dir.join("tls.crt"), dir.join("tls.key"));
    start_serving(files, timeouts).await
}

/// Starts the webhook serving `files`.
pub async fn start_serving(files: marin3r_certs::ServingFiles, timeouts: Timeouts) -> Running {
    let localhost = "127.0.0.1:0".parse::<SocketAddr>().unwrap();
    let config = Config {
        webhook_addr: localhost,
        tls: files,
        health_addr: localhost,
        metrics_addr: localhost,
        defaults: Defaults::default(),
    };
    let listeners = Listeners::bind(&config).await.unwrap();
    let https = listeners.https.local_addr().unwrap();
    let probes = listeners.probes.local_addr().unwrap();
    let metrics = listeners.metrics.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_with_timeouts(
        config,
        listeners,
        timeouts,
        async move {
            let _ = rx.await;
        },
    ));
    Running {
        https,
        probes,
        metrics,
        stop: Some(tx),
        task,
    }
}

/// Reads a whole `connection: close` HTTP/1.1 response: (status, body).
pub async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> Result<(u16, String), String> {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
