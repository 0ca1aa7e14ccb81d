//! A replica's own report (`docs/ha.md` §3): the digest of every node it serves or has
//! streams for ([`digest`]), and when to write it ([`Schedule`]): a change of what a
//! verdict reads is written at once, at most one write per [`COALESCE`]; everything
//! else (exact pod counts, messages) rides on the [`HEARTBEAT`] written at least every
//! 10 s. Pod churn therefore costs no writes, only a node's pods crossing zero does.
//!
//! Pure: the shell (`kubernetes::ha`) feeds it the local state and the clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use marin3r_envoyconfig::ResourceType;
use marin3r_envoyconfig::discoveryservicereplica::{MAX_DIGEST_MESSAGE, NodeDigest};
use marin3r_xds::NodeNacks;
use tokio::time::Instant;

/// The most a report's digests may weigh (serialized), far below etcd's 1.5 MiB
/// object limit whatever clients send: only configured nodes are reported
/// (`kubernetes::ha::digests`), and [`bounded`] enforces it for the rest.
pub const MAX_REPORT_BYTES: usize = 512 * 1024;

/// `digests` (sorted by node id) within `max_bytes` serialized: as they are when they
/// fit; else without their messages; else without the nodes that have no pods here
/// (they cannot block a verdict); else the first ones that fit, the rest dropped with an
/// error logged (only EnvoyConfigs with absurdly long node ids get there).
pub fn bounded(mut digests: Vec<NodeDigest>, max_bytes: usize) -> Vec<NodeDigest> {
    let size = |d: &[NodeDigest]| -> usize {
        d.iter()
            .map(|d| serde_json::to_vec(d).map_or(usize::MAX / 2, |v| v.len() + 1))
            .sum()
    };
    if size(&digests) <= max_bytes {
        return digests;
    }
    for d in &mut digests {
        d.message = None;
    }
    if size(&digests) <= max_bytes {
        return digests;
    }
    digests.retain(|d| d.pods > 0);
    let mut total = 0usize;
    let before = digests.len();
    digests.retain(|d| {
        total = total.saturating_add(size(std::slice::from_ref(d)));
        total <= max_bytes
    });
    if digests.len() < before {
        tracing::error!(
            reported = digests.len(),
            dropped = before - digests.len(),
            max_bytes,
            "this replica's report would outgrow its bound: the digests of some nodes with pods are left out"
        );
    }
    digests
}

/// Decision-relevant changes closer together than this are written together.
pub const COALESCE: Duration = Duration::from_millis(500);
/// A report is written at least this often (with exact pod counts).
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// What this replica serves one node: the revision, the epoch it saw, the versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The revision's UID.
    pub uid: String,
    /// The revision's name (for logs).
    pub name: String,
    /// The revision's config version.
    pub version: String,
    /// The revision's `status.lastPublishedAt` as this replica last read it.
    pub epoch: Option<Time>,
    /// The per-type versions of the snapshot in the cache.
    pub versions: BTreeMap<ResourceType, String>,
}

/// The digest of one node: what is served (`served`, `None` while the node is held)
/// and how the pods answered it (`nacks`, from `AckNackStats::node_nacks` over the
/// served versions).
///
/// `silent`: the node's pods that never answered ([`crate::nacks::NackView::silent_pods`]),
/// of which the first [`crate::nacks::MAX_SILENT_PODS`] + 1 are kept (what the leader's
/// taint reason needs to name them as one replica's does).
pub fn digest(
    node_id: &str,
    served: Option<&Served>,
    nacks: NodeNacks,
    silent: BTreeSet<String>,
) -> NodeDigest {
    NodeDigest {
        node_id: node_id.to_string(),
        revision: served.map(|s| s.uid.clone()),
        epoch: served.and_then(|s| s.epoch.clone()),
        versions: served
            .map(|s| {
                s.versions
                    .iter()
                    .map(|(t, v)| (t.as_str().to_string(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        pods: nacks.pods,
        min_nacks: nacks
            .min_nacks
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| (t.as_str().to_string(), n))
            .collect(),
        message: nacks
            .message
            .map(|m| m.chars().take(MAX_DIGEST_MESSAGE).collect()),
        silent_pods: silent
            .into_iter()
            .take(crate::nacks::MAX_SILENT_PODS + 1)
            .collect(),
    }
}

/// The part of a digest a verdict reads: everything but the exact pod count (only
/// whether there are pods) and the message.
fn decisive(d: &NodeDigest) -> impl PartialEq + '_ {
    (
        &d.node_id,
        &d.revision,
        &d.epoch,
        &d.versions,
        d.pods > 0,
        &d.min_nacks,
    )
}

fn same_decisions(a: &[NodeDigest], b: &[NodeDigest]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| decisive(x) == decisive(y))
}

/// When to write next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Write now.
    Write,
    /// Nothing to write before this instant (unless the digests change).
    Wait(Instant),
}

/// The write schedule of one replica's report.
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    /// What the last successful write carried, and when.
    written: Option<(Vec<NodeDigest>, bool, Instant)>,
}

