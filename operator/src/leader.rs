//! Leader election of `marin3r operator` (operator-design.md §7 \[R\]): the controllers run
//! only in the replica that holds the `coordination.k8s.io/v1` Lease [`LEASE_NAME`] in the
//! operator's namespace. The election itself is the discovery service's,
//! [`marin3r_kube::lease::elect`] (a holder renewing [`LEASE_GRACE_SECONDS`] before its
//! [`LEASE_DURATION_SECONDS`] lock expires, i.e. every 3 s; a waiting replica takes the
//! lock once it has seen no change of it for the duration on its own clock, never by
//! the holder's `renewTime`; after a failed request a pause of 1 s; the release at
//! shutdown, bounded by [`RELEASE_TIMEOUT`]); this module only starts and stops the
//! controllers with it.
//!
//! The controllers run while [`Leadership::is_current`] holds: this replica holds the
//! Lease and sent its last successful renewal less than the write window
//! ([`LeaseSettings::write_window`], 13 s) ago. So they stop when the Lease is lost to
//! another replica, and when no renewal has succeeded for the window because renewals
//! fail or hang — before another replica can take the lock over, 15 s after it last
//! saw the lock change. They start again once the Lease is held and renewed again.
//! Told to stop, they get [`STOP_TIMEOUT`] to finish their reconciles in flight, and never
//! longer than until the lock, as last renewed, expires; then they are dropped.
//!
//! On shutdown the controllers stop first, then the Lease is released, so that the next
//! replica takes over at once instead of after the lock expires; a Lease that could not
//! be released expires by itself [`LEASE_DURATION_SECONDS`] after its last renewal.
//!
//! Each replica writes the Lease under its own field manager ([`lease_field_manager`]),
//! which is what makes two replicas racing for a free lock conflict instead of both
//! believing they hold it.

use std::future::Future;
use std::time::Duration;

use kube::Client;
use marin3r_kube::lease::{self, Leadership, LeaseSettings, LeaseView};
use tokio::sync::oneshot;
use tokio::time::Instant;

pub use marin3r_kube::lease::{LeaseError, RELEASE_TIMEOUT};

use super::FIELD_MANAGER;

/// Name of the Lease (upstream's leader-election id, so that an upstream operator and
/// ours never both act during a migration).
pub const LEASE_NAME: &str = "2cfbe7d6.operator.marin3r.3scale.net";
/// How long a lock lasts without renewal.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// How long before expiry the holder renews it: renewals every
/// `LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS` = 3 s (operator-design.md §7 \[R\]: the
/// decision first asked for about 2 s; 3 s leaves 12 s of margin for clock skew and for
/// stopping the controllers after a failed renewal).
pub const LEASE_GRACE_SECONDS: u64 = 12;

/// The field manager of `identity`'s Lease writes: one per replica (who wrote the
/// Lease last is then visible in its managed fields). Two replicas racing for a free
/// lock conflict (409) on the resourceVersion every write of it is preconditioned on.
pub fn lease_field_manager(identity: &str) -> String {
    lease::field_manager(FIELD_MANAGER, identity)
}

/// The operator's Lease in `namespace`, held as `identity` (the pod name).
pub fn lease_settings(namespace: &str, identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: namespace.to_string(),
        name: LEASE_NAME.to_string(),
        identity: identity.to_string(),
        manager: FIELD_MANAGER.to_string(),
        duration: LEASE_DURATION_SECONDS,
        grace: LEASE_GRACE_SECONDS,
    }
}

/// How long the controllers may take to stop once told to (their reconciles in
/// flight); past it they are dropped, so that the Lease is still released in time.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long controllers told to stop at `now` may take: [`STOP_TIMEOUT`], and no longer
/// than until the lock expires, `duration` after this replica sent its last renewal of
/// it (if any).
pub fn stop_bound(view: &LeaseView, duration: Duration, now: Instant) -> Duration {
    let expires_in = view.renewed.map(|renewed| {
        let age = now.saturating_duration_since(renewed);
        duration.saturating_sub(age)
    });
    expires_in.map_or(STOP_TIMEOUT, |left| left.min(STOP_TIMEOUT))
}

/// How a leadership term ended.
enum Term {
    /// `shutdown` completed.
    Shutdown,
    /// The controllers ended by themselves.
    WorkEnded,
    /// The Lease lost, a renewal failed, or none seen for the write window.
    NotCurrent,
}

