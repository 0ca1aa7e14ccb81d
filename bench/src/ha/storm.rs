//! Reconnect storm: `streams` streams over three replicas, one replica killed (a crash:
//! no drain), the time until every stream it held is open again on the others and has
//! accepted its versions again.
//!
//! The swarm holds one descriptor per stream and so does the fleet; with 10,000 streams
//! both together pass the open-files limit of one process (20,000 on the bench machine),
//! so the fleet runs in a child process (`marin3r-bench --ha-fleet-process N`, which
//! talks JSON lines over its stdin and stdout) and the swarm dials the replicas
//! directly, round-robin, skipping an address that refuses: the test balancer would
//! need two more descriptors per stream. Like the harness's balancer (and kube-proxy
//! once the endpoint is gone), the dead replica's address is dropped from the targets
//! at the kill.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use marin3r_tests::ha::{Fleet, api_server};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{CONVERGE, REPLICAS, fleet_options, node_ids};
use crate::ads::{Recovery, Swarm, SwarmConfig};
use crate::process::{cpu_seconds, open_files_limit, rss_kib, status_kib};

/// Bound of the fleet process's start (100 EnvoyConfigs published on three replicas).
const START: Duration = Duration::from_secs(120);
/// Bound of the swarm's connect, and of the recovery.
const CONNECT: Duration = Duration::from_secs(240);
const RECOVER: Duration = Duration::from_secs(120);
/// Descriptors besides the streams' (listeners, the runtime, the fake API server).
const SLACK: u64 = 512;

/// What [`measure`] found.
#[derive(Debug, Clone, Default)]
pub struct Storm {
    pub configs: usize,
    pub streams: usize,
    /// Swarm start → every stream configured.
    pub connect: Duration,
    /// Open streams per replica before the kill, and after the recovery.
    pub before: Vec<(String, usize)>,
    pub after: Vec<(String, usize)>,
    pub leader: String,
    pub victim: String,
    /// The victim's streams: when each one saw its connection end, opened its ADS
    /// stream again and had its versions again, from the kill.
    pub recovery: Recovery,
    /// Their reconnect attempts that failed before an ADS stream opened.
    pub failed_attempts: u32,
    /// CPU seconds from the kill until every stream was served: the fleet process's,
    /// and this one's (the swarm), over `recovery_wall` seconds.
    pub fleet_cpu: f64,
    pub swarm_cpu: f64,
    pub recovery_wall: f64,
    /// Streams per second at the swarm's first connect (every stream configured).
    pub connect_rate: f64,
    /// `VmRSS` of the fleet process: before the kill, the highest sampled (every 10 ms)
    /// until every stream was served, and after; `VmHWM` since the kill (reset through
    /// `/proc/<pid>/clear_refs`; `None` if that failed).
    pub rss_before_kib: u64,
    pub rss_peak_kib: u64,
    pub rss_after_kib: u64,
    pub hwm_kib: Option<u64>,
}

/// The fleet in a child process; killed when dropped.
struct FleetProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<std::io::Result<String>>,
}

impl FleetProcess {
    fn spawn(exe: &Path, configs: usize) -> Result<Self> {
        let mut child = Command::new(exe)
            .arg("--ha-fleet-process")
            .arg(configs.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start {} --ha-fleet-process", exe.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("the fleet process has no stdout"))?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Self {
            stdin: child.stdin.take(),
            child,
            lines,
        })
    }

    fn id(&self) -> u32 {
        self.child.id()
    }

    async fn line(&mut self, within: Duration) -> Result<Value> {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(line)) => Ok(serde_json::from_str(&line?)?),
            Ok(None) => bail!("the fleet process exited"),
            Err(_) => bail!("the fleet process said nothing for {within:?}"),
        }
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the fleet process's stdin is closed"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }
}

