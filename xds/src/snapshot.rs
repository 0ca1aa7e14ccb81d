//! Per-node snapshots of the resources to serve, and the cache that hands them to ADS
//! streams.
//!
//! A [`Snapshot`] holds, for every [`ResourceType`], a [`TypeSnapshot`]: the resources by
//! name and a per-type version. The version is a stable hash of the type's sorted
//! `(name, digest)` pairs (design.md §3: "per-type version = stable hash of the type's
//! resources; a push happens only when a version changes"), so two processes building
//! the same resources agree on it, and an unchanged type keeps its version across
//! snapshots. A type without resources has the version of the empty set,
//! [`EMPTY_VERSION`] (= `version_string(fnv1a64(b""))`).
//!
//! [`SnapshotCache`] stores one snapshot per `node.id` behind a
//! [`tokio::sync::watch`] channel: subscribers always see the latest value and never
//! an intermediate backlog, which is what an ADS stream needs (it diffs against what it
//! last sent anyway).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::watch;

use marin3r_envoyconfig::resource::{Resource, ResourceType, fnv1a64, version_string};

/// A resource as the `Any` of a discovery response (envoy-types' own protobuf `Any`; the
/// config model encodes into prost's, which has the same two fields).
pub fn wire_any(resource: &Resource) -> envoy_types::pb::google::protobuf::Any {
    envoy_types::pb::google::protobuf::Any {
        type_url: resource.body.type_url.clone(),
        value: resource.body.value.clone(),
    }
}

/// Version of a type that holds no resources: the FNV-1a 64 hash of zero bytes.
pub const EMPTY_VERSION: &str = "cbf29ce484222325";

/// Two resources of the same type share a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duplicate {kind} resource {name:?}")]
pub struct DuplicateResource {
    pub kind: ResourceType,
    pub name: String,
}

/// The resources of one type and their version.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeSnapshot {
    version: String,
    resources: BTreeMap<String, Resource>,
}

impl TypeSnapshot {
    /// A type without resources (version [`EMPTY_VERSION`]).
    pub fn empty() -> Self {
        Self {
            version: EMPTY_VERSION.to_string(),
            resources: BTreeMap::new(),
        }
    }

    /// Wraps resources keyed by name and computes their version.
    pub fn new(resources: BTreeMap<String, Resource>) -> Self {
        let version = type_version(resources.iter().map(|(name, r)| (name.as_str(), r.digest)));
        Self { version, resources }
    }

    /// Stable hash of the sorted `(name, digest)` pairs, as 16 hex digits.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resources by name (sorted).
    pub fn resources(&self) -> &BTreeMap<String, Resource> {
        &self.resources
    }

    /// One resource by name.
    pub fn get(&self, name: &str) -> Option<&Resource> {
        self.resources.get(name)
    }

    pub fn len(&self) -> usize {
        self.resources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

impl Default for TypeSnapshot {
    fn default() -> Self {
        Self::empty()
    }
}

/// Hashes `(name, digest)` pairs that are already sorted by name. Each name is length
/// prefixed so that no two different sets encode to the same bytes.
fn type_version<'a>(pairs: impl Iterator<Item = (&'a str, u64)>) -> String {
    let mut buf = Vec::new();
    for (name, digest) in pairs {
        buf.extend_from_slice(&(name.len() as u64).to_le_bytes());
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(&digest.to_le_bytes());
    }
    version_string(fnv1a64(&buf))
}

/// Everything served to one node: a [`TypeSnapshot`] for every [`ResourceType`].
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Indexed by the position of the type in [`ResourceType::ALL`].
    types: [TypeSnapshot; ResourceType::ALL.len()],
    /// When the cache published this snapshot (push latency metric).
    published_at: Option<Instant>,
    /// The placeholder of a node that has no published snapshot (see
    /// [`Snapshot::placeholder`]).
    held: bool,
}

/// Slot of a type in `Snapshot::types`: the enum is declared in push order, like `ALL`.
fn slot(t: ResourceType) -> usize {
    t as usize
}

