//! The fleet-wide NACK judgement (`docs/ha.md` §3): the single-process rule — taint a
//! published revision's type when **every** subscribed pod NACKed its version at least
//! N times — judged over every replica's report, each of which sees only its own
//! streams.
//!
//! For a node X, a published revision R and a type t:
//!
//! ```text
//! taint(R, t) ⇔ Σ_{r∈E} n_r(X) > 0
//!             ∧ ∀ r ∈ E: fresh(r) ∧ ( n_r(X) = 0
//!                   ∨ ( rev_r = R.uid ∧ epoch_r = R.lastPublished
//!                       ∧ v_r[t] = R.version[t] ∧ minNacks_r[t] ≥ N ) )
//! ```
//!
//! where `E`, the expected replicas, are the pods with a ready or terminating endpoint
//! in the discovery service's Service together with the replicas whose report is fresh
//! (seen to change at most [`FRESHNESS`] ago, on the leader's clock: see
//! `kubernetes::ha::Ha::fleet`). A missing, stale or lagging replica **vetoes**;
//! a replica without pods of X cannot block. Within a replica, a pod that ACKed a version
//! on any of its streams counts no NACKs for it (`marin3r_xds::PodCounts::counted_nacks`,
//! the rule of the single-process test too), so a pod that accepted `v_r[t]` makes
//! `minNacks_r[t] = 0` and no forged NACKs of it, on that replica or another, taint
//! it. When the predicate holds, every pod a replica reported NACKed at least N times,
//! so the fleet is never more eager than the single-process rule over what the replicas
//! reported (it is sometimes later: a pod that moved mid-episode, a replica that has not
//! caught up).
//!
//! [`FleetView`] is the publisher's [`NackView`] for one revision, so the publisher's
//! rule ([`crate::publisher::decide`]) stays the one pure function both modes use.
//! Everything here is pure: the reports, the expected replicas and `now` are inputs.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use marin3r_envoyconfig::ResourceType;
use marin3r_envoyconfig::discoveryservicereplica::NodeDigest;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;

use crate::nacks::NackView;

/// How old a replica's last report may be and still count (three heartbeats).
pub const FRESHNESS: Duration = Duration::from_secs(30);

/// One replica's last report, as the leader reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// When the leader last saw it change, on the leader's clock (never the date the
    /// replica wrote: clocks disagree).
    pub heartbeat: Option<SystemTime>,
    /// Its digests, by node id.
    pub nodes: BTreeMap<String, NodeDigest>,
}

impl Report {
    /// A report of `digests` written at `heartbeat`.
    pub fn new(
        heartbeat: Option<SystemTime>,
        digests: impl IntoIterator<Item = NodeDigest>,
    ) -> Self {
        Self {
            heartbeat,
            nodes: digests
                .into_iter()
                .map(|d| (d.node_id.clone(), d))
                .collect(),
        }
    }

    /// Whether the report is at most [`FRESHNESS`] old at `now` (both on the leader's
    /// clock; a `heartbeat` after `now` counts as seen now).
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        self.heartbeat
            .is_some_and(|h| now.duration_since(h).map_or(true, |age| age <= FRESHNESS))
    }
}

/// The revision whose rejection is judged: the published one of its EnvoyConfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// Its UID.
    pub uid: String,
    /// Its `status.lastPublishedAt`, as the leader sees it.
    pub epoch: Option<Time>,
}

impl Judged {
    /// `revision` as the leader judges it: its UID and its `status.lastPublishedAt`.
    pub fn of(revision: &EnvoyConfigRevision) -> Option<Self> {
        Some(Self {
            uid: revision.metadata.uid.clone()?,
            epoch: revision
                .status
                .as_ref()
                .and_then(|s| s.last_published_at.clone()),
        })
    }
}

/// Why a replica blocks a verdict that the others would give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Veto {
    /// Expected (it has an endpoint) but it never reported.
    Missing,
    /// Its last report is older than [`FRESHNESS`].
    Stale,
    /// It has pods of the node but serves another revision, epoch or version.
    Lagging,
}

