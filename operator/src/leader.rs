//! Leader election of `marin3r operator` (operator-design.md §7 [R]): the controllers run
//! only in the replica that holds the `coordination.k8s.io/v1` Lease [`LEASE_NAME`] in the
//! operator's namespace, kept with `kube-lease-manager` (server-side apply on the Lease; a
//! holder renews [`LEASE_GRACE_SECONDS`] before its [`LEASE_DURATION_SECONDS`] lock
//! expires, i.e. every 3 s; an expired lock is taken over). Losing the lease stops the
//! controllers; they start again if it is won back. On shutdown the controllers stop first,
//! then the lease is released, so the next replica takes over at once instead of after the
//! lock expires.
//!
//! A renewal that fails (the API server answers an error) also stops the controllers:
//! this replica can no longer tell whether it still holds the lock, and another replica
//! may take it over once it expires, [`LEASE_GRACE_SECONDS`] later. The library's
//! `LeaseManager::watch` only logs such errors and keeps reporting "leader" while it
//! retries with a backoff of up to 30 s (measured: with it, controllers still ran 14 s
//! after renewals started failing, past the lock's expiry), so this module drives
//! `LeaseManager::changed` itself. After a failure it waits (1 s, doubling to 30 s),
//! reads the Lease again and starts a new term if the lock is still, or again, ours.
//!
//! Each replica writes the Lease under its own field manager
//! ([`lease_field_manager`]), which is what makes two replicas racing for a free lock
//! conflict instead of both believing they hold it.
//!
//! Shutdown is bounded even when the API server stops answering: building the manager
//! (which reads the Lease) and waiting for a change are abandoned at once, the
//! controllers get [`STOP_TIMEOUT`] to finish their reconciles in flight, and the
//! release [`RELEASE_TIMEOUT`]; a Lease that could not be released expires by itself
//! [`LEASE_DURATION_SECONDS`] after its last renewal.
//!
//! Not covered: a renewal request that hangs (rather than fails) is not interrupted;
//! the 12 s grace is the margin for it and for clock skew between nodes.

use std::future::Future;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};

use super::FIELD_MANAGER;

/// Name of the Lease (upstream's leader-election id, so that an upstream operator and
/// ours never both act during a migration).
pub const LEASE_NAME: &str = "2cfbe7d6.operator.marin3r.3scale.net";
/// How long a lock lasts without renewal.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// How long before expiry the holder renews it: renewals every
/// `LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS` = 3 s (operator-design.md §7 [R]: the
/// decision first asked for about 2 s; 3 s leaves 12 s of margin for clock skew and for
/// stopping the controllers after a failed renewal).
pub const LEASE_GRACE_SECONDS: u64 = 12;

/// The field manager of `identity`'s Lease writes: one per replica, as
/// `kube-lease-manager` requires. It takes a free lock with a server-side apply without
/// `force`, so that when two replicas race for it, the second apply conflicts (409) on
/// `spec.holderIdentity` owned by the first one's manager, instead of silently
/// overwriting a lock that replica believes it holds (measured with one shared field
/// manager: both ran the controllers).
pub fn lease_field_manager(identity: &str) -> String {
    format!("{FIELD_MANAGER}-{identity}")
}

/// How long the controllers may take to stop once told to (their reconciles in
/// flight); past it they are dropped, so that the Lease is still released in time.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long releasing the Lease may take (the API server may not answer).
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Pause after a failed Lease request, doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Errors of leader election (the API server refusing the Lease).
#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{LEASE_NAME} failed: {message}")]
pub struct LeaderError {
    pub namespace: String,
    pub message: String,
}

/// How a leadership term ended.
enum Term {
    /// `shutdown` completed.
    Shutdown,
    /// The controllers ended by themselves.
    WorkEnded,
    /// Another replica holds the lock.
    Lost,
    /// A renewal failed: whether the lock is still ours is unknown.
    Failed(kube_lease_manager::LeaseManagerError),
}