impl Snapshot {
    /// Groups resources by type; a `(type, name)` pair may appear only once.
    pub fn new(resources: Vec<Resource>) -> Result<Self, DuplicateResource> {
        let mut by_type: [BTreeMap<String, Resource>; ResourceType::ALL.len()] =
            std::array::from_fn(|_| BTreeMap::new());
        for r in resources {
            let map = &mut by_type[slot(r.kind)];
            if map.contains_key(&r.name) {
                return Err(DuplicateResource {
                    kind: r.kind,
                    name: r.name,
                });
            }
            map.insert(r.name.clone(), r);
        }
        Ok(Self {
            types: by_type.map(TypeSnapshot::new),
            published_at: None,
            held: false,
        })
    }

    /// A snapshot without resources: every type has [`EMPTY_VERSION`].
    pub fn empty() -> Self {
        Self {
            types: std::array::from_fn(|_| TypeSnapshot::empty()),
            published_at: None,
            held: false,
        }
    }

    /// What streams of a node without a published snapshot see (a node nobody configured
    /// yet, e.g. right after a restart, or whose EnvoyConfig was removed): the ADS state
    /// machines record the requests but answer **nothing** until a snapshot is
    /// published, so an Envoy is never told that its listeners and clusters are gone.
    pub fn placeholder() -> Self {
        Self {
            held: true,
            ..Self::empty()
        }
    }

    /// Whether this is the [placeholder](Self::placeholder) of an unpublished node.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// The resources and version of one type.
    pub fn get(&self, t: ResourceType) -> &TypeSnapshot {
        &self.types[slot(t)]
    }

    /// The version of one type.
    pub fn version(&self, t: ResourceType) -> &str {
        self.get(t).version()
    }

    /// The resources of one type by name.
    pub fn resources(&self, t: ResourceType) -> &BTreeMap<String, Resource> {
        self.get(t).resources()
    }

    /// One resource.
    pub fn resource(&self, t: ResourceType, name: &str) -> Option<&Resource> {
        self.get(t).get(name)
    }

    /// Every type in push order.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceType, &TypeSnapshot)> {
        ResourceType::ALL.into_iter().zip(self.types.iter())
    }

    /// Per-type versions in push order.
    pub fn versions(&self) -> BTreeMap<ResourceType, String> {
        self.iter().map(|(t, ts)| (t, ts.version.clone())).collect()
    }

    /// Types whose version differs between `self` and `other`, in push order.
    pub fn changed_types(&self, other: &Snapshot) -> Vec<ResourceType> {
        ResourceType::ALL
            .into_iter()
            .filter(|t| self.version(*t) != other.version(*t))
            .collect()
    }

    /// Whether every type has the same version in both snapshots (same content).
    pub fn same_versions(&self, other: &Snapshot) -> bool {
        self.changed_types(other).is_empty()
    }

    /// Total number of resources.
    pub fn len(&self) -> usize {
        self.types.iter().map(TypeSnapshot::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.types.iter().all(TypeSnapshot::is_empty)
    }

    /// When [`SnapshotCache::set`] published this snapshot; `None` for a snapshot that
    /// was never published (e.g. the empty one handed to unknown nodes). The ADS shell
    /// uses it for the push latency histogram.
    pub fn published_at(&self) -> Option<Instant> {
        self.published_at
    }

    /// Returns the snapshot stamped with a publication time.
    pub fn with_published_at(mut self, at: Instant) -> Self {
        self.published_at = Some(at);
        self
    }
}

impl Default for Snapshot {
    fn default() -> Self {
        Self::empty()
    }
}

struct Entry {
    tx: watch::Sender<Arc<Snapshot>>,
    /// `false` for nodes that were only subscribed to, or removed.
    set: bool,
}

