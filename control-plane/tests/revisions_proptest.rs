//! Property tests of the self-healing revision engine (`marin3r_control_plane::revisions`,
//! design.md §4): random sequences of apply / taint / remove / evaluate, checked after
//! every step against the engine's invariants and against a small reference model of the
//! rules:
//!
//! - the published revision is always the topmost untainted one, and the cache state
//!   follows from it (InSync / Rollback / RollbackFailed);
//! - at most `MAX_REVISIONS` are kept, versions are unique;
//! - the desired (last applied) revision is always kept, on top;
//! - the rollback target (the newest untainted revision below the desired one) survives
//!   every trim;
//! - a taint is never lifted (only removing the revision forgets it);
//! - `evaluate` only ever taints the published revision, and only when every pod
//!   rejected what it provides.
#![allow(clippy::unwrap_used, clippy::panic)] // helpers outside #[test] fns

mod fixtures;

use std::collections::{BTreeMap, BTreeSet};

use marin3r_control_plane::revisions::{MAX_REVISIONS, NackView, Revisions};
use marin3r_envoyconfig::config_version;
use marin3r_envoyconfig::envoyconfig::{CacheState, EnvoyConfigSpec};
use marin3r_xds::ResourceType;
use proptest::prelude::*;

/// Spec `n` of the 16 the operations pick from.
fn spec(n: u8) -> EnvoyConfigSpec {
    serde_json::from_value(fixtures::spec(u64::from(n))).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// Apply spec `n` (16 distinct specs, so re-applies and trims both happen).
    Apply(u8),
    /// Taint the revision at this index (modulo the count).
    Taint(usize),
    /// Delete the revision at this index (modulo the count).
    Remove(usize),
    /// Publish, then evaluate NACK stats in which every pod rejected (or not) what the
    /// published revision provides.
    Evaluate { rejected: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..16).prop_map(Op::Apply),
        2 => (0usize..16).prop_map(Op::Taint),
        1 => (0usize..16).prop_map(Op::Remove),
        2 => any::<bool>().prop_map(|rejected| Op::Evaluate { rejected }),
    ]
}

/// NACK view in which every pod rejected exactly the listed listener versions.
struct Rejected(BTreeSet<String>);

impl NackView for Rejected {
    fn rejected_by_all_pods(&self, _: &str, t: ResourceType, v: &str, _: u64) -> bool {
        t == ResourceType::Listener && self.0.contains(v)
    }
}

/// The reference model: (version, tainted), oldest first.
#[derive(Debug, Default)]
struct Model(Vec<(String, bool)>);

impl Model {
    fn apply(&mut self, version: &str) {
        match self.0.iter().position(|(v, _)| v == version) {
            Some(i) => {
                let r = self.0.remove(i);
                self.0.push(r);
            }
            None => self.0.push((version.to_string(), false)),
        }
        while self.0.len() > MAX_REVISIONS {
            let below_top = self.0.len() - 1;
            let target = self.0[..below_top].iter().rposition(|(_, t)| !t);
            let i = (0..below_top).find(|i| Some(*i) != target).unwrap();
            self.0.remove(i);
        }
    }
}

fn listed(r: &Revisions) -> Vec<(String, bool)> {
    r.revisions
        .iter()
        .map(|x| (x.version.clone(), x.tainted.is_some()))
        .collect()
}

