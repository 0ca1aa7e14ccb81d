//! Leader election on a `coordination.k8s.io/v1` Lease, kept with `kube-lease-manager`:
//! [`elect`] takes and renews the Lease while the process runs and releases it at
//! shutdown; [`Leadership`] tells, right before a write, whether this process still
//! holds it ([`Leadership::is_current`]).
//!
//! `kube-lease-manager` renews the Lease [`LeaseSettings::grace`] before it expires. Its
//! `changed()` reports acquisitions and losses, and fails when a renewal fails (the
//! process can then no longer tell whether it still holds the lock, and another one may
//! take it over once it expires): [`elect`] reports that as a loss, waits (1 s doubling to
//! 30 s), reads the Lease again and carries on. A renewal that *hangs* is not reported
//! by the library; [`Leadership::is_current`] therefore also requires the last renewal
//! this process saw on the Lease (through a watch of that one object) to be younger than
//! the Lease duration minus a safety margin, so writes stop before another process can
//! take over — even when the API server stops answering. [`Leadership::until_current`]
//! and [`Leadership::until_not_current`] wait for that condition to change, the window
//! passing included, for a process that starts and stops work with it (the operator's
//! controllers).
//!
//! Each process writes the Lease under its own field manager ([`field_manager`]): two
//! processes racing for a free lock then conflict (409) instead of both believing they
//! hold it.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;

/// Pause after a failed Lease request, doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long releasing the Lease at shutdown may take (the API server may not answer).
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Which Lease, held as whom, for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Who holds it (the pod name).
    pub identity: String,
    /// The field manager prefix of the process (see [`field_manager`]).
    pub manager: String,
    /// How long a lock lasts without renewal (seconds).
    pub duration: u64,
    /// How long before expiry the holder renews it (seconds).
    pub grace: u64,
}

impl LeaseSettings {
    /// The Lease duration.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.duration)
    }

    /// How long after the last renewal this process stops writing: the duration minus a
    /// margin for clock skew and request latency — 2 s, or half the grace when that is
    /// less, so that the next renewal (due `grace` before expiry) always comes inside
    /// the window and a holder that renews on time never stops writing.
    pub fn write_window(&self) -> Duration {
        let margin = Duration::from_secs(2).min(Duration::from_secs(self.grace) / 2);
        self.duration().saturating_sub(margin)
    }
}

/// The field manager of `identity`'s Lease writes: one per process, as
/// `kube-lease-manager` requires (see the module docs).
pub fn field_manager(manager: &str, identity: &str) -> String {
    format!("{manager}-{identity}")
}

/// Errors of leader election: the API server refused the Lease at start.
#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{name} failed: {message}")]
pub struct LeaseError {
    pub namespace: String,
    pub name: String,
    pub message: String,
}

/// What this process knows of the Lease: whether `kube-lease-manager` says it holds it,
/// and the last renewal it saw on the Lease object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// `kube-lease-manager` reported this process as the holder (and no failure since).
    pub holder: bool,
    /// `spec.renewTime` of the Lease when `spec.holderIdentity` was this process.
    pub renewed: Option<SystemTime>,
    /// How many times the Lease was seen go from held to free (its holder released it).
    pub releases: u64,
    /// The Lease was last seen held by someone.
    pub held: bool,
}

impl LeaseView {
    /// Whether a write at `now` is still covered by the lock: this process holds it and
    /// renewed it less than `window` ago (by its own clock, which wrote `renewTime`).
    pub fn is_current(&self, now: SystemTime, window: Duration) -> bool {
        self.covered_for(now, window).is_some()
    }

    /// How much longer than `now` writes stay covered without another renewal (`None`:
    /// not covered now). A renewal dated after `now` counts as made at `now`.
    pub fn covered_for(&self, now: SystemTime, window: Duration) -> Option<Duration> {
        let renewed = self.renewed.filter(|_| self.holder)?;
        let age = now.duration_since(renewed).unwrap_or_default();
        window.checked_sub(age).filter(|left| !left.is_zero())
    }
}

/// The leadership of this process, cheap to clone: checked right before every write.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// What is known of the Lease; every update wakes [`Leadership::until_current`] and
    /// [`Leadership::until_not_current`].
    view: Arc<watch::Sender<LeaseView>>,
    window: Duration,
    changes: Arc<watch::Sender<bool>>,
}

