//! When the ADS server closes a connection, sans-I/O ([`crate::server`] applies it):
//!
//! - **on shutdown** ([`DrainPlan`]): the server keeps serving fully for
//!   [`drain_delay`] (`AdsConfig::drain_delay`, while Kubernetes removes the endpoint;
//!   zero when no ADS stream is open, and over as soon as the last one closes: nothing
//!   to redirect), then stops accepting and gives every connection open at that moment
//!   a rank in accept order; the connection ranked `i` of `n` closes
//!   [`close_offset`]`(i, n, window)` after that (`AdsConfig::drain_time`). Until its
//!   turn a connection keeps serving (new streams, pushes);
//! - **by age** ([`jittered_age`]): a connection closes `AdsConfig::max_connection_age`
//!   ± [`MAX_AGE_JITTER_PERCENT`] % after it was accepted, the jitter drawn from a
//!   per-connection seed, so the connections of a fleet that connected together (after a
//!   rollout) do not all come back at once, and streams rebalance over the replicas.
//!
//! Closing is the same for both reasons ([`CloseReason`]): the connection gets an HTTP/2
//! GOAWAY and its ADS streams end with `UNAVAILABLE` and [`CloseReason::message`]. Envoy
//! keeps its config and opens a new connection (a connection that sent a GOAWAY takes no
//! new stream) — through the Service, to any replica.

use std::time::Duration;

use tokio::time::Instant;

/// The message of the `UNAVAILABLE` status a stream ends with when the server stops.
///
/// Why `UNAVAILABLE` rather than `OK`: Envoy (`grpc_stream.h`, `logClose`) treats both
/// the same way — it keeps its config, logs the first close at debug level and
/// reconnects after its backoff — but `UNAVAILABLE` is the status gRPC defines for "try
/// again" (other ADS clients retry on it; some treat `OK` as the end of the
/// conversation), and if the closes go on (no replica left) Envoy turns it into a
/// warning once its backoff time limit passes, where `OK` would stay silent.
pub const SHUTTING_DOWN: &str = "discovery service shutting down";

/// The message of the `UNAVAILABLE` status a stream ends with when its connection
/// reached its max age (same handling by Envoy as [`SHUTTING_DOWN`]).
pub const MAX_AGE_REACHED: &str = "connection max age reached; reconnect";
/// The status message of a connection closed for being idle (it has no stream, so no
/// client sees it; for logs and symmetry).
pub const IDLE: &str = "connection idle; reconnect";

/// The jitter of the connection max age: each connection lives `max_age` ± this
/// percentage (Istio's default spread; gRPC's `MAX_CONNECTION_AGE` jitter is the same).
pub const MAX_AGE_JITTER_PERCENT: u32 = 10;

/// Why the server closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The server shuts down (its turn in the [`DrainPlan`] came).
    Shutdown,
    /// The connection reached its [`jittered_age`].
    MaxAge,
    /// The connection had no stream for the idle timeout
    /// ([`crate::limits::IDLE_TIMEOUT`]).
    Idle,
}

impl CloseReason {
    /// The message of the `UNAVAILABLE` status the connection's ADS streams end with.
    pub fn message(self) -> &'static str {
        match self {
            Self::Shutdown => SHUTTING_DOWN,
            Self::MaxAge => MAX_AGE_REACHED,
            Self::Idle => IDLE,
        }
    }

    /// For logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shutdown => "shutdown",
            Self::MaxAge => "max age",
            Self::Idle => "idle",
        }
    }
}

/// How long the server keeps serving fully after the shutdown signal before it starts
/// closing connections: `delay` while `ads_connections` (connections with an ADS stream
/// open: Envoys) are open — their Envoys must find the endpoint gone when they reconnect
/// — and zero when none is: there is nothing to redirect, and a replica without Envoys
/// exits at once. (For the same reason the server also ends the delay early when the
/// last ADS stream closes.)
pub fn drain_delay(ads_connections: usize, delay: Duration) -> Duration {
    if ads_connections == 0 {
        Duration::ZERO
    } else {
        delay
    }
}

/// When the connection ranked `index` (0-based) among `count` connections closes,
/// counted from the start of the drain: `window · index / count`, so the first closes at
/// once and the last `window / count` before the window ends. A rank at or beyond `count`
/// closes at the end of the window.
pub fn close_offset(index: usize, count: usize, window: Duration) -> Duration {
    if index >= count {
        return window;
    }
    // window · index / count, exact and without overflow: with q, r = window ÷ count,
    // q · index ≤ window and r · index < count² ≤ 2¹²⁸.
    let (n, i, c) = (window.as_nanos(), index as u128, count as u128);
    from_nanos((n / c) * i + (n % c) * i / c)
}

