//! One home per revision group: the EnvoyConfigRevisions one EnvoyConfig controls,
//! ordered, with the elected one ([`Group`], pure), and the event-fed index that finds a
//! group's members by key ([`GroupIndex`]) instead of a scan of the revision store.
//!
//! Every user of the election reads it here: the triggers (which revision a Secret or
//! EndpointSlice change reconciles), the revision reconcile (publish only the elected
//! one), the EnvoyConfig reconcile (its revisions), the fleet's `ReplicasInSync` and the
//! start-up load. The index is fed the revision watch's events *before* the watch cache
//! applies them ([`GroupIndex::apply`]), so a reconcile the cache's event triggers
//! always finds the new member; a member the cache does not hold yet is skipped until
//! its own event triggers the reconciles again. Modelled on kubert's
//! `IndexNamespacedResource` and Linkerd's policy-controller index: an index of keys,
//! the objects stay in the one cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};

use super::plan;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_kube::Lenient;

/// A revision group's key: its namespace and the UID of the EnvoyConfig that controls it
/// ([`plan::owner`], the one owner rule).
pub type GroupKey = (String, String);

type Member = Arc<Lenient<EnvoyConfigRevision>>;

/// The valid revisions of one EnvoyConfig (`namespace`, controller UID `uid`): the live
/// ones oldest first (the order every election uses, [`plan::order_key`]), the
/// terminating ones after them, and the elected one (the topmost untainted,
/// [`plan::elected`]). Built once per use from the index's lookups; pure.
#[derive(Debug, Clone)]
pub struct Group {
    namespace: String,
    uid: String,
    /// Live ones ordered, then terminating ones (valid only: the one validity filter).
    members: Vec<Member>,
    /// How many of `members` are live.
    live: usize,
    /// Index of the elected one in `members`.
    elected: Option<usize>,
}

/// The typed revision of a member that [`Group::new`] admitted (valid by construction).
fn typed(m: &Member) -> Option<&EnvoyConfigRevision> {
    m.valid().ok()
}