/// Runs `work(stop)` while this process (`identity`, e.g. the pod name) holds the Lease
/// in `namespace`, until `shutdown` completes. `work` must end soon after `stop`
/// completes; `on_change(leader)` is told every start and stop of `work` (for a metric).
///
/// Returns an error only when the Lease cannot be read or created at start (e.g. a
/// missing Role): later errors stop the controllers and are retried (logged at warn).
pub async fn run_while_leader<W, Fut>(
    client: Client,
    namespace: &str,
    identity: &str,
    work: W,
    on_change: impl Fn(bool),
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaseError>
where
    W: Fn(oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = ()>,
{
    let settings = lease_settings(namespace, identity);
    let leadership = Leadership::new(settings.write_window());
    let (stop_election, election_stopped) = oneshot::channel::<()>();
    let (election_ended, ended) = oneshot::channel::<()>();
    // Run in this future, not spawned: dropping it stops renewing, as a crash would.
    let election = async {
        let result = lease::elect(client, settings.clone(), leadership.clone(), async {
            let _ = election_stopped.await;
        })
        .await;
        drop(election_ended);
        result
    };
    let terms = async {
        run_terms(&leadership, &settings, work, on_change, shutdown, ended).await;
        // The controllers have stopped: step down so that another replica leads at once.
        let _ = stop_election.send(());
    };
    let (result, ()) = tokio::join!(election, terms);
    result
}

/// Runs `work` in terms while `leadership` is current, until `shutdown`, the work ending
/// by itself, or the election ending (it failed at start).
async fn run_terms<W, Fut>(
    leadership: &Leadership,
    settings: &LeaseSettings,
    work: W,
    on_change: impl Fn(bool),
    shutdown: impl Future<Output = ()>,
    mut election_ended: oneshot::Receiver<()>,
) where
    W: Fn(oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = ()>,
{
    let identity = settings.identity.as_str();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Follower: wait for the lock, and its renewal seen.
        tokio::select! {
            () = &mut shutdown => return,
            _ = &mut election_ended => return,
            () = leadership.until_current() => {}
        }
        tracing::info!(
            identity,
            lease = LEASE_NAME,
            "leading; starting the controllers"
        );
        on_change(true);
        let (stop, stopped) = oneshot::channel();
        let mut running = std::pin::pin!(work(stopped));
        let term = tokio::select! {
            () = &mut running => Term::WorkEnded,
            () = &mut shutdown => Term::Shutdown,
            () = leadership.until_not_current() => Term::NotCurrent,
        };
        on_change(false);
        if !matches!(term, Term::WorkEnded) {
            let _ = stop.send(());
            let bound = stop_bound(&leadership.view(), settings.duration(), Instant::now());
            if tokio::time::timeout(bound, &mut running).await.is_err() {
                tracing::warn!(
                    identity,
                    timeout = ?bound,
                    "the controllers did not stop in time; dropped"
                );
            }
        }
        match term {
            Term::Shutdown | Term::WorkEnded => return,
            Term::NotCurrent => tracing::warn!(
                identity,
                lease = LEASE_NAME,
                "lost the lease or cannot renew it; controllers stopped until it is held again"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_never_stops_between_renewals() {
        let settings = lease_settings("ns", "pod");
        let renew_every = Duration::from_secs(LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS);
        assert!(settings.write_window() > renew_every, "{settings:?}");
        assert!(
            settings.write_window() < settings.duration(),
            "{settings:?}"
        );
        assert_eq!(
            lease_field_manager("pod"),
            "marin3r-operator-pod",
            "one field manager per replica"
        );
    }

    #[test]
    fn the_controllers_stop_before_the_lock_expires() {
        let t0 = Instant::now();
        let duration = Duration::from_secs(LEASE_DURATION_SECONDS);
        let renewed = LeaseView {
            holder: true,
            renewed: Some(t0),
        };
        // A failed renewal, 3 s after the last one: the whole STOP_TIMEOUT.
        assert_eq!(
            stop_bound(&renewed, duration, t0 + Duration::from_secs(3)),
            STOP_TIMEOUT
        );
        // No renewal seen for the write window (13 s): 2 s left before the lock expires.
        assert_eq!(
            stop_bound(&renewed, duration, t0 + Duration::from_secs(13)),
            Duration::from_secs(2)
        );
        assert_eq!(
            stop_bound(&renewed, duration, t0 + Duration::from_secs(20)),
            Duration::ZERO
        );
        // Lost to another holder: no lock of ours to expire.
        assert_eq!(
            stop_bound(&LeaseView::default(), duration, t0),
            STOP_TIMEOUT
        );
    }
}
