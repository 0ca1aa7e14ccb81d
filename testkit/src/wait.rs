//! Polling a condition until it holds or a deadline passes.
//!
//! The async forms sleep on tokio's clock, so under `#[tokio::test(start_paused = true)]`
//! they cost no wall-clock time.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// Time between two polls.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `condition` every [`POLL`] until it returns `Some`, and returns the value.
///
/// # Panics
/// With `what` when `within` passes first.
#[track_caller]
pub fn wait_until_some<T>(
    what: impl Display,
    within: Duration,
    mut condition: impl FnMut() -> Option<T>,
) -> impl Future<Output = T> {
    let caller = std::panic::Location::caller();
    async move {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(value) = condition() {
                return value;
            }
            if tokio::time::Instant::now() >= deadline {
                timed_out(&what, within, caller);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Polls `condition` every [`POLL`] until it is true.
///
/// # Panics
/// With `what` when `within` passes first.
#[track_caller]
pub fn wait_until(
    what: impl Display,
    within: Duration,
    mut condition: impl FnMut() -> bool,
) -> impl Future<Output = ()> {
    wait_until_some(what, within, move || condition().then_some(()))
}

/// Like [`wait_until`] with an async condition (e.g. one that makes a request).
///
/// # Panics
/// With `what` when `within` passes first.
#[track_caller]
pub fn wait_until_async<F, Fut>(
    what: impl Display,
    within: Duration,
    mut condition: F,
) -> impl Future<Output = ()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let caller = std::panic::Location::caller();
    async move {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if condition().await {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                timed_out(&what, within, caller);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Polls the async `probe` every [`POLL`] until it returns `Ok`, and returns the value.
///
/// # Panics
/// With `what` and the probe's last error when `within` passes first.
#[track_caller]
pub fn wait_ok<T, E, F, Fut>(
    what: impl Display,
    within: Duration,
    probe: F,
) -> impl Future<Output = T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let caller = std::panic::Location::caller();
    async move {
        match poll_ok(&what, within, POLL, probe).await {
            Ok(value) => value,
            Err(e) => failed(&e, caller),
        }
    }
}

/// The non-panicking form of [`wait_ok`], for harness code that reports failures as
/// values (a benchmark, a process harness): polls the async `probe` every `every` until
/// it returns `Ok`; after `within`, an error naming `what` and the probe's last error.
/// `every` is [`POLL`] unless the caller measures something finer (a benchmark's
/// latency samples) or polls an in-memory value thousands of times.
pub async fn poll_ok<T, E, F, Fut>(
    what: impl Display,
    within: Duration,
    every: Duration,
    mut probe: F,
) -> Result<T, String>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = match probe().await {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{what}: not within {within:?}; last: {last}"));
        }
        tokio::time::sleep(every).await;
    }
}

/// The blocking form for synchronous tests and harness code: polls `condition` every
/// [`POLL`] (sleeping the thread) until it returns `Some`; `None` after `within`, so the
/// caller can report or recover (e.g. kill a process that did not exit).
pub fn wait_for<T>(within: Duration, mut condition: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = condition() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

#[allow(clippy::panic)]
fn failed(message: &str, caller: &std::panic::Location<'_>) -> ! {
    panic!("{message} (waited at {caller})")
}

#[allow(clippy::panic)]
fn timed_out(what: &dyn Display, within: Duration, caller: &std::panic::Location<'_>) -> ! {
    panic!("timed out after {within:?} waiting for {what} (waited at {caller})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_once_the_condition_holds() {
        let start = tokio::time::Instant::now();
        let mut polls = 0;
        let value = wait_until_some("the third poll", Duration::from_secs(1), || {
            polls += 1;
            (polls == 3).then_some(polls)
        })
        .await;
        assert_eq!(value, 3);
        assert_eq!(start.elapsed(), POLL * 2);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 1s waiting for nothing")]
    async fn panics_with_the_description() {
        wait_until("nothing", Duration::from_secs(1), || false).await;
    }

    #[tokio::test(start_paused = true)]
    async fn async_conditions() {
        let mut n = 0;
        wait_until_async("n = 2", Duration::from_secs(1), || {
            n += 1;
            let done = n == 2;
            async move { done }
        })
        .await;
        assert_eq!(n, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn fallible_probes_return_their_value_or_report_their_last_error() {
        let mut n = 0;
        let value = wait_ok("n = 3", Duration::from_secs(1), || {
            n += 1;
            let result = if n == 3 {
                Ok(n)
            } else {
                Err(format!("n is {n}"))
            };
            async move { result }
        })
        .await;
        assert_eq!(value, 3);
        let start = tokio::time::Instant::now();
        let err = poll_ok("never", Duration::from_millis(100), POLL, || async {
            Err::<(), _>("still no")
        })
        .await
        .unwrap_err();
        assert_eq!(err, "never: not within 100ms; last: still no");
        assert_eq!(start.elapsed(), POLL * 5);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the answer: not within 1s; last: wrong")]
    async fn wait_ok_panics_with_the_last_error() {
        wait_ok("the answer", Duration::from_secs(1), || async {
            Err::<(), _>("wrong")
        })
        .await;
    }

    #[test]
    fn blocking_form_gives_up_with_none() {
        assert_eq!(wait_for(Duration::ZERO, || None::<()>), None);
        assert_eq!(wait_for(Duration::ZERO, || Some(7)), Some(7));
    }
}
