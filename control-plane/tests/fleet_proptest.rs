//! The fleet-wide NACK judgement against the single-process rule (`docs/ha.md` §7.1): random
//! fleets of pods on 2–4 replicas, NACK sequences, pods moving, replicas lagging, freezing
//! (their reports stop), dying and losing their endpoint, reports going stale.
//!
//! - **Safety**: the fleet never taints where the single-process rule over every pod
//!   connected to a replica that reports would not (a replica whose writes stopped is
//!   judged by what it last reported: that window is documented);
//! - **Liveness**: once every replica reports its current state and none lags, the fleet
//!   taints exactly when the single-process rule does;
//! - a crashed replica stops blocking once its endpoint is gone and its report is stale.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use marin3r_control_plane::fleet::{FRESHNESS, Fleet, Judged, Report, Verdict};
use marin3r_envoyconfig::ResourceType;
use marin3r_envoyconfig::discoveryservicereplica::NodeDigest;
use proptest::prelude::*;

const N: u64 = 3;
const NODE: &str = "kuard";
const VERSION: &str = "L2";

fn epoch() -> Time {
    Time(Timestamp::from_second(1_700_000_000).unwrap())
}

fn judged() -> Judged {
    Judged {
        uid: "uid-r2".into(),
        epoch: Some(epoch()),
    }
}

#[derive(Debug, Clone)]
enum Action {
    Connect { pod: usize, replica: usize },
    Disconnect { pod: usize },
    Nack { pod: usize },
    Advance { secs: u64 },
    Freeze { replica: usize },
    Thaw { replica: usize },
    Kill { replica: usize },
    DropEndpoint { replica: usize },
    Lag { replica: usize },
    CatchUp { replica: usize },
}

fn action(replicas: usize, pods: usize) -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0..pods, 0..replicas).prop_map(|(pod, replica)| Action::Connect { pod, replica }),
        1 => (0..pods).prop_map(|pod| Action::Disconnect { pod }),
        6 => (0..pods).prop_map(|pod| Action::Nack { pod }),
        2 => (1u64..20).prop_map(|secs| Action::Advance { secs }),
        1 => (0..replicas).prop_map(|replica| Action::Freeze { replica }),
        1 => (0..replicas).prop_map(|replica| Action::Thaw { replica }),
        1 => (0..replicas).prop_map(|replica| Action::Kill { replica }),
        1 => (0..replicas).prop_map(|replica| Action::DropEndpoint { replica }),
        1 => (0..replicas).prop_map(|replica| Action::Lag { replica }),
        1 => (0..replicas).prop_map(|replica| Action::CatchUp { replica }),
    ]
}

#[derive(Debug, Clone)]
struct Replica {
    alive: bool,
    /// Writes stopped (the API server does not take them): the report stays as it was.
    frozen: bool,
    endpoint: bool,
    lagging: bool,
    report: Option<Report>,
}

#[derive(Debug, Clone, Default)]
struct Pod {
    replica: Option<usize>,
    nacks: u64,
}

struct Sim {
    now: u64,
    replicas: Vec<Replica>,
    pods: Vec<Pod>,
}

fn at(secs: u64) -> SystemTime {
    marin3r_testkit::unix_time(1_800_000_000 + secs)
}

impl Sim {
    fn new(replicas: usize, pods: usize) -> Self {
        let mut sim = Self {
            now: 0,
            replicas: vec![
                Replica {
                    alive: true,
                    frozen: false,
                    endpoint: true,
                    lagging: false,
                    report: None,
                };
                replicas
            ],
            pods: vec![Pod::default(); pods],
        };
        sim.write_reports();
        sim
    }

    fn name(r: usize) -> String {
        format!("ds-{r}")
    }

    /// What replica `r` would report now: its pods of the node and their smallest count.
    fn digest(&self, r: usize) -> NodeDigest {
        let pods: Vec<&Pod> = self.pods.iter().filter(|p| p.replica == Some(r)).collect();
        let min = pods.iter().map(|p| p.nacks).min().unwrap_or(0).min(N);
        let lagging = self.replicas[r].lagging;
        NodeDigest {
            node_id: NODE.into(),
            revision: Some(if lagging { "uid-r1" } else { "uid-r2" }.into()),
            epoch: Some(epoch()),
            versions: BTreeMap::from([(
                "listener".into(),
                if lagging { "L1" } else { VERSION }.into(),
            )]),
            pods: pods.len() as u64,
            min_nacks: if min > 0 {
                BTreeMap::from([("listener".into(), min)])
            } else {
                BTreeMap::new()
            },
            message: None,
            silent_pods: Vec::new(),
        }
    }

    /// Every live replica whose writes go through reports its current state.
    fn write_reports(&mut self) {
        for r in 0..self.replicas.len() {
            if self.replicas[r].alive && !self.replicas[r].frozen {
                let report = Report::new(Some(at(self.now)), [self.digest(r)]);
                self.replicas[r].report = Some(report);
            }
        }
    }