impl Group {
    /// The group of EnvoyConfig `uid` in `namespace` among `candidates`: the valid ones
    /// in that namespace that `uid` controls are kept, the rest ignored.
    pub fn new(namespace: &str, uid: &str, candidates: impl IntoIterator<Item = Member>) -> Self {
        let (mut live, terminating): (Vec<Member>, Vec<Member>) = candidates
            .into_iter()
            .filter(|m| {
                typed(m).is_some_and(|r| {
                    r.metadata.namespace.as_deref() == Some(namespace) && plan::owned_by(r, uid)
                })
            })
            .partition(|m| !plan::is_deleting(m.meta()));
        live.sort_by_cached_key(|m| typed(m).map(plan::order_key));
        // Every member is valid: positions in `ordered` are positions in `live`.
        let elected = {
            let ordered: Vec<&EnvoyConfigRevision> = live.iter().filter_map(typed).collect();
            plan::elected(&ordered).and_then(|e| ordered.iter().position(|r| std::ptr::eq(*r, e)))
        };
        Self {
            namespace: namespace.to_string(),
            uid: uid.to_string(),
            live: live.len(),
            members: live.into_iter().chain(terminating).collect(),
            elected,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The UID of the EnvoyConfig.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The live revisions, oldest first.
    pub fn live(&self) -> Vec<&EnvoyConfigRevision> {
        self.members[..self.live].iter().filter_map(typed).collect()
    }

    /// Every valid revision, terminating ones included (what the EnvoyConfig's plan
    /// waits for or deletes).
    pub fn all(&self) -> impl Iterator<Item = &EnvoyConfigRevision> {
        self.members.iter().filter_map(typed)
    }

    /// The revision to serve: the topmost untainted live one.
    pub fn elected(&self) -> Option<&EnvoyConfigRevision> {
        self.elected.and_then(|i| typed(&self.members[i]))
    }

    /// Whether `ecr` (by name and UID) is the elected revision.
    pub fn is_elected(&self, ecr: &EnvoyConfigRevision) -> bool {
        self.elected()
            .is_some_and(|e| same_object(e, ecr.metadata.name.as_deref(), ecr.uid().as_deref()))
    }
}

/// Whether `ecr` is the object named `name` with UID `uid`.
pub fn same_object(ecr: &EnvoyConfigRevision, name: Option<&str>, uid: Option<&str>) -> bool {
    ecr.metadata.name.as_deref() == name && ecr.metadata.uid.as_deref() == uid
}

/// The group key of a revision (`None`: no namespace or no controlling EnvoyConfig).
pub fn key_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<GroupKey> {
    Some((meta.namespace.clone()?, plan::owner(meta)?.uid.clone()))
}

type RevisionRef = ObjectRef<Lenient<EnvoyConfigRevision>>;

/// Which revisions each group has (by name, with the reference the watch cache is
/// looked up with, built once).
#[derive(Debug, Default)]
struct Keys {
    groups: BTreeMap<GroupKey, BTreeMap<String, RevisionRef>>,
    /// (namespace, name) → its group, to move or drop a member by name.
    member_of: HashMap<(String, String), GroupKey>,
}

impl Keys {
    fn insert(&mut self, obj: &Lenient<EnvoyConfigRevision>) {
        let meta = obj.meta();
        let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
            return;
        };
        let id = (namespace, name);
        let key = key_of(meta);
        if self.member_of.get(&id) == key.as_ref() {
            return;
        }
        self.remove_id(&id);
        if let Some(key) = key {
            let reference = ObjectRef::new(&id.1).within(&id.0);
            (self.groups.entry(key.clone()).or_default()).insert(id.1.clone(), reference);
            self.member_of.insert(id, key);
        }
    }

    fn remove(&mut self, obj: &Lenient<EnvoyConfigRevision>) {
        let meta = obj.meta();
        if let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) {
            self.remove_id(&(namespace, name));
        }
    }

    fn remove_id(&mut self, id: &(String, String)) {
        let Some(key) = self.member_of.remove(id) else {
            return;
        };
        if let Some(members) = self.groups.get_mut(&key) {
            members.remove(&id.1);
            if members.is_empty() {
                self.groups.remove(&key);
            }
        }
    }

    /// The groups of `namespace` (`None`: of every namespace).
    fn in_namespace<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a GroupKey, &'a BTreeMap<String, RevisionRef>)> + 'a {
        let all = namespace.is_none();
        let start = (namespace.unwrap_or_default().to_string(), String::new());
        self.groups
            .range(start..)
            .take_while(move |((ns, _), _)| all || Some(ns.as_str()) == namespace)
    }
}

#[derive(Debug, Default)]
struct IndexState {
    keys: Keys,
    /// A re-list in progress: the keys it has seen so far (replaces `keys` when done,
    /// as the watch cache does).
    relist: Option<Keys>,
}

/// The revision groups by key, fed by the revision watch ([`GroupIndex::apply`]); the
/// revisions themselves are read from the watch cache (`store`) by name.
#[derive(Clone)]
pub struct GroupIndex {
    store: Store<Lenient<EnvoyConfigRevision>>,
    state: Arc<RwLock<IndexState>>,
}

impl std::fmt::Debug for GroupIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupIndex").finish_non_exhaustive()
    }
}

