//! The validation slots: EnvoyConfig and EnvoyDeployment validations (CPU-heavy for
//! megabyte configs) run on tokio's blocking pool, at most [`VALIDATION_SLOTS`] at once,
//! so they never hold the async workers Pod injection runs on (injection never takes a
//! slot). A validation that finds every slot taken waits for one in a bounded queue, for
//! a bounded time, and only then is refused: the API server does not retry a webhook
//! call, so refusing a burst (a GitOps tool applying a folder) at once would deny
//! requests that a short wait serves.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many validations run at once by default.
pub const VALIDATION_SLOTS: usize = 2;
/// How many validations may wait for a slot by default; one more is refused at once.
pub const VALIDATION_QUEUE: usize = 32;
/// How long a validation waits for a slot by default before it is refused: well inside
/// the validating webhooks' `timeoutSeconds` (5 s, manifests/default/webhooks.yaml), so
/// the validation itself still has time and a refusal reaches the API server as ours,
/// not as its timeout.
pub const VALIDATION_WAIT: Duration = Duration::from_secs(2);

/// Why a validation got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Every slot is taken and the queue is full.
    #[error("too many validations in progress ({slots} running, {queue} waiting)")]
    QueueFull { slots: usize, queue: usize },
    /// No slot freed within the wait.
    #[error("no validation slot freed within {wait:?} ({slots} running)")]
    WaitedTooLong { slots: usize, wait: Duration },
}

/// Slots for validations, with a bounded queue and a bounded wait.
#[derive(Debug)]
pub struct ValidationSlots {
    running: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    slots: usize,
    queue: usize,
    wait: Duration,
}

impl Default for ValidationSlots {
    fn default() -> Self {
        Self::new(VALIDATION_SLOTS, VALIDATION_QUEUE, VALIDATION_WAIT)
    }
}

impl ValidationSlots {
    /// `slots` validations at once, `queue` waiting for at most `wait` each.
    pub fn new(slots: usize, queue: usize, wait: Duration) -> Self {
        Self {
            running: Arc::new(Semaphore::new(slots)),
            waiting: Arc::new(Semaphore::new(queue)),
            slots,
            queue,
            wait,
        }
    }

    /// A slot: a free one at once, else the first one freed within the wait (waiters are
    /// served in arrival order), unless the queue is full.
    pub async fn acquire(&self) -> Result<OwnedSemaphorePermit, Refused> {
        if let Ok(slot) = self.running.clone().try_acquire_owned() {
            return Ok(slot);
        }
        let Ok(_place) = self.waiting.clone().try_acquire_owned() else {
            return Err(Refused::QueueFull {
                slots: self.slots,
                queue: self.queue,
            });
        };
        let waited = Refused::WaitedTooLong {
            slots: self.slots,
            wait: self.wait,
        };
        match tokio::time::timeout(self.wait, self.running.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            // The semaphore is never closed; a closed one is no slot either.
            Ok(Err(_)) | Err(_) => Err(waited),
        }
    }

    /// A free slot taken without waiting (tests hold slots with it).
    pub fn try_hold(&self) -> Option<OwnedSemaphorePermit> {
        self.running.clone().try_acquire_owned().ok()
    }

    /// How many slots are free.
    pub fn free(&self) -> usize {
        self.running.available_permits()
    }

    /// How many validations wait for a slot.
    pub fn waiting(&self) -> usize {
        self.queue - self.waiting.available_permits()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    async fn until_waiting(slots: &ValidationSlots, n: usize) {
        for _ in 0..100_000 {
            if slots.waiting() == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{} wait for a slot, not {n}", slots.waiting());
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_get_the_freed_slots_in_order_within_the_wait() {
        let slots = Arc::new(ValidationSlots::new(1, 2, Duration::from_secs(2)));
        let held = slots.try_hold().unwrap();
        let first = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire().await }
        });
        until_waiting(&slots, 1).await;
        let second = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire().await }
        });
        until_waiting(&slots, 2).await;
        // The queue is full: refused at once, without waiting.
        let before = tokio::time::Instant::now();
        assert_eq!(
            slots.acquire().await.unwrap_err(),
            Refused::QueueFull { slots: 1, queue: 2 }
        );
        assert_eq!(before.elapsed(), Duration::ZERO);
        // 1.5 s later the slot frees: the first waiter gets it, then the second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(held);
        let slot = first.await.unwrap().unwrap();
        assert_eq!(slots.waiting(), 1);
        drop(slot);
        drop(second.await.unwrap().unwrap());
        assert_eq!((slots.free(), slots.waiting()), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_past_the_wait_is_refused_and_leaves_the_queue() {
        let slots = ValidationSlots::new(1, 32, Duration::from_secs(2));
        let _held = slots.try_hold().unwrap();
        let before = tokio::time::Instant::now();
        let refused = slots.acquire().await.unwrap_err();
        assert_eq!(
            refused,
            Refused::WaitedTooLong {
                slots: 1,
                wait: Duration::from_secs(2)
            }
        );
        assert_eq!(before.elapsed(), Duration::from_secs(2));
        assert_eq!(slots.waiting(), 0);
    }
}
