//! The decisions of the Kubernetes controllers, free of I/O: functions from the watched
//! objects (and the NACK verdict) to what to create, patch and delete, and the statuses
//! to write. The controllers in [`super::controller`] only read the stores, call these
//! and carry the result out.
//!
//! The revision engine [`Revisions`] is the core: it is rebuilt from the
//! EnvoyConfigRevisions of an EnvoyConfig on every reconcile, ordered by the
//! [`marin3r_wire::APPLIED_AT_ANNOTATION`] (when a revision last became the desired one), so both
//! controllers agree on which revision is published without talking to each other.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kube::core::{Expression, Selector};
use kube::{Resource as _, ResourceExt as _};

use crate::revisions::{Revision, Revisions};
use marin3r_envoyconfig::config_version;
use marin3r_envoyconfig::envoyconfig::{
    ConfigRevisionRef, EnvoyApi, EnvoyConfig, EnvoyConfigStatus,
};
use marin3r_envoyconfig::envoyconfigrevision::{
    EnvoyConfigRevision, EnvoyConfigRevisionSpec, EnvoyConfigRevisionStatus, RESOURCES_IN_SYNC,
    REVISION_PUBLISHED, REVISION_TAINTED, VersionTracker,
};
use marin3r_envoyconfig::resource::{ResourceType, fnv1a64};

pub use crate::status::{CACHE_OUT_OF_SYNC, REPLICAS_IN_SYNC, ROLLBACK_FAILED};
pub use marin3r_kube::conditions::set_condition;
pub use marin3r_kube::time::truncate_to_seconds;
use marin3r_wire::{is_dns1123_subdomain, is_label_value};

/// Why a plan could not be made (the object is logged and skipped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the object has no {0} (not read from the API server?)")]
    MissingMetadata(&'static str),
}

/// `text` reduced to `[a-z0-9-]`, at most `max` chars, followed by `-<hash of text>` so
/// that different inputs stay different.
fn sanitized(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if !(c == '-' && (out.is_empty() || out.ends_with('-'))) {
            out.push(c);
        }
    }
    let hash = format!("{:08x}", fnv1a64(text.as_bytes()) as u32);
    out.truncate(max.saturating_sub(hash.len() + 1));
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        hash
    } else {
        format!("{out}-{hash}")
    }
}

/// The name of the revision of `version` for `node_id`: `<nodeID>-<envoyAPI>-<version>`
/// as upstream, when that is a valid object name; otherwise the node id is reduced to
/// `[a-z0-9-]` and suffixed with a hash of itself (`My_Node` → `my-node-1a2b3c4d-v3-…`).
pub fn revision_name(node_id: &str, api: EnvoyApi, version: &str) -> String {
    let api = api.as_str();
    let plain = format!("{node_id}-{api}-{version}");
    if is_dns1123_subdomain(&plain) {
        return plain;
    }
    let budget = 253 - api.len() - version.len() - 2;
    format!("{}-{api}-{version}", sanitized(node_id, budget.min(200)))
}

/// The value of the node-id label: the node id itself when it is a valid label value,
/// else a sanitized form with a hash.
pub fn node_id_label(node_id: &str) -> String {
    if is_label_value(node_id) {
        node_id.to_string()
    } else {
        sanitized(node_id, 63)
    }
}

/// The one owner rule: the EnvoyConfig a revision belongs to is its controller owner
/// reference of kind EnvoyConfig (every user of "the owner" reads it here, whether it
/// holds a typed revision or only its metadata).
pub fn owner(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "EnvoyConfig")
}

/// Whether `ecr` is controlled by the EnvoyConfig with `uid` ([`owner`]).
pub fn owned_by(ecr: &EnvoyConfigRevision, uid: &str) -> bool {
    controller_uid(ecr) == Some(uid)
}

/// The uid of the EnvoyConfig owning `ecr` ([`owner`]).
pub fn controller_uid(ecr: &EnvoyConfigRevision) -> Option<&str> {
    owner(&ecr.metadata).map(|o| o.uid.as_str())
}

pub(crate) fn is_deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// Order of the revisions of one EnvoyConfig, oldest first: the applied-at annotation
/// (falling back to the last publication, then the creation time), then the name.
pub(crate) fn order_key(ecr: &EnvoyConfigRevision) -> (Option<Timestamp>, String) {
    let applied = ecr
        .annotations()
        .get(marin3r_wire::APPLIED_AT_ANNOTATION)
        .and_then(|t| t.parse::<Timestamp>().ok());
    let published = ecr
        .status
        .as_ref()
        .and_then(|s| s.last_published_at.as_ref())
        .map(|t| t.0);
    let created = ecr.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (applied.or(published).or(created), ecr.name_any())
}

/// The live (not terminating) revisions among `all` that `uid` controls, oldest first.
pub fn siblings<'a>(
    all: impl IntoIterator<Item = &'a EnvoyConfigRevision>,
    uid: &str,
) -> Vec<&'a EnvoyConfigRevision> {
    let mut live: Vec<&EnvoyConfigRevision> = all
        .into_iter()
        .filter(|e| owned_by(e, uid) && !is_deleting(&e.metadata))
        .collect();
    live.sort_by_key(|e| order_key(e));
    live
}

/// The engine state of ordered revisions (see [`siblings`]).
pub fn engine(node_id: &str, ordered: &[&EnvoyConfigRevision]) -> Revisions {
    let mut revisions = Revisions::new(node_id);
    for ecr in ordered {
        let status = ecr.status.clone().unwrap_or_default();
        revisions.revisions.push(Revision {
            version: ecr.spec.version.clone(),
            spec: std::sync::Arc::new(ecr.spec.config_spec()),
            created_at: ecr
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(SystemTime::UNIX_EPOCH, |t| SystemTime::from(t.0)),
            last_published_at: status
                .last_published_at
                .as_ref()
                .map(|t| SystemTime::from(t.0)),
            tainted: status.is_tainted().then(|| tainted_reason(&status)),
            provides_versions: status
                .provides_versions
                .as_ref()
                .map(VersionTracker::to_versions)
                .unwrap_or_default(),
        });
    }
    revisions
}

