//! The report's "Several replicas (HA)" section, and [`splice`], which puts it into an
//! existing report (`--only ha` keeps every other section of the file as it is).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::storm::Storm;
use super::taint::Taint;
use super::writes::{EditWrites, Kind, TRAIL, Write, Writes, tally};
use crate::markdown::{load_str, median, spread, verdict};
use crate::stats::{ms, nearest_rank};

/// The section's heading.
pub const HEADING: &str = "## Several replicas (HA)";

/// How far above a `~` target of docs/ha.md a figure still counts as met.
const ABOUT: f64 = 1.25;

/// Everything the HA section measured.
#[derive(Debug, Clone, Default)]
pub struct HaResults {
    pub taint: Option<Taint>,
    pub writes: Option<Writes>,
    pub storm: Option<Storm>,
    pub load_start: Option<[f64; 3]>,
    pub load_end: Option<[f64; 3]>,
    /// Cores' worth of CPU other processes used while the section ran.
    pub others: Option<f64>,
    pub elapsed: Duration,
    pub failures: Vec<String>,
}

/// Per edit: the writes until it settled that are not Lease renewals.
fn edit_writes(e: &EditWrites) -> usize {
    e.writes.iter().filter(|w| w.kind() != Kind::Lease).count()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn p50_max(sorted: &[Duration]) -> String {
    match (nearest_rank(sorted, 50.0), sorted.last()) {
        (Some(p50), Some(max)) => format!("{:.2} / {:.2}", secs(p50), secs(*max)),
        _ => "—".into(),
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Row {
    figure: String,
    target: String,
    measured: String,
    met: Option<bool>,
}

fn targets(r: &HaResults) -> Vec<Row> {
    let mut rows = Vec::new();
    let taint = r.taint.as_ref().filter(|t| !t.runs.is_empty());
    let pick = |f: fn(&super::taint::TaintRun) -> f64| -> Vec<f64> {
        taint
            .map(|t| t.runs.iter().map(f).collect())
            .unwrap_or_default()
    };
    let edit_to_taint = pick(|r| secs(r.edit_to_taint));
    let m = median(&edit_to_taint);
    rows.push(Row {
        figure: "edit → taint, every stream rejecting, 3 replicas, s".into(),
        target: "~3–4 s (§3)".into(),
        measured: spread(&edit_to_taint, 2),
        met: (!m.is_nan()).then_some(m <= 4.0 * ABOUT),
    });
    let last = pick(|r| ms(r.last_nack_to_taint));
    let m = median(&last);
    rows.push(Row {
        figure: "last NACK → taint, ms".into(),
        target: "≤ 1,750 ms (derived from §3: report tick 250 ms + coalescing 500 ms + the leader's 1 s evaluation)".into(),
        measured: spread(&last, 0),
        met: (!m.is_nan()).then_some(m <= 1750.0),
    });
    let writes = r.writes.as_ref();
    let per_edit: Vec<f64> = writes
        .map(|w| w.edits.iter().map(|e| edit_writes(e) as f64).collect())
        .unwrap_or_default();
    let m = median(&per_edit);
    rows.push(Row {
        figure: format!(
            "API writes per edit until `InSync` on every replica (Lease renewals left out), {}",
            writes.map_or_else(String::new, |w| format!(
                "{} EnvoyConfigs × {} pods",
                w.configs, w.streams
            ))
        ),
        target: "~8 (the issue, after HA.md)".into(),
        measured: spread(&per_edit, 0),
        met: (!m.is_nan()).then_some(m <= 8.0 * ABOUT),
    });
    let steady = writes.filter(|w| w.steady_seconds > 0.0);
    rows.push(Row {
        figure: "API writes per second, steady state".into(),
        target: "~0.4/s: 3 heartbeats + 1 Lease renewal per 10 s; nothing else".into(),
        measured: steady.map_or_else(
            || "—".into(),
            |w| format!("{:.2}/s", w.steady.len() as f64 / w.steady_seconds),
        ),
        met: steady.map(|w| {
            let other = w.steady.iter().filter(|x| x.kind() == Kind::Other).count();
            w.steady.len() as f64 / w.steady_seconds <= 0.4 * ABOUT && other == 0
        }),
    });
    let storm = r.storm.as_ref().filter(|s| !s.recovery.served.is_empty());
    rows.push(Row {
        figure: storm.map_or_else(
            || "replica killed: its streams served again by the others, s (p50 / max)".into(),
            |s| {
                format!(
                    "replica killed under {} streams: its {} streams served again by the others, s (p50 / max)",
                    s.streams,
                    s.recovery.served.len()
                )
            },
        ),
        target: "~2 s (§6: Envoys back on a replica; Envoy's backoff is capped at 2 s)".into(),
        measured: storm.map_or_else(|| "—".into(), |s| p50_max(&s.recovery.served)),
        met: storm
            .and_then(|s| s.recovery.served.last())
            .map(|max| secs(*max) <= 2.0 * ABOUT),
    });
    rows
}

/// The section, from its heading to a blank line.
pub fn render(r: &HaResults, runs: usize) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{HEADING}\n");
    let _ = writeln!(
        o,
        "Three replicas of the discovery service in Kubernetes mode with `--leader-elect` \
         (`marin3r_tests::ha::Fleet`: each replica is `serve_with` with \
         `KubernetesBackend::with_ha`, all of them tasks of one 2-worker runtime) against \
         one stateful fake API server (`marin3r_testkit::apiserver`, in memory), with the \
         defaults of `marin3r discovery-service`: NACK threshold 5, Lease 15 s renewed 5 s \
         before it expires, NACK evaluation every 1 s, reports coalesced over 500 ms with a \
         10 s heartbeat, drain 5 s + 5 s. The Envoys are the ADS client swarm \
         (`marin3r_bench::ads`: SotW, one mTLS connection per stream, ACKing or NACKing \
         like Envoy, reconnecting with Envoy's jittered backoff, 0.5 s base and 2 s cap). \
         Load average (1, 5, 15 min) at the start of this section {}, at its end {}; CPU \
         used by other processes meanwhile {} cores; {:.0} s in all. A `~` target of \
         docs/ha.md counts as met up to {:.0} % above it.\n",
        load_str(r.load_start),
        load_str(r.load_end),
        r.others
            .map_or_else(|| "unknown".to_string(), |c| format!("{c:.2}")),
        secs(r.elapsed),
        (ABOUT - 1.0) * 100.0
    );
    let _ = writeln!(
        o,
        "| figure | docs/ha.md | measured (min / **median** / max) | verdict |\n|---|---|---|---|"
    );
    for t in targets(r) {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} |",
            t.figure,
            t.target,
            t.measured,
            verdict(t.met)
        );
    }
    taint_part(&mut o, r.taint.as_ref(), runs);
    writes_part(&mut o, r.writes.as_ref());
    storm_part(&mut o, r.storm.as_ref());
    if !r.failures.is_empty() {
        let _ = writeln!(o, "\n### Failures of this section\n");
        for f in &r.failures {
            let _ = writeln!(o, "- {}", f.replace('\n', " "));
        }
    }
    o
}

