//! The open connections of the ADS server: which are open (for the [`DrainPlan`] of a
//! shutdown), which have an ADS stream open — an Envoy — (whether the shutdown waits its
//! drain delay), and each one's close signal, which its ADS streams follow
//! ([`ConnectionHandle`], put into every request's extensions by [`crate::server`]).
//!
//! [`DrainPlan`]: crate::drain::DrainPlan

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::watch;

use crate::drain::CloseReason;

/// The connections of one server.
#[derive(Debug)]
pub(crate) struct Registry {
    /// Open connections by id, and how many ADS streams each has open.
    open: Mutex<BTreeMap<u64, usize>>,
    /// How many open connections have an ADS stream open ("ADS connections"; changed
    /// under `open`'s lock).
    ads: watch::Sender<usize>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            open: Mutex::default(),
            ads: watch::channel(0).0,
        }
    }
}

impl Registry {
    /// Registers the connection `id` (ids ascend in accept order) until the returned
    /// guard drops.
    pub(crate) fn register(self: &Arc<Self>, id: u64) -> Registered {
        self.lock().insert(id, 0);
        Registered {
            registry: self.clone(),
            handle: ConnectionHandle(Arc::new(Connection {
                id,
                registry: Arc::downgrade(self),
                close: watch::channel(None).0,
            })),
        }
    }

    /// The ids of the open connections, ascending.
    pub(crate) fn open_ids(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    /// `(open connections, ADS connections)`.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let open = self.lock();
        (open.len(), *self.ads.borrow())
    }

    /// Completes once no ADS stream is open.
    pub(crate) async fn no_ads_connection(&self) {
        let mut ads = self.ads.subscribe();
        // The sender lives in `self`: `wait_for` cannot fail while this runs.
        let _ = ads.wait_for(|n| *n == 0).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, usize>> {
        // The map stays consistent whatever panicked while holding it.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A registered connection; unregisters it when dropped.
#[derive(Debug)]
pub(crate) struct Registered {
    registry: Arc<Registry>,
    handle: ConnectionHandle,
}

impl Registered {
    pub(crate) fn handle(&self) -> &ConnectionHandle {
        &self.handle
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.registry.lock();
        if open
            .remove(&self.handle.0.id)
            .is_some_and(|streams| streams > 0)
        {
            self.registry.ads.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

#[derive(Debug)]
struct Connection {
    id: u64,
    /// Weak: the registry outlives its connections, and a stream task that outlives
    /// its connection must not keep the registry.
    registry: Weak<Registry>,
    /// `Some` once the server closes the connection.
    close: watch::Sender<Option<CloseReason>>,
}

/// One connection as its requests see it (a request extension).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionHandle(Arc<Connection>);

impl ConnectionHandle {
    /// The server closes the connection: its ADS streams end (the server sends the
    /// GOAWAY). Idempotent: the first reason stays.
    pub(crate) fn close(&self, reason: CloseReason) {
        self.0.close.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(reason);
            true
        });
    }

    /// Why the connection is closing, if it is.
    pub(crate) fn closing(&self) -> Option<CloseReason> {
        *self.0.close.borrow()
    }

    /// An ADS stream opens on the connection: the connection counts as an ADS connection
    /// until the returned stream's guard drops (unless it is already gone: a request
    /// handled while its connection ended), and the stream follows the returned close
    /// signal ([`closed`]).
    pub(crate) fn ads_stream(&self) -> AdsStream {
        self.add_stream(1);
        AdsStream {
            close: self.0.close.subscribe(),
            conn: self.clone(),
        }
    }

    /// Counts `delta` (±1) ADS streams on the connection, if it is still registered.
    fn add_stream(&self, delta: isize) {
        let Some(registry) = self.0.registry.upgrade() else {
            return;
        };
        let mut open = registry.lock();
        let Some(streams) = open.get_mut(&self.0.id) else {
            return;
        };
        let before = *streams;
        *streams = streams.saturating_add_signed(delta);
        match (before, *streams) {
            (0, 1..) => registry.ads.send_modify(|n| *n += 1),
            (1.., 0) => registry.ads.send_modify(|n| *n = n.saturating_sub(1)),
            _ => {}
        }
    }
}

/// An open ADS stream on a connection: counts while it lives; `close` is the
/// connection's close signal.
#[derive(Debug)]
pub(crate) struct AdsStream {
    pub(crate) close: watch::Receiver<Option<CloseReason>>,
    conn: ConnectionHandle,
}

impl Drop for AdsStream {
    fn drop(&mut self) {
        self.conn.add_stream(-1);
    }
}

/// Completes with the reason once the connection `close` follows is closing.
pub(crate) async fn closed(close: &mut watch::Receiver<Option<CloseReason>>) -> CloseReason {
    let reason = match close.wait_for(Option::is_some).await {
        Ok(reason) => *reason,
        // The sender lives as long as any handle of the connection, and the stream
        // holds one: not reached. A stream of a vanished connection ends by its inbound
        // side.
        Err(_) => None,
    };
    match reason {
        Some(reason) => reason,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn connections_count_as_ads_once_a_stream_opened_and_unregister_on_drop() {
        let registry = Arc::new(Registry::default());
        let a = registry.register(1);
        let b = registry.register(2);
        assert_eq!(registry.counts(), (2, 0));
        registry.no_ads_connection().await;
        let mut first = b.handle().ads_stream();
        let second = b.handle().ads_stream();
        assert_eq!(registry.counts(), (2, 1), "a connection counts once");
        assert_eq!(registry.open_ids(), [1, 2]);
        // Counts while one of its streams is open.
        drop(second);
        assert_eq!(registry.counts(), (2, 1));
        let ended = a.handle().ads_stream();
        assert_eq!(registry.counts(), (2, 2));
        drop(ended);
        assert_eq!(registry.counts(), (2, 1), "no ADS stream open any more");

        assert_eq!(b.handle().closing(), None);
        b.handle().close(CloseReason::MaxAge);
        b.handle().close(CloseReason::Shutdown);
        assert_eq!(
            closed(&mut first.close).await,
            CloseReason::MaxAge,
            "the first stays"
        );
        assert_eq!(b.handle().closing(), Some(CloseReason::MaxAge));
        // A stream that subscribes after the close sees it at once.
        let mut late = b.handle().ads_stream();
        assert_eq!(closed(&mut late.close).await, CloseReason::MaxAge);
        drop(late);

        let handle = b.handle().clone();
        let waiting = tokio::spawn({
            let registry = registry.clone();
            async move { registry.no_ads_connection().await }
        });
        drop(b);
        waiting.await.unwrap();
        assert_eq!(registry.counts(), (1, 0));
        // Streams that outlive their connection, or open after it ended, do not count.
        drop(first);
        let _stray = handle.ads_stream();
        assert_eq!(registry.counts(), (1, 0));
        drop(a);
        assert!(registry.open_ids().is_empty());
    }
}