/// The lifetime of a connection whose seed is `seed`: `max_age` ± [`MAX_AGE_JITTER_PERCENT`]
/// %, spread uniformly (to the nanosecond) over that band by a mix of the seed, so
/// consecutive seeds land far apart; the same seed always gives the same age. `None`
/// (never closed by age) when `max_age` is zero.
pub fn jittered_age(max_age: Duration, seed: u64) -> Option<Duration> {
    if max_age.is_zero() {
        return None;
    }
    let nanos = max_age.as_nanos();
    let spread = nanos * u128::from(MAX_AGE_JITTER_PERCENT) / 100;
    // A draw in [0, 2·spread]; the modulo bias is below 2⁻⁶⁴ · 2·spread, nothing.
    let draw = u128::from(mix(seed)) % (2 * spread + 1);
    Some(from_nanos(nanos - spread + draw))
}

/// The drain of one shutdown: when each connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainPlan {
    start: Instant,
    window: Duration,
    /// The connections open when the drain began, ascending (accept order).
    open: Vec<u64>,
}

impl DrainPlan {
    /// The drain that begins at `start` over `window`, for the connections `open` (their
    /// ids, in any order; a connection's rank is its place in ascending order).
    pub fn new(start: Instant, window: Duration, open: impl IntoIterator<Item = u64>) -> Self {
        let mut open: Vec<u64> = open.into_iter().collect();
        open.sort_unstable();
        open.dedup();
        Self {
            start,
            window,
            open,
        }
    }

    /// How many connections the drain closes (those open when it began).
    pub fn connections(&self) -> usize {
        self.open.len()
    }

    /// When the connection `id` closes; a connection the plan does not know (it finished
    /// its handshake after the drain began, when the listener was already closed) at
    /// once.
    pub fn close_at(&self, id: u64) -> Instant {
        match self.open.binary_search(&id) {
            Ok(rank) => after(self.start, close_offset(rank, self.open.len(), self.window)),
            Err(_) => self.start,
        }
    }

    /// When the last connection of the plan closes (the start when it has none); the
    /// server's shutdown grace counts from there.
    pub fn last_close(&self) -> Instant {
        let count = self.open.len();
        match count.checked_sub(1) {
            Some(last) => after(self.start, close_offset(last, count, self.window)),
            None => self.start,
        }
    }
}

/// `start + d`, saturating (a flag of a hundred years must not panic): past what the
/// clock can represent, a year after `start`, the same as never for a server.
pub(crate) fn after(start: Instant, d: Duration) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    start
        .checked_add(d)
        .or_else(|| start.checked_add(YEAR))
        .unwrap_or(start)
}

