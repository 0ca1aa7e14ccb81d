//! Kubernetes-mode churn (`--only churn`): `marin3r discovery-service` in Kubernetes
//! mode as a separate process, against the stateful fake API server of this process
//! (served over HTTP, [`http`]), with EnvoyConfigs (some generating their endpoints
//! from EndpointSlices), EndpointSlices and the injected Pods of an ADS swarm
//! ([`crate::ads`], real mTLS, SotW or delta); then, for the run's length:
//!
//! - pod churn: streams closed and opened again as new pods (new names; the old Pod
//!   deleted from the API server, a new one created), at the rate that makes
//!   `pod_lifetimes` lifetimes pass in the run;
//! - EndpointSlice churn: `slice_rate` writes per second, round-robin over the slices,
//!   each adding, removing or turning (not) ready an endpoint and moving the slice's
//!   marker endpoint to the write's sequence number ([`crate::ads::marker_ip`]), so a
//!   stream tells which writes a ClusterLoadAssignment contains;
//! - every second: the discovery service's RSS, CPU and `/metrics` (size, open streams,
//!   EnvoyConfigs per cache state), and the EDS latencies of the writes completed in
//!   that second ([`Deliveries`]: from the write until every stream of the nodes
//!   reading the slice had a ClusterLoadAssignment containing it).
//!
//! [`report`] writes the report's section and the plots.

pub mod http;
pub mod report;
pub mod world;

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use marin3r_testkit::apiserver::FakeApiServer;

use crate::ads::{AdsApi, ResponseCounts, Swarm, SwarmConfig};
use crate::machine::load_average;
use crate::process::{DiscoveryService, cpu_seconds, open_files_limit, rss_kib, status_kib};
use world::{Layout, NS, Slice};

/// Bound of the discovery service publishing every EnvoyConfig.
const PUBLISH: Duration = Duration::from_secs(600);
/// Bound of the swarm's connect (every stream configured, EDS included).
const CONNECT: Duration = Duration::from_secs(300);
/// A write not delivered to every affected stream within this is counted lost.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the fake API server sends bookmarks to its watches.
const BOOKMARKS: Duration = Duration::from_secs(10);
/// Writes (and pod replacements) one tick of the churn loop does at most.
const MAX_CATCH_UP: u64 = 20;
/// Descriptors besides the streams' (listeners, the runtime, the API server).
const SLACK: u64 = 512;

/// What a churn run does.
#[derive(Debug, Clone, PartialEq)]
pub struct ChurnOptions {
    pub streams: usize,
    pub layout: Layout,
    /// Pod lifetimes in the run: the first `streams`, then one per replacement.
    pub pod_lifetimes: usize,
    pub seconds: f64,
    /// EndpointSlice writes per second.
    pub slice_rate: f64,
    /// The first part of the run that the flatness figures leave out.
    pub warmup_fraction: f64,
}

impl ChurnOptions {
    /// Pod replacements per second.
    pub fn replace_rate(&self) -> f64 {
        self.pod_lifetimes.saturating_sub(self.streams) as f64 / self.seconds.max(1e-9)
    }

    /// How much faster than "10 % of the pods replaced per minute" the run goes.
    pub fn acceleration(&self) -> f64 {
        let natural = 0.1 * self.streams as f64 / 60.0;
        self.replace_rate() / natural.max(1e-9)
    }
}

/// One second of a run.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the churn started.
    pub t: f64,
    pub rss_kib: u64,
    /// Cores' worth of CPU the discovery service used since the last sample.
    pub cpu: f64,
    pub metrics_bytes: usize,
    /// `marin3r_xdss_streams`, summed.
    pub streams_metric: f64,
    /// Streams of the swarm with an open ADS stream.
    pub swarm_open: usize,
    /// EnvoyConfigs per cache state (`marin3r_envoyconfig_cache_state` at 1).
    pub states: BTreeMap<String, usize>,
    pub pods_replaced: usize,
    pub writes: u64,
    /// Writes completed in this second: their EDS latency to every affected stream.
    pub completed: Vec<Duration>,
    /// Writes lost so far (not delivered to every affected stream within
    /// [`DELIVERY_TIMEOUT`]), and writes waiting now.
    pub lost: u64,
    pub in_flight: usize,
}

