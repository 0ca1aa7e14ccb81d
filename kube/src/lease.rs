//! Leader election on a `coordination.k8s.io/v1` Lease: [`elect`] takes and renews the
//! Lease while the process runs and releases it at shutdown; [`Leadership`] tells, right
//! before a write, whether this process still holds it ([`Leadership::is_current`]).
//!
//! **No decision compares another process's timestamp with our clock.** A process that
//! does not hold the Lease judges whether the holder is alive the way client-go does
//! (`observedTime`): by how long ago *it* saw the Lease record change
//! ([`Observer`]), on its own monotonic clock — never by the holder's `renewTime`, which
//! a clock running ahead or behind (or a forged date in 2099) would make look expired
//! or fresh for ever. It takes the Lease once it has seen no change for the Lease
//! duration ([`next`]). The holder renews it `duration - grace` after its last renewal;
//! its writes are covered for [`LeaseSettings::write_window`] after the instant it *sent*
//! that renewal (its own clock again), so they stop before any other process can take
//! the Lease over — also when the API server stops answering. Every write carries the
//! resourceVersion it read: two processes racing for the Lease conflict (409) instead of
//! both taking it.
//!
//! A process that does not hold the Lease reads it every [`POLL`], and at once when its
//! watch of the Lease sees a change (a released Lease is taken at once); the holder
//! writes it with merge patches. Each request is bounded by the client
//! ([`crate::client`]); a failed one is retried after [`RETRY`].
//! [`Leadership::until_current`] and [`Leadership::until_not_current`] wait for the
//! write gate to change, the window passing included, for a process that starts and
//! stops work with it (the operator's controllers).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

/// How often a process that does not hold the Lease reads it again.
pub const POLL: Duration = Duration::from_secs(2);
/// Pause after a failed Lease request.
pub const RETRY: Duration = Duration::from_secs(1);
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

    /// How long after its last renewal the holder renews again.
    pub fn renew_every(&self) -> Duration {
        Duration::from_secs(self.duration.saturating_sub(self.grace).max(1))
    }

    /// How long after sending its last renewal this process stops writing: the duration
    /// minus a margin for request latency — 2 s, or half the grace when that is less, so
    /// that the next renewal (due `grace` before expiry) always comes inside the window
    /// and a holder that renews on time never stops writing.
    pub fn write_window(&self) -> Duration {
        let margin = Duration::from_secs(2).min(Duration::from_secs(self.grace) / 2);
        self.duration().saturating_sub(margin)
    }
}

/// The field manager of `identity`'s Lease writes: one per process.
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

/// What this process knows of its leadership.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// This process holds the Lease (its last write of it succeeded, and no read since
    /// showed another holder).
    pub holder: bool,
    /// When this process sent its last successful renewal (or take) of the Lease.
    pub renewed: Option<Instant>,
}

impl LeaseView {
    /// Whether a write at `now` is still covered by the lock: this process holds it and
    /// sent its last renewal less than `window` ago.
    pub fn is_current(&self, now: Instant, window: Duration) -> bool {
        self.covered_for(now, window).is_some()
    }

    /// How much longer than `now` writes stay covered without another renewal (`None`:
    /// not covered now).
    pub fn covered_for(&self, now: Instant, window: Duration) -> Option<Duration> {
        let renewed = self.renewed.filter(|_| self.holder)?;
        let age = now.saturating_duration_since(renewed);
        window.checked_sub(age).filter(|left| !left.is_zero())
    }
}

/// The part of a Lease that says who holds it: a change of any of it is a sign of life
/// of its holder.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub holder: Option<String>,
    pub renew_time: Option<MicroTime>,
    pub acquire_time: Option<MicroTime>,
    pub transitions: Option<i32>,
    pub duration_seconds: Option<i32>,
}

impl Record {
    /// The record of `lease`.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renew_time: spec.renew_time,
            acquire_time: spec.acquire_time,
            transitions: spec.lease_transitions,
            duration_seconds: spec.lease_duration_seconds,
        }
    }
}

/// When this process last saw the Lease record change, on its own clock (client-go's
/// `observedTime`).
#[derive(Debug, Clone, Default)]
pub struct Observer {
    seen: Option<(Record, Instant)>,
}

