//! Edit → serve: how long after a config file is replaced does Envoy serve the new config,
//! without being restarted. Printed, not asserted.
//!
//! For SotW and for Delta: the discovery service in-process serving a local config folder
//! with the walkthrough's direct-response listener, and one real Envoy 1.40 talking ADS to
//! it over mTLS (the harness in `marin3r_tests::xds`, as in `tests/tests/xds_e2e.rs`). Then
//! [`EDITS`] times: replace the file atomically with a new direct-response body and poll
//! Envoy's listener every [`PROBE_INTERVAL`] until it answers with that body (at most
//! [`DEADLINE`]); the time from the rename to the first such answer is one sample.
//!
//! The folder is watched with inotify: the rename wakes the discovery service's scan at
//! once (`control-plane/src/local/backend.rs`), so a sample is that scan, the push to
//! Envoy and its apply. Without inotify (instance or watch limits reached) the folder is
//! scanned every `marin3r_control_plane::local::POLL_INTERVAL` instead, and a sample then
//! depends on where in that period the write lands: answering the previous edit right
//! after a scan and editing at once would put every edit at the same phase, so each edit
//! first waits a different fraction of the period, spreading the writes evenly over it.
//!
//! Everything binds 127.0.0.1. Envoy is killed (and the service stopped) also when
//! something fails; then the reason and Envoy's log tail go to stderr and the exit status
//! is non-zero.
//!
//! Run: `cargo bench -p marin3r-tests --bench edit_to_serve`.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use marin3r_control_plane::local::POLL_INTERVAL;
use marin3r_sidecar::bootstrap::ApiType;
use marin3r_tests::xds::{
    CONVERGE, Envoy, Xds, direct_response_yaml, get, localhost, write_atomic,
};
use marin3r_tests::{find_envoy, free_port};

/// Edits per API flavour.
const EDITS: u32 = 30;
/// How often Envoy's listener is probed while waiting for an edit.
const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// How long one edit may take to be served.
const DEADLINE: Duration = Duration::from_secs(10);
/// Lines of Envoy's log shown on failure.
const LOG_TAIL: usize = 40;

fn main() -> ExitCode {
    // `cargo bench` passes `--bench` (and any filter); there is nothing to select.
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edit_to_serve: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    // The lookup behind `envoy_bin()` (which `Envoy::start` uses, as in the tests), but
    // reported as an error instead of a panic: no Envoy is a failure, never a skip.
    let envoy = find_envoy()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    println!(
        "edit → serve: {EDITS} edits of the direct-response body per API, Envoy's listener probed every {PROBE_INTERVAL:?} (deadline {DEADLINE:?}); Envoy {}",
        envoy.display()
    );
    let mut rows = Vec::new();
    for api in [ApiType::Sotw, ApiType::Delta] {
        let samples = runtime
            .block_on(measure(api))
            .map_err(|e| format!("[{api}] {e}"))?;
        rows.push((api, samples));
    }
    println!();
    println!(
        "{:<6} {:>3} {:>8} {:>8} {:>8} {:>8}",
        "api", "n", "min ms", "p50 ms", "p90 ms", "max ms"
    );
    for (api, samples) in &rows {
        let s = Summary::of(samples).ok_or_else(|| format!("[{api}] no samples"))?;
        println!(
            "{:<6} {:>3} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            api.as_str(),
            s.n,
            ms(s.min),
            ms(s.p50),
            ms(s.p90),
            ms(s.max)
        );
    }
    println!(
        "note: the config folder is watched with inotify (control-plane/src/local/backend.rs): the rename wakes the scan at once, so a figure is the scan, the push to Envoy and its apply; without inotify the folder is scanned every {} ms (POLL_INTERVAL) and an edit may wait up to that long first.",
        POLL_INTERVAL.as_millis()
    );
    Ok(())
}

/// Starts the service and one Envoy for `api`, then times [`EDITS`] edits. Envoy is
/// killed and the service stopped before returning, on success and on failure.
async fn measure(api: ApiType) -> Result<Vec<Duration>, String> {
    let node = format!("bench-edit-{api}");
    let port = free_port().map_err(|e| format!("free port: {e}"))?;
    let xds = Xds::start(&[(
        "config.yaml",
        direct_response_yaml(&node, port, "initial\n")?,
    )])
    .await?;
    let mut envoy = Envoy::start(&xds, &node, api)?;
    let result = edits(&xds, &mut envoy, &node, port).await;
    let result = result.map_err(|e| format!("{e}\n{}", envoy.log_report(LOG_TAIL)));
    // Envoy must be gone before the service stops: open ADS streams hold a graceful stop.
    drop(envoy);
    let samples = result?;
    xds.stop().await?;
    Ok(samples)
}

async fn edits(
    xds: &Xds,
    envoy: &mut Envoy,
    node: &str,
    port: u16,
) -> Result<Vec<Duration>, String> {
    let addr = localhost(port);
    let file = xds.file("config.yaml");
    envoy
        .wait_body_every(addr, "initial\n", CONVERGE, PROBE_INTERVAL)
        .await?;
    let mut samples = Vec::new();
    for i in 0..EDITS {
        // Spread the writes over the folder's poll period (7 and 30 are coprime, so each
        // of the 30 offsets k/30 · POLL_INTERVAL is used once).
        tokio::time::sleep(POLL_INTERVAL * ((i * 7) % EDITS) / EDITS).await;
        let body = format!("edit {i}\n");
        let yaml = direct_response_yaml(node, port, &body)?;
        write_atomic(&file, &yaml)?;
        let written = Instant::now();
        envoy
            .wait_body_every(addr, &body, DEADLINE, PROBE_INTERVAL)
            .await
            .map_err(|e| format!("edit {i}: {e}"))?;
        samples.push(written.elapsed());
    }
    // The same Envoy process served every edit.
    envoy.check_running()?;
    // Still the last body (no flapping back).
    let r = get(addr, "/").await?;
    let last = format!("edit {}\n", EDITS - 1);
    if (r.status, r.body.as_str()) != (200, last.as_str()) {
        return Err(format!(
            "after the last edit: status {} body {:?}",
            r.status, r.body
        ));
    }
    Ok(samples)
}

struct Summary {
    n: usize,
    min: Duration,
    p50: Duration,
    p90: Duration,
    max: Duration,
}

impl Summary {
    /// Nearest-rank percentiles.
    fn of(samples: &[Duration]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        sorted.sort();
        let n = sorted.len();
        let rank = |p: usize| sorted.get((p * n).div_ceil(100).max(1) - 1).copied();
        Some(Self {
            n,
            min: *sorted.first()?,
            p50: rank(50)?,
            p90: rank(90)?,
            max: *sorted.last()?,
        })
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
