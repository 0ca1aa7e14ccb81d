//! The drain decision, free of I/O: given what the last poll of Envoy's admin returned
//! and the current time, decide whether to keep polling (and when) or to finish.
//!
//! The async driver in the server only sleeps, polls and feeds results in here, so every
//! rule (min connections, min drain duration, drain timeout, Envoy gone) is covered by
//! plain `#[test]`s below.

use std::time::{Duration, Instant};

/// The knobs of the drain loop (a subset of [`crate::Config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainSettings {
    /// Finish when the open connection count is at or below this.
    pub min_open_connections: u64,
    /// Never finish as "drained" before this much time has passed since the drain started.
    pub min_drain_duration: Duration,
    /// Finish regardless of open connections once this much time passed since the start.
    pub drain_timeout: Duration,
    /// Time between two polls of Envoy's stats.
    pub check_drain_interval: Duration,
    /// Finish after this many consecutive failed polls (Envoy is gone); `0` disables this
    /// and leaves only the drain timeout.
    pub envoy_gone_after: u32,
}

/// What one poll of Envoy's admin produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollResult {
    /// The admin answered; this many downstream connections are open.
    Open(u64),
    /// The admin could not be reached (refused, reset, timed out): Envoy may be gone.
    Failed,
    /// The admin answered, but the open connections cannot be told (an error status,
    /// HTML, non-UTF-8, a negative count): Envoy is there, the count is unknown. Never
    /// "Envoy gone", never "drained"; the drain waits for a count or its timeout.
    Unknown,
}

/// Why a drain finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneReason {
    /// Open connections at or below the minimum, and the minimum drain duration passed.
    Drained {
        /// The count of the last poll.
        open_connections: u64,
    },
    /// The drain timeout expired first.
    TimedOut,
    /// Envoy's admin failed this many consecutive polls: Envoy is gone.
    EnvoyGone {
        /// Consecutive failed polls.
        consecutive_failures: u32,
    },
}

impl DoneReason {
    /// Short stable name, used in logs and the `x-marin3r-drain-result` response header.
    pub fn as_str(&self) -> &'static str {
        match self {
            DoneReason::Drained { .. } => "drained",
            DoneReason::TimedOut => "timeout",
            DoneReason::EnvoyGone { .. } => "envoy-gone",
        }
    }
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Poll again at `next_poll` (never later than the drain deadline).
    KeepPolling {
        /// When to poll next.
        next_poll: Instant,
    },
    /// Stop polling and create the ready file.
    Done(DoneReason),
}

/// Memory of the drain loop between polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainState {
    started: Instant,
    consecutive_failures: u32,
}

impl DrainState {
    /// A drain that started at `started` (when `/drain` was first requested; both the
    /// minimum drain duration and the drain timeout count from here).
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            consecutive_failures: 0,
        }
    }

    /// When the drain started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Consecutive failed polls so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// The instant at which the drain times out.
    pub fn deadline(&self, settings: &DrainSettings) -> Instant {
        self.started + settings.drain_timeout
    }
}

/// Feeds one poll result, taken at `now`, into the drain and decides what to do next.
///
/// Rules, in order:
/// 1. A successful poll resets the failure count; a failed one increments it, and
///    reaching `envoy_gone_after` finishes with [`DoneReason::EnvoyGone`]; an answer with
///    an unknown count resets the failures (Envoy answered) and decides nothing.
/// 2. `open ≤ min_open_connections` and `now - started ≥ min_drain_duration` finishes
///    with [`DoneReason::Drained`].
/// 3. `now ≥ started + drain_timeout` finishes with [`DoneReason::TimedOut`].
/// 4. Otherwise poll again after `check_drain_interval`, earlier if the deadline or (when
///    only the minimum duration is missing) the end of the minimum duration comes first.
pub fn decide(
    state: &mut DrainState,
    poll: PollResult,
    now: Instant,
    settings: &DrainSettings,
) -> Decision {
    let elapsed = now.saturating_duration_since(state.started);
    let min_duration_end = state.started + settings.min_drain_duration;
    let mut waiting_for_min_duration = false;
    match poll {
        PollResult::Failed => {
            state.consecutive_failures = state.consecutive_failures.saturating_add(1);
            if settings.envoy_gone_after > 0
                && state.consecutive_failures >= settings.envoy_gone_after
            {
                return Decision::Done(DoneReason::EnvoyGone {
                    consecutive_failures: state.consecutive_failures,
                });
            }
        }
        PollResult::Unknown => state.consecutive_failures = 0,
        PollResult::Open(open) => {
            state.consecutive_failures = 0;
            if open <= settings.min_open_connections {
                if elapsed >= settings.min_drain_duration {
                    return Decision::Done(DoneReason::Drained {
                        open_connections: open,
                    });
                }
                waiting_for_min_duration = true;
            }
        }
    }
    let deadline = state.deadline(settings);
    if now >= deadline {
        return Decision::Done(DoneReason::TimedOut);
    }
    let mut next_poll = (now + settings.check_drain_interval).min(deadline);
    if waiting_for_min_duration {
        next_poll = next_poll.min(min_duration_end);
    }
    Decision::KeepPolling { next_poll }
}

