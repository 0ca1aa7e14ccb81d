//! What one revision's reconcile publishes, decided without I/O: a pure function of the
//! revision's [`Group`], what this replica serves its node, the resolver (Secrets and
//! EndpointSlices from the watch caches) and a NACK view. The reconcile
//! (`controller.rs`) only picks the NACK view (its own streams, or the fleet on the HA
//! leader) and carries the verdict out (cache, status).

use std::collections::BTreeMap;

use super::group::{Group, same_object};
use super::plan::{self, Outcome};
use crate::fleet::{Judged, Served};
use crate::nacks::NackView;
use crate::publisher::{self, Publish, Resolution};
use crate::revisions::{Revision, Revisions};
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_xds::ResourceType;

/// A revision that may be published or tainted: the elected one of its group, or the
/// one this replica serves its node. Any other revision is not a candidate
/// ([`Candidate::of`] is `None`) and nothing is resolved for it.
#[derive(Debug)]
pub struct Candidate<'a> {
    ecr: &'a EnvoyConfigRevision,
    /// The engine of the group's live revisions; the served one's versions are what is
    /// served (the coalesced status may not show them yet).
    engine: Revisions,
    live: Vec<&'a EnvoyConfigRevision>,
    served: Option<String>,
}

/// What the reconcile of a candidate does.
#[derive(Debug)]
pub enum Verdict {
    /// Tainted, waiting, or not the one to publish: only the status changes.
    Settled(Outcome),
    /// Set the cache to this (after checking, under the publish lock, that the revision
    /// is still elected).
    Publish(Box<Publish>),
}

impl<'a> Candidate<'a> {
    /// `ecr` as a candidate of `group`, given what this replica serves its node
    /// (`served`); `None` when it is neither elected nor served (it answers "not
    /// elected" without resolving anything).
    pub fn of(
        group: &'a Group,
        ecr: &'a EnvoyConfigRevision,
        served: Option<&Served>,
    ) -> Option<Self> {
        let is_served =
            served.is_some_and(|s| same_object(ecr, Some(s.name.as_str()), Some(s.uid.as_str())));
        if !group.is_elected(ecr) && !is_served {
            return None;
        }
        let live = group.live();
        let mut engine = plan::engine(&ecr.spec.node_id, &live);
        if let Some(s) = served {
            judge_what_is_served(&mut engine, &live, s);
        }
        Some(Self {
            ecr,
            engine,
            live,
            served: served.map(|s| s.version.clone()),
        })
    }

    /// The engine of the group (what the revision metrics record on a publication).
    pub fn engine(&self) -> &Revisions {
        &self.engine
    }

    /// The group's published revision as the fleet judgement names it (its UID and
    /// its last publication): what the HA leader's fleet view judges.
    pub fn judged(&self) -> Option<Judged> {
        let published = self.engine.published()?;
        let ecr = self
            .live
            .iter()
            .rev()
            .find(|e| e.spec.version == published.version)?;
        Judged::of(ecr)
    }

    /// The verdict for this revision: [`publisher::decide`] (the one rule of both modes)
    /// for its group, read for this revision's version.
    pub fn decide(
        &self,
        resolve: impl FnMut(&Revision) -> Resolution,
        nacks: &dyn NackView,
        threshold: u64,
    ) -> Verdict {
        let decision = publisher::decide(
            &self.engine,
            self.served.as_deref(),
            resolve,
            nacks,
            threshold,
        );
        let version = &self.ecr.spec.version;
        if let Some(taint) = decision.taints.into_iter().find(|t| t.version == *version) {
            return Verdict::Settled(Outcome::Tainted {
                reason: taint.cause.as_str(),
                message: taint.reason,
            });
        }
        if let Some(w) = decision.waiting.filter(|w| w.version == *version) {
            return Verdict::Settled(Outcome::OutOfSync {
                reason: "DependenciesNotReady",
                message: w.reason,
            });
        }
        match decision.publish.filter(|p| p.version == *version) {
            Some(p) => Verdict::Publish(Box::new(p)),
            None => Verdict::Settled(Outcome::NotElected),
        }
    }
}

