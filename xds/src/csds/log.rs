//! The per-resource log each stream state machine keeps for client status: per
//! resource the version the Envoy ACKed, what the last unanswered response changes for
//! it ([`Pending`]), the last NACK that concerns it.

use std::sync::Arc;
use std::time::Instant;

use marin3r_envoyconfig::resource::{Resource, version_string};

/// The version of a resource the client ACKed: what it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acked {
    pub(super) version: Arc<str>,
    pub(super) digest: u64,
    pub(super) at: Instant,
}

/// A NACK that concerns a resource.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Nacked {
    /// The rejected version.
    pub(super) version: Arc<str>,
    /// Envoy's message, as stored ([`crate::tracking::stored_nack_message`]).
    pub(super) message: Arc<str>,
    pub(super) at: Instant,
}

/// What the last response not answered yet does to a resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Nothing in flight.
    #[default]
    Idle,
    /// Sent again with the digest the client runs.
    Unchanged,
    /// Sent with this digest.
    Update(u64),
    /// Sent as removed (SotW: left out of the type's full state).
    Removal,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResourceState {
    pub(super) acked: Option<Acked>,
    pub(super) pending: Pending,
    pub(super) nacked: Option<Arc<Nacked>>,
}

impl ResourceState {
    /// Nothing ACKed, NACKed or in flight.
    fn is_empty(&self) -> bool {
        self.acked.is_none() && self.nacked.is_none() && self.pending == Pending::Idle
    }

    fn pending_for(&self, digest: u64) -> Pending {
        match &self.acked {
            Some(a) if a.digest == digest => Pending::Unchanged,
            _ => Pending::Update(digest),
        }
    }
}

/// The per-resource status of one type on one stream, sorted by name. A sorted `Vec`
/// grown to fit, not a `BTreeMap`: its first node holds 11 entries (≈ 1 KiB here) for
/// the one or two resources of a type most streams have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResourceLog(Vec<(String, ResourceState)>);

impl ResourceLog {
    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&ResourceState> {
        self.position(name).ok().map(|i| &self.0[i].1)
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut ResourceState> {
        self.position(name).ok().map(|i| &mut self.0[i].1)
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    /// The client dropped `name` (unsubscribed).
    pub(crate) fn remove(&mut self, name: &str) {
        if let Ok(i) = self.position(name) {
            self.0.remove(i);
        }
    }

    /// Keeps the names `keep` selects (the client dropped the others).
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.0.retain(|(name, _)| keep(name));
    }

    /// Keeps the states `f` returns `true` for, after it changed them.
    fn retain_mut(&mut self, mut f: impl FnMut(&mut ResourceState) -> bool) {
        self.0.retain_mut(|(_, state)| f(state));
    }

    /// Applies `f` to the state of each name of `items` (a default one if absent), in
    /// one pass: new names are added with one sort, states `f` leaves empty dropped.
    fn update<'a, T>(
        &mut self,
        items: impl IntoIterator<Item = (&'a str, T)>,
        mut f: impl FnMut(&mut ResourceState, T),
    ) {
        let mut added = Vec::new();
        let mut emptied = false;
        for (name, item) in items {
            if let Some(state) = self.get_mut(name) {
                f(state, item);
                emptied |= state.is_empty();
            } else {
                let mut state = ResourceState::default();
                f(&mut state, item);
                if !state.is_empty() {
                    added.push((name.to_string(), state));
                }
            }
        }
        if emptied {
            self.0.retain(|(_, state)| !state.is_empty());
        }
        if !added.is_empty() {
            self.0.reserve_exact(added.len());
            self.0.append(&mut added);
            self.0.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }

    /// A SotW response with the type's full state `resources` was sent: what it changes
    /// per resource replaces what an earlier unanswered response changed.
    pub(crate) fn sent_sotw(&mut self, resources: &[&Resource]) {
        for (_, state) in &mut self.0 {
            state.pending = if state.acked.is_some() {
                Pending::Removal
            } else {
                Pending::Idle
            };
        }
        self.update(
            resources.iter().map(|r| (r.name.as_str(), r.digest)),
            |state, digest| state.pending = state.pending_for(digest),
        );
    }

    /// The client answered the last SotW response, of `version`: an ACK (`nack` is
    /// `None`) makes what it sent what the client runs; a NACK marks the resources it
    /// changed.
    pub(crate) fn answered_sotw(&mut self, version: &str, nack: Option<&str>, now: Instant) {
        match nack {
            None => {
                let version: Arc<str> = Arc::from(version);
                self.retain_mut(|state| {
                    let keep = match state.pending {
                        Pending::Update(digest) => {
                            state.acked = Some(Acked {
                                version: version.clone(),
                                digest,
                                at: now,
                            });
                            true
                        }
                        Pending::Unchanged => true,
                        Pending::Removal | Pending::Idle => false,
                    };
                    state.nacked = None;
                    state.pending = Pending::Idle;
                    keep
                });
            }
            Some(message) => {
                let nacked = Arc::new(Nacked {
                    version: Arc::from(version),
                    message: Arc::from(message),
                    at: now,
                });
                self.retain_mut(|state| {
                    if let Pending::Update(_) = state.pending {
                        state.nacked = Some(nacked.clone());
                    }
                    state.pending = Pending::Idle;
                    state.acked.is_some() || state.nacked.is_some()
                });
            }
        }
    }

    /// A Delta response sent `resources` and removed `removed`.
    pub(crate) fn sent_delta<'a>(
        &mut self,
        resources: &[&Resource],
        removed: impl IntoIterator<Item = &'a String>,
    ) {
        self.update(
            resources.iter().map(|r| (r.name.as_str(), r.digest)),
            |state, digest| state.pending = state.pending_for(digest),
        );
        for name in removed {
            if let Some(state) = self.get_mut(name) {
                state.pending = Pending::Removal;
            }
        }
    }

    /// The client answered a Delta response that sent `resources` (name → digest) and
    /// removed `removed`; `later(name)`: a newer unanswered response carries the name
    /// again (its pending change stays).
    pub(crate) fn answered_delta<'a>(
        &mut self,
        resources: impl IntoIterator<Item = (&'a String, &'a u64)>,
        removed: impl IntoIterator<Item = &'a String>,
        later: impl Fn(&str) -> bool,
        nack: Option<&str>,
        now: Instant,
    ) {
        let nack = nack.map(Arc::<str>::from);
        let items = resources
            .into_iter()
            .map(|(name, digest)| (name.as_str(), (later(name), *digest)));
        self.update(items, |state, (still_pending, digest)| {
            if !still_pending {
                state.pending = Pending::Idle;
            }
            let changed = state.acked.as_ref().is_none_or(|a| a.digest != digest);
            match &nack {
                None => {
                    if changed {
                        state.acked = Some(Acked {
                            version: Arc::from(version_string(digest)),
                            digest,
                            at: now,
                        });
                    }
                    state.nacked = None;
                }
                Some(message) if changed => {
                    state.nacked = Some(Arc::new(Nacked {
                        version: Arc::from(version_string(digest)),
                        message: message.clone(),
                        at: now,
                    }));
                }
                Some(_) => {}
            }
        });
        for name in removed {
            if later(name) {
                if nack.is_none()
                    && let Some(state) = self.get_mut(name)
                {
                    state.acked = None;
                    state.nacked = None;
                }
                continue;
            }
            match nack {
                None => self.remove(name),
                Some(_) => {
                    if let Some(state) = self.get_mut(name) {
                        state.pending = Pending::Idle;
                    }
                }
            }
        }
    }
}