fn provides(version: &str) -> BTreeMap<ResourceType, String> {
    BTreeMap::from([(ResourceType::Listener, format!("L-{version}"))])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn revision_engine_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let mut r = Revisions::new("prop");
        let mut model = Model::default();
        let mut tainted: BTreeSet<String> = BTreeSet::new();
        let mut desired: Option<String> = None;
        let now = |i: usize| marin3r_testkit::unix_time(i as u64);

        for (step, op) in ops.iter().enumerate() {
            match op {
                Op::Apply(n) => {
                    // The rollback target before the apply: the newest untainted revision
                    // other than the one being applied.
                    let version = config_version(&spec(*n));
                    let target_before = r
                        .revisions
                        .iter()
                        .rev()
                        .find(|x| x.tainted.is_none() && x.version != version)
                        .map(|x| x.version.clone());
                    prop_assert_eq!(r.apply(&std::sync::Arc::new(spec(*n)), now(step)), version.clone());
                    model.apply(&version);
                    desired = Some(version.clone());
                    if let Some(target) = target_before {
                        let below: Vec<&str> = r.revisions[..r.revisions.len() - 1]
                            .iter()
                            .filter(|x| x.tainted.is_none())
                            .map(|x| x.version.as_str())
                            .collect();
                        prop_assert_eq!(below.last().copied(), Some(target.as_str()),
                            "step {}: the rollback target was trimmed", step);
                    }
                }
                Op::Taint(i) => {
                    if !r.revisions.is_empty() {
                        let i = i % r.revisions.len();
                        let version = r.revisions[i].version.clone();
                        let changed = r.taint(&version, "test");
                        prop_assert_eq!(changed, !model.0[i].1);
                        model.0[i].1 = true;
                        tainted.insert(version);
                    }
                }
                Op::Remove(i) => {
                    if !r.revisions.is_empty() {
                        let i = i % r.revisions.len();
                        let version = r.revisions[i].version.clone();
                        prop_assert!(r.remove(&version));
                        prop_assert!(!r.remove(&version));
                        model.0.remove(i);
                        tainted.remove(&version);
                        if desired.as_deref() == Some(version.as_str()) {
                            desired = r.desired().map(|d| d.version.clone());
                        }
                    }
                }
                Op::Evaluate { rejected } => {
                    let published = r.published().map(|p| p.version.clone());
                    if let Some(p) = &published {
                        r.mark_newly_published(p, provides(p), now(step));
                    }
                    let view = Rejected(if *rejected {
                        published.iter().map(|p| format!("L-{p}")).collect()
                    } else {
                        BTreeSet::new()
                    });
                    let verdict = r.evaluate(&view, 5);
                    match (&published, rejected, &verdict) {
                        (Some(p), true, Some(t)) => {
                            prop_assert_eq!(&t.version, p, "only the published revision is judged");
                            prop_assert!(r.taint(&t.version, t.reason.clone()));
                            let i = model.0.iter().position(|(v, _)| v == p).unwrap();
                            model.0[i].1 = true;
                            tainted.insert(p.clone());
                        }
                        (_, _, None) => prop_assert!(published.is_none() || !rejected,
                            "step {}: a rejected published revision was not tainted", step),
                        _ => prop_assert!(false, "step {}: unexpected verdict {:?}", step, verdict),
                    }
                }
            }

            // The engine matches the model.
            prop_assert_eq!(listed(&r), model.0.clone(), "step {}: {:?}", step, op);
            // Bounded, unique.
            prop_assert!(r.revisions.len() <= MAX_REVISIONS);
            let unique: BTreeSet<&str> = r.revisions.iter().map(|x| x.version.as_str()).collect();
            prop_assert_eq!(unique.len(), r.revisions.len());
            // The desired revision is kept, on top.
            prop_assert_eq!(r.desired().map(|d| d.version.clone()), desired.clone());
            // Published = topmost untainted; the cache state follows.
            let topmost_untainted = r.revisions.iter().rev().find(|x| x.tainted.is_none());
            prop_assert_eq!(r.published().map(|p| &p.version), topmost_untainted.map(|p| &p.version));
            let expected_state = match (r.desired(), r.published()) {
                (None, _) => None,
                (Some(d), Some(p)) if d.version == p.version => Some(CacheState::InSync),
                (Some(_), Some(_)) => Some(CacheState::Rollback),
                (Some(_), None) => Some(CacheState::RollbackFailed),
            };
            prop_assert_eq!(r.cache_state(), expected_state);
            // A taint is never lifted while the revision exists (a trimmed or removed
            // revision is forgotten: applied again later, it starts untainted).
            tainted.retain(|v| r.revisions.iter().any(|x| &x.version == v));
            for x in &r.revisions {
                prop_assert_eq!(x.tainted.is_some(), tainted.contains(&x.version),
                    "step {}: taint of {} changed", step, &x.version);
            }
        }
    }
}