/// The NACKs are judged against what this replica serves (`served`), which the
/// coalesced status may not show yet: the served revision's versions in the engine
/// become the ones in the cache.
fn judge_what_is_served(engine: &mut Revisions, live: &[&EnvoyConfigRevision], served: &Served) {
    if !live
        .iter()
        .any(|e| e.metadata.uid.as_deref() == Some(served.uid.as_str()))
    {
        return;
    }
    if let Some(r) = engine
        .revisions
        .iter_mut()
        .find(|r| r.version == served.version)
    {
        r.provides_versions.clone_from(&served.versions);
    }
}

/// The per-type versions of `ecr` to judge against the NACKs: what this replica serves
/// its node when it serves `ecr` (`served`; the status may lag behind), else what its
/// status says.
pub fn served_versions(
    ecr: &EnvoyConfigRevision,
    served: Option<Served>,
) -> Option<BTreeMap<ResourceType, String>> {
    match served {
        Some(s) if ecr.metadata.uid.as_deref() == Some(s.uid.as_str()) => Some(s.versions),
        _ => Some(
            ecr.status
                .as_ref()?
                .provides_versions
                .as_ref()?
                .to_versions(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::NoVerdict;
    use marin3r_kube::Lenient;
    use serde_json::json;
    use std::sync::Arc;

    fn revision(
        name: &str,
        version: &str,
        minute: u32,
        status: serde_json::Value,
    ) -> Arc<Lenient<EnvoyConfigRevision>> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "marin3r.3scale.net/v1alpha1",
                "kind": "EnvoyConfigRevision",
                "metadata": {
                    "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                    "annotations": {
                        marin3r_wire::APPLIED_AT_ANNOTATION: format!("2026-01-01T00:{minute:02}:00.000000Z")
                    },
                    "ownerReferences": [{
                        "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                        "name": "ec", "uid": "ec-uid", "controller": true
                    }]
                },
                "spec": {"nodeID": "node", "version": version, "resources": [
                    {"type": "cluster", "value": {
                        "name": format!("c{version}"), "connect_timeout": "1s", "type": "STATIC"
                    }}
                ]},
                "status": status
            }))
            .expect("a revision"),
        )
    }

    /// A view in which every pod rejected everything.
    struct RejectAll;
    impl NackView for RejectAll {
        fn rejected_by_all_pods(&self, _: &str, _: ResourceType, _: &str, _: u64) -> bool {
            true
        }
    }

    fn resolve_ready(count: &std::cell::Cell<u32>) -> impl FnMut(&Revision) -> Resolution + '_ {
        let memo = marin3r_envoyconfig::memo::DecodeMemo::new();
        move |rev| {
            count.set(count.get() + 1);
            let none = marin3r_envoyconfig::envoyconfig::NoSecrets;
            publisher::resolution(&rev.spec, &none, &memo)
        }
    }

    #[test]
    fn a_revision_that_is_neither_elected_nor_served_never_resolves() {
        let old = revision("old", "1", 1, json!({}));
        let new = revision("new", "2", 2, json!({}));
        let group = Group::new("default", "ec-uid", [old.clone(), new]);
        let old = old.valid().expect("valid");
        assert!(Candidate::of(&group, old, None).is_none());
    }

    #[test]
    fn the_elected_revision_is_published_and_a_rejected_served_one_is_tainted() {
        let served_status = json!({"published": true, "providesVersions": {"clusters": "v1"}});
        let a = revision("a", "1", 1, served_status);
        let group = Group::new("default", "ec-uid", [a.clone()]);
        let a = a.valid().expect("valid");
        let count = std::cell::Cell::new(0);
        let candidate = Candidate::of(&group, a, None).expect("elected");
        match candidate.decide(resolve_ready(&count), &NoVerdict, 1) {
            Verdict::Publish(p) => assert_eq!(p.version, "1"),
            other => panic!("expected a publication, got {other:?}"),
        }
        assert_eq!(count.get(), 1);
        // Served and rejected by every pod: tainted, with the engine's reason.
        let served = Served {
            uid: "uid-a".into(),
            name: "a".into(),
            version: "1".into(),
            epoch: None,
            versions: BTreeMap::from([(ResourceType::Cluster, "v1".to_string())]),
        };
        let candidate = Candidate::of(&group, a, Some(&served)).expect("served");
        match candidate.decide(resolve_ready(&count), &RejectAll, 1) {
            Verdict::Settled(Outcome::Tainted { .. }) => {}
            other => panic!("expected a taint, got {other:?}"),
        }
        assert!(candidate.judged().is_some_and(|j| j.uid == "uid-a"));
    }
}
