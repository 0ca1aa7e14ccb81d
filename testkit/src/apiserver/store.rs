//! The state of the fake API server, without I/O: the objects, the global
//! resourceVersion counter, and the history of events watches replay. The write
//! semantics (create, update, patch, apply, delete, garbage collection) are in
//! [`super::writes`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde_json::{Value, json};

use super::error::ApiError;
use super::kinds::{Kinds, ResourceKind};
use super::object;

/// How many events the history keeps by default (watches from an older
/// resourceVersion get `410 Expired`).
pub const DEFAULT_HISTORY_LIMIT: usize = 100_000;

/// `(qualified plural, namespace or "", name)`.
pub(crate) type Key = (String, String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    /// The qualified plural of the object's kind.
    pub(crate) resource: String,
    pub(crate) namespace: String,
    pub(crate) kind: EventType,
    /// The object after the change (for a deletion: its last state, with the
    /// deletion's resourceVersion).
    pub(crate) object: Value,
    /// The object before a modification (for selectors the change enters or leaves).
    pub(crate) old: Option<Value>,
}

/// The objects and their history.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pub(crate) kinds: Kinds,
    pub(super) objects: BTreeMap<Key, Value>,
    rv: u64,
    uids: u64,
    history: VecDeque<Event>,
    history_limit: usize,
    /// The highest resourceVersion whose event was dropped from the history.
    compacted_through: u64,
    /// Events not yet handed to the open watches.
    unsent: Vec<Event>,
    /// An object was removed since the last garbage collection.
    pub(super) removed: bool,
    /// Per uid, how many stored objects have it (garbage collection looks owners up
    /// here instead of walking every object).
    pub(super) uid_index: HashMap<String, usize>,
    /// The keys of the stored objects that have owner references: the only ones
    /// garbage collection can delete.
    pub(super) owned: BTreeSet<Key>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            kinds: Kinds::with_builtins(),
            objects: BTreeMap::new(),
            rv: 0,
            uids: 0,
            history: VecDeque::new(),
            history_limit: DEFAULT_HISTORY_LIMIT,
            compacted_through: 0,
            unsent: Vec::new(),
            removed: false,
            uid_index: HashMap::new(),
            owned: BTreeSet::new(),
        }
    }
}

impl Store {
    /// The resourceVersion of the last change.
    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    pub(crate) fn key(kind: &ResourceKind, namespace: &str, name: &str) -> Key {
        let namespace = if kind.namespaced { namespace } else { "" };
        (
            kind.qualified_plural(),
            namespace.to_string(),
            name.to_string(),
        )
    }

    pub(crate) fn get(
        &self,
        kind: &ResourceKind,
        namespace: &str,
        name: &str,
    ) -> Result<&Value, ApiError> {
        self.objects
            .get(&Self::key(kind, namespace, name))
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// The objects of `kind` (in `namespace` if given), ordered by namespace and name.
    pub(crate) fn objects_of<'a>(
        &'a self,
        kind: &ResourceKind,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        let resource = kind.qualified_plural();
        self.objects
            .iter()
            .filter(move |((r, ns, _), _)| *r == resource && namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v)
    }

    /// A number not given before (for uids and generated names).
    pub(crate) fn next_serial(&mut self) -> u64 {
        self.uids += 1;
        self.uids
    }

    /// A new uid (UUID-shaped, unique in this server).
    pub(crate) fn next_uid(&mut self) -> String {
        format!("00000000-0000-4000-8000-{:012x}", self.next_serial())
    }

    /// Stores `object` under `key` with the next resourceVersion and records the event.
    pub(crate) fn store(&mut self, key: Key, mut object: Value, old: Option<Value>) -> Value {
        self.rv += 1;
        object::set_meta(&mut object, "resourceVersion", json!(self.rv.to_string()));
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(&key, kind, object.clone(), old);
        self.insert_object(key, object.clone());
        object
    }

    /// Puts `object` under `key` (no event), keeping the uid and owner indexes; returns
    /// the object it replaced. Every insertion goes through here.
    pub(crate) fn insert_object(&mut self, key: Key, object: Value) -> Option<Value> {
        let uid = object::meta_str(&object, "uid").to_string();
        let has_owners = !object::owner_uids(&object).is_empty();
        let previous = self.objects.insert(key.clone(), object);
        if let Some(previous) = &previous {
            self.unindex(&key, previous);
        }
        if !uid.is_empty() {
            *self.uid_index.entry(uid).or_default() += 1;
        }
        if has_owners {
            self.owned.insert(key);
        }
        previous
    }

    /// Takes `object`, just removed from under `key`, out of the indexes.
    fn unindex(&mut self, key: &Key, object: &Value) {
        let uid = object::meta_str(object, "uid");
        if let Some(n) = self.uid_index.get_mut(uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.uid_index.remove(uid);
            }
        }
        self.owned.remove(key);
    }

    /// Whether a stored object has uid `uid`.
    pub(crate) fn uid_exists(&self, uid: &str) -> bool {
        self.uid_index.contains_key(uid)
    }

    /// Removes the object under `key` with the next resourceVersion and records the
    /// event; returns its last state.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.unindex(key, &object);
        self.rv += 1;
        object::set_meta(&mut object, "resourceVersion", json!(self.rv.to_string()));
        self.record(key, EventType::Deleted, object.clone(), None);
        self.removed = true;
        Some(object)
    }

    fn record(&mut self, key: &Key, kind: EventType, object: Value, old: Option<Value>) {
        let event = Event {
            rv: self.rv,
            resource: key.0.clone(),
            namespace: key.1.clone(),
            kind,
            object,
            old,
        };
        self.unsent.push(event.clone());
        self.history.push_back(event);
        self.trim_history();
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted_through = dropped.rv;
            }
        }
    }

    /// The events not yet handed to watches.
    pub(crate) fn take_unsent(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.unsent)
    }

    /// The events after resourceVersion `rv`, or `410 Expired` if some were dropped.
    pub(crate) fn events_after(&self, rv: u64) -> Result<impl Iterator<Item = &Event>, ApiError> {
        if rv < self.compacted_through {
            return Err(ApiError::new(
                410,
                format!(
                    "too old resource version: {rv} ({})",
                    self.compacted_through
                ),
            ));
        }
        Ok(self.history.iter().filter(move |e| e.rv > rv))
    }

    /// Keeps at most `limit` events.
    pub(crate) fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit;
        self.trim_history();
    }

    /// Drops the whole history, as an etcd compaction does.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted_through = self.rv;
    }
}
