//! From a parsed request to an answer, without I/O: routing by verb, resource and
//! scope, decoding bodies by content type, the JSON shapes of answers (objects,
//! `<Kind>List`, `PartialObjectMetadata`, Status), and what a WATCH starts with.

use std::time::Duration;

use serde_json::{Value, json};

use super::error::ApiError;
use super::kinds::ResourceKind;
use super::log::Verb;
use super::object::{meta_str, partial_metadata};
use super::request::Call;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Key, Store};
use super::watch::{Filter, WatchStart, bookmark_line};
use super::writes::{DeleteOptions, PatchBody, Target};

/// The server-side timeout of a watch that names none (the API server picks 30 to 60
/// minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// An answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Json(u16, Value),
    Watch(WatchStart),
}

impl From<ApiError> for Reply {
    fn from(error: ApiError) -> Self {
        Reply::Json(error.code, error.to_status())
    }
}

/// Serves `call` on `store` at time `now` (RFC 3339).
pub(crate) fn dispatch(store: &mut Store, call: &Call, now: &str) -> Result<Reply, ApiError> {
    if call.record.path == "/version" {
        return Ok(Reply::Json(200, version()));
    }
    if let Err(error) = &call.params {
        return Err(error.clone());
    }
    let not_served = || ApiError::new(404, "the server could not find the requested resource");
    let path = call.path.as_ref().ok_or_else(not_served)?;
    let kind = store
        .kinds
        .by_url(&path.group, &path.version, &path.plural)
        .cloned()
        .ok_or_else(not_served)?;
    let verb = call.record.verb.ok_or_else(|| {
        ApiError::new(
            405,
            format!(
                "the server does not allow the method {}",
                call.record.method
            ),
        )
    })?;
    let across_namespaces = matches!(verb, Verb::List | Verb::Watch | Verb::DeleteCollection);
    let scope_ok = if kind.namespaced {
        path.namespace.is_some() || across_namespaces
    } else {
        path.namespace.is_none()
    };
    let status = match path.subresource.as_deref() {
        None => false,
        Some("status") if kind.status_subresource => true,
        Some(_) => return Err(not_served()),
    };
    if !scope_ok || (verb == Verb::Create && path.name.is_some()) {
        return Err(not_served());
    }
    let request = Request {
        call,
        kind,
        namespace: path.namespace.clone(),
        name: path.name.clone().unwrap_or_default(),
        status,
        now,
    };
    if verb.is_write() && call.param("dryRun") == Some("All") {
        // Validated and answered as if done, nothing kept.
        return request.serve(&mut store.clone(), verb);
    }
    request.serve(store, verb)
}

/// A request to a resource the server serves.
struct Request<'a> {
    call: &'a Call,
    kind: ResourceKind,
    namespace: Option<String>,
    name: String,
    status: bool,
    now: &'a str,
}

