//! The report's "Kubernetes mode under churn" section and its plots.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::{ChurnOptions, ChurnRun, Sample};
use crate::ads::AdsApi;
use crate::markdown::{load_str, verdict};
use crate::plot::{COLORS, Chart, Series, line_chart};
use crate::stats::{ms, nearest_rank};

/// The section's heading.
pub const HEADING: &str = "## Kubernetes mode under churn";
/// Where the plots go, relative to the report.
pub const PLOTS: &str = "bench/plots";

/// The plots of one run (paths relative to the report).
#[derive(Debug, Clone)]
pub struct Plots {
    pub api: AdsApi,
    pub rss: String,
    pub metrics: String,
    pub eds: String,
}

/// Everything the churn section measured.
#[derive(Debug, Clone, Default)]
pub struct ChurnResults {
    pub options: Option<ChurnOptions>,
    pub runs: Vec<ChurnRun>,
    pub failures: Vec<String>,
    /// Plot files written (relative to the report), per run: RSS, EDS latency.
    pub plots: Vec<Plots>,
    /// Cores' worth of CPU other processes used while the section ran.
    pub others: Option<f64>,
    pub elapsed: Duration,
}

pub fn api_name(api: AdsApi) -> &'static str {
    match api {
        AdsApi::Sotw => "sotw",
        AdsApi::Delta => "delta",
    }
}

/// The samples after the warm-up.
fn steady(run: &ChurnRun) -> &[Sample] {
    let skip = (run.samples.len() as f64 * run.options.warmup_fraction).ceil() as usize;
    run.samples.get(skip..).unwrap_or_default()
}

/// `(min, median, max)` of `v` (NaNs if empty).
fn range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    match (v.first(), nearest_rank(&v, 50.0), v.last()) {
        (Some(a), Some(m), Some(b)) => (*a, m, *b),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

/// The least-squares slope of `points` (y per x; NaN with fewer than two x values).
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den > 0.0 { num / den } else { f64::NAN }
}

/// RSS growth after the warm-up, MiB per minute.
fn rss_drift(run: &ChurnRun) -> f64 {
    let points: Vec<(f64, f64)> = steady(run)
        .iter()
        .map(|s| (s.t / 60.0, s.rss_kib as f64 / 1024.0))
        .collect();
    slope(&points)
}

/// Largest deviation from the median, in percent of it.
fn deviation((min, median, max): (f64, f64, f64)) -> f64 {
    100.0 * (max - median).max(median - min) / median
}

fn latency(run: &ChurnRun, p: f64) -> f64 {
    nearest_rank(&run.latencies, p).map_or(f64::NAN, ms)
}

/// Writes the plots of `runs` next to `out` (under [`PLOTS`]); returns their paths
/// relative to `out`'s folder.
pub fn write_plots(out: &Path, runs: &[ChurnRun]) -> Result<Vec<Plots>> {
    let base = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(base.join(PLOTS))?;
    let mut written = Vec::new();
    for run in runs {
        let name = api_name(run.api);
        let over_time = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
            run.samples.iter().map(|s| (s.t, f(s))).collect()
        };
        let rss = format!("{PLOTS}/churn-{name}-rss.png");
        let whole_run = Some((0.0, run.options.seconds));
        let over_the_run = |title, y_title| Chart {
            title,
            x_title: "time since the churn started (s)",
            y_title,
            y_from_zero: true,
            x_range: whole_run,
        };
        let rss_title = format!("Discovery service RSS under churn ({name})");
        line_chart(
            &base.join(&rss),
            &over_the_run(&rss_title, "RSS (MiB)"),
            &[Series {
                label: "RSS".into(),
                color: COLORS[0],
                points: over_time(&|s| s.rss_kib as f64 / 1024.0),
            }],
        )?;
        let metrics = format!("{PLOTS}/churn-{name}-metrics.png");
        let metrics_title = format!("Size of /metrics under churn ({name})");
        line_chart(
            &base.join(&metrics),
            &over_the_run(&metrics_title, "/metrics body (KiB)"),
            &[Series {
                label: "/metrics".into(),
                color: COLORS[1],
                points: over_time(&|s| s.metrics_bytes as f64 / 1024.0),
            }],
        )?;
        let eds = format!("{PLOTS}/churn-{name}-eds-latency.png");
        let per_second = |p: f64| -> Vec<(f64, f64)> {
            run.samples
                .iter()
                .filter_map(|s| {
                    let mut l = s.completed.clone();
                    l.sort_unstable();
                    nearest_rank(&l, p).map(|d| (s.t, ms(d)))
                })
                .collect()
        };
        let eds_title =
            format!("EndpointSlice write to every affected stream, per second ({name})");
        line_chart(
            &base.join(&eds),
            &over_the_run(&eds_title, "latency (ms)"),
            &[
                Series {
                    label: "max".into(),
                    color: COLORS[3],
                    points: per_second(100.0),
                },
                Series {
                    label: "p99".into(),
                    color: COLORS[1],
                    points: per_second(99.0),
                },
                Series {
                    label: "p50".into(),
                    color: COLORS[2],
                    points: per_second(50.0),
                },
            ],
        )?;
        written.push(Plots {
            api: run.api,
            rss,
            metrics,
            eds,
        });
    }
    Ok(written)
}

