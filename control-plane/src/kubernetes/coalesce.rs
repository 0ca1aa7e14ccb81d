//! Status writes that do not follow endpoint churn: a revision re-published within the same revision
//! (an EndpointSlice or a Secret it reads changed) changes only its
//! `status.providesVersions`. Those writes are coalesced per EnvoyConfig: the first one
//! is written at once, then at most one per [`STATUS_WINDOW`], and the last value is
//! always written (a trailing write when the window closes). The snapshot served to
//! Envoy is never delayed; what is judged against the NACKs is what is served, not the
//! status (`controller::served_versions`). Every other status change (published,
//! tainted, waiting) is written at once, and opens a window too.
//!
//! What shows the served version: CSDS reads the snapshot cache, so it (and the CSDS
//! part of `marin3r status --csds-address …`) is always exact. The revision table of
//! `marin3r status` in Kubernetes mode and `kubectl get ecr -o yaml` read
//! `status.providesVersions`, which lags the served versions by at most
//! [`STATUS_WINDOW`] while endpoints or Secrets change.
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
            entries: HashMap::new(),
        }
    }

    /// Whether a coalescable write for `key` is made at `now` ([`gate`]); a deferred one
    /// is pending until a write of `key` is recorded.
    pub fn offer(&mut self, key: K, now: Instant) -> Gate {
        let last = self.entries.get(&key).map(|e| e.last);
        let gate = gate(now, last, self.window);
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
        let window = self.window;
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
