//! The NACK verdict (design.md §4), a leaf both the revision engine ([`crate::revisions`])
//! and the publisher ([`crate::publisher`]) use: what the NACK statistics tell
//! ([`NackView`]), whether every Envoy of a node rejected a version a revision provides
//! ([`rejected`]), and the [`Taint`] that verdict gives ([`nack_verdict`], quoting Envoy's
//! own message).

use std::collections::BTreeMap;

use marin3r_envoyconfig::ResourceType;
use marin3r_xds::SharedStats;

/// Characters of Envoy's NACK message quoted in a taint reason: one bound for one
/// replica and several (whose reports carry the message, bounded the same).
pub const MAX_NACK_MESSAGE: usize =
    marin3r_envoyconfig::discoveryservicereplica::MAX_DIGEST_MESSAGE;
/// Silent pods named in a taint reason (the rest are elided).
pub const MAX_SILENT_PODS: usize = 10;

/// What the NACK statistics tell the publisher.
pub trait NackView {
    /// True when every pod currently subscribed for `node_id` NACKed `version` of `t` at
    /// least `threshold` times (false when no pod is subscribed).
    fn rejected_by_all_pods(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        threshold: u64,
    ) -> bool;

    /// The error message of one of those NACKs, if any.
    fn nack_message(&self, node_id: &str, t: ResourceType, version: &str) -> Option<String> {
        let _ = (node_id, t, version);
        None
    }

    /// Pods of the node that never answered anything and so are not counted
    /// (`marin3r_xds::stats::SILENT_POD_GRACE`).
    fn silent_pods(&self, node_id: &str) -> Vec<String> {
        let _ = node_id;
        Vec::new()
    }
}

impl NackView for SharedStats {
    fn rejected_by_all_pods(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        threshold: u64,
    ) -> bool {
        SharedStats::rejected_by_all_pods(self, node_id, t, version, threshold)
    }

    fn nack_message(&self, node_id: &str, t: ResourceType, version: &str) -> Option<String> {
        self.counts(node_id, t, version)
            .into_values()
            .find_map(|c| c.last_nack_message)
    }

    fn silent_pods(&self, node_id: &str) -> Vec<String> {
        SharedStats::silent_pods(self, node_id)
            .into_iter()
            .collect()
    }
}

/// A revision to taint, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub version: String,
    pub reason: String,
    pub cause: TaintCause,
}

/// Why a revision is tainted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintCause {
    /// Every subscribed Envoy of the node rejected it.
    RejectedByEnvoy,
    /// Its resources do not decode.
    ResourcesFailedToDecode,
}

impl TaintCause {
    /// The reason of the `RevisionTainted` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintCause::RejectedByEnvoy => "RejectedByEnvoy",
            TaintCause::ResourcesFailedToDecode => "ResourcesFailedToDecode",
        }
    }
}

/// The first of `versions` (per type, what a revision provides to `node_id`) that every
/// subscribed pod rejected at least `threshold` times: the verdict alone, without the
/// lookups [`nack_verdict`] makes for its reason.
pub fn rejected<'v>(
    node_id: &str,
    versions: &'v BTreeMap<ResourceType, String>,
    nacks: &dyn NackView,
    threshold: u64,
) -> Option<(ResourceType, &'v str)> {
    versions
        .iter()
        .find(|(t, version)| nacks.rejected_by_all_pods(node_id, **t, version, threshold))
        .map(|(t, version)| (*t, version.as_str()))
}

/// The NACK verdict for `revision`, which provides `versions` to `node_id`: a taint when
/// every subscribed pod rejected one of them at least `threshold` times ([`rejected`]),
/// with Envoy's message (truncated) in the reason.
pub fn nack_verdict(
    node_id: &str,
    revision: &str,
    versions: &BTreeMap<ResourceType, String>,
    nacks: &dyn NackView,
    threshold: u64,
) -> Option<Taint> {
    let (t, version) = rejected(node_id, versions, nacks, threshold)?;
    let mut reason = format!(
        "every Envoy of node {node_id} rejected {t} version {version} at least {threshold} times"
    );
    if let Some(message) = nacks.nack_message(node_id, t, version) {
        let message: String = message.chars().take(MAX_NACK_MESSAGE).collect();
        reason.push_str(&format!("; Envoy: {message}"));
    }
    let silent = nacks.silent_pods(node_id);
    if !silent.is_empty() {
        let shown: Vec<&str> = silent
            .iter()
            .take(MAX_SILENT_PODS)
            .map(String::as_str)
            .collect();
        reason.push_str(&format!(
            "; not counted, never answered: {}{}",
            shown.join(", "),
            if silent.len() > shown.len() {
                ", …"
            } else {
                ""
            }
        ));
    }
    Some(Taint {
        version: revision.to_string(),
        reason,
        cause: TaintCause::RejectedByEnvoy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    struct Rejected(BTreeSet<String>);
    impl NackView for Rejected {
        fn rejected_by_all_pods(&self, _: &str, _: ResourceType, v: &str, _: u64) -> bool {
            self.0.contains(v)
        }
        fn silent_pods(&self, _: &str) -> Vec<String> {
            vec!["quiet".into()]
        }
    }

    #[test]
    fn nack_verdict_uses_the_engine() {
        let versions = BTreeMap::from([
            (ResourceType::Cluster, "C1".to_string()),
            (ResourceType::Listener, "L2".to_string()),
        ]);
        let none = Rejected(BTreeSet::new());
        assert_eq!(rejected("n", &versions, &none, 5), None);
        assert_eq!(nack_verdict("n", "v2", &versions, &none, 5), None);
        let l2 = Rejected(BTreeSet::from(["L2".into()]));
        assert_eq!(
            rejected("n", &versions, &l2, 5),
            Some((ResourceType::Listener, "L2"))
        );
        let taint = nack_verdict("n", "v2", &versions, &l2, 5).unwrap();
        assert_eq!(taint.version, "v2");
        assert_eq!(taint.cause, TaintCause::RejectedByEnvoy);
        assert_eq!(
            taint.reason,
            "every Envoy of node n rejected listener version L2 at least 5 times; not counted, never answered: quiet"
        );
    }
}
