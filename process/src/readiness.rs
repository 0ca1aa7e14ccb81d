//! Readiness, computed once: ready = synced and not stopping.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// What readiness is computed from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct State {
    synced: bool,
    stopping: bool,
}

impl State {
    fn ready(self) -> bool {
        self.synced && !self.stopping
    }
}

/// A process's readiness: `/readyz`, and gRPC health where there is one, read it.
///
/// Ready = *synced* and not *stopping*, computed here and nowhere else. The process sets
/// *synced* when it can do its job (the webhook once its HTTPS listener is up, the
/// discovery service once its backend has synced and published, the operator once its
/// listeners are up); the runner ([`crate::Process::serve`]) sets *stopping* the moment
/// the shutdown signal arrives. Both flags only ever turn on, so a process never becomes
/// ready again once it stops. Cheap to clone; setting a flag twice is harmless.
#[derive(Debug, Clone)]
pub struct Readiness {
    state: Arc<watch::Sender<State>>,
    ready: Arc<watch::Sender<bool>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Not synced, not stopping: not ready.
    pub fn new() -> Self {
        Self {
            state: Arc::new(watch::channel(State::default()).0),
            ready: Arc::new(watch::channel(false).0),
        }
    }

    /// The process can do its job (idempotent).
    pub fn set_synced(&self) {
        self.update(|state| state.synced = true);
    }

    /// The process is shutting down (idempotent): not ready from now on.
    pub fn set_stopping(&self) {
        self.update(|state| state.stopping = true);
    }

    /// Changes the state and the ready flag under the state's lock, so that concurrent
    /// changes cannot leave the flag at a stale value.
    fn update(&self, change: impl FnOnce(&mut State)) {
        self.state.send_if_modified(|state| {
            let before = *state;
            change(state);
            let ready = state.ready();
            self.ready
                .send_if_modified(|r| std::mem::replace(r, ready) != ready);
            *state != before
        });
    }

    pub fn is_synced(&self) -> bool {
        self.state.borrow().synced
    }

    pub fn is_stopping(&self) -> bool {
        self.state.borrow().stopping
    }

    /// Synced and not stopping.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Completes once synced.
    pub async fn synced(&self) {
        let _ = self.state.subscribe().wait_for(|state| state.synced).await;
    }

    /// Follows [`is_ready`](Self::is_ready) (e.g. for gRPC health).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// What the main work of a process watches to know it must stop.
    pub fn stopping(&self) -> Stopping {
        Stopping(self.state.subscribe())
    }
}

/// Told to the main work of a process ([`crate::Process::serve`]): the shutdown began.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Stopping(watch::Receiver<State>);

impl Stopping {
    pub fn is_stopping(&self) -> bool {
        self.0.borrow().stopping
    }

    /// Completes once the shutdown began (at once if it already has). Owns what it
    /// needs, so it can be handed to a server as its shutdown future.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut state = self.0.clone();
        async move {
            // An error: every `Readiness` is gone, so is the process: stop too.
            let _ = state.wait_for(|state| state.stopping).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn ready_only_when_synced_and_not_stopping() {
        for (synced, stopping, ready) in [
            (false, false, false),
            (true, false, true),
            (true, true, false),
            (false, true, false),
        ] {
            let readiness = Readiness::new();
            if synced {
                readiness.set_synced();
            }
            if stopping {
                readiness.set_stopping();
            }
            assert_eq!(
                readiness.is_ready(),
                ready,
                "synced {synced}, stopping {stopping}"
            );
            assert_eq!(*readiness.subscribe().borrow(), ready);
            assert_eq!(readiness.stopping().is_stopping(), stopping);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_synced_then_stopping_and_never_comes_back() {
        let readiness = Readiness::new();
        let mut ready = readiness.subscribe();
        let stopping = readiness.stopping();
        let synced = tokio::spawn({
            let readiness = readiness.clone();
            async move { readiness.synced().await }
        });
        assert!(!*ready.borrow_and_update() && !synced.is_finished());
        readiness.set_synced();
        readiness.set_synced();
        ready.wait_for(|r| *r).await.unwrap();
        synced.await.unwrap();
        assert!(!stopping.is_stopping());

        readiness.set_stopping();
        ready.wait_for(|r| !*r).await.unwrap();
        stopping.wait().await;
        readiness.set_synced();
        assert!(!readiness.is_ready(), "stays not ready after the signal");
        assert!(!ready.has_changed().unwrap(), "no flicker");
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_completes_when_the_readiness_is_gone() {
        let stopping = Readiness::new().stopping();
        stopping.wait().await;
    }
}
