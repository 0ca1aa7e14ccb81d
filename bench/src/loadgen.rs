//! An HTTPS keep-alive load generator: `concurrency` HTTP/1.1 connections over
//! tokio-rustls, each sending the same POST back to back (max-rate mode) or on a fixed
//! schedule (fixed-rate mode, open loop: a request's latency counts from when it was due,
//! so a stalled server cannot hide its queueing — no coordinated omission).
//!
//! Every run is bounded: by its duration and optionally by a request budget.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::stats::Percentiles;

/// Bound of one request (and of connecting).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What to load: one POST, repeated.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// TLS server name (SNI and certificate check).
    pub server_name: ServerName<'static>,
    pub tls: Arc<rustls::ClientConfig>,
    pub path: String,
    pub body: Bytes,
}

impl Target {
    /// A target trusting only `ca_pem`, SNI `localhost`, ALPN `http/1.1`.
    pub fn new(addr: SocketAddr, ca_pem: &str, path: &str, body: Bytes) -> Result<Self> {
        Ok(Self {
            addr,
            server_name: ServerName::try_from("localhost")?.to_owned(),
            tls: client_config(ca_pem)?,
            path: path.to_string(),
            body,
        })
    }
}

/// A rustls client config (ring, TLS 1.2 + 1.3) trusting only `ca_pem`, ALPN `http/1.1`.
pub fn client_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>> {
    marin3r_testkit::tls::client_config(ca_pem)
        .alpn(b"http/1.1")
        .build()
        .map_err(|e| anyhow!(e))
}

/// How fast to send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// Each connection sends its next request as soon as the previous answer is in.
    Max,
    /// This many requests per second in total, spread evenly over the connections.
    Fixed(f64),
}

/// One run of load.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub concurrency: usize,
    pub rate: Rate,
    /// Requests (not recorded) before the measurement, on the same connections.
    pub warmup: Duration,
    /// Length of the measurement.
    pub duration: Duration,
    /// Stop after this many measured requests in total (whichever comes first).
    pub max_requests: Option<u64>,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// Answered with 200 during the measurement.
    pub requests: u64,
    /// Failed (not 200, I/O error, timeout) during the measurement.
    pub errors: u64,
    /// From the start of the measurement to the last answer.
    pub elapsed: Duration,
    pub latency: Percentiles,
}

impl LoadResult {
    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.requests as f64 / secs
        } else {
            0.0
        }
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// A keep-alive HTTP/1.1 connection over TLS to `target`.
async fn connect(target: &Target) -> Result<Sender> {
    let fut = async {
        let tcp = TcpStream::connect(target.addr)
            .await
            .with_context(|| format!("connect {}", target.addr))?;
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(target.tls.clone())
            .connect(target.server_name.clone(), tcp)
            .await
            .context("TLS handshake")?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok::<_, anyhow::Error>(sender)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| anyhow!("connecting to {} timed out", target.addr))?
}

/// One POST on `sender`; the answer's status and body.
pub async fn post(sender: &mut Sender, target: &Target) -> Result<(u16, Bytes)> {
    let fut = async {
        sender.ready().await?;
        let request = hyper::Request::post(target.path.as_str())
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(target.body.clone()))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, anyhow::Error>((status, body))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| anyhow!("request timed out"))?
}

/// One request on a fresh connection: the answer's status and body (sanity checks).
pub async fn once(target: &Target) -> Result<(u16, Bytes)> {
    let mut sender = connect(target).await?;
    post(&mut sender, target).await
}

struct WorkerOut {
    latencies: Vec<Duration>,
    errors: u64,
    finished: Instant,
}

/// Runs `load` against `target`.
pub async fn run(target: &Target, load: Load) -> Result<LoadResult> {
    if load.concurrency == 0 {
        bail!("concurrency must be at least 1");
    }
    if let Rate::Fixed(r) = load.rate
        && !(r.is_finite() && r > 0.0)
    {
        bail!("the fixed rate must be positive, got {r}");
    }
    // Every connection is up before the clock starts.
    let mut senders = Vec::with_capacity(load.concurrency);
    for _ in 0..load.concurrency {
        senders.push(connect(target).await?);
    }
    let warmup_end = Instant::now() + load.warmup;
    let start = warmup_end;
    let end = start + load.duration;
    let budget = Arc::new(AtomicU64::new(load.max_requests.unwrap_or(u64::MAX)));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, sender) in senders.into_iter().enumerate() {
        let target = target.clone();
        let budget = budget.clone();
        tasks.spawn(worker(target, load, i, sender, warmup_end, end, budget));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut finished = start;
    while let Some(out) = tasks.join_next().await {
        let out = out??;
        latencies.extend(out.latencies);
        errors += out.errors;
        finished = finished.max(out.finished);
    }
    let requests = latencies.len() as u64;
    let latency = Percentiles::of(&mut latencies).unwrap_or_default();
    Ok(LoadResult {
        requests,
        errors,
        elapsed: finished.saturating_duration_since(start),
        latency,
    })
}

/// Takes one request from the shared budget; false when it is spent.
fn take(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(1))
        .is_ok()
}

async fn worker(
    target: Target,
    load: Load,
    index: usize,
    mut sender: Sender,
    warmup_end: Instant,
    end: Instant,
    budget: Arc<AtomicU64>,
) -> Result<WorkerOut> {
    let mut out = WorkerOut {
        latencies: Vec::new(),
        errors: 0,
        finished: warmup_end,
    };
    // Warm-up: back to back, not recorded.
    while Instant::now() < warmup_end {
        if post(&mut sender, &target).await.is_err() {
            sender = connect(&target).await?;
        }
    }
    // Fixed rate: this connection's share, phase-shifted so the connections interleave.
    let interval = match load.rate {
        Rate::Max => None,
        Rate::Fixed(r) => Some(Duration::from_secs_f64(load.concurrency as f64 / r)),
    };
    let mut due = warmup_end;
    if let Some(interval) = interval {
        due += interval.mul_f64(index as f64 / load.concurrency as f64);
    }
    loop {
        if let Some(interval) = interval {
            if due >= end {
                break;
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
            due += interval;
        } else if Instant::now() >= end {
            break;
        }
        if !take(&budget) {
            break;
        }
        // Open loop: latency from when the request was due (fixed rate) or sent (max).
        let sent = match interval {
            Some(i) => due - i,
            None => Instant::now(),
        };
        match post(&mut sender, &target).await {
            Ok((200, _)) => out.latencies.push(sent.elapsed()),
            Ok(_) => out.errors += 1,
            Err(_) => {
                out.errors += 1;
                sender = connect(&target).await?;
            }
        }
    }
    out.finished = Instant::now();
    Ok(out)
}