/// Snapshots by node id, shared between the config sources (writers) and the ADS
/// streams (readers). Cheap to clone (an `Arc` inside), thread-safe.
///
/// Semantics:
/// - [`set`](Self::set) notifies subscribers when at least one type version changed, or
///   when the node had no published snapshot.
/// - [`subscribe`](Self::subscribe) works for nodes that have no snapshot yet: they see
///   [`Snapshot::placeholder`] until one is set, and the ADS streams answer nothing
///   meanwhile (the discovery service never answers a node it has not published a
///   snapshot for: after a restart, a reconnecting Envoy keeps its config until its node
///   is published again, instead of being told that everything is gone).
/// - [`remove`](Self::remove) forgets the node (`get` → `None`, not in `node_ids`) and
///   hands its streams the placeholder, which pushes nothing: connected Envoys keep their
///   last configuration, like go-control-plane's `ClearSnapshot` leaves open watches
///   alone, and new streams of the node are held. Deleting a config by mistake therefore
///   never black-holes live traffic. Once nobody listens
///   the entry is dropped and a later subscriber starts from the empty snapshot.
#[derive(Clone, Default)]
pub struct SnapshotCache {
    inner: Arc<Mutex<HashMap<String, Entry>>>,
}

impl std::fmt::Debug for SnapshotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCache")
            .field("nodes", &self.node_ids())
            .finish()
    }
}