fn taint_part(o: &mut String, t: Option<&Taint>, runs: usize) {
    let _ = writeln!(o, "\n### Fleet taint latency\n");
    let Some(t) = t else {
        let _ = writeln!(o, "Not measured in this run.");
        return;
    };
    let spread_text: Vec<String> = t.spread.iter().map(|(n, s)| format!("{n} {s}")).collect();
    let _ = writeln!(
        o,
        "{} streams of node `{}` connect through the TCP balancer that stands in for the \
         Service (round-robin per connection; streams per replica: {}). Each run applies a \
         good update (every stream has it, the status says `InSync` on every replica), \
         then a broken one (its listener routes to a cluster that does not exist, the \
         cluster unchanged), which every stream NACKs (`error_detail`, the version it \
         runs) each time the server sends it: at once, then after the server's NACK \
         backoff (100, 200, 400, 800 ms, …). The bench records when each NACK was handed \
         to its connection and reads the revisions in the fake API server every 5 ms; \
         the taint counts when `status.tainted` was first seen. Last NACK → taint is from \
         the last NACK sent before that moment. {} runs on one fleet, run k's broken edit \
         k/{} of the 1 s evaluation interval later than the others' (the leader judges \
         on that tick, so one phase alone would give one point of a spread); \
         connections lost meanwhile: {}.\n",
        t.streams,
        super::taint::NODE,
        spread_text.join(", "),
        runs,
        runs,
        t.disconnects
    );
    let _ = writeln!(
        o,
        "| run | edit → first NACK, ms | edit → taint, s | last NACK → taint, ms | NACKs before the taint (fewest of a stream / all) | last NACK → every stream got its previous listener again, ms |\n|---|---|---|---|---|---|"
    );
    for (i, r) in t.runs.iter().enumerate() {
        let _ = writeln!(
            o,
            "| {} | {:.0} | {:.2} | {:.0} | {} / {} | {:.0} |",
            i + 1,
            ms(r.first_nack),
            secs(r.edit_to_taint),
            ms(r.last_nack_to_taint),
            r.min_nacks_per_stream,
            r.nacks,
            ms(r.restored)
        );
    }
}

