//! The compiled constraints of a message type: per field, whether it is required,
//! skipped or opaque, names an extension, and its type rule (numbers, strings, bytes,
//! enums, lists, maps, `Any`, `Duration`, `Timestamp`), as [`super::compile`] builds them
//! from the descriptors' PGV options and [`super::walk`] and [`super::apply`] use them.

use prost_reflect::{FieldDescriptor, OneofDescriptor};

use super::value::Num;

/// The compiled constraints of one message type.
#[derive(Default)]
pub(super) struct MessageRules {
    /// The fields that have rules or hold messages (to recurse into).
    pub(super) fields: Vec<FieldCheck>,
    /// Oneofs with `(validate.required) = true`.
    pub(super) required_oneofs: Vec<OneofDescriptor>,
    /// This message is an extension (`typed_config` in a oneof): the oneof that must be
    /// set (unless the message says `is_optional: true`).
    pub(super) extension: Option<OneofDescriptor>,
    /// Rules this checker does not implement, as `field: rule` (for the survey test).
    pub(super) unsupported: Vec<String>,
    /// Rule kinds in use, for the survey test.
    pub(super) kinds: Vec<&'static str>,
}

pub(super) struct FieldCheck {
    pub(super) field: FieldDescriptor,
    /// A oneof member or proto3 `optional`: checked only when set.
    pub(super) only_if_set: bool,
    /// `message.required`.
    pub(super) required: bool,
    /// `message.skip`: not recursed into.
    pub(super) skip: bool,
    pub(super) rule: Option<Rule>,
    /// The field holds messages (singular, list or map values).
    pub(super) holds_messages: bool,
    /// `Metadata.typed_filter_metadata`: `Any` payloads Envoy never unpacks.
    pub(super) opaque: bool,
    /// `typed_config` of an extension, or a `typed_per_filter_config` value: an empty
    /// `Any` there names no factory.
    pub(super) names_extension: bool,
}

/// Bounds and sets of a numeric (or duration, in nanoseconds) rule.
#[derive(Default)]
pub(super) struct Range {
    pub(super) konst: Option<Num>,
    pub(super) lt: Option<Num>,
    pub(super) lte: Option<Num>,
    pub(super) gt: Option<Num>,
    pub(super) gte: Option<Num>,
    pub(super) in_: Vec<Num>,
    pub(super) not_in: Vec<Num>,
}

#[derive(Default)]
pub(super) struct StringRule {
    pub(super) konst: Option<String>,
    pub(super) len: Option<u64>,
    pub(super) min_len: Option<u64>,
    pub(super) max_len: Option<u64>,
    pub(super) len_bytes: Option<u64>,
    pub(super) min_bytes: Option<u64>,
    pub(super) max_bytes: Option<u64>,
    pub(super) pattern: Option<(String, regex::Regex)>,
    pub(super) prefix: Option<String>,
    pub(super) suffix: Option<String>,
    pub(super) contains: Option<String>,
    pub(super) not_contains: Option<String>,
    pub(super) in_: Vec<String>,
    pub(super) not_in: Vec<String>,
    pub(super) well_known: Option<WellKnown>,
    pub(super) ignore_empty: bool,
}

#[derive(Clone, Copy)]
pub(super) enum WellKnown {
    Ip,
    Ipv4,
    Ipv6,
    Hostname,
    Address,
    Uuid,
}

#[derive(Default)]
pub(super) struct BytesRule {
    pub(super) konst: Option<Vec<u8>>,
    pub(super) len: Option<u64>,
    pub(super) min_len: Option<u64>,
    pub(super) max_len: Option<u64>,
    pub(super) pattern: Option<(String, regex::bytes::Regex)>,
    pub(super) prefix: Option<Vec<u8>>,
    pub(super) suffix: Option<Vec<u8>>,
    pub(super) contains: Option<Vec<u8>>,
    pub(super) in_: Vec<Vec<u8>>,
    pub(super) not_in: Vec<Vec<u8>>,
    pub(super) ignore_empty: bool,
}

pub(super) enum Rule {
    Num {
        range: Range,
        ignore_empty: bool,
    },
    Bool(Option<bool>),
    Str(Box<StringRule>),
    Bytes(Box<BytesRule>),
    Enum {
        range: Range,
        defined_only: bool,
    },
    Repeated {
        min: Option<u64>,
        max: Option<u64>,
        unique: bool,
        items: Option<Box<ItemRule>>,
        ignore_empty: bool,
    },
    Map {
        min: Option<u64>,
        max: Option<u64>,
        keys: Option<Box<ItemRule>>,
        values: Option<Box<ItemRule>>,
        ignore_empty: bool,
    },
    Any {
        required: bool,
        in_: Vec<String>,
        not_in: Vec<String>,
    },
    Duration {
        required: bool,
        range: Range,
    },
    Timestamp {
        required: bool,
    },
}

/// The rules of a list item or map key/value: `message.required`/`skip` and a type rule.
pub(super) struct ItemRule {
    pub(super) skip: bool,
    pub(super) rule: Option<Rule>,
}
