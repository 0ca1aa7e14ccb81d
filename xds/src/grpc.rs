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

use crate::service::AdsService;

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
            _ => Box::pin(async move {
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
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sotw::AdsConfig;
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

    #[test]
    fn route_name_is_the_generated_one() {
        use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer as Generated;
        assert_eq!(
            <AdsServer as NamedService>::NAME,
            <Generated<AdsService> as NamedService>::NAME
        );
    }
}
