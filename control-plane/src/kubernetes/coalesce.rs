//! Status writes that do not follow endpoint churn: a revision re-published within the same revision
//! (an EndpointSlice or a Secret it reads changed) changes only its
//! `status.providesVersions`. Those writes are coalesced per EnvoyConfig: the first one
//! is written at once, then at most one per [`STATUS_WINDOW`], and the last value is
//! always written (a trailing write when the window closes). While more EnvoyConfigs
//! re-publish than [`STATUS_BUDGET`] writes a second allow, the window widens to their
//! number over the budget (300 EnvoyConfigs reading churning Services: one write each
//! per minute), so these writes stay near the budget whatever the fleet's size (the
//! churn benchmark: 0.99 API writes per EndpointSlice write with the 5 s window alone,
//! at 300 reading EnvoyConfigs). The snapshot served to
//! Envoy is never delayed; what is judged against the NACKs is what is served, not the
//! status (`publish::served_versions`). Every other status change (published,
//! tainted, waiting) is written at once, and opens a window too.
//!
//! What shows the served version: CSDS reads the snapshot cache, so it (and the CSDS
//! part of `marin3r status --csds-address …`) is always exact. The revision table of
//! `marin3r status` in Kubernetes mode and `kubectl get ecr -o yaml` read
//! `status.providesVersions`, which lags the served versions by at most the window
//! ([`STATUS_WINDOW`], or the widened one) while endpoints or Secrets change.
//!
//! Sans-I/O: [`gate`] and [`Coalescer`] take the instant as input; the reconcile
//! ([`super::controller::reconcile_revision`]) asks before a coalescable write,
//! requeues itself for the trailing write, and records every status write it made.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// At most one coalescable status write per EnvoyConfig in this window: 50 slice writes
/// per second read by an EnvoyConfig cost 0.2 status writes per second instead of 50.
pub const STATUS_WINDOW: Duration = Duration::from_secs(5);

/// Coalescable status writes per second the process aims at, over every EnvoyConfig:
/// with more EnvoyConfigs in their window than this many per second, each one's window
/// is their number over this budget ([`Coalescer::window`]).
pub const STATUS_BUDGET: u32 = 5;

/// What to do with a coalescable status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Write it now.
    Write,
    /// Not before this much time (the window of the last write closes then): look again
    /// then, with the value of that time.
    Defer(Duration),
}

/// The rule: at `now`, with the last status write at `last`, a coalescable write is made
/// at once if the window of `last` has closed, deferred to its end otherwise.
pub fn gate(now: Instant, last: Option<Instant>, window: Duration) -> Gate {
    match last.map(|last| last + window) {
        Some(end) if now < end => Gate::Defer(end - now),
        _ => Gate::Write,
    }
}

/// The last status write and whether a deferred one is pending, per key (an
/// EnvoyConfig: its namespace and UID).
#[derive(Debug)]
pub struct Coalescer<K> {
    window: Duration,
    budget: u32,
    entries: HashMap<K, Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    last: Instant,
    pending: bool,
}