fn tainted_reason(status: &EnvoyConfigRevisionStatus) -> String {
    status
        .condition(REVISION_TAINTED)
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "tainted".to_string())
}

/// Which of the ordered revisions of one EnvoyConfig must be served: the topmost
/// untainted one (the rule of [`Revisions::published`], which both modes use), read
/// from the statuses without building an engine (no spec is copied: every trigger
/// and reconcile asks this).
pub fn elected<'a>(ordered: &[&'a EnvoyConfigRevision]) -> Option<&'a EnvoyConfigRevision> {
    let top = ordered.iter().rev().find(|e| !is_tainted(e))?;
    ordered
        .iter()
        .rev()
        .find(|e| e.spec.version == top.spec.version)
        .copied()
}

fn is_tainted(e: &EnvoyConfigRevision) -> bool {
    e.status.as_ref().is_some_and(|s| s.is_tainted())
}

/// The version whose snapshot the cache holds for the node of `ecr`, as far as the
/// statuses tell: `ecr`'s own when it is published, else the newest published sibling.
pub fn served(ordered: &[&EnvoyConfigRevision], ecr: &EnvoyConfigRevision) -> Option<String> {
    if is_published(ecr) {
        return Some(ecr.spec.version.clone());
    }
    newest_published(ordered)
}

fn is_published(e: &EnvoyConfigRevision) -> bool {
    e.status.as_ref().is_some_and(|s| s.is_published())
}

/// The version of the newest revision whose status says published.
fn newest_published(ordered: &[&EnvoyConfigRevision]) -> Option<String> {
    ordered
        .iter()
        .rev()
        .find(|e| is_published(e))
        .map(|e| e.spec.version.clone())
}

/// What the EnvoyConfig controller must do for one EnvoyConfig.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyConfigPlan {
    /// A revision to create (the desired version is new).
    pub create: Option<EnvoyConfigRevision>,
    /// A revision to move to the top: set its applied-at annotation to this value.
    pub touch: Option<(String, String)>,
    /// Revisions to delete (retention, or left over from another node id).
    pub delete: Vec<String>,
    /// The status to write (`None`: leave it, e.g. while waiting for a deletion).
    pub status: Option<EnvoyConfigStatus>,
    /// The desired revision is still being deleted; try again shortly.
    pub wait_for_deletion: bool,
}

fn rfc3339_micros(t: Timestamp) -> String {
    format!("{t:.6}")
}

fn revision_ref(name: &str, namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(EnvoyConfigRevision::api_version(&()).to_string()),
        kind: Some(EnvoyConfigRevision::kind(&()).to_string()),
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        ..ObjectReference::default()
    }
}

