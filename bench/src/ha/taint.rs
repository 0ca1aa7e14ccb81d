//! Fleet taint latency: every stream of one node, spread over the three replicas by the
//! balancer, rejects an update; how long from the last NACK any of them sent (and from
//! the edit) until the revision's `status.tainted` is in the API server.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use marin3r_tests::ha::Fleet;

use super::{CONVERGE, POLL, desired_version, edit_spec, rolled_back, settled, spec};
use crate::ads::{LISTENER, Nack, Rejection, Swarm};

/// The node (and EnvoyConfig) of the taint runs.
pub const NODE: &str = "taint";

/// One broken update, rejected by every stream until the taint.
#[derive(Debug, Clone)]
pub struct TaintRun {
    /// The edit → the first NACK of the broken listener.
    pub first_nack: Duration,
    /// The last NACK sent before the taint was seen → the taint seen in the API server.
    pub last_nack_to_taint: Duration,
    /// The edit → the taint seen in the API server.
    pub edit_to_taint: Duration,
    /// NACKs sent before the taint was seen: the fewest of one stream, and all of them.
    pub min_nacks_per_stream: usize,
    pub nacks: usize,
    /// The last NACK → every stream ACKed the listener it runs again: the replicas went
    /// back to the previous revision and sent it (often before the bench's poll saw the
    /// taint).
    pub restored: Duration,
}

/// What [`measure`] found.
#[derive(Debug, Clone, Default)]
pub struct Taint {
    pub streams: usize,
    /// Open streams of the node per replica (from their metrics).
    pub spread: Vec<(String, usize)>,
    pub runs: Vec<TaintRun>,
    /// Connections that ended during the runs (should be none).
    pub disconnects: usize,
}

/// `runs` broken updates, each after a good one, on a fresh fleet with `streams` streams.
pub async fn measure(
    servers: &tokio::runtime::Handle,
    streams: usize,
    runs: usize,
) -> Result<Taint> {
    let nodes = [NODE.to_string()];
    super::with_fleet_and_swarm(servers, &nodes, streams, async |fleet, swarm, started| {
        runs_on(fleet, swarm, started, runs).await
    })
    .await
}

async fn runs_on(
    fleet: &Fleet,
    swarm: &mut Swarm,
    connecting: Instant,
    runs: usize,
) -> Result<Taint> {
    swarm.wait_converged(connecting, CONVERGE).await?;
    let mut out = Taint {
        streams: swarm.len(),
        ..Taint::default()
    };
    out.spread = fleet
        .streams(NODE)
        .await
        .into_iter()
        .map(|(name, n)| (name, n as usize))
        .collect();
    for run in 0..runs as u32 {
        if run > 0 {
            let before = desired_version(fleet, NODE);
            swarm
                .measure_change(|| edit_spec(fleet, NODE, spec(NODE, run, false)), CONVERGE)
                .await?;
            super::wait_status(fleet, NODE, "the good update on every replica", |s| {
                settled(s, before.as_deref())
            })
            .await?;
        } else {
            super::wait_status(fleet, NODE, "served by every replica", |s| settled(s, None))
                .await?;
        }
        super::stagger(run as usize, runs).await;
        let r = broken_update(fleet, swarm, run).await?;
        eprintln!(
            "   taint run {run}: edit → taint {:.2} s, last NACK → taint {:.0} ms, first NACK after {:.0} ms, ≥ {} NACKs per stream",
            r.edit_to_taint.as_secs_f64(),
            crate::stats::ms(r.last_nack_to_taint),
            crate::stats::ms(r.first_nack),
            r.min_nacks_per_stream
        );
        out.runs.push(r);
    }
    swarm.drain()?;
    out.disconnects = swarm.disconnects();
    Ok(out)
}

/// The names of the tainted revisions.
fn tainted(fleet: &Fleet) -> BTreeSet<String> {
    fleet
        .revisions()
        .into_iter()
        .filter(|r| r["status"]["tainted"] == true)
        .filter_map(|r| r["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Applies a broken update every stream rejects and times the taint.
async fn broken_update(fleet: &Fleet, swarm: &mut Swarm, run: u32) -> Result<TaintRun> {
    let before = tainted(fleet);
    swarm.drain()?;
    swarm.clear_nacks();
    swarm.set_rejection(Rejection::NewVersions { slot: LISTENER });
    let edited = Instant::now();
    edit_spec(fleet, NODE, spec(NODE, run, true))?;
    let deadline = edited + CONVERGE;
    let seen = loop {
        swarm.drain()?;
        if tainted(fleet).difference(&before).next().is_some() {
            break Instant::now();
        }
        if Instant::now() > deadline {
            bail!(
                "run {run}: no taint within {CONVERGE:?} ({} NACKs)",
                swarm.nacks().len()
            );
        }
        tokio::time::sleep(POLL).await;
    };
    swarm.drain()?;
    let nacks: Vec<Nack> = swarm
        .nacks()
        .iter()
        .filter(|n| n.at <= seen)
        .cloned()
        .collect();
    let (Some(first), Some(last)) = (
        nacks.iter().map(|n| n.at).min(),
        nacks.iter().map(|n| n.at).max(),
    ) else {
        bail!("run {run}: tainted without a NACK");
    };
    let mut per_stream = vec![0usize; swarm.len()];
    for n in &nacks {
        if let Some(c) = per_stream.get_mut(n.stream) {
            *c += 1;
        }
    }
    swarm
        .wait_until(
            "the previous listener again on every stream",
            CONVERGE,
            |s| s.all_acked_since(LISTENER, last).is_some(),
        )
        .await
        .map_err(|e| {
            let status = fleet.envoyconfig(NODE).map(|ec| ec["status"].clone());
            let revisions: Vec<_> = fleet
                .revisions()
                .iter()
                .map(|r| r["status"].clone())
                .collect();
            anyhow!("{e:#}; status {status:?}; revisions {revisions:?}")
        })?;
    let restored = swarm
        .all_acked_since(LISTENER, last)
        .ok_or_else(|| anyhow!("run {run}: the previous listener is not back"))?;
    super::wait_status(fleet, NODE, "rolled back on every replica", rolled_back).await?;
    swarm.set_rejection(Rejection::None);
    Ok(TaintRun {
        first_nack: first.saturating_duration_since(edited),
        last_nack_to_taint: seen.saturating_duration_since(last),
        edit_to_taint: seen.saturating_duration_since(edited),
        min_nacks_per_stream: per_stream.iter().copied().min().unwrap_or_default(),
        nacks: nacks.len(),
        restored: restored.saturating_duration_since(last),
    })
}
