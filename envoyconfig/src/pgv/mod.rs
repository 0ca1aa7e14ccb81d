//! The constraints Envoy checks when it loads a resource, over a decoded message: the
//! protoc-gen-validate (PGV) rules of Envoy's API protos, and the extension lookups that
//! fail on an `Any` that names no type.
//!
//! **PGV.** Envoy's `.proto` files carry `(validate.rules)` field options,
//! `(validate.required)` oneof options and `(validate.disabled)`/`(validate.ignored)`
//! message options; Envoy runs the C++ validators PGV generates from them on every
//! resource it loads, and on the payload of every `Any` it unpacks into an extension's
//! config (`MessageUtil::validate`, `downcastAndValidate`). The registry keeps those
//! options (protoc writes them into the descriptor set, `validate/validate.proto` is in
//! the pool), so [`check`] reads them: the rules of a message type are compiled once, on
//! first use, and cached. The semantics are those of PGV's C++ templates:
//!
//! - a field's rules apply to its value, the default included (an unset `string` with
//!   `min_len: 1` fails), except for a field of a oneof or a proto3 `optional` field,
//!   which is checked only when set; `ignore_empty` skips an empty value;
//! - a message field is checked for `required`, then (unless `skip`) recursively; a
//!   wrapper (`UInt32Value`, …) is checked with the rules of its wrapped type when set;
//! - string lengths count characters, `*_bytes` count bytes, `pattern` and
//!   `well_known_regex` (`HTTP_HEADER_NAME`/`VALUE`, `strict: false` = no NUL, CR, LF)
//!   must match the whole string;
//! - `Any`: `required`, `in`, `not_in` on the type URL; its payload is checked with the
//!   rules of the type it names (Envoy validates it when it unpacks the extension
//!   config), except in `Metadata.typed_filter_metadata`, which Envoy keeps opaque;
//! - `Duration`: `required`, `const`, `lt`/`lte`/`gt`/`gte`, `in`/`not_in`;
//!   `Timestamp`: `required`; a disabled or ignored message is not checked at all.
//!
//! Rules that PGV's C++ templates do not implement (`email`, `uri`, timestamp
//! comparisons, `no_sparse`, IP rules on bytes) are not checked (Envoy's API uses none of
//! them; a test surveys every rule of the registry).
//!
//! **Extensions.** Envoy finds the factory of an extension (`name` + `typed_config`) by
//! the type URL of `typed_config`. An empty `Any` (`typed_config: {}`) or a missing
//! `typed_config` finds none: Envoy refuses it with "Didn't find a registered
//! implementation for '<name>' with type URL: ''" — for every message whose
//! `typed_config` is in a oneof (listener, network, HTTP and listener filters, transport
//! sockets, access loggers, tracers, retry predicates, …), a `TypedExtensionConfig`
//! (matcher inputs and actions, …), and the values of `typed_per_filter_config` — except
//! for an HTTP filter marked `is_optional`, which Envoy then skips. An empty `Any`
//! elsewhere (`FilterConfig.config: {}`) is accepted.
//!
//! **TLS material.** After its rules, each message goes through [`crate::tls::check`]:
//! what Envoy's TLS context loader refuses in certificates, keys, CAs, curves and
//! cipher suites (validate mode never runs it; a serving Envoy does).
//!
//! Errors name the field path in proto field names, the way decode errors do:
//! `filter_chains[0].filters[0].typed_config.stat_prefix: value length must be at least
//! 1 characters`.
//!
//! The parts, from the entry down: `walk` ([`check`]: the walk over a message, its
//! extensions and `Any` payloads), `apply` (one rule on one value), `compile` (PGV
//! options → rules, cached per message type), `rules` (the compiled rules) and `value`
//! (reading reflected values).

mod apply;
mod compile;
mod rules;
mod value;
mod walk;

pub(crate) use walk::check;