/// The EnvoyConfig controller's decision for `ec` given every EnvoyConfigRevision of its
/// namespace (`all`; others' are ignored) at time `now`:
///
/// - the desired version is [`config_version`] of the spec; a new version gets a new
///   revision `<nodeID>-<envoyAPI>-<version>` (labels, controller owner reference,
///   finalizer, applied-at = now); a known one is moved to the top (applied-at = now);
///   a revision upstream MARIN3R created for the same resources is a known one, under
///   its own version ([`Revisions::find`]: adopting an upstream install duplicates
///   nothing);
/// - at most [`crate::revisions::MAX_REVISIONS`] are kept: the oldest are deleted, never
///   the desired one nor the rollback target; revisions of another node id or Envoy API
///   (the spec's nodeID was edited) are deleted;
/// - the status reports the desired and published versions, the cache state, the
///   revisions oldest → newest and the `CacheOutOfSync` / `RollbackFailed` conditions.
pub fn plan_envoyconfig<'a>(
    ec: &EnvoyConfig,
    all: impl IntoIterator<Item = &'a EnvoyConfigRevision>,
    now: Timestamp,
) -> Result<EnvoyConfigPlan, PlanError> {
    // The applied-at annotation orders the revisions: it keeps microseconds, so two
    // edits within one second stay in order. Status times have Kubernetes' seconds.
    let applied_at = rfc3339_micros(now);
    let now = truncate_to_seconds(now);
    let uid = ec
        .metadata
        .uid
        .as_deref()
        .ok_or(PlanError::MissingMetadata("uid"))?;
    if ec.metadata.name.is_none() {
        return Err(PlanError::MissingMetadata("name"));
    }
    let namespace = ec
        .metadata
        .namespace
        .as_deref()
        .ok_or(PlanError::MissingMetadata("namespace"))?;
    let owner = ec
        .controller_owner_ref(&())
        .ok_or(PlanError::MissingMetadata("name or uid"))?;
    let api = ec.spec.envoy_api.unwrap_or_default();
    let all: Vec<&EnvoyConfigRevision> = all.into_iter().collect();
    let (current, stale): (Vec<&EnvoyConfigRevision>, Vec<&EnvoyConfigRevision>) =
        siblings(all.iter().copied(), uid)
            .into_iter()
            .partition(|e| {
                e.spec.node_id == ec.spec.node_id && e.spec.envoy_api.unwrap_or_default() == api
            });
    let mut plan = EnvoyConfigPlan {
        create: None,
        touch: None,
        delete: stale.iter().map(|e| e.name_any()).collect(),
        status: None,
        wait_for_deletion: false,
    };

    let mut revisions = engine(&ec.spec.node_id, &current);
    // The desired version: that of the revision already holding the spec's resources
    // (adopted from upstream MARIN3R, it keeps upstream's version and name), else ours.
    let desired = revisions
        .find(&ec.spec)
        .map_or_else(|| config_version(&ec.spec), |r| r.version.clone());
    let desired_name = revision_name(&ec.spec.node_id, api, &desired);
    let existing = current.iter().find(|e| e.spec.version == desired).copied();
    if existing.is_none() {
        let terminating = all.iter().any(|e| {
            e.metadata.name.as_deref() == Some(desired_name.as_str())
                && e.metadata.namespace.as_deref() == Some(namespace)
                && is_deleting(&e.metadata)
        });
        if terminating {
            // The tainted revision of this very version is being deleted (to retry it):
            // its name is still taken. Its removal triggers another reconcile.
            plan.wait_for_deletion = true;
            return Ok(plan);
        }
    }

    let names: BTreeMap<String, String> = current
        .iter()
        .map(|e| (e.spec.version.clone(), e.name_any()))
        .collect();
    let was_top = current.last().map(|e| e.spec.version.as_str()) == Some(desired.as_str());
    revisions.apply(&std::sync::Arc::new(ec.spec.clone()), SystemTime::from(now));

    match existing {
        Some(e) if !was_top => plan.touch = Some((e.name_any(), applied_at)),
        Some(_) => {}
        None => {
            let mut labels = BTreeMap::new();
            labels.insert(
                marin3r_wire::NODE_ID_ANNOTATION.to_string(),
                node_id_label(&ec.spec.node_id),
            );
            labels.insert(
                marin3r_wire::CONFIG_VERSION_LABEL.to_string(),
                desired.clone(),
            );
            labels.insert(
                marin3r_wire::ENVOY_API_LABEL.to_string(),
                api.as_str().to_string(),
            );
            let mut revision = EnvoyConfigRevision::new(
                &desired_name,
                EnvoyConfigRevisionSpec::from_config(&ec.spec, desired.clone()),
            );
            revision.metadata = ObjectMeta {
                name: Some(desired_name.clone()),
                namespace: Some(namespace.to_string()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    marin3r_wire::APPLIED_AT_ANNOTATION.to_string(),
                    applied_at,
                )])),
                owner_references: Some(vec![OwnerReference {
                    block_owner_deletion: Some(true),
                    ..owner
                }]),
                finalizers: Some(vec![marin3r_wire::REVISION_FINALIZER.to_string()]),
                ..ObjectMeta::default()
            };
            plan.create = Some(revision);
        }
    }
    for e in &current {
        if !revisions
            .revisions
            .iter()
            .any(|r| r.version == e.spec.version)
        {
            plan.delete.push(e.name_any());
        }
    }

    let previous = ec.status.clone().unwrap_or_default();
    let state = revisions.cache_state();
    // What is served, and whether the elected revision waits, as the revision statuses
    // tell (the revision controller writes them).
    let served = newest_published(&current);
    let waiting = revisions
        .published()
        .and_then(|p| current.iter().find(|e| e.spec.version == p.version))
        .and_then(|e| e.status.as_ref())
        .and_then(|s| s.condition(RESOURCES_IN_SYNC))
        .filter(|c| c.status == "False")
        .map(|c| c.message.clone());
    let mut conditions = crate::status::conditions(
        state,
        Some(desired.as_str()),
        served.as_deref(),
        waiting.as_deref(),
        &previous.conditions,
        SystemTime::from(now),
    );
    for c in &mut conditions {
        c.observed_generation = ec.metadata.generation;
    }
    let revision_refs = revisions
        .revisions
        .iter()
        .map(|r| ConfigRevisionRef {
            version: r.version.clone(),
            reference: revision_ref(
                names
                    .get(&r.version)
                    .map_or(desired_name.as_str(), String::as_str),
                namespace,
            ),
        })
        .collect();
    plan.status = Some(EnvoyConfigStatus {
        cache_state: state,
        published_version: served.or(previous.published_version),
        desired_version: Some(desired),
        conditions,
        revisions: revision_refs,
    });
    Ok(plan)
}

/// What publishing an elected revision gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not the elected revision of its EnvoyConfig (or tainted): not served.
    NotElected,
    /// Served with these per-type versions.
    Published {
        versions: BTreeMap<ResourceType, String>,
    },
    /// Must never be served: `reason` is a condition reason (`ResourcesFailedToDecode`,
    /// `RejectedByEnvoy`).
    Tainted {
        reason: &'static str,
        message: String,
    },
    /// Could not be loaded for now (a Secret or EndpointSlice it needs is missing or
    /// wrong, or another EnvoyConfig holds the node id); the node keeps what it has.
    OutOfSync {
        reason: &'static str,
        message: String,
    },
}

/// Whether `new` differs from `current` only by `providesVersions` on a revision that
/// stays published and untainted: a re-publication within the same revision (an
/// EndpointSlice or Secret it reads changed), the status write that is coalesced
/// ([`super::coalesce`]). Any other change (published, tainted, a condition) is not.
pub fn republished_only(
    current: &EnvoyConfigRevisionStatus,
    new: &EnvoyConfigRevisionStatus,
) -> bool {
    if !current.is_published() || current.is_tainted() || current.last_published_at.is_none() {
        return false;
    }
    let mut same = new.clone();
    same.provides_versions
        .clone_from(&current.provides_versions);
    same == *current
}

