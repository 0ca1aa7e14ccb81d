//! Injected faults: requests that match are failed with a given Status or delayed
//! before being served.

use std::time::Duration;

use super::error::ApiError;
use super::log::{RequestRecord, Verb};

/// What a fault does to a matching request.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer this error instead of serving the request.
    Fail(ApiError),
    /// Serve the request after this delay (tokio time: paused clocks advance it).
    Delay(Duration),
}

/// A fault for the requests it matches (every unset criterion matches), for the next
/// `times` of them or for all.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub action: FaultAction,
    pub verb: Option<Verb>,
    /// The plural of the resource.
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub name: Option<String>,
    /// How many more requests it applies to (None: no limit).
    pub times: Option<usize>,
}

impl Fault {
    /// Fails matching requests with `code` (and its usual reason).
    pub fn fail(code: u16) -> Self {
        Self::new(FaultAction::Fail(ApiError::new(
            code,
            "injected by the test",
        )))
    }

    /// Delays matching requests by `delay`.
    pub fn delay(delay: Duration) -> Self {
        Self::new(FaultAction::Delay(delay))
    }

    fn new(action: FaultAction) -> Self {
        Fault {
            action,
            verb: None,
            resource: None,
            subresource: None,
            name: None,
            times: None,
        }
    }

    pub fn verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }

    pub fn resource(mut self, plural: &str) -> Self {
        self.resource = Some(plural.to_string());
        self
    }

    pub fn subresource(mut self, subresource: &str) -> Self {
        self.subresource = Some(subresource.to_string());
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Applies to the next `n` matching requests only.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    pub(crate) fn matches(&self, record: &RequestRecord) -> bool {
        fn wanted<T: PartialEq>(criterion: &Option<T>, actual: Option<&T>) -> bool {
            criterion.as_ref().is_none_or(|c| Some(c) == actual)
        }
        self.times != Some(0)
            && wanted(&self.verb, record.verb.as_ref())
            && wanted(&self.resource, Some(&record.resource))
            && wanted(&self.subresource, record.subresource.as_ref())
            && wanted(&self.name, record.name.as_ref())
    }
}

/// Takes the action of the first fault matching `record`, counting it down.
pub(crate) fn take(faults: &mut Vec<Fault>, record: &RequestRecord) -> Option<FaultAction> {
    let index = faults.iter().position(|f| f.matches(record))?;
    let fault = faults.get_mut(index)?;
    let action = fault.action.clone();
    if let Some(times) = fault.times.as_mut() {
        *times = times.saturating_sub(1);
        if *times == 0 {
            faults.remove(index);
        }
    }
    Some(action)
}