impl Drop for FleetProcess {
    fn drop(&mut self) {
        // Closing its stdin lets it stop; the kill covers a process that does not.
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fleet process's first line.
struct Ready {
    replicas: BTreeMap<String, SocketAddr>,
    leader: String,
    nodes: Vec<String>,
    ca: String,
    cert: String,
    key: String,
}

impl Ready {
    fn parse(v: &Value) -> Result<Self> {
        let text = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("the fleet process's {k} is missing: {v}"))
        };
        let replicas = v["replicas"]
            .as_object()
            .ok_or_else(|| anyhow!("no replicas: {v}"))?
            .iter()
            .map(|(name, addr)| {
                let addr = addr.as_str().unwrap_or_default().parse()?;
                Ok((name.clone(), addr))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        let nodes = v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        Ok(Self {
            replicas,
            leader: text("leader")?,
            nodes,
            ca: text("ca")?,
            cert: text("cert")?,
            key: text("key")?,
        })
    }
}

/// Kills a replica of a fleet of three (in a child process, `exe --ha-fleet-process`)
/// serving `configs` EnvoyConfigs to `streams` streams.
pub async fn measure(exe: &Path, configs: usize, streams: usize) -> Result<Storm> {
    let limit = open_files_limit()?;
    if (streams as u64) + SLACK > limit {
        bail!(
            "{streams} streams: the open-files limit is {limit} (scripts/bench raises it with ulimit -n)"
        );
    }
    let mut fleet = FleetProcess::spawn(exe, configs)?;
    let ready = Ready::parse(&fleet.line(START).await?)?;
    let config = SwarmConfig {
        targets: ready.replicas.values().copied().collect(),
        ca_pem: ready.ca.clone(),
        client_cert_pem: ready.cert.clone(),
        client_key_pem: ready.key.clone(),
        node_ids: ready.nodes.clone(),
        streams,
        connect_parallelism: 64,
        reconnect: true,
        eds: Default::default(),
        api: Default::default(),
    };
    let connecting = Instant::now();
    let mut swarm = Swarm::connect(&config)?;
    let result = storm(&mut fleet, &mut swarm, &ready, connecting).await;
    // The fleet goes first (its side keeps the TIME_WAIT), then the swarm, which must
    // not reconnect meanwhile.
    swarm.set_targets(&[])?;
    drop(fleet);
    swarm.shutdown().await;
    result
}

fn per_replica(swarm: &Swarm, ready: &Ready) -> Vec<(String, usize)> {
    let spread = swarm.spread();
    ready
        .replicas
        .iter()
        .map(|(name, addr)| (name.clone(), spread.get(addr).copied().unwrap_or_default()))
        .collect()
}

async fn storm(
    fleet: &mut FleetProcess,
    swarm: &mut Swarm,
    ready: &Ready,
    connecting: Instant,
) -> Result<Storm> {
    let connect = swarm.wait_configured(connecting, CONNECT).await?;
    eprintln!(
        "   storm: {} streams over {} nodes configured in {:.1} s",
        swarm.len(),
        ready.nodes.len(),
        connect.as_secs_f64()
    );
    // The replicas' reports catch up with the new streams.
    tokio::time::sleep(Duration::from_secs(2)).await;
    swarm.drain()?;
    let before = per_replica(swarm, ready);
    let (victim, victim_addr) = ready
        .replicas
        .iter()
        .find(|(name, _)| **name != ready.leader)
        .map(|(n, a)| (n.clone(), *a))
        .ok_or_else(|| anyhow!("no replica other than the leader"))?;
    let survivors: Vec<SocketAddr> = ready
        .replicas
        .values()
        .copied()
        .filter(|a| *a != victim_addr)
        .collect();
    let victims = swarm.streams_on(victim_addr);
    let failed_before = swarm.failed_attempts(&victims);
    let expected = swarm.versions().to_vec();
    let pid = fleet.id();
    let rss_before_kib = rss_kib(pid)?;
    let hwm_reset = std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let sampling = sampling.clone();
        async move {
            let mut peak = 0;
            while sampling.load(Ordering::Relaxed) {
                peak = rss_kib(pid).unwrap_or_default().max(peak);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            peak
        }
    });

    let cpu = |pid: u32| cpu_seconds(pid).unwrap_or(f64::NAN);
    let (fleet_cpu0, swarm_cpu0) = (cpu(pid), cpu(std::process::id()));
    let killed = Instant::now();
    fleet.send(&format!("kill {victim}"))?;
    swarm.set_targets(&survivors)?;
    let recovery = swarm
        .wait_recovered(&victims, &expected, killed, RECOVER)
        .await;
    let recovery_wall = killed.elapsed().as_secs_f64();
    let (fleet_cpu, swarm_cpu) = (cpu(pid) - fleet_cpu0, cpu(std::process::id()) - swarm_cpu0);
    sampling.store(false, Ordering::Relaxed);
    let rss_peak_kib = sampler.await?;
    let recovery = recovery?;
    let answer = fleet.line(Duration::from_secs(10)).await?;
    if answer["killed"] != victim.as_str() {
        bail!("the fleet process answered {answer} to the kill of {victim}");
    }
    eprintln!(
        "   storm: {victim} killed; its {} streams open again within {:.2} s, served within {:.2} s",
        victims.len(),
        recovery
            .reopened
            .last()
            .copied()
            .unwrap_or_default()
            .as_secs_f64(),
        recovery
            .served
            .last()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    );
    let failed_attempts = swarm.failed_attempts(&victims) - failed_before;
    Ok(Storm {
        configs: ready.nodes.len(),
        streams: swarm.len(),
        connect,
        before,
        after: per_replica(swarm, ready),
        leader: ready.leader.clone(),
        victim,
        recovery,
        failed_attempts,
        fleet_cpu,
        swarm_cpu,
        recovery_wall,
        connect_rate: swarm.len() as f64 / connect.as_secs_f64().max(1e-9),
        rss_before_kib,
        rss_peak_kib,
        rss_after_kib: rss_kib(pid)?,
        hwm_kib: hwm_reset.then(|| status_kib(pid, "VmHWM").ok()).flatten(),
    })
}

/// The child process: three replicas serving `configs` EnvoyConfigs; prints its
/// replicas, leader, node ids and client certificate as one JSON line, then kills the
/// replica each `kill <name>` line of its stdin names (answering `{"killed": name}`);
/// stops at the end of its stdin.
pub fn fleet_process(configs: usize) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fleet")
        .enable_all()
        .build()
        .context("fleet runtime")?;
    runtime.block_on(async {
        let mut fleet = Fleet::start(api_server(), REPLICAS, fleet_options())
            .await
            .map_err(|e| anyhow!(e))?;
        fleet.wait_leader(CONVERGE).await.map_err(|e| anyhow!(e))?;
        let nodes = node_ids(configs.max(1));
        super::publish(&fleet, &nodes).await?;
        let leader = fleet.leader().await.unwrap_or_default();
        let replicas: serde_json::Map<String, Value> = fleet
            .replicas
            .values()
            .map(|r| (r.name.clone(), json!(r.server.xdss.to_string())))
            .collect();
        say(&json!({
            "replicas": replicas,
            "leader": leader,
            "nodes": nodes,
            "ca": fleet.bundle.ca.cert_pem,
            "cert": fleet.bundle.client.cert_pem,
            "key": fleet.bundle.client.key_pem,
        }))?;
        let (tx, mut commands) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        while let Some(line) = commands.recv().await {
            let line = line?;
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["kill", name] => {
                    fleet.kill_replica(name).map_err(|e| anyhow!(e))?;
                    say(&json!({"killed": name}))?;
                }
                _ => bail!("unknown command {line:?}"),
            }
        }
        Ok(())
    })
}

fn say(v: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()?;
    Ok(())
}