impl Schedule {
    /// Whether `nodes` (sorted by node id) and the leader flag must be written at `now`.
    pub fn next(&self, now: Instant, nodes: &[NodeDigest], leader: bool) -> Next {
        let Some((written, was_leader, at)) = &self.written else {
            return Next::Write;
        };
        let due = if same_decisions(written, nodes) && *was_leader == leader {
            *at + HEARTBEAT
        } else {
            *at + COALESCE
        };
        if now >= due {
            Next::Write
        } else {
            Next::Wait(due)
        }
    }

    /// A write of `nodes` succeeded at `at`.
    pub fn written(&mut self, at: Instant, nodes: Vec<NodeDigest>, leader: bool) {
        self.written = Some((nodes, leader, at));
    }

    /// When the last successful write happened.
    #[cfg(test)]
    fn last_write(&self) -> Option<Instant> {
        self.written.as_ref().map(|(_, _, at)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pods: u64, min: u64) -> NodeDigest {
        let served = Served {
            uid: "uid".into(),
            name: "r".into(),
            version: "v".into(),
            epoch: None,
            versions: BTreeMap::from([(ResourceType::Listener, "L".into())]),
        };
        digest(
            "n",
            Some(&served),
            NodeNacks {
                pods,
                min_nacks: BTreeMap::from([(ResourceType::Listener, min)]),
                message: Some("x".repeat(300)),
            },
            (0..20).map(|i| format!("quiet-{i:02}")).collect(),
        )
    }

    #[test]
    fn a_digest_names_the_revision_and_keeps_messages_short() {
        let d = node(2, 1);
        assert_eq!(d.revision.as_deref(), Some("uid"));
        assert_eq!(d.versions["listener"], "L");
        assert_eq!(d.min_nacks["listener"], 1);
        assert_eq!(d.silent_pods.len(), crate::nacks::MAX_SILENT_PODS + 1);
        assert_eq!(d.silent_pods[0], "quiet-00");
        assert_eq!(
            d.message.as_ref().map(|m| m.chars().count()),
            Some(MAX_DIGEST_MESSAGE)
        );
        let held = digest("n", None, NodeNacks::default(), BTreeSet::new());
        assert_eq!((held.revision, held.versions.len()), (None, 0));
    }

    #[test]
    fn a_report_over_its_bound_sheds_messages_then_idle_nodes_then_the_rest() {
        let with = |id: usize, pods: u64| NodeDigest {
            node_id: format!("{id:0>1400}"),
            pods,
            message: Some("m".repeat(MAX_DIGEST_MESSAGE)),
            ..NodeDigest::default()
        };
        let small = vec![with(1, 1), with(2, 0)];
        assert_eq!(
            bounded(small.clone(), MAX_REPORT_BYTES),
            small,
            "fits as it is"
        );
        // 320 nodes of ~1.7 KiB: over 512 KiB with messages, under without.
        let many: Vec<NodeDigest> = (0..320).map(|i| with(i, 1)).collect();
        let shed = bounded(many, MAX_REPORT_BYTES);
        assert_eq!(shed.len(), 320);
        assert!(shed.iter().all(|d| d.message.is_none()));
        // 400 idle nodes and 10 with pods, too many even without messages: the idle
        // ones go (they cannot block a verdict).
        let mixed: Vec<NodeDigest> = (0..410).map(|i| with(i, u64::from(i >= 400))).collect();
        let kept = bounded(mixed, 100 * 1024);
        assert_eq!(kept.len(), 10);
        assert!(kept.iter().all(|d| d.pods > 0));
        // Beyond: what fits.
        let busy: Vec<NodeDigest> = (0..400).map(|i| with(i, 1)).collect();
        let kept = bounded(busy, 100 * 1024);
        let bytes: usize = kept
            .iter()
            .map(|d| serde_json::to_vec(d).unwrap().len() + 1)
            .sum();
        assert!(
            bytes <= 100 * 1024 && kept.len() > 40,
            "{} digests, {bytes} B",
            kept.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn changes_are_written_coalesced_and_heartbeats_carry_the_rest() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        assert_eq!(
            s.next(t0, &[node(2, 0)], false),
            Next::Write,
            "first report"
        );
        s.written(t0, vec![node(2, 0)], false);

        // Pod churn (2 → 5 pods) is not decisive: it waits for the heartbeat.
        assert_eq!(s.next(t0, &[node(5, 0)], false), Next::Wait(t0 + HEARTBEAT));
        // A NACK count is: written at once once the coalescing window has passed...
        assert_eq!(
            s.next(t0 + Duration::from_millis(100), &[node(2, 1)], false),
            Next::Wait(t0 + COALESCE)
        );
        assert_eq!(s.next(t0 + COALESCE, &[node(2, 1)], false), Next::Write);
        s.written(t0 + COALESCE, vec![node(2, 1)], false);
        // ...and so are pods crossing zero, a new node set, and leadership.
        let later = t0 + COALESCE * 2;
        assert_eq!(s.next(later, &[node(0, 1)], false), Next::Write);
        assert_eq!(s.next(later, &[], false), Next::Write);
        assert_eq!(s.next(later, &[node(2, 1)], true), Next::Write);
        assert_eq!(
            s.next(later, &[node(2, 1)], false),
            Next::Wait(t0 + COALESCE + HEARTBEAT)
        );
        assert_eq!(
            s.next(t0 + COALESCE + HEARTBEAT, &[node(7, 1)], false),
            Next::Write
        );
        assert_eq!(s.last_write(), Some(t0 + COALESCE));
    }
}
