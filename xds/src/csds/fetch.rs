//! The query: the streams the matchers select, each view built under its own lock,
//! the answer's size counted as it grows.

use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse,
};

use crate::snapshot::SnapshotCache;

use super::bounds::CsdsError;
use super::matcher::NodeFilter;
use super::registry::{ClientStatusRegistry, lock};
use super::view::{Clock, ViewInput};

/// The answer to `req` at `clock`, within `limit` encoded bytes ([`MAX_ANSWER_BYTES`](super::MAX_ANSWER_BYTES) in
/// the service): the matchers are bounded ([`MAX_STRING_MATCHERS`](super::MAX_STRING_MATCHERS),
/// [`MAX_PATTERN_BYTES`](super::MAX_PATTERN_BYTES)); the registry is locked only to copy the stream handles
/// (matching runs without it), each
/// stream's state machine only while its view is built; the answer's encoded size is
/// counted as it grows and the query stops once it is over the limit.
pub fn fetch(
    registry: &ClientStatusRegistry,
    cache: &SnapshotCache,
    req: &ClientStatusRequest,
    clock: Clock,
    limit: usize,
) -> Result<ClientStatusResponse, CsdsError> {
    let filter = NodeFilter::compile(&req.node_matchers)?;
    let with_contents = !req.exclude_resource_contents && filter.is_targeted();
    let streams = registry.matching(|node| filter.matches(node));
    let matched = streams.len();
    let mut config = Vec::with_capacity(matched);
    let mut size = 0usize;
    for (_, node, view) in streams {
        let snapshot = with_contents.then(|| cache.get(&node.id)).flatten();
        let input = ViewInput {
            clock,
            contents: snapshot.as_deref(),
        };
        let generic_xds_configs = lock(&view).generic_xds_configs(&input);
        let cc = ClientConfig {
            node: Some(node.to_node()),
            generic_xds_configs,
            ..Default::default()
        };
        size = size.saturating_add(prost::encoding::message::encoded_len(1, &cc));
        if size > limit {
            return Err(CsdsError::TooLarge {
                matched,
                size,
                limit,
            });
        }
        config.push(cc);
    }
    Ok(ClientStatusResponse { config })
}