impl Leadership {
    /// Not leading yet; a write is covered for `window` after a renewal
    /// ([`LeaseSettings::write_window`]).
    pub fn new(window: Duration) -> Self {
        Self {
            view: Arc::new(watch::channel(LeaseView::default()).0),
            window,
            changes: Arc::new(watch::channel(false).0),
        }
    }

    /// A leadership that always holds (a single replica: no Lease).
    pub fn always() -> Self {
        let l = Self::new(Duration::MAX);
        l.update(|v| {
            v.holder = true;
            v.renewed = Some(SystemTime::UNIX_EPOCH);
        });
        l
    }

    /// Whether this process may write now.
    pub fn is_current(&self) -> bool {
        self.view().is_current(SystemTime::now(), self.window)
    }

    /// What is known of the Lease.
    pub fn view(&self) -> LeaseView {
        self.view.borrow().clone()
    }

    /// Follows `holder` (true when this process becomes the holder, false when it stops
    /// being one). [`Leadership::until_not_current`] also sees a renewal that is late.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// Resolves once [`Leadership::is_current`] holds (at once if it does).
    pub async fn until_current(&self) {
        self.until(true).await;
    }

    /// Resolves once [`Leadership::is_current`] no longer holds (at once if it does
    /// not): the Lease lost, a failed renewal, or no renewal seen for the write window.
    pub async fn until_not_current(&self) {
        self.until(false).await;
    }

    async fn until(&self, current: bool) {
        let mut views = self.view.subscribe();
        loop {
            let covered = views
                .borrow_and_update()
                .covered_for(SystemTime::now(), self.window);
            if covered.is_some() == current {
                return;
            }
            // Only news changes the answer, or, while covered, the window passing.
            let news = views.changed();
            match covered {
                Some(left) => tokio::select! {
                    _ = news => {}
                    () = tokio::time::sleep(left) => {}
                },
                // The sender lives in `self`: `changed` cannot fail.
                None => {
                    let _ = news.await;
                }
            }
        }
    }

    fn update(&self, f: impl FnOnce(&mut LeaseView)) {
        let mut holder = false;
        self.view.send_modify(|view| {
            f(view);
            holder = view.holder;
        });
        self.changes
            .send_if_modified(|h| std::mem::replace(h, holder) != holder);
    }

    fn set_holder(&self, holder: bool) {
        self.update(|v| v.holder = holder);
    }

