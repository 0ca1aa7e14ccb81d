//! [`StoreSource`]: the [`SecretSource`] of Kubernetes mode, reading Secrets from the
//! reflector store and EndpointSlices from the [`SliceIndex`] (no API call while
//! resolving).
//!
//! [`SliceIndex`] is the EndpointSlice watch cache, indexed by namespace: resolving a
//! `generateFromEndpointSlices` reads only the slices of the EnvoyConfig's namespace
//! (not every slice of the cluster, cloned, per resolution), and applying a watch event
//! tells which label sets changed, the old ones included, so that a slice whose labels
//! no longer match a selector still reconciles the revisions that used it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt as _;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::plan::{label_matcher, required_labels};
use marin3r_envoyconfig::envoyconfig::{SecretData, SecretSource};

/// Secrets and EndpointSlices of one namespace, from the watch caches.
pub struct StoreSource<'a> {
    /// The namespace of the EnvoyConfig being resolved.
    pub namespace: &'a str,
    pub secrets: &'a Store<Secret>,
    pub slices: &'a SliceIndex,
}

/// A label set of EndpointSlices in a namespace: what a slice event changes (the
/// revisions whose selector matches it are reconciled).
pub type LabelSet = (String, BTreeMap<String, String>);

/// The slices of one namespace: by name (so they come out sorted by name), and the
/// names of those carrying each `key=value` label (the posting lists a selector's
/// required labels narrow the candidates with: the churn profile had 30 % of the
/// discovery service's CPU matching one Service's selector against every slice of the
/// namespace on each resolution).
#[derive(Default)]
struct Namespace {
    by_name: BTreeMap<String, Arc<EndpointSlice>>,
    by_label: HashMap<(String, String), BTreeSet<String>>,
}

impl Namespace {
    fn unindex(&mut self, name: &str, slice: &EndpointSlice) {
        for (k, v) in slice.labels() {
            let key = (k.clone(), v.clone());
            if let Some(names) = self.by_label.get_mut(&key) {
                names.remove(name);
                if names.is_empty() {
                    self.by_label.remove(&key);
                }
            }
        }
    }
}

/// Slices by namespace.
type ByNamespace = HashMap<String, Namespace>;

#[derive(Default)]
struct SliceState {
    slices: ByNamespace,
    /// A (re)list in progress: the slices listed so far (`Init` … `InitDone`).
    relist: Option<ByNamespace>,
    /// The first list completed.
    ready: bool,
}

/// The EndpointSlice watch cache of Kubernetes mode, indexed by namespace (see the
/// module docs). Holds every watched slice once and nothing else: an entry goes with
/// the slice's `Delete` event, or with a re-list that no longer has it. Thread-safe.
pub struct SliceIndex {
    state: Mutex<SliceState>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl Default for SliceIndex {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            ready: tokio::sync::watch::channel(false).0,
        }
    }
}

impl std::fmt::Debug for SliceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceIndex")
            .field("slices", &self.len())
            .finish_non_exhaustive()
    }
}

fn key(slice: &EndpointSlice) -> Option<(String, String)> {
    Some((slice.namespace()?, slice.metadata.name.clone()?))
}

fn insert(map: &mut ByNamespace, slice: &EndpointSlice) -> Option<Arc<EndpointSlice>> {
    let (namespace, name) = key(slice)?;
    let ns = map.entry(namespace).or_default();
    let old = ns.by_name.insert(name.clone(), Arc::new(slice.clone()));
    if let Some(old) = &old {
        ns.unindex(&name, old);
    }
    for (k, v) in slice.labels() {
        let names = ns.by_label.entry((k.clone(), v.clone())).or_default();
        names.insert(name.clone());
    }
    old
}

fn remove(map: &mut ByNamespace, slice: &EndpointSlice) -> Option<Arc<EndpointSlice>> {
    let (namespace, name) = key(slice)?;
    let ns = map.get_mut(&namespace)?;
    let old = ns.by_name.remove(&name);
    if let Some(old) = &old {
        ns.unindex(&name, old);
    }
    if ns.by_name.is_empty() {
        map.remove(&namespace);
    }
    old
}

fn labels_of(slice: &EndpointSlice) -> Option<LabelSet> {
    Some((slice.namespace()?, slice.labels().clone()))
}

