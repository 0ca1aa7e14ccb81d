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

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::json;

use super::coalesce::Gate;
use super::evaluate::replicas_in_sync;
use super::group::Group;
use super::plan::{self, Outcome, controller_uid, plan_envoyconfig, plan_revision_status};
use super::publish::{Candidate, Verdict};
use super::shared::{Shared, forget_node, lock, set_snapshot};
use super::source::StoreSource;
use super::writer::{Writer, Written};
use crate::fleet::{FleetView, NoVerdict};
use crate::publisher;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_kube::Lenient;

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

fn now() -> Timestamp {
    Timestamp::now()
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
    let Some(uid) = ec.metadata.uid.as_deref() else {
        tracing::error!(namespace, name, "EnvoyConfig without a uid; skipped");
        return Ok(Action::await_change());
    };
    let group = ctx.groups.group(&namespace, uid);
    let mut plan = match plan_envoyconfig(ec, group.all(), now()) {
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
    let owner = ctx.owner_config(ecr);
    let Some(Ok(owner)) = owner.as_deref().map(Lenient::valid) else {
        // Not cached yet, malformed, or gone (then the garbage collector deletes this
        // revision).
        return Ok(Action::requeue(RETRY_OWNER));
    };
    let status = ecr.status.clone().unwrap_or_default();
    let outcome = if owner.metadata.deletion_timestamp.is_some() || status.is_tainted() {
        Outcome::NotElected
    } else if let Some(other) = ctx.node_claimed_by_other(owner) {
        Outcome::OutOfSync {
            reason: "NodeIDConflict",
            message: format!(
                "node id {:?} is already configured by EnvoyConfig {other}",
                ecr.spec.node_id
            ),
        }
    } else {
        publish(&ctx, &ctx.groups.group(&namespace, owner_uid), ecr).await
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
    let key = (namespace.clone(), owner_uid.to_string());
    if new_status != status && plan::republished_only(&status, &new_status) {
        let gate = lock(&ctx.status_writes).offer(key.clone(), tokio::time::Instant::now());
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
                lock(&ctx.status_writes).written(key, tokio::time::Instant::now());
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

/// Applies what [`publisher::decide`] decides for the EnvoyConfig of `ecr` (its
/// `group`) to `ecr` ([`Candidate`]: the decision itself is pure): it is tainted,
/// published (the cache is set), waiting for a Secret or EndpointSlice, or not the
/// elected revision. The other revisions of the EnvoyConfig apply their part in their
/// own reconciles (every revision change triggers them). This shell only picks the NACK
/// view: a single replica sees every Envoy of the node; the HA leader judges over the
/// fleet as the tick that triggered this reconcile saw it; the other replicas follow
/// the leader's taints.
async fn publish(ctx: &Shared, group: &Group, ecr: &EnvoyConfigRevision) -> Outcome {
    let node_id = &ecr.spec.node_id;
    let served = ctx.served.get(node_id);
    let Some(candidate) = Candidate::of(group, ecr, served.as_ref()) else {
        return Outcome::NotElected;
    };
    let source = StoreSource {
        namespace: group.namespace(),
        secrets: &ctx.secrets,
        slices: &ctx.slices,
    };
    let resolve = |rev: &crate::revisions::Revision| {
        ctx.resolutions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        publisher::resolution(&rev.spec, &source, &ctx.memo)
    };
    let threshold = ctx.nack_threshold;
    // Only the HA leader names the judged revision (a single replica never needs it).
    let judged = match &ctx.ha {
        Some(ha) if ctx.writer.leads() => candidate.judged().map(|j| (ha, j)),
        _ => None,
    };
    let verdict = match (&ctx.ha, judged) {
        (None, _) => candidate.decide(resolve, &ctx.xds.stats, threshold),
        (Some(_), Some((ha, judged))) => {
            let fleet = ha.this_tick(|| ctx.digests());
            let view = FleetView::new(&fleet, judged);
            let verdict = candidate.decide(resolve, &view, threshold);
            ha.count_vetoes(&view.into_vetoes());
            verdict
        }
        (Some(_), None) => candidate.decide(resolve, &NoVerdict, threshold),
    };
    let p = match verdict {
        Verdict::Settled(outcome) => return outcome,
        Verdict::Publish(p) => p,
    };
    let _guard = ctx.publish_lock.lock().await;
    // Still elected as the caches say now (a newer revision may have arrived meanwhile).
    if !ctx
        .groups
        .group(group.namespace(), group.uid())
        .is_elected(ecr)
    {
        return Outcome::NotElected;
    }
    set_snapshot(ctx, ecr, p.snapshot, p.versions.clone(), p.reset_nacks);
    if p.reset_nacks {
        ctx.xds
            .revisions
            .published(candidate.engine(), &ecr.spec.version);
    }
    Outcome::Published {
        versions: p.versions,
    }
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
