//! The two reconcilers of Kubernetes mode, thin I/O shells over [`super::plan`]:
//!
//! - [`reconcile_envoyconfig`]: ensures the revision of the desired version exists,
//!   moves a re-applied one to the top, deletes beyond retention, writes the
//!   EnvoyConfig status;
//! - [`reconcile_revision`]: publishes the elected revision of each EnvoyConfig into the
//!   xDS cache (resolving Secrets and EndpointSlices from the watch caches), taints it
//!   when it does not decode or every Envoy rejected it, writes its status, and forgets
//!   the node's snapshot when the last revision of a node goes away (finalizer).
//!
//! Both read the same reflector stores, so they agree on which revision is elected
//! (the topmost untainted one) without writing to each other's objects' status. One
//! malformed object is logged and skipped; it never stops a controller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource as _, ResourceExt as _};
use serde_json::json;

use super::plan::{
    self, Outcome, controller_uid, elected, plan_envoyconfig, plan_revision_status, siblings,
};
use super::source::{SliceIndex, StoreSource};
use crate::publisher;
use marin3r_envoyconfig::discoveryservicereplica::NodeDigest;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_kube::Lenient;
use marin3r_xds::ResourceType;
use marin3r_xds::snapshot::Snapshot;

use super::coalesce::{self, Coalescer, Gate};
use super::ha::{self, Ha, ServedNodes};
use super::writer::{Writer, Written};
use crate::fleet::{Fleet, FleetView, Judged, NoVerdict, Served};
use crate::nacks::NackView;
use marin3r_kube::lease::Leadership;

pub use super::writer::FIELD_MANAGER;
/// Retry delay while the desired revision's old copy is still being deleted.
const WAIT_FOR_DELETION: Duration = Duration::from_secs(2);
/// Retry delay while a Secret or EndpointSlice a revision needs is missing.
const RETRY_OUT_OF_SYNC: Duration = Duration::from_secs(30);
/// Retry delay after a write refused because the object changed meanwhile.
const RETRY_CONFLICT: Duration = Duration::from_secs(1);
/// Retry delay while the owner of a revision is not in the cache yet.
const RETRY_OWNER: Duration = Duration::from_secs(5);

pub use marin3r_kube::Error;
use marin3r_kube::is_status;
pub use marin3r_kube::watch::error_policy;

