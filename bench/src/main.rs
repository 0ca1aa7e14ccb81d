//! `marin3r-bench`: runs every benchmark and writes `BENCHMARKS.md`. Normally started by
//! `scripts/bench` (which builds everything in release mode, raises the open-files limit
//! and runs the edit → serve bench first); `--help` lists the knobs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use clap::{Parser, ValueEnum};

use marin3r_bench::ads::{
    AdsApi, FanOut, Swarm, SwarmConfig, fleet_config_yaml, swarm_config_yaml,
};
use marin3r_bench::churn::{self, ChurnOptions, report::ChurnResults, world::Layout};
use marin3r_bench::echo::EchoServer;
use marin3r_bench::ha::{self, report::HaResults};
use marin3r_bench::loadgen::{self, Load, LoadResult, Rate, Target};
use marin3r_bench::machine::{CpuTicks, Machine, load_average};
use marin3r_bench::markdown::{load_str, median, spread, verdict};
use marin3r_bench::process::{DiscoveryService, open_files_limit, shutdown_manager_idle_rss};
use marin3r_bench::stats::{ms, us};
use marin3r_bench::webhook::{WebhookServer, check_injected, realistic_review};
use marin3r_bench::{EditToServe, cores, parse_edit_to_serve};

/// The same allocator as the `marin3r` binary, so the in-process webhook and the cores
/// are measured as they run in production (README "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Cores,
    Webhook,
    Xds,
    Fleet,
    Shutdown,
    /// Three replicas in Kubernetes mode (docs/ha.md): taint latency, API writes, a
    /// reconnect storm. Alone (`--only ha`), it replaces only the report's HA section of
    /// an existing `--out` file.
    Ha,
    /// One discovery service in Kubernetes mode under pod and EndpointSlice churn
    /// (`marin3r_bench::churn`). Alone (`--only churn`, or with `ha`), it replaces only
    /// its own section of an existing `--out` file.
    Churn,
}

