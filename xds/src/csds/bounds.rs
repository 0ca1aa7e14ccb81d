//! What a client status query may make the server do, and how a query is refused.

/// Largest encoded answer: 4 MiB, gRPC's default receive limit of a client.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Most string matchers in one query (each `node_id` and each `node_metadatas` entry of
/// every `node_matchers` item counts): a query's matching work is matchers × streams,
/// so both factors are bounded (`marin3r status` sends one; a fleet tool a few).
pub const MAX_STRING_MATCHERS: usize = 64;
/// Most bytes of all the patterns of one query together (a pattern longer than a
/// node's fields, [`marin3r_wire::MAX_NODE_NAME_BYTES`], matches nothing but `contains`
/// still scans for it).
pub const MAX_PATTERN_BYTES: usize = 16 * 1024;
/// Queries answered at once by one replica; more wait their turn. A query runs on a
/// blocking thread and may read every stream's state machine: this bounds the CPU all
/// client status clients together take from serving Envoys.
pub const MAX_CONCURRENT_QUERIES: usize = 2;

/// A query refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsdsError {
    /// `field` of a node matcher uses what the server does not support.
    #[error("{field}: {rule}")]
    InvalidMatcher { field: String, rule: &'static str },
    /// The query's matchers are over a bound ([`MAX_STRING_MATCHERS`],
    /// [`MAX_PATTERN_BYTES`]).
    #[error(
        "node_matchers: {count} {what}, over the limit of {limit}: ask for fewer nodes per query (e.g. a node id prefix)"
    )]
    TooManyMatchers {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// The answer would be larger than [`MAX_ANSWER_BYTES`].
    #[error(
        "the status of the {matched} Envoys matched is over {size} bytes, over the limit of {limit} bytes: narrow node_matchers (e.g. a node id prefix)"
    )]
    TooLarge {
        matched: usize,
        size: usize,
        limit: usize,
    },
}