/// `what` rows: per edit counts, and the objects they touched.
fn edit_table(o: &mut String, edits: &[EditWrites], pick: fn(&EditWrites) -> &[Write]) {
    let mut rows: BTreeMap<String, (BTreeSet<String>, Vec<usize>)> = BTreeMap::new();
    for (i, e) in edits.iter().enumerate() {
        for w in pick(e) {
            let what = if w.code >= 400 {
                format!("{} → {}", w.what, w.code)
            } else {
                w.what.clone()
            };
            let row = rows
                .entry(what)
                .or_insert_with(|| (BTreeSet::new(), vec![0; edits.len()]));
            row.0.insert(w.object.clone());
            if let Some(c) = row.1.get_mut(i) {
                *c += 1;
            }
        }
    }
    let header: Vec<String> = (1..=edits.len()).map(|i| format!("edit {i}")).collect();
    let _ = writeln!(
        o,
        "| write | objects | {} |\n|---|---|{}",
        header.join(" | "),
        "---|".repeat(edits.len())
    );
    for (what, (objects, counts)) in &rows {
        let counts: Vec<String> = counts.iter().map(ToString::to_string).collect();
        let objects: Vec<&str> = objects.iter().map(String::as_str).collect();
        let _ = writeln!(
            o,
            "| {what} | {} | {} |",
            objects.join(", "),
            counts.join(" | ")
        );
    }
    let totals: Vec<String> = edits.iter().map(|e| pick(e).len().to_string()).collect();
    let _ = writeln!(o, "| **all** | | {} |", totals.join(" | "));
}