impl Section {
    /// The report section this one replaces when only such sections run (`None`: the
    /// section is part of the whole report only).
    fn own_heading(self) -> Option<&'static str> {
        match self {
            Section::Ha => Some(ha::report::HEADING),
            Section::Churn => Some(churn::report::HEADING),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ChurnApi {
    Sotw,
    Delta,
}

impl From<ChurnApi> for AdsApi {
    fn from(a: ChurnApi) -> Self {
        match a {
            ChurnApi::Sotw => AdsApi::Sotw,
            ChurnApi::Delta => AdsApi::Delta,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Core {
    Injection,
    Review,
    Decode,
}

/// Benchmarks against peers and the physical limit; writes a Markdown report.
#[derive(Debug, Parser)]
struct Args {
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// The `marin3r` binary (release build) run as the discovery service and the
    /// shutdown manager.
    #[arg(long, default_value = "target/release/marin3r")]
    marin3r: PathBuf,
    /// Output of `cargo bench -p marin3r-tests --bench edit_to_serve` to include.
    #[arg(long)]
    edit_to_serve: Option<PathBuf>,
    /// Where raw figures go (the churn runs' per-second samples as CSV).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Hand-written notes (profiles, fixes) appended to the report.
    #[arg(long)]
    notes: Option<PathBuf>,
    /// Runs (samples) per figure.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// ADS stream counts of the scaling table.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000,10000")]
    streams: Vec<usize>,
    /// Counts of other EnvoyConfigs (10 clusters + 10 listeners each, other node ids)
    /// beside the edited one in the fleet table.
    #[arg(long, value_delimiter = ',', default_value = "0,100,1000")]
    fleet: Vec<usize>,
    /// ADS streams on the edited node in the fleet table.
    #[arg(long, default_value_t = 10)]
    fleet_streams: usize,
    /// Webhook / echo connection counts of the throughput table.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Seconds per max-rate load run (after a 0.25 s warm-up).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Requests per second of the fixed-rate latency runs.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Connections of the fixed-rate latency runs.
    #[arg(long, default_value_t = 32)]
    rate_concurrency: usize,
    /// Seconds per fixed-rate run.
    #[arg(long, default_value_t = 3.0)]
    rate_seconds: f64,
    /// Sections to run. `--only ha` alone keeps every other section of an existing
    /// `--out` file and replaces (or adds) only "Several replicas (HA)".
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cores,webhook,xds,fleet,shutdown,ha,churn"
    )]
    only: Vec<Section>,
    /// Churn: ADS streams (pods), spread over the EnvoyConfigs' nodes.
    #[arg(long, default_value_t = 10_000)]
    churn_streams: usize,
    /// Churn: EnvoyConfigs (one node each).
    #[arg(long, default_value_t = 1000)]
    churn_configs: usize,
    /// Churn: of those, the ones generating their endpoints from EndpointSlices.
    #[arg(long, default_value_t = 300)]
    churn_eds_configs: usize,
    /// Churn: EndpointSlices (over one Service per 3 EDS EnvoyConfigs).
    #[arg(long, default_value_t = 3000)]
    churn_slices: usize,
    /// Churn: pod lifetimes that pass in the run (the first streams, then one per
    /// replacement).
    #[arg(long, default_value_t = 100_000)]
    churn_pod_lifetimes: usize,
    /// Churn: seconds of churn per run.
    #[arg(long, default_value_t = 600.0)]
    churn_seconds: f64,
    /// Churn: EndpointSlice writes per second.
    #[arg(long, default_value_t = 50.0)]
    churn_slice_rate: f64,
    /// Churn: the ADS flavours, one run each.
    #[arg(long, value_delimiter = ',', default_value = "sotw,delta")]
    churn_apis: Vec<ChurnApi>,
    /// Churn, short variant (e.g. for CI): 1,000 streams, 100 EnvoyConfigs (30 EDS),
    /// 300 EndpointSlices, 2,000 pod lifetimes, 60 s; overrides the sizes above.
    #[arg(long)]
    churn_short: bool,
    /// HA: streams of the node whose update every stream rejects (taint latency).
    #[arg(long, default_value_t = 10)]
    ha_taint_streams: usize,
    /// HA: EnvoyConfigs (one node each) of the API writes figures.
    #[arg(long, default_value_t = 100)]
    ha_configs: usize,
    /// HA: streams (pods) spread over those nodes.
    #[arg(long, default_value_t = 1000)]
    ha_pods: usize,
    /// HA: seconds of the steady-state window of the API writes.
    #[arg(long, default_value_t = 60.0)]
    ha_steady_seconds: f64,
    /// HA: streams of the reconnect storm.
    #[arg(long, default_value_t = 10_000)]
    ha_storm_streams: usize,
    /// HA: EnvoyConfigs (nodes) the storm's streams are spread over.
    #[arg(long, default_value_t = 100)]
    ha_storm_configs: usize,
    /// Internal: run as the reconnect storm's fleet process with this many EnvoyConfigs.
    #[arg(long, hide = true)]
    ha_fleet_process: Option<usize>,
    /// Only these CPU cores (for profiling one of them: `perf record … --only cores
    /// --cores injection`).
    #[arg(long, value_delimiter = ',', default_value = "injection,review,decode")]
    cores: Vec<Core>,
    /// The command line recorded in the report.
    #[arg(long, default_value = "scripts/bench")]
    command: String,
}

/// Samples of one load configuration, one per run.
#[derive(Debug, Default, Clone)]
struct LoadSamples {
    rps: Vec<f64>,
    p50_ms: Vec<f64>,
    p90_ms: Vec<f64>,
    p99_ms: Vec<f64>,
    max_ms: Vec<f64>,
    errors: u64,
    requests: u64,
}

impl LoadSamples {
    fn push(&mut self, r: &LoadResult) {
        self.rps.push(r.rps());
        self.p50_ms.push(ms(r.latency.p50));
        self.p90_ms.push(ms(r.latency.p90));
        self.p99_ms.push(ms(r.latency.p99));
        self.max_ms.push(ms(r.latency.max));
        self.errors += r.errors;
        self.requests += r.requests;
    }
}

#[derive(Debug, Clone)]
struct ConcurrencyRow {
    concurrency: usize,
    echo: LoadSamples,
    webhook: LoadSamples,
}

#[derive(Debug, Clone)]
struct XdsRow {
    streams: usize,
    connect: Duration,
    rss_before_kib: u64,
    rss_idle_kib: Vec<f64>,
    hwm_kib: u64,
    fanout: Vec<FanOut>,
}

impl XdsRow {
    fn per_stream_kib(&self) -> Vec<f64> {
        self.rss_idle_kib
            .iter()
            .map(|r| (r - self.rss_before_kib as f64) / self.streams as f64)
            .collect()
    }
}

/// One discovery service serving the edited EnvoyConfig beside `others` more.
#[derive(Debug, Clone)]
struct FleetRow {
    others: usize,
    /// Process start → every stream of the edited node configured.
    startup: Duration,
    rss_idle_kib: Vec<f64>,
    hwm_kib: u64,
    fanout: Vec<FanOut>,
}

#[derive(Debug, Default)]
struct Results {
    injection_us: Vec<f64>,
    review_us: Vec<f64>,
    decode_ms: Vec<f64>,
    webhook: Vec<ConcurrencyRow>,
    fixed_echo: LoadSamples,
    fixed_webhook: LoadSamples,
    xds: Vec<XdsRow>,
    fleet: Vec<FleetRow>,
    shutdown_rss_kib: Vec<f64>,
    shutdown_anon_kib: Vec<f64>,
    /// File name of the program the idle shutdown manager ran (`/proc/PID/exe`).
    shutdown_exe: String,
    edit_to_serve: Vec<EditToServe>,
    ha: HaResults,
    churn: ChurnResults,
    /// The idle RSS plot of the xDS scaling table (relative to the report).
    xds_plot: Option<String>,
    failures: Vec<String>,
    loads: Vec<(String, Option<[f64; 3]>)>,
    /// Per section: cores' worth of CPU used by other processes while it ran.
    others: Vec<(String, Option<f64>)>,
    elapsed: Duration,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(configs) = args.ha_fleet_process {
        return match ha::storm::fleet_process(configs) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("marin3r-bench fleet process: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("marin3r-bench: some benchmarks failed; see the report");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("marin3r-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(name: &str) -> Result<tokio::runtime::Runtime> {
    // Two workers each, like the services' default runtime on this 2-core machine.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .with_context(|| format!("{name} runtime"))
}

/// Runs the sections and writes the report; `Ok(false)` when a section failed.
fn run(args: &Args) -> Result<bool> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let started = Instant::now();
    let envoy = marin3r_tests::find_envoy().ok();
    let machine = Machine::probe(envoy.as_deref());
    let mut results = Results::default();
    results.loads.push(("start".into(), load_average()));
    // The servers under test and the load (clients) get separate runtimes.
    let servers = runtime("server")?;
    let clients = runtime("client")?;
    let work = async {
        let dir = tempfile::tempdir().context("temp dir")?;
        let bundle = marin3r_tests::xds::issue_bundle().map_err(|e| anyhow!(e))?;
        let certs = dir.path().join("certs");
        bundle.write_to(&certs).context("write certificates")?;
        for section in &args.only {
            eprintln!("== {section:?}");
            let name = format!("{section:?}").to_lowercase();
            results.loads.push((name.clone(), load_average()));
            let before = CpuTicks::now();
            let outcome = match section {
                Section::Cores => cores_section(args, &mut results),
                Section::Webhook => {
                    webhook_section(args, servers.handle(), &certs, &bundle, &mut results).await
                }
                Section::Xds => xds_section(args, dir.path(), &bundle, &mut results).await,
                Section::Fleet => fleet_section(args, dir.path(), &bundle, &mut results).await,
                Section::Shutdown => shutdown_section(args, dir.path(), &mut results).await,
                Section::Ha => ha_section(args, servers.handle(), &mut results).await,
                Section::Churn => {
                    churn_section(args, dir.path(), &bundle, servers.handle(), &mut results).await
                }
            };
            let others = before.zip(CpuTicks::now()).map(|(b, a)| a.others_since(&b));
            results.others.push((name, others));
            if let Err(e) = outcome {
                eprintln!("   FAILED: {e:#}");
                results.failures.push(format!("{section:?}: {e:#}"));
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    clients.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("SIGTERM handler")?;
        // Dropping `work` on a signal drops every server and child process it holds.
        tokio::select! {
            r = work => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
            _ = term.recv() => Err(anyhow!("terminated")),
        }
    })?;
    if let Some(path) = &args.edit_to_serve {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        results.edit_to_serve = parse_edit_to_serve(&text);
        if results.edit_to_serve.is_empty() {
            results.failures.push(format!(
                "edit → serve: no result table in {}",
                path.display()
            ));
        }
    }
    results.loads.push(("end".into(), load_average()));
    results.elapsed = started.elapsed();
    let notes = match &args.notes {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?)
        }
        None => None,
    };
    if !results.xds.is_empty() {
        match xds_plot(&args.out, &results.xds) {
            Ok(p) => results.xds_plot = Some(p),
            Err(e) => results.failures.push(format!("xDS idle RSS plot: {e:#}")),
        }
    }
    let own_only = args.only.iter().all(|s| s.own_heading().is_some());
    let report = if own_only && let Ok(existing) = std::fs::read_to_string(&args.out) {
        // The other sections stay as they are: only these sections are new.
        let first_note = notes
            .as_deref()
            .and_then(|n| n.lines().find(|l| l.starts_with("## ")));
        let before: Vec<&str> = ["## Failures in this run"]
            .into_iter()
            .chain(first_note)
            .collect();
        let mut text = existing;
        for section in &args.only {
            let (heading, body) = match section {
                Section::Ha => (
                    ha::report::HEADING,
                    ha::report::render(&results.ha, args.runs),
                ),
                Section::Churn => (
                    churn::report::HEADING,
                    churn::report::render(&results.churn),
                ),
                _ => continue,
            };
            eprintln!(
                "replacing the section {heading:?} of {}",
                args.out.display()
            );
            text = marin3r_bench::markdown::splice(&text, heading, &body, &before);
        }
        text
    } else {
        render(args, &machine, &results, notes.as_deref())
    };
    std::fs::write(&args.out, report).with_context(|| format!("write {}", args.out.display()))?;
    eprintln!("wrote {}", args.out.display());
    servers.shutdown_timeout(Duration::from_secs(2));
    clients.shutdown_timeout(Duration::from_secs(2));
    Ok(results.failures.is_empty())
}

fn cores_section(args: &Args, r: &mut Results) -> Result<()> {
    let on = |c| args.cores.contains(&c);
    for _ in 0..args.runs {
        if on(Core::Injection) {
            r.injection_us
                .push(us(cores::injection(Duration::from_secs(1))?));
        }
        if on(Core::Review) {
            r.review_us
                .push(us(cores::admission_review(Duration::from_millis(500))?));
        }
        if on(Core::Decode) {
            r.decode_ms.push(ms(cores::decode(Duration::from_secs(1))?));
        }
    }
    eprintln!(
        "   injection {:.1} µs, review {:.1} µs, decode {:.2} ms (medians)",
        median(&r.injection_us),
        median(&r.review_us),
        median(&r.decode_ms)
    );
    Ok(())
}

async fn webhook_section(
    args: &Args,
    servers: &tokio::runtime::Handle,
    certs: &Path,
    bundle: &marin3r_certs::Bundle,
    r: &mut Results,
) -> Result<()> {
    let cert = certs.join("server/tls.crt");
    let key = certs.join("server/tls.key");
    let (c, k) = (cert.clone(), key.clone());
    let webhook = servers
        .spawn(async move { WebhookServer::start(&c, &k).await })
        .await??;
    let echo = servers
        .spawn(async move { EchoServer::start(&cert, &key).await })
        .await??;
    let body = Bytes::from(serde_json::to_vec(&realistic_review())?);
    let ca = &bundle.ca.cert_pem;
    let webhook_target = Target::new(webhook.addr, ca, marin3r_webhook::MUTATE_PATH, body.clone())?;
    let echo_target = Target::new(echo.addr, ca, "/echo", body.clone())?;
    // Real injection, and a real echo.
    let (status, answer) = loadgen::once(&webhook_target).await?;
    if status != 200 {
        bail!("the webhook answered {status}");
    }
    check_injected(&answer)?;
    let (status, answer) = loadgen::once(&echo_target).await?;
    if status != 200 || answer != body {
        bail!("the echo server answered {status} with another body");
    }
    eprintln!(
        "   AdmissionReview {} bytes, answer {} bytes",
        body.len(),
        answer.len()
    );

    let max = |concurrency| Load {
        concurrency,
        rate: Rate::Max,
        warmup: Duration::from_millis(250),
        duration: Duration::from_secs_f64(args.seconds),
        max_requests: None,
    };
    let mut rows: Vec<ConcurrencyRow> = args
        .concurrency
        .iter()
        .map(|&c| ConcurrencyRow {
            concurrency: c,
            echo: LoadSamples::default(),
            webhook: LoadSamples::default(),
        })
        .collect();
    for run in 0..args.runs {
        for row in &mut rows {
            // Alternate which server goes first, so drifting background load hits both.
            let order: [bool; 2] = if run % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for is_webhook in order {
                let (target, samples) = if is_webhook {
                    (&webhook_target, &mut row.webhook)
                } else {
                    (&echo_target, &mut row.echo)
                };
                let result = loadgen::run(target, max(row.concurrency)).await?;
                samples.push(&result);
            }
            eprintln!(
                "   run {run} c={}: echo {:.0} req/s, webhook {:.0} req/s",
                row.concurrency,
                row.echo.rps.last().copied().unwrap_or_default(),
                row.webhook.rps.last().copied().unwrap_or_default()
            );
        }
    }
    r.webhook = rows;

    let fixed = Load {
        concurrency: args.rate_concurrency,
        rate: Rate::Fixed(args.rate),
        warmup: Duration::from_millis(250),
        duration: Duration::from_secs_f64(args.rate_seconds),
        max_requests: None,
    };
    for run in 0..args.runs {
        let e = loadgen::run(&echo_target, fixed).await?;
        r.fixed_echo.push(&e);
        let w = loadgen::run(&webhook_target, fixed).await?;
        r.fixed_webhook.push(&w);
        eprintln!(
            "   run {run} at {} req/s: echo p99 {:.2} ms, webhook p99 {:.2} ms ({:.0} req/s)",
            args.rate,
            ms(e.latency.p99),
            ms(w.latency.p99),
            w.rps()
        );
    }
    drop(webhook);
    drop(echo);
    Ok(())
}

/// The release `marin3r` binary the discovery-service sections run.
fn require_marin3r(args: &Args) -> Result<()> {
    if !args.marin3r.is_file() {
        bail!(
            "{} is missing (cargo build --release -p marin3r)",
            args.marin3r.display()
        );
    }
    Ok(())
}

async fn xds_section(
    args: &Args,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    r: &mut Results,
) -> Result<()> {
    require_marin3r(args)?;
    let limit = open_files_limit()?;
    // One descriptor per stream here and in the discovery service, plus slack.
    let (fit, too_many): (Vec<usize>, Vec<usize>) = args
        .streams
        .iter()
        .partition(|&&n| (n as u64) + 256 <= limit);
    let run = points(
        &fit,
        |n| format!("{n} streams"),
        |n| xds_point(args, dir, bundle, n),
        &mut r.xds,
    )
    .await;
    let mut failures: Vec<String> = too_many
        .iter()
        .map(|n| {
            format!(
                "{n} streams: the open-files limit is {limit} (scripts/bench raises it with ulimit -n)"
            )
        })
        .collect();
    failures.extend(run.err().map(|e| format!("{e:#}")));
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(failures.join("; ")))
    }
}

/// What one discovery service measured under a swarm on one node.
struct SwarmRun {
    /// Process start → `/readyz`.
    ready: Duration,
    /// Swarm connect → every stream configured.
    connect: Duration,
    rss_before_kib: u64,
    rss_idle_kib: Vec<f64>,
    hwm_kib: u64,
    fanout: Vec<FanOut>,
}

/// Starts a discovery service on `point/config` (already holding any other files) with
/// the swarm's EnvoyConfig for `node_id`, connects `streams` streams, then edits that
/// EnvoyConfig `args.runs` times; `label` prefixes the progress lines.
async fn swarm_run(
    args: &Args,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    point: &Path,
    streams: usize,
    label: &str,
) -> Result<SwarmRun> {
    let node_id = "swarm";
    let config_dir = point.join("config");
    std::fs::create_dir_all(&config_dir)?;
    let file = config_dir.join("swarm.yaml");
    std::fs::write(&file, swarm_config_yaml(node_id, 0))?;
    let started = Instant::now();
    let mut ds = DiscoveryService::start(
        &args.marin3r,
        &dir.join("certs"),
        &config_dir,
        &point.join("discovery-service.log"),
    )
    .await?;
    let ready = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before_kib = ds.rss_kib()?;
    let config = SwarmConfig {
        targets: vec![ds.xdss],
        ca_pem: bundle.ca.cert_pem.clone(),
        client_cert_pem: bundle.client.cert_pem.clone(),
        client_key_pem: bundle.client.key_pem.clone(),
        node_ids: vec![node_id.into()],
        streams,
        connect_parallelism: 64,
        reconnect: false,
        eds: Default::default(),
        api: Default::default(),
    };
    let connecting = Instant::now();
    let mut swarm = Swarm::connect(&config)?;
    let result = async {
        let connect = swarm
            .wait_converged(connecting, Duration::from_secs(240))
            .await?;
        eprintln!(
            "   {label}: ready in {:.2} s, {streams} streams connected and configured in {:.1} s",
            ready.as_secs_f64(),
            connect.as_secs_f64()
        );
        ds.check_running()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut rss_idle_kib = vec![ds.rss_kib()? as f64];
        let mut fanout = Vec::new();
        for revision in 1..=args.runs as u32 {
            let yaml = swarm_config_yaml(node_id, revision);
            let f = swarm
                .measure_change(
                    || marin3r_tests::xds::write_atomic(&file, &yaml).map_err(|e| anyhow!(e)),
                    Duration::from_secs(60),
                )
                .await?;
            eprintln!(
                "   {label}: edit {revision} reached the first stream in {:.0} ms, half in {:.0} ms, all in {:.0} ms",
                ms(f.first),
                ms(f.median),
                ms(f.all)
            );
            fanout.push(f);
            // Idle again: the per-stream footprint between pushes.
            tokio::time::sleep(Duration::from_secs(1)).await;
            rss_idle_kib.push(ds.rss_kib()? as f64);
        }
        ds.check_running()?;
        let hwm_kib = marin3r_bench::process::status_kib(ds.process.id(), "VmHWM")?;
        Ok::<_, anyhow::Error>(SwarmRun {
            ready,
            connect,
            rss_before_kib,
            rss_idle_kib,
            hwm_kib,
            fanout,
        })
    }
    .await;
    // The server goes first, so the closed connections' TIME_WAIT stays on its side and
    // does not hold the client's ephemeral ports for the next point.
    drop(ds);
    swarm.shutdown().await;
    result
}

async fn xds_point(
    args: &Args,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    n: usize,
) -> Result<XdsRow> {
    let point = dir.join(format!("xds-{n}"));
    let run = swarm_run(args, dir, bundle, &point, n, &format!("{n} streams")).await?;
    Ok(XdsRow {
        streams: n,
        connect: run.connect,
        rss_before_kib: run.rss_before_kib,
        rss_idle_kib: run.rss_idle_kib,
        hwm_kib: run.hwm_kib,
        fanout: run.fanout,
    })
}

/// Runs `point` for each item, collecting the rows and naming each failure.
async fn points<T: Copy, R, F: Future<Output = Result<R>>>(
    items: &[T],
    name: impl Fn(T) -> String,
    point: impl Fn(T) -> F,
    rows: &mut Vec<R>,
) -> Result<()> {
    let mut failures = Vec::new();
    for &item in items {
        match point(item).await {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("   {} FAILED: {e:#}", name(item));
                failures.push(format!("{}: {e:#}", name(item)));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(failures.join("; ")))
    }
}

async fn fleet_section(
    args: &Args,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    r: &mut Results,
) -> Result<()> {
    require_marin3r(args)?;
    points(
        &args.fleet,
        |others| format!("{others} other EnvoyConfigs"),
        |others| fleet_point(args, dir, bundle, others),
        &mut r.fleet,
    )
    .await
}

/// The swarm's EnvoyConfig beside `others` EnvoyConfigs of other nodes: startup, idle RSS
/// and edit → all of the node's streams.
async fn fleet_point(
    args: &Args,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    others: usize,
) -> Result<FleetRow> {
    let point = dir.join(format!("fleet-{others}"));
    let config_dir = point.join("config");
    std::fs::create_dir_all(&config_dir)?;
    for i in 0..others {
        let node = format!("other-{i:04}");
        std::fs::write(
            config_dir.join(format!("{node}.yaml")),
            fleet_config_yaml(&node, 10),
        )?;
    }
    let label = format!("{others} other EnvoyConfigs");
    let run = swarm_run(args, dir, bundle, &point, args.fleet_streams, &label).await?;
    Ok(FleetRow {
        others,
        startup: run.ready + run.connect,
        rss_idle_kib: run.rss_idle_kib,
        hwm_kib: run.hwm_kib,
        fanout: run.fanout,
    })
}

async fn shutdown_section(args: &Args, dir: &Path, r: &mut Results) -> Result<()> {
    require_marin3r(args)?;
    for run in 0..args.runs {
        let d = dir.join(format!("shutdown-manager-{run}"));
        std::fs::create_dir_all(&d)?;
        let rss = shutdown_manager_idle_rss(&args.marin3r, &d).await?;
        r.shutdown_rss_kib.push(rss.rss as f64);
        r.shutdown_anon_kib.push(rss.anon as f64);
        r.shutdown_exe = rss
            .exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    eprintln!(
        "   shutdown manager idle RSS {:.1} MiB (median)",
        median(&r.shutdown_rss_kib) / 1024.0
    );
    Ok(())
}

/// The churn options from the command line (`--churn-short` overrides the sizes).
fn churn_options(args: &Args) -> ChurnOptions {
    let layout = |configs, eds_configs, slices| Layout {
        configs,
        eds_configs,
        slices,
        configs_per_service: 3,
    };
    if args.churn_short {
        ChurnOptions {
            streams: 1000,
            layout: layout(100, 30, 300),
            pod_lifetimes: 2000,
            seconds: 60.0,
            slice_rate: args.churn_slice_rate,
            warmup_fraction: 0.2,
        }
    } else {
        ChurnOptions {
            streams: args.churn_streams,
            layout: layout(
                args.churn_configs,
                args.churn_eds_configs,
                args.churn_slices,
            ),
            pod_lifetimes: args.churn_pod_lifetimes,
            seconds: args.churn_seconds,
            slice_rate: args.churn_slice_rate,
            warmup_fraction: 0.2,
        }
    }
}

/// One churn run per ADS flavour, then the plots; each run's failure is recorded and
/// the others still run.
async fn churn_section(
    args: &Args,
    dir: &Path,
    bundle: &marin3r_certs::Bundle,
    servers: &tokio::runtime::Handle,
    r: &mut Results,
) -> Result<()> {
    require_marin3r(args)?;
    let options = churn_options(args);
    if options.layout.configs == 0 || options.streams == 0 || options.seconds <= 0.0 {
        bail!("churn: --churn-configs, --churn-streams and --churn-seconds must be positive");
    }
    if options.layout.eds_configs > options.layout.configs {
        bail!("churn: --churn-eds-configs must be at most --churn-configs");
    }
    let started = Instant::now();
    let before = CpuTicks::now();
    let apis: Vec<AdsApi> = args.churn_apis.iter().map(|&a| a.into()).collect();
    let (runs, failures) =
        churn::measure_all(&args.marin3r, dir, bundle, servers, &options, &apis).await;
    let c = &mut r.churn;
    c.options = Some(options);
    c.failures = failures;
    match churn::report::write_plots(&args.out, &runs) {
        Ok(p) => c.plots = p,
        Err(e) => c.failures.push(format!("plots: {e:#}")),
    }
    if let Some(data) = &args.data {
        for run in &runs {
            let path = data.join(format!("churn-{}.csv", churn::report::api_name(run.api)));
            let written = std::fs::create_dir_all(data)
                .and_then(|()| std::fs::write(&path, churn::report::csv(run)));
            match written {
                Ok(()) => eprintln!("   wrote {}", path.display()),
                Err(e) => c.failures.push(format!("write {}: {e}", path.display())),
            }
        }
    }
    c.runs = runs;
    c.others = before.zip(CpuTicks::now()).map(|(b, a)| a.others_since(&b));
    c.elapsed = started.elapsed();
    if c.failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(c.failures.join("; ")))
    }
}

/// The xDS scaling table's idle RSS per stream count as a plot next to `out`; returns
/// its path relative to `out`'s folder.
fn xds_plot(out: &Path, rows: &[XdsRow]) -> Result<String> {
    use marin3r_bench::plot::{COLORS, Chart, Series, line_chart};
    let base = out.parent().unwrap_or(Path::new("."));
    let rel = format!("{}/xds-idle-rss.png", churn::report::PLOTS);
    std::fs::create_dir_all(base.join(churn::report::PLOTS))?;
    let points = |f: &dyn Fn(&XdsRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (r.streams as f64, f(r))).collect()
    };
    line_chart(
        &base.join(&rel),
        &Chart {
            title: "Discovery service RSS by connected streams",
            x_title: "open ADS streams",
            y_title: "RSS (MiB)",
            y_from_zero: true,
            x_range: None,
        },
        &[
            Series {
                label: "streams open, idle (median)".into(),
                color: COLORS[0],
                points: points(&|r| median(&r.rss_idle_kib) / 1024.0),
            },
            Series {
                label: "before the streams".into(),
                color: COLORS[1],
                points: points(&|r| r.rss_before_kib as f64 / 1024.0),
            },
        ],
    )?;
    Ok(rel)
}