/// Runs `work(stop)` while this process (`identity`, e.g. the pod name) holds the Lease
/// in `namespace`, until `shutdown` completes. `work` must end soon after `stop`
/// completes; `on_change(leader)` is told every change (for a metric and the log).
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
) -> Result<(), LeaderError>
where
    W: Fn(tokio::sync::oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = ()>,
{
    let error = |e: &dyn std::fmt::Display| LeaderError {
        namespace: namespace.to_string(),
        message: e.to_string(),
    };
    let build = || {
        LeaseManagerBuilder::new(client.clone(), LEASE_NAME)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_DURATION_SECONDS)
            .with_grace(LEASE_GRACE_SECONDS)
            .with_field_manager(lease_field_manager(identity))
            .build()
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let mut manager: LeaseManager = tokio::select! {
        () = &mut shutdown => return Ok(()),
        built = build() => built.map_err(|e| error(&e))?,
    };
    let mut backoff = MIN_BACKOFF;
    loop {
        // Follower: wait for the lock.
        let acquired = tokio::select! {
            () = &mut shutdown => return Ok(()),
            changed = manager.changed() => changed,
        };
        match acquired {
            Ok(true) => backoff = MIN_BACKOFF,
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(identity, lease = LEASE_NAME, error = %e, "cannot read the lease; retrying");
                match retry(&mut shutdown, &mut backoff, &build).await {
                    Some(fresh) => manager = fresh,
                    None => return Ok(()),
                }
                continue;
            }
        }

        // Leader: run the controllers while renewing.
        tracing::info!(
            identity,
            lease = LEASE_NAME,
            "became the leader; starting the controllers"
        );
        on_change(true);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let mut running = std::pin::pin!(work(stopped));
        let term = loop {
            tokio::select! {
                () = &mut running => break Term::WorkEnded,
                () = &mut shutdown => break Term::Shutdown,
                changed = manager.changed() => match changed {
                    Ok(true) => continue,
                    Ok(false) => break Term::Lost,
                    Err(e) => break Term::Failed(e),
                },
            }
        };
        on_change(false);
        if !matches!(term, Term::WorkEnded) {
            let _ = stop.send(());
            if tokio::time::timeout(STOP_TIMEOUT, &mut running)
                .await
                .is_err()
            {
                tracing::warn!(
                    identity,
                    timeout = ?STOP_TIMEOUT,
                    "the controllers did not stop in time; dropped"
                );
            }
        }
        match term {
            Term::Shutdown | Term::WorkEnded => {
                // Step down so that another replica leads at once.
                release(&manager, identity).await.map_err(|e| error(&e))?;
                return Ok(());
            }
            Term::Lost => {
                tracing::warn!(
                    identity,
                    lease = LEASE_NAME,
                    "lost the lease; controllers stopped until it is won back"
                );
            }
            Term::Failed(e) => {
                tracing::warn!(
                    identity,
                    lease = LEASE_NAME,
                    error = %e,
                    "cannot renew the lease; controllers stopped until it is confirmed"
                );
                // Best effort: if it is still ours, free it for another replica.
                let _ = release(&manager, identity).await;
                match retry(&mut shutdown, &mut backoff, &build).await {
                    Some(fresh) => manager = fresh,
                    None => return Ok(()),
                }
            }
        }
    }
}

/// Releases the Lease, waiting at most [`RELEASE_TIMEOUT`] for the API server; an API
/// server that does not answer in time is logged, not an error (the lock expires by
/// itself).
async fn release(
    manager: &LeaseManager,
    identity: &str,
) -> Result<(), kube_lease_manager::LeaseManagerError> {
    match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
        Ok(released) => {
            released?;
            tracing::info!(identity, lease = LEASE_NAME, "lease released");
        }
        Err(_) => tracing::warn!(
            identity,
            lease = LEASE_NAME,
            timeout = ?RELEASE_TIMEOUT,
            "the API server did not answer the release; the lease expires by itself"
        ),
    }
    Ok(())
}

/// After a failed Lease request: waits `backoff` (then doubles it), and builds a fresh
/// manager (which reads the Lease again), until one is built; `None` on shutdown.
async fn retry<B, BF>(
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    backoff: &mut Duration,
    build: &B,
) -> Option<LeaseManager>
where
    B: Fn() -> BF,
    BF: Future<Output = kube_lease_manager::Result<LeaseManager>>,
{
    loop {
        tokio::select! {
            () = shutdown.as_mut() => return None,
            () = tokio::time::sleep(*backoff) => {}
        }
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            () = shutdown.as_mut() => return None,
            built = build() => match built {
                Ok(manager) => return Some(manager),
                Err(e) => tracing::warn!(lease = LEASE_NAME, error = %e, "cannot read the lease; retrying"),
            },
        }
    }
}
