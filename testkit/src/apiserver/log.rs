//! The request log: every request the server answered, with its verb, resource and
//! field manager, for assertions and for counting API writes.

/// The verb of a request, as RBAC names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// Whether the verb writes (create, update, patch, delete, deletecollection).
    pub fn is_write(self) -> bool {
        !matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

/// One answered request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw query string (without `?`).
    pub query: String,
    /// None for a URL that names no resource (e.g. `/version`) or an unknown method.
    pub verb: Option<Verb>,
    /// API group ("" for the core group).
    pub group: String,
    /// The plural of the resource ("" if the URL names none).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The `fieldManager` query parameter.
    pub field_manager: Option<String>,
    /// The media type of the body (e.g. `application/apply-patch+yaml`).
    pub content_type: String,
    /// The HTTP status of the answer (200 for a watch that started).
    pub code: u16,
}

impl RequestRecord {
    /// Whether the request is a write.
    pub fn is_write(&self) -> bool {
        self.verb.is_some_and(Verb::is_write)
    }

    /// For a watch: its path and selectors, which one watcher keeps from one watch
    /// request to the next (unlike its resourceVersion).
    pub fn watch_key(&self) -> Option<String> {
        if self.verb != Some(Verb::Watch) {
            return None;
        }
        let mut selectors: Vec<&str> = self
            .query
            .split('&')
            .filter(|p| p.starts_with("labelSelector=") || p.starts_with("fieldSelector="))
            .collect();
        selectors.sort_unstable();
        Some(format!("{}?{}", self.path, selectors.join("&")))
    }
}

/// A position in the request log ([`FakeApiServer::mark`](super::FakeApiServer::mark)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mark(pub(crate) usize);