/// The three HA figures; each one's failure is recorded and the others still run.
async fn ha_section(args: &Args, servers: &tokio::runtime::Handle, r: &mut Results) -> Result<()> {
    let started = Instant::now();
    let before = CpuTicks::now();
    let ha = &mut r.ha;
    ha.load_start = load_average();
    match ha::taint::measure(servers, args.ha_taint_streams, args.runs).await {
        Ok(t) => ha.taint = Some(t),
        Err(e) => ha.failures.push(format!("taint latency: {e:#}")),
    }
    let steady = Duration::from_secs_f64(args.ha_steady_seconds.max(0.0));
    match ha::writes::measure(servers, args.ha_configs, args.ha_pods, args.runs, steady).await {
        Ok(w) => ha.writes = Some(w),
        Err(e) => ha.failures.push(format!("API writes: {e:#}")),
    }
    let exe = std::env::current_exe().context("this program's path")?;
    match ha::storm::measure(&exe, args.ha_storm_configs, args.ha_storm_streams).await {
        Ok(s) => ha.storm = Some(s),
        Err(e) => ha.failures.push(format!("reconnect storm: {e:#}")),
    }
    ha.load_end = load_average();
    ha.others = before.zip(CpuTicks::now()).map(|(b, a)| a.others_since(&b));
    ha.elapsed = started.elapsed();
    if ha.failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(ha.failures.join("; ")))
    }
}

