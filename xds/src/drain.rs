//! Draining the ADS streams on shutdown: on the signal every stream open at that moment
//! gets a rank, and the stream ranked `i` of `n` closes [`close_offset`]`(i, n, window)`
//! after the signal (`AdsConfig::drain_time`), with `UNAVAILABLE` and [`SHUTTING_DOWN`].
//! Until then it keeps serving (pushes still go out). Envoy keeps its config and
//! reconnects with its backoff, so spreading the closes spreads the reconnections to
//! the other replicas.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// When the stream ranked `index` (0-based) among `count` streams closes, counted from
/// the shutdown signal: `window · index / count`, so the first closes at once and the
/// last `window / count` before the window ends. A rank at or beyond `count` (a stream
/// that opened while the drain began) closes at the end of the window.
pub fn close_offset(index: usize, count: usize, window: Duration) -> Duration {
    if index >= count {
        return window;
    }
    // window · index / count, exact and without overflow: with q, r = window ÷ count,
    // q · index ≤ window and r · index < count² ≤ 2¹²⁸.
    let (n, i, c) = (window.as_nanos(), index as u128, count as u128);
    let nanos = (n / c) * i + (n % c) * i / c;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The drain state shared by a server's streams.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    /// Streams open now.
    open: AtomicUsize,
    /// When the drain began and how many streams were open then.
    plan: OnceLock<(Instant, usize)>,
    /// The next rank to hand out.
    next_rank: AtomicUsize,
    /// Notified when the last open stream closes.
    all_closed: tokio::sync::Notify,
}

/// Counts a stream as open while it lives.
#[derive(Debug)]
pub(crate) struct OpenStream<'a>(&'a Drain);

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all_closed.notify_waiters();
        }
    }
}

impl Drain {
    pub(crate) fn opened(&self) -> OpenStream<'_> {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenStream(self)
    }

    /// The drain begins at `now` (idempotent: the first call fixes the plan).
    pub(crate) fn begin(&self, now: Instant) {
        self.plan
            .get_or_init(|| (now, self.open.load(Ordering::Acquire)));
    }

    /// Completes when no stream is open.
    pub(crate) async fn all_closed(&self) {
        let notified = self.all_closed.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        if self.open.load(Ordering::Acquire) == 0 {
            return;
        }
        notified.await;
    }

    /// The close instant of the next stream to ask (each stream asks once); `None`
    /// before [`begin`](Self::begin).
    pub(crate) fn close_at(&self, window: Duration) -> Option<Instant> {
        let (start, count) = *self.plan.get()?;
        let rank = self.next_rank.fetch_add(1, Ordering::AcqRel);
        Some(start + close_offset(rank, count, window))
    }
}

#[cfg(test)]
mod tests {
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
        // 10,000 streams over 5 s: 2,000 closes per second, none past the window.
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
    fn a_zero_window_closes_everything_at_once_and_late_streams_close_at_the_end() {
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
            "a single stream at once"
        );
        // Huge windows do not overflow.
        let huge = Duration::from_secs(u64::MAX / 2);
        assert!(close_offset(usize::MAX - 1, usize::MAX, huge) <= huge);
    }

    #[test]
    fn ranks_follow_the_streams_open_when_the_drain_began() {
        let drain = Drain::default();
        let window = Duration::from_secs(4);
        assert_eq!(drain.close_at(window), None, "no drain yet");
        let streams: Vec<_> = (0..4).map(|_| drain.opened()).collect();
        drop(drain.opened()); // one that closed before the signal
        let t0 = Instant::now();
        drain.begin(t0);
        drain.begin(t0 + window); // idempotent
        let closes: Vec<Duration> = (0..5)
            .map(|_| drain.close_at(window).unwrap() - t0)
            .collect();
        assert_eq!(
            closes,
            [
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(3),
                window
            ]
        );
        drop(streams);
        assert_eq!(drain.open.load(Ordering::Acquire), 0);
    }
}