impl GroupIndex {
    /// An empty index over the revision watch cache `store`.
    pub fn new(store: Store<Lenient<EnvoyConfigRevision>>) -> Self {
        Self {
            store,
            state: Arc::default(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, IndexState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one event of the revision watch (call it before the watch cache does).
    pub fn apply(&self, event: &watcher::Event<Lenient<EnvoyConfigRevision>>) {
        let mut guard = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *guard;
        match event {
            watcher::Event::Apply(o) => state.keys.insert(o),
            watcher::Event::Delete(o) => state.keys.remove(o),
            watcher::Event::Init => state.relist = Some(Keys::default()),
            watcher::Event::InitApply(o) => match &mut state.relist {
                Some(relist) => relist.insert(o),
                None => state.keys.insert(o),
            },
            watcher::Event::InitDone => {
                if let Some(relist) = state.relist.take() {
                    state.keys = relist;
                }
            }
        }
    }

    /// The keys of the groups in `namespace` (`None`: in every namespace).
    pub fn keys(&self, namespace: Option<&str>) -> Vec<GroupKey> {
        let state = self.read();
        state
            .keys
            .in_namespace(namespace)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// `f` of every group of `namespace` (`None`: of every namespace): its key and its
    /// cached members; the `Some` answers. One pass under the index's read lock (the
    /// watch cache's lookups take the cache's own lock; nothing holds the cache's lock
    /// while it takes the index's), no key copied.
    pub fn scan<T>(
        &self,
        namespace: Option<&str>,
        mut f: impl FnMut(&GroupKey, Vec<Member>) -> Option<T>,
    ) -> Vec<T> {
        let state = self.read();
        state
            .keys
            .in_namespace(namespace)
            .filter_map(|(key, members)| {
                let cached = members.values().filter_map(|r| self.store.get(r)).collect();
                f(key, cached)
            })
            .collect()
    }

    /// The members of group `key` as references (whatever their state or validity):
    /// what a change of one of them reconciles.
    pub fn refs(&self, key: &GroupKey) -> Vec<RevisionRef> {
        let state = self.read();
        (state.keys.groups.get(key)).map_or_else(Vec::new, |m| m.values().cloned().collect())
    }

    /// The cached objects of group `key` (one lookup each; a member the cache does not
    /// hold yet is left out).
    pub fn members(&self, key: &GroupKey) -> Vec<Member> {
        let state = self.read();
        (state.keys.groups.get(key)).map_or_else(Vec::new, |m| {
            m.values().filter_map(|r| self.store.get(r)).collect()
        })
    }

    /// The group of EnvoyConfig `uid` in `namespace`.
    pub fn group(&self, namespace: &str, uid: &str) -> Group {
        let key = (namespace.to_string(), uid.to_string());
        Group::new(namespace, uid, self.members(&key))
    }

    /// The group `ecr` belongs to (`None`: it has no controlling EnvoyConfig).
    pub fn group_of(&self, ecr: &EnvoyConfigRevision) -> Option<Group> {
        let (namespace, uid) = key_of(&ecr.metadata)?;
        Some(self.group(&namespace, &uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use serde_json::json;

    fn revision(
        name: &str,
        owner: &str,
        version: &str,
        applied: &str,
        tainted: bool,
    ) -> Lenient<EnvoyConfigRevision> {
        let mut doc = json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfigRevision",
            "metadata": {
                "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "annotations": {marin3r_wire::APPLIED_AT_ANNOTATION: applied},
                "ownerReferences": [{
                    "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                    "name": format!("ec-{owner}"), "uid": owner, "controller": true
                }]
            },
            "spec": {"nodeID": "node", "version": version, "resources": []}
        });
        if tainted {
            doc["status"] = json!({"tainted": true});
        }
        serde_json::from_value(doc).expect("a revision")
    }

    fn world() -> (
        GroupIndex,
        reflector::store::Writer<Lenient<EnvoyConfigRevision>>,
    ) {
        let (store, writer) = reflector::store();
        (GroupIndex::new(store), writer)
    }

    fn put(
        index: &GroupIndex,
        writer: &mut reflector::store::Writer<Lenient<EnvoyConfigRevision>>,
        event: watcher::Event<Lenient<EnvoyConfigRevision>>,
    ) {
        index.apply(&event);
        writer.apply_watcher_event(&event);
    }

    fn names(revs: &[&EnvoyConfigRevision]) -> Vec<String> {
        revs.iter().map(|r| r.name_any()).collect()
    }

    #[test]
    fn a_group_orders_its_live_revisions_and_elects_the_topmost_untainted_one() {
        let (index, mut w) = world();
        let t = |m: u32| format!("2026-01-01T00:{m:02}:00.000000Z");
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("c", "a", "3", &t(3), true)),
        );
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("a", "a", "1", &t(1), false)),
        );
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("b", "a", "2", &t(2), false)),
        );
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("x", "other", "9", &t(9), false)),
        );
        let group = index.group("default", "a");
        assert_eq!(names(&group.live()), ["a", "b", "c"]);
        assert_eq!(group.elected().map(|e| e.name_any()).as_deref(), Some("b"));
        let b = group.elected().cloned().expect("elected");
        assert!(group.is_elected(&b));
        assert_eq!(index.keys(Some("default")).len(), 2);
        assert_eq!(index.keys(Some("elsewhere")), Vec::<GroupKey>::new());
        // The same rule as the engine's (`Revisions::published`).
        let engine = plan::engine("node", &group.live());
        assert_eq!(engine.published().map(|p| p.version.as_str()), Some("2"));
    }

    #[test]
    fn deletions_moves_and_relists_keep_the_index_equal_to_the_cache() {
        let (index, mut w) = world();
        let t = "2026-01-01T00:00:00.000000Z";
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("a", "g1", "1", t, false)),
        );
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("b", "g1", "2", t, false)),
        );
        // b moves to another owner.
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("b", "g2", "2", t, false)),
        );
        assert_eq!(names(&index.group("default", "g1").live()), ["a"]);
        assert_eq!(names(&index.group("default", "g2").live()), ["b"]);
        put(
            &index,
            &mut w,
            watcher::Event::Delete(revision("a", "g1", "1", t, false)),
        );
        assert!(index.keys(None).iter().all(|(_, uid)| uid != "g1"));
        // A re-list that no longer has b but has c: the index follows it when done.
        put(&index, &mut w, watcher::Event::Init);
        put(
            &index,
            &mut w,
            watcher::Event::InitApply(revision("c", "g3", "1", t, false)),
        );
        assert_eq!(
            index.keys(None).len(),
            1,
            "the old keys serve until the re-list ends"
        );
        put(&index, &mut w, watcher::Event::InitDone);
        let keys = index.keys(None);
        assert_eq!(keys, [("default".to_string(), "g3".to_string())]);
        assert_eq!(names(&index.group("default", "g3").live()), ["c"]);
    }

    #[test]
    fn a_member_the_cache_does_not_hold_yet_is_left_out_and_invalid_ones_never_count() {
        let (index, mut w) = world();
        let t = "2026-01-01T00:00:00.000000Z";
        put(
            &index,
            &mut w,
            watcher::Event::Apply(revision("a", "g", "1", t, false)),
        );
        // Indexed, not yet in the cache (the watch cache applies after the index).
        index.apply(&watcher::Event::Apply(revision("b", "g", "2", t, false)));
        assert_eq!(index.refs(&("default".into(), "g".into())).len(), 2);
        assert_eq!(names(&index.group("default", "g").live()), ["a"]);
        // A malformed member is referenced (its change reconciles the group) but never
        // elected.
        let malformed: Lenient<EnvoyConfigRevision> = serde_json::from_value(json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigRevision",
            "metadata": {"name": "m", "namespace": "default", "ownerReferences": [{
                "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                "name": "ec-g", "uid": "g", "controller": true}]},
            "spec": {"nodeID": 7}
        }))
        .expect("lenient");
        assert!(malformed.valid().is_err());
        put(&index, &mut w, watcher::Event::Apply(malformed));
        assert_eq!(index.refs(&("default".into(), "g".into())).len(), 3);
        assert_eq!(names(&index.group("default", "g").live()), ["a"]);
    }
}