/// A churn run's figures.
#[derive(Debug, Clone)]
pub struct ChurnRun {
    pub api: AdsApi,
    pub options: ChurnOptions,
    /// Discovery service start → every EnvoyConfig published.
    pub publish: Duration,
    /// Swarm start → every stream configured (clusters, listeners, EDS).
    pub connect: Duration,
    pub rss_before_swarm_kib: u64,
    pub rss_connected_kib: u64,
    pub hwm_kib: u64,
    pub samples: Vec<Sample>,
    /// Per write: until every affected stream had it (completed writes).
    pub latencies: Vec<Duration>,
    /// Per (write, stream): until that stream had it.
    pub stream_latencies: u64,
    /// Writes some affected stream never had within [`DELIVERY_TIMEOUT`].
    pub lost: u64,
    pub writes: u64,
    /// Affected streams summed over the writes (the EDS responses the writes call for).
    pub expected_pushes: u64,
    pub counts: ResponseCounts,
    pub pods_replaced: usize,
    pub disconnects: usize,
    /// Requests (and writes among them) the discovery service sent to the API server
    /// during the churn.
    pub api_requests: usize,
    pub api_writes: usize,
    pub elapsed: Duration,
    pub load_start: Option<[f64; 3]>,
    pub load_end: Option<[f64; 3]>,
}

/// Writes in flight until every affected stream had them, per Service.
#[derive(Debug, Default)]
pub struct Deliveries {
    pending: BTreeMap<usize, VecDeque<Pending>>,
    /// Per stream, the highest marker it had (since its last replacement).
    had: Vec<u64>,
    /// Completed writes since the last [`Deliveries::take_completed`].
    completed: Vec<Duration>,
    pub stream_samples: u64,
    pub lost: u64,
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    at: Instant,
    outstanding: Vec<usize>,
    worst: Duration,
}

impl Deliveries {
    pub fn new(streams: usize) -> Self {
        Self {
            had: vec![0; streams],
            ..Self::default()
        }
    }

    /// Write `seq` to a slice of `service` at `at`, which `affected` streams must get.
    pub fn write(&mut self, seq: u64, service: usize, at: Instant, affected: Vec<usize>) {
        let outstanding: Vec<usize> = affected
            .into_iter()
            .filter(|&s| self.had.get(s).is_some_and(|&m| m < seq))
            .collect();
        if outstanding.is_empty() {
            self.completed.push(Duration::ZERO);
            return;
        }
        self.pending.entry(service).or_default().push_back(Pending {
            seq,
            at,
            outstanding,
            worst: Duration::ZERO,
        });
    }

    /// Stream `stream` had a ClusterLoadAssignment of `service` with `marker` at `at`.
    pub fn update(&mut self, stream: usize, service: usize, marker: u64, at: Instant) {
        if let Some(m) = self.had.get_mut(stream) {
            *m = (*m).max(marker);
        }
        let Some(queue) = self.pending.get_mut(&service) else {
            return;
        };
        for w in queue.iter_mut().filter(|w| w.seq <= marker) {
            if let Some(pos) = w.outstanding.iter().position(|&s| s == stream) {
                w.outstanding.swap_remove(pos);
                w.worst = w.worst.max(at.saturating_duration_since(w.at));
                self.stream_samples += 1;
            }
        }
        self.settle(service);
    }

    /// Stream `stream` was closed (replaced): no write waits for it any more, and its
    /// next connection starts from nothing.
    pub fn excuse(&mut self, stream: usize, service: usize) {
        if let Some(m) = self.had.get_mut(stream) {
            *m = 0;
        }
        if let Some(queue) = self.pending.get_mut(&service) {
            for w in queue.iter_mut() {
                w.outstanding.retain(|&s| s != stream);
            }
        }
        self.settle(service);
    }

