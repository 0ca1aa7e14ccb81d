//! What every long-running marin3r process (webhook, discovery service, operator)
//! shares, so that each starts, reports readiness and stops the same way:
//!
//! - [`Process::serve`]: the one runner. It serves the probes and metrics, runs the
//!   process's main work, and on the shutdown signal turns not ready at once, tells the
//!   main work to stop ([`Stopping`]), gives it the process's grace and no more (then
//!   drops it with a warning), and stops the probe and metrics servers; every error is
//!   an [`Error`] naming its server;
//! - [`Readiness`]: ready = synced and not stopping, computed once; `/readyz` and the
//!   discovery service's gRPC health both read it;
//! - [`bind`]: a TCP listener, with an error naming the address;
//! - [`accept`]: every accepted connection of every listener gets `TCP_NODELAY` there
//!   ([`set_nodelay`]); [`serve_http`]: every plain-HTTP listener (probes, metrics, the
//!   shutdown manager), bounded by [`HttpLimits`] (header read timeout, connection limit,
//!   header size);
//! - [`shutdown_signal`]: resolves on SIGTERM or Ctrl-C;
//! - [`probe_router`]: `/healthz` (process alive) and `/readyz` (200 while ready, 503
//!   before and while stopping);
//! - [`metrics_router`]: Prometheus `/metrics` in the OpenMetrics text format.
//!
//! Each router is a plain `axum::Router`, testable with `tower::ServiceExt::oneshot`.
//! (The shutdown manager is a sidecar with its own drain protocol: it runs none of this
//! but [`serve_http`].)
#![forbid(unsafe_code)]

mod accept;
mod certificates;
mod readiness;
mod ready_metric;
mod routes;
mod serve;
mod signal;

use std::net::SocketAddr;

pub use accept::{
    ConnectionSlots, HTTP_HEADER_READ_TIMEOUT, HTTP_MAX_CONNECTIONS, HTTP_MAX_HEADER_BYTES,
    HTTP_WRITE_STALL_TIMEOUT, Held, HttpLimits, accept, serve_http, set_nodelay,
};
pub use certificates::{
    CERTIFICATE_EXPIRY_METRIC, CertificateExpiry, IssuedCertificates, not_after, unix_seconds,
};
pub use readiness::{Readiness, Stopping};
pub use ready_metric::{READY_METRIC, register_ready_metric};
pub use routes::{OPENMETRICS_CONTENT_TYPE, encode_metrics, metrics_router, probe_router};
pub use serve::{HTTP_STOP_GRACE, Process};
pub use signal::shutdown_signal;

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