impl Observer {
    /// `record` read at `now`: returns since when it has been unchanged (`now` if it
    /// changed, or is the first one seen).
    pub fn see(&mut self, record: &Record, now: Instant) -> Instant {
        match &self.seen {
            Some((seen, since)) if seen == record => *since,
            _ => {
                self.seen = Some((record.clone(), now));
                now
            }
        }
    }
}

/// What to do with the Lease as last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// It is ours: renew it when due.
    Renew,
    /// It is free, or its holder has shown no sign of life for the duration: take it.
    Take,
    /// Another process holds it: read it again within this (at most [`POLL`]).
    Wait(Duration),
}

/// What `identity` does with `record`, unchanged since `since`, at `now`, when a lock
/// lasts `duration` (ours: the duration written in the Lease is another process's
/// input, as is its `renewTime`, and neither is trusted).
pub fn next(
    record: &Record,
    since: Instant,
    now: Instant,
    identity: &str,
    duration: Duration,
) -> Next {
    match record.holder.as_deref() {
        None => Next::Take,
        Some(holder) if holder == identity => Next::Renew,
        Some(_) => {
            let expires = since + duration;
            if now >= expires {
                Next::Take
            } else {
                Next::Wait((expires - now).min(POLL))
            }
        }
    }
}

/// The leadership of this process, cheap to clone: checked right before every write.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// What is known; every update wakes [`Leadership::until_current`] and
    /// [`Leadership::until_not_current`].
    view: Arc<watch::Sender<LeaseView>>,
    window: Duration,
    changes: Arc<watch::Sender<bool>>,
}

