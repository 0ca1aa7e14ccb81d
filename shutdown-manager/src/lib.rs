//! The MARIN3R shutdown manager: a sidecar that drains Envoy's connections before the pod
//! goes away (`marin3r shutdown-manager`, design.md §5).
//!
//! HTTP endpoints (default port 8090):
//! - `GET /healthz` → 200 `OK`.
//! - `GET /drain` — the shutdown manager container's preStop hook. Waits
//!   [`Config::start_drain_delay`], sends `POST /healthcheck/fail` to Envoy's admin
//!   (5 attempts, exponential backoff from 100 ms), waits [`Config::check_drain_delay`],
//!   then polls Envoy's open downstream connections every [`Config::check_drain_interval`]
//!   (listener `downstream_cx_active` gauges, HTTP and TCP proxy alike, admin listener
//!   excluded; see [`open_connections`]) and logs each poll as `"polled open
//!   connections"` with `open_connections` and `min_connections`. It finishes when the
//!   count is ≤ [`Config::min_open_connections`] and [`Config::min_drain_duration`]
//!   passed, when [`Config::drain_timeout`] expired, or when Envoy's admin failed
//!   [`Config::envoy_gone_after`] consecutive polls; then it creates
//!   [`Config::ready_file`] and answers 200 `OK` with header
//!   `x-marin3r-drain-result: drained|timeout|envoy-gone`. Should the ready file not be
//!   creatable it answers 500.
//! - `GET /shutdown` — Envoy's preStop hook. Logs `"file /tmp/shutdown-ok does not
//!   exist, recheck in 1s"` and polls every [`Config::check_ready_interval`] until the
//!   ready file exists (200 `OK`), or answers 500 after [`Config::ready_timeout`].
//!
//! Choices the spec leaves open:
//! - **One drain per process.** A second `/drain` while one runs joins it (same answer,
//!   no second `/healthcheck/fail`); after it finished, `/drain` answers the same result at
//!   once. The drain runs in its own task, so a preStop client that gives up does not stop
//!   it.
//! - Both the minimum drain duration and the drain timeout count from the first `/drain`
//!   request, and the timeout also cuts the start/check delays and the health-check
//!   retries short.
//! - If `/healthcheck/fail` never succeeded (Envoy most likely gone), the check-drain
//!   delay is skipped and the polls decide (Envoy gone after `envoy_gone_after` failures).
//! - On shutdown (SIGTERM) waiting requests answer at once: `/shutdown` 200 if the ready
//!   file exists, else 503; `/drain` 503 unless it already finished. A ready file left from
//!   an earlier run is removed at start-up.
//!
//! The decision logic is a pure function, [`decide`], and the stats parsing is
//! [`open_connections`]; the async code only sleeps, polls and serves HTTP.
#![forbid(unsafe_code)]

mod drain;
mod duration;
mod envoy;
mod server;
mod stats;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use drain::{
    Decision, DoneReason, DrainSettings, DrainState, PollResult, backoff_delay, decide,
};
pub use duration::{format_duration, parse_duration};
pub use envoy::AdminClient;
pub use server::{
    ADMIN_REQUEST_TIMEOUT, AppState, DRAIN_RESULT_HEADER, HEALTHCHECK_FAIL_ATTEMPTS,
    HEALTHCHECK_FAIL_INITIAL_BACKOFF, HEALTHCHECK_FAIL_MAX_BACKOFF, HTTP_LIMITS, router, run,
    serve,
};
pub use stats::{STATS_PATH, open_connections};

/// Settings of the shutdown manager; the defaults are the `marin3r shutdown-manager`
/// flag defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `--port` (8090).
    pub port: u16,
    /// Address to listen on (0.0.0.0).
    pub bind_address: IpAddr,
    /// `--envoy-admin-address` (`http://localhost:9901`); the `http://` may be omitted.
    pub envoy_admin_address: String,
    /// `--ready-file` (`/tmp/shutdown-ok`), created when the drain finished.
    pub ready_file: PathBuf,
    /// `--check-ready-interval` (1s): how often `/shutdown` looks for the ready file.
    pub check_ready_interval: Duration,
    /// `--check-drain-interval` (5s): how often the drain polls Envoy's connections.
    pub check_drain_interval: Duration,
    /// `--start-drain-delay` (0s): wait before failing Envoy's health check.
    pub start_drain_delay: Duration,
    /// `--check-drain-delay` (15s): wait after failing the health check before the first
    /// poll, so load balancers notice Envoy is not ready.
    pub check_drain_delay: Duration,
    /// `--min-open-connections` (0): the drain is complete at or below this count.
    pub min_open_connections: u64,
    /// `--min-drain-duration` (0s): the drain never completes as "drained" earlier than
    /// this after `/drain` was called (the drain timeout still applies).
    pub min_drain_duration: Duration,
    /// `--drain-timeout` (300s, the default `drain-time` annotation): the drain completes
    /// regardless of open connections this long after `/drain` was called.
    pub drain_timeout: Duration,
    /// `--ready-timeout` (330s = default drain timeout + 30s, so a drain that ends by
    /// timeout still unblocks `/shutdown` with 200): `/shutdown` answers 500 after this.
    pub ready_timeout: Duration,
    /// Consecutive failed polls of Envoy's admin after which Envoy counts as gone and
    /// the drain completes (3); 0 disables this.
    pub envoy_gone_after: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            port: marin3r_wire::ports::SHUTDOWN_MANAGER,
            bind_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            envoy_admin_address: format!("http://localhost:{}", marin3r_wire::ports::ENVOY_ADMIN),
            ready_file: PathBuf::from("/tmp/shutdown-ok"),
            check_ready_interval: Duration::from_secs(1),
            check_drain_interval: Duration::from_secs(5),
            start_drain_delay: Duration::ZERO,
            check_drain_delay: Duration::from_secs(15),
            min_open_connections: 0,
            min_drain_duration: Duration::ZERO,
            drain_timeout: Duration::from_secs(300),
            ready_timeout: Duration::from_secs(330),
            envoy_gone_after: 3,
        }
    }
}

/// Errors of the shutdown manager.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownManagerError {
    /// A duration flag could not be parsed.
    #[error("invalid duration {input:?}: {reason}")]
    InvalidDuration {
        /// The rejected input.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The Envoy admin address is not a usable `http://host:port` URL.
    #[error("invalid envoy admin address {address:?}: {reason}")]
    InvalidAdminAddress {
        /// The rejected address.
        address: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A setting is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The HTTP listener could not be bound.
    #[error("cannot listen on {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A request to Envoy's admin failed (connect, I/O, body too large).
    #[error("request to envoy admin {url} failed")]
    AdminRequest {
        /// The requested URL.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request to Envoy's admin took too long.
    #[error("request to envoy admin {url} timed out after {timeout:?}")]
    AdminTimeout {
        /// The requested URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Envoy's admin answered with a non-2xx status.
    #[error("envoy admin {url} answered {status}: {body}")]
    AdminStatus {
        /// The requested URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// The stats body is not Envoy's text stats format.
    #[error("invalid envoy stats at line {line}: {reason}: {content:?}")]
    InvalidStats {
        /// 1-based line number (0 when the whole body is unusable).
        line: usize,
        /// The offending line, truncated.
        content: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The ready file could not be created.
    #[error("cannot create ready file {path}")]
    ReadyFile {
        /// The ready file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