impl SliceIndex {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, SliceState> {
        // Every mutation is a single insert, remove or swap: a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one watch event and returns the label sets whose readers must be
    /// reconciled: a changed or deleted slice's old and new labels; after a re-list,
    /// those of every slice that appeared, vanished or changed meanwhile (nothing after
    /// the first list: the controllers reconcile everything at start). A slice whose
    /// `resourceVersion` did not change changes nothing.
    pub fn apply_watcher_event(&self, event: &watcher::Event<EndpointSlice>) -> Vec<LabelSet> {
        let mut s = self.lock();
        let mut changed = BTreeSet::new();
        match event {
            watcher::Event::Apply(slice) => {
                let old = insert(&mut s.slices, slice);
                if old.as_deref().is_none_or(|o| !same_version(o, slice)) {
                    changed.extend(old.as_deref().and_then(labels_of));
                    changed.extend(labels_of(slice));
                }
            }
            watcher::Event::Delete(slice) => {
                let old = remove(&mut s.slices, slice);
                changed.extend(old.as_deref().and_then(labels_of));
                changed.extend(labels_of(slice));
            }
            watcher::Event::Init => s.relist = Some(ByNamespace::new()),
            watcher::Event::InitApply(slice) => {
                let relist = s.relist.get_or_insert_with(ByNamespace::new);
                insert(relist, slice);
            }
            watcher::Event::InitDone => {
                let listed = s.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut s.slices, listed);
                if s.ready {
                    changed.extend(relist_changes(&old, &s.slices));
                }
                s.ready = true;
                self.ready.send_replace(true);
            }
        }
        changed.into_iter().collect()
    }

    /// The slices of `namespace` whose labels `selector` matches, sorted by name. A
    /// selector with required labels ([`required_labels`]: a Service's
    /// `kubernetes.io/service-name`) looks only at the slices of its shortest posting
    /// list; any other at the namespace's every slice.
    pub fn matching(
        &self,
        namespace: &str,
        selector: Option<&LabelSelector>,
    ) -> Vec<Arc<EndpointSlice>> {
        let matches = label_matcher(selector);
        let s = self.lock();
        let Some(ns) = s.slices.get(namespace) else {
            return Vec::new();
        };
        // The posting list of each required label (`None`: no slice carries it, so none
        // matches); the shortest one holds every candidate.
        let postings: Vec<Option<&BTreeSet<String>>> = (selector.map(required_labels))
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| ns.by_label.get(&(k.to_string(), v.to_string())))
            .collect();
        let shortest = postings.iter().min_by_key(|p| p.map_or(0, BTreeSet::len));
        let candidates: Box<dyn Iterator<Item = &Arc<EndpointSlice>>> = match shortest {
            Some(names) => Box::new(
                names
                    .iter()
                    .flat_map(|set| set.iter())
                    .filter_map(|n| ns.by_name.get(n)),
            ),
            None => Box::new(ns.by_name.values()),
        };
        candidates
            .filter(|slice| matches(slice.labels()))
            .map(Arc::clone)
            .collect()
    }

    /// How many slices are held (the index's whole size, for tests and bounds).
    pub fn len(&self) -> usize {
        let s = self.lock();
        let listed: usize = s.slices.values().map(|ns| ns.by_name.len()).sum();
        let relisting: usize = s
            .relist
            .iter()
            .flat_map(|r| r.values())
            .map(|ns| ns.by_name.len())
            .sum();
        listed + relisting
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Completes once the first list is in.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

fn same_version(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.metadata.resource_version.is_some()
        && a.metadata.resource_version == b.metadata.resource_version
}

/// The label sets of the slices that appeared, vanished or changed between two lists.
fn relist_changes(old: &ByNamespace, new: &ByNamespace) -> BTreeSet<LabelSet> {
    let mut changed = BTreeSet::new();
    let get = |m: &ByNamespace, ns: &str, name: &str| {
        m.get(ns).and_then(|n| n.by_name.get(name)).cloned()
    };
    for (ns, names) in old {
        for (name, o) in &names.by_name {
            match get(new, ns, name) {
                Some(n) if same_version(o, &n) => {}
                other => {
                    changed.extend(labels_of(o));
                    changed.extend(other.as_deref().and_then(labels_of));
                }
            }
        }
    }
    for (ns, names) in new {
        for (name, n) in &names.by_name {
            if get(old, ns, name).is_none() {
                changed.extend(labels_of(n));
            }
        }
    }
    changed
}

/// The type and decoded data of a Secret (`data`, then `stringData` on top).
pub fn secret_data(secret: &Secret) -> SecretData {
    let mut data: std::collections::BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), v.as_bytes().to_vec());
    }
    SecretData {
        type_: secret.type_.clone().unwrap_or_default(),
        data,
    }
}