fn writes_part(o: &mut String, w: Option<&Writes>) {
    let _ = writeln!(o, "\n### API writes\n");
    let Some(w) = w else {
        let _ = writeln!(o, "Not measured in this run.");
        return;
    };
    let _ = writeln!(
        o,
        "{} EnvoyConfigs (one cluster and one listener each, node id = name) and {} \
         streams spread over their nodes ({} per node) through the balancer; every \
         stream configured {:.1} s after the swarm started. Every request the replicas \
         send is in the fake API server's log (`FakeApiServer::mark`, \
         `requests_since`; the bench's own writes bypass it); a write is a create, \
         update, patch, apply or delete, whatever its answer. **Per edit**: one \
         EnvoyConfig's spec replaced (a new cluster endpoint and listener body), counted \
         from the edit until its status says `InSync`, `publishedVersion` = \
         `desiredVersion` and `ReplicasInSync` True naming the new revision, and over \
         the {} s after that; the edited config's streams had the new versions after {} \
         ms (median). The edits are staggered over the 1 s evaluation interval as the \
         taint runs are. Writes that happen on their own (heartbeats, Lease renewals) \
         fall into these windows too. **Steady state**: {:.0} s without any change, {} s after \
         the last edit. Connections lost meanwhile: {}.\n",
        w.configs,
        w.streams,
        w.streams / w.configs.max(1),
        secs(w.connect),
        TRAIL.as_secs(),
        {
            let v: Vec<f64> = w.edits.iter().map(|e| ms(e.served.all)).collect();
            format!("{:.0}", median(&v))
        },
        w.steady_seconds,
        super::writes::SETTLE.as_secs(),
        w.disconnects
    );
    if !w.edits.is_empty() {
        let settled: Vec<f64> = w.edits.iter().map(|e| secs(e.settled)).collect();
        let _ = writeln!(
            o,
            "Writes from the edit until the status settled ({} s, min / median / max):\n",
            spread(&settled, 2)
        );
        edit_table(o, &w.edits, |e| &e.writes);
        let mut sequences: Vec<(String, usize)> = Vec::new();
        for e in &w.edits {
            let status_writes = e
                .writes
                .iter()
                .filter(|x| x.what == "apply envoyconfigs/status" && x.object == "the EnvoyConfig")
                .count();
            let mut text = e
                .status_changes
                .iter()
                .enumerate()
                .map(|(i, c)| format!("({}) {}", i + 1, c.join(", ")))
                .collect::<Vec<_>>()
                .join("; ");
            let idle = status_writes.saturating_sub(e.status_changes.len());
            if idle > 0 {
                let _ = write!(text, "; and {idle} status write(s) that changed nothing");
            }
            match sequences.iter_mut().find(|(t, _)| *t == text) {
                Some((_, n)) => *n += 1,
                None => sequences.push((text, 1)),
            }
        }
        let _ = writeln!(
            o,
            "\nThe EnvoyConfig's status as it changed until it settled (a watch of it; \
             what each change touched):\n"
        );
        for (text, n) in &sequences {
            let _ = writeln!(o, "- {n} of {} edits: {text}", w.edits.len());
        }
        let _ = writeln!(
            o,
            "\nWrites in the {} s after it settled:\n",
            TRAIL.as_secs()
        );
        edit_table(o, &w.edits, |e| &e.trailing);
    }
    if w.steady_seconds > 0.0 {
        let _ = writeln!(
            o,
            "\nSteady state, {:.0} s:\n\n| kind | writes | per second | which |\n|---|---|---|---|",
            w.steady_seconds
        );
        for (kind, name) in [
            (
                Kind::Report,
                "reports (DiscoveryServiceReplica changes and heartbeats)",
            ),
            (Kind::Lease, "Lease renewals"),
            (Kind::Other, "anything else"),
        ] {
            let of_kind: Vec<&Write> = w.steady.iter().filter(|x| x.kind() == kind).collect();
            let which: Vec<String> = tally(of_kind.iter().copied())
                .into_iter()
                .map(|(what, n)| format!("{what} ×{n}"))
                .collect();
            let _ = writeln!(
                o,
                "| {name} | {} | {:.3} | {} |",
                of_kind.len(),
                of_kind.len() as f64 / w.steady_seconds,
                which.join(", ")
            );
        }
        let _ = writeln!(
            o,
            "| **all** | {} | {:.3} | |",
            w.steady.len(),
            w.steady.len() as f64 / w.steady_seconds
        );
    }
}