impl SnapshotCache {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock cannot leave the map half-updated (every
        // mutation is a single insert/replace), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores the snapshot of a node. Returns `true` when subscribers were notified,
    /// i.e. when some type version differs from the current value.
    pub fn set(&self, node_id: &str, snapshot: Snapshot) -> bool {
        let mut map = self.lock();
        match map.get_mut(node_id) {
            Some(entry) => {
                let was_set = std::mem::replace(&mut entry.set, true);
                let current = entry.tx.borrow().clone();
                if was_set && !current.is_held() && current.same_versions(&snapshot) {
                    return false;
                }
                entry
                    .tx
                    .send_replace(Arc::new(snapshot.with_published_at(Instant::now())));
                true
            }
            None => {
                let (tx, _) = watch::channel(Arc::new(snapshot.with_published_at(Instant::now())));
                map.insert(node_id.to_string(), Entry { tx, set: true });
                true
            }
        }
    }

    /// The snapshot of a node, if one was set (and not removed since).
    pub fn get(&self, node_id: &str) -> Option<Arc<Snapshot>> {
        let map = self.lock();
        map.get(node_id)
            .filter(|e| e.set)
            .map(|e| e.tx.borrow().clone())
    }

    /// A latest-value receiver for a node's snapshot. Nodes without a published snapshot
    /// start with [`Snapshot::placeholder`] (their streams are held) and are notified when
    /// a snapshot is set.
    pub fn subscribe(&self, node_id: &str) -> watch::Receiver<Arc<Snapshot>> {
        let mut map = self.lock();
        prune(&mut map);
        map.entry(node_id.to_string())
            .or_insert_with(|| Entry {
                tx: watch::channel(Arc::new(Snapshot::placeholder())).0,
                set: false,
            })
            .tx
            .subscribe()
    }

    /// Forgets a node's snapshot (see the type docs): its streams are handed the
    /// [`Snapshot::placeholder`], which pushes nothing (connected Envoys keep their config)
    /// and holds new streams. Returns whether a snapshot was set.
    pub fn remove(&self, node_id: &str) -> bool {
        let mut map = self.lock();
        let was_set = match map.get_mut(node_id) {
            Some(entry) => {
                if entry.set {
                    entry.tx.send_replace(Arc::new(Snapshot::placeholder()));
                }
                std::mem::replace(&mut entry.set, false)
            }
            None => false,
        };
        prune(&mut map);
        was_set
    }

    /// How many nodes the cache holds an entry for: those with a snapshot, and those
    /// only subscribed to whose last receiver may have gone since the last
    /// [`subscribe`](Self::subscribe) or [`remove`](Self::remove) (each drops the entries
    /// nobody needs any more). The bound under stream churn: the nodes set plus the
    /// nodes of the streams open at the peak.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids of the nodes that have a snapshot, sorted.
    pub fn node_ids(&self) -> Vec<String> {
        let map = self.lock();
        let mut ids: Vec<String> = map
            .iter()
            .filter(|(_, e)| e.set)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

/// Drops entries nobody needs any more: no snapshot set and no receiver alive.
fn prune(map: &mut HashMap<String, Entry>) {
    map.retain(|_, e| e.set || e.tx.receiver_count() > 0);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use prost_types::Any;

    /// A synthetic resource: the body is arbitrary bytes, the digest is derived from
    /// `content` so equal content gives equal digests.
    pub(crate) fn res(kind: ResourceType, name: &str, content: &str) -> Resource {
        Resource {
            kind,
            name: name.to_string(),
            body: Any {
                type_url: kind.type_url().to_string(),
                value: content.as_bytes().to_vec(),
            },
            digest: fnv1a64(format!("{name}/{content}").as_bytes()),
        }
    }

    pub(crate) fn snap(resources: &[(ResourceType, &str, &str)]) -> Snapshot {
        Snapshot::new(resources.iter().map(|(k, n, c)| res(*k, n, c)).collect()).unwrap()
    }

    #[test]
    fn slots_follow_push_order() {
        for (i, t) in ResourceType::ALL.into_iter().enumerate() {
            assert_eq!(slot(t), i);
        }
    }

    #[test]
    fn empty_version_is_hash_of_nothing() {
        assert_eq!(EMPTY_VERSION, version_string(fnv1a64(b"")));
        assert_eq!(TypeSnapshot::new(BTreeMap::new()).version(), EMPTY_VERSION);
        let s = Snapshot::empty();
        for t in ResourceType::ALL {
            assert_eq!(s.version(t), EMPTY_VERSION);
        }
        assert!(s.is_empty());
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn versions_are_stable_and_order_independent() {
        use ResourceType::*;
        let a = snap(&[
            (Cluster, "a", "1"),
            (Cluster, "b", "2"),
            (Listener, "l", "x"),
        ]);
        let b = snap(&[
            (Listener, "l", "x"),
            (Cluster, "b", "2"),
            (Cluster, "a", "1"),
        ]);
        assert!(a.same_versions(&b));
        assert_eq!(a.len(), 3);
        // Golden value: changing the hashing scheme changes every version Envoy sees.
        assert_eq!(
            a.version(Listener),
            type_version([("l", fnv1a64(b"l/x"))].into_iter())
        );
        assert_eq!(a.version(Route), EMPTY_VERSION);

        let c = snap(&[
            (Cluster, "a", "1"),
            (Cluster, "b", "3"),
            (Listener, "l", "x"),
        ]);
        assert_eq!(a.changed_types(&c), vec![Cluster]);
        // Same digests under different names are a different set.
        let d = snap(&[(Cluster, "ab", "1")]);
        let e = Snapshot::new(vec![Resource {
            name: "a".into(),
            ..res(Cluster, "ab", "1")
        }])
        .unwrap();
        assert_ne!(d.version(Cluster), e.version(Cluster));
    }

    #[test]
    fn duplicates_are_rejected() {
        use ResourceType::*;
        let err = Snapshot::new(vec![res(Route, "r", "1"), res(Route, "r", "2")]).unwrap_err();
        assert_eq!(
            err,
            DuplicateResource {
                kind: Route,
                name: "r".into()
            }
        );
        assert_eq!(err.to_string(), "duplicate route resource \"r\"");
        // Same name in different types is fine.
        assert!(Snapshot::new(vec![res(Cluster, "x", "1"), res(Endpoint, "x", "1")]).is_ok());
    }

    #[test]
    fn cache_notifies_only_on_change() {
        use ResourceType::*;
        let cache = SnapshotCache::new();
        let mut rx = cache.subscribe("n1");
        assert!(rx.borrow_and_update().is_empty());
        assert!(cache.get("n1").is_none());
        assert!(cache.node_ids().is_empty());

        assert!(cache.set("n1", snap(&[(Cluster, "a", "1")])));
        assert!(rx.has_changed().unwrap());
        let first = rx.borrow_and_update().clone();
        assert!(first.published_at().is_some());
        assert_eq!(
            cache.get("n1").unwrap().version(Cluster),
            first.version(Cluster)
        );

        // Same content: no notification.
        assert!(!cache.set("n1", snap(&[(Cluster, "a", "1")])));
        assert!(!rx.has_changed().unwrap());

        assert!(cache.set("n1", snap(&[(Cluster, "a", "2")])));
        assert!(rx.has_changed().unwrap());
        assert_eq!(cache.node_ids(), vec!["n1".to_string()]);

        // A subscriber arriving later sees the latest value at once.
        let late = cache.subscribe("n1");
        assert_eq!(
            late.borrow().version(Cluster),
            cache.get("n1").unwrap().version(Cluster)
        );
    }

    #[test]
    fn remove_forgets_and_holds_the_node() {
        use ResourceType::*;
        let cache = SnapshotCache::new();
        cache.set("n1", snap(&[(Cluster, "a", "1")]));
        cache.set("n2", snap(&[(Cluster, "b", "1")]));
        let mut rx = cache.subscribe("n1");
        rx.borrow_and_update();
        assert!(cache.remove("n1"));
        assert!(!cache.remove("n1"));
        assert!(cache.get("n1").is_none());
        assert_eq!(cache.node_ids(), vec!["n2".to_string()]);
        // Streams get the placeholder (which the state machines answer with nothing),
        // and so do new ones.
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow_and_update().is_held());
        assert!(cache.subscribe("n1").borrow().is_held());
        // Setting again notifies the existing subscriber, even with the same versions.
        assert!(cache.set("n1", snap(&[(Cluster, "a", "1")])));
        assert!(rx.has_changed().unwrap());
        assert!(!rx.borrow_and_update().is_held());

        // Without subscribers the entry is dropped entirely.
        assert!(cache.remove("n2"));
        assert!(cache.subscribe("n2").borrow().is_held());
    }

    #[test]
    fn unknown_nodes_are_held_until_published_even_with_an_empty_snapshot() {
        let cache = SnapshotCache::new();
        let mut rx = cache.subscribe("n");
        assert!(rx.borrow_and_update().is_held());
        assert!(
            cache.set("n", Snapshot::empty()),
            "publishing an empty config notifies"
        );
        assert!(rx.has_changed().unwrap());
        assert!(!rx.borrow_and_update().is_held());
    }

    /// 10,000 streams of nodes nobody configured come and go (and a configured node
    /// removed): the next subscription leaves only what is needed.
    #[test]
    fn subscriber_churn_leaves_no_entry_behind() {
        use ResourceType::*;
        let cache = SnapshotCache::new();
        cache.set("kept", snap(&[(Cluster, "a", "1")]));
        let live = cache.subscribe("live");
        let baseline = cache.len();
        for i in 0..10_000 {
            let rx = cache.subscribe(&format!("unknown-{i}"));
            drop(rx);
        }
        cache.set("gone", snap(&[(Cluster, "a", "1")]));
        let rx = cache.subscribe("gone");
        assert!(cache.remove("gone"));
        drop(rx);
        let again = cache.subscribe("live");
        assert_eq!(cache.len(), baseline);
        drop((live, again));
    }

    #[test]
    fn cache_is_shared_across_threads() {
        use ResourceType::*;
        let cache = SnapshotCache::new();
        let rx = cache.subscribe("n");
        let writer = cache.clone();
        std::thread::spawn(move || writer.set("n", snap(&[(Secret, "s", "1")])))
            .join()
            .unwrap();
        assert_eq!(rx.borrow().resources(Secret).len(), 1);
    }
}
