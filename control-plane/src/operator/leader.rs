//! Leader election of `marin3r operator` (OPERATOR.md §7 [R]): the controllers run only
//! in the replica that holds the `coordination.k8s.io/v1` Lease [`LEASE_NAME`] in the
//! operator's namespace, kept with `kube-lease-manager` (server-side apply on the
//! Lease; a holder renews [`LEASE_GRACE_SECONDS`] before its [`LEASE_DURATION_SECONDS`]
//! lock expires, an expired lock is taken over). Losing the lease stops the
//! controllers; they start again if it is won back. On shutdown the controllers stop
//! first, then the lease is released, so the next replica takes over at once instead of
//! after the lock expires.

use std::future::Future;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;

use super::FIELD_MANAGER;

/// Name of the Lease (upstream's leader-election id, so that an upstream operator and
/// ours never both act during a migration).
pub const LEASE_NAME: &str = "2cfbe7d6.operator.marin3r.3scale.net";
/// How long a lock lasts without renewal.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// How long before expiry the holder renews it.
pub const LEASE_GRACE_SECONDS: u64 = 5;

/// Errors of leader election (the API server refusing the Lease).
#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{LEASE_NAME} failed: {message}")]
pub struct LeaderError {
    pub namespace: String,
    pub message: String,
}

/// Runs `work(stop)` while this process (`identity`, e.g. the pod name) holds the Lease
/// in `namespace`, until `shutdown` completes. `work` must end soon after `stop`
/// completes; `on_change(leader)` is told every change (for a metric and the log).
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
    let error = |e: kube_lease_manager::LeaseManagerError| LeaderError {
        namespace: namespace.to_string(),
        message: e.to_string(),
    };
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .with_field_manager(FIELD_MANAGER)
        .build()
        .await
        .map_err(error)?;
    let (mut leader, task) = manager.watch().await;
    let mut shutdown = std::pin::pin!(shutdown);
    'outer: loop {
        tokio::select! {
            () = &mut shutdown => break 'outer,
            changed = leader.wait_for(|l| *l) => if changed.is_err() { break 'outer },
        }
        tracing::info!(
            identity,
            lease = LEASE_NAME,
            "became the leader; starting the controllers"
        );
        on_change(true);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let mut running = std::pin::pin!(work(stopped));
        let end = tokio::select! {
            () = &mut running => None,
            lost = leader.wait_for(|l| !*l) => Some(lost.is_err()),
            () = &mut shutdown => Some(true),
        };
        on_change(false);
        if let Some(quit) = end {
            let _ = stop.send(());
            running.await;
            if quit {
                break 'outer;
            }
            tracing::warn!(
                identity,
                lease = LEASE_NAME,
                "lost the lease; controllers stopped until it is won back"
            );
        } else {
            // The controllers ended by themselves: step down so another replica leads.
            break 'outer;
        }
    }
    // Closing the channel makes the lease task release the lock and end.
    drop(leader);
    match task.await {
        Ok(Ok(_)) => {
            tracing::info!(identity, lease = LEASE_NAME, "lease released");
            Ok(())
        }
        Ok(Err(e)) => Err(error(e)),
        Err(e) => Err(LeaderError {
            namespace: namespace.to_string(),
            message: e.to_string(),
        }),
    }
}
