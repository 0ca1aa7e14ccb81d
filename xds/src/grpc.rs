//! The ADS gRPC routes, hand-written instead of the generated
//! `AggregatedDiscoveryServiceServer`, for one reason: the codec. The generated server
//! uses `tonic_prost::ProstCodec::default()`, whose encoder and decoder each allocate an
//! 8 KiB buffer per call that lives as long as the stream; with 10,000 idle Envoys that
//! was 16 KiB per stream (`valgrind --tool=massif`, bench/NOTES.md). [`AdsCodec`] is the
//! same prost encoding with 1 KiB starting buffers that grow on demand (xDS requests are
//! a few hundred bytes; a response reserves its encoded length before it is written).
//!
//! Everything else is what the generated code does: the two method paths, no
//! compression, the message size limits, and `UNIMPLEMENTED` for any other path.
//!
//! [`CsdsServer`] is the client status service
//! (`envoy.service.status.v3.ClientStatusDiscoveryService`) routed next to ADS on the
//! same mTLS listener, with the same codec and limits: `FetchClientStatus` (unary) and
//! `StreamClientStatus` (each request answered like a fetch); the answers are built by
//! [`crate::csds::fetch`].

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use envoy_types::pb::envoy::service::status::v3::{ClientStatusRequest, ClientStatusResponse};
use futures::StreamExt as _;
use tonic::server::UnaryService;

use crate::csds::{
    ClientStatusRegistry, Clock, CsdsError, MAX_ANSWER_BYTES, MAX_CONCURRENT_QUERIES, fetch,
};
use crate::service::AdsService;
use crate::snapshot::SnapshotCache;

/// Largest request accepted: 4 MiB, gRPC's default (and what upstream MARIN3R's
/// grpc-go server accepts). An Envoy request is its node (bounded by
/// [`crate::node::check_node`] to about 66 KiB), the names it subscribes to and a
/// NACK message; a larger one ends its stream with `OUT_OF_RANGE` before it is
/// decoded, so one request cannot make the server hold more than this.
pub const MAX_DECODING_MESSAGE_SIZE: usize = 4 * 1024 * 1024;
/// Largest response sent.
pub const MAX_ENCODING_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Starting size of a stream's encode and decode buffers (tonic's default: 8 KiB each).
const CODEC_BUFFER_SIZE: usize = 1024;
/// Encoded responses are handed to HTTP/2 once this many bytes are buffered (tonic's
/// default).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(CODEC_BUFFER_SIZE, YIELD_THRESHOLD)
}

/// Prost encoding with small per-stream buffers: encodes `T`, decodes `U`.
#[derive(Debug)]
pub struct AdsCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for AdsCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// The encoder of [`AdsCodec`].
#[derive(Debug)]
pub struct AdsEncoder<T>(PhantomData<fn() -> T>);

/// The decoder of [`AdsCodec`].
#[derive(Debug)]
pub struct AdsDecoder<U>(PhantomData<fn() -> U>);

impl<T, U> Codec for AdsCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = AdsEncoder<T>;
    type Decoder = AdsDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        AdsEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        AdsDecoder(PhantomData)
    }
}

impl<T: Message> Encoder for AdsEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // One allocation of the right size instead of growing the small buffer in steps.
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a response: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

impl<U: Message + Default> Decoder for AdsDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // INTERNAL for a malformed message, as tonic-prost does (gRPC status code doc).
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

/// The ADS service as a tonic route (`envoy.service.discovery.v3.AggregatedDiscoveryService`).
#[derive(Debug, Clone)]
pub struct AdsServer {
    inner: Arc<AdsService>,
}

impl AdsServer {
    pub fn new(service: AdsService) -> Self {
        Self {
            inner: Arc::new(service),
        }
    }
}

impl NamedService for AdsServer {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

struct Sotw(Arc<AdsService>);

impl StreamingService<DiscoveryRequest> for Sotw {
    type Response = DiscoveryResponse;
    type ResponseStream =
        <AdsService as AggregatedDiscoveryService>::StreamAggregatedResourcesStream;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.stream_aggregated_resources(request).await })
    }
}