impl Veto {
    /// Every veto (the label values of a node's veto series).
    pub const ALL: [Veto; 3] = [Veto::Missing, Veto::Stale, Veto::Lagging];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Veto::Missing => "missing",
            Veto::Stale => "stale",
            Veto::Lagging => "lagging",
        }
    }
}

/// The verdict on one type of one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every pod of every expected replica rejected it at least N times.
    Rejected,
    /// Some pod accepted it (or has not rejected it often enough), or no pod is
    /// connected anywhere.
    NotRejected,
    /// Every replica that can tell says rejected, but these replicas cannot tell.
    Vetoed(BTreeMap<String, Veto>),
}

/// What the leader knows about the fleet at one instant: every replica's last report
/// and the replicas that have an endpoint.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    /// Reports by replica (pod) name.
    pub reports: BTreeMap<String, Report>,
    /// Pods with a ready or terminating endpoint in the discovery service's Service.
    pub endpoints: BTreeSet<String>,
    /// The leader's clock.
    pub now: Option<SystemTime>,
}

impl Fleet {
    fn now(&self) -> SystemTime {
        self.now.unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// `E`: the replicas with an endpoint, and those with a fresh report.
    pub fn expected(&self) -> BTreeSet<&str> {
        let now = self.now();
        self.endpoints
            .iter()
            .map(String::as_str)
            .chain(
                self.reports
                    .iter()
                    .filter(|(_, r)| r.is_fresh(now))
                    .map(|(name, _)| name.as_str()),
            )
            .collect()
    }

    /// The verdict on `version` of `t` of `revision` for `node_id` (see the module docs).
    pub fn verdict(
        &self,
        node_id: &str,
        revision: &Judged,
        t: ResourceType,
        version: &str,
        threshold: u64,
    ) -> Verdict {
        let now = self.now();
        let threshold = threshold.max(1);
        let mut pods = 0u64;
        let mut vetoes = BTreeMap::new();
        let mut accepted = false;
        for replica in self.expected() {
            let Some(report) = self.reports.get(replica) else {
                vetoes.insert(replica.to_string(), Veto::Missing);
                continue;
            };
            if !report.is_fresh(now) {
                vetoes.insert(replica.to_string(), Veto::Stale);
                continue;
            }
            let Some(digest) = report.nodes.get(node_id).filter(|d| d.pods > 0) else {
                continue;
            };
            pods += digest.pods;
            let current = digest.revision.as_deref() == Some(revision.uid.as_str())
                && digest.epoch == revision.epoch
                && digest.versions.get(t.as_str()).map(String::as_str) == Some(version);
            if !current {
                vetoes.insert(replica.to_string(), Veto::Lagging);
            } else if digest.min_nacks.get(t.as_str()).copied().unwrap_or(0) < threshold {
                accepted = true;
            }
        }
        if accepted || pods == 0 && vetoes.is_empty() {
            Verdict::NotRejected
        } else if !vetoes.is_empty() {
            Verdict::Vetoed(vetoes)
        } else {
            Verdict::Rejected
        }
    }

    /// The NACK message one of the replicas that NACKed `version` of `t` reported for
    /// the node (a digest's message is that of its most rejected version).
    pub fn message(&self, node_id: &str, t: ResourceType, version: &str) -> Option<String> {
        self.reports
            .values()
            .filter_map(|r| r.nodes.get(node_id))
            .filter(|d| {
                d.versions.get(t.as_str()).map(String::as_str) == Some(version)
                    && d.min_nacks.get(t.as_str()).is_some_and(|n| *n > 0)
            })
            .find_map(|d| d.message.clone())
    }

    /// The pods of `node_id` that never answered, over the replicas with a fresh report
    /// (sorted, each once): what one replica's own statistics say for its streams.
    pub fn silent_pods(&self, node_id: &str) -> Vec<String> {
        let now = self.now();
        let silent: BTreeSet<&String> = self
            .reports
            .values()
            .filter(|r| r.is_fresh(now))
            .filter_map(|r| r.nodes.get(node_id))
            .flat_map(|d| &d.silent_pods)
            .collect();
        silent.into_iter().cloned().collect()
    }

    /// Pods connected for `node_id` over the expected replicas with a fresh report.
    pub fn pods(&self, node_id: &str) -> u64 {
        let now = self.now();
        self.expected()
            .into_iter()
            .filter_map(|r| self.reports.get(r))
            .filter(|r| r.is_fresh(now))
            .filter_map(|r| r.nodes.get(node_id))
            .map(|d| d.pods)
            .sum()
    }
}

/// The publisher's [`NackView`] over the fleet, for the published revision `revision`:
/// "rejected by all pods" is [`Verdict::Rejected`]. Vetoes are recorded (for the
/// `marin3r_ha_vetoes_total` metric and the log).
#[derive(Debug)]
pub struct FleetView<'a> {
    fleet: &'a Fleet,
    revision: Judged,
    vetoes: RefCell<Vec<(String, String, Veto)>>,
}