    fn apply(&mut self, a: &Action) {
        match *a {
            Action::Connect { pod, replica } => {
                if self.replicas[replica].alive {
                    // A pod that moves starts a fresh stream: Envoy resends its NACKs
                    // there only for pushes it gets, so it starts from 0.
                    if self.pods[pod].replica != Some(replica) {
                        self.pods[pod] = Pod {
                            replica: Some(replica),
                            nacks: 0,
                        };
                    }
                }
            }
            Action::Disconnect { pod } => self.pods[pod].replica = None,
            Action::Nack { pod } => {
                if self.pods[pod].replica.is_some() {
                    self.pods[pod].nacks += 1;
                }
            }
            Action::Advance { secs } => self.now += secs,
            Action::Freeze { replica } => self.replicas[replica].frozen = true,
            Action::Thaw { replica } => self.replicas[replica].frozen = false,
            Action::Kill { replica } => {
                self.replicas[replica].alive = false;
                for p in &mut self.pods {
                    if p.replica == Some(replica) {
                        p.replica = None;
                    }
                }
            }
            Action::DropEndpoint { replica } => {
                if !self.replicas[replica].alive {
                    self.replicas[replica].endpoint = false;
                }
            }
            Action::Lag { replica } => self.replicas[replica].lagging = true,
            Action::CatchUp { replica } => self.replicas[replica].lagging = false,
        }
        self.write_reports();
    }

    fn fleet(&self) -> Fleet {
        Fleet {
            reports: self
                .replicas
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.report.clone().map(|rep| (Self::name(i), rep)))
                .collect(),
            endpoints: self
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.endpoint)
                .map(|(i, _)| Self::name(i))
                .collect(),
            now: Some(at(self.now)),
        }
    }

    fn verdict(&self) -> Verdict {
        self.fleet()
            .verdict(NODE, &judged(), ResourceType::Listener, VERSION, N)
    }

    /// The single-process rule over the pods of the replicas that report (every live,
    /// not frozen one): at least one pod, every one NACKed at least N times.
    fn single_process_rule(&self, replicas: &BTreeSet<usize>) -> bool {
        let pods: Vec<&Pod> = self
            .pods
            .iter()
            .filter(|p| p.replica.is_some_and(|r| replicas.contains(&r)))
            .collect();
        !pods.is_empty() && pods.iter().all(|p| p.nacks >= N)
    }

    fn reporting(&self) -> BTreeSet<usize> {
        (0..self.replicas.len())
            .filter(|r| self.replicas[*r].alive && !self.replicas[*r].frozen)
            .collect()
    }

    /// Every replica reports its current state, none lags, and the endpoints are the
    /// live replicas.
    fn settled(&self) -> bool {
        self.replicas
            .iter()
            .all(|r| !r.frozen && !r.lagging && r.alive == r.endpoint)
            && self.replicas.iter().all(|r| {
                r.alive
                    || r.report
                        .as_ref()
                        .is_some_and(|rep| !rep.is_fresh(at(self.now)))
            })
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_fleet_never_taints_where_the_single_process_rule_would_not(
        (replicas, pods, actions) in (2usize..=4, 1usize..=6).prop_flat_map(|(r, p)| {
            (Just(r), Just(p), proptest::collection::vec(action(r, p), 0..60))
        })
    ) {
        let mut sim = Sim::new(replicas, pods);
        for a in &actions {
            sim.apply(a);
            let verdict = sim.verdict();
            if verdict == Verdict::Rejected {
                // Every pod of a replica that reports its current state rejected N times,
                // and none of those replicas serves another revision.
                let reporting = sim.reporting();
                for p in &sim.pods {
                    if let Some(r) = p.replica.filter(|r| reporting.contains(r)) {
                        prop_assert!(p.nacks >= N, "pod on {r} with {} NACKs, after {a:?}", p.nacks);
                        prop_assert!(!sim.replicas[r].lagging, "lagging replica {r} with pods");
                    }
                }
                prop_assert!(sim.fleet().pods(NODE) > 0, "a taint needs a pod somewhere");
            }
            if sim.settled() {
                let alive: BTreeSet<usize> =
                    (0..replicas).filter(|r| sim.replicas[*r].alive).collect();
                prop_assert_eq!(
                    verdict == Verdict::Rejected,
                    sim.single_process_rule(&alive),
                    "settled fleet disagrees with the single-process rule after {:?}", a
                );
            }
        }
    }

    #[test]
    fn once_a_crashed_replica_is_gone_the_others_decide(
        replicas in 2usize..=4,
        crashed in 0usize..4,
        nacks_before_crash in 0u64..3,
    ) {
        let crashed = crashed % replicas;
        let mut sim = Sim::new(replicas, replicas);
        for pod in 0..replicas {
            sim.apply(&Action::Connect { pod, replica: pod });
        }
        for _ in 0..nacks_before_crash {
            sim.apply(&Action::Nack { pod: crashed });
        }
        sim.apply(&Action::Kill { replica: crashed });
        // Its pod reconnects elsewhere and, like every other pod, rejects N times.
        let survivor = (crashed + 1) % replicas;
        sim.apply(&Action::Connect { pod: crashed, replica: survivor });
        for pod in 0..replicas {
            for _ in 0..N {
                sim.apply(&Action::Nack { pod });
            }
        }
        // While its endpoint is there, the dead replica vetoes (missing report after
        // it is stale): no taint from a partial view...
        prop_assert_ne!(sim.verdict(), Verdict::Rejected);
        sim.apply(&Action::DropEndpoint { replica: crashed });
        // ...and once its report is stale too, the others decide.
        sim.apply(&Action::Advance { secs: FRESHNESS.as_secs() + 1 });
        prop_assert_eq!(sim.verdict(), Verdict::Rejected);
    }
}