struct Delta(Arc<AdsService>);

impl StreamingService<DeltaDiscoveryRequest> for Delta {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream =
        <AdsService as AggregatedDiscoveryService>::DeltaAggregatedResourcesStream;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.delta_aggregated_resources(request).await })
    }
}

impl<B> Service<http::Request<B>> for AdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let mut grpc =
                    Grpc::new(AdsCodec::<DiscoveryResponse, DiscoveryRequest>::default())
                        .apply_max_message_size_config(
                            Some(MAX_DECODING_MESSAGE_SIZE),
                            Some(MAX_ENCODING_MESSAGE_SIZE),
                        );
                Ok(grpc.streaming(Sotw(inner), req).await)
            }),
            DELTA_PATH => Box::pin(async move {
                let mut grpc =
                    Grpc::new(AdsCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default())
                        .apply_max_message_size_config(
                            Some(MAX_DECODING_MESSAGE_SIZE),
                            Some(MAX_ENCODING_MESSAGE_SIZE),
                        );
                Ok(grpc.streaming(Delta(inner), req).await)
            }),
            _ => unimplemented_route(),
        }
    }
}

/// `UNIMPLEMENTED` for a path no route serves.
fn unimplemented_route() -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
    Box::pin(async move {
        let mut response = http::Response::new(tonic::body::Body::default());
        let headers = response.headers_mut();
        headers.insert(
            Status::GRPC_STATUS,
            http::HeaderValue::from(tonic::Code::Unimplemented as i32),
        );
        headers.insert(
            http::header::CONTENT_TYPE,
            tonic::metadata::GRPC_CONTENT_TYPE,
        );
        Ok(response)
    })
}

/// The client status service as a tonic route
/// (`envoy.service.status.v3.ClientStatusDiscoveryService`), answering for the ADS
/// streams of this replica.
#[derive(Debug, Clone)]
pub struct CsdsServer {
    inner: Arc<CsdsInner>,
}

#[derive(Debug)]
struct CsdsInner {
    registry: ClientStatusRegistry,
    cache: SnapshotCache,
    /// [`MAX_CONCURRENT_QUERIES`] queries at once.
    queries: tokio::sync::Semaphore,
}

impl CsdsServer {
    /// The status of the streams of `service`.
    pub fn new(service: &AdsService) -> Self {
        Self {
            inner: Arc::new(CsdsInner {
                registry: service.client_status().clone(),
                cache: service.cache().clone(),
                queries: tokio::sync::Semaphore::new(MAX_CONCURRENT_QUERIES),
            }),
        }
    }

    fn answer(&self, req: &ClientStatusRequest) -> Result<ClientStatusResponse, Status> {
        fetch(
            &self.inner.registry,
            &self.inner.cache,
            req,
            Clock::now(),
            MAX_ANSWER_BYTES,
        )
        .map_err(csds_status)
    }

    /// [`Self::answer`] off the async workers: a fleet-wide answer locks and reads
    /// every stream's state machine in turn (milliseconds at 10,000 streams), which
    /// must not stall the ADS streams served by the same workers.
    async fn answer_blocking(
        &self,
        req: ClientStatusRequest,
    ) -> Result<ClientStatusResponse, Status> {
        let _turn = self
            .inner
            .queries
            .acquire()
            .await
            .map_err(|e| Status::internal(format!("client status query: {e}")))?;
        let server = self.clone();
        tokio::task::spawn_blocking(move || server.answer(&req))
            .await
            .map_err(|e| Status::internal(format!("client status query: {e}")))?
    }
}

/// The gRPC status of a refused query.
fn csds_status(e: CsdsError) -> Status {
    match &e {
        CsdsError::InvalidMatcher { .. } | CsdsError::TooManyMatchers { .. } => {
            Status::invalid_argument(e.to_string())
        }
        CsdsError::TooLarge { .. } => Status::resource_exhausted(e.to_string()),
    }
}

impl NamedService for CsdsServer {
    const NAME: &'static str = "envoy.service.status.v3.ClientStatusDiscoveryService";
}