/// What the reconcilers read and write.
pub struct Shared {
    /// Reads not served by the caches (the owner of a revision being finalized).
    pub client: Client,
    /// Every write, gated on the Lease ([`Writer`]).
    pub writer: Writer,
    pub configs: Store<Lenient<EnvoyConfig>>,
    pub revisions: Store<Lenient<EnvoyConfigRevision>>,
    pub secrets: Store<Secret>,
    /// The EndpointSlice watch cache, by namespace.
    pub slices: SliceIndex,
    /// The xDS snapshot cache and ACK/NACK statistics.
    pub xds: crate::Context,
    /// `--nack-threshold`.
    pub nack_threshold: u64,
    /// Serialises "is it still elected? then set the cache", so a reconcile that read an
    /// older state cannot overwrite a newer revision's snapshot.
    publish_lock: tokio::sync::Mutex<()>,
    /// What this replica serves each node (the revisions of the cache's snapshots):
    /// what "newly served" means for the NACK counts, and the source of its digests.
    pub served: ServedNodes,
    /// One of several replicas: the leadership writes are gated on, and the fleet's
    /// reports. `None`: a single replica, which always writes.
    pub ha: Option<Arc<Ha>>,
    /// The revisions' status writes per EnvoyConfig (namespace, UID): a re-publication
    /// within the same revision is written at most once per [`coalesce::STATUS_WINDOW`].
    status_writes: std::sync::Mutex<Coalescer<(String, String)>>,
    /// How many times a reconcile resolved a revision's spec ([`Shared::resolutions`]).
    resolutions: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub fn new(
        client: Client,
        configs: Store<Lenient<EnvoyConfig>>,
        revisions: Store<Lenient<EnvoyConfigRevision>>,
        secrets: Store<Secret>,
        slices: SliceIndex,
        xds: crate::Context,
        nack_threshold: u64,
    ) -> Self {
        Self {
            writer: Writer::new(client.clone(), Leadership::always()),
            client,
            configs,
            revisions,
            secrets,
            slices,
            xds,
            nack_threshold,
            publish_lock: tokio::sync::Mutex::new(()),
            served: ServedNodes::default(),
            ha: None,
            status_writes: std::sync::Mutex::new(Coalescer::new(coalesce::STATUS_WINDOW)),
            resolutions: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// One of several replicas (`docs/ha.md`): writes only while it leads, and judges
    /// NACKs over the fleet.
    /// Writes only while `leadership` is current (what [`Shared::with_ha`] sets from
    /// the Lease election; a single replica always writes).
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.writer = Writer::new(self.client.clone(), leadership);
        self
    }

    pub fn with_ha(mut self, ha: Arc<Ha>) -> Self {
        self = self.with_leadership(ha.leadership.clone());
        self.ha = Some(ha);
        self
    }

    /// How many times the revision reconciles resolved a spec (Secrets and
    /// EndpointSlices read, resources decoded): for tests and profiles.
    pub fn resolutions(&self) -> u64 {
        self.resolutions.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This replica's digest of every node it serves or has streams for.
    pub fn digests(&self) -> Vec<NodeDigest> {
        let configs = self.configs.state();
        let claimed: std::collections::BTreeSet<&str> = configs
            .iter()
            .filter_map(|c| c.valid().ok())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| c.spec.node_id.as_str())
            .collect();
        ha::digests(
            &self.served.snapshot(),
            &self.xds.stats,
            self.nack_threshold,
            |node| claimed.contains(node),
        )
    }

    /// The valid revisions of a namespace.
    fn revisions_in(&self, namespace: &str) -> Vec<Arc<Lenient<EnvoyConfigRevision>>> {
        self.revisions
            .state()
            .into_iter()
            .filter(|r| r.meta().namespace.as_deref() == Some(namespace) && r.valid().is_ok())
            .collect()
    }

    /// The EnvoyConfig with `uid` in `namespace`, if cached and valid.
    fn config(&self, namespace: &str, uid: &str) -> Option<EnvoyConfig> {
        self.configs.state().into_iter().find_map(|c| {
            let c = c.valid().ok()?;
            (c.metadata.namespace.as_deref() == Some(namespace)
                && c.metadata.uid.as_deref() == Some(uid))
            .then(|| c.clone())
        })
    }

    /// Another live EnvoyConfig that holds `ec`'s node id ([`publisher::node_owners`]:
    /// the first by namespace/name, as in local mode).
    fn node_claimed_by_other(&self, ec: &EnvoyConfig) -> Option<String> {
        let key = |c: &EnvoyConfig| (c.namespace().unwrap_or_default(), c.name_any());
        let configs = self.configs.state();
        let live: Vec<((String, String), &str)> = configs
            .iter()
            .filter_map(|c| c.valid().ok())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter(|c| c.spec.node_id == ec.spec.node_id)
            .map(|c| (key(c), c.spec.node_id.as_str()))
            .collect();
        let owner = publisher::node_owner(live.iter().map(|(k, n)| (k, *n)), &ec.spec.node_id)?;
        (*owner != key(ec)).then(|| format!("{}/{}", owner.0, owner.1))
    }

    /// The elected revision of the EnvoyConfig `uid` in `namespace`.
    pub fn elected(&self, namespace: &str, uid: &str) -> Option<EnvoyConfigRevision> {
        let all = self.revisions_in(namespace);
        let valid: Vec<&EnvoyConfigRevision> = all.iter().filter_map(|r| r.valid().ok()).collect();
        let ordered = siblings(valid, uid);
        elected(&ordered).cloned()
    }

    /// The name of the elected revision of the EnvoyConfig `uid` in `namespace`.
    fn elected_name(&self, namespace: &str, uid: &str) -> Option<String> {
        self.elected(namespace, uid).map(|e| e.name_any())
    }
}

fn now() -> Timestamp {
    Timestamp::now()
}

/// A lock that a panic elsewhere does not poison for good.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The per-type versions of `ecr` to judge against the NACKs: what this replica serves
/// its node when it serves `ecr` (the status may lag behind, [`coalesce`]), else what
/// its status says.
pub(super) fn served_versions(
    ctx: &Shared,
    ecr: &EnvoyConfigRevision,
) -> Option<BTreeMap<ResourceType, String>> {
    match ctx.served.get(&ecr.spec.node_id) {
        Some(s) if ecr.metadata.uid.as_deref() == Some(s.uid.as_str()) => Some(s.versions),
        _ => Some(
            ecr.status
                .as_ref()?
                .provides_versions
                .as_ref()?
                .to_versions(),
        ),
    }
}

/// Reconciles one EnvoyConfig (see the module docs and [`plan_envoyconfig`]).
pub async fn reconcile_envoyconfig(
    obj: Arc<Lenient<EnvoyConfig>>,
    ctx: Arc<Shared>,
) -> Result<Action, Error> {
    let meta = obj.meta();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let ec = match obj.valid() {
        Ok(ec) => ec,
        Err(error) => {
            tracing::error!(namespace, name, error, "malformed EnvoyConfig; skipped");
            return Ok(Action::await_change());
        }
    };
    if ec.metadata.deletion_timestamp.is_some() {
        ctx.xds.revisions.forget(&namespace, &name);
        // Its revisions are garbage collected through their owner reference.
        return Ok(Action::await_change());
    }
    if !ctx.writer.leads() {
        // The leader shows the cacheState (a former leader's would go stale).
        ctx.xds.revisions.forget(&namespace, &name);
        // Another replica leads: it creates the revisions and writes the status.
        return Ok(ctx.writer.skipped(Action::await_change()));
    }
    let all = ctx.revisions_in(&namespace);
    let mut plan = match plan_envoyconfig(ec, all.iter().filter_map(|r| r.valid().ok()), now()) {
        Ok(plan) => plan,
        Err(error) => {
            tracing::error!(namespace, name, error = %error, "cannot reconcile EnvoyConfig; skipped");
            return Ok(Action::await_change());
        }
    };
    if let Some(status) = &plan.status {
        let node_id = &ec.spec.node_id;
        (ctx.xds.revisions).cache_state(&namespace, &name, node_id, status.cache_state);
    }
    let mut action = Action::await_change();
    if let (Some(ha), Some(status)) = (&ctx.ha, plan.status.as_mut()) {
        let previous = ec.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        if let Some(again) = replicas_in_sync(&ctx, ha, ec, previous, &mut status.conditions) {
            action = Action::requeue(again);
        }
    }
    // Every write is gated by the writer; one skipped means a retry.
    let mut skipped = false;
    let w = &ctx.writer;
    if let Some(new) = &plan.create {
        let revision = new.name_any();
        match w.create(&namespace, new).await {
            Ok(Written::Done) => tracing::info!(
                namespace,
                envoyconfig = name,
                revision,
                "created EnvoyConfigRevision"
            ),
            Ok(Written::Skipped) => skipped = true,
            // Not in our cache yet (or taken by an object we do not own): look again soon.
            Err(e) if is_status(&e, 409) => action = Action::requeue(RETRY_OWNER),
            Err(e) => return Err(e.into()),
        }
    }
    if let Some((revision, applied_at)) = &plan.touch {
        let patch = json!({"metadata": {"annotations": {
            marin3r_wire::APPLIED_AT_ANNOTATION: applied_at
        }}});
        match w
            .merge_patch::<EnvoyConfigRevision>(&namespace, revision, &patch)
            .await?
        {
            Written::Done => tracing::info!(
                namespace,
                envoyconfig = name,
                revision,
                "re-applied a known revision"
            ),
            Written::Skipped => skipped = true,
        }
    }
    for revision in &plan.delete {
        match w.delete::<EnvoyConfigRevision>(&namespace, revision).await {
            Ok(Written::Done) => tracing::info!(
                namespace,
                envoyconfig = name,
                revision,
                "deleted old EnvoyConfigRevision"
            ),
            Ok(Written::Skipped) => skipped = true,
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(status) = &plan.status
        && ec.status.as_ref() != Some(status)
    {
        let written = w
            .apply_status::<EnvoyConfig>(&namespace, &name, None, status)
            .await?;
        skipped |= written == Written::Skipped;
    }
    if plan.wait_for_deletion {
        action = Action::requeue(WAIT_FOR_DELETION);
    }
    if skipped {
        action = ctx.writer.skipped(Action::await_change());
    }
    Ok(action)
}

/// Sets the `ReplicasInSync` condition (`docs/ha.md` §5) in `conditions`: whether every
/// expected replica serves the elected revision of `ec`. A lag shorter than
/// [`ha::REPLICAS_IN_SYNC_DEBOUNCE`] keeps what `previous` says (an ordinary edit costs
/// no extra write); returns when to look again then.
fn replicas_in_sync(
    ctx: &Shared,
    ha: &Ha,
    ec: &EnvoyConfig,
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    conditions: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Option<Duration> {
    let fleet = ha.this_tick(|| ctx.digests());
    let (verdict, again) =
        replicas_in_sync_verdict(ctx, ha, &fleet, ec, tokio::time::Instant::now())?;
    // The plan writes its own conditions afresh: carry this one over, so that its
    // transition time moves only with its status.
    if let Some(kept) = previous.iter().find(|c| c.type_ == plan::REPLICAS_IN_SYNC) {
        conditions.retain(|c| c.type_ != plan::REPLICAS_IN_SYNC);
        conditions.push(kept.clone());
    }
    // A lag younger than the debounce (`None`): what the status says stays.
    if let Some((in_sync, reason, message)) = verdict {
        plan::set_condition(
            conditions,
            plan::REPLICAS_IN_SYNC,
            in_sync,
            reason,
            message,
            ec.metadata.generation,
            now(),
        );
    }
    if let Some(c) = conditions
        .iter()
        .find(|c| c.type_ == plan::REPLICAS_IN_SYNC)
    {
        let (namespace, name) = (ec.namespace().unwrap_or_default(), ec.name_any());
        let in_sync = c.status == "True";
        (ctx.xds.revisions).replicas_in_sync(&namespace, &name, &ec.spec.node_id, in_sync);
    }
    again
}

/// `ReplicasInSync`'s status, reason and message (`None` inside the debounce), and when
/// to look again.
pub(super) type ReplicasInSyncVerdict = (Option<(bool, &'static str, String)>, Option<Duration>);

/// What the `ReplicasInSync` condition of `ec` should say in `fleet` at `now`
/// (`docs/ha.md` §5): its status, reason and message, or `None` while a lag is younger
/// than [`ha::REPLICAS_IN_SYNC_DEBOUNCE`]; and when to look again. `None` when `ec` has
/// no elected revision.
pub(super) fn replicas_in_sync_verdict(
    ctx: &Shared,
    ha: &Ha,
    fleet: &Fleet,
    ec: &EnvoyConfig,
    now: tokio::time::Instant,
) -> Option<ReplicasInSyncVerdict> {
    let namespace = ec.namespace().unwrap_or_default();
    let elected = ctx.elected(&namespace, ec.metadata.uid.as_deref()?)?;
    let (verdict, again) = ha.replicas_in_sync(
        fleet,
        &ec.spec.node_id,
        elected.metadata.uid.as_deref()?,
        now,
    );
    let condition = verdict.map(|v| ha::replicas_in_sync_condition(v, &elected.name_any()));
    Some((condition, again))
}

fn has_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers
        .iter()
        .flatten()
        .any(|f| f == marin3r_wire::REVISION_FINALIZER)
}

/// Sets the finalizer list with a merge patch guarded by the resource version: a
/// concurrent change makes it fail with 409 Conflict, and the reconcile is retried.
async fn set_finalizers(
    writer: &Writer,
    meta: &ObjectMeta,
    finalizers: Vec<String>,
) -> Result<Written, Error> {
    let name = meta.name.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let patch = json!({"metadata": {
        "resourceVersion": meta.resource_version,
        "finalizers": finalizers,
    }});
    match writer
        .merge_patch::<EnvoyConfigRevision>(namespace, name, &patch)
        .await
    {
        Ok(written) => Ok(written),
        // Already gone: nothing left to finalize.
        Err(e) if is_status(&e, 404) => Ok(Written::Done),
        Err(e) => Err(e.into()),
    }
}

/// Adds [`marin3r_wire::REVISION_FINALIZER`] to the revision.
async fn add_finalizer(writer: &Writer, meta: &ObjectMeta) -> Result<Written, Error> {
    let mut list = meta.finalizers.clone().unwrap_or_default();
    list.push(marin3r_wire::REVISION_FINALIZER.to_string());
    set_finalizers(writer, meta, list).await
}

/// Removes [`marin3r_wire::REVISION_FINALIZER`] from the revision.
async fn remove_finalizer(writer: &Writer, meta: &ObjectMeta) -> Result<Written, Error> {
    let list = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != marin3r_wire::REVISION_FINALIZER)
        .cloned()
        .collect();
    set_finalizers(writer, meta, list).await
}

/// What a reconcile does after `written`: `done` when it was written, else what
/// [`Writer::skipped`] says.
fn after(ctx: &Shared, written: Written, done: Action) -> Action {
    match written {
        Written::Done => done,
        Written::Skipped => ctx.writer.skipped(done),
    }
}

/// Reconciles one EnvoyConfigRevision (see the module docs).
pub async fn reconcile_revision(
    obj: Arc<Lenient<EnvoyConfigRevision>>,
    ctx: Arc<Shared>,
) -> Result<Action, Error> {
    let meta = obj.meta().clone();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let deleting = meta.deletion_timestamp.is_some();
    let ecr = match obj.valid() {
        Ok(ecr) => ecr,
        Err(error) => {
            tracing::error!(
                namespace,
                name,
                error,
                "malformed EnvoyConfigRevision; skipped"
            );
            if deleting && has_finalizer(&meta) {
                // Never block the deletion of an object we cannot read.
                let written = remove_finalizer(&ctx.writer, &meta).await?;
                return Ok(after(&ctx, written, Action::await_change()));
            }
            return Ok(Action::await_change());
        }
    };
    if deleting {
        // Removing the finalizer is the leader's (the writer skips it elsewhere); the
        // node is forgotten by every replica (as `forget_unclaimed_nodes` does anyway).
        if has_finalizer(&meta) {
            cleanup(&ctx, ecr).await?;
            let written = remove_finalizer(&ctx.writer, &meta).await?;
            return Ok(after(&ctx, written, Action::await_change()));
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer(&meta) {
        // The patch triggers the next reconcile.
        let written = add_finalizer(&ctx.writer, &meta).await?;
        return Ok(after(&ctx, written, Action::await_change()));
    }
    let Some(owner_uid) = controller_uid(ecr) else {
        tracing::debug!(
            namespace,
            name,
            "EnvoyConfigRevision without an owner EnvoyConfig; ignored"
        );
        return Ok(Action::await_change());
    };
    let Some(owner) = ctx.config(&namespace, owner_uid) else {
        // Not cached yet, or gone (then the garbage collector deletes this revision).
        return Ok(Action::requeue(RETRY_OWNER));
    };
    let status = ecr.status.clone().unwrap_or_default();
    let outcome = if owner.metadata.deletion_timestamp.is_some() || status.is_tainted() {
        Outcome::NotElected
    } else if let Some(other) = ctx.node_claimed_by_other(&owner) {
        Outcome::OutOfSync {
            reason: "NodeIDConflict",
            message: format!(
                "node id {:?} is already configured by EnvoyConfig {other}",
                ecr.spec.node_id
            ),
        }
    } else {
        publish(&ctx, &namespace, owner_uid, ecr).await
    };
    if ctx.writer.leads() {
        log_outcome(&namespace, &name, &ecr.spec.node_id, &outcome);
    }
    let new_status = plan_revision_status(&status, meta.generation, &outcome, now());
    let retry = match outcome {
        Outcome::OutOfSync { .. } => Action::requeue(RETRY_OUT_OF_SYNC),
        _ => Action::await_change(),
    };
    // A re-publication within the same revision (new endpoints, a renewed Secret) is
    // written at most once per window, the last value at the window's end; the snapshot
    // was set already.
    let group = (namespace.clone(), owner_uid.to_string());
    if new_status != status && plan::republished_only(&status, &new_status) {
        let gate = lock(&ctx.status_writes).offer(group.clone(), tokio::time::Instant::now());
        if let Gate::Defer(wait) = gate {
            return Ok(Action::requeue(wait));
        }
    }
    if new_status != status {
        // Fenced: the taint is written only on the revision as it was judged (another
        // replica may have led meanwhile).
        let fence = matches!(outcome, Outcome::Tainted { .. })
            .then_some(meta.resource_version.as_deref())
            .flatten();
        match ctx
            .writer
            .apply_status::<EnvoyConfigRevision>(&namespace, &name, fence, &new_status)
            .await
        {
            Ok(Written::Skipped) => return Ok(ctx.writer.skipped(retry)),
            Ok(Written::Done) => {
                lock(&ctx.status_writes).written(group, tokio::time::Instant::now());
                if let Outcome::Tainted { reason, .. } = &outcome {
                    ctx.xds.revisions.tainted_reason(&ecr.spec.node_id, reason);
                }
            }
            Err(e) if fence.is_some() && is_status(&e, 409) => {
                return Ok(Action::requeue(RETRY_CONFLICT));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(retry)
}

fn log_outcome(namespace: &str, name: &str, node_id: &str, outcome: &Outcome) {
    match outcome {
        Outcome::NotElected | Outcome::Published { .. } => {}
        Outcome::Tainted { reason, message } => {
            tracing::warn!(
                namespace,
                revision = name,
                node_id,
                reason,
                message,
                "revision tainted"
            );
        }
        Outcome::OutOfSync { reason, message } => {
            tracing::warn!(
                namespace,
                revision = name,
                node_id,
                reason,
                message,
                "cannot load revision; the node keeps its current config"
            );
        }
    }
}

/// Applies what [`publisher::decide`] decides for the EnvoyConfig of `ecr` to `ecr`: it
/// is tainted, published (the cache is set), waiting for a Secret or EndpointSlice, or
/// not the elected revision. The other revisions of the EnvoyConfig apply their part in
/// their own reconciles (every revision change triggers them).
async fn publish(
    ctx: &Shared,
    namespace: &str,
    owner_uid: &str,
    ecr: &EnvoyConfigRevision,
) -> Outcome {
    let node_id = &ecr.spec.node_id;
    let all = ctx.revisions_in(namespace);
    let valid: Vec<&EnvoyConfigRevision> = all.iter().filter_map(|r| r.valid().ok()).collect();
    let ordered = siblings(valid, owner_uid);
    let served = ctx.served.get(node_id);
    // Only the elected revision is published and only it or the one served can be
    // tainted: any other answers "not elected" without copying the group into an
    // engine or resolving anything (each status write of the elected revision
    // reconciles every sibling).
    let same = |name: &str, uid: Option<&str>| {
        Some(name) == ecr.metadata.name.as_deref() && uid == ecr.metadata.uid.as_deref()
    };
    let is_elected =
        plan::elected(&ordered).is_some_and(|e| same(&e.name_any(), e.metadata.uid.as_deref()));
    let is_served = served
        .as_ref()
        .is_some_and(|s| same(&s.name, Some(s.uid.as_str())));
    if !is_elected && !is_served {
        return Outcome::NotElected;
    }
    let mut revisions = plan::engine(node_id, &ordered);
    // The NACKs are judged against what is served, which the (coalesced) status may
    // not show yet.
    if let Some(s) = &served
        && let Some(r) = revisions
            .revisions
            .iter_mut()
            .find(|r| r.version == s.version)
        && ordered
            .iter()
            .any(|e| e.metadata.uid.as_deref() == Some(s.uid.as_str()))
    {
        r.provides_versions.clone_from(&s.versions);
    }
    let served = served.map(|s| s.version);
    let source = StoreSource {
        namespace,
        secrets: &ctx.secrets,
        slices: &ctx.slices,
    };
    let decide = |nacks: &dyn NackView| {
        publisher::decide(
            &revisions,
            served.as_deref(),
            |rev| {
                ctx.resolutions
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                publisher::resolution(&rev.spec, &source)
            },
            nacks,
            ctx.nack_threshold,
        )
    };
    let decision = match &ctx.ha {
        // A single replica sees every Envoy of the node.
        None => decide(&ctx.xds.stats),
        // The leader judges over every replica's report; the others follow its taints.
        Some(ha) if ctx.writer.leads() => match judged(&revisions, &ordered) {
            Some(judged) => {
                // The fleet as the tick that triggered this reconcile judged it.
                let fleet = ha.this_tick(|| ctx.digests());
                let view = FleetView::new(&fleet, judged);
                let decision = decide(&view);
                ha.count_vetoes(&view.into_vetoes());
                decision
            }
            None => decide(&NoVerdict),
        },
        Some(_) => decide(&NoVerdict),
    };
    let version = &ecr.spec.version;
    if let Some(taint) = decision.taints.into_iter().find(|t| t.version == *version) {
        return Outcome::Tainted {
            reason: taint.cause.as_str(),
            message: taint.reason,
        };
    }
    if let Some(w) = decision.waiting.filter(|w| w.version == *version) {
        return Outcome::OutOfSync {
            reason: "DependenciesNotReady",
            message: w.reason,
        };
    }
    let Some(p) = decision.publish.filter(|p| p.version == *version) else {
        return Outcome::NotElected;
    };
    let _guard = ctx.publish_lock.lock().await;
    if ctx.elected_name(namespace, owner_uid).as_deref() != ecr.metadata.name.as_deref() {
        return Outcome::NotElected;
    }
    set_snapshot(ctx, ecr, p.snapshot, p.versions.clone(), p.reset_nacks);
    if p.reset_nacks {
        ctx.xds.revisions.published(&revisions, version);
    }
    Outcome::Published {
        versions: p.versions,
    }
}

/// The published revision of `revisions` (the engine of `ordered`), as the fleet
/// judgement names it: its UID and its last publication.
fn judged(
    revisions: &crate::revisions::Revisions,
    ordered: &[&EnvoyConfigRevision],
) -> Option<Judged> {
    let published = revisions.published()?;
    let ecr = ordered
        .iter()
        .rev()
        .find(|e| e.spec.version == published.version)?;
    Judged::of(ecr)
}

/// Stores `snapshot` (with `versions`) for the node of `ecr` and records what is served.
/// The NACK counts of those versions start afresh when the revision becomes the served
/// one (`reset_nacks`, from the publisher), and when the revision served is published
/// anew (its `lastPublishedAt` changed: another replica led an episode this one missed).
fn set_snapshot(
    ctx: &Shared,
    ecr: &EnvoyConfigRevision,
    snapshot: Snapshot,
    versions: BTreeMap<ResourceType, String>,
    reset_nacks: bool,
) {
    let node_id = &ecr.spec.node_id;
    let served = Served {
        uid: ecr.metadata.uid.clone().unwrap_or_default(),
        name: ecr.name_any(),
        version: ecr.spec.version.clone(),
        epoch: ecr
            .status
            .as_ref()
            .and_then(|s| s.last_published_at.clone()),
        versions,
    };
    let before = ctx.served.set(node_id, served.clone());
    let republished = before
        .as_ref()
        .is_some_and(|b| b.uid == served.uid && b.epoch.is_some() && b.epoch != served.epoch);
    if reset_nacks || republished {
        for (t, v) in &served.versions {
            ctx.xds.stats.reset_version(node_id, *t, v);
        }
    }
    if ctx.xds.cache.set(node_id, snapshot) {
        tracing::info!(node_id, revision = served.name, "published snapshot");
    }
}

/// Forgets the nodes no live EnvoyConfig configures any more (their EnvoyConfig was
/// deleted, or its nodeID changed): their snapshot, what is served and their NACK
/// counts. Level-triggered (every evaluation), on every replica: the revisions'
/// finalizer does the same on the leader at once. Connected Envoys keep their config
/// (see [`marin3r_xds::SnapshotCache::remove`]).
pub fn forget_unclaimed_nodes(ctx: &Shared) {
    let configs = ctx.configs.state();
    let live: Vec<&EnvoyConfig> = configs
        .iter()
        .filter_map(|c| c.valid().ok())
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    let claimed: std::collections::BTreeSet<&str> =
        live.iter().map(|c| c.spec.node_id.as_str()).collect();
    // Every tick: one set of the live EnvoyConfigs, not a scan of them per key shown.
    let names: std::collections::BTreeSet<(&str, &str)> = live
        .iter()
        .filter_map(|c| {
            Some((
                c.metadata.namespace.as_deref()?,
                c.metadata.name.as_deref()?,
            ))
        })
        .collect();
    ctx.xds
        .revisions
        .retain(|namespace, name| names.contains(&(namespace, name)));
    for node_id in ctx.served.snapshot().into_keys() {
        if !claimed.contains(node_id.as_str()) {
            forget_node(ctx, &node_id, None);
        }
    }
    if let Some(ha) = &ctx.ha {
        ha.retain_nodes(|node_id| claimed.contains(node_id));
    }
}

fn forget_node(ctx: &Shared, node_id: &str, revision: Option<&str>) {
    if ctx.xds.cache.remove(node_id) {
        tracing::info!(
            node_id,
            revision,
            "EnvoyConfig removed; node no longer configured"
        );
    }
    ctx.served.remove(node_id);
    ctx.xds.stats.clear_node(node_id);
    ctx.xds.revisions.forget_node(node_id);
}

/// Loads the elected, already published revisions into the cache without writing
/// anything (the discovery service's start: Envoys that reconnect get their config at
/// once instead of an empty one). Returns how many nodes were loaded.
pub fn warm_start(ctx: &Shared) -> usize {
    let mut loaded = 0;
    for obj in ctx.revisions.state() {
        let Ok(ecr) = obj.valid() else { continue };
        let status = ecr.status.clone().unwrap_or_default();
        let namespace = ecr.namespace().unwrap_or_default();
        let Some(uid) = controller_uid(ecr) else {
            continue;
        };
        if !status.is_published()
            || status.is_tainted()
            || ctx.elected_name(&namespace, uid).as_deref() != ecr.metadata.name.as_deref()
        {
            continue;
        }
        match ctx.config(&namespace, uid) {
            Some(owner) if ctx.node_claimed_by_other(&owner).is_none() => {}
            _ => continue,
        }
        let source = StoreSource {
            namespace: &namespace,
            secrets: &ctx.secrets,
            slices: &ctx.slices,
        };
        match publisher::resolution(&ecr.spec.config_spec(), &source) {
            publisher::Resolution::Ready(snapshot) => {
                let versions = snapshot.versions();
                set_snapshot(ctx, ecr, *snapshot, versions, false);
                loaded += 1;
            }
            publisher::Resolution::Invalid(message) | publisher::Resolution::Waiting(message) => {
                tracing::warn!(
                    namespace,
                    revision = ecr.name_any(),
                    node_id = ecr.spec.node_id,
                    message,
                    "cannot load the published revision at start"
                );
            }
        }
    }
    loaded
}

/// Finalizer: when no live EnvoyConfig configures the revision's node any more (its
/// EnvoyConfig was deleted, or its nodeID changed), the node's snapshot and NACK counts
/// are dropped. Connected Envoys keep their config (see [`marin3r_xds::SnapshotCache::remove`]).
async fn cleanup(ctx: &Shared, ecr: &EnvoyConfigRevision) -> Result<(), Error> {
    let node_id = &ecr.spec.node_id;
    let namespace = ecr.namespace().unwrap_or_default();
    // Ask the API server about the owner: the cache may not have seen its deletion yet.
    let owner_alive = match plan::owner(&ecr.metadata) {
        Some(owner) => {
            let configs: Api<Lenient<EnvoyConfig>> =
                Api::namespaced(ctx.client.clone(), &namespace);
            match configs.get_opt(&owner.name).await? {
                Some(Lenient::Valid(ec)) => {
                    ec.metadata.uid.as_deref() == Some(owner.uid.as_str())
                        && ec.metadata.deletion_timestamp.is_none()
                        && ec.spec.node_id == *node_id
                }
                Some(Lenient::Malformed { .. }) | None => false,
            }
        }
        None => false,
    };
    let claimed_elsewhere = ctx
        .configs
        .state()
        .iter()
        .filter_map(|c| c.valid().ok())
        .any(|c| {
            c.spec.node_id == *node_id
                && c.metadata.deletion_timestamp.is_none()
                && c.metadata.uid.as_deref() != plan::controller_uid(ecr)
        });
    if !owner_alive && !claimed_elsewhere {
        forget_node(ctx, node_id, Some(&ecr.name_any()));
    }
    Ok(())
}