/// `nanos` as a duration, saturating at [`Duration::MAX`].
fn from_nanos(nanos: u128) -> Duration {
    const PER_SEC: u128 = 1_000_000_000;
    match u64::try_from(nanos / PER_SEC) {
        // The remainder is below 10⁹, so it fits a u32.
        Ok(secs) => Duration::new(secs, (nanos % PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

/// SplitMix64's finalizer: a bijection of `u64` whose outputs for consecutive inputs
/// look independent.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn closes_are_spread_evenly_over_the_window() {
        let s = Duration::from_secs;
        let offsets: Vec<Duration> = (0..5).map(|i| close_offset(i, 5, s(5))).collect();
        assert_eq!(offsets, [s(0), s(1), s(2), s(3), s(4)]);
        // Uneven division stays exact to the nanosecond and monotonic.
        let window = Duration::from_millis(1000);
        let offsets: Vec<Duration> = (0..3).map(|i| close_offset(i, 3, window)).collect();
        assert_eq!(
            offsets,
            [
                Duration::ZERO,
                Duration::from_nanos(333_333_333),
                Duration::from_nanos(666_666_666)
            ]
        );
        // 10,000 connections over 5 s: 2,000 closes per second, none past the window.
        let n = 10_000;
        let per_second =
            (0..n)
                .map(|i| close_offset(i, n, s(5)).as_secs())
                .fold([0usize; 6], |mut acc, sec| {
                    acc[sec as usize] += 1;
                    acc
                });
        assert_eq!(per_second, [2000, 2000, 2000, 2000, 2000, 0]);
    }

    #[test]
    fn a_zero_window_closes_everything_at_once_and_ranks_past_the_count_at_the_end() {
        let s = Duration::from_secs;
        for i in 0..4 {
            assert_eq!(close_offset(i, 4, Duration::ZERO), Duration::ZERO);
        }
        assert_eq!(
            close_offset(4, 4, s(5)),
            s(5),
            "beyond the count: at the end"
        );
        assert_eq!(close_offset(0, 0, s(5)), s(5));
        assert_eq!(
            close_offset(0, 1, s(5)),
            Duration::ZERO,
            "a single connection at once"
        );
        // Huge windows do not overflow.
        let huge = Duration::from_secs(u64::MAX / 2);
        assert!(close_offset(usize::MAX - 1, usize::MAX, huge) <= huge);
        assert_eq!(close_offset(1, 2, Duration::MAX), Duration::MAX / 2);
    }

    #[test]
    fn the_plan_ranks_the_connections_open_when_the_drain_began_in_accept_order() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        // Ids as the accept loop hands them out; 12 closed before the drain.
        let plan = DrainPlan::new(t0, s(4), [31, 7, 19, 7, 3]);
        assert_eq!(plan.connections(), 4, "duplicates count once");
        let closes: Vec<Duration> = [3, 7, 19, 31].map(|id| plan.close_at(id) - t0).to_vec();
        assert_eq!(closes, [s(0), s(1), s(2), s(3)]);
        assert_eq!(plan.last_close() - t0, s(3));
        // Unknown to the plan (handshake finished after the drain began): at once.
        assert_eq!(plan.close_at(40), t0);
        assert_eq!(plan.close_at(12), t0);
        // No connection: nothing to wait for.
        let empty = DrainPlan::new(t0, s(4), []);
        assert_eq!(empty.connections(), 0);
        assert_eq!(empty.close_at(1), t0);
        assert_eq!(empty.last_close(), t0);
        // A window too large for the clock does not panic.
        let far = DrainPlan::new(t0, Duration::MAX, [1, 2]);
        assert!(far.close_at(2) > t0 + s(86_400));
    }

    #[test]
    fn the_delay_applies_only_while_an_ads_connection_is_open() {
        let delay = Duration::from_secs(5);
        assert_eq!(drain_delay(0, delay), Duration::ZERO);
        assert_eq!(drain_delay(1, delay), delay);
        assert_eq!(drain_delay(10_000, delay), delay);
        assert_eq!(drain_delay(3, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn ages_stay_within_ten_percent_and_spread_over_the_whole_band() {
        let max_age = Duration::from_secs(30 * 60);
        let (low, high) = (max_age * 9 / 10, max_age * 11 / 10);
        let n = 10_000u64;
        let ages: Vec<Duration> = (0..n)
            .map(|seed| jittered_age(max_age, seed).unwrap())
            .collect();
        assert!(
            ages.iter().all(|a| (low..=high).contains(a)),
            "an age outside 30 min ± 10 %"
        );
        // Uniform over the band: each tenth of it gets about a tenth of the
        // connections (1,000 ± 15 %; a fixed seed sequence, so no flakiness).
        let band = high - low;
        let mut tenths = [0u32; 10];
        for a in &ages {
            let i = ((*a - low).as_nanos() * 10 / band.as_nanos()).min(9) as usize;
            tenths[i] += 1;
        }
        assert!(
            tenths.iter().all(|&c| (850..=1150).contains(&c)),
            "not spread over ±10 %: {tenths:?}"
        );
        // Consecutive seeds (as a server hands them out) are not ordered by age.
        let rising = ages.windows(2).filter(|w| w[1] > w[0]).count() as u64;
        assert!((n * 4 / 10..=n * 6 / 10).contains(&rising), "{rising}");
        // The same seed always gives the same age; most distinct seeds different ones.
        assert_eq!(jittered_age(max_age, 42), jittered_age(max_age, 42));
        let mut distinct = ages.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() as u64 > n * 99 / 100);
    }

    #[test]
    fn a_zero_max_age_disables_it_and_extremes_do_not_overflow() {
        assert_eq!(jittered_age(Duration::ZERO, 7), None);
        // 1 ns: no room for jitter.
        assert_eq!(
            jittered_age(Duration::from_nanos(1), 7),
            Some(Duration::from_nanos(1))
        );
        // 10 ns: 9..=11 ns.
        for seed in 0..100 {
            let a = jittered_age(Duration::from_nanos(10), seed).unwrap();
            assert!((9..=11).contains(&a.as_nanos()), "{a:?}");
        }
        // Duration::MAX: never above it.
        for seed in [0, 1, u64::MAX] {
            let a = jittered_age(Duration::MAX, seed).unwrap();
            assert!(a >= Duration::MAX - Duration::MAX / 10, "{a:?}");
        }
    }

    #[test]
    fn reasons_name_their_status_message() {
        assert_eq!(CloseReason::Shutdown.message(), SHUTTING_DOWN);
        assert_eq!(CloseReason::MaxAge.message(), MAX_AGE_REACHED);
        assert_ne!(CloseReason::Shutdown.as_str(), CloseReason::MaxAge.as_str());
    }
}