    /// Counts writes older than `timeout` as lost.
    pub fn expire(&mut self, now: Instant, timeout: Duration) {
        for queue in self.pending.values_mut() {
            let before = queue.len();
            queue.retain(|w| now.saturating_duration_since(w.at) < timeout);
            self.lost += (before - queue.len()) as u64;
        }
    }

    fn settle(&mut self, service: usize) {
        if let Some(queue) = self.pending.get_mut(&service) {
            let completed = &mut self.completed;
            queue.retain(|w| {
                let done = w.outstanding.is_empty();
                if done {
                    completed.push(w.worst);
                }
                !done
            });
        }
    }

    pub fn in_flight(&self) -> usize {
        self.pending.values().map(VecDeque::len).sum()
    }

    pub fn take_completed(&mut self) -> Vec<Duration> {
        std::mem::take(&mut self.completed)
    }
}

/// The figures `/metrics` gives: its size, open streams (`marin3r_xdss_streams`,
/// summed) and EnvoyConfigs per cache state.
pub fn parse_metrics(text: &str) -> (usize, f64, BTreeMap<String, usize>) {
    let mut streams = 0.0;
    let mut states = BTreeMap::new();
    for line in text.lines() {
        let value = || {
            line.rsplit_once(' ')
                .and_then(|(_, v)| v.parse::<f64>().ok())
        };
        if line.starts_with("marin3r_xdss_streams{") {
            streams += value().unwrap_or(0.0);
        } else if line.starts_with("marin3r_envoyconfig_cache_state{")
            && value() == Some(1.0)
            && let Some(rest) = line.split_once("state=\"").map(|(_, r)| r)
            && let Some((state, _)) = rest.split_once('"')
        {
            *states.entry(state.to_string()).or_default() += 1;
        }
    }
    (text.len(), streams, states)
}

/// The Service of cluster `name` (`svc-NNN`).
fn service_of_cluster(name: &str) -> Option<usize> {
    name.strip_prefix("svc-")?.parse().ok()
}

/// Whether every EnvoyConfig's status says its desired version is published.
fn published_count(api: &FakeApiServer) -> usize {
    api.list("envoyconfigs")
        .iter()
        .filter(|ec| {
            let s = &ec["status"];
            let desired = s["desiredVersion"].as_str().unwrap_or_default();
            !desired.is_empty() && s["publishedVersion"].as_str() == Some(desired)
        })
        .count()
}