fn storm_part(o: &mut String, s: Option<&Storm>) {
    let _ = writeln!(o, "\n### Reconnect storm\n");
    let Some(s) = s else {
        let _ = writeln!(o, "Not measured in this run.");
        return;
    };
    let per = |v: &[(String, usize)]| {
        v.iter()
            .map(|(n, c)| format!("{n} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        o,
        "{} streams over {} nodes ({} EnvoyConfigs, {} streams each) on the three \
         replicas, which run in a child process (`marin3r-bench --ha-fleet-process`): \
         the swarm and the replicas hold one descriptor per stream each, together more \
         than the open-files limit of one process, so the swarm dials the replicas \
         directly (round-robin, skipping an address that refuses) instead of through the \
         balancer, which would need two more per stream. Every stream configured {:.1} s \
         after the swarm started; streams per replica {}. Then replica `{}` (not the \
         leader, `{}`) is killed: its task aborted, no drain, its listener and \
         connections closed at once; its address leaves the swarm's targets at the same \
         moment (as the harness's balancer drops a killed backend). Each of its streams \
         sees its connection end, waits Envoy's backoff (uniform in [0, 0.5 s) the first \
         time), connects to a survivor (the swarm sets up its first connections 64 at a \
         time, but reconnects do not wait for one another, as separate Envoys do not) and \
         subscribes again with the versions it runs; it counts as served once it \
         accepted both its versions again on the new connection. A failed reconnect \
         attempt (refused, reset, TLS) waits the next backoff. Times from the kill, p50 / max over its streams; \
         \"connection ended\" is mostly the in-process kill's own lag (the fleet's busy \
         2-worker runtime drops {} aborted connection tasks; a crashed process's \
         sockets close at once), hence also the time from each stream's own end. \
         Afterwards: {}; other streams that lost their connection: {}.\n",
        s.streams,
        s.configs,
        s.configs,
        s.streams / s.configs.max(1),
        secs(s.connect),
        per(&s.before),
        s.victim,
        s.leader,
        s.recovery.served.len(),
        per(&s.after),
        s.recovery.others_lost
    );
    let _ = writeln!(
        o,
        "| the victim's streams | failed reconnect attempts | connection ended, s | ADS stream open again, s | served again, s | its connection ended → served again, s | fleet process RSS before / peak / after, MiB | `VmHWM` since the kill, MiB |\n|---|---|---|---|---|---|---|---|"
    );
    let _ = writeln!(
        o,
        "| {} | {} | {} | {} | {} | {} | {:.0} / {:.0} / {:.0} | {} |",
        s.recovery.served.len(),
        s.failed_attempts,
        p50_max(&s.recovery.down),
        p50_max(&s.recovery.reopened),
        p50_max(&s.recovery.served),
        p50_max(&s.recovery.served_after_down),
        mib(s.rss_before_kib),
        mib(s.rss_peak_kib),
        mib(s.rss_after_kib),
        s.hwm_kib
            .map_or_else(|| "—".to_string(), |k| format!("{:.0}", mib(k)))
    );
    let _ = writeln!(
        o,
        "\nFrom the kill until every stream was served ({:.2} s), the fleet process used \
         {:.2} s of CPU and the swarm (this process) {:.2} s, of the 2 cores' {:.2} s: \
         the swarm's half of each TLS handshake runs on the same cores as the replicas'. \
         The swarm's first connect ran at {:.0} streams/s (every stream configured), \
         which puts {} reconnects at {:.2} s of this machine's time.",
        s.recovery_wall,
        s.fleet_cpu,
        s.swarm_cpu,
        2.0 * s.recovery_wall,
        s.connect_rate,
        s.recovery.served.len(),
        s.recovery.served.len() as f64 / s.connect_rate.max(1e-9)
    );
    let _ = writeln!(
        o,
        "\nThe fleet process holds the three replicas (the killed one's memory is freed \
         as its tasks end), the fake API server and its request log; RSS is sampled \
         every 10 ms from `/proc/<pid>/status`."
    );
}

/// `existing` with `section` in place of its HA section, or inserted before the first
/// of `before` (headings) it has, or appended.
pub fn splice(existing: &str, section: &str, before: &[&str]) -> String {
    crate::markdown::splice(existing, HEADING, section, before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_replaces_the_old_one_or_goes_before_the_notes() {
        let report = "# Benchmarks\n\n## Shutdown manager\n\nx\n\n## Profiles\n\nnotes\n";
        let once = splice(report, &format!("{HEADING}\n\nfirst\n"), &["## Profiles"]);
        assert_eq!(
            once,
            format!(
                "# Benchmarks\n\n## Shutdown manager\n\nx\n\n{HEADING}\n\nfirst\n\n## Profiles\n\nnotes\n"
            )
        );
        let twice = splice(&once, &format!("{HEADING}\n\nsecond\n"), &["## Profiles"]);
        assert_eq!(twice, once.replace("first", "second"));
        let last = splice(
            "# B\n\n## A\n\na\n",
            &format!("{HEADING}\n\nz"),
            &["## None"],
        );
        assert_eq!(last, format!("# B\n\n## A\n\na\n\n{HEADING}\n\nz\n\n"));
        // An HA section at the end of the file is replaced to the end.
        assert_eq!(
            splice(&last, &format!("{HEADING}\n\ny\n"), &[]),
            format!("# B\n\n## A\n\na\n\n{HEADING}\n\ny\n\n")
        );
    }

    #[test]
    fn an_empty_run_renders() {
        let text = render(&HaResults::default(), 5);
        assert!(text.starts_with(HEADING));
        assert!(text.contains("not measured"));
        assert!(text.contains("Not measured in this run."));
    }
}
