//! The self-healing revision engine (design.md §4), sans-I/O: one [`Revisions`] per
//! EnvoyConfig. Inputs are "this spec is desired", "these resources failed to decode",
//! NACK statistics and deletions; outputs are which revision to publish, which to taint
//! and the status to show. Local mode keeps it in memory; Kubernetes mode mirrors it into
//! EnvoyConfigRevision objects.
//!
//! Rules:
//! - a revision is identified by the hash of `spec.resources` (+ the deprecated form);
//!   applying a known hash moves that revision to the top (it keeps its taint); a
//!   revision that holds the same resources under another version (one upstream MARIN3R
//!   created: its versions are a different hash) is that revision, adopted, and keeps
//!   its version ([`same_resources`]);
//! - the published revision is the topmost untainted one; the state is `InSync` when it is
//!   the desired (topmost) one, `Rollback` when it is older, `RollbackFailed` when every
//!   revision is tainted (the last good snapshot keeps being served);
//! - a revision is tainted when its resources fail to decode, or when **every** pod
//!   subscribed for the node has NACKed one of the versions it publishes at least
//!   `threshold` times; partial rejection never taints; a taint is never lifted, but
//!   removing the revision lets the same spec be tried again (fresh, untainted);
//! - at most [`MAX_REVISIONS`] are kept: the oldest goes first, except the desired one and
//!   the newest untainted one below it (the rollback target).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use marin3r_envoyconfig::config_version;
use marin3r_envoyconfig::envoyconfig::{CacheState, EnvoyConfigSpec};
use marin3r_envoyconfig::resource::ResourceType;

/// Revisions kept per EnvoyConfig.
pub const MAX_REVISIONS: usize = 10;
/// Default `--nack-threshold`: NACKs per pod before a version counts as rejected.
pub const DEFAULT_NACK_THRESHOLD: u64 = 5;

pub use crate::nacks::{NackView, Taint};

/// One revision of an EnvoyConfig.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// [`config_version`] of `spec`.
    pub version: String,
    /// The spec this revision publishes (shared with the EnvoyConfig it came from and
    /// the served revision: one copy in memory however many hold it).
    pub spec: Arc<EnvoyConfigSpec>,
    pub created_at: SystemTime,
    /// When it was last made the published revision.
    pub last_published_at: Option<SystemTime>,
    /// Why it is tainted (never cleared).
    pub tainted: Option<String>,
    /// Per-type versions of the snapshot it published last (`providesVersions`).
    pub provides_versions: BTreeMap<ResourceType, String>,
}

impl Revision {
    /// The NACK verdict on the versions it provides to `node_id`
    /// ([`crate::nacks::nack_verdict`]).
    pub fn nack_verdict(
        &self,
        node_id: &str,
        nacks: &dyn NackView,
        threshold: u64,
    ) -> Option<Taint> {
        crate::nacks::nack_verdict(
            node_id,
            &self.version,
            &self.provides_versions,
            nacks,
            threshold,
        )
    }
}

/// Whether two specs publish the same resources: the same `resources` and deprecated
/// `envoyResources`, and (only for the latter, the one it applies to) the same
/// `serialization`. The identity of a revision whose version is not our hash of its
/// resources: upstream MARIN3R names versions by a hash of its Go structures, which
/// cannot be recomputed here, and copies neither `serialization` nor `envoyResources`
/// into its revisions (it converts the latter to `resources` first).
pub fn same_resources(a: &EnvoyConfigSpec, b: &EnvoyConfigSpec) -> bool {
    a.resources == b.resources
        && a.envoy_resources == b.envoy_resources
        && (a.envoy_resources.is_none()
            || a.serialization.unwrap_or_default() == b.serialization.unwrap_or_default())
}

/// The revisions of one EnvoyConfig, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revisions {
    pub node_id: String,
    /// Oldest → newest; the last one is the desired revision.
    pub revisions: Vec<Revision>,
}