impl SecretSource for StoreSource<'_> {
    fn get(&self, name: &str) -> Option<SecretData> {
        let key = ObjectRef::<Secret>::new(name).within(self.namespace);
        self.secrets.get(&key).map(|s| secret_data(&s))
    }

    fn endpoint_slices(&self, selector: Option<&LabelSelector>) -> Option<Vec<Arc<EndpointSlice>>> {
        // Sorted by name: a stable order, so the generated ClusterLoadAssignment (and its
        // version) is too.
        Some(self.slices.matching(self.namespace, selector))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::runtime::{reflector, watcher};
    use std::collections::BTreeMap;

    fn slice(namespace: &str, name: &str, app: &str, version: &str) -> EndpointSlice {
        let mut s = EndpointSlice::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(namespace.into());
        s.metadata.resource_version = Some(version.into());
        s.metadata.labels = Some(BTreeMap::from([("app".to_string(), app.to_string())]));
        s
    }

    fn app(namespace: &str, app: &str) -> LabelSet {
        (
            namespace.to_string(),
            BTreeMap::from([("app".to_string(), app.to_string())]),
        )
    }

    #[test]
    fn reads_secrets_and_slices_of_its_namespace_only() {
        let (secrets, mut w) = reflector::store::<Secret>();
        let mut secret = Secret::default();
        secret.metadata.name = Some("tls".into());
        secret.metadata.namespace = Some("a".into());
        secret.type_ = Some("kubernetes.io/tls".into());
        secret.data = Some(BTreeMap::from([(
            "tls.crt".to_string(),
            ByteString(b"C".to_vec()),
        )]));
        w.apply_watcher_event(&watcher::Event::Apply(secret.clone()));
        secret.metadata.namespace = Some("b".into());
        w.apply_watcher_event(&watcher::Event::Apply(secret));

        let slices = SliceIndex::new();
        for (ns, name) in [("a", "s2"), ("a", "s1"), ("b", "s3")] {
            slices.apply_watcher_event(&watcher::Event::Apply(slice(ns, name, "kuard", "1")));
        }
        let source = StoreSource {
            namespace: "a",
            secrets: &secrets,
            slices: &slices,
        };
        let data = source.get("tls").unwrap();
        assert_eq!(data.type_, "kubernetes.io/tls");
        assert_eq!(data.data["tls.crt"], b"C");
        assert!(source.get("other").is_none());
        let all = LabelSelector::default();
        let names: Vec<String> = source
            .endpoint_slices(Some(&all))
            .unwrap()
            .iter()
            .map(|s| s.name_any())
            .collect();
        assert_eq!(names, ["s1", "s2"]);
        assert!(source.endpoint_slices(None).unwrap().is_empty());
    }

    #[test]
    fn a_relabelled_slice_reports_its_old_labels_too() {
        let index = SliceIndex::new();
        let changes =
            index.apply_watcher_event(&watcher::Event::Apply(slice("a", "s", "old", "1")));
        assert_eq!(changes, [app("a", "old")]);
        // Moved to another Service: the readers of the old labels must drop its endpoints.
        let changes =
            index.apply_watcher_event(&watcher::Event::Apply(slice("a", "s", "new", "2")));
        assert_eq!(changes, [app("a", "new"), app("a", "old")]);
        // The same object again (a watch re-sending it): nothing changed.
        let changes =
            index.apply_watcher_event(&watcher::Event::Apply(slice("a", "s", "new", "2")));
        assert!(changes.is_empty());
        // Deleted with stale labels in the event: the labels it was indexed under count.
        let changes =
            index.apply_watcher_event(&watcher::Event::Delete(slice("a", "s", "stale", "3")));
        assert_eq!(changes, [app("a", "new"), app("a", "stale")]);
        assert!(index.is_empty());
    }

    #[test]
    fn a_relist_reports_what_changed_while_the_watch_was_down() {
        let index = SliceIndex::new();
        let list = |items: &[EndpointSlice]| {
            let mut changes = index.apply_watcher_event(&watcher::Event::Init);
            for s in items {
                changes.extend(index.apply_watcher_event(&watcher::Event::InitApply(s.clone())));
            }
            changes.extend(index.apply_watcher_event(&watcher::Event::InitDone));
            changes
        };
        // The first list: the controllers reconcile everything anyway.
        let first = list(&[
            slice("a", "kept", "k", "1"),
            slice("a", "gone", "g", "1"),
            slice("a", "edited", "e", "1"),
        ]);
        assert!(first.is_empty());
        assert_eq!(index.len(), 3);
        // A re-list after a watch outage: one slice vanished, one changed, one is new.
        let changes = list(&[
            slice("a", "kept", "k", "1"),
            slice("a", "edited", "e", "2"),
            slice("b", "new", "n", "1"),
        ]);
        assert_eq!(changes, [app("a", "e"), app("a", "g"), app("b", "n")]);
        assert_eq!(index.len(), 3, "the vanished slice is forgotten");
    }

    /// 10,000 slices created and deleted (and a re-list that drops more): the index
    /// returns to its baseline, empty namespaces included.
    #[test]
    fn slice_churn_leaves_nothing_behind() {
        let index = SliceIndex::new();
        index.apply_watcher_event(&watcher::Event::Init);
        index.apply_watcher_event(&watcher::Event::InitApply(slice("base", "s", "x", "1")));
        index.apply_watcher_event(&watcher::Event::InitDone);
        // (slices, namespaces, posting lists), each read under its own lock.
        let sizes = |index: &SliceIndex| -> (usize, usize, usize) {
            let len = index.len();
            let s = index.lock();
            let postings = s.slices.values().map(|ns| ns.by_label.len()).sum();
            (len, s.slices.len(), postings)
        };
        let baseline = sizes(&index);
        for i in 0..10_000 {
            let s = slice(&format!("ns-{}", i % 100), &format!("s-{i}"), "x", "1");
            index.apply_watcher_event(&watcher::Event::Apply(s.clone()));
            // Relabelled before it goes: its first label's posting goes with it.
            let relabelled = slice(&format!("ns-{}", i % 100), &format!("s-{i}"), "y", "2");
            index.apply_watcher_event(&watcher::Event::Apply(relabelled));
            index.apply_watcher_event(&watcher::Event::Delete(s));
        }
        assert_eq!(sizes(&index), baseline);
        for i in 0..1_000 {
            index.apply_watcher_event(&watcher::Event::Apply(slice(
                "tmp",
                &format!("s-{i}"),
                "x",
                "1",
            )));
        }
        // Deleted while the watch was down: the re-list forgets them.
        index.apply_watcher_event(&watcher::Event::Init);
        index.apply_watcher_event(&watcher::Event::InitApply(slice("base", "s", "x", "1")));
        index.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(sizes(&index), baseline);
    }

    /// Matching through the posting lists answers what a scan of the namespace does,
    /// for selectors with required labels, without, and with a bad operator, while
    /// slices move between Services.
    #[test]
    fn the_posting_lists_answer_as_a_scan_does() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let index = SliceIndex::new();
        for i in 0..60 {
            let app = format!("app-{}", i % 4);
            index.apply_watcher_event(&watcher::Event::Apply(slice(
                "a",
                &format!("s-{i:02}"),
                &app,
                "1",
            )));
        }
        for i in (0..60).step_by(7) {
            let app = format!("app-{}", (i + 1) % 4);
            index.apply_watcher_event(&watcher::Event::Apply(slice(
                "a",
                &format!("s-{i:02}"),
                &app,
                "2",
            )));
        }
        let one = |op: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..LabelSelector::default()
        };
        let selectors = [
            LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "app-1".into())])),
                ..LabelSelector::default()
            },
            LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "none".into())])),
                ..LabelSelector::default()
            },
            one("In", &["app-2"]),
            one("In", &["app-2", "app-3"]),
            one("NotIn", &["app-0"]),
            one("Sideways", &["app-0"]),
            LabelSelector::default(),
        ];
        for selector in &selectors {
            let matches = label_matcher(Some(selector));
            let scan: Vec<String> = {
                let s = index.lock();
                let ns = s.slices.get("a").expect("namespace a");
                ns.by_name
                    .values()
                    .filter(|x| matches(x.labels()))
                    .map(|x| x.name_any())
                    .collect()
            };
            let got: Vec<String> = index
                .matching("a", Some(selector))
                .iter()
                .map(|x| x.name_any())
                .collect();
            assert_eq!(got, scan, "{selector:?}");
        }
        assert_eq!(index.matching("a", None).len(), 0);
        assert_eq!(index.matching("elsewhere", Some(&selectors[0])).len(), 0);
        assert_eq!(index.matching("a", Some(&selectors[6])).len(), 60);
    }
}