/// The revision's new status after `outcome` (the revision controller writes it when it
/// differs from `current`):
///
/// - `published`/`RevisionPublished` follow the outcome; `lastPublishedAt` is set when
///   the revision becomes published;
/// - a taint sets `tainted` and `RevisionTainted` and is never lifted;
/// - `ResourcesInSync` is true once published with the current Secrets/EndpointSlices,
///   false (with the reason) while they cannot be loaded.
pub fn plan_revision_status(
    current: &EnvoyConfigRevisionStatus,
    generation: Option<i64>,
    outcome: &Outcome,
    now: Timestamp,
) -> EnvoyConfigRevisionStatus {
    let now = truncate_to_seconds(now);
    let mut s = current.clone();
    let unpublish = |s: &mut EnvoyConfigRevisionStatus, reason: &str, message: String| {
        if s.published.is_some() || s.condition(REVISION_PUBLISHED).is_some() {
            s.published = Some(false);
            set_condition(
                &mut s.conditions,
                REVISION_PUBLISHED,
                false,
                reason,
                message,
                generation,
                now,
            );
        }
    };
    match outcome {
        Outcome::NotElected if current.is_tainted() => {
            unpublish(&mut s, "Tainted", "the revision is tainted".to_string());
        }
        Outcome::NotElected => unpublish(
            &mut s,
            "NotPublished",
            "another revision of the EnvoyConfig is published".to_string(),
        ),
        Outcome::Published { versions } => {
            if !current.is_published() || current.last_published_at.is_none() {
                s.last_published_at = Some(Time(now));
            }
            s.published = Some(true);
            s.provides_versions = Some(VersionTracker::from_versions(versions));
            set_condition(
                &mut s.conditions,
                REVISION_PUBLISHED,
                true,
                // Upstream MARIN3R's reasons (docs/migrating.md).
                "VersionPublished",
                "the revision is served by the discovery service",
                generation,
                now,
            );
            set_condition(
                &mut s.conditions,
                RESOURCES_IN_SYNC,
                true,
                "ResourcesSynced",
                "",
                generation,
                now,
            );
        }
        Outcome::Tainted { reason, message } => {
            s.tainted = Some(true);
            set_condition(
                &mut s.conditions,
                REVISION_TAINTED,
                true,
                reason,
                message.clone(),
                generation,
                now,
            );
            s.published = Some(false);
            set_condition(
                &mut s.conditions,
                REVISION_PUBLISHED,
                false,
                "Tainted",
                "the revision is tainted",
                generation,
                now,
            );
        }
        Outcome::OutOfSync { reason, message } => {
            set_condition(
                &mut s.conditions,
                RESOURCES_IN_SYNC,
                false,
                reason,
                message.clone(),
                generation,
                now,
            );
        }
    }
    s
}

/// Names of the Secrets a revision reads.
pub fn referenced_secrets(spec: &EnvoyConfigRevisionSpec) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in spec.resources.iter().flatten() {
        if let Some(s) = &r.generate_from_tls_secret {
            names.push(s.clone());
        }
        if let Some(o) = &r.generate_from_opaque_secret {
            names.push(o.name.clone());
        }
    }
    for s in spec.envoy_resources.iter().flat_map(|d| &d.secrets) {
        let name = s
            .reference
            .as_ref()
            .and_then(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| s.name.clone());
        names.push(name);
    }
    names.sort();
    names.dedup();
    names
}

/// Whether `labels` match a `generateFromEndpointSlices` selector. No selector matches
/// nothing (as a null selector in Kubernetes policy objects); `{}` matches everything;
/// an invalid selector matches nothing.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    label_matcher(selector)(labels)
}

/// [`selector_matches`] with the selector checked once, for matching many label sets:
/// Kubernetes' rules (kube's `Selector` gives the same answers, tested below), read
/// from the selector itself, nothing copied or parsed per label set (the churn
/// profile: parsing a copy per revision and slice event was 13 % of the discovery
/// service's CPU).
pub fn label_matcher(
    selector: Option<&LabelSelector>,
) -> impl Fn(&BTreeMap<String, String>) -> bool + '_ {
    let valid = selector.filter(|s| {
        s.match_expressions
            .iter()
            .flatten()
            .all(|e| match e.operator.as_str() {
                "In" | "NotIn" => e.values.is_some(),
                "Exists" | "DoesNotExist" => true,
                _ => false,
            })
    });
    move |labels| {
        valid.is_some_and(|s| {
            let equal = s
                .match_labels
                .iter()
                .flatten()
                .all(|(k, v)| labels.get(k) == Some(v));
            equal
                && s.match_expressions.iter().flatten().all(|e| {
                    let value = labels.get(&e.key);
                    let listed = |v: &String| e.values.iter().flatten().any(|x| x == v);
                    match e.operator.as_str() {
                        "In" => value.is_some_and(listed),
                        "NotIn" => !value.is_some_and(listed),
                        "Exists" => value.is_some(),
                        _ => value.is_none(),
                    }
                })
        })
    }
}

/// The `key=value` pairs every label set `selector` matches must carry (its
/// `matchLabels` and its one-value `In` expressions): what an index by label can
/// narrow the candidates with before [`label_matcher`] decides.
pub fn required_labels(selector: &LabelSelector) -> Vec<(&str, &str)> {
    let equal = (selector.match_labels.iter().flatten()).map(|(k, v)| (k.as_str(), v.as_str()));
    let one_of = (selector.match_expressions.iter().flatten()).filter_map(|e| {
        match (e.operator.as_str(), e.values.as_deref()) {
            ("In", Some([v])) => Some((e.key.as_str(), v.as_str())),
            _ => None,
        }
    });
    equal.chain(one_of).collect()
}

/// Whether a revision generates endpoints from slices with these labels.
pub fn uses_endpoint_slices(
    spec: &EnvoyConfigRevisionSpec,
    labels: &BTreeMap<String, String>,
) -> bool {
    spec.resources
        .iter()
        .flatten()
        .filter_map(|r| r.generate_from_endpoint_slices.as_ref())
        .any(|g| selector_matches(g.selector.as_ref(), labels))
}

