//! The vocabulary both ADS stream state machines ([`crate::sotw`], [`crate::delta`])
//! speak: what one call produced ([`Outcome`]), what a stream is subscribed to for one
//! type ([`Subscription`]), and the wildcard rules ([`WILDCARD`], [`supports_wildcard`]).
//! Their tunables and bookkeeping are in [`crate::tracking`].

use std::collections::BTreeSet;

use marin3r_envoyconfig::resource::ResourceType;

use crate::events::StreamEvent;
use crate::snapshot::TypeSnapshot;
use crate::tracking::TooManyNames;

/// What one call of a stream state machine produced: responses to send in order, and
/// events for the stats; or the request was refused and the stream must end with
/// `RESOURCE_EXHAUSTED` and this message (nothing of the request was applied).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<R> {
    pub responses: Vec<R>,
    pub events: Vec<StreamEvent>,
    pub refused: Option<TooManyNames>,
}

impl<R> Default for Outcome<R> {
    fn default() -> Self {
        Self {
            responses: Vec::new(),
            events: Vec::new(),
            refused: None,
        }
    }
}

impl<R> Outcome<R> {
    pub fn is_empty(&self) -> bool {
        self.responses.is_empty() && self.events.is_empty() && self.refused.is_none()
    }

    /// The outcome of a request refused with `why`.
    pub(crate) fn refused(why: TooManyNames) -> Self {
        Self {
            refused: Some(why),
            ..Self::default()
        }
    }
}

/// Types where an empty subscription means "everything" (legacy wildcard): clusters,
/// listeners and scoped routes, which Envoy requests without names.
pub fn supports_wildcard(t: ResourceType) -> bool {
    matches!(
        t,
        ResourceType::Cluster | ResourceType::Listener | ResourceType::ScopedRoute
    )
}

/// The explicit wildcard resource name.
pub(crate) const WILDCARD: &str = "*";

/// What a stream is subscribed to for one type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Subscription {
    pub(crate) wildcard: bool,
    pub(crate) names: BTreeSet<String>,
}

impl Subscription {
    pub(crate) fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.wildcard && self.names.is_empty()
    }

    /// The resources of `ts` this subscription selects, by name.
    pub(crate) fn select<'t>(&self, ts: &'t TypeSnapshot) -> Vec<&'t crate::Resource> {
        if self.wildcard {
            ts.resources().values().collect()
        } else {
            self.names.iter().filter_map(|n| ts.get(n)).collect()
        }
    }
}