/// The per-second samples of `run` as CSV (latencies in ms; empty without a completed
/// write in that second).
pub fn csv(run: &ChurnRun) -> String {
    let mut o = String::from(
        "t_s,rss_kib,cpu_cores,metrics_bytes,streams_metric,swarm_open,pods_replaced,writes,completed,lost,in_flight,eds_p50_ms,eds_p99_ms,eds_max_ms,states\n",
    );
    for s in &run.samples {
        let mut l = s.completed.clone();
        l.sort_unstable();
        let p = |q: f64| nearest_rank(&l, q).map_or(String::new(), |d| format!("{:.1}", ms(d)));
        let states: Vec<String> = s.states.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            o,
            "{:.1},{},{:.3},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.t,
            s.rss_kib,
            s.cpu,
            s.metrics_bytes,
            s.streams_metric,
            s.swarm_open,
            s.pods_replaced,
            s.writes,
            l.len(),
            s.lost,
            s.in_flight,
            p(50.0),
            p(99.0),
            p(100.0),
            states.join(";")
        );
    }
    o
}

struct Row {
    figure: String,
    target: String,
    measured: Vec<String>,
    met: Option<bool>,
}

fn target_rows(runs: &[ChurnRun]) -> Vec<Row> {
    let per = |f: &dyn Fn(&ChurnRun) -> (String, Option<bool>)| -> (Vec<String>, Option<bool>) {
        let mut met = None;
        let cells = runs
            .iter()
            .map(|r| {
                let (cell, ok) = f(r);
                met = match (met, ok) {
                    (None, x) => x,
                    (Some(a), Some(b)) => Some(a && b),
                    (a, None) => a,
                };
                cell
            })
            .collect();
        (cells, met)
    };
    let full = |r: &ChurnRun| r.options.streams >= 10_000;
    let mut rows = Vec::new();
    let (measured, met) = per(&|r| {
        let rss = range(
            steady(r)
                .iter()
                .map(|s| s.rss_kib as f64 / 1024.0)
                .collect(),
        );
        let d = deviation(rss);
        (
            format!(
                "{:.1} / **{:.1}** / {:.1} MiB (±{d:.1} %; trend {:+.2} MiB/min)",
                rss.0,
                rss.1,
                rss.2,
                rss_drift(r)
            ),
            (!d.is_nan()).then_some(d <= 10.0),
        )
    });
    rows.push(Row {
        figure: "discovery-service RSS after the warm-up, min / **median** / max".into(),
        target: "flat within ±10 % of the median".into(),
        measured,
        met,
    });
    let (measured, met) = per(&|r| {
        let m = range(
            steady(r)
                .iter()
                .map(|s| s.metrics_bytes as f64 / 1024.0)
                .collect(),
        );
        let d = deviation(m);
        (
            format!("{:.0} / **{:.0}** / {:.0} KiB (±{d:.1} %)", m.0, m.1, m.2),
            (!d.is_nan()).then_some(d <= 10.0),
        )
    });
    rows.push(Row {
        figure: "`/metrics` size after the warm-up, min / **median** / max".into(),
        target: "flat within ±10 % of the median".into(),
        measured,
        met,
    });
    let (measured, met) = per(&|r| {
        let (p50, p99, max) = (latency(r, 50.0), latency(r, 99.0), latency(r, 100.0));
        (
            format!(
                "{p50:.0} / **{p99:.0}** / {max:.0} ms ({} writes, {} lost)",
                r.latencies.len(),
                r.lost
            ),
            (!p99.is_nan() && full(r)).then_some(p99 < 1000.0 && r.lost == 0),
        )
    });
    rows.push(Row {
        figure: "EndpointSlice write → every affected stream has the new EDS, p50 / **p99** / max"
            .into(),
        target: "p99 < 1 s at 10,000 streams, none lost".into(),
        measured,
        met,
    });
    let (measured, met) = per(&|r| {
        let rss = range(steady(r).iter().map(|s| s.rss_kib as f64).collect()).1;
        let per = rss / r.options.streams.max(1) as f64;
        (
            format!("**{per:.1}** KiB ({} streams)", r.options.streams),
            (!per.is_nan() && full(r)).then_some(per <= 64.0),
        )
    });
    rows.push(Row {
        figure: "memory per connected Envoy incl. its share of config (median RSS after the warm-up / streams)".into(),
        target: "≤ 64 KiB at 10,000 streams".into(),
        measured,
        met,
    });
    let (measured, met) = per(&|r| {
        let writes = r.writes.max(1) as f64;
        let ratio = r.counts.eds_pushes as f64 / r.expected_pushes.max(1) as f64;
        (
            format!(
                "**{:.2}** EDS responses per write for {:.2} affected streams per write (×{ratio:.2}); {} cluster/listener responses",
                r.counts.eds_pushes as f64 / writes,
                r.expected_pushes as f64 / writes,
                r.counts.cds_lds_pushes
            ),
            // Writes coalesced by a backlog also send fewer responses: judged only
            // when every write was delivered.
            (r.lost == 0).then_some(ratio <= 1.0 && r.counts.cds_lds_pushes == 0),
        )
    });
    rows.push(Row {
        figure: "work per EndpointSlice write: ClusterLoadAssignments sent (after the first of each stream), per write".into(),
        target: "the affected streams only (×1.00 or less), no cluster/listener pushes; judged when no write was lost".into(),
        measured,
        met,
    });
    let (measured, met) = per(&|r| {
        (
            format!(
                "**{:.2}** requests ({:.2} writes) per EndpointSlice write",
                r.api_requests as f64 / r.writes.max(1) as f64,
                r.api_writes as f64 / r.writes.max(1) as f64
            ),
            None,
        )
    });
    rows.push(Row {
        figure: "discovery service → API server during the churn (the bench's own writes excluded)"
            .into(),
        target: "— (no target; writes should not follow the slice writes)".into(),
        measured,
        met,
    });
    let (measured, met) = per(&|r| {
        (
            format!("**{}** of {}", r.counts.eds_noops, r.counts.eds_pushes),
            Some(r.counts.eds_noops == 0),
        )
    });
    rows.push(Row {
        figure: "no-op EDS pushes (endpoints unchanged since the stream's last one)".into(),
        target: "0".into(),
        measured,
        met,
    });
    rows
}