/// A label selector for `key=value` (used to watch injected pods only).
pub fn equality_selector(key: &str, value: &str) -> String {
    Selector::from(Expression::Equal(key.to_string(), value.to_string())).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use marin3r_envoyconfig::envoyconfig::CacheState;
    use marin3r_envoyconfig::envoyconfig::EnvoyConfigSpec;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn spec(port: u64) -> EnvoyConfigSpec {
        EnvoyConfigSpec::clone(&crate::fixtures::spec(port))
    }

    fn ec(port: u64) -> EnvoyConfig {
        let mut ec = EnvoyConfig::new("kuard", spec(port));
        ec.metadata.namespace = Some("default".into());
        ec.metadata.uid = Some("ec-uid".into());
        ec.metadata.generation = Some(1);
        ec
    }

    /// The revision the plan creates for `port`, as the API server returns it.
    fn ecr(
        port: u64,
        applied: i64,
        status: Option<EnvoyConfigRevisionStatus>,
    ) -> EnvoyConfigRevision {
        let plan = plan_envoyconfig(&ec(port), [], ts(applied)).unwrap();
        let mut ecr = plan.create.unwrap();
        ecr.metadata.creation_timestamp = Some(Time(ts(applied)));
        ecr.status = status;
        ecr
    }

    fn published() -> Option<EnvoyConfigRevisionStatus> {
        Some(EnvoyConfigRevisionStatus {
            published: Some(true),
            ..Default::default()
        })
    }

    fn tainted() -> Option<EnvoyConfigRevisionStatus> {
        Some(EnvoyConfigRevisionStatus {
            tainted: Some(true),
            published: Some(false),
            ..Default::default()
        })
    }

    fn condition<'a>(
        s: &'a EnvoyConfigStatus,
        t: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn names_are_upstreams_when_valid_else_sanitized() {
        let cases = [
            ("kuard", "kuard-v3-abc"),
            ("envoy.example", "envoy.example-v3-abc"),
            ("My_Node", "my-node-"),
            ("__", ""),
        ];
        for (node, prefix) in cases {
            let name = revision_name(node, EnvoyApi::V3, "abc");
            assert!(is_dns1123_subdomain(&name), "{node} → {name}");
            assert!(name.starts_with(prefix), "{node} → {name}");
            assert!(name.ends_with("-v3-abc"), "{node} → {name}");
        }
        assert_ne!(
            revision_name("A", EnvoyApi::V3, "x"),
            revision_name("a_", EnvoyApi::V3, "x"),
            "sanitized names keep a hash of the original"
        );
        let long = "n".repeat(300);
        let name = revision_name(&long, EnvoyApi::V3, "0123456789abcdef");
        assert!(
            is_dns1123_subdomain(&name) && name.len() <= 253,
            "{}",
            name.len()
        );
        for (value, ok) in [
            ("kuard", true),
            ("a.b_c-d", true),
            ("-a", false),
            ("", true),
        ] {
            assert_eq!(is_label_value(value), ok, "{value}");
        }
        assert!(is_label_value(&node_id_label(&long)));
        assert!(is_label_value(&node_id_label("My Node!")));
        assert_eq!(node_id_label("kuard"), "kuard");
    }

    #[test]
    fn new_envoyconfig_creates_a_labelled_owned_revision() {
        let plan = plan_envoyconfig(&ec(1), [], ts(0)).unwrap();
        let created = plan.create.unwrap();
        let version = config_version(&spec(1));
        assert_eq!(
            created.metadata.name.as_deref(),
            Some(format!("kuard-v3-{version}").as_str())
        );
        let labels = created.metadata.labels.unwrap();
        assert_eq!(labels[marin3r_wire::NODE_ID_ANNOTATION], "kuard");
        assert_eq!(labels[marin3r_wire::CONFIG_VERSION_LABEL], version);
        assert_eq!(labels[marin3r_wire::ENVOY_API_LABEL], "v3");
        let owner = &created.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("EnvoyConfig", "ec-uid", Some(true))
        );
        assert_eq!(
            created.metadata.finalizers.unwrap(),
            [marin3r_wire::REVISION_FINALIZER]
        );
        assert_eq!(created.spec.version, version);
        assert_eq!(created.spec.envoy_api, Some(EnvoyApi::V3));
        let status = plan.status.unwrap();
        assert_eq!(status.cache_state, Some(CacheState::InSync));
        assert_eq!(status.desired_version.as_deref(), Some(version.as_str()));
        assert_eq!(
            status.published_version, None,
            "publishedVersion is what is served: nothing yet"
        );
        assert_eq!(status.revisions.len(), 1);
        assert_eq!(
            condition(&status, CACHE_OUT_OF_SYNC).reason,
            "PublishPending"
        );
        assert_eq!(condition(&status, ROLLBACK_FAILED).status, "False");
        assert!(plan.delete.is_empty() && plan.touch.is_none());
    }

    /// Two edits within one second: the second spec's revision is on top (its applied-at
    /// keeps microseconds), so nothing is re-applied; with whole seconds the two tied and
    /// their names decided, and the reconciles touched them in turn until the second
    /// rolled over.
    #[test]
    fn two_edits_in_one_second_stay_in_order() {
        let at = |millis: i64| Timestamp::from_millisecond(1_700_000_000_000 + millis).unwrap();
        let first = plan_envoyconfig(&ec(1), [], at(100))
            .unwrap()
            .create
            .unwrap();
        let second = plan_envoyconfig(&ec(2), [&first], at(600)).unwrap();
        let second = second.create.unwrap();
        assert_eq!(
            second.annotations()[marin3r_wire::APPLIED_AT_ANNOTATION],
            "2023-11-14T22:13:20.600000Z"
        );
        for (a, b) in [(&first, &second), (&second, &first)] {
            let again = plan_envoyconfig(&ec(2), [a, b], at(900)).unwrap();
            assert_eq!(again.touch, None, "the newest spec is already on top");
            assert!(again.create.is_none());
        }
    }

    /// (case, existing revisions as (port, applied-at, status), desired port) →
    /// (created?, touched port, deleted ports, state, served port (the revision whose
    /// status says published; 0: none), CacheOutOfSync)
    #[test]
    fn envoyconfig_plans() {
        type Row = (
            &'static str,
            Vec<(u64, i64, Option<EnvoyConfigRevisionStatus>)>,
            u64,
            bool,
            Option<u64>,
            Vec<u64>,
            CacheState,
            u64,
            bool,
        );
        let rows: Vec<Row> = vec![
            (
                "in sync, nothing to do",
                vec![(1, 0, published())],
                1,
                false,
                None,
                vec![],
                CacheState::InSync,
                1,
                false,
            ),
            (
                "spec change adds a revision",
                vec![(1, 0, published())],
                2,
                true,
                None,
                vec![],
                CacheState::InSync,
                1,
                true,
            ),
            (
                "desired tainted: rollback",
                vec![(1, 0, published()), (2, 1, tainted())],
                2,
                false,
                None,
                vec![],
                CacheState::Rollback,
                1,
                true,
            ),
            (
                "all tainted: rollback failed",
                vec![(1, 0, tainted()), (2, 1, tainted())],
                2,
                false,
                None,
                vec![],
                CacheState::RollbackFailed,
                0,
                true,
            ),
            (
                "known version moves to the top",
                vec![(1, 0, None), (2, 1, published())],
                1,
                false,
                Some(1),
                vec![],
                CacheState::InSync,
                2,
                true,
            ),
            (
                "tainted known version moved up stays tainted",
                vec![(2, 0, tainted()), (1, 1, published())],
                2,
                false,
                Some(2),
                vec![],
                CacheState::Rollback,
                1,
                true,
            ),
        ];
        for (
            case,
            existing,
            desired,
            created,
            touched,
            deleted,
            state,
            published_port,
            out_of_sync,
        ) in rows
        {
            let ecrs: Vec<EnvoyConfigRevision> =
                existing.into_iter().map(|(p, t, s)| ecr(p, t, s)).collect();
            let plan = plan_envoyconfig(&ec(desired), &ecrs, ts(100)).unwrap();
            assert_eq!(plan.create.is_some(), created, "{case}");
            let name = |p: u64| revision_name("kuard", EnvoyApi::V3, &config_version(&spec(p)));
            assert_eq!(
                plan.touch.as_ref().map(|t| t.0.clone()),
                touched.map(name),
                "{case}"
            );
            assert_eq!(
                plan.delete,
                deleted.into_iter().map(name).collect::<Vec<_>>(),
                "{case}"
            );
            let status = plan.status.unwrap();
            assert_eq!(status.cache_state, Some(state), "{case}");
            if published_port == 0 {
                assert_eq!(status.published_version, None, "{case}");
            } else {
                assert_eq!(
                    status.published_version,
                    Some(config_version(&spec(published_port))),
                    "{case}"
                );
            }
            assert_eq!(
                condition(&status, CACHE_OUT_OF_SYNC).status == "True",
                out_of_sync,
                "{case}"
            );
            assert_eq!(
                condition(&status, ROLLBACK_FAILED).status == "True",
                state == CacheState::RollbackFailed,
                "{case}"
            );
            let versions: Vec<&str> = status
                .revisions
                .iter()
                .map(|r| r.version.as_str())
                .collect();
            assert_eq!(
                versions.last().copied(),
                Some(config_version(&spec(desired)).as_str()),
                "{case}: newest last"
            );
        }
    }

    #[test]
    fn retention_deletes_the_oldest_but_keeps_the_rollback_target() {
        let mut ecrs: Vec<EnvoyConfigRevision> = vec![ecr(100, 0, published())];
        for i in 1..10 {
            ecrs.push(ecr(i, i as i64, tainted()));
        }
        let plan = plan_envoyconfig(&ec(50), &ecrs, ts(100)).unwrap();
        assert!(plan.create.is_some());
        let oldest_tainted = revision_name("kuard", EnvoyApi::V3, &config_version(&spec(1)));
        assert_eq!(
            plan.delete,
            [oldest_tainted],
            "the published (rollback target) survives"
        );
    }

    /// A revision as upstream MARIN3R leaves it for `port`: its version is another hash
    /// (`up<port>`), its name `<nodeID>-<envoyAPI>-<version>`, no applied-at annotation
    /// (ordered by `lastPublishedAt`, then creation, as upstream sorts).
    fn upstream_ecr(
        port: u64,
        published_at: i64,
        status: Option<EnvoyConfigRevisionStatus>,
    ) -> EnvoyConfigRevision {
        let mut e = ecr(port, published_at, status);
        let version = format!("up{port}");
        e.spec.version = version.clone();
        e.spec.serialization = None;
        e.metadata.name = Some(format!("kuard-v3-{version}"));
        e.metadata.annotations = None;
        e.metadata.creation_timestamp = Some(Time(ts(0)));
        if let Some(labels) = e.metadata.labels.as_mut() {
            labels.insert(marin3r_wire::CONFIG_VERSION_LABEL.to_string(), version);
        }
        if let Some(s) = e.status.as_mut() {
            s.last_published_at = Some(Time(ts(published_at)));
        }
        e
    }

    #[test]
    fn upstream_revisions_are_adopted_by_content_and_trimmed_by_the_same_retention() {
        // Upstream's published revision holds the spec: nothing to create or move.
        let upstream: Vec<EnvoyConfigRevision> = (1..=10)
            .map(|p| {
                let status = match p {
                    10 => published(),
                    7 => tainted(),
                    _ => Some(EnvoyConfigRevisionStatus {
                        published: Some(false),
                        ..Default::default()
                    }),
                };
                upstream_ecr(p, p as i64, status)
            })
            .collect();
        let plan = plan_envoyconfig(&ec(10), &upstream, ts(100)).unwrap();
        assert!(plan.create.is_none() && plan.touch.is_none() && plan.delete.is_empty());
        let status = plan.status.unwrap();
        assert_eq!(status.desired_version.as_deref(), Some("up10"));
        assert_eq!(status.published_version.as_deref(), Some("up10"));
        assert_eq!(status.cache_state, Some(CacheState::InSync));
        assert_eq!(status.revisions.len(), 10);

        // Re-applying the tainted spec moves upstream's revision up, tainted: rollback.
        let plan = plan_envoyconfig(&ec(7), &upstream, ts(100)).unwrap();
        assert!(plan.create.is_none());
        assert_eq!(plan.touch.map(|t| t.0).as_deref(), Some("kuard-v3-up7"));
        assert_eq!(plan.status.unwrap().cache_state, Some(CacheState::Rollback));

        // A new spec: one revision of ours, and the oldest upstream one goes.
        let plan = plan_envoyconfig(&ec(11), &upstream, ts(100)).unwrap();
        assert!(plan.create.is_some());
        assert_eq!(plan.delete, ["kuard-v3-up1"]);
    }

    #[test]
    fn revisions_of_other_owners_or_terminating_are_ignored_and_a_renamed_node_is_cleaned_up() {
        let mut foreign = ecr(1, 0, published());
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        let plan = plan_envoyconfig(&ec(1), [&foreign], ts(1)).unwrap();
        assert!(
            plan.create.is_some(),
            "another EnvoyConfig's revision is not ours"
        );
        assert!(plan.delete.is_empty());

        let mut terminating = ecr(1, 0, tainted());
        terminating.metadata.deletion_timestamp = Some(Time(ts(1)));
        let plan = plan_envoyconfig(&ec(1), [&terminating], ts(2)).unwrap();
        assert!(plan.wait_for_deletion && plan.create.is_none() && plan.status.is_none());

        let old = ecr(1, 0, published());
        let mut renamed = ec(1);
        renamed.spec.node_id = "kuard2".into();
        let plan = plan_envoyconfig(&renamed, [&old], ts(2)).unwrap();
        assert_eq!(plan.delete, [old.metadata.name.clone().unwrap()]);
        assert!(
            plan.create
                .unwrap()
                .metadata
                .name
                .unwrap()
                .starts_with("kuard2-v3-")
        );
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let first = ecr(1, 0, published());
        let mut config = ec(1);
        config.status = plan_envoyconfig(&config, [&first], ts(10)).unwrap().status;
        let again = plan_envoyconfig(&config, [&first], ts(20))
            .unwrap()
            .status
            .unwrap();
        assert_eq!(
            Some(&again),
            config.status.as_ref(),
            "idempotent: nothing to write"
        );
        assert_eq!(
            condition(&again, CACHE_OUT_OF_SYNC).last_transition_time,
            Time(ts(10))
        );
    }

    #[test]
    fn missing_metadata_is_an_error_not_a_panic() {
        let mut no_uid = ec(1);
        no_uid.metadata.uid = None;
        assert_eq!(
            plan_envoyconfig(&no_uid, [], ts(0)),
            Err(PlanError::MissingMetadata("uid"))
        );
    }

    #[test]
    fn election_is_the_topmost_untainted() {
        let a = ecr(1, 0, published());
        let b = ecr(2, 1, None);
        let c = ecr(3, 2, tainted());
        let all = [c.clone(), a.clone(), b.clone()];
        let ordered = siblings(&all, "ec-uid");
        let names: Vec<String> = ordered.iter().map(|e| e.name_any()).collect();
        assert_eq!(names, [a.name_any(), b.name_any(), c.name_any()]);
        assert_eq!(elected(&ordered).map(|e| e.name_any()), Some(b.name_any()));
        assert_eq!(elected(&[&c]), None);
    }

    /// (case, current status, outcome) → (published, tainted, ResourcesInSync, lastPublishedAt changed)
    #[test]
    fn revision_status_plans() {
        let versions = BTreeMap::from([(ResourceType::Listener, "L1".to_string())]);
        let was_published = EnvoyConfigRevisionStatus {
            published: Some(true),
            last_published_at: Some(Time(ts(0))),
            ..Default::default()
        };
        type Row = (
            &'static str,
            EnvoyConfigRevisionStatus,
            Outcome,
            Option<bool>,
            bool,
            Option<&'static str>,
            bool,
        );
        let rows: Vec<Row> = vec![
            (
                "first publication",
                Default::default(),
                Outcome::Published {
                    versions: versions.clone(),
                },
                Some(true),
                false,
                Some("True"),
                true,
            ),
            (
                "re-publication keeps the time",
                was_published.clone(),
                Outcome::Published {
                    versions: versions.clone(),
                },
                Some(true),
                false,
                Some("True"),
                false,
            ),
            (
                "never published, not elected: untouched",
                Default::default(),
                Outcome::NotElected,
                None,
                false,
                None,
                false,
            ),
            (
                "superseded",
                was_published.clone(),
                Outcome::NotElected,
                Some(false),
                false,
                None,
                false,
            ),
            (
                "tainted stays unpublished",
                EnvoyConfigRevisionStatus {
                    tainted: Some(true),
                    published: Some(false),
                    ..Default::default()
                },
                Outcome::NotElected,
                Some(false),
                true,
                None,
                false,
            ),
            (
                "decode failure taints",
                Default::default(),
                Outcome::Tainted {
                    reason: "ResourcesFailedToDecode",
                    message: "bad".into(),
                },
                Some(false),
                true,
                None,
                false,
            ),
            (
                "missing secret waits",
                was_published.clone(),
                Outcome::OutOfSync {
                    reason: "SecretNotReady",
                    message: "secret \"x\" not found".into(),
                },
                Some(true),
                false,
                Some("False"),
                false,
            ),
        ];
        for (case, current, outcome, published, tainted, in_sync, time_changed) in rows {
            let s = plan_revision_status(&current, Some(1), &outcome, ts(50));
            assert_eq!(s.published, published, "{case}");
            assert_eq!(s.is_tainted(), tainted, "{case}");
            assert_eq!(
                s.condition(RESOURCES_IN_SYNC).map(|c| c.status.as_str()),
                in_sync,
                "{case}"
            );
            assert_eq!(
                s.last_published_at != current.last_published_at,
                time_changed,
                "{case}"
            );
            if let Outcome::Tainted { reason, .. } = &outcome {
                assert_eq!(s.condition(REVISION_TAINTED).unwrap().reason, *reason);
            }
            if let Outcome::Published { .. } = outcome {
                assert_eq!(
                    s.provides_versions.as_ref().unwrap().listeners.as_deref(),
                    Some("L1")
                );
                assert_eq!(s.condition(REVISION_PUBLISHED).unwrap().status, "True");
            }
            let again = plan_revision_status(&s, Some(1), &outcome, ts(60));
            assert_eq!(again, s, "{case}: idempotent");
        }
    }

    /// One owner rule: the controller reference of kind EnvoyConfig, nothing else.
    #[test]
    fn the_owner_is_the_controller_envoyconfig() {
        let reference = |kind: &str, uid: &str, controller: Option<bool>| OwnerReference {
            api_version: "marin3r.3scale.net/v1alpha1".into(),
            kind: kind.into(),
            name: "kuard".into(),
            uid: uid.into(),
            controller,
            ..Default::default()
        };
        let mut r = ecr(8080, 0, None);
        for (refs, want) in [
            (vec![reference("EnvoyConfig", "a", Some(true))], Some("a")),
            (vec![reference("EnvoyConfig", "a", None)], None),
            (vec![reference("Deployment", "d", Some(true))], None),
            (
                vec![
                    reference("Deployment", "d", Some(true)),
                    reference("EnvoyConfig", "b", Some(false)),
                    reference("EnvoyConfig", "c", Some(true)),
                ],
                Some("c"),
            ),
        ] {
            r.metadata.owner_references = Some(refs);
            assert_eq!(controller_uid(&r), want);
            assert_eq!(owner(&r.metadata).map(|o| o.uid.as_str()), want);
            assert!(!owned_by(&r, "d"), "a Deployment never owns a revision");
        }
    }

    /// Only a re-publication within the same published revision is coalesced: the
    /// first publication, a taint, a wait or an unpublication are written at once.
    #[test]
    fn only_a_republication_within_the_revision_is_coalescable() {
        let versions = |v: &str| Outcome::Published {
            versions: [(ResourceType::Endpoint, v.to_string())].into(),
        };
        let first = plan_revision_status(&Default::default(), Some(1), &versions("E1"), ts(0));
        assert!(
            !republished_only(&Default::default(), &first),
            "first publication"
        );
        let again = plan_revision_status(&first, Some(1), &versions("E2"), ts(10));
        assert!(republished_only(&first, &again), "new endpoints");
        assert!(republished_only(&first, &first), "nothing changed");
        for outcome in [
            Outcome::Tainted {
                reason: "NACK",
                message: "rejected".into(),
            },
            Outcome::OutOfSync {
                reason: "DependenciesNotReady",
                message: "slice".into(),
            },
            Outcome::NotElected,
        ] {
            let s = plan_revision_status(&first, Some(1), &outcome, ts(10));
            assert!(!republished_only(&first, &s), "{outcome:?}");
        }
        let mut tainted = first.clone();
        tainted.tainted = Some(true);
        let s = plan_revision_status(&tainted, Some(1), &versions("E2"), ts(10));
        assert!(!republished_only(&tainted, &s), "tainted");
    }

    /// The native matcher answers as kube's `Selector` does (the reference), over
    /// every operator, a bad one, missing values and label sets with and without
    /// each key; and the required labels are ones every matched set carries.
    #[test]
    fn the_label_matcher_agrees_with_kube_selectors() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        use kube::core::SelectorExt as _;
        let req = |key: &str, op: &str, values: Option<&[&str]>| LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        };
        let mut selectors = vec![LabelSelector::default()];
        let labels_of = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        for ml in [
            None,
            Some(labels_of(&[("app", "a")])),
            Some(labels_of(&[("app", "a"), ("t", "1")])),
        ] {
            for e in [
                None,
                Some(vec![req("t", "In", Some(&["1"]))]),
                Some(vec![req("t", "In", Some(&["1", "2"]))]),
                Some(vec![req("t", "In", Some(&[]))]),
                Some(vec![req("t", "In", None)]),
                Some(vec![req("t", "NotIn", Some(&["1"]))]),
                Some(vec![req("t", "NotIn", None)]),
                Some(vec![req("t", "Exists", None)]),
                Some(vec![req("t", "DoesNotExist", None)]),
                Some(vec![req("t", "Sideways", Some(&["1"]))]),
                Some(vec![
                    req("app", "Exists", None),
                    req("t", "NotIn", Some(&["2"])),
                ]),
            ] {
                selectors.push(LabelSelector {
                    match_labels: ml.clone(),
                    match_expressions: e,
                });
            }
        }
        let sets = [
            labels_of(&[]),
            labels_of(&[("app", "a")]),
            labels_of(&[("app", "b")]),
            labels_of(&[("app", "a"), ("t", "1")]),
            labels_of(&[("app", "a"), ("t", "2")]),
            labels_of(&[("t", "1")]),
        ];
        for selector in &selectors {
            let reference = Selector::try_from(selector.clone()).ok();
            let ours = label_matcher(Some(selector));
            for labels in &sets {
                let want = reference.as_ref().is_some_and(|s| s.matches(labels));
                assert_eq!(ours(labels), want, "{selector:?} on {labels:?}");
                if want {
                    for (k, v) in required_labels(selector) {
                        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{selector:?}");
                    }
                }
            }
        }
        assert!(
            !label_matcher(None)(&sets[1]),
            "no selector matches nothing"
        );
    }

    #[test]
    fn references_and_selectors() {
        let spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "n",
            "resources": [
                {"type": "secret", "generateFromTlsSecret": "tls"},
                {"type": "secret", "generateFromOpaqueSecret": {"name": "opaque", "key": "k", "alias": "a"}},
                {"type": "endpoint", "generateFromEndpointSlices": {"clusterName": "c", "targetPort": "http",
                    "selector": {"matchLabels": {"app": "kuard"}}}}
            ]
        }))
        .unwrap();
        let rev = EnvoyConfigRevisionSpec::from_config(&spec, "v");
        assert_eq!(referenced_secrets(&rev), ["opaque", "tls"]);
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(uses_endpoint_slices(
            &rev,
            &labels(&[("app", "kuard"), ("x", "y")])
        ));
        assert!(!uses_endpoint_slices(&rev, &labels(&[("app", "other")])));
        let deprecated: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "n",
            "envoyResources": {"secrets": [{"name": "a"}, {"name": "b", "ref": {"name": "c", "namespace": "x"}}]}
        }))
        .unwrap();
        assert_eq!(
            referenced_secrets(&EnvoyConfigRevisionSpec::from_config(&deprecated, "v")),
            ["a", "c"]
        );

        let expr = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["web".into()]),
            }]),
            ..Default::default()
        };
        assert!(selector_matches(Some(&expr), &labels(&[("tier", "web")])));
        assert!(!selector_matches(Some(&expr), &labels(&[("tier", "db")])));
        assert!(selector_matches(
            Some(&LabelSelector::default()),
            &labels(&[])
        ));
        assert!(!selector_matches(None, &labels(&[("tier", "web")])));
        assert_eq!(
            equality_selector("marin3r.3scale.net/status", "enabled"),
            "marin3r.3scale.net/status=enabled"
        );
    }
}