    /// A Lease object was seen: records its renewal when this process holds it, and a
    /// release by whoever held it.
    pub fn observe(&self, lease: &Lease, identity: &str) {
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        let renewed = spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| SystemTime::from(t.0));
        self.update(|v| {
            v.renewed = if holder == Some(identity) {
                renewed
            } else {
                None
            };
            if v.held && holder.is_none() {
                v.releases += 1;
            }
            v.held = holder.is_some();
        });
    }

    /// Resolves once the Lease has been released more than `seen` times
    /// ([`LeaseView::releases`]).
    async fn until_released(&self, seen: u64) {
        let mut views = self.view.subscribe();
        while views.borrow_and_update().releases <= seen {
            // The sender lives in `self`: `changed` cannot fail.
            if views.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Runs leader election for `settings` until `shutdown` completes, keeping
/// `leadership` up to date; at shutdown releases the Lease if held (bounded by
/// [`RELEASE_TIMEOUT`]). Returns an error only when the Lease cannot be read or created
/// at start; later failures are logged and retried.
pub async fn elect(
    client: Client,
    settings: LeaseSettings,
    leadership: Leadership,
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaseError> {
    let mut shutdown = std::pin::pin!(shutdown);
    // Aborted also when this future is dropped (an aborted election task).
    let watch_task = AbortOnDrop(tokio::spawn(watch_lease(
        Api::namespaced(client.clone(), &settings.namespace),
        settings.clone(),
        leadership.clone(),
    )));
    let slot = ManagerSlot::default();
    let result = tokio::select! {
        result = run_elections(client, &settings, &slot, &leadership) => result,
        () = &mut shutdown => Ok(()),
    };
    drop(watch_task);
    let was_holder = leadership.view().holder;
    leadership.set_holder(false);
    result?;
    let manager = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(manager) = manager.filter(|_| was_holder) {
        match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
            Ok(Ok(())) => tracing::info!(lease = settings.name, "lease released"),
            Ok(Err(e)) => {
                tracing::warn!(lease = settings.name, error = %e, "cannot release the lease")
            }
            Err(_) => tracing::warn!(
                lease = settings.name,
                timeout = ?RELEASE_TIMEOUT,
                "the API server did not answer the lease release; it expires by itself"
            ),
        }
    }
    Ok(())
}

/// A task aborted when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The current manager of [`run_elections`], for the release at shutdown.
type ManagerSlot = Mutex<Option<Arc<LeaseManager>>>;

fn error(settings: &LeaseSettings, e: &dyn std::fmt::Display) -> LeaseError {
    LeaseError {
        namespace: settings.namespace.clone(),
        name: settings.name.clone(),
        message: e.to_string(),
    }
}

fn builder(client: &Client, settings: &LeaseSettings) -> LeaseManagerBuilder {
    LeaseManagerBuilder::new(client.clone(), &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(settings.duration)
        .with_grace(settings.grace)
        .with_field_manager(field_manager(&settings.manager, &settings.identity))
}

/// The election loop: runs until dropped, reporting every change of holdership to
/// `leadership`; the manager in use is kept in `slot`. Fails only when the Lease cannot
/// be read or created at start.
///
/// A process that does not hold the Lease is told by `kube-lease-manager` only when the
/// holder's lock expires (it sleeps until then); when the watch sees the holder release
/// it (a rolling update, a drained node), the wait is cut short and the lock taken at
/// once.
async fn run_elections(
    client: Client,
    settings: &LeaseSettings,
    slot: &ManagerSlot,
    leadership: &Leadership,
) -> Result<(), LeaseError> {
    let on_change = |holder: bool| leadership.set_holder(holder);
    let build = || builder(&client, settings).build();
    let keep = |manager: LeaseManager| {
        let manager = Arc::new(manager);
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(manager.clone());
        manager
    };
    let mut manager = keep(build().await.map_err(|e| error(settings, &e))?);
    let mut backoff = MIN_BACKOFF;
    loop {
        let changed = if leadership.view().holder {
            manager.changed().await
        } else {
            let released = leadership.view().releases;
            tokio::select! {
                changed = manager.changed() => changed,
                () = leadership.until_released(released) => {
                    // The manager trusts its cached lock until it expires: a fresh one
                    // reads the Lease again and takes it.
                    tracing::debug!(lease = settings.name, "the lease was released; taking it");
                    if let Ok(fresh) = build().await {
                        manager = keep(fresh);
                    }
                    continue;
                }
            }
        };
        match changed {
            Ok(holder) => {
                if holder {
                    backoff = MIN_BACKOFF;
                    tracing::info!(
                        identity = settings.identity,
                        lease = settings.name,
                        "became the leader"
                    );
                } else {
                    tracing::warn!(
                        identity = settings.identity,
                        lease = settings.name,
                        "lost the lease"
                    );
                }
                on_change(holder);
            }
            Err(e) => {
                on_change(false);
                tracing::warn!(
                    identity = settings.identity,
                    lease = settings.name,
                    error = %e,
                    "cannot read or renew the lease; not leading until it is confirmed"
                );
                // Best effort: if it is still ours, free it for another process.
                let _ = tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await;
                loop {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    match build().await {
                        Ok(fresh) => {
                            manager = keep(fresh);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(lease = settings.name, error = %e, "cannot read the lease; retrying")
                        }
                    }
                }
            }
        }
    }
}

/// Watches the one Lease object and records its renewals in `leadership`.
async fn watch_lease(api: Api<Lease>, settings: LeaseSettings, leadership: Leadership) {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", settings.name));
    let mut stream = std::pin::pin!(crate::watch::watch(api, config));
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                leadership.observe(&lease, &settings.identity);
            }
            Ok(watcher::Event::Delete(_)) => leadership.update(|v| v.renewed = None),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(lease = settings.name, error = %e, "lease watch failed; retrying")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        marin3r_testkit::unix_time(1_800_000_000 + secs)
    }

    #[test]
    fn a_write_is_covered_only_by_a_recent_renewal_of_a_held_lease() {
        let window = Duration::from_secs(13);
        let held = LeaseView {
            holder: true,
            renewed: Some(at(0)),
            ..LeaseView::default()
        };
        assert!(held.is_current(at(12), window));
        assert!(
            !held.is_current(at(13), window),
            "renewal too old: stop writing"
        );
        assert!(
            !LeaseView {
                holder: false,
                ..held.clone()
            }
            .is_current(at(1), window),
            "lost"
        );
        assert!(
            !LeaseView {
                renewed: None,
                ..held.clone()
            }
            .is_current(at(1), window),
            "no renewal seen"
        );
        // How much longer: until the window after the renewal has passed.
        assert_eq!(held.covered_for(at(0), window), Some(window));
        assert_eq!(
            held.covered_for(at(12), window),
            Some(Duration::from_secs(1))
        );
        assert_eq!(held.covered_for(at(13), window), None);
        assert_eq!(
            LeaseView {
                renewed: Some(at(5)),
                ..held
            }
            .covered_for(at(0), window),
            Some(window),
            "a renewal dated later (the clock stepped back) counts as made now"
        );
    }

    #[test]
    fn the_write_window_leaves_a_margin() {
        let s = |duration, grace| LeaseSettings {
            namespace: "ns".into(),
            name: "l".into(),
            identity: "me".into(),
            manager: "m".into(),
            duration,
            grace,
        };
        assert_eq!(s(15, 5).write_window(), Duration::from_secs(13));
        // Renewed every 3 s (4 - 1): writes stay covered until 3.5 s after a renewal.
        assert_eq!(s(4, 1).write_window(), Duration::from_millis(3500));
        for (duration, grace) in [(15, 5), (4, 1), (3, 1), (60, 20), (2, 1)] {
            let settings = s(duration, grace);
            assert!(
                settings.write_window() > Duration::from_secs(duration - grace),
                "the next renewal comes inside the window: {settings:?}"
            );
        }
    }

    #[test]
    fn leadership_follows_the_lease_and_reports_changes() {
        let l = Leadership::new(Duration::from_secs(13));
        let mut changes = l.subscribe();
        assert!(!l.is_current());
        l.set_holder(true);
        assert!(changes.has_changed().unwrap());
        assert!(*changes.borrow_and_update());
        assert!(!l.is_current(), "no renewal seen yet");
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "me", "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
        }))
        .unwrap();
        l.observe(&lease, "me");
        assert!(l.is_current());
        l.observe(&lease, "someone-else");
        assert!(!l.is_current());
        assert!(Leadership::always().is_current());
    }

    fn renewed_now(identity: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": identity, "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
        }))
        .unwrap()
    }

    /// Real time: the window is measured on the system clock, as `renewTime` is.
    #[tokio::test]
    async fn waits_end_when_the_lease_is_won_lost_or_not_renewed_in_time() {
        let bound = Duration::from_secs(5);
        let window = Duration::from_millis(300);
        let l = Leadership::new(window);
        tokio::time::timeout(bound, l.until_not_current())
            .await
            .expect("not current yet: at once");
        // Won: the holder, then its renewal seen.
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.until_current().await }
        });
        l.set_holder(true);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no renewal seen yet");
        l.observe(&renewed_now("me"), "me");
        tokio::time::timeout(bound, waiting).await.unwrap().unwrap();
        // Not renewed in time: ends once the window has passed, not before.
        let started = std::time::Instant::now();
        tokio::time::timeout(bound, l.until_not_current())
            .await
            .expect("the window passed without a renewal");
        assert!(started.elapsed() >= window / 2, "{:?}", started.elapsed());
        assert!(!l.is_current());
        // Renewed again, then lost: ends at once.
        l.observe(&renewed_now("me"), "me");
        tokio::time::timeout(bound, l.until_current())
            .await
            .unwrap();
        let l = Leadership {
            window: Duration::from_secs(3600),
            ..l
        };
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.until_not_current().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        l.set_holder(false);
        tokio::time::timeout(bound, waiting).await.unwrap().unwrap();
    }
}
