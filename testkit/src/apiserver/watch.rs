//! WATCH: which events a watch sees (namespace, selectors, objects entering or leaving
//! them), the newline-delimited JSON lines, and the streaming response body (ends at
//! `timeoutSeconds` after a bookmark, goes silent when the server hangs).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Sleep;

use super::error::ApiError;
use super::object::partial_metadata;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Event, EventType};

/// Which objects a watch (or a list) sees.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    /// The qualified plural of the kind.
    pub(crate) resource: String,
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    /// Objects are sent as `PartialObjectMetadata`.
    pub(crate) metadata_only: bool,
}

impl Filter {
    pub(crate) fn matches(&self, namespace: &str, object: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }

    /// The line a watch with this filter gets for `event`, if any: a modification
    /// that brings an object into the selection is `ADDED`, one that takes it out is
    /// `DELETED`.
    pub(crate) fn line(&self, event: &Event) -> Option<Bytes> {
        if event.resource != self.resource {
            return None;
        }
        let now = self.matches(&event.namespace, &event.object);
        let before = event
            .old
            .as_ref()
            .is_some_and(|old| self.matches(&event.namespace, old));
        let kind = match (event.kind, before, now) {
            (EventType::Added, _, true) => "ADDED",
            (EventType::Deleted, _, true) => "DELETED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(self.object_line(kind, &event.object))
    }

    /// `{"type": kind, "object": object}` and a newline.
    pub(crate) fn object_line(&self, kind: &str, object: &Value) -> Bytes {
        if self.metadata_only {
            line(kind, &partial_metadata(object))
        } else {
            line(kind, object)
        }
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

/// An `ERROR` event carrying `error`'s Status (e.g. 410 Expired).
pub(crate) fn error_line(error: &ApiError) -> Bytes {
    line("ERROR", &error.to_status())
}

/// The `(apiVersion, kind)` of a watch's bookmarks.
pub(crate) type BookmarkType = (String, String);

/// A `BOOKMARK` at resourceVersion `rv` (`initial_end`: the end of the initial events
/// of a `sendInitialEvents` watch).
pub(crate) fn bookmark_line(types: &BookmarkType, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"apiVersion": types.0, "kind": types.1, "metadata": metadata}),
    )
}

/// What a WATCH request starts with.
#[derive(Debug)]
pub(crate) struct WatchStart {
    pub(crate) filter: Filter,
    /// Bookmarks allowed (`allowWatchBookmarks`): their type.
    pub(crate) bookmarks: Option<BookmarkType>,
    /// Initial or replayed events, sent first.
    pub(crate) lines: Vec<Bytes>,
    /// The stream ends after `lines` (e.g. `410 Expired`).
    pub(crate) ends: bool,
    pub(crate) timeout: Duration,
    /// The resourceVersion the watch is at after `lines`.
    pub(crate) rv: u64,
}

/// The server's end of an open watch.
#[derive(Debug)]
pub(crate) struct WatchSink {
    filter: Filter,
    bookmarks: Option<BookmarkType>,
    tx: mpsc::UnboundedSender<Bytes>,
    /// The resourceVersion up to which every event was offered.
    progress: Arc<AtomicU64>,
    hung: Arc<AtomicBool>,
}

impl WatchSink {
    /// Sends `event` if the watch sees it; the watch has been offered everything up
    /// to `event.rv` afterwards.
    pub(crate) fn offer(&self, event: &Event) {
        if let Some(line) = self.filter.line(event) {
            let _ = self.tx.send(line);
        }
        self.progress.store(event.rv, Ordering::SeqCst);
    }

    /// Sends a bookmark at `rv` if the watch allows them.
    pub(crate) fn bookmark(&self, rv: u64) {
        if let Some(types) = &self.bookmarks {
            let _ = self.tx.send(bookmark_line(types, rv, false));
        }
    }

    /// The client went away.
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The connection hangs: the stream never yields again, nor ends.
    pub(crate) fn hang(&self) {
        self.hung.store(true, Ordering::SeqCst);
    }
}

/// Opens a watch: the sink to offer events to (none if it ends at once) and the
/// response body.
pub(crate) fn open(start: WatchStart) -> (Option<WatchSink>, WatchStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    for line in start.lines {
        let _ = tx.send(line);
    }
    let progress = Arc::new(AtomicU64::new(start.rv));
    let hung = Arc::new(AtomicBool::new(false));
    let stream = WatchStream {
        rx,
        deadline: Box::pin(tokio::time::sleep(start.timeout)),
        progress: progress.clone(),
        hung: hung.clone(),
        bookmarks: start.bookmarks.clone(),
        done: false,
    };
    let sink = (!start.ends).then(|| WatchSink {
        filter: start.filter,
        bookmarks: start.bookmarks,
        tx,
        progress,
        hung,
    });
    (sink, stream)
}

/// The body of a WATCH response: lines as they come; at the timeout, a bookmark (if
/// allowed) and the end.
#[derive(Debug)]
pub struct WatchStream {
    rx: mpsc::UnboundedReceiver<Bytes>,
    deadline: Pin<Box<Sleep>>,
    progress: Arc<AtomicU64>,
    hung: Arc<AtomicBool>,
    bookmarks: Option<BookmarkType>,
    done: bool,
}

impl Stream for WatchStream {
    type Item = Result<Frame<Bytes>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.hung.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(line)) => return Poll::Ready(Some(Ok(Frame::data(line)))),
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        if this.deadline.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // Timed out: what was offered up to `rv` is in the channel; send it, then a
        // bookmark at `rv`, and end.
        this.done = true;
        let rv = this.progress.load(Ordering::SeqCst);
        let mut rest = Vec::new();
        while let Ok(line) = this.rx.try_recv() {
            rest.extend_from_slice(&line);
        }
        if let Some(types) = &this.bookmarks {
            rest.extend_from_slice(&bookmark_line(types, rv, false));
        }
        if rest.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))))
        }
    }
}
