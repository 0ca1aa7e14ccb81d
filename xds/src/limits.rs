//! What one client can make the ADS/CSDS listener hold, bounded (docs/reliability.md):
//! connections, streams (per connection and overall), bytes of requests held while they
//! are received (per connection and overall), and idle time.
//!
//! - [`ConnectionLimits`]: the numbers, in [`crate::AdsConfig::limits`].
//! - [`Framing`]: a sans-I/O reader of the gRPC message framing of a request body: how
//!   many bytes the server's decoder holds for it after each chunk.
//! - [`Bounded`]: a request body that charges what its decoder holds to its connection's
//!   and the server's [`Budget`]; a stream that would go over either ends with
//!   `RESOURCE_EXHAUSTED` (the client may retry; nothing else is touched).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};

/// Connections held at once; one more is closed as soon as it is accepted (before its
/// TLS handshake). Sized for the 10,000 Envoys of the manifests' sizing on one replica
/// plus 20 % for reconnect storms, and for the 512 Mi memory limit: at ~40 KiB per
/// Envoy (connection and ADS stream, docs/install.md "Sizing"), 12,000 take ~470 MiB.
pub const MAX_CONNECTIONS: usize = 12_000;
/// Streams a client may open at once on one connection (HTTP/2
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; more are refused with `REFUSED_STREAM`). An Envoy
/// opens one ADS stream per connection; gRPC clients that multiplex (tests, tools) get
/// grpc-go's usual 100.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;
/// Streams open at once over all connections; one more ends at once with
/// `RESOURCE_EXHAUSTED`. Like [`MAX_CONNECTIONS`]: at ~40 KiB per ADS stream, 12,000
/// take ~470 MiB, within the 512 Mi memory limit.
pub const MAX_STREAMS: usize = 12_000;
/// The HTTP/2 flow-control window of a stream: at most this much of a stream's data is
/// buffered before the server reads it.
pub const STREAM_WINDOW_BYTES: u32 = 256 * 1024;
/// The HTTP/2 flow-control window of a connection: at most this much data of all its
/// streams is buffered before the server reads it.
pub const CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;
/// Bytes of requests one connection's decoders may hold at once ([`Framing::held`]):
/// two messages of the largest size ([`crate::grpc::MAX_DECODING_MESSAGE_SIZE`]).
pub const CONNECTION_REQUEST_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes of requests all connections' decoders may hold at once.
pub const TOTAL_REQUEST_BYTES: u64 = 128 * 1024 * 1024;
/// A connection without any stream for this long is closed (a GOAWAY): an Envoy always
/// has its ADS stream open, so only a client that stays connected doing nothing is.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// A complete message at least this large is counted as held until the stream ends: the
/// stream's decoder keeps the buffer it grew for it. Smaller ones are not (at most
/// this much per stream).
pub const RETAINED_FROM_BYTES: u64 = 64 * 1024;

/// The bounds of the ADS/CSDS listener ([`crate::AdsConfig::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// [`MAX_STREAMS_PER_CONNECTION`].
    pub max_streams_per_connection: u32,
    /// [`MAX_STREAMS`].
    pub max_streams: usize,
    /// [`STREAM_WINDOW_BYTES`].
    pub stream_window: u32,
    /// [`CONNECTION_WINDOW_BYTES`].
    pub connection_window: u32,
    /// [`CONNECTION_REQUEST_BYTES`].
    pub connection_request_bytes: u64,
    /// [`TOTAL_REQUEST_BYTES`].
    pub total_request_bytes: u64,
    /// [`IDLE_TIMEOUT`]; zero disables it.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            max_streams_per_connection: MAX_STREAMS_PER_CONNECTION,
            max_streams: MAX_STREAMS,
            stream_window: STREAM_WINDOW_BYTES,
            connection_window: CONNECTION_WINDOW_BYTES,
            connection_request_bytes: CONNECTION_REQUEST_BYTES,
            total_request_bytes: TOTAL_REQUEST_BYTES,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// A number of bytes that may be held at once, shared by whoever charges it.
#[derive(Debug)]
pub struct Budget {
    used: AtomicU64,
    limit: u64,
    /// Names the budget in the status a refused stream gets.
    what: &'static str,
}

impl Budget {
    /// A budget of `limit` bytes; `what` names it ("connection", "server").
    pub fn new(limit: u64, what: &'static str) -> Self {
        Self {
            used: AtomicU64::new(0),
            limit,
            what,
        }
    }

    /// Takes `n` bytes if they fit; whether they did.
    pub fn try_take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Gives `n` bytes back.
    pub fn give(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(n))
            });
    }

    /// Bytes taken now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// The gRPC length-prefixed message framing of a request body (a 1-byte flag and a
/// 4-byte big-endian length before each message), followed chunk by chunk: how much the
/// server's decoder holds for the stream.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Framing {
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message's body still to come.
    remaining: u64,
    /// Bytes of the current, unfinished message received (its prefix included).
    unfinished: u64,
    /// The largest complete message of at least [`RETAINED_FROM_BYTES`] (the decoder
    /// keeps a buffer that large).
    retained: u64,
}

