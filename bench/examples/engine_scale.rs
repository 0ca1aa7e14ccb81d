//! Local-mode publishing cost against the number of other EnvoyConfigs in the folder:
//! `cargo run --release -p marin3r-bench --example engine_scale -- 0 100 1000`.
//! For each count: the first scan + reconcile (startup), then one EnvoyConfig edited
//! and the folder re-scanned and reconciled (an edit), 9 times; prints the medians split
//! into scan, manifests and reconcile. This is the sans-I/O part of an edit; `scripts/bench`
//! measures the whole path to ADS streams.
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use marin3r_bench::ads::swarm_config_yaml;
use marin3r_control_plane::local::{Engine, LocalSource, Options};
use marin3r_xds::SharedStats;

fn write_atomic(path: &std::path::Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    for others in if counts.is_empty() {
        vec![0, 100, 1000]
    } else {
        counts
    } {
        let dir = tempfile::tempdir()?;
        for i in 0..others {
            let node = format!("other-{i}");
            std::fs::write(
                dir.path().join(format!("{node}.yaml")),
                swarm_config_yaml(&node, 0),
            )?;
        }
        let file = dir.path().join("edited.yaml");
        std::fs::write(&file, swarm_config_yaml("edited", 0))?;
        let stats = SharedStats::new();
        let mut source = LocalSource::new(dir.path());
        let mut engine = Engine::new(Options::default());
        let start = Instant::now();
        source.scan()?;
        let effects = engine.reconcile(&source.manifests(), &stats, SystemTime::now());
        let startup = start.elapsed();
        let (mut scans, mut manifests, mut reconciles, mut totals) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for revision in 1..=9 {
            write_atomic(&file, &swarm_config_yaml("edited", revision))?;
            let t0 = Instant::now();
            source.scan()?;
            let t1 = Instant::now();
            let m = source.manifests();
            let t2 = Instant::now();
            let effects = engine.reconcile(&m, &stats, SystemTime::now());
            let t3 = Instant::now();
            assert!(!effects.is_empty(), "the edit publishes");
            scans.push(t1 - t0);
            manifests.push(t2 - t1);
            reconciles.push(t3 - t2);
            totals.push(t3 - t0);
        }
        println!(
            "{others:>5} others: startup {:>8.1} ms ({} effects); edit median {:>8.2} ms (scan {:.2}, manifests {:.2}, reconcile {:.2})",
            startup.as_secs_f64() * 1e3,
            effects.len(),
            median(totals).as_secs_f64() * 1e3,
            median(scans).as_secs_f64() * 1e3,
            median(manifests).as_secs_f64() * 1e3,
            median(reconciles).as_secs_f64() * 1e3,
        );
    }
    Ok(())
}