impl<K: std::hash::Hash + Eq> Coalescer<K> {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            budget: STATUS_BUDGET,
            entries: HashMap::new(),
        }
    }

    /// The window now: the base one, widened to the EnvoyConfigs tracked over the budget
    /// (each writes once per window, so all of them about `budget` times a second).
    pub fn window(&self) -> Duration {
        let spread = Duration::from_secs(self.entries.len() as u64) / self.budget.max(1);
        self.window.max(spread)
    }

    /// `key`'s window: a widened one is stretched by up to half, by a fixed fraction of
    /// the key's hash, so EnvoyConfigs written together (a Service many read, a
    /// restart) drift apart instead of writing in bursts at every window's end.
    fn window_of(&self, key: &K) -> Duration {
        let window = self.window();
        if window == self.window {
            return window;
        }
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(key, &mut h);
        let fraction = (std::hash::Hasher::finish(&h) % 1024) as f64 / 2048.0;
        window + window.mul_f64(fraction)
    }

    /// Whether a coalescable write for `key` is made at `now` ([`gate`]); a deferred one
    /// is pending until a write of `key` is recorded.
    pub fn offer(&mut self, key: K, now: Instant) -> Gate {
        let last = self.entries.get(&key).map(|e| e.last);
        let gate = gate(now, last, self.window_of(&key));
        if let (Gate::Defer(_), Some(e)) = (gate, self.entries.get_mut(&key)) {
            e.pending = true;
        }
        gate
    }

    /// Records a status write of `key` at `now` (any write: it carries the last value,
    /// and opens a window). Entries whose window closed with nothing pending are
    /// dropped (they decide as an absent one does), so the map holds the EnvoyConfigs
    /// written in the last window only.
    pub fn written(&mut self, key: K, now: Instant) {
        self.entries.insert(
            key,
            Entry {
                last: now,
                pending: false,
            },
        );
        // Kept while any key's window may still be open (at most 1.5 widened windows).
        let window = self.window().mul_f64(1.5);
        self.entries
            .retain(|_, e| e.pending || now.saturating_duration_since(e.last) < window);
    }

    /// Whether a deferred write of `key` is pending.
    pub fn pending(&self, key: &K) -> bool {
        self.entries.get(key).is_some_and(|e| e.pending)
    }

    /// How many EnvoyConfigs are tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = STATUS_WINDOW;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_write_is_made_at_once_then_deferred_to_the_end_of_the_window() {
        let t0 = Instant::now();
        assert_eq!(gate(t0, None, W), Gate::Write);
        assert_eq!(gate(t0 + ms(20), Some(t0), W), Gate::Defer(W - ms(20)));
        assert_eq!(gate(t0 + W - ms(1), Some(t0), W), Gate::Defer(ms(1)));
        assert_eq!(gate(t0 + W, Some(t0), W), Gate::Write);
        assert_eq!(gate(t0 + W * 3, Some(t0), W), Gate::Write);
    }

    /// N coalescable writes within the window: one at once, one trailing write at the
    /// window's end (which carries the last value: the reconcile computes it then).
    #[test]
    fn n_writes_in_a_window_cost_one_write_and_one_trailing_write() {
        let mut c = Coalescer::new(W);
        let t0 = Instant::now();
        let mut writes = Vec::new();
        let mut due = None;
        for i in 0..50u64 {
            let now = t0 + ms(20 * i);
            match c.offer("ec", now) {
                Gate::Write => {
                    c.written("ec", now);
                    writes.push(now);
                }
                Gate::Defer(d) => due = Some(now + d),
            }
        }
        assert_eq!(writes, [t0]);
        assert!(c.pending(&"ec"));
        let due = due.unwrap();
        assert_eq!(due, t0 + W);
        assert_eq!(c.offer("ec", due), Gate::Write);
        c.written("ec", due);
        assert!(!c.pending(&"ec"));
        // The next one waits for the trailing write's window.
        assert_eq!(c.offer("ec", due + ms(1)), Gate::Defer(W - ms(1)));
    }

    #[test]
    fn envoyconfigs_are_coalesced_apart_and_closed_windows_are_forgotten() {
        let mut c = Coalescer::new(W);
        let t0 = Instant::now();
        assert_eq!(c.offer("a", t0), Gate::Write);
        c.written("a", t0);
        assert_eq!(c.offer("b", t0 + ms(1)), Gate::Write);
        c.written("b", t0 + ms(1));
        assert_eq!(c.offer("a", t0 + ms(2)), Gate::Defer(W - ms(2)));
        assert_eq!(c.len(), 2);
        // "a" is pending, "b" closed: only "a" (and the new "c") are kept.
        c.written("c", t0 + W * 2);
        assert_eq!(c.len(), 2);
        assert!(c.pending(&"a"));
        assert_eq!(c.offer("b", t0 + W * 2), Gate::Write);
    }

    /// 300 EnvoyConfigs re-publishing every 100 ms for 10 minutes: the writes stay near
    /// the budget (not 60 a second, as one 5 s window each would give), every
    /// EnvoyConfig is written again and again, and each one's pending value is written
    /// within the widened window.
    #[test]
    fn many_envoyconfigs_share_the_budget_and_each_is_still_written() {
        let mut c = Coalescer::new(W);
        let t0 = Instant::now();
        let keys = 300usize;
        let mut due: Vec<Instant> = vec![t0; keys];
        let mut writes = vec![0u32; keys];
        let mut total_after_warmup = 0u32;
        let mut longest_wait = Duration::ZERO;
        let mut offered_at: Vec<Option<Instant>> = vec![None; keys];
        let mut per_second = vec![0u32; 600];
        for tick in 0..6_000u64 {
            let now = t0 + ms(100 * tick);
            for k in 0..keys {
                if now < due[k] {
                    offered_at[k].get_or_insert(now);
                    continue;
                }
                match c.offer(k, now) {
                    Gate::Write => {
                        c.written(k, now);
                        writes[k] += 1;
                        per_second[(tick / 10) as usize] += 1;
                        if tick >= 1_200 {
                            total_after_warmup += 1;
                        }
                        if let Some(first) = offered_at[k].take() {
                            longest_wait = longest_wait.max(now - first);
                        }
                    }
                    Gate::Defer(d) => {
                        due[k] = now + d;
                        offered_at[k].get_or_insert(now);
                    }
                }
            }
        }
        let rate = f64::from(total_after_warmup) / 480.0;
        assert!(rate <= f64::from(STATUS_BUDGET) * 1.1, "{rate} writes/s");
        assert!(writes.iter().all(|w| *w >= 5), "{writes:?}");
        assert!(longest_wait <= Duration::from_secs(91), "{longest_wait:?}");
        let busiest = per_second.iter().skip(300).max().copied().unwrap_or(0);
        assert!(
            busiest <= STATUS_BUDGET * 6,
            "{busiest} writes in one second"
        );
        // A few EnvoyConfigs keep the base window.
        let mut few = Coalescer::new(W);
        for k in 0..3 {
            few.written(k, t0);
        }
        assert_eq!(few.window(), W);
    }

    /// Any status write (published, tainted) opens a window: a re-publication right
    /// after a new revision was published waits for it.
    #[test]
    fn any_recorded_write_opens_a_window() {
        let mut c = Coalescer::new(W);
        let t0 = Instant::now();
        c.written("a", t0);
        assert_eq!(c.offer("a", t0 + ms(100)), Gate::Defer(W - ms(100)));
    }
}