impl Revisions {
    pub fn new(node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            revisions: Vec::new(),
        }
    }

    /// Makes `spec` the desired revision: a new version is added on top, a known one is
    /// moved to the top (keeping its taint). Returns its version (an adopted revision's
    /// own, see [`find`](Self::find)).
    pub fn apply(&mut self, spec: &Arc<EnvoyConfigSpec>, now: SystemTime) -> String {
        let version = config_version(spec);
        let rev = match self.position_of(spec, &version) {
            Some(i) => self.revisions.remove(i),
            None => Revision {
                version,
                spec: Arc::clone(spec),
                created_at: now,
                last_published_at: None,
                tainted: None,
                provides_versions: BTreeMap::new(),
            },
        };
        let version = rev.version.clone();
        self.revisions.push(rev);
        self.trim();
        version
    }

    fn position(&self, version: &str) -> Option<usize> {
        self.revisions.iter().position(|r| r.version == version)
    }

    /// The revision of `spec` (whose [`config_version`] is `version`): the one with that
    /// version, else one holding the same resources under another version.
    fn position_of(&self, spec: &EnvoyConfigSpec, version: &str) -> Option<usize> {
        self.position(version).or_else(|| {
            self.revisions
                .iter()
                .position(|r| same_resources(&r.spec, spec))
        })
    }

    /// The revision that holds `spec`, by version or, for a revision adopted from
    /// upstream MARIN3R, by content ([`same_resources`]).
    pub fn find(&self, spec: &EnvoyConfigSpec) -> Option<&Revision> {
        self.position_of(spec, &config_version(spec))
            .and_then(|i| self.revisions.get(i))
    }

    /// Drops the oldest revisions beyond [`MAX_REVISIONS`]. Never dropped: the desired
    /// (top) revision and the newest untainted one below it, the rollback target should
    /// the desired one be rejected.
    fn trim(&mut self) {
        while self.revisions.len() > MAX_REVISIONS {
            let below_top = self.revisions.len().saturating_sub(1);
            let rollback_target = self.revisions[..below_top]
                .iter()
                .rposition(|r| r.tainted.is_none());
            let Some(i) = (0..below_top).find(|i| Some(*i) != rollback_target) else {
                return;
            };
            self.revisions.remove(i);
        }
    }

    /// The desired (topmost) revision.
    pub fn desired(&self) -> Option<&Revision> {
        self.revisions.last()
    }

    /// The revision to serve: the topmost untainted one.
    pub fn published(&self) -> Option<&Revision> {
        self.revisions.iter().rev().find(|r| r.tainted.is_none())
    }

    /// `InSync`, `Rollback` or `RollbackFailed` (`None` before any apply).
    pub fn cache_state(&self) -> Option<CacheState> {
        let desired = self.desired()?;
        Some(match self.published() {
            Some(p) if p.version == desired.version => CacheState::InSync,
            Some(_) => CacheState::Rollback,
            None => CacheState::RollbackFailed,
        })
    }

    /// Taints `version` (no-op if unknown or already tainted). Returns whether it changed.
    pub fn taint(&mut self, version: &str, reason: impl Into<String>) -> bool {
        match self.revisions.iter_mut().find(|r| r.version == version) {
            Some(r) if r.tainted.is_none() => {
                r.tainted = Some(reason.into());
                true
            }
            _ => false,
        }
    }

    /// Deletes a revision (a user deleting an EnvoyConfigRevision). Re-applying its spec
    /// later creates it afresh, untainted.
    pub fn remove(&mut self, version: &str) -> bool {
        match self.position(version) {
            Some(i) => {
                self.revisions.remove(i);
                true
            }
            None => false,
        }
    }

    /// Records that `version` is now served with these per-type versions. Returns
    /// whether that is news: its first publication, or a snapshot whose versions differ
    /// from those it provided (then `lastPublishedAt` is `now`); `false` for an unknown
    /// version.
    pub fn mark_published(
        &mut self,
        version: &str,
        provides: BTreeMap<ResourceType, String>,
        now: SystemTime,
    ) -> bool {
        let Some(r) = self.revisions.iter_mut().find(|r| r.version == version) else {
            return false;
        };
        let news = r.last_published_at.is_none() || r.provides_versions != provides;
        if news {
            r.last_published_at = Some(now);
            r.provides_versions = provides;
        }
        news
    }

    /// Like [`mark_published`](Self::mark_published) for a revision that has just become
    /// the published one (first time, rollback, retry): `lastPublishedAt` is always `now`.
    pub fn mark_newly_published(
        &mut self,
        version: &str,
        provides: BTreeMap<ResourceType, String>,
        now: SystemTime,
    ) -> bool {
        if let Some(r) = self.revisions.iter_mut().find(|r| r.version == version) {
            r.last_published_at = None;
        }
        self.mark_published(version, provides, now)
    }

    /// The taint verdict for the published revision given the NACK statistics
    /// ([`crate::nacks::nack_verdict`]): tainted when, for one of the versions it
    /// provides, every subscribed pod has at least `threshold` NACKs.
    pub fn evaluate(&self, stats: &dyn NackView, threshold: u64) -> Option<Taint> {
        self.published()?
            .nack_verdict(&self.node_id, stats, threshold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::fixtures::{spec, t};

    /// NACK view where the listed (type, version)s are rejected by all pods.
    struct Rejected(BTreeSet<(ResourceType, String)>);
    impl NackView for Rejected {
        fn rejected_by_all_pods(&self, _: &str, t: ResourceType, v: &str, _: u64) -> bool {
            self.0.contains(&(t, v.to_string()))
        }
    }

    fn provides(v: &str) -> BTreeMap<ResourceType, String> {
        BTreeMap::from([(ResourceType::Listener, v.to_string())])
    }

    #[test]
    fn version_is_a_stable_hash_of_the_resources() {
        assert_eq!(config_version(&spec(1)), config_version(&spec(1)));
        assert_ne!(config_version(&spec(1)), config_version(&spec(2)));
        let mut other_node = EnvoyConfigSpec::clone(&spec(1));
        other_node.node_id = "other".into();
        assert_eq!(
            config_version(&spec(1)),
            config_version(&other_node),
            "node id is not a resource"
        );
        assert_eq!(config_version(&spec(1)).len(), 16);
    }

    #[test]
    fn in_sync_rollback_and_rollback_failed() {
        let mut r = Revisions::new("kuard");
        assert_eq!(r.cache_state(), None);
        let v1 = r.apply(&spec(1), t(1));
        assert_eq!(r.cache_state(), Some(CacheState::InSync));
        assert_eq!(r.published().unwrap().version, v1);
        let v2 = r.apply(&spec(2), t(2));
        assert_eq!(r.published().unwrap().version, v2);
        assert!(r.taint(&v2, "rejected"));
        assert_eq!(r.cache_state(), Some(CacheState::Rollback));
        assert_eq!(r.published().unwrap().version, v1);
        assert!(r.taint(&v1, "rejected"));
        assert_eq!(r.cache_state(), Some(CacheState::RollbackFailed));
        assert!(r.published().is_none());
        assert!(!r.taint(&v1, "again"), "a taint is set once");
        assert_eq!(r.revisions[0].tainted.as_deref(), Some("rejected"));
    }

    #[test]
    fn reapplying_a_known_hash_moves_it_to_the_top() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        let v2 = r.apply(&spec(2), t(2));
        assert_eq!(r.apply(&spec(1), t(3)), v1);
        let order: Vec<&str> = r.revisions.iter().map(|x| x.version.as_str()).collect();
        assert_eq!(order, [v2.as_str(), v1.as_str()]);
        assert_eq!(
            r.revisions[1].created_at,
            t(1),
            "the revision is moved, not recreated"
        );
        assert_eq!(r.published().unwrap().version, v1);
    }

    #[test]
    fn reapplying_a_tainted_hash_keeps_the_taint() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        let v2 = r.apply(&spec(2), t(2));
        r.taint(&v2, "bad");
        r.apply(&spec(1), t(3));
        r.apply(&spec(2), t(4));
        assert_eq!(r.cache_state(), Some(CacheState::Rollback));
        assert_eq!(r.published().unwrap().version, v1);
    }

    /// A revision upstream MARIN3R created (its version is another hash of the same
    /// resources) is the revision of that spec: re-applying the spec moves it, keeping
    /// its version and its taint, instead of adding a duplicate.
    #[test]
    fn a_revision_adopted_from_upstream_is_found_by_its_resources() {
        let mut r = Revisions::new("kuard");
        for (version, port) in [("6c8f9d7b4", 1), ("5d7f4c9b8", 2)] {
            r.revisions.push(Revision {
                version: version.into(),
                spec: spec(port),
                created_at: t(port),
                last_published_at: None,
                tainted: None,
                provides_versions: BTreeMap::new(),
            });
        }
        r.taint("6c8f9d7b4", "upstream: ResourcesFailing");
        assert_eq!(
            r.find(&spec(1)).map(|x| x.version.as_str()),
            Some("6c8f9d7b4")
        );
        assert_eq!(r.apply(&spec(1), t(9)), "6c8f9d7b4");
        assert_eq!(r.revisions.len(), 2, "no duplicate");
        assert_eq!(
            r.cache_state(),
            Some(CacheState::Rollback),
            "the taint is kept"
        );
        assert_eq!(r.published().unwrap().version, "5d7f4c9b8");
        assert!(r.find(&spec(3)).is_none());

        // `serialization` only matters to the deprecated `envoyResources`.
        let mut yaml = EnvoyConfigSpec::clone(&spec(2));
        yaml.serialization = Some(marin3r_envoyconfig::Serialization::Yaml);
        assert!(same_resources(&spec(2), &yaml));
        assert!(!same_resources(&spec(1), &spec(2)));
    }

    #[test]
    fn removing_a_tainted_revision_allows_a_retry() {
        let mut r = Revisions::new("kuard");
        r.apply(&spec(1), t(1));
        let v2 = r.apply(&spec(2), t(2));
        r.taint(&v2, "bad");
        assert!(r.remove(&v2));
        assert!(!r.remove(&v2));
        assert_eq!(r.apply(&spec(2), t(3)), v2);
        assert_eq!(r.cache_state(), Some(CacheState::InSync));
        assert!(r.desired().unwrap().tainted.is_none());
    }

    #[test]
    fn retention_keeps_ten_oldest_out_first_but_never_the_rollback_target() {
        let mut r = Revisions::new("kuard");
        for i in 0..12 {
            r.apply(&spec(i), t(i));
        }
        assert_eq!(r.revisions.len(), MAX_REVISIONS);
        assert_eq!(r.revisions[0].version, config_version(&spec(2)));

        // The last good revision is the oldest (all newer tainted): it survives trimming.
        let mut r = Revisions::new("kuard");
        let v0 = r.apply(&spec(100), t(0));
        for i in 0..12 {
            let v = r.apply(&spec(i), t(i + 1));
            r.taint(&v, "bad");
        }
        assert_eq!(r.revisions.len(), MAX_REVISIONS);
        assert_eq!(r.published().unwrap().version, v0);
        assert_eq!(r.cache_state(), Some(CacheState::Rollback));
    }

    #[test]
    fn evaluate_taints_only_when_every_pod_rejected_what_is_published() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        r.mark_published(&v1, provides("L1"), t(1));
        let v2 = r.apply(&spec(2), t(2));
        r.mark_published(&v2, provides("L2"), t(2));

        let none = Rejected(BTreeSet::new());
        assert_eq!(
            r.evaluate(&none, 5),
            None,
            "partial or no rejection never taints"
        );

        let l2 = Rejected(BTreeSet::from([(ResourceType::Listener, "L2".to_string())]));
        let taint = r.evaluate(&l2, 5).unwrap();
        assert_eq!(taint.version, v2);
        assert!(taint.reason.contains("listener version L2"));
        r.taint(&taint.version, taint.reason);
        // Rolled back to v1, whose listener version is not rejected.
        assert_eq!(r.published().unwrap().version, v1);
        assert_eq!(r.evaluate(&l2, 5), None);
        // Before anything is published there is nothing to judge.
        assert_eq!(Revisions::new("x").evaluate(&l2, 5), None);
    }

    #[test]
    fn mark_published_records_time_and_versions() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        r.mark_published(&v1, provides("L1"), t(5));
        r.mark_published(&v1, provides("L1"), t(9));
        let rev = r.published().unwrap();
        assert_eq!(
            rev.last_published_at,
            Some(t(5)),
            "unchanged re-publish keeps the time"
        );
        assert_eq!(rev.provides_versions[&ResourceType::Listener], "L1");
        r.mark_published(&v1, provides("L1b"), t(10));
        assert_eq!(r.published().unwrap().last_published_at, Some(t(10)));
        r.mark_newly_published(&v1, provides("L1b"), t(12));
        assert_eq!(
            r.published().unwrap().last_published_at,
            Some(t(12)),
            "a rollback to it is a new publication"
        );
    }
}