/// The section, with the plots of [`write_plots`] embedded.
pub fn render(r: &ChurnResults) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{HEADING}\n");
    let Some(opt) = &r.options else {
        let _ = writeln!(o, "Not measured in this run.");
        return o;
    };
    let l = opt.layout;
    let _ = writeln!(
        o,
        "`marin3r discovery-service` in Kubernetes mode (the release binary, a separate \
         process, default flags, one replica) against the stateful fake API server of \
         `marin3r-bench` (`marin3r_testkit::apiserver`, served over HTTP on 127.0.0.1 through \
         a kubeconfig: lists, watches with resourceVersions, a bookmark every 10 s). \
         {} EnvoyConfigs (one node each; a direct-response listener and a cluster), the \
         first {} of which take their cluster's endpoints over ADS, generated from the \
         EndpointSlices of one of {} Services (`generateFromEndpointSlices`, {} \
         EnvoyConfigs per Service); {} EndpointSlices (4 to 12 endpoints and a marker \
         each). {} mTLS ADS streams (`marin3r_bench::ads`, one connection each, {} per \
         node; the streams of an EDS node also subscribe to its ClusterLoadAssignment), \
         each with an injected Pod in the API server.\n",
        l.configs,
        l.eds_configs,
        l.services(),
        l.configs_per_service,
        l.slices,
        opt.streams,
        opt.streams / l.configs.max(1),
    );
    let _ = writeln!(
        o,
        "For {:.0} s: **pod churn**, {:.1} streams per second closed and opened again as new \
         pods (the old Pod deleted, a new one with a new name and UID created: {} pod \
         lifetimes, i.e. \"10 % of the pods per minute\" sped up {:.1}×), and \
         **EndpointSlice churn**, {:.0} writes per second round-robin over the slices (an \
         endpoint added, removed, turning not ready or ready again; the slice's marker \
         endpoint moved to the write's number, which tells the streams which writes a \
         ClusterLoadAssignment holds). Every second: `VmRSS` and CPU of the discovery \
         service (`/proc`), the size of its `/metrics` and the open streams it counts \
         (`marin3r_xdss_streams`), EnvoyConfigs per cache state \
         (`marin3r_envoyconfig_cache_state`), and the EDS latencies of the writes \
         completed in that second: from the write to the API server until **every** \
         stream of the nodes reading the slice had a ClusterLoadAssignment holding it \
         (streams replaced meanwhile are not waited for). The first {:.0} % of the run is \
         the warm-up the flatness figures leave out. Total section time {:.0} s.\n",
        opt.seconds,
        opt.replace_rate(),
        opt.pod_lifetimes,
        opt.acceleration(),
        opt.slice_rate,
        100.0 * opt.warmup_fraction,
        r.elapsed.as_secs_f64()
    );
    if let Some(c) = r.others {
        let _ = writeln!(
            o,
            "Other processes used {c:.2} cores while the section ran{}.\n",
            if c > 0.25 {
                " — **the machine was busy**: the figures are disturbed"
            } else {
                ""
            }
        );
    }
    if !r.runs.is_empty() {
        let names: Vec<&str> = r.runs.iter().map(|x| api_name(x.api)).collect();
        let _ = writeln!(o, "| figure | target | {} | verdict |", names.join(" | "));
        let _ = writeln!(o, "|---|---|{}---|", "---|".repeat(names.len()));
        for row in target_rows(&r.runs) {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} |",
                row.figure,
                row.target,
                row.measured.join(" | "),
                verdict(row.met)
            );
        }
        if r.runs.iter().any(|x| x.options.streams < 10_000) {
            let _ = writeln!(
                o,
                "\nFewer than 10,000 streams (the short variant): the targets stated at \
                 10,000 streams are not judged."
            );
        }
        let _ = writeln!(
            o,
            "\n| run | publish every EnvoyConfig, s | connect + configure, s | EndpointSlice writes (achieved rate) | pods replaced (achieved rate) | stream disconnects | RSS before the swarm / connected / peak (VmHWM), MiB | CPU after the warm-up, cores (median / max) | open streams (`/metrics`, min / max) | cache states (last sample) | load average start → end |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
        for run in &r.runs {
            let st = steady(run);
            let cpu = range(st.iter().map(|s| s.cpu).collect());
            let streams = range(st.iter().map(|s| s.streams_metric).collect());
            let states = run
                .samples
                .last()
                .map(|s| {
                    s.states
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "| {} | {:.1} | {:.1} | {} ({:.1}/s) | {} ({:.1}/s) | {} | {:.1} / {:.1} / {:.1} | {:.2} / {:.2} | {:.0} / {:.0} | {} | {} → {} |",
                api_name(run.api),
                run.publish.as_secs_f64(),
                run.connect.as_secs_f64(),
                run.writes,
                run.writes as f64 / run.options.seconds.max(1e-9),
                run.pods_replaced,
                run.pods_replaced as f64 / run.options.seconds.max(1e-9),
                run.disconnects,
                run.rss_before_swarm_kib as f64 / 1024.0,
                run.rss_connected_kib as f64 / 1024.0,
                run.hwm_kib as f64 / 1024.0,
                cpu.1,
                cpu.2,
                streams.0,
                streams.2,
                if states.is_empty() {
                    "—".into()
                } else {
                    states
                },
                load_str(run.load_start),
                load_str(run.load_end)
            );
        }
    }
    for p in &r.plots {
        let name = api_name(p.api);
        let _ = writeln!(
            o,
            "\n{name}: discovery-service RSS over the run (x: seconds; y: MiB):\n\n\
             ![{name} RSS over time]({})\n\n{name}: `/metrics` size over the run (x: \
             seconds; y: KiB):\n\n![{name} /metrics size over time]({})\n\n{name}: EDS \
             latency of the writes completed in each second, write → every affected \
             stream (x: seconds; y: ms; green p50, red p99, purple max; with about {:.0} \
             writes a second, p99 is about the max):\n\n![{name} EDS latency over time]({})",
            p.rss,
            p.metrics,
            r.options.as_ref().map_or(0.0, |o| o.slice_rate),
            p.eds
        );
    }
    if !r.failures.is_empty() {
        let _ = writeln!(o, "\nFailed:\n");
        for f in &r.failures {
            let _ = writeln!(o, "- {}", f.replace('\n', " "));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deviation_from_the_median() {
        assert!((deviation((90.0, 100.0, 105.0)) - 10.0).abs() < 1e-9);
        assert!((deviation((99.0, 100.0, 112.0)) - 12.0).abs() < 1e-9);
        assert!(deviation(range(Vec::new())).is_nan());
    }

    #[test]
    fn slopes() {
        assert!((slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) - 2.0).abs() < 1e-9);
        assert!(slope(&[(1.0, 1.0)]).is_nan());
        assert!(slope(&[]).is_nan());
    }

    #[test]
    fn an_unmeasured_section_says_so() {
        let text = render(&ChurnResults::default());
        assert!(text.starts_with(HEADING));
        assert!(text.contains("Not measured"));
    }
}