// ---------------------------------------------------------------------------------------
// The report.

fn fanout_ms(rows: &XdsRow, pick: impl Fn(&FanOut) -> Duration) -> Vec<f64> {
    rows.fanout.iter().map(|f| ms(pick(f))).collect()
}

struct TargetRow {
    figure: String,
    target: String,
    measured: String,
    baseline: String,
    ratio: String,
    met: Option<bool>,
}

fn target_rows(args: &Args, r: &Results) -> Vec<TargetRow> {
    let mut rows = Vec::new();
    // Webhook throughput: the highest concurrency (the most throughput).
    let top = r.webhook.iter().max_by_key(|row| row.concurrency);
    rows.push(match top {
        Some(row) => {
            let (w, e) = (median(&row.webhook.rps), median(&row.echo.rps));
            TargetRow {
                figure: format!(
                    "webhook requests/s, {} connections, realistic Pod injected",
                    row.concurrency
                ),
                target: "≥ 60 % of bare rustls echo".into(),
                measured: spread(&row.webhook.rps, 0),
                baseline: format!("echo {}", spread(&row.echo.rps, 0)),
                ratio: format!("{:.0} %", 100.0 * w / e),
                met: Some(w / e >= 0.6),
            }
        }
        None => TargetRow {
            figure: "webhook requests/s".into(),
            target: "≥ 60 % of bare rustls echo".into(),
            measured: "—".into(),
            baseline: "—".into(),
            ratio: "—".into(),
            met: None,
        },
    });
    let p99 = median(&r.fixed_webhook.p99_ms);
    rows.push(TargetRow {
        figure: format!(
            "webhook p99 latency at {:.0} req/s ({} connections, open loop), ms",
            args.rate, args.rate_concurrency
        ),
        target: "≤ echo p99 + 1 ms".into(),
        measured: spread(&r.fixed_webhook.p99_ms, 2),
        baseline: format!("echo {}", spread(&r.fixed_echo.p99_ms, 2)),
        ratio: format!("{:.2}× echo", p99 / median(&r.fixed_echo.p99_ms)),
        met: (!p99.is_nan()).then_some(p99 <= median(&r.fixed_echo.p99_ms) + 1.0),
    });
    let review = median(&r.review_us);
    rows.push(TargetRow {
        figure: "whole AdmissionReview path (body in → response body out, realistic Pod), µs"
            .into(),
        target: "< 25 µs".into(),
        measured: spread(&r.review_us, 1),
        baseline: "target 25 µs".into(),
        ratio: format!("{:.2}× target", review / 25.0),
        met: (!review.is_nan()).then_some(review < 25.0),
    });
    let inj = median(&r.injection_us);
    rows.push(TargetRow {
        figure: "injection core (`mutate_pod`, realistic Pod), µs/pod".into(),
        target: "< 20 µs".into(),
        measured: spread(&r.injection_us, 1),
        baseline: "target 20 µs".into(),
        ratio: format!("{:.2}× target", inj / 20.0),
        met: (!inj.is_nan()).then_some(inj < 20.0),
    });
    let top = r.xds.iter().max_by_key(|row| row.streams);
    match top {
        Some(row) => {
            let all = fanout_ms(row, |f| f.all);
            let m = median(&all);
            rows.push(TargetRow {
                figure: format!(
                    "xDS: config file edit → all {} mTLS ADS streams have it, ms",
                    row.streams
                ),
                target: "< 300 ms at 10,000 streams".into(),
                measured: spread(&all, 0),
                baseline: "target 300 ms".into(),
                ratio: format!("{:.2}× target", m / 300.0),
                met: (!m.is_nan()).then_some(m < 300.0 && row.streams >= 10_000),
            });
            let per = row.per_stream_kib();
            let m = median(&per);
            rows.push(TargetRow {
                figure: format!(
                    "xDS: discovery-service RSS per idle stream at {} streams, KiB",
                    row.streams
                ),
                target: "< 16 KiB".into(),
                measured: spread(&per, 1),
                baseline: "target 16 KiB".into(),
                ratio: format!("{:.2}× target", m / 16.0),
                met: (!m.is_nan()).then_some(m < 16.0 && row.streams >= 10_000),
            });
        }
        None => rows.push(TargetRow {
            figure: "xDS: 10,000 streams, fan-out and RSS".into(),
            target: "< 1 s, < 16 KiB/stream".into(),
            measured: "—".into(),
            baseline: "—".into(),
            ratio: "—".into(),
            met: None,
        }),
    }
    let alone = r.fleet.iter().find(|row| row.others == 0);
    let most = r
        .fleet
        .iter()
        .filter(|row| row.others > 0)
        .max_by_key(|row| row.others);
    rows.push(match (alone, most) {
        (Some(alone), Some(most)) => {
            let all = |row: &FleetRow| row.fanout.iter().map(|f| ms(f.all)).collect::<Vec<_>>();
            let (a, m) = (median(&all(alone)), median(&all(most)));
            TargetRow {
                figure: format!(
                    "edit → all {} streams beside {} other EnvoyConfigs, ms",
                    args.fleet_streams, most.others
                ),
                target: "≤ 1.5 × the edit alone".into(),
                measured: spread(&all(most), 1),
                baseline: format!("alone {}", spread(&all(alone), 1)),
                ratio: format!("{:.2}× alone", m / a),
                met: (!m.is_nan() && !a.is_nan()).then_some(m <= 1.5 * a && most.others >= 1000),
            }
        }
        _ => TargetRow {
            figure: "edit → all streams beside 1,000 other EnvoyConfigs".into(),
            target: "≤ 1.5 × the edit alone".into(),
            measured: "—".into(),
            baseline: "—".into(),
            ratio: "—".into(),
            met: None,
        },
    });
    for e in &r.edit_to_serve {
        rows.push(TargetRow {
            figure: format!(
                "edit → real Envoy serving the change ({}, {} edits), ms",
                e.api, e.n
            ),
            target: "p50 < 200 ms".into(),
            measured: format!("{:.1} / **{:.1}** / {:.1}", e.min, e.p50, e.max),
            baseline: "target 200 ms".into(),
            ratio: format!("{:.2}× target", e.p50 / 200.0),
            met: Some(e.p50 < 200.0),
        });
    }
    if r.edit_to_serve.is_empty() {
        rows.push(TargetRow {
            figure: "edit → real Envoy serving the change".into(),
            target: "p50 < 200 ms".into(),
            measured: "—".into(),
            baseline: "—".into(),
            ratio: "—".into(),
            met: None,
        });
    }
    let dec = median(&r.decode_ms);
    rows.push(TargetRow {
        figure: "decode a 100-resource EnvoyConfig, ms".into(),
        target: "< 10 ms".into(),
        measured: spread(&r.decode_ms, 2),
        baseline: "target 10 ms".into(),
        ratio: format!("{:.2}× target", dec / 10.0),
        met: (!dec.is_nan()).then_some(dec < 10.0),
    });
    let sm: Vec<f64> = r.shutdown_rss_kib.iter().map(|k| k / 1024.0).collect();
    let s = median(&sm);
    rows.push(TargetRow {
        figure: "shutdown manager idle RSS, MiB".into(),
        target: "< 8 MiB".into(),
        measured: spread(&sm, 2),
        baseline: "target 8 MiB".into(),
        ratio: format!("{:.2}× target", s / 8.0),
        met: (!s.is_nan()).then_some(s < 8.0),
    });
    rows
}

