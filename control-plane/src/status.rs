//! The self-healing status of local mode (design.md §4): the JSON of `GET /status` on the
//! metrics listener and how it is computed from [`Revisions`]. The `marin3r status`
//! client and its `kubectl get ec`-like table are in the CLI crate.
//!
//! ```json
//! {"envoyConfigs": [{"name": "kuard", "namespace": "default", "nodeID": "kuard",
//!   "envoyAPI": "v3", "desiredVersion": "…", "publishedVersion": "…",
//!   "cacheState": "Rollback", "conditions": [{"type": "CacheOutOfSync", …}],
//!   "revisions": [{"version": "…", "published": true, "tainted": false,
//!                  "createdAt": "2025-01-01T10:00:00Z", "lastPublishedAt": "…",
//!                  "providesVersions": {"listener": "…"}}]}]}
//! ```
//!
//! Everything here is pure.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

use crate::revisions::Revisions;
use marin3r_envoyconfig::envoyconfig::CacheState;

/// Condition type: the desired version is not the one being served.
pub const CACHE_OUT_OF_SYNC: &str = "CacheOutOfSync";
/// Condition type (Kubernetes mode with several replicas, `docs/ha.md` §5): every
/// expected replica serves the elected revision.
pub const REPLICAS_IN_SYNC: &str = "ReplicasInSync";
/// Condition type: every revision is tainted; the last good snapshot keeps being served.
pub const ROLLBACK_FAILED: &str = "RollbackFailed";

/// The body of `GET /status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// Sorted by namespace, then name.
    pub envoy_configs: Vec<EnvoyConfigReport>,
    /// Local mode: the config folder's files that cannot be used now (their last good
    /// content keeps being served), with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileReport>,
}

/// A file of the config folder that cannot be used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileReport {
    pub path: String,
    pub error: String,
}

/// One EnvoyConfig: what `kubectl get ec -o yaml` shows as its status in Kubernetes mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigReport {
    pub name: String,
    pub namespace: String,
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// `spec.envoyAPI` (`v3` when unset, its default).
    #[serde(rename = "envoyAPI")]
    pub envoy_api: String,
    /// The version of the current spec.
    #[serde(default)]
    pub desired_version: Option<String>,
    /// The version whose snapshot is being served (in `RollbackFailed`: the last good
    /// one, which may be tainted or even deleted by then).
    #[serde(default)]
    pub published_version: Option<String>,
    #[serde(default)]
    pub cache_state: Option<CacheState>,
    /// `CacheOutOfSync` and `RollbackFailed`, as Kubernetes conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Oldest first; the last one is the desired revision.
    #[serde(default)]
    pub revisions: Vec<RevisionReport>,
    /// Why what is written for this EnvoyConfig is not used (an invalid document, a file
    /// that cannot be read): the last good state keeps being served meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// One revision (an EnvoyConfigRevision in Kubernetes mode).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionReport {
    pub version: String,
    /// Its snapshot is the one in the cache.
    pub published: bool,
    pub tainted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint_reason: Option<String>,
    /// RFC 3339, UTC, whole seconds.
    pub created_at: String,
    #[serde(default)]
    pub last_published_at: Option<String>,
    /// Per-type versions of the snapshot it published last.
    #[serde(default)]
    pub provides_versions: BTreeMap<String, String>,
}

pub use marin3r_kube::time::rfc3339;

