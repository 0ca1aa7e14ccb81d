//! Small statistics: min/median/max over runs, nearest-rank percentiles over latencies.

use std::time::Duration;

/// Min, median and max of a set of per-run figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    /// `None` for no samples (or a NaN among them).
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|s| s.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            *sorted.get(n / 2)?
        } else {
            (*sorted.get(n / 2 - 1)? + *sorted.get(n / 2)?) / 2.0
        };
        Some(Self {
            n,
            min: *sorted.first()?,
            median,
            max: *sorted.last()?,
        })
    }
}

/// Latency percentiles (nearest rank) of one load run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Percentiles {
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Percentiles {
    /// Sorts `samples` in place; `None` when empty.
    pub fn of(samples: &mut [Duration]) -> Option<Self> {
        samples.sort_unstable();
        Some(Self {
            p50: nearest_rank(samples, 50.0)?,
            p90: nearest_rank(samples, 90.0)?,
            p99: nearest_rank(samples, 99.0)?,
            max: *samples.last()?,
        })
    }
}

/// The nearest-rank `p`th percentile of sorted `samples`.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len() as f64;
    let rank = ((p / 100.0) * n).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// Milliseconds as `f64`.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Microseconds as `f64`.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_percentiles() {
        let s = Spread::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.n, s.min, s.median, s.max), (4, 1.0, 2.5, 10.0));
        assert_eq!(Spread::of(&[5.0]).unwrap().median, 5.0);
        assert!(Spread::of(&[]).is_none());
        let mut l: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = Percentiles::of(&mut l).unwrap();
        assert_eq!(p.p50, Duration::from_millis(50));
        assert_eq!(p.p99, Duration::from_millis(99));
        assert_eq!(p.max, Duration::from_millis(100));
    }
}
