//! The edits injection makes to a Pod ([`Injection`]): per list of the spec
//! ([`ListEdit`]), the grace period ([`GraceEdit`]), and how the added objects are held
//! ([`Added`]). Planned in `plan`, undone in `undo`, carried out in `apply`.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::pod::{list, to_value};
use crate::Error;

/// How an [`Injection`] holds the objects it adds (the generated containers and volumes):
/// as `Value` trees, for [`Injection::into_pod`] and [`Injection::patch`], or
/// serialised once as JSON text (`Box<RawValue>`), for an admission response that only
/// writes the patch out ([`InjectionPatch::to_json`](super::InjectionPatch::to_json)). Both forms come from the same
/// generated objects and give the same patch.
pub trait Added: Serialize + fmt::Debug + Sized {
    /// A generated object in this form.
    fn from_generated<T: Serialize>(t: &T) -> Result<Self, Error>;
    /// Whether this object is exactly `original` (an entry of the Pod).
    fn is(&self, original: &Value) -> bool;
}

impl Added for Value {
    fn from_generated<T: Serialize>(t: &T) -> Result<Self, Error> {
        to_value(t)
    }

    fn is(&self, original: &Value) -> bool {
        self == original
    }
}

impl Added for Box<RawValue> {
    fn from_generated<T: Serialize>(t: &T) -> Result<Self, Error> {
        serde_json::value::to_raw_value(t).map_err(Error::Serialize)
    }

    fn is(&self, original: &Value) -> bool {
        serde_json::from_str::<Value>(self.get()).is_ok_and(|v| v == *original)
    }
}

/// The lists of `spec` injection edits, in the order it edits them.
pub(super) const LISTS: [&str; 3] = ["containers", "initContainers", "volumes"];
pub(super) const CONTAINERS: usize = 0;
pub(super) const INIT_CONTAINERS: usize = 1;
pub(super) const VOLUMES: usize = 2;

/// What injection does to one list of the Pod's spec.
#[derive(Debug)]
pub(super) struct ListEdit<'a, F> {
    /// The list as it is in the Pod (empty when absent or `null`).
    pub(super) original: &'a [Value],
    /// Whether `spec[key]` is a list in the Pod (absent and `null` are not).
    pub(super) present: bool,
    /// Per original entry: whether injection removes it (an earlier injection's object).
    pub(super) removed: Vec<bool>,
    /// The final `lifecycle` of kept entries whose lifecycle injection sets or restores
    /// (`None`: no `lifecycle`), by original index.
    pub(super) lifecycle: BTreeMap<usize, Option<Value>>,
    /// The entries injection appends.
    pub(super) appended: Vec<F>,
}

impl<'a, F: Added> ListEdit<'a, F> {
    pub(super) fn new(spec: &'a Map<String, Value>, key: &str) -> Result<Self, Error> {
        let (original, present) = list(spec, key)?;
        Ok(Self {
            original,
            present,
            removed: vec![false; original.len()],
            lifecycle: BTreeMap::new(),
            appended: Vec::new(),
        })
    }

    /// The entries injection keeps, with their original index.
    pub(super) fn kept(&self) -> impl Iterator<Item = (usize, &'a Value)> + '_ {
        self.original
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.removed[*i])
    }

    /// The entries injection removes.
    pub(super) fn gone(&self) -> impl Iterator<Item = &'a Value> + '_ {
        self.original
            .iter()
            .enumerate()
            .filter(|(i, _)| self.removed[*i])
            .map(|(_, v)| v)
    }

    /// The `lifecycle` of original entry `i` as injection leaves it so far.
    pub(super) fn lifecycle_of(&self, i: usize) -> Option<&Value> {
        match self.lifecycle.get(&i) {
            Some(l) => l.as_ref(),
            None => self.original[i].get("lifecycle"),
        }
    }

    /// How many removed entries at the end of the list are given back unchanged by the
    /// first appended ones (re-injecting an injected Pod): those are left in place.
    pub(super) fn reused_tail(&self) -> (usize, usize) {
        let start = self.removed.iter().rposition(|r| !r).map_or(0, |i| i + 1);
        let reused = self.original[start..]
            .iter()
            .zip(&self.appended)
            .take_while(|(a, b)| b.is(a))
            .count();
        (start, reused)
    }
}

/// `spec.terminationGracePeriodSeconds` after injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GraceEdit {
    Keep,
    Set(i64),
    Remove,
}

/// What injecting the sidecar changes in a Pod, decided without copying the Pod: the
/// objects an earlier injection added are removed ([`SidecarStatus`](super::SidecarStatus)), the recorded Pod
/// changes undone, the new objects appended, the grace period and preStop hooks set, and
/// the status annotation written. [`Injection::patch`] is the JSON patch for an admission
/// response; [`Injection::into_pod`] the injected Pod. Both come from the same edits.
/// `F` is how the added objects are held ([`Added`]).
#[derive(Debug)]
pub struct Injection<'a, F = Value> {
    pub(super) pod: &'a Value,
    pub(super) lists: [ListEdit<'a, F>; 3],
    pub(super) grace: GraceEdit,
    pub(super) status: String,
}