fn render(args: &Args, m: &Machine, r: &Results, notes: Option<&str>) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# Benchmarks\n");
    let _ = writeln!(
        o,
        "Written by `{}` (bench crate `bench/`, binary `marin3r-bench`); numbers, not \
         assertions. Each figure is **min / median / max over {} runs** unless said \
         otherwise; verdicts use the median. Everything runs on 127.0.0.1 of one machine: \
         the load generator and the ADS client swarm share the cores with the servers \
         they measure. Total bench time (without the builds and edit → serve): {:.0} s.\n",
        args.command,
        args.runs,
        r.elapsed.as_secs_f64()
    );
    let _ = writeln!(o, "## Machine\n");
    let _ = writeln!(o, "| | |\n|---|---|");
    let _ = writeln!(o, "| cores (nproc) | {} |", m.nproc);
    let _ = writeln!(o, "| CPU | {} |", m.cpu_model);
    let _ = writeln!(o, "| memory | {} |", m.memory);
    let _ = writeln!(o, "| kernel | {} |", m.kernel);
    let _ = writeln!(o, "| rustc | {} |", m.rustc);
    let _ = writeln!(o, "| Envoy | {} |", m.envoy);
    let _ = writeln!(o, "| command | `{}` |", args.command);
    for (when, l) in &r.loads {
        let _ = writeln!(
            o,
            "| load average (1, 5, 15 min) at {when} | {} |",
            load_str(*l)
        );
    }
    for (section, others) in &r.others {
        let _ = writeln!(
            o,
            "| CPU used by other processes during {section} (cores; `/proc/stat` minus this process and its children) | {} |",
            others.map_or_else(|| "unknown".to_string(), |c| format!("{c:.2}"))
        );
    }
    // The load average counts the benchmark's own threads (and the build before it), so
    // the verdict on a busy machine uses the CPU that other processes took meanwhile.
    let busiest = r
        .others
        .iter()
        .filter_map(|(_, c)| *c)
        .fold(0.0_f64, f64::max);
    if busiest > 0.25 {
        let _ = writeln!(
            o,
            "\n> **The machine was busy**: other processes used up to {busiest:.2} of the {} \
             cores during a section. Every figure below is disturbed by that load — \
             throughput low, latency tails long. A re-run of `scripts/bench` on a quiet \
             machine is needed before these numbers are quoted.",
            m.nproc
        );
    }
    let _ = writeln!(o, "\n## Targets\n");
    let _ = writeln!(
        o,
        "| figure | target | measured (min / **median** / max) | baseline | ratio | verdict |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    for t in target_rows(args, r) {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} |",
            t.figure,
            t.target,
            t.measured,
            t.baseline,
            t.ratio,
            verdict(t.met)
        );
    }

    let _ = writeln!(o, "\n## Webhook vs a bare rustls HTTPS echo server\n");
    let _ = writeln!(
        o,
        "Same rustls `ServerConfig` (`marin3r_certs::server_config`: ring, TLS 1.2 + 1.3, \
         the reloading certificate resolver, ECDSA P-256), HTTP/1.1 keep-alive, same \
         machine, same load generator (`marin3r_bench::loadgen`: hyper + tokio-rustls, one \
         keep-alive connection per concurrent client), same run (the two servers take \
         turns). The body is a realistic Pod AdmissionReview (two app containers; the \
         kuard walkthrough annotations with shutdown manager, host port mapping and \
         resources); the webhook injects the sidecar and answers the base64 JSON patch, \
         the echo server answers the body back. Max rate, {:.1} s per run after a \
         0.25 s warm-up; the servers run on a 2-worker tokio runtime, the load generator \
         on another. The webhook logs through `tracing` with no subscriber installed (in \
         production each injection writes one INFO line).\n",
        args.seconds
    );
    let _ = writeln!(
        o,
        "| connections | echo req/s | webhook req/s | webhook / echo (medians) | echo p50 / p99 ms (medians) | webhook p50 / p99 ms (medians) | errors (echo, webhook) |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for row in &r.webhook {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.0} % | {:.2} / {:.2} | {:.2} / {:.2} | {}, {} |",
            row.concurrency,
            spread(&row.echo.rps, 0),
            spread(&row.webhook.rps, 0),
            100.0 * median(&row.webhook.rps) / median(&row.echo.rps),
            median(&row.echo.p50_ms),
            median(&row.echo.p99_ms),
            median(&row.webhook.p50_ms),
            median(&row.webhook.p99_ms),
            row.echo.errors,
            row.webhook.errors
        );
    }
    if !r.fixed_webhook.rps.is_empty() {
        let _ = writeln!(
            o,
            "\nFixed rate {:.0} req/s over {} connections, {:.1} s per run, open loop \
             (latency counted from when each request was due):\n",
            args.rate, args.rate_concurrency, args.rate_seconds
        );
        let _ = writeln!(
            o,
            "| server | achieved req/s | p50 ms | p90 ms | p99 ms | max ms | errors |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        for (name, s) in [("echo", &r.fixed_echo), ("webhook", &r.fixed_webhook)] {
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                spread(&s.rps, 0),
                spread(&s.p50_ms, 2),
                spread(&s.p90_ms, 2),
                spread(&s.p99_ms, 2),
                spread(&s.max_ms, 2),
                s.errors
            );
        }
    }

    let _ = writeln!(o, "\n## CPU-bound cores (one thread, in a loop)\n");
    let _ = writeln!(o, "| figure | min / **median** / max |\n|---|---|");
    let _ = writeln!(
        o,
        "| `mutate_pod` on the realistic Pod, µs | {} |",
        spread(&r.injection_us, 1)
    );
    let _ = writeln!(
        o,
        "| whole AdmissionReview (parse, plan the injection, build the patch, base64, serialise), µs | {} |",
        spread(&r.review_us, 1)
    );
    let _ = writeln!(
        o,
        "| `resolve` of the 100-resource EnvoyConfig of `marin3r_bench::cores::hundred_resource_spec` (50 clusters, 25 listeners with HCM + Router, 25 routes), ms | {} |",
        spread(&r.decode_ms, 2)
    );

    let _ = writeln!(o, "\n## xDS scaling\n");
    let _ = writeln!(
        o,
        "`marin3r discovery-service --config-dir` (the release binary, a separate process, \
         default JSON INFO logging to a file) serves one EnvoyConfig (one cluster, one \
         direct-response listener) for node `swarm`. The swarm (`marin3r_bench::ads`, \
         tonic) opens N SotW ADS streams, each on its own mTLS connection with a client \
         certificate from the same CA and its own `pod_name`, subscribes to clusters and \
         listeners and ACKs every response. Then the config file is replaced {} times \
         (atomic rename; the cluster and the listener change each time) and the swarm \
         records when each stream has both new versions; the time counts from the rename, \
         so it includes the folder poll (every {} ms). RSS is `VmRSS` of the discovery \
         service from `/proc/<pid>/status`: before the swarm, then idle 1 s after it \
         converged and 1 s after each edit; per idle stream = (idle − before) / N. A fresh \
         discovery service per row.\n",
        args.runs,
        marin3r_control_plane::local::POLL_INTERVAL.as_millis()
    );
    let _ = writeln!(
        o,
        "| streams | connect + initial config, s | edit → first stream, ms | edit → half, ms | edit → all streams, ms | RSS before, MiB | RSS idle, MiB (median) | per idle stream, KiB | peak RSS (VmHWM), MiB |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
    for row in &r.xds {
        let _ = writeln!(
            o,
            "| {} | {:.1} | {} | {} | {} | {:.1} | {:.1} | {} | {:.1} |",
            row.streams,
            row.connect.as_secs_f64(),
            spread(&fanout_ms(row, |f| f.first), 0),
            spread(&fanout_ms(row, |f| f.median), 0),
            spread(&fanout_ms(row, |f| f.all), 0),
            row.rss_before_kib as f64 / 1024.0,
            median(&row.rss_idle_kib) / 1024.0,
            spread(&row.per_stream_kib(), 1),
            row.hwm_kib as f64 / 1024.0
        );
    }
    let _ = writeln!(
        o,
        "\nThe RSS samples of a row come from one swarm ({} samples: after converging and \
         after each edit), the fan-out figures from its {} edits.",
        args.runs + 1,
        args.runs
    );
    if let Some(plot) = &r.xds_plot {
        let _ = writeln!(
            o,
            "\nIdle RSS (blue, median, MiB) and RSS before the swarm (red, MiB) per stream \
             count (x: streams):\n\n![xDS idle RSS per stream count]({plot})"
        );
    }

    let _ = writeln!(o, "\n## Scaling with other EnvoyConfigs\n");
    let _ = writeln!(
        o,
        "The same discovery service and swarm: {} SotW streams on node `swarm`, whose \
         EnvoyConfig (one cluster, one listener) is replaced {} times, beside N \
         EnvoyConfigs of other node ids in the same folder (10 clusters + 10 listeners \
         each, one file each). Startup = process start → `/readyz`, plus the swarm's \
         connect → every stream configured (together they include resolving all N + 1 \
         EnvoyConfigs); RSS is idle `VmRSS` (after converging and after each edit). A \
         fresh discovery service per row. The edit's cost should follow the change, not \
         N.\n",
        args.fleet_streams, args.runs
    );
    let _ = writeln!(
        o,
        "| other EnvoyConfigs | startup, s | edit → first stream, ms | edit → all streams, ms | RSS idle, MiB (median) | peak RSS (VmHWM), MiB |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    for row in &r.fleet {
        let pick =
            |f: fn(&FanOut) -> Duration| row.fanout.iter().map(|x| ms(f(x))).collect::<Vec<_>>();
        let _ = writeln!(
            o,
            "| {} | {:.2} | {} | {} | {:.1} | {:.1} |",
            row.others,
            row.startup.as_secs_f64(),
            spread(&pick(|f| f.first), 1),
            spread(&pick(|f| f.all), 1),
            median(&row.rss_idle_kib) / 1024.0,
            row.hwm_kib as f64 / 1024.0
        );
    }

    let _ = writeln!(o, "\n## Edit → a real Envoy serving the change\n");
    if r.edit_to_serve.is_empty() {
        let _ = writeln!(o, "Not measured in this run.");
    } else {
        let _ = writeln!(
            o,
            "From `cargo bench -p marin3r-tests --bench edit_to_serve` (in-process discovery \
             service, one Envoy 1.40 over mTLS, the direct-response body edited and the \
             listener polled every 5 ms); min / p50 / max over its edits, ms:\n"
        );
        let _ = writeln!(
            o,
            "| API | edits | min | p50 | p90 | max |\n|---|---|---|---|---|---|"
        );
        for e in &r.edit_to_serve {
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                e.api, e.n, e.min, e.p50, e.p90, e.max
            );
        }
    }

    let _ = writeln!(o, "\n## Shutdown manager\n");
    let _ = writeln!(
        o,
        "`marin3r shutdown-manager` (release build, current-thread runtime) on 127.0.0.1; \
         the process runs `{}` (`marin3r` execs `marin3r-shutdown-manager` when it is \
         installed next to it, as in the image). `VmRSS` one second after its first \
         `/healthz` answer, one fresh process per run: {} MiB, of which anonymous memory \
         (`RssAnon`; the rest are pages of the binary and its libraries): {} MiB.",
        r.shutdown_exe,
        spread(
            &r.shutdown_rss_kib
                .iter()
                .map(|k| k / 1024.0)
                .collect::<Vec<_>>(),
            2
        ),
        spread(
            &r.shutdown_anon_kib
                .iter()
                .map(|k| k / 1024.0)
                .collect::<Vec<_>>(),
            2
        )
    );

    let _ = writeln!(o);
    o.push_str(&ha::report::render(&r.ha, args.runs));
    let _ = writeln!(o);
    o.push_str(&churn::report::render(&r.churn));

    if !r.failures.is_empty() {
        let _ = writeln!(o, "\n## Failures in this run\n");
        for f in &r.failures {
            let _ = writeln!(o, "- {}", f.replace('\n', " "));
        }
    }
    if let Some(notes) = notes {
        let _ = writeln!(o, "\n{}", notes.trim_end());
    }
    o
}
