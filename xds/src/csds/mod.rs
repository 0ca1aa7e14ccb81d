//! Client status (CSDS, `envoy.service.status.v3.ClientStatusDiscoveryService`): per
//! connected Envoy, what this replica sent, what the Envoy ACKed and what it NACKed with
//! which message.
//!
//! - **What is tracked** ([`ResourceLog`], one per type in each stream state machine):
//!   per resource the version the Envoy ACKed (what it runs), when, and the digest of it;
//!   what the last unanswered response changes for it (`Pending`); the last NACK
//!   that concerns it. A digest, an `Arc<str>` version (shared by the resources of one
//!   ACKed SotW response) and an `Instant` per resource: nothing is copied per response.
//! - **Versions** are what Envoy's admin `/config_dump` shows per active dynamic
//!   resource. Delta: the resource's own version (`version_string(digest)`). SotW: the
//!   `version_info` of the ACKed response that last *changed* the resource; Envoy keeps
//!   the older version of a resource whose content did not change in a later response
//!   (it skips an unchanged cluster, listener or route configuration by hash). A NACK
//!   leaves the ACKed version in place and marks the resources the rejected response
//!   changed as NACKED (with Envoy's message, as the NACK statistics store it:
//!   [`crate::tracking::stored_nack_message`]), until a later ACK covers them.
//! - **Registry** ([`ClientStatusRegistry`]): a stream registers when its node is
//!   learned and is removed when its task ends, on every path ([`Registration`]'s
//!   `Drop`). The state machine is shared with the stream task behind a mutex, locked by
//!   the task for each of its calls and by a query briefly, to build that stream's view
//!   ([`ClientView`]): the registry lock is held only to copy the stream handles, and
//!   the matchers run without it (a query never delays a stream registering).
//! - **Bounds** on what a query makes the server do: at most [`MAX_STRING_MATCHERS`]
//!   string matchers of at most [`MAX_PATTERN_BYTES`] together (refused with
//!   `INVALID_ARGUMENT` naming the limit), each compared with node fields bounded by
//!   [`crate::node::check_node`]; at most [`MAX_CONCURRENT_QUERIES`] queries at once
//!   (the others wait); the answer bounded by [`MAX_ANSWER_BYTES`]. The request itself
//!   is bounded by the listener's message size, and `StreamClientStatus` answers its
//!   requests one at a time.
//! - **Queries** ([`fetch`]): `node_matchers` OR-ed (empty = every stream), see
//!   [`NodeFilter`]; one `ClientConfig` per open stream that sent its node, sorted by
//!   node id, pod name, stream id. The resource itself (`xds_config`) only for a
//!   targeted query (every matcher an exact node id) without `exclude_resource_contents`,
//!   never for a Secret, and with every field Envoy marks sensitive redacted as Envoy's
//!   `/config_dump` shows it (`[redacted]`: an inline TLS key of a listener or cluster). The encoded answer is bounded ([`MAX_ANSWER_BYTES`]),
//!   counted as it is built.
//!
//! Access: any client the ADS port accepts (same mTLS rules) may read the status of
//! every Envoy connected to this replica, never a Secret's contents; a replica answers
//! only for its own streams.

mod bounds;
mod fetch;
mod log;
mod matcher;
mod registry;
mod view;

#[cfg(test)]
mod size;
#[cfg(test)]
mod tests;

pub use bounds::{
    CsdsError, MAX_ANSWER_BYTES, MAX_CONCURRENT_QUERIES, MAX_PATTERN_BYTES, MAX_STRING_MATCHERS,
};
pub use fetch::fetch;
pub(crate) use log::ResourceLog;
pub use matcher::NodeFilter;
pub use registry::{
    API_METADATA_KEY, ClientNode, ClientStatusRegistry, Registration, SharedView, lock,
};
pub use view::{ClientView, Clock, ViewInput};
pub(crate) use view::{absent_config, nack_message, resource_config};
