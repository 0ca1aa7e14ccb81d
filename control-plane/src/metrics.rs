//! The self-healing series of the discovery service ([`RevisionMetrics`]), fed by both
//! sources (local mode's engine and the Kubernetes controllers) through the same four
//! calls: a revision [`tainted`](RevisionMetrics::tainted), a revision that becomes the
//! served one ([`published`](RevisionMetrics::published), a rollback when it is not the
//! desired one), the [`cache_state`](RevisionMetrics::cache_state) of an EnvoyConfig,
//! and an EnvoyConfig gone ([`forget`](RevisionMetrics::forget)).
//!
//! Series (prometheus-client appends `_total` to counters):
//! - `marin3r_envoyconfig_revisions_published_total{node_id}`: revisions that became the
//!   served one of the node (first publication, rollback, retry of a re-created one);
//! - `marin3r_envoyconfig_revisions_tainted_total{node_id, reason}`: taints, `reason`
//!   one of the `RevisionTainted` condition's reasons ([`TaintCause::as_str`]);
//! - `marin3r_envoyconfig_rollbacks_total{node_id}`: publications of a revision older
//!   than the desired one (the desired one is tainted);
//! - `marin3r_envoyconfig_cache_state{envoyconfig_namespace, envoyconfig, node_id,
//!   state}`: one series per EnvoyConfig and state (`InSync`, `Rollback`,
//!   `RollbackFailed`), 1 for its `status.cacheState` and 0 for the others (so a
//!   selector on a state has series before the EnvoyConfig is ever in it);
//! - `marin3r_ha_replicas_in_sync{envoyconfig_namespace, envoyconfig, node_id}`: with
//!   several replicas, the leader's `ReplicasInSync` condition of each EnvoyConfig (1
//!   True, 0 False), as written in its status.
//!
//! Cardinality is bounded by the EnvoyConfigs: an EnvoyConfig's state series are
//! replaced when its node id changes and removed with it, and a node's counters go with
//! the last EnvoyConfig of that node id (a node id configured again restarts from zero,
//! which Prometheus reads as a counter reset). The namespace label is not `namespace`:
//! the scrape sets that one to the discovery service pod's namespace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use marin3r_envoyconfig::envoyconfig::CacheState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::nacks::TaintCause;
use crate::revisions::Revisions;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node_id: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaintLabels {
    node_id: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigLabels {
    envoyconfig_namespace: String,
    envoyconfig: String,
    node_id: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    envoyconfig_namespace: String,
    envoyconfig: String,
    node_id: String,
    state: String,
}

/// Every value of the `state` label.
pub const CACHE_STATES: [CacheState; 3] = [
    CacheState::InSync,
    CacheState::Rollback,
    CacheState::RollbackFailed,
];

/// Every value of the `reason` label of the taint counter.
pub const TAINT_REASONS: [TaintCause; 2] = [
    TaintCause::RejectedByEnvoy,
    TaintCause::ResourcesFailedToDecode,
];

/// (namespace, name) of an EnvoyConfig.
type Key = (String, String);

/// The self-healing series (see the module docs). Cloning shares them. The default is
/// a set registered nowhere (unit tests of the sources, tools).
#[derive(Debug, Clone, Default)]
pub struct RevisionMetrics {
    published: Family<NodeLabels, Counter>,
    tainted: Family<TaintLabels, Counter>,
    rollbacks: Family<NodeLabels, Counter>,
    cache_state: Family<StateLabels, Gauge>,
    replicas_in_sync: Family<ConfigLabels, Gauge>,
    /// The node id and state each EnvoyConfig's series shows.
    shown: Arc<Mutex<BTreeMap<Key, (String, CacheState)>>>,
    /// The node id of each EnvoyConfig's `replicas_in_sync` series.
    in_sync_shown: Arc<Mutex<BTreeMap<Key, String>>>,
}

impl RevisionMetrics {
    /// Registers the series with `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "marin3r_envoyconfig_revisions_published",
            "Revisions that became the one served to their node, per node",
            m.published.clone(),
        );
        registry.register(
            "marin3r_envoyconfig_revisions_tainted",
            "Revisions tainted, per node and reason (RejectedByEnvoy, ResourcesFailedToDecode)",
            m.tainted.clone(),
        );
        registry.register(
            "marin3r_envoyconfig_rollbacks",
            "Publications of a revision older than the desired one (it is tainted), per node",
            m.rollbacks.clone(),
        );
        registry.register(
            "marin3r_envoyconfig_cache_state",
            "Per EnvoyConfig and state (InSync, Rollback, RollbackFailed): 1 for its cacheState, 0 for the others",
            m.cache_state.clone(),
        );
        registry.register(
            "marin3r_ha_replicas_in_sync",
            "The ReplicasInSync condition of each EnvoyConfig (1 True, 0 False; several replicas only)",
            m.replicas_in_sync.clone(),
        );
        m
    }

    /// The `ReplicasInSync` condition of EnvoyConfig `namespace/name` (of `node_id`) is
    /// `in_sync`.
    pub fn replicas_in_sync(&self, namespace: &str, name: &str, node_id: &str, in_sync: bool) {
        let key = (namespace.to_string(), name.to_string());
        let mut shown = self
            .in_sync_shown
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = shown.get(&key).filter(|old| *old != node_id) {
            self.replicas_in_sync.remove(&Self::config(&key, old));
        }
        self.replicas_in_sync
            .get_or_create(&Self::config(&key, node_id))
            .set(i64::from(in_sync));
        shown.insert(key, node_id.to_string());
    }

    fn config(key: &Key, node_id: &str) -> ConfigLabels {
        ConfigLabels {
            envoyconfig_namespace: key.0.clone(),
            envoyconfig: key.1.clone(),
            node_id: node_id.to_string(),
        }
    }

    fn node(node_id: &str) -> NodeLabels {
        NodeLabels {
            node_id: node_id.to_string(),
        }
    }

    /// A revision of `node_id` was tainted (counted once per taint: callers call this
    /// when the taint is recorded, not when it is decided again).
    pub fn tainted(&self, node_id: &str, cause: TaintCause) {
        self.tainted
            .get_or_create(&TaintLabels {
                node_id: node_id.to_string(),
                reason: cause.as_str().to_string(),
            })
            .inc();
    }

    /// [`tainted`](Self::tainted) by the condition reason ([`TaintCause::as_str`]) a
    /// revision's status was written with; another string counts nothing.
    pub fn tainted_reason(&self, node_id: &str, reason: &str) {
        if let Some(cause) = TAINT_REASONS.into_iter().find(|c| c.as_str() == reason) {
            self.tainted(node_id, cause);
        }
    }

    /// Revision `version` of `revisions` became the one served to its node; a rollback
    /// when it is not the desired (topmost) one.
    pub fn published(&self, revisions: &Revisions, version: &str) {
        let node = Self::node(&revisions.node_id);
        self.published.get_or_create(&node).inc();
        if revisions.desired().is_some_and(|d| d.version != version) {
            self.rollbacks.get_or_create(&node).inc();
        }
    }

    fn labels(key: &Key, node_id: &str, state: CacheState) -> StateLabels {
        StateLabels {
            envoyconfig_namespace: key.0.clone(),
            envoyconfig: key.1.clone(),
            node_id: node_id.to_string(),
            state: state.to_string(),
        }
    }

    fn remove_states(&self, key: &Key, node_id: &str) {
        for s in CACHE_STATES {
            self.cache_state.remove(&Self::labels(key, node_id, s));
        }
    }

    /// The cacheState of EnvoyConfig `namespace/name` (of `node_id`) is `state`
    /// (`None`: no revision yet, no series).
    pub fn cache_state(
        &self,
        namespace: &str,
        name: &str,
        node_id: &str,
        state: Option<CacheState>,
    ) {
        let key = (namespace.to_string(), name.to_string());
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        let now = state.map(|s| (node_id.to_string(), s));
        if shown.get(&key) == now.as_ref() {
            return;
        }
        if let Some((old_node, _)) = shown.remove(&key)
            && (old_node != node_id || now.is_none())
        {
            self.remove_states(&key, &old_node);
            if old_node != node_id {
                self.forget_node_unless_shown(&shown, &old_node);
            }
        }
        if let Some((node, current)) = now {
            for s in CACHE_STATES {
                self.cache_state
                    .get_or_create(&Self::labels(&key, &node, s))
                    .set(i64::from(s == current));
            }
            shown.insert(key, (node, current));
        }
    }

    /// EnvoyConfig `namespace/name` is gone (deleted, or no longer served here): its
    /// state series goes, and its node's counters when no other EnvoyConfig has it.
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        {
            let mut in_sync = self
                .in_sync_shown
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(node) = in_sync.remove(&key) {
                self.replicas_in_sync.remove(&Self::config(&key, &node));
            }
        }
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((node, _)) = shown.remove(&key) {
            self.remove_states(&key, &node);
            self.forget_node_unless_shown(&shown, &node);
        }
    }

    /// [`forget`](Self::forget) for every EnvoyConfig shown for which `live` is false.
    pub fn retain(&self, live: impl Fn(&str, &str) -> bool) {
        let gone: Vec<Key> = {
            let shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
            let in_sync = self
                .in_sync_shown
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let keys: std::collections::BTreeSet<&Key> =
                shown.keys().chain(in_sync.keys()).collect();
            keys.into_iter()
                .filter(|(ns, name)| !live(ns, name))
                .cloned()
                .collect()
        };
        for (ns, name) in gone {
            self.forget(&ns, &name);
        }
    }

    /// Node `node_id` is no longer configured here: its counters go, unless an
    /// EnvoyConfig whose state is shown still has it.
    pub fn forget_node(&self, node_id: &str) {
        let shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        self.forget_node_unless_shown(&shown, node_id);
    }

    fn forget_node_unless_shown(&self, shown: &BTreeMap<Key, (String, CacheState)>, node_id: &str) {
        if shown.values().any(|(n, _)| n == node_id) {
            return;
        }
        let node = Self::node(node_id);
        self.published.remove(&node);
        self.rollbacks.remove(&node);
        for cause in TAINT_REASONS {
            self.tainted.remove(&TaintLabels {
                node_id: node_id.to_string(),
                reason: cause.as_str().to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{spec, t};

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap_or_default();
        out
    }

    #[test]
    fn a_rollback_is_a_publication_of_an_older_revision() {
        let mut registry = Registry::default();
        let m = RevisionMetrics::register(&mut registry);
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        m.published(&r, &v1);
        let out = text(&registry);
        assert!(
            out.contains("marin3r_envoyconfig_revisions_published_total{node_id=\"kuard\"} 1"),
            "{out}"
        );
        assert!(
            !out.contains("marin3r_envoyconfig_rollbacks_total{"),
            "{out}"
        );

        let v2 = r.apply(&spec(2), t(2));
        r.taint(&v2, "rejected");
        m.tainted("kuard", TaintCause::RejectedByEnvoy);
        m.published(&r, &v1);
        let out = text(&registry);
        assert!(
            out.contains("marin3r_envoyconfig_revisions_published_total{node_id=\"kuard\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("marin3r_envoyconfig_rollbacks_total{node_id=\"kuard\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("marin3r_envoyconfig_revisions_tainted_total{node_id=\"kuard\",reason=\"RejectedByEnvoy\"} 1"),
            "{out}"
        );
    }

    #[test]
    fn one_state_series_per_envoyconfig_gone_with_it() {
        let mut registry = Registry::default();
        let m = RevisionMetrics::register(&mut registry);
        m.cache_state("ns", "ec", "node-a", Some(CacheState::InSync));
        m.tainted("node-a", TaintCause::ResourcesFailedToDecode);
        m.cache_state("ns", "ec", "node-a", Some(CacheState::Rollback));
        let out = text(&registry);
        assert!(
            out.contains("marin3r_envoyconfig_cache_state{envoyconfig_namespace=\"ns\",envoyconfig=\"ec\",node_id=\"node-a\",state=\"Rollback\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("marin3r_envoyconfig_cache_state{envoyconfig_namespace=\"ns\",envoyconfig=\"ec\",node_id=\"node-a\",state=\"InSync\"} 0"),
            "the other states are 0: {out}"
        );
        assert!(out.contains("state=\"RollbackFailed\"} 0"), "{out}");

        // A new node id: the old node's counters go with it.
        m.cache_state("ns", "ec", "node-b", Some(CacheState::InSync));
        let out = text(&registry);
        assert!(!out.contains("node-a"), "{out}");
        assert!(
            out.contains("node_id=\"node-b\",state=\"InSync\"} 1"),
            "{out}"
        );

        // Two EnvoyConfigs of one node: the node's counters stay while one is left.
        m.cache_state("ns", "other", "node-b", Some(CacheState::InSync));
        m.tainted("node-b", TaintCause::RejectedByEnvoy);
        m.forget("ns", "ec");
        let out = text(&registry);
        assert!(out.contains("envoyconfig=\"other\""), "{out}");
        assert!(!out.contains("envoyconfig=\"ec\""), "{out}");
        assert!(out.contains("reason=\"RejectedByEnvoy\"} 1"), "{out}");

        m.replicas_in_sync("ns", "other", "node-b", false);
        assert!(
            text(&registry).contains("marin3r_ha_replicas_in_sync{envoyconfig_namespace=\"ns\",envoyconfig=\"other\",node_id=\"node-b\"} 0")
        );
        m.replicas_in_sync("ns", "other", "node-b", true);
        assert!(
            text(&registry).contains("marin3r_ha_replicas_in_sync{envoyconfig_namespace=\"ns\",envoyconfig=\"other\",node_id=\"node-b\"} 1")
        );
        // A replica that shows no state (not the leader) drops a node's counters with
        // the node.
        m.published(&Revisions::new("node-c"), "v");
        assert!(text(&registry).contains("node-c"));
        m.forget_node("node-c");
        assert!(!text(&registry).contains("node-c"));
        m.forget_node("node-b");
        assert!(
            text(&registry).contains("node_id=\"node-b\",reason=\"RejectedByEnvoy\"} 1"),
            "a node an EnvoyConfig shows keeps its counters"
        );
        m.retain(|_, name| name != "other");
        let out = text(&registry);
        assert!(
            !out.contains("node-b"),
            "every series of the node is gone: {out}"
        );
    }
}