const CSDS_FETCH_PATH: &str =
    "/envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus";
const CSDS_STREAM_PATH: &str =
    "/envoy.service.status.v3.ClientStatusDiscoveryService/StreamClientStatus";

struct CsdsFetch(CsdsServer);

impl UnaryService<ClientStatusRequest> for CsdsFetch {
    type Response = ClientStatusResponse;
    type Future = BoxFuture<Response<ClientStatusResponse>, Status>;

    fn call(&mut self, request: Request<ClientStatusRequest>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move {
            server
                .answer_blocking(request.into_inner())
                .await
                .map(Response::new)
        })
    }
}

struct CsdsStream(CsdsServer);

type CsdsResponses =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<ClientStatusResponse, Status>> + Send>>;

impl StreamingService<ClientStatusRequest> for CsdsStream {
    type Response = ClientStatusResponse;
    type ResponseStream = CsdsResponses;
    type Future = BoxFuture<Response<CsdsResponses>, Status>;

    fn call(&mut self, request: Request<Streaming<ClientStatusRequest>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move {
            // One answer per request, in order; a refused query answers with its status
            // and ends the stream (as gRPC does for any error).
            let answers = request.into_inner().then(move |req| {
                let server = server.clone();
                async move { server.answer_blocking(req?).await }
            });
            Ok(Response::new(Box::pin(answers) as CsdsResponses))
        })
    }
}

impl<B> Service<http::Request<B>> for CsdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let server = self.clone();
        let grpc = || {
            Grpc::new(AdsCodec::<ClientStatusResponse, ClientStatusRequest>::default())
                .apply_max_message_size_config(
                    Some(MAX_DECODING_MESSAGE_SIZE),
                    Some(MAX_ENCODING_MESSAGE_SIZE),
                )
        };
        match req.uri().path() {
            CSDS_FETCH_PATH => {
                Box::pin(async move { Ok(grpc().unary(CsdsFetch(server), req).await) })
            }
            CSDS_STREAM_PATH => {
                Box::pin(async move { Ok(grpc().streaming(CsdsStream(server), req).await) })
            }
            _ => unimplemented_route(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::AdsConfig;
    use crate::{SharedStats, SnapshotCache};

    fn server() -> AdsServer {
        AdsServer::new(AdsService::new(
            SnapshotCache::new(),
            SharedStats::new(),
            AdsConfig::default(),
        ))
    }

    #[tokio::test]
    async fn unknown_paths_are_unimplemented() {
        let req = http::Request::builder()
            .uri("/envoy.service.discovery.v3.AggregatedDiscoveryService/FetchClusters")
            .body(tonic::body::Body::default())
            .map_err(|e| e.to_string());
        let Ok(req) = req else {
            panic!("request: {req:?}");
        };
        let Ok(resp) = server().call(req).await;
        assert_eq!(
            resp.headers().get(Status::GRPC_STATUS),
            Some(&http::HeaderValue::from(tonic::Code::Unimplemented as i32))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn client_status_queries_beyond_the_bound_wait_their_turn() {
        let service = AdsService::new(
            SnapshotCache::new(),
            SharedStats::new(),
            AdsConfig::default(),
        );
        let csds = CsdsServer::new(&service);
        // Every turn taken (as by queries that run).
        let held = csds
            .inner
            .queries
            .acquire_many(MAX_CONCURRENT_QUERIES as u32)
            .await
            .unwrap();
        let waiting = tokio::time::timeout(
            std::time::Duration::from_secs(3600),
            csds.answer_blocking(ClientStatusRequest::default()),
        )
        .await;
        assert!(waiting.is_err(), "answered beyond the bound: {waiting:?}");
        drop(held);
        let answered = csds
            .answer_blocking(ClientStatusRequest::default())
            .await
            .unwrap();
        assert!(answered.config.is_empty());
    }

    #[test]
    fn route_name_is_the_generated_one() {
        use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer as Generated;
        assert_eq!(
            <AdsServer as NamedService>::NAME,
            <Generated<AdsService> as NamedService>::NAME
        );
    }
}