impl Request<'_> {
    fn serve(&self, store: &mut Store, verb: Verb) -> Result<Reply, ApiError> {
        let (call, now) = (self.call, self.now);
        let namespace = self.namespace.as_deref().unwrap_or_default();
        let target = Target {
            kind: self.kind.clone(),
            namespace: namespace.to_string(),
            name: self.name.clone(),
            status: self.status,
        };
        let one = |code: u16, object: Value| Ok(Reply::Json(code, self.shape(object)));
        match verb {
            Verb::Get => one(200, store.get(&self.kind, namespace, &self.name)?.clone()),
            Verb::List => {
                let filter = self.filter()?;
                let items: Vec<Value> = store
                    .objects_of(&self.kind, self.namespace.as_deref())
                    .filter(|o| filter.matches(meta_namespace(o), o))
                    .cloned()
                    .collect();
                Ok(Reply::Json(200, self.list(items, store.resource_version())))
            }
            Verb::Watch => self.watch(store).map(Reply::Watch),
            Verb::Create => one(
                201,
                store.create(
                    &self.kind,
                    namespace,
                    self.json_body()?,
                    &call.manager(),
                    now,
                )?,
            ),
            Verb::Update => one(
                200,
                store.replace(&target, self.json_body()?, &call.manager(), now)?,
            ),
            Verb::Patch => {
                let body = self.json_body()?;
                let patch = match call.content_type.as_str() {
                    "application/apply-patch+yaml" => {
                        let existed = store.get(&self.kind, namespace, &self.name).is_ok();
                        let manager = call.param("fieldManager").unwrap_or_default();
                        let force = call.param("force") == Some("true");
                        let applied = store.apply(&target, body, manager, force, now)?;
                        return one(if existed { 200 } else { 201 }, applied);
                    }
                    "application/merge-patch+json" => PatchBody::Merge(body),
                    "application/strategic-merge-patch+json" if !self.kind.custom => {
                        PatchBody::Strategic(body)
                    }
                    "application/json-patch+json" => {
                        PatchBody::Json(serde_json::from_value(body).map_err(|e| {
                            ApiError::bad_request(format!("invalid JSON patch: {e}"))
                        })?)
                    }
                    other => {
                        return Err(ApiError::new(
                            415,
                            format!(
                                "the body of the request was in an unknown format - accepted \
                                 media types include: application/json-patch+json, \
                                 application/merge-patch+json, application/apply-patch+yaml \
                                 (got {other:?})"
                            ),
                        ));
                    }
                };
                one(200, store.patch(&target, patch, &call.manager(), now)?)
            }
            Verb::Delete => {
                let (object, gone) = store.delete(&target, &self.delete_options()?, now)?;
                one(if gone { 200 } else { 202 }, object)
            }
            Verb::DeleteCollection => {
                let filter = self.filter()?;
                let keys: Vec<Key> = store
                    .objects_of(&self.kind, self.namespace.as_deref())
                    .filter(|o| filter.matches(meta_namespace(o), o))
                    .map(|o| Store::key(&self.kind, meta_namespace(o), meta_str(o, "name")))
                    .collect();
                let deleted = store.delete_all(keys, &self.delete_options()?, now);
                Ok(Reply::Json(
                    200,
                    self.list(deleted, store.resource_version()),
                ))
            }
        }
    }

    /// WATCH: the initial objects (`resourceVersion` "" or "0", or
    /// `sendInitialEvents`) or the events after `resourceVersion` (`410 Expired` as an
    /// ERROR event if the history no longer has them).
    fn watch(&self, store: &Store) -> Result<WatchStart, ApiError> {
        let call = self.call;
        let filter = self.filter()?;
        let rv = call.param("resourceVersion").unwrap_or_default();
        let initial = call.param("sendInitialEvents") == Some("true");
        let allow_bookmarks = call.param("allowWatchBookmarks") == Some("true");
        if initial && !allow_bookmarks {
            return Err(ApiError::invalid(
                &self.kind,
                "",
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless \
                 allowWatchBookmarks=true",
            ));
        }
        let timeout =
            match call.param("timeoutSeconds") {
                None => DEFAULT_WATCH_TIMEOUT,
                Some(secs) => Duration::from_secs(secs.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid timeoutSeconds {secs:?}"))
                })?),
            };
        let bookmarks = allow_bookmarks.then(|| {
            if filter.metadata_only {
                (
                    "meta.k8s.io/v1".to_string(),
                    "PartialObjectMetadata".to_string(),
                )
            } else {
                (self.kind.api_version(), self.kind.kind.clone())
            }
        });
        let current = store.resource_version();
        let mut start = WatchStart {
            filter,
            bookmarks,
            lines: Vec::new(),
            ends: false,
            timeout,
            rv: current,
        };
        if rv.is_empty() || rv == "0" || initial {
            start.lines = store
                .objects_of(&self.kind, self.namespace.as_deref())
                .filter(|o| start.filter.matches(meta_namespace(o), o))
                .map(|o| start.filter.object_line("ADDED", o))
                .collect();
            if let (true, Some(types)) = (initial, &start.bookmarks) {
                start.lines.push(bookmark_line(types, current, true));
            }
            return Ok(start);
        }
        let from: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
        match store.events_after(from) {
            Ok(events) => start.lines = events.filter_map(|e| start.filter.line(e)).collect(),
            Err(expired) => {
                start.lines = vec![super::watch::error_line(&expired)];
                start.ends = true;
            }
        }
        Ok(start)
    }

    fn filter(&self) -> Result<Filter, ApiError> {
        let labels = LabelSelector::parse(self.call.param("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(
            self.call.param("fieldSelector").unwrap_or_default(),
            &self.kind,
        )
        .map_err(ApiError::bad_request)?;
        Ok(Filter {
            resource: self.kind.qualified_plural(),
            namespace: self.namespace.clone(),
            labels,
            fields,
            metadata_only: self.metadata_only(),
        })
    }

    /// The body as JSON (an apply's YAML is not parsed: kube-rs sends JSON).
    fn json_body(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.call.body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    }

    fn delete_options(&self) -> Result<DeleteOptions, ApiError> {
        let body = if self.call.body.is_empty() {
            Value::Null
        } else {
            self.json_body()?
        };
        let mut options = DeleteOptions::from_body(&body);
        if self.call.param("propagationPolicy") == Some("Orphan") {
            options.orphan = true;
        }
        Ok(options)
    }

    fn metadata_only(&self) -> bool {
        self.call.accept.contains("as=PartialObjectMetadata")
    }

    /// One object as the client asked for it (whole, or its metadata).
    fn shape(&self, object: Value) -> Value {
        if self.metadata_only() {
            partial_metadata(&object)
        } else {
            object
        }
    }

    /// A `<Kind>List` (or `PartialObjectMetadataList`) at resourceVersion `rv`.
    fn list(&self, items: Vec<Value>, rv: u64) -> Value {
        let (api_version, kind) = if self.metadata_only() {
            (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadataList".to_string(),
            )
        } else {
            (self.kind.api_version(), format!("{}List", self.kind.kind))
        };
        let items: Vec<Value> = items.into_iter().map(|o| self.shape(o)).collect();
        json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        })
    }
}

fn meta_namespace(object: &Value) -> &str {
    meta_str(object, "namespace")
}

/// `GET /version`.
fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-fake",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"
    })
}
