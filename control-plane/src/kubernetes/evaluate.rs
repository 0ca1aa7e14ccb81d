//! The periodic judgement (every [`super::DEFAULT_EVALUATE_INTERVAL`]): published
//! revisions every pod rejected are reconciled (and tainted), unclaimed nodes forgotten;
//! with several replicas the fleet is judged once per tick and `ReplicasInSync` follows
//! it (`docs/ha.md` §5). A new leader reconciles everything.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use super::ha::{self, Ha};
use super::shared::{Shared, forget_unclaimed_nodes};
use super::triggers::send_all;
use super::{ConfigRef, RevisionRef, plan, publish};
use crate::fleet::Fleet;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;

/// Every `interval`: reconciles the published revisions that every pod of their node
/// rejected (the reconcile taints them); on every replica, forgets the nodes no live
/// EnvoyConfig claims any more; with several replicas, updates the fleet metrics and,
/// on the leader, reconciles the EnvoyConfigs whose `ReplicasInSync` must change.
pub(super) async fn evaluate_loop(
    shared: Arc<Shared>,
    config_tx: mpsc::Sender<ConfigRef>,
    revision_tx: mpsc::Sender<RevisionRef>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !shared.xds.ready.is_synced() {
            // The stores are not complete yet: nothing can be judged or forgotten.
            continue;
        }
        forget_unclaimed_nodes(&shared);
        // With several replicas, the fleet as this tick sees it: judged, observed and
        // compared with the statuses once.
        let fleet = shared.ha.as_ref().map(|ha| {
            let fleet = ha.fleet(shared.digests(), std::time::SystemTime::now());
            (ha, ha.judged(fleet))
        });
        for target in rejected_revisions_in(&shared, fleet.as_ref().map(|(_, f)| &**f)) {
            let _ = revision_tx.send(target).await;
        }
        if let Some((ha, fleet)) = &fleet {
            ha.observe(fleet, shared.nack_threshold);
            if shared.writer.leads() {
                for target in replicas_in_sync_changes(&shared, ha, fleet) {
                    let _ = config_tx.send(target).await;
                }
            }
        }
    }
}

/// The published, untainted revisions whose served versions every pod rejected: the
/// verdict alone ([`crate::nacks::rejected`]); the reconcile it triggers derives the
/// taint and its reason once, in [`crate::publisher::decide`]. With several replicas,
/// only the leader judges, over the fleet ([`crate::fleet::FleetView`]).
pub fn rejected_revisions(shared: &Shared) -> Vec<RevisionRef> {
    let fleet = shared
        .ha
        .as_ref()
        .map(|ha| ha.fleet(shared.digests(), std::time::SystemTime::now()));
    rejected_revisions_in(shared, fleet.as_ref())
}

/// [`rejected_revisions`] with several replicas judged over `fleet` (`None`: a single
/// replica, which judges its own streams).
fn rejected_revisions_in(shared: &Shared, fleet: Option<&crate::fleet::Fleet>) -> Vec<RevisionRef> {
    let fleet = match (&shared.ha, fleet) {
        (None, _) => None,
        // Only the leader judges, and only over the fleet.
        (Some(_), _) if !shared.writer.leads() => return Vec::new(),
        (Some(ha), Some(fleet)) => Some((ha, fleet)),
        (Some(_), None) => return Vec::new(),
    };
    shared
        .revisions
        .state()
        .iter()
        .filter_map(|r| r.valid().ok())
        .filter_map(|r| {
            let status = r.status.as_ref()?;
            if !status.is_published() || status.is_tainted() {
                return None;
            }
            let versions = publish::served_versions(r, shared.served.get(&r.spec.node_id))?;
            match &fleet {
                None => crate::nacks::rejected(
                    &r.spec.node_id,
                    &versions,
                    &shared.xds.stats,
                    shared.nack_threshold,
                ),
                Some((ha, fleet)) => {
                    let judged = crate::fleet::Judged::of(r)?;
                    let view = crate::fleet::FleetView::new(fleet, judged);
                    let verdict = crate::nacks::rejected(
                        &r.spec.node_id,
                        &versions,
                        &view,
                        shared.nack_threshold,
                    );
                    ha.count_vetoes(&view.into_vetoes());
                    verdict
                }
            }?;
            Some(ObjectRef::new(&r.name_any()).within(&r.namespace()?))
        })
        .collect()
}