impl Framing {
    /// Follows `chunk`, the next bytes of the body.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.header_len < self.header.len() {
                let n = (self.header.len() - self.header_len).min(chunk.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&chunk[..n]);
                self.header_len += n;
                self.unfinished += n as u64;
                chunk = &chunk[n..];
                if self.header_len == self.header.len() {
                    let [_, a, b, c, d] = self.header;
                    self.remaining = u64::from(u32::from_be_bytes([a, b, c, d]));
                    if self.remaining == 0 {
                        self.complete();
                    }
                }
                continue;
            }
            let n = usize::try_from(self.remaining)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            self.remaining -= n as u64;
            self.unfinished += n as u64;
            chunk = &chunk[n..];
            if self.remaining == 0 {
                self.complete();
            }
        }
    }

    fn complete(&mut self) {
        let len = self.unfinished.saturating_sub(self.header.len() as u64);
        if len >= RETAINED_FROM_BYTES {
            self.retained = self.retained.max(len);
        }
        self.header_len = 0;
        self.unfinished = 0;
    }

    /// Bytes the decoder holds now: the unfinished message received so far, or the
    /// buffer a large message left, whichever is larger (the buffer is reused).
    pub fn held(&self) -> u64 {
        self.unfinished.max(self.retained)
    }
}

/// A request body whose decoder's holding ([`Framing::held`]) is charged to its
/// connection's and the server's [`Budget`] as it is received, and given back when the
/// body is dropped (the stream ended). Over either budget, the body fails with
/// `RESOURCE_EXHAUSTED`: the stream ends with that status and its buffers are freed.
#[derive(Debug)]
pub struct Bounded<B> {
    inner: B,
    framing: Framing,
    charged: u64,
    budgets: [Arc<Budget>; 2],
    /// Refused: the body has ended.
    refused: bool,
}

impl<B> Bounded<B> {
    /// `inner` charged to `connection` and `total`.
    pub fn new(inner: B, connection: Arc<Budget>, total: Arc<Budget>) -> Self {
        Self {
            inner,
            framing: Framing::default(),
            charged: 0,
            budgets: [connection, total],
            refused: false,
        }
    }

    /// Charges the bytes held after `chunk`; the status if a budget is over.
    fn charge(&mut self, chunk: &[u8]) -> Result<(), tonic::Status> {
        self.framing.feed(chunk);
        let held = self.framing.held();
        if held <= self.charged {
            let back = self.charged - held;
            self.budgets.iter().for_each(|b| b.give(back));
            self.charged = held;
            return Ok(());
        }
        let more = held - self.charged;
        for (i, budget) in self.budgets.iter().enumerate() {
            if !budget.try_take(more) {
                self.budgets[..i].iter().for_each(|b| b.give(more));
                // The stream ends: what it held is given back now, not when its
                // decoder is dropped, so the streams still within the budget go on.
                let charged = std::mem::take(&mut self.charged);
                self.budgets.iter().for_each(|b| b.give(charged));
                self.refused = true;
                return Err(tonic::Status::resource_exhausted(format!(
                    "the {} holds its limit of {} bytes of requests being received; retry later",
                    budget.what, budget.limit
                )));
            }
        }
        self.charged = held;
        Ok(())
    }
}

impl<B> Drop for Bounded<B> {
    fn drop(&mut self) {
        let charged = self.charged;
        self.budgets.iter().for_each(|b| b.give(charged));
    }
}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(None);
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(tonic::Status::from_error(e.into())))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(status) = this.charge(data)
        {
            return Poll::Ready(Some(Err(status)));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.resize(5 + len as usize, 7);
        m
    }

    #[test]
    fn framing_counts_the_unfinished_message_whatever_the_chunking() {
        let mut f = Framing::default();
        let two = [message(10), message(3)].concat();
        for (i, byte) in two.iter().enumerate() {
            f.feed(std::slice::from_ref(byte));
            let expect = match i {
                14 | 22 => 0,
                0..14 => i + 1,
                _ => i - 14,
            } as u64;
            assert_eq!(f.held(), expect, "after byte {i}");
        }
        // In one chunk: nothing held once both are complete.
        let mut f = Framing::default();
        f.feed(&two);
        assert_eq!(f.held(), 0);
        // An empty message, then half a header.
        f.feed(&message(0));
        f.feed(&[0, 0]);
        assert_eq!(f.held(), 2);
    }

    #[test]
    fn a_large_complete_message_stays_held_until_the_stream_ends() {
        let mut f = Framing::default();
        f.feed(&message(100_000));
        assert_eq!(f.held(), 100_000);
        f.feed(&message(10));
        assert_eq!(f.held(), 100_000);
        let mut f = Framing::default();
        f.feed(&message(4 * 1024 * 1024)[..1_000_005]);
        assert_eq!(f.held(), 1_000_005);
    }

    #[test]
    fn budgets_refuse_past_their_limit_and_take_back() {
        let b = Budget::new(10, "connection");
        assert!(b.try_take(6));
        assert!(!b.try_take(5));
        assert!(b.try_take(4));
        b.give(10);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_body_over_its_budget_fails_resource_exhausted_and_gives_back_at_once() {
        use http_body_util::BodyExt as _;
        let conn = Arc::new(Budget::new(1000, "connection"));
        let total = Arc::new(Budget::new(1500, "server"));
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from(message(2000)[..800].to_vec()))),
            Ok(Frame::data(Bytes::from(message(2000)[800..1200].to_vec()))),
        ];
        let inner = http_body_util::StreamBody::new(futures::stream::iter(chunks));
        let mut body = Bounded::new(inner, conn.clone(), total.clone());
        body.frame().await.unwrap().unwrap();
        assert_eq!((conn.used(), total.used()), (800, 800));
        let status = body.frame().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("connection"), "{status:?}");
        // Refused: what it held is given back at once, and it has ended.
        assert_eq!((conn.used(), total.used()), (0, 0));
        assert!(body.frame().await.is_none());
        drop(body);
        assert_eq!((conn.used(), total.used()), (0, 0));
    }
}