/// The conditions of an EnvoyConfig (both modes: `GET /status` in local mode, the
/// EnvoyConfig status in Kubernetes mode), keeping each condition's `lastTransitionTime`
/// from `previous` when its status did not change (like `meta.SetStatusCondition`). Both
/// are present once there is a state:
///
/// - `CacheOutOfSync` is `True` when what is served is not the desired version:
///   `CantPublishDesiredVersion` in `Rollback` and `RollbackFailed`; `ResourcesOutOfSync`
///   while the elected revision waits for a Secret (`waiting`, the message names it);
///   `PublishPending` while the desired revision is not served yet; else `False`,
///   `DesiredVersionPublished`.
/// - `RollbackFailed` is `True` (`AllRevisionsTainted`) only in `RollbackFailed`, else
///   `False` (`UntaintedRevisionPublished`).
pub fn conditions(
    state: Option<CacheState>,
    desired: Option<&str>,
    published: Option<&str>,
    waiting: Option<&str>,
    previous: &[Condition],
    now: SystemTime,
) -> Vec<Condition> {
    let Some(state) = state else {
        return Vec::new();
    };
    let desired = desired.unwrap_or_default();
    let out_of_sync = match (state, waiting) {
        (CacheState::Rollback, _) => (
            true,
            "CantPublishDesiredVersion",
            format!(
                "version {desired} is tainted; rolled back to version {}",
                published.unwrap_or_default()
            ),
        ),
        (CacheState::RollbackFailed, _) => (
            true,
            "CantPublishDesiredVersion",
            format!("version {desired} is tainted and no untainted revision is left"),
        ),
        (CacheState::InSync, Some(reason)) => (
            true,
            "ResourcesOutOfSync",
            format!("version {desired} waits for its dependencies: {reason}"),
        ),
        (CacheState::InSync, None) if published != Some(desired) => (
            true,
            "PublishPending",
            format!("version {desired} is being published"),
        ),
        (CacheState::InSync, None) => (
            false,
            "DesiredVersionPublished",
            format!("version {desired} is published"),
        ),
    };
    let rollback_failed = match state {
        CacheState::RollbackFailed => (
            true,
            "AllRevisionsTainted",
            "every revision is tainted; the last good snapshot keeps being served".to_string(),
        ),
        _ => (
            false,
            "UntaintedRevisionPublished",
            "an untainted revision is published".to_string(),
        ),
    };
    [
        (CACHE_OUT_OF_SYNC, out_of_sync),
        (ROLLBACK_FAILED, rollback_failed),
    ]
    .into_iter()
    .map(|(type_, (on, reason, message))| {
        marin3r_kube::conditions::condition(
            previous,
            type_,
            on,
            reason,
            message,
            None,
            marin3r_kube::time::timestamp(now),
        )
    })
    .collect()
}

