//! A stateful, in-memory Kubernetes API server for tests (feature `apiserver`): one
//! [`FakeApiServer`] holds the objects; any number of `kube::Client`s made with
//! [`FakeApiServer::client`] (discovery-service replicas, controllers, lease managers)
//! read and write them through a `tower::Service`, with no socket.
//!
//! ```no_run
//! # async fn demo() {
//! use marin3r_testkit::apiserver::{FakeApiServer, ResourceKind};
//!
//! let server = FakeApiServer::new();
//! server.register(
//!     ResourceKind::new("marin3r.3scale.net", "v1alpha1", "envoyconfigs", "EnvoyConfig")
//!         .with_status(),
//! );
//! let (replica_a, replica_b) = (server.client(), server.client());
//! # }
//! ```
//!
//! # What it emulates (JSON only, as kube-rs 5 sends it)
//! - URLs: `/api/v1/…` and `/apis/<group>/<version>/…`, namespaced
//!   (`namespaces/<ns>/<plural>`) and cluster-scoped kinds, lists and watches across
//!   all namespaces, the `status` subresource, `GET /version`. The kinds served are
//!   [`ResourceKind::builtins`] plus those [`FakeApiServer::register`]ed.
//! - GET (404 `NotFound`), LIST (`labelSelector` with `=`, `==`, `!=`, `in`, `notin`,
//!   exists, `!`exists; `fieldSelector` on `metadata.name`, `metadata.namespace` and
//!   the kind's field labels; the list's `metadata.resourceVersion`), metadata-only
//!   answers (`Accept: …;as=PartialObjectMetadata[List]`), `dryRun=All`.
//! - WATCH: newline-delimited `ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK` events after the
//!   given `resourceVersion` (from `""`/`"0"`: the current objects first), filtered by
//!   the selectors (an object entering or leaving them is `ADDED`/`DELETED`),
//!   `sendInitialEvents` (ending with the `k8s.io/initial-events-end` bookmark),
//!   `timeoutSeconds` (with a bookmark before the end if `allowWatchBookmarks`). A
//!   resourceVersion older than the kept history gets, like the real server, HTTP 200
//!   and an `ERROR` event with a `410 Expired` Status (kube's watcher then re-lists;
//!   an HTTP 410 would make it retry the same version forever). The history keeps
//!   [`DEFAULT_HISTORY_LIMIT`] events; see [`FakeApiServer::set_history_limit`] and
//!   [`FakeApiServer::compact`].
//! - POST: `409 AlreadyExists`, `generateName`, DNS-1123 names (`422 Invalid`); sets
//!   uid, `resourceVersion` (one global counter), `creationTimestamp`,
//!   `generation: 1`.
//! - PUT; PATCH as `application/merge-patch+json` (RFC 7396),
//!   `application/strategic-merge-patch+json` (applied as a merge patch; `415` for
//!   custom resources, as for CRDs), `application/json-patch+json` (RFC 6902; a failed
//!   `test` is `422`) and `application/apply-patch+yaml` (server-side apply,
//!   `fieldManager`, `force`; creates a missing object).
//! - Field ownership in `metadata.managedFields` (FieldsV1) per (manager, operation,
//!   subresource) at leaf granularity (lists are atomic): an apply that changes a
//!   field another entry owns fails `409 Conflict` naming it, unless `force=true`
//!   (which takes it over); fields an applier stops applying are removed unless
//!   someone else owns them; updates (PUT, merge, strategic and JSON patches) take the
//!   fields they change. Updates never conflict.
//! - Preconditions: a body `metadata.resourceVersion` other than the stored one is
//!   `409 Conflict` (PUT, patches, apply); DELETE preconditions (uid, resourceVersion).
//! - Status subresource: writes to `/status` change only `.status`; writes to the main
//!   resource keep it. `generation` grows when anything outside metadata (and outside
//!   `.status` for kinds with the subresource) changes, and when deletion starts. A
//!   write that changes nothing stores nothing (same resourceVersion, no event).
//! - DELETE: with finalizers, `deletionTimestamp` and `deletionGracePeriodSeconds: 0`
//!   are set (`202`); the update that removes the last finalizer removes the object.
//!   Garbage collection (background propagation): after a removal, objects whose
//!   owner references all point to objects that no longer exist are deleted the same
//!   way, recursively; `propagationPolicy: Orphan` removes the owner references
//!   instead. Deletions of collections.
//! - The Pod `portforward` subresource over a websocket (`v4.channel.k8s.io`, as kube's
//!   `Api::<Pod>::portforward` speaks it), each port bridged to a TCP address the test
//!   registers with [`FakeApiServer::forward_pod_port`].
//! - Errors are `metav1.Status` objects (`code`, `reason`, `message`, `details`);
//!   a malformed request (bad JSON, query, selector, path) is answered `400`/`404`,
//!   never a panic.
//! - Test controls: [`Outage`] (hang or refuse), [`Fault`]s (fail or delay matching
//!   requests), the request log ([`RequestRecord`], [`FakeApiServer::mark`],
//!   [`FakeApiServer::writes_since`]), direct [`FakeApiServer::put`], `get`, `list`,
//!   `delete` without a client.
//!
//! # What it does not
//! No authentication, authorization or admission (webhooks are not called), no
//! defaulting, no schema validation or pruning, no conversion between versions, no
//! pagination (`limit` and `continue` are ignored: everything comes in one page), no
//! `resourceVersionMatch` semantics (lists are always current), no YAML or protobuf
//! bodies, no strategic-merge list merge keys or directives, no list-type-aware
//! ownership (`x-kubernetes-list-map-keys`), no foreground deletion (treated as
//! background), no graceful pod deletion (pods go at once), no namespace lifecycle
//! (namespaces need not exist), no discovery endpoints (`/apis`), no `as=Table`, no
//! periodic bookmarks (only at a watch's timeout and [`FakeApiServer::send_bookmarks`]).

mod dispatch;
mod error;
mod faults;
mod fields;
mod kinds;
mod log;
mod object;
mod portforward;
mod request;
mod selector;
mod server;
mod store;
mod watch;
mod writes;

pub use error::ApiError;
pub use faults::{Fault, FaultAction};
pub use kinds::ResourceKind;
pub use log::{Mark, RequestRecord, Verb};
pub use server::{ApiService, FakeApiServer, Outage, ResponseBody, ServiceError};
pub use store::DEFAULT_HISTORY_LIMIT;