impl<'a> FleetView<'a> {
    pub fn new(fleet: &'a Fleet, revision: Judged) -> Self {
        Self {
            fleet,
            revision,
            vetoes: RefCell::new(Vec::new()),
        }
    }

    /// `(node id, replica, why)` of every veto met while judging.
    pub fn into_vetoes(self) -> Vec<(String, String, Veto)> {
        self.vetoes.into_inner()
    }
}

impl NackView for FleetView<'_> {
    fn rejected_by_all_pods(
        &self,
        node_id: &str,
        t: ResourceType,
        version: &str,
        threshold: u64,
    ) -> bool {
        match self
            .fleet
            .verdict(node_id, &self.revision, t, version, threshold)
        {
            Verdict::Rejected => true,
            Verdict::NotRejected => false,
            Verdict::Vetoed(vetoes) => {
                let mut seen = self.vetoes.borrow_mut();
                for (replica, why) in vetoes {
                    seen.push((node_id.to_string(), replica, why));
                }
                false
            }
        }
    }

    fn nack_message(&self, node_id: &str, t: ResourceType, version: &str) -> Option<String> {
        self.fleet.message(node_id, t, version)
    }

    fn silent_pods(&self, node_id: &str) -> Vec<String> {
        self.fleet.silent_pods(node_id)
    }
}

/// A [`NackView`] that never sees a rejection: what a replica that does not lead
/// judges with (the leader taints; every replica follows the taints it reads).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoVerdict;

impl NackView for NoVerdict {
    fn rejected_by_all_pods(&self, _: &str, _: ResourceType, _: &str, _: u64) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    const N: u64 = 3;

    fn t(secs: u64) -> SystemTime {
        marin3r_testkit::unix_time(1_800_000_000 + secs)
    }

    fn epoch() -> Time {
        Time(Timestamp::from_second(1_700_000_000).unwrap())
    }

    fn judged() -> Judged {
        Judged {
            uid: "uid-r2".into(),
            epoch: Some(epoch()),
        }
    }

    fn digest(pods: u64, min: u64) -> NodeDigest {
        NodeDigest {
            node_id: "kuard".into(),
            revision: Some("uid-r2".into()),
            epoch: Some(epoch()),
            versions: BTreeMap::from([("listener".into(), "L2".into())]),
            pods,
            min_nacks: BTreeMap::from([("listener".into(), min)]),
            message: Some("unknown cluster".into()),
            silent_pods: Vec::new(),
        }
    }

    fn fleet(reports: &[(&str, u64, NodeDigest)], endpoints: &[&str], now: u64) -> Fleet {
        Fleet {
            reports: reports
                .iter()
                .map(|(name, at, d)| (name.to_string(), Report::new(Some(t(*at)), [d.clone()])))
                .collect(),
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            now: Some(t(now)),
        }
    }

    fn verdict(f: &Fleet) -> Verdict {
        f.verdict("kuard", &judged(), ResourceType::Listener, "L2", N)
    }

