//! Benchmarks of marin3r-rs against peers and the physical limit (driven by
//! `scripts/bench`, which writes `BENCHMARKS.md`): the webhook against a bare rustls
//! HTTPS echo server, an ADS client swarm against the discovery service process, the
//! CPU-bound cores, idle memory, and three replicas in Kubernetes mode ([`ha`]).
//! Everything listens on 127.0.0.1, every loop is bounded, and every child process is
//! killed when its handle drops.
#![forbid(unsafe_code)]

pub mod ads;
pub mod churn;
pub mod cores;
pub mod echo;
pub mod ha;
pub mod loadgen;
pub mod machine;
pub mod markdown;
pub mod plot;
pub mod process;
pub mod stats;
pub mod webhook;

/// One row of `tests/benches/edit_to_serve.rs`'s summary table (milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub struct EditToServe {
    pub api: String,
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

/// Parses the summary table printed by `cargo bench -p marin3r-tests --bench
/// edit_to_serve` (`api n min p50 p90 max`, one row per API).
pub fn parse_edit_to_serve(output: &str) -> Vec<EditToServe> {
    output
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let [api, n, min, p50, p90, max] = cols.as_slice() else {
                return None;
            };
            if !matches!(*api, "sotw" | "delta") {
                return None;
            }
            Some(EditToServe {
                api: (*api).to_string(),
                n: n.parse().ok()?,
                min: min.parse().ok()?,
                p50: p50.parse().ok()?,
                p90: p90.parse().ok()?,
                max: max.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_edit_to_serve_table() {
        let out = "edit → serve: 30 edits …\n\napi      n   min ms   p50 ms   p90 ms   max ms\n\
                   sotw    30     12.0    101.5    180.2    230.9\n\
                   delta   30     10.1     99.0    170.0    201.0\nnote: …\n";
        let rows = parse_edit_to_serve(out);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].api, "sotw");
        assert_eq!(rows[0].p50, 101.5);
        assert_eq!(rows[1].n, 30);
        assert_eq!(rows[1].max, 201.0);
    }
}