/// One churn run of `api` flavour. `dir` holds the certificates (`certs/`), the
/// kubeconfig and the discovery service's log.
pub async fn measure(
    marin3r: &Path,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    servers: &tokio::runtime::Handle,
    options: &ChurnOptions,
    ads: AdsApi,
) -> Result<ChurnRun> {
    let started = Instant::now();
    let load_start = load_average();
    let limit = open_files_limit()?;
    if (options.streams as u64) + SLACK > limit {
        bail!(
            "{} streams: the open-files limit is {limit} (scripts/bench raises it with ulimit -n)",
            options.streams
        );
    }
    let layout = options.layout;
    let label = format!("churn {ads:?}");
    let api = marin3r_tests::ha::api_server();
    for i in 0..layout.configs {
        api.put(world::envoyconfig(&layout, i))
            .map_err(|e| anyhow!("create EnvoyConfig {i}: {e:?}"))?;
    }
    let mut slices: Vec<Slice> = (0..layout.slices).map(|j| Slice::new(&layout, j)).collect();
    for s in &slices {
        api.put(s.object())
            .map_err(|e| anyhow!("create EndpointSlice {}: {e:?}", s.name()))?;
    }
    let nodes = layout.node_ids();
    for i in 0..options.streams {
        let node = &nodes[i % nodes.len()];
        api.put(world::pod(node, &crate::ads::pod_name(node, i, 0)))
            .map_err(|e| anyhow!("create Pod {i}: {e:?}"))?;
    }
    let http = http::HttpApiServer::start(api.clone(), servers).await?;
    let point = dir.join(format!("churn-{}", format!("{ads:?}").to_lowercase()));
    std::fs::create_dir_all(&point)?;
    let kubeconfig = point.join("kubeconfig");
    http.write_kubeconfig(&kubeconfig, NS)?;
    let log = point.join("discovery-service.log");
    let mut ds =
        DiscoveryService::start_kubernetes(marin3r, &dir.join("certs"), &kubeconfig, NS, &log)
            .await?;
    eprintln!(
        "   {label}: discovery service ready in {:.1} s ({} EnvoyConfigs, {} of them EDS over {} Services, {} EndpointSlices, {} Pods)",
        started.elapsed().as_secs_f64(),
        layout.configs,
        layout.eds_configs,
        layout.services(),
        layout.slices,
        options.streams
    );
    // Every EnvoyConfig published (its revision created and served).
    let deadline = Instant::now() + PUBLISH;
    let mut said = Instant::now();
    loop {
        let n = published_count(&api);
        if n >= layout.configs {
            break;
        }
        ds.check_running()?;
        if Instant::now() > deadline {
            bail!(
                "{label}: {n}/{} EnvoyConfigs published after {PUBLISH:?}",
                layout.configs
            );
        }
        if said.elapsed() > Duration::from_secs(5) {
            eprintln!("   {label}: {n}/{} EnvoyConfigs published", layout.configs);
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let publish = started.elapsed();
    eprintln!(
        "   {label}: every EnvoyConfig published {:.1} s after the start",
        publish.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before_swarm_kib = ds.rss_kib()?;

    let config = SwarmConfig {
        targets: vec![ds.xdss],
        ca_pem: bundle.ca.cert_pem.clone(),
        client_cert_pem: bundle.client.cert_pem.clone(),
        client_key_pem: bundle.client.key_pem.clone(),
        node_ids: nodes.clone(),
        streams: options.streams,
        connect_parallelism: 64,
        reconnect: true,
        eds: layout.eds_subscriptions(),
        api: ads,
    };
    let connecting = Instant::now();
    let mut swarm = Swarm::connect(&config)?;
    let result = churn(
        &api,
        &mut ds,
        &mut swarm,
        &mut slices,
        options,
        &label,
        connecting,
    )
    .await;
    // The server first (its side keeps the TIME_WAIT), then the swarm and the API.
    let hwm_kib = status_kib(ds.process.id(), "VmHWM").unwrap_or_default();
    let still_running = ds.check_running();
    drop(ds);
    swarm.shutdown().await;
    drop(http);
    let mut run = result?;
    still_running?;
    run.rss_before_swarm_kib = rss_before_swarm_kib;
    run.publish = publish;
    run.hwm_kib = hwm_kib;
    run.api = ads;
    run.elapsed = started.elapsed();
    run.load_start = load_start;
    run.load_end = load_average();
    Ok(run)
}

/// Per stream, the Service its node reads (EDS nodes only).
fn stream_services(layout: &Layout, streams: usize) -> Vec<Option<usize>> {
    (0..streams)
        .map(|i| layout.service_of_config(i % layout.configs.max(1)))
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn churn(
    api: &FakeApiServer,
    ds: &mut DiscoveryService,
    swarm: &mut Swarm,
    slices: &mut [Slice],
    options: &ChurnOptions,
    label: &str,
    connecting: Instant,
) -> Result<ChurnRun> {
    let layout = options.layout;
    let services = stream_services(&layout, options.streams);
    let mut by_service: Vec<Vec<usize>> = vec![Vec::new(); layout.services()];
    for (i, s) in services.iter().enumerate() {
        if let Some(list) = s.and_then(|s| by_service.get_mut(s)) {
            list.push(i);
        }
    }
    let eds_streams: usize = by_service.iter().map(Vec::len).sum();
    // Per stream: it had its first ClusterLoadAssignment on its current connection.
    let mut eds_ready = vec![false; options.streams];
    let mut deliveries = Deliveries::new(options.streams);
    let absorb =
        |swarm: &mut Swarm, deliveries: &mut Deliveries, eds_ready: &mut [bool]| -> Result<()> {
            swarm.drain()?;
            for u in swarm.take_eds() {
                let Some(service) = service_of_cluster(&u.cluster) else {
                    continue;
                };
                if let Some(r) = eds_ready.get_mut(u.stream) {
                    *r = true;
                }
                deliveries.update(u.stream, service, u.marker, u.at);
            }
            Ok(())
        };

    let connect = swarm.wait_configured(connecting, CONNECT).await?;
    let deadline = Instant::now() + CONNECT;
    loop {
        absorb(swarm, &mut deliveries, &mut eds_ready)?;
        let ready = eds_ready.iter().filter(|r| **r).count();
        if ready >= eds_streams {
            break;
        }
        if Instant::now() > deadline {
            bail!("{label}: {ready}/{eds_streams} EDS streams had their endpoints");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect = connect.max(connecting.elapsed());
    eprintln!(
        "   {label}: {} streams ({eds_streams} with EDS) configured in {:.1} s",
        options.streams,
        connect.as_secs_f64()
    );
    ds.check_running()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_connected_kib = ds.rss_kib()?;
    let counts_before = swarm.counts();
    let api_mark = api.mark();
    let disconnects_before = swarm.disconnects();
    deliveries.take_completed();

    let pid = ds.process.id();
    let run_for = Duration::from_secs_f64(options.seconds);
    let replace_rate = options.replace_rate();
    let mut samples = Vec::new();
    let mut latencies = Vec::new();
    let mut completed_now = Vec::new();
    let mut seq: u64 = 0;
    let mut replaced = 0usize;
    let mut next_victim = 0usize;
    let mut expected_pushes = 0u64;
    let start = Instant::now();
    let mut next_sample = start + Duration::from_secs(1);
    let mut next_bookmark = start + BOOKMARKS;
    let mut cpu_last = (cpu_seconds(pid)?, start);
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    eprintln!(
        "   {label}: churn for {:.0} s: {:.0} EndpointSlice writes/s, {:.1} pod replacements/s ({:.1}× 10 %/min)",
        options.seconds,
        options.slice_rate,
        replace_rate,
        options.acceleration()
    );
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= run_for {
            break;
        }
        let t = elapsed.as_secs_f64();
        // EndpointSlice writes due by now.
        // At most a tick's worth of catch-up each: the loop yields between ticks (a
        // signal must still get through), and a bench that falls behind shows it in
        // the achieved rates.
        let due = ((t * options.slice_rate) as u64).min(seq + MAX_CATCH_UP);
        while seq < due && !slices.is_empty() {
            seq += 1;
            let Some(slice) = slices.get_mut((seq as usize - 1) % layout.slices.max(1)) else {
                break;
            };
            slice.mutate(seq.min(crate::ads::MAX_MARKER));
            let object = slice.object();
            let service = slice.service;
            let affected: Vec<usize> = by_service
                .get(service)
                .map(|l| {
                    l.iter()
                        .copied()
                        .filter(|&i| eds_ready.get(i).copied().unwrap_or(false))
                        .collect()
                })
                .unwrap_or_default();
            expected_pushes += affected.len() as u64;
            let at = Instant::now();
            api.put(object)
                .map_err(|e| anyhow!("write EndpointSlice: {e:?}"))?;
            deliveries.write(seq, service, at, affected);
        }
        // Pod replacements due by now.
        let due = ((t * replace_rate) as usize).min(replaced + MAX_CATCH_UP as usize);
        while replaced < due && options.streams > 0 {
            let i = next_victim % options.streams;
            next_victim += 1;
            replaced += 1;
            let node = swarm.node_of(i).to_string();
            let (old, new) = swarm.replace(i)?;
            if let Some(r) = eds_ready.get_mut(i) {
                *r = false;
            }
            if let Some(Some(service)) = services.get(i) {
                deliveries.excuse(i, *service);
            }
            let _ = api.delete("pods", NS, &old);
            api.put(world::pod(&node, &new))
                .map_err(|e| anyhow!("create Pod {new}: {e:?}"))?;
        }
        absorb(swarm, &mut deliveries, &mut eds_ready)?;
        deliveries.expire(now, DELIVERY_TIMEOUT);
        completed_now.extend(deliveries.take_completed());
        if now >= next_bookmark {
            api.send_bookmarks();
            next_bookmark += BOOKMARKS;
        }
        if now >= next_sample {
            next_sample += Duration::from_secs(1);
            ds.check_running()?;
            let cpu_now = (cpu_seconds(pid)?, Instant::now());
            let cpu = (cpu_now.0 - cpu_last.0)
                / cpu_now
                    .1
                    .saturating_duration_since(cpu_last.1)
                    .as_secs_f64()
                    .max(1e-3);
            cpu_last = cpu_now;
            let metrics = marin3r_tests::xds::get(ds.metrics, "/metrics")
                .await
                .map_err(|e| anyhow!("GET /metrics: {e}"))?;
            let (metrics_bytes, streams_metric, states) = parse_metrics(&metrics.body);
            latencies.extend(completed_now.iter().copied());
            let sample = Sample {
                t: elapsed.as_secs_f64(),
                rss_kib: rss_kib(pid)?,
                cpu,
                metrics_bytes,
                streams_metric,
                swarm_open: swarm.open(),
                states,
                pods_replaced: replaced,
                writes: seq,
                completed: std::mem::take(&mut completed_now),
                lost: deliveries.lost,
                in_flight: deliveries.in_flight(),
            };
            if samples.len() % 10 == 9 {
                let mut recent: Vec<Duration> = latencies
                    .iter()
                    .rev()
                    .take(500)
                    .copied()
                    .collect::<Vec<_>>();
                recent.sort_unstable();
                eprintln!(
                    "   {label}: t={:.0} s RSS {:.1} MiB, CPU {:.2}, /metrics {} KiB, streams {} (open {}), writes {seq}, pods replaced {replaced}, EDS p99 {:.0} ms (recent), in flight {}, lost {}",
                    sample.t,
                    sample.rss_kib as f64 / 1024.0,
                    sample.cpu,
                    sample.metrics_bytes / 1024,
                    sample.streams_metric,
                    sample.swarm_open,
                    crate::stats::nearest_rank(&recent, 99.0).map_or(f64::NAN, crate::stats::ms),
                    deliveries.in_flight(),
                    deliveries.lost
                );
            }
            samples.push(sample);
        }
    }
    // The writes still in flight get their chance.
    let drain_until = Instant::now() + Duration::from_secs(10);
    while deliveries.in_flight() > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        absorb(swarm, &mut deliveries, &mut eds_ready)?;
    }
    latencies.extend(completed_now);
    latencies.extend(deliveries.take_completed());
    deliveries.expire(Instant::now() + DELIVERY_TIMEOUT, DELIVERY_TIMEOUT);
    let after = swarm.counts();
    let counts = ResponseCounts {
        cds_lds_pushes: after.cds_lds_pushes - counts_before.cds_lds_pushes,
        eds_pushes: after.eds_pushes - counts_before.eds_pushes,
        eds_noops: after.eds_noops - counts_before.eds_noops,
        eds_initial: after.eds_initial - counts_before.eds_initial,
    };
    latencies.sort_unstable();
    Ok(ChurnRun {
        api: AdsApi::Sotw,
        options: options.clone(),
        publish: Duration::ZERO,
        connect,
        rss_before_swarm_kib: 0,
        rss_connected_kib,
        hwm_kib: 0,
        samples,
        latencies,
        stream_latencies: deliveries.stream_samples,
        lost: deliveries.lost,
        writes: seq,
        expected_pushes,
        counts,
        pods_replaced: replaced,
        disconnects: swarm.disconnects() - disconnects_before,
        api_requests: api.requests_since(api_mark).len(),
        api_writes: api.writes_since(api_mark),
        elapsed: Duration::ZERO,
        load_start: None,
        load_end: None,
    })
}

/// Runs [`measure`] for each flavour of `apis`; a failed run is recorded and the next
/// one still runs.
pub async fn measure_all(
    marin3r: &Path,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    servers: &tokio::runtime::Handle,
    options: &ChurnOptions,
    apis: &[AdsApi],
) -> (Vec<ChurnRun>, Vec<String>) {
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for &ads in apis {
        match measure(marin3r, dir, bundle, servers, options, ads).await {
            Ok(run) => runs.push(run),
            Err(e) => {
                eprintln!("   churn {ads:?} FAILED: {e:#}");
                failures.push(format!("churn {ads:?}: {e:#}"));
            }
        }
    }
    (runs, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_completes_when_every_affected_stream_had_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut d = Deliveries::new(4);
        d.write(1, 0, t0, vec![0, 1, 2]);
        d.write(2, 0, t0 + ms(10), vec![0, 1, 2]);
        d.update(0, 0, 2, t0 + ms(30));
        d.update(1, 0, 1, t0 + ms(40));
        assert!(d.take_completed().is_empty());
        // Another Service's endpoints do not count.
        d.update(2, 1, 5, t0 + ms(45));
        assert_eq!(d.in_flight(), 2);
        d.update(2, 0, 1, t0 + ms(50));
        assert_eq!(d.take_completed(), [ms(50)], "write 1: the slowest stream");
        // Stream 1 is replaced: write 2 no longer waits for it.
        d.update(2, 0, 2, t0 + ms(60));
        assert!(d.take_completed().is_empty());
        d.excuse(1, 0);
        assert_eq!(d.take_completed(), [ms(50)]);
        assert_eq!(d.stream_samples, 5);
        // A stream that already had a later marker is not waited for.
        d.write(2, 0, t0 + ms(70), vec![0]);
        assert_eq!(d.take_completed(), [Duration::ZERO]);
        d.write(3, 0, t0 + ms(80), vec![3]);
        d.expire(t0 + ms(200), ms(100));
        assert_eq!((d.lost, d.in_flight()), (1, 0));
    }

    #[test]
    fn metrics_figures() {
        let text = "# HELP x\nmarin3r_xdss_streams{node_id=\"a\",api=\"sotw\"} 3\n\
                    marin3r_xdss_streams{node_id=\"b\",api=\"delta\"} 2\n\
                    marin3r_envoyconfig_cache_state{envoyconfig_namespace=\"default\",envoyconfig=\"a\",node_id=\"a\",state=\"InSync\"} 1\n\
                    marin3r_envoyconfig_cache_state{envoyconfig_namespace=\"default\",envoyconfig=\"a\",node_id=\"a\",state=\"Rollback\"} 0\n";
        let (bytes, streams, states) = parse_metrics(text);
        assert_eq!((bytes, streams), (text.len(), 5.0));
        assert_eq!(states, BTreeMap::from([("InSync".to_string(), 1)]));
        assert_eq!(service_of_cluster("svc-042"), Some(42));
        assert_eq!(service_of_cluster("backend"), None);
    }

    #[test]
    fn the_short_variant_replaces_its_pods_at_the_churn_rate() {
        let o = ChurnOptions {
            streams: 1000,
            layout: Layout {
                configs: 100,
                eds_configs: 30,
                slices: 300,
                configs_per_service: 3,
            },
            pod_lifetimes: 2000,
            seconds: 60.0,
            slice_rate: 50.0,
            warmup_fraction: 0.2,
        };
        assert!((o.replace_rate() - 1000.0 / 60.0).abs() < 1e-9);
        // 10 % of 1,000 pods per minute is 100/min; 1,000/min is 10×.
        assert!((o.acceleration() - 10.0).abs() < 1e-9);
    }
}