/// The EnvoyConfigs whose `ReplicasInSync` condition no longer says what the fleet
/// does (past the debounce).
fn replicas_in_sync_changes(
    shared: &Shared,
    ha: &ha::Ha,
    fleet: &crate::fleet::Fleet,
) -> Vec<ConfigRef> {
    let now = tokio::time::Instant::now();
    shared
        .configs
        .state()
        .iter()
        .filter_map(|c| c.valid().ok())
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|ec| {
            let namespace = ec.namespace()?;
            let (verdict, _) = replicas_in_sync_verdict(shared, ha, fleet, ec, now)?;
            let (in_sync, _, message) = verdict?;
            let current = ec.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == plan::REPLICAS_IN_SYNC)
            });
            // The count changes too ("2/2" → "3/3" after a replica joined).
            let same =
                current.is_some_and(|c| (c.status == "True") == in_sync && c.message == message);
            (!same).then(|| ObjectRef::new(&ec.name_any()).within(&namespace))
        })
        .collect()
}

/// When this replica becomes the leader, reconciles every EnvoyConfig and revision:
/// their statuses are recomputed and what the previous leader left is finished.
pub(super) async fn requeue_when_leading(
    shared: Arc<Shared>,
    mut leading: tokio::sync::watch::Receiver<bool>,
    config_tx: mpsc::Sender<ConfigRef>,
    revision_tx: mpsc::Sender<RevisionRef>,
) {
    while leading.changed().await.is_ok() {
        if !*leading.borrow_and_update() {
            continue;
        }
        let configs: Vec<ConfigRef> = shared
            .configs
            .state()
            .iter()
            .map(|c| ObjectRef::from_obj(c.as_ref()))
            .collect();
        let revisions: Vec<RevisionRef> = shared
            .revisions
            .state()
            .iter()
            .map(|r| ObjectRef::from_obj(r.as_ref()))
            .collect();
        tracing::info!(
            envoyconfigs = configs.len(),
            revisions = revisions.len(),
            "leading: reconciling everything"
        );
        send_all(config_tx.clone(), configs).await;
        send_all(revision_tx.clone(), revisions).await;
    }
}

/// Sets the `ReplicasInSync` condition (`docs/ha.md` §5) in `conditions`: whether every
/// expected replica serves the elected revision of `ec`. A lag shorter than
/// [`ha::REPLICAS_IN_SYNC_DEBOUNCE`] keeps what `previous` says (an ordinary edit costs
/// no extra write); returns when to look again then.
pub(super) fn replicas_in_sync(
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
            Timestamp::now(),
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
type ReplicasInSyncVerdict = (Option<(bool, &'static str, String)>, Option<Duration>);

/// What the `ReplicasInSync` condition of `ec` should say in `fleet` at `now`
/// (`docs/ha.md` §5): its status, reason and message, or `None` while a lag is younger
/// than [`ha::REPLICAS_IN_SYNC_DEBOUNCE`]; and when to look again. `None` when `ec` has
/// no elected revision.
fn replicas_in_sync_verdict(
    ctx: &Shared,
    ha: &Ha,
    fleet: &Fleet,
    ec: &EnvoyConfig,
    now: tokio::time::Instant,
) -> Option<ReplicasInSyncVerdict> {
    let namespace = ec.namespace().unwrap_or_default();
    let group = ctx.groups.group(&namespace, ec.metadata.uid.as_deref()?);
    let elected = group.elected()?;
    let (verdict, again) = ha.replicas_in_sync(
        fleet,
        &ec.spec.node_id,
        elected.metadata.uid.as_deref()?,
        now,
    );
    let condition = verdict.map(|v| ha::replicas_in_sync_condition(v, &elected.name_any()));
    Some((condition, again))
}
