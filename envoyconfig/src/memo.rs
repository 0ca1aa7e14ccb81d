//! A bounded memo of the resources decoded from a spec's own text, so resolving a spec
//! again (an EndpointSlice or Secret it reads changed) does not decode, canonicalise and
//! validate every unchanged resource again: a lookup by content instead.
//!
//! - **Key**: the resource type and the exact input, i.e. the entry's `value` written
//!   back as JSON text (equal text, equal value), or a deprecated `envoyResources`
//!   string with its serialization. Decoding depends on nothing else (the type registry
//!   is static, no clock is read), so a hit is exactly what decoding would return.
//! - **Only successes** are kept: an error names its field path (`spec.resources[3]…`),
//!   which is not part of the key, so a failing entry is decoded again every time and
//!   errors read the same with and without the memo.
//! - **Only what the spec itself holds**: resources generated from EndpointSlices or
//!   Secrets never go through the memo.
//! - **Bounded**: see [`DecodeMemo`].

use std::collections::HashMap;
use std::sync::Mutex;

use crate::resource::{Resource, ResourceType};
use crate::text::Serialization;

/// The fewest entries the memo holds before it sweeps (see [`DecodeMemo`]).
pub const MIN_SWEEP_ENTRIES: usize = 4096;
/// The most entries the memo holds (plus the one being inserted), unless set otherwise.
pub const MAX_ENTRIES: usize = 16 * MIN_SWEEP_ENTRIES;

/// What a decoded resource was decoded from (no `Debug`: it may hold inline key
/// material).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Input {
    /// A `spec.resources[].value`, as its JSON text.
    Value(String),
    /// A deprecated `spec.envoyResources` string and how it is written.
    Text(Serialization, String),
}

type Key = (ResourceType, Input);

/// A thread-safe, bounded memo of decoded resources, shared by every resolution of a
/// process (local and Kubernetes mode alike, through
/// [`crate::envoyconfig::resolve_cached`]).
///
/// Bound: each entry remembers whether a resolution used it (or inserted it) since the
/// last sweep. When an insertion takes the memo above `max(2 × its size after the last
/// sweep, min_sweep)` ([`MIN_SWEEP_ENTRIES`] = 4,096 unless set), the entries not used
/// since the last sweep are dropped, so the resources of a deleted (or edited)
/// EnvoyConfig are gone after at most two sweeps. Entries inserted since the last sweep
/// count as used, so steady churn with a live set can raise that threshold sweep after
/// sweep; hence a hard bound: if more than `max_entries / 2` entries are left, all are
/// dropped (they decode again on next use). The memo never holds more than
/// `max(max_entries, min_sweep) + 1` entries ([`MAX_ENTRIES`] = 65,536 unless set).
/// The lock is held per lookup or insertion, never while decoding. `Debug` shows the
/// counters only (the keys may hold inline key material).
pub struct DecodeMemo {
    inner: Mutex<Inner>,
    min_sweep: usize,
    max_entries: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Entries left by the last sweep.
    after_sweep: usize,
    hits: u64,
    misses: u64,
}

struct Entry {
    resource: Resource,
    used: bool,
}

/// Counters of a [`DecodeMemo`] (for tests and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoStats {
    /// Lookups answered from the memo.
    pub hits: u64,
    /// Lookups that decoded (successfully or not).
    pub misses: u64,
    /// Entries held now.
    pub entries: usize,
}

impl std::fmt::Debug for DecodeMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeMemo")
            .field("stats", &self.stats())
            .field("min_sweep", &self.min_sweep)
            .field("max_entries", &self.max_entries)
            .finish()
    }
}

impl Default for DecodeMemo {
    fn default() -> Self {
        Self::new()
    }
}

impl DecodeMemo {
    /// An empty memo that sweeps from [`MIN_SWEEP_ENTRIES`] entries on and holds at
    /// most [`MAX_ENTRIES`].
    pub fn new() -> Self {
        Self::with_bounds(MIN_SWEEP_ENTRIES, MAX_ENTRIES)
    }

    /// An empty memo that sweeps from `min_sweep` entries on and holds at most
    /// `max(max_entries, min_sweep)` (tests use small values).
    pub fn with_bounds(min_sweep: usize, max_entries: usize) -> Self {
        DecodeMemo {
            inner: Mutex::new(Inner::default()),
            min_sweep,
            max_entries: max_entries.max(min_sweep),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> MemoStats {
        let inner = self.lock();
        MemoStats {
            hits: inner.hits,
            misses: inner.misses,
            entries: inner.entries.len(),
        }
    }

    /// The resource decoded from `input`: from the memo, or by `decode` (outside the
    /// lock), remembering it when it succeeds.
    pub(crate) fn get_or_decode<E>(
        &self,
        kind: ResourceType,
        input: Input,
        decode: impl FnOnce() -> Result<Resource, E>,
    ) -> Result<Resource, E> {
        let key = (kind, input);
        {
            let mut inner = self.lock();
            if let Some(entry) = inner.entries.get_mut(&key) {
                entry.used = true;
                let resource = entry.resource.clone();
                inner.hits += 1;
                return Ok(resource);
            }
            inner.misses += 1;
        }
        let resource = decode()?;
        let mut inner = self.lock();
        inner.entries.insert(
            key,
            Entry {
                resource: resource.clone(),
                used: true,
            },
        );
        if inner.entries.len() > (2 * inner.after_sweep).max(self.min_sweep) {
            inner.entries.retain(|_, e| std::mem::take(&mut e.used));
            if inner.entries.len() > self.max_entries / 2 {
                inner.entries.clear();
            }
            inner.after_sweep = inner.entries.len();
        }
        Ok(resource)
    }

    /// The memo holds only complete entries, so a panic elsewhere while it was locked
    /// leaves it usable.
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