    #[test]
    fn every_pod_of_every_replica_rejected() {
        let f = fleet(
            &[("a", 0, digest(2, N)), ("b", 0, digest(1, N))],
            &["a", "b"],
            5,
        );
        assert_eq!(verdict(&f), Verdict::Rejected);
        assert_eq!(f.pods("kuard"), 3);
    }

    #[test]
    fn one_accepting_replica_means_partial_rejection() {
        let f = fleet(
            &[("a", 0, digest(2, N)), ("b", 0, digest(1, 0))],
            &["a", "b"],
            5,
        );
        assert_eq!(verdict(&f), Verdict::NotRejected);
    }

    #[test]
    fn a_replica_without_pods_of_the_node_cannot_block() {
        let idle = NodeDigest {
            revision: None,
            pods: 0,
            ..digest(0, 0)
        };
        let f = fleet(&[("a", 0, digest(2, N)), ("b", 0, idle)], &["a", "b"], 5);
        assert_eq!(verdict(&f), Verdict::Rejected);
    }

    #[test]
    fn no_pod_anywhere_is_no_rejection() {
        let f = fleet(&[("a", 0, digest(0, 0))], &["a"], 5);
        assert_eq!(verdict(&f), Verdict::NotRejected);
    }

    #[test]
    fn missing_stale_and_lagging_replicas_veto() {
        let missing = fleet(&[("a", 0, digest(2, N))], &["a", "b"], 5);
        assert_eq!(
            verdict(&missing),
            Verdict::Vetoed(BTreeMap::from([("b".into(), Veto::Missing)]))
        );
        let stale = fleet(
            &[("a", 40, digest(2, N)), ("b", 0, digest(1, N))],
            &["a", "b"],
            40,
        );
        assert_eq!(
            verdict(&stale),
            Verdict::Vetoed(BTreeMap::from([("b".into(), Veto::Stale)]))
        );
        for lag in [
            NodeDigest {
                revision: Some("uid-r1".into()),
                ..digest(1, N)
            },
            NodeDigest {
                epoch: None,
                ..digest(1, N)
            },
            NodeDigest {
                versions: BTreeMap::from([("listener".into(), "L1".into())]),
                ..digest(1, N)
            },
        ] {
            let f = fleet(&[("a", 0, digest(2, N)), ("b", 0, lag)], &["a", "b"], 5);
            assert_eq!(
                verdict(&f),
                Verdict::Vetoed(BTreeMap::from([("b".into(), Veto::Lagging)]))
            );
        }
    }

    #[test]
    fn a_gone_replica_stops_vetoing_once_it_has_no_endpoint_and_its_report_is_stale() {
        // b crashed: its endpoint is gone; its last report stays fresh for 30 s.
        let f = fleet(
            &[("a", 31, digest(2, N)), ("b", 0, digest(1, N))],
            &["a"],
            31,
        );
        assert_eq!(verdict(&f), Verdict::Rejected, "b is no longer expected");
        let fresh = fleet(
            &[("a", 20, digest(2, N)), ("b", 0, digest(1, 0))],
            &["a"],
            20,
        );
        assert_eq!(
            verdict(&fresh),
            Verdict::NotRejected,
            "a fresh report still counts without an endpoint"
        );
    }

    #[test]
    fn the_view_records_vetoes_and_quotes_envoy() {
        let f = fleet(&[("a", 0, digest(2, N))], &["a", "b"], 5);
        let view = FleetView::new(&f, judged());
        assert!(!view.rejected_by_all_pods("kuard", ResourceType::Listener, "L2", N));
        assert_eq!(
            view.nack_message("kuard", ResourceType::Listener, "L2")
                .as_deref(),
            Some("unknown cluster")
        );
        assert_eq!(
            view.into_vetoes(),
            [("kuard".to_string(), "b".to_string(), Veto::Missing)]
        );
        assert!(!NoVerdict.rejected_by_all_pods("kuard", ResourceType::Listener, "L2", 1));
    }
}