/// The report of one EnvoyConfig. `served` is the revision whose snapshot is in the cache
/// (the published one, or the last good one in `RollbackFailed`).
pub fn envoy_config_report(
    namespace: &str,
    name: &str,
    envoy_api: &str,
    revisions: &Revisions,
    served: Option<&str>,
    conditions: Vec<Condition>,
) -> EnvoyConfigReport {
    EnvoyConfigReport {
        name: name.to_string(),
        namespace: namespace.to_string(),
        node_id: revisions.node_id.clone(),
        envoy_api: envoy_api.to_string(),
        desired_version: revisions.desired().map(|r| r.version.clone()),
        published_version: served.map(str::to_string),
        cache_state: revisions.cache_state(),
        conditions,
        revisions: revisions
            .revisions
            .iter()
            .map(|r| RevisionReport {
                version: r.version.clone(),
                published: served == Some(r.version.as_str()),
                tainted: r.tainted.is_some(),
                taint_reason: r.tainted.clone(),
                created_at: rfc3339(r.created_at),
                last_published_at: r.last_published_at.map(rfc3339),
                provides_versions: r
                    .provides_versions
                    .iter()
                    .map(|(t, v)| (t.as_str().to_string(), v.clone()))
                    .collect(),
            })
            .collect(),
        errors: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::fixtures::{spec, t};

    #[test]
    fn times_are_rfc3339_utc_whole_seconds() {
        assert_eq!(rfc3339(t(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(t(1_700_000_000) + Duration::from_millis(999)),
            "2023-11-14T22:13:20Z"
        );
    }

    #[test]
    fn conditions_follow_the_cache_state_and_keep_transition_times() {
        assert!(conditions(None, None, None, None, &[], t(1)).is_empty());
        let in_sync = conditions(
            Some(CacheState::InSync),
            Some("a"),
            Some("a"),
            None,
            &[],
            t(1),
        );
        let types: Vec<(&str, &str)> = in_sync
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [(CACHE_OUT_OF_SYNC, "False"), (ROLLBACK_FAILED, "False")]
        );

        let rollback = conditions(
            Some(CacheState::Rollback),
            Some("b"),
            Some("a"),
            None,
            &in_sync,
            t(5),
        );
        assert_eq!(rollback[0].status, "True");
        assert_eq!(rollback[0].reason, "CantPublishDesiredVersion");
        assert!(rollback[0].message.contains("rolled back to version a"));
        assert_eq!(
            rollback[0].last_transition_time,
            marin3r_kube::time::time(t(5))
        );
        assert_eq!(
            rollback[1].last_transition_time,
            marin3r_kube::time::time(t(1)),
            "unchanged status keeps its transition time"
        );

        let failed = conditions(
            Some(CacheState::RollbackFailed),
            Some("b"),
            Some("a"),
            None,
            &rollback,
            t(9),
        );
        assert_eq!(
            failed[0].last_transition_time,
            marin3r_kube::time::time(t(5))
        );
        assert_eq!(
            (failed[1].status.as_str(), failed[1].reason.as_str()),
            ("True", "AllRevisionsTainted")
        );
        assert_eq!(
            failed[1].last_transition_time,
            marin3r_kube::time::time(t(9))
        );

        // In sync by the revisions, but the desired one waits for a Secret, or is not
        // served yet.
        let waiting = conditions(
            Some(CacheState::InSync),
            Some("b"),
            Some("a"),
            Some("secret \"cert\" not found"),
            &[],
            t(10),
        );
        assert_eq!(
            (waiting[0].status.as_str(), waiting[0].reason.as_str()),
            ("True", "ResourcesOutOfSync")
        );
        assert!(waiting[0].message.contains("secret \"cert\" not found"));
        let pending = conditions(
            Some(CacheState::InSync),
            Some("b"),
            Some("a"),
            None,
            &[],
            t(10),
        );
        assert_eq!(
            (pending[0].status.as_str(), pending[0].reason.as_str()),
            ("True", "PublishPending")
        );
    }

    #[test]
    fn report_json_has_the_documented_shape() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(10));
        r.mark_published(
            &v1,
            BTreeMap::from([(
                marin3r_envoyconfig::ResourceType::Listener,
                "L1".to_string(),
            )]),
            t(11),
        );
        let v2 = r.apply(&spec(2), t(20));
        r.taint(&v2, "rejected");
        let conds = conditions(r.cache_state(), Some(&v2), Some(&v1), None, &[], t(21));
        let report = StatusReport {
            files: Vec::new(),
            envoy_configs: vec![envoy_config_report(
                "default",
                "kuard",
                "v3",
                &r,
                Some(&v1),
                conds,
            )],
        };
        let json = serde_json::to_value(&report).unwrap();
        let ec = &json["envoyConfigs"][0];
        assert_eq!(ec["nodeID"], "kuard");
        assert_eq!(ec["envoyAPI"], "v3");
        assert_eq!(ec["desiredVersion"], v2.as_str());
        assert_eq!(ec["publishedVersion"], v1.as_str());
        assert_eq!(ec["cacheState"], "Rollback");
        assert_eq!(ec["conditions"][0]["type"], "CacheOutOfSync");
        assert_eq!(
            ec["conditions"][0]["lastTransitionTime"],
            "1970-01-01T00:00:21Z"
        );
        let revs = ec["revisions"].as_array().unwrap();
        assert_eq!(revs[0]["version"], v1.as_str());
        assert_eq!(revs[0]["published"], true);
        assert_eq!(revs[0]["tainted"], false);
        assert_eq!(revs[0]["createdAt"], "1970-01-01T00:00:10Z");
        assert_eq!(revs[0]["lastPublishedAt"], "1970-01-01T00:00:11Z");
        assert_eq!(revs[0]["providesVersions"]["listener"], "L1");
        assert_eq!(revs[1]["tainted"], true);
        assert_eq!(revs[1]["taintReason"], "rejected");
        assert_eq!(revs[1]["lastPublishedAt"], serde_json::Value::Null);
        // And back.
        let back: StatusReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }
}