/// Delay before retry number `retry` (0-based) of a failed admin call: exponential from
/// `initial`, doubling, capped at `max`.
pub fn backoff_delay(initial: Duration, max: Duration, retry: u32) -> Duration {
    let factor = 2u32.checked_pow(retry).unwrap_or(u32::MAX);
    initial.checked_mul(factor).unwrap_or(max).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> DrainSettings {
        DrainSettings {
            min_open_connections: 0,
            min_drain_duration: Duration::ZERO,
            drain_timeout: Duration::from_secs(300),
            check_drain_interval: Duration::from_secs(5),
            envoy_gone_after: 3,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn no_connections_finishes_immediately() {
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        assert_eq!(
            decide(&mut st, PollResult::Open(0), t0, &settings()),
            Decision::Done(DoneReason::Drained {
                open_connections: 0
            })
        );
    }

    #[test]
    fn open_connections_keep_polling_every_interval() {
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        let now = t0 + secs(1);
        assert_eq!(
            decide(&mut st, PollResult::Open(1), now, &settings()),
            Decision::KeepPolling {
                next_poll: now + secs(5)
            }
        );
    }

    #[test]
    fn min_open_connections_is_inclusive() {
        let s = DrainSettings {
            min_open_connections: 2,
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        assert!(matches!(
            decide(&mut st, PollResult::Open(3), t0, &s),
            Decision::KeepPolling { .. }
        ));
        assert_eq!(
            decide(&mut st, PollResult::Open(2), t0 + secs(5), &s),
            Decision::Done(DoneReason::Drained {
                open_connections: 2
            })
        );
    }

    #[test]
    fn min_drain_duration_holds_an_empty_envoy() {
        let s = DrainSettings {
            min_drain_duration: secs(12),
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        // Next poll normally in 5 s.
        assert_eq!(
            decide(&mut st, PollResult::Open(0), t0 + secs(1), &s),
            Decision::KeepPolling {
                next_poll: t0 + secs(6)
            }
        );
        // Shortened to the end of the minimum duration.
        assert_eq!(
            decide(&mut st, PollResult::Open(0), t0 + secs(10), &s),
            Decision::KeepPolling {
                next_poll: t0 + secs(12)
            }
        );
        assert_eq!(
            decide(&mut st, PollResult::Open(0), t0 + secs(12), &s),
            Decision::Done(DoneReason::Drained {
                open_connections: 0
            })
        );
    }

    #[test]
    fn min_drain_duration_does_not_shorten_polls_while_connections_are_open() {
        let s = DrainSettings {
            min_drain_duration: secs(12),
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        assert_eq!(
            decide(&mut st, PollResult::Open(4), t0 + secs(10), &s),
            Decision::KeepPolling {
                next_poll: t0 + secs(15)
            }
        );
    }

    #[test]
    fn drain_timeout_finishes_with_connections_open() {
        let s = DrainSettings {
            drain_timeout: secs(30),
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        // The poll before the deadline is clamped to the deadline.
        assert_eq!(
            decide(&mut st, PollResult::Open(1), t0 + secs(28), &s),
            Decision::KeepPolling {
                next_poll: t0 + secs(30)
            }
        );
        assert_eq!(
            decide(&mut st, PollResult::Open(1), t0 + secs(30), &s),
            Decision::Done(DoneReason::TimedOut)
        );
    }

    #[test]
    fn drain_timeout_wins_over_min_drain_duration() {
        let s = DrainSettings {
            drain_timeout: secs(10),
            min_drain_duration: secs(60),
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        assert_eq!(
            decide(&mut st, PollResult::Open(0), t0 + secs(10), &s),
            Decision::Done(DoneReason::TimedOut)
        );
    }

    #[test]
    fn drained_at_the_deadline_reports_drained() {
        let s = DrainSettings {
            drain_timeout: secs(10),
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        assert_eq!(
            decide(&mut st, PollResult::Open(0), t0 + secs(11), &s),
            Decision::Done(DoneReason::Drained {
                open_connections: 0
            })
        );
    }

    #[test]
    fn envoy_gone_after_consecutive_failures() {
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        let s = settings();
        assert!(matches!(
            decide(&mut st, PollResult::Failed, t0, &s),
            Decision::KeepPolling { .. }
        ));
        assert!(matches!(
            decide(&mut st, PollResult::Failed, t0 + secs(5), &s),
            Decision::KeepPolling { .. }
        ));
        assert_eq!(st.consecutive_failures(), 2);
        assert_eq!(
            decide(&mut st, PollResult::Failed, t0 + secs(10), &s),
            Decision::Done(DoneReason::EnvoyGone {
                consecutive_failures: 3
            })
        );
    }

    #[test]
    fn a_successful_poll_resets_the_failure_count() {
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        let s = settings();
        decide(&mut st, PollResult::Failed, t0, &s);
        decide(&mut st, PollResult::Failed, t0, &s);
        assert!(matches!(
            decide(&mut st, PollResult::Open(1), t0, &s),
            Decision::KeepPolling { .. }
        ));
        assert_eq!(st.consecutive_failures(), 0);
        decide(&mut st, PollResult::Failed, t0, &s);
        assert!(matches!(
            decide(&mut st, PollResult::Failed, t0, &s),
            Decision::KeepPolling { .. }
        ));
    }

    #[test]
    fn an_unknown_count_is_neither_gone_nor_drained() {
        let settings = settings();
        let t0 = Instant::now();
        let mut state = DrainState::new(t0);
        // Two failed polls, then answers that cannot be read: never "gone".
        decide(&mut state, PollResult::Failed, t0, &settings);
        decide(&mut state, PollResult::Failed, t0, &settings);
        for i in 1..20 {
            let now = t0 + settings.check_drain_interval * i;
            if now >= state.deadline(&settings) {
                break;
            }
            assert!(matches!(
                decide(&mut state, PollResult::Unknown, now, &settings),
                Decision::KeepPolling { .. }
            ));
            assert_eq!(state.consecutive_failures(), 0);
        }
        let deadline = state.deadline(&settings);
        assert_eq!(
            decide(&mut state, PollResult::Unknown, deadline, &settings),
            Decision::Done(DoneReason::TimedOut)
        );
    }

    #[test]
    fn envoy_gone_disabled_waits_for_the_timeout() {
        let s = DrainSettings {
            envoy_gone_after: 0,
            drain_timeout: secs(20),
            ..settings()
        };
        let t0 = Instant::now();
        let mut st = DrainState::new(t0);
        for i in 0..4 {
            assert!(matches!(
                decide(&mut st, PollResult::Failed, t0 + secs(5 * i), &s),
                Decision::KeepPolling { .. }
            ));
        }
        assert_eq!(
            decide(&mut st, PollResult::Failed, t0 + secs(20), &s),
            Decision::Done(DoneReason::TimedOut)
        );
    }

    #[test]
    fn a_clock_before_the_start_is_harmless() {
        let t0 = Instant::now() + secs(100);
        let mut st = DrainState::new(t0);
        let s = DrainSettings {
            min_drain_duration: secs(1),
            ..settings()
        };
        assert!(matches!(
            decide(&mut st, PollResult::Open(0), t0 - secs(50), &s),
            Decision::KeepPolling { .. }
        ));
    }

    #[test]
    fn reason_names() {
        assert_eq!(
            DoneReason::Drained {
                open_connections: 0
            }
            .as_str(),
            "drained"
        );
        assert_eq!(DoneReason::TimedOut.as_str(), "timeout");
        assert_eq!(
            DoneReason::EnvoyGone {
                consecutive_failures: 1
            }
            .as_str(),
            "envoy-gone"
        );
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let ms = Duration::from_millis;
        let delays: Vec<_> = (0..6)
            .map(|r| backoff_delay(ms(100), ms(1000), r))
            .collect();
        assert_eq!(
            delays,
            vec![ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        assert_eq!(backoff_delay(ms(100), ms(1000), 200), ms(1000));
        assert_eq!(backoff_delay(Duration::MAX, ms(1000), 3), ms(1000));
    }
}
