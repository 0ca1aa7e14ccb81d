//! What each watched change reconciles: a revision change its EnvoyConfig and the
//! revision's group; a Secret or EndpointSlice change the elected revision of each
//! EnvoyConfig that reads it ([`elected_readers`], from the group index); a deleted
//! injected Pod clears its NACK counts.

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource as _, ResourceExt as _};
use tokio::sync::mpsc;

use super::group::{self, Group, GroupIndex};
use super::{ConfigRef, POD_NODE_ID_ANNOTATION, POD_SELECTOR, RevisionRef, plan, source};
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_kube::Lenient;
use marin3r_kube::watch::watch;

/// The object of a live change (not of the initial list, which reconciles everything
/// anyway).
pub(super) fn changed<K>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) => Some(o),
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => None,
    }
}

pub(super) async fn send_all<T>(tx: mpsc::Sender<T>, items: Vec<T>) {
    for item in items {
        let _ = tx.send(item).await;
    }
}

/// For a revision change: its EnvoyConfig, and every revision of that EnvoyConfig (the
/// group's members, from the index: no scan of the revisions).
pub(super) fn revision_event_targets(
    groups: &GroupIndex,
    event: &watcher::Event<Lenient<EnvoyConfigRevision>>,
) -> Option<(ConfigRef, Vec<RevisionRef>)> {
    let changed = changed(event)?;
    let key = group::key_of(changed.meta())?;
    let owner = plan::owner(changed.meta())?;
    let config = ObjectRef::new(&owner.name).within(&key.0);
    Some((config, groups.refs(&key)))
}

/// The elected revision of every EnvoyConfig of `namespace` (`None`: of every
/// namespace) for which `reads` holds: what a Secret or EndpointSlice change reconciles.
/// Only the elected revision (the topmost untainted one) is resolved and served, so one
/// trigger per EnvoyConfig that reads the object is enough; its siblings follow through
/// the revision events its status write causes, if any. One lookup per revision of the
/// namespace's groups, whatever the number of EnvoyConfigs that read the object.
pub fn elected_readers(
    groups: &GroupIndex,
    namespace: Option<&str>,
    reads: impl Fn(&EnvoyConfigRevision) -> bool,
) -> Vec<RevisionRef> {
    groups.scan(namespace, |key, members| {
        // The elected revision is one of the group: a group none of whose revisions
        // reads the object is skipped before it is ordered and elected.
        if !members.iter().filter_map(|m| m.valid().ok()).any(&reads) {
            return None;
        }
        let group = Group::new(&key.0, &key.1, members);
        let elected = group.elected()?;
        reads(elected).then(|| ObjectRef::new(&elected.name_any()).within(&key.0))
    })
}

/// The elected revisions that read Secret `secret` (see [`elected_readers`]).
pub fn secret_readers(groups: &GroupIndex, secret: &Secret) -> Vec<RevisionRef> {
    let (Some(namespace), name) = (secret.namespace(), secret.name_any()) else {
        return Vec::new();
    };
    elected_readers(groups, Some(&namespace), |r| {
        plan::referenced_secrets(&r.spec).contains(&name)
    })
}

/// The elected revisions that read any Secret: what a re-list of the Secrets
/// reconciles (a change made while the watch was down is not seen as an event).
pub fn all_secret_readers(groups: &GroupIndex) -> Vec<RevisionRef> {
    elected_readers(groups, None, |r| {
        !plan::referenced_secrets(&r.spec).is_empty()
    })
}

/// The elected revisions whose `generateFromEndpointSlices` selects one of the label
/// sets `changes` (what [`SliceIndex::apply_watcher_event`] returns: a slice's old and
/// new labels) in its namespace (see [`elected_readers`]).
pub fn slice_readers(groups: &GroupIndex, changes: &[source::LabelSet]) -> Vec<RevisionRef> {
    if changes.is_empty() {
        return Vec::new();
    }
    let mut by_namespace: std::collections::BTreeMap<
        &str,
        Vec<&std::collections::BTreeMap<String, String>>,
    > = std::collections::BTreeMap::new();
    for (ns, labels) in changes {
        by_namespace.entry(ns.as_str()).or_default().push(labels);
    }
    by_namespace
        .into_iter()
        .flat_map(|(ns, label_sets)| {
            elected_readers(groups, Some(ns), |r| {
                label_sets
                    .iter()
                    .any(|labels| plan::uses_endpoint_slices(&r.spec, labels))
            })
        })
        .collect()
}

/// The Pod watch: metadata only (`PartialObjectMeta`), injected Pods only
/// ([`POD_SELECTOR`]), and no store is kept (only deletions are acted upon), so its memory
/// is one list page, whatever the number of Pods (`bench/examples/pod_watch.rs`).
pub fn pod_watch_config() -> watcher::Config {
    watcher::Config::default().labels(&plan::equality_selector(POD_SELECTOR.0, POD_SELECTOR.1))
}

/// Forgets the NACK counts of deleted injected pods (matched by name, the `pod_name` of
/// their Envoy's node metadata), so a new pod with the same name (StatefulSets) starts
/// clean.
pub(super) async fn watch_pods(api: Api<PartialObjectMeta<Pod>>, xds: crate::Context) {
    let stream = watch(api, pod_watch_config());
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Delete(pod)) => {
                let name = pod.name_any();
                let nodes = match pod.annotations().get(POD_NODE_ID_ANNOTATION) {
                    Some(node) => vec![node.clone()],
                    None => xds.cache.node_ids(),
                };
                for node in nodes {
                    xds.stats.clear_pod(&node, &name);
                }
                tracing::debug!(pod = name, "pod deleted; NACK counts cleared");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(kind = "Pod", error = %e, "watch failed; retrying"),
        }
    }
}