impl Leadership {
    /// Not leading yet; a write is covered for `window` after a renewal was sent
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
        l.renewed(Instant::now());
        l
    }

    /// Whether this process may write now.
    pub fn is_current(&self) -> bool {
        self.view().is_current(Instant::now(), self.window)
    }

    /// What is known of the leadership.
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
    /// not): the Lease lost, or no renewal for the write window.
    pub async fn until_not_current(&self) {
        self.until(false).await;
    }

    async fn until(&self, current: bool) {
        let mut views = self.view.subscribe();
        loop {
            let covered = views
                .borrow_and_update()
                .covered_for(Instant::now(), self.window);
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

    /// A renewal (or take) sent at `sent` succeeded.
    fn renewed(&self, sent: Instant) {
        self.update(|v| {
            v.holder = true;
            v.renewed = Some(sent);
        });
    }

    /// This process no longer holds the Lease (or can no longer tell).
    fn lost(&self) {
        self.update(|v| v.holder = false);
    }
}

/// Runs leader election for `settings` until `shutdown` completes, keeping
/// `leadership` up to date; at shutdown releases the Lease if held (bounded by
/// [`RELEASE_TIMEOUT`]). Returns an error only when the API server refuses the Lease
/// (401, 403) before it was ever read; other failures are logged and retried.
pub async fn elect(
    client: Client,
    settings: LeaseSettings,
    leadership: Leadership,
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaseError> {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let news = Arc::new(tokio::sync::Notify::new());
    // Aborted also when this future is dropped (an aborted election task).
    let watch_task = AbortOnDrop(tokio::spawn(watch_lease(
        api.clone(),
        settings.name.clone(),
        news.clone(),
    )));
    let last = Mutex::new(None);
    let result = tokio::select! {
        result = run_elections(&api, &settings, &leadership, &last, &news) => result,
        () = shutdown => Ok(()),
    };
    drop(watch_task);
    let was_holder = leadership.view().holder;
    leadership.lost();
    result?;
    let last = last.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(lease) = last.filter(|_| was_holder) {
        match tokio::time::timeout(RELEASE_TIMEOUT, release(&api, &settings, lease)).await {
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

fn error(settings: &LeaseSettings, e: &dyn std::fmt::Display) -> LeaseError {
    LeaseError {
        namespace: settings.namespace.clone(),
        name: settings.name.clone(),
        message: e.to_string(),
    }
}

fn params(settings: &LeaseSettings) -> PostParams {
    PostParams {
        field_manager: Some(field_manager(&settings.manager, &settings.identity)),
        ..PostParams::default()
    }
}

fn patch_params(settings: &LeaseSettings) -> PatchParams {
    PatchParams {
        field_manager: Some(field_manager(&settings.manager, &settings.identity)),
        ..PatchParams::default()
    }
}

/// The merge patch that makes `lease` held by `settings.identity`, renewed now (and
/// acquired now, one transition more, if it was not `identity`'s), preconditioned on
/// the resourceVersion read: a write racing another one conflicts (409). `renewTime` is
/// informative only (for people and other tools): no decision here reads it.
fn hold(lease: &Lease, settings: &LeaseSettings) -> Patch<serde_json::Value> {
    let spec = lease.spec.clone().unwrap_or_default();
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let mut patch = serde_json::json!({
        "metadata": precondition(lease),
        "spec": {
            "holderIdentity": settings.identity,
            "renewTime": now,
            "leaseDurationSeconds": i32::try_from(settings.duration).unwrap_or(i32::MAX),
        },
    });
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        patch["spec"]["acquireTime"] = serde_json::json!(now);
        patch["spec"]["leaseTransitions"] =
            serde_json::json!(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    Patch::Merge(patch)
}

/// The metadata of a patch that applies only to `lease` as read (its resourceVersion).
fn precondition(lease: &Lease) -> serde_json::Value {
    match &lease.metadata.resource_version {
        Some(rv) => serde_json::json!({"resourceVersion": rv}),
        None => serde_json::json!({}),
    }
}

/// A new Lease held by `settings.identity`.
fn created(settings: &LeaseSettings) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(settings.name.clone()),
            namespace: Some(settings.namespace.clone()),
            ..kube::api::ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(settings.identity.clone()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_duration_seconds: Some(i32::try_from(settings.duration).unwrap_or(i32::MAX)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// Whether `e` is the API server refusing this process the Lease.
fn is_refusal(e: &kube::Error) -> bool {
    crate::is_status(e, 401) || crate::is_status(e, 403)
}

/// The election loop: runs until dropped, reporting every change to `leadership`; the
/// last Lease object read or written is kept in `last` (for the release at shutdown).
/// Fails only when the API server refuses the Lease before it was ever read.
async fn run_elections(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    leadership: &Leadership,
    last: &Mutex<Option<Lease>>,
    news: &tokio::sync::Notify,
) -> Result<(), LeaseError> {
    let keep = |lease: &Lease| {
        *last.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease.clone());
    };
    let mut observer = Observer::default();
    // The Lease as this process last wrote it (no need to read it again to renew it).
    let mut written: Option<Lease> = None;
    let mut read_once = false;
    loop {
        // Writes stop by themselves once the window passes (`Leadership::is_current`);
        // the holder flag follows, so that a renewal after that counts as a new term.
        if leadership.view().holder && !leadership.is_current() {
            tracing::warn!(
                identity = settings.identity,
                lease = settings.name,
                "cannot renew the lease; not leading until it is renewed"
            );
            leadership.lost();
        }
        let lease = match written.take() {
            Some(lease) => lease,
            None => match api.get_opt(&settings.name).await {
                Ok(Some(lease)) => lease,
                Ok(None) => {
                    let sent = Instant::now();
                    match api.create(&params(settings), &created(settings)).await {
                        Ok(lease) => {
                            became_leader(settings, leadership, sent);
                            keep(&lease);
                            written = Some(lease);
                        }
                        Err(e) if crate::is_status(&e, 409) => {}
                        Err(e) if !read_once && is_refusal(&e) => {
                            return Err(error(settings, &e));
                        }
                        Err(e) => {
                            tracing::warn!(lease = settings.name, error = %e, "cannot create the lease; retrying");
                            tokio::time::sleep(RETRY).await;
                        }
                    }
                    continue;
                }
                Err(e) if !read_once && is_refusal(&e) => return Err(error(settings, &e)),
                Err(e) => {
                    tracing::warn!(lease = settings.name, error = %e, "cannot read the lease; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            },
        };
        read_once = true;
        keep(&lease);
        let now = Instant::now();
        let record = Record::of(&lease);
        let since = observer.see(&record, now);
        let take = match next(&record, since, now, &settings.identity, settings.duration()) {
            Next::Wait(pause) => {
                if leadership.view().holder {
                    tracing::warn!(
                        identity = settings.identity,
                        lease = settings.name,
                        holder = record.holder,
                        "lost the lease"
                    );
                    leadership.lost();
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = news.notified() => {}
                }
                continue;
            }
            Next::Renew => {
                let view = leadership.view();
                let due = view
                    .renewed
                    .filter(|_| view.holder)
                    .map_or(now, |t| t + settings.renew_every());
                if due > now {
                    written = Some(lease);
                    tokio::time::sleep_until(due).await;
                    continue;
                }
                !view.holder
            }
            Next::Take => true,
        };
        let sent = Instant::now();
        match api
            .patch(
                &settings.name,
                &patch_params(settings),
                &hold(&lease, settings),
            )
            .await
        {
            Ok(lease) => {
                if take {
                    became_leader(settings, leadership, sent);
                } else {
                    leadership.renewed(sent);
                }
                keep(&lease);
                written = Some(lease);
            }
            // Someone else wrote it first: read it again.
            Err(e) if crate::is_status(&e, 409) => {
                tracing::debug!(
                    lease = settings.name,
                    "the lease changed meanwhile; reading it again"
                );
            }
            Err(e) => {
                tracing::warn!(lease = settings.name, error = %e, "cannot write the lease; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

fn became_leader(settings: &LeaseSettings, leadership: &Leadership, sent: Instant) {
    tracing::info!(
        identity = settings.identity,
        lease = settings.name,
        "became the leader"
    );
    leadership.renewed(sent);
}

/// Frees `lease` (as last read or written) if this process still holds it.
async fn release(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    mut lease: Lease,
) -> Result<(), kube::Error> {
    loop {
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(settings.identity.as_str()) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": precondition(&lease),
            "spec": {"holderIdentity": null, "acquireTime": null, "renewTime": null},
        });
        match api
            .patch(
                &settings.name,
                &patch_params(settings),
                &Patch::Merge(patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if crate::is_status(&e, 409) => lease = api.get(&settings.name).await?,
            Err(e) => return Err(e),
        }
    }
}

/// Watches the one Lease object and wakes the election loop at every change of it (a
/// release is taken at once, not at the next [`POLL`]).
async fn watch_lease(api: Api<Lease>, name: String, news: Arc<tokio::sync::Notify>) {
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(crate::watch::watch(api, config));
    while let Some(event) = futures::StreamExt::next(&mut stream).await {
        match event {
            Ok(
                kube::runtime::watcher::Event::Apply(_) | kube::runtime::watcher::Event::Delete(_),
            ) => {
                news.notify_one();
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(lease = name, error = %e, "lease watch failed; retrying"),
        }
    }
}

/// A task aborted when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(duration: u64, grace: u64) -> LeaseSettings {
        LeaseSettings {
            namespace: "ns".into(),
            name: "l".into(),
            identity: "me".into(),
            manager: "m".into(),
            duration,
            grace,
        }
    }

    fn record(holder: Option<&str>, renew: &str) -> Record {
        Record {
            holder: holder.map(str::to_string),
            renew_time: Some(MicroTime(renew.parse().unwrap())),
            duration_seconds: Some(15),
            ..Record::default()
        }
    }

    #[test]
    fn a_write_is_covered_only_by_a_recent_renewal_of_a_held_lease() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let window = Duration::from_secs(13);
        let held = LeaseView {
            holder: true,
            renewed: Some(t0),
        };
        assert!(held.is_current(s(12), window));
        assert!(
            !held.is_current(s(13), window),
            "renewal too old: stop writing"
        );
        let lost = LeaseView {
            holder: false,
            ..held.clone()
        };
        assert!(!lost.is_current(s(1), window));
        assert!(
            !LeaseView::default().is_current(s(1), window),
            "never renewed"
        );
        assert_eq!(held.covered_for(t0, window), Some(window));
        assert_eq!(
            held.covered_for(s(12), window),
            Some(Duration::from_secs(1))
        );
        assert_eq!(held.covered_for(s(13), window), None);
    }

    #[test]
    fn the_write_window_leaves_a_margin() {
        assert_eq!(settings(15, 5).write_window(), Duration::from_secs(13));
        // Renewed every 3 s (4 - 1): writes stay covered until 3.5 s after a renewal.
        assert_eq!(settings(4, 1).write_window(), Duration::from_millis(3500));
        for (duration, grace) in [(15, 5), (4, 1), (3, 1), (60, 20), (2, 1), (15, 12)] {
            let s = settings(duration, grace);
            assert!(
                s.write_window() > s.renew_every(),
                "the next renewal comes inside the window: {s:?}"
            );
            assert!(s.write_window() < s.duration(), "{s:?}");
        }
    }

    /// Finding: a replica whose clock ran 40 s ahead judged the holder's `renewTime`
    /// expired and took the Lease from it at start. Here the holder's `renewTime` is
    /// never read: a holder is alive while its record keeps changing, whatever the
    /// dates it writes (40 s behind, 40 s ahead, 2099), and expired once it has not
    /// changed for the duration on our clock — also when it is dated in 2099.
    #[test]
    fn a_holder_is_judged_by_when_we_saw_its_record_change_never_by_its_dates() {
        let duration = Duration::from_secs(15);
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let now_utc = k8s_openapi::jiff::Timestamp::now();
        let skews: [(&str, String); 4] = [
            ("in time", now_utc.to_string()),
            (
                "40 s behind",
                (now_utc - k8s_openapi::jiff::SignedDuration::from_secs(40)).to_string(),
            ),
            (
                "40 s ahead",
                (now_utc + k8s_openapi::jiff::SignedDuration::from_secs(40)).to_string(),
            ),
            ("in 2099", "2099-01-01T00:00:00Z".to_string()),
        ];
        for (what, renew) in skews {
            // First seen now: alive for the duration, whatever it says.
            let mut observer = Observer::default();
            let first = record(Some("a"), &renew);
            let since = observer.see(&first, t0);
            assert_eq!(
                next(&first, since, t0, "me", duration),
                Next::Wait(POLL),
                "{what}"
            );
            assert_eq!(
                next(&first, since, at(14), "me", duration),
                Next::Wait(Duration::from_secs(1)),
                "{what}"
            );
            // Renewed every 10 s (a new renewTime each time, as skewed): never taken.
            let mut renewed = first.clone();
            for i in 1..=10u64 {
                renewed.renew_time = renewed.renew_time.map(|MicroTime(t)| {
                    MicroTime(t + k8s_openapi::jiff::SignedDuration::from_secs(10))
                });
                let since = observer.see(&renewed, at(10 * i));
                assert_eq!(since, at(10 * i), "{what}: a change");
                assert!(
                    matches!(
                        next(&renewed, since, at(10 * i + 9), "me", duration),
                        Next::Wait(_)
                    ),
                    "{what}: alive"
                );
            }
            // No change for the duration: taken, however late or early it is dated.
            let since = observer.see(&renewed, at(115));
            assert_eq!(since, at(100));
            assert!(
                matches!(
                    next(&renewed, since, at(114), "me", duration),
                    Next::Wait(_)
                ),
                "{what}"
            );
            assert_eq!(
                next(&renewed, since, at(115), "me", duration),
                Next::Take,
                "{what}: expired"
            );
        }
        // Free: taken at once; ours: renewed.
        let free = Record::default();
        assert_eq!(next(&free, t0, t0, "me", duration), Next::Take);
        assert_eq!(
            next(
                &record(Some("me"), "2099-01-01T00:00:00Z"),
                t0,
                t0,
                "me",
                duration
            ),
            Next::Renew
        );
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_follows_renewals_and_waits_end_when_the_window_passes() {
        let window = Duration::from_secs(13);
        let l = Leadership::new(window);
        let mut changes = l.subscribe();
        assert!(!l.is_current());
        tokio::time::timeout(Duration::from_secs(1), l.until_not_current())
            .await
            .expect("not current yet: at once");
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.until_current().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        l.renewed(Instant::now());
        assert!(*changes.borrow_and_update());
        waiting.await.unwrap();
        assert!(l.is_current());
        // Not renewed in time: ends once the window has passed, not before.
        let started = Instant::now();
        l.until_not_current().await;
        assert_eq!(started.elapsed(), window);
        assert!(!l.is_current());
        // Renewed again, then lost: ends at once.
        l.renewed(Instant::now());
        assert!(l.is_current());
        l.lost();
        assert!(!l.is_current());
        assert!(changes.has_changed().unwrap());
        assert!(Leadership::always().is_current());
    }
}
