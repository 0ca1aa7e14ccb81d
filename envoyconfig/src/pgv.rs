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

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock, RwLock};

use prost_reflect::{
    DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    OneofDescriptor, ReflectMessage, Value,
};

use crate::decode::{DecodeError, Location, join_path, key_segment};
use crate::lenient::EMPTY_ANY_URL;
use crate::registry;

/// Nesting bound of the walk (protobuf's own recursion limit is 100).
const MAX_DEPTH: u32 = 128;

/// Checks `message` (and everything in it, `Any` payloads included) against Envoy's
/// constraints. The error names the first violation with its field path.
pub(crate) fn check(message: &DynamicMessage) -> Result<(), DecodeError> {
    check_message(message, "", 0)
}

// --- compiled rules ---------------------------------------------------------------------

/// The compiled constraints of one message type.
#[derive(Default)]
pub(crate) struct MessageRules {
    /// The fields that have rules or hold messages (to recurse into).
    fields: Vec<FieldCheck>,
    /// Oneofs with `(validate.required) = true`.
    required_oneofs: Vec<OneofDescriptor>,
    /// This message is an extension (`typed_config` in a oneof): the oneof that must be
    /// set (unless the message says `is_optional: true`).
    extension: Option<OneofDescriptor>,
    /// Rules this checker does not implement, as `field: rule` (for the survey test).
    pub(crate) unsupported: Vec<String>,
    /// Rule kinds in use, for the survey test.
    pub(crate) kinds: Vec<&'static str>,
}

struct FieldCheck {
    field: FieldDescriptor,
    /// A oneof member or proto3 `optional`: checked only when set.
    only_if_set: bool,
    /// `message.required`.
    required: bool,
    /// `message.skip`: not recursed into.
    skip: bool,
    rule: Option<Rule>,
    /// The field holds messages (singular, list or map values).
    holds_messages: bool,
    /// `Metadata.typed_filter_metadata`: `Any` payloads Envoy never unpacks.
    opaque: bool,
    /// `typed_config` of an extension, or a `typed_per_filter_config` value: an empty
    /// `Any` there names no factory.
    names_extension: bool,
}

/// A number of any protobuf numeric type, for comparisons.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn of(value: &Value) -> Option<Num> {
        Some(match value {
            Value::I32(v) => Num::Int(i128::from(*v)),
            Value::I64(v) => Num::Int(i128::from(*v)),
            Value::U32(v) => Num::Int(i128::from(*v)),
            Value::U64(v) => Num::Int(i128::from(*v)),
            Value::EnumNumber(v) => Num::Int(i128::from(*v)),
            Value::F32(v) => Num::Float(f64::from(*v)),
            Value::F64(v) => Num::Float(*v),
            _ => return None,
        })
    }

    fn cmp(self, other: Num) -> Option<std::cmp::Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(v) => v as f64,
            Num::Float(v) => v,
        }
    }

    fn is_zero(self) -> bool {
        self.as_f64() == 0.0
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(v) => write!(f, "{v}"),
            Num::Float(v) => write!(f, "{v}"),
        }
    }
}

/// Bounds and sets of a numeric (or duration, in nanoseconds) rule.
#[derive(Default)]
struct Range {
    konst: Option<Num>,
    lt: Option<Num>,
    lte: Option<Num>,
    gt: Option<Num>,
    gte: Option<Num>,
    in_: Vec<Num>,
    not_in: Vec<Num>,
}

#[derive(Default)]
struct StringRule {
    konst: Option<String>,
    len: Option<u64>,
    min_len: Option<u64>,
    max_len: Option<u64>,
    len_bytes: Option<u64>,
    min_bytes: Option<u64>,
    max_bytes: Option<u64>,
    pattern: Option<(String, regex::Regex)>,
    prefix: Option<String>,
    suffix: Option<String>,
    contains: Option<String>,
    not_contains: Option<String>,
    in_: Vec<String>,
    not_in: Vec<String>,
    well_known: Option<WellKnown>,
    ignore_empty: bool,
}

#[derive(Clone, Copy)]
enum WellKnown {
    Ip,
    Ipv4,
    Ipv6,
    Hostname,
    Address,
    Uuid,
}

#[derive(Default)]
struct BytesRule {
    konst: Option<Vec<u8>>,
    len: Option<u64>,
    min_len: Option<u64>,
    max_len: Option<u64>,
    pattern: Option<(String, regex::bytes::Regex)>,
    prefix: Option<Vec<u8>>,
    suffix: Option<Vec<u8>>,
    contains: Option<Vec<u8>>,
    in_: Vec<Vec<u8>>,
    not_in: Vec<Vec<u8>>,
    ignore_empty: bool,
}

enum Rule {
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
struct ItemRule {
    skip: bool,
    rule: Option<Rule>,
}

static CACHE: LazyLock<RwLock<HashMap<String, Arc<MessageRules>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The compiled rules of `desc`, from the cache.
pub(crate) fn rules_for(desc: &MessageDescriptor) -> Arc<MessageRules> {
    if let Ok(cache) = CACHE.read()
        && let Some(rules) = cache.get(desc.full_name())
    {
        return rules.clone();
    }
    let rules = Arc::new(compile(desc));
    if let Ok(mut cache) = CACHE.write() {
        cache.insert(desc.full_name().to_string(), rules.clone());
    }
    rules
}

/// The PGV option extensions, when the pool has them.
struct Extensions {
    rules: ExtensionDescriptor,
    disabled: Option<ExtensionDescriptor>,
    ignored: Option<ExtensionDescriptor>,
    required: Option<ExtensionDescriptor>,
}

fn extensions(desc: &MessageDescriptor) -> Option<Extensions> {
    let pool = desc.parent_pool();
    Some(Extensions {
        rules: pool.get_extension_by_name("validate.rules")?,
        disabled: pool.get_extension_by_name("validate.disabled"),
        ignored: pool.get_extension_by_name("validate.ignored"),
        required: pool.get_extension_by_name("validate.required"),
    })
}

fn flag(options: &DynamicMessage, ext: Option<&ExtensionDescriptor>) -> bool {
    ext.is_some_and(|e| {
        options.has_extension(e) && options.get_extension(e).as_bool() == Some(true)
    })
}

fn compile(desc: &MessageDescriptor) -> MessageRules {
    let mut out = MessageRules::default();
    let Some(ext) = extensions(desc) else {
        return out;
    };
    let options = desc.options();
    if flag(&options, ext.disabled.as_ref()) || flag(&options, ext.ignored.as_ref()) {
        out.kinds.push("message.disabled");
        return out;
    }
    for oneof in desc.oneofs() {
        if !oneof.is_synthetic() && flag(&oneof.options(), ext.required.as_ref()) {
            out.kinds.push("oneof.required");
            out.required_oneofs.push(oneof);
        }
    }
    let is_metadata = desc.full_name() == "envoy.config.core.v3.Metadata";
    let is_typed_extension_config = matches!(
        desc.full_name(),
        "envoy.config.core.v3.TypedExtensionConfig" | "xds.core.v3.TypedExtensionConfig"
    );
    let per_filter_config = |f: &FieldDescriptor| f.name() == "typed_per_filter_config";
    for field in desc.fields() {
        let options = field.options();
        let mut check = FieldCheck {
            only_if_set: field.containing_oneof().is_some(),
            required: false,
            skip: false,
            rule: None,
            holds_messages: holds_messages(&field),
            opaque: is_metadata && field.name() == "typed_filter_metadata",
            names_extension: is_extension_config(&field)
                || per_filter_config(&field)
                || (is_typed_extension_config && field.name() == "typed_config"),
            field: field.clone(),
        };
        if options.has_extension(&ext.rules)
            && let Value::Message(rules) = &*options.get_extension(&ext.rules)
        {
            let mut ctx = Ctx {
                field: field.name(),
                out: &mut out,
            };
            let (required, skip, rule) = field_rules(rules, &mut ctx);
            check.required = required;
            check.skip = skip;
            check.rule = rule;
        }
        if check.required || check.rule.is_some() || check.holds_messages {
            out.fields.push(check);
        }
    }
    if let Some(typed_config) = desc.get_field_by_name("typed_config")
        && is_extension_config(&typed_config)
        && let Some(oneof) = typed_config.containing_oneof()
    {
        out.extension = Some(oneof);
    }
    out
}

/// `typed_config` (an `Any`) in a real oneof: the config of a named extension.
fn is_extension_config(field: &FieldDescriptor) -> bool {
    field.name() == "typed_config"
        && matches!(field.kind(), Kind::Message(m) if m.full_name() == "google.protobuf.Any")
        && field.containing_oneof().is_some_and(|o| !o.is_synthetic())
}

fn holds_messages(field: &FieldDescriptor) -> bool {
    match field.kind() {
        Kind::Message(m) if field.is_map() => {
            matches!(m.map_entry_value_field().kind(), Kind::Message(_))
        }
        Kind::Message(_) => true,
        _ => false,
    }
}

/// Where compiled rules report what they use and what they do not support.
struct Ctx<'a> {
    field: &'a str,
    out: &'a mut MessageRules,
}

impl Ctx<'_> {
    fn kind(&mut self, kind: &'static str) {
        self.out.kinds.push(kind);
    }

    fn unsupported(&mut self, rule: &str) {
        self.out.unsupported.push(format!("{}: {rule}", self.field));
    }
}

/// `validate.FieldRules` → (`message.required`, `message.skip`, the type rule).
fn field_rules(rules: &DynamicMessage, ctx: &mut Ctx<'_>) -> (bool, bool, Option<Rule>) {
    let mut required = false;
    let mut skip = false;
    if let Some(Value::Message(m)) = get(rules, "message") {
        required = get_bool(&m, "required");
        skip = get_bool(&m, "skip");
        if required {
            ctx.kind("message.required");
        }
        if skip {
            ctx.kind("message.skip");
        }
    }
    let mut rule = None;
    for (field, value) in rules.fields() {
        let Value::Message(r) = value else { continue };
        rule = match field.name() {
            "message" => continue,
            "float" | "double" | "int32" | "int64" | "uint32" | "uint64" | "sint32" | "sint64"
            | "fixed32" | "fixed64" | "sfixed32" | "sfixed64" => {
                ctx.kind(numeric_kind(field.name()));
                Some(Rule::Num {
                    range: range(r, Num::of),
                    ignore_empty: get_bool(r, "ignore_empty"),
                })
            }
            "bool" => {
                ctx.kind("bool.const");
                Some(Rule::Bool(get(r, "const").and_then(|v| v.as_bool())))
            }
            "string" => Some(Rule::Str(Box::new(string_rule(r, ctx)))),
            "bytes" => Some(Rule::Bytes(Box::new(bytes_rule(r, ctx)))),
            "enum" => {
                let defined_only = get_bool(r, "defined_only");
                let range = range(r, Num::of);
                if defined_only {
                    ctx.kind("enum.defined_only");
                }
                if range.konst.is_some() || !range.in_.is_empty() || !range.not_in.is_empty() {
                    ctx.kind("enum.const/in/not_in");
                }
                Some(Rule::Enum {
                    range,
                    defined_only,
                })
            }
            "repeated" => {
                let items = match get(r, "items") {
                    Some(Value::Message(items)) => Some(Box::new(item_rule(&items, ctx))),
                    _ => None,
                };
                let unique = get_bool(r, "unique");
                ctx.kind("repeated");
                if unique {
                    ctx.kind("repeated.unique");
                }
                if items.is_some() {
                    ctx.kind("repeated.items");
                }
                Some(Rule::Repeated {
                    min: get_u64(r, "min_items"),
                    max: get_u64(r, "max_items"),
                    unique,
                    items,
                    ignore_empty: get_bool(r, "ignore_empty"),
                })
            }
            "map" => {
                if get_bool(r, "no_sparse") {
                    ctx.unsupported("map.no_sparse");
                }
                let sub = |name: &str, ctx: &mut Ctx<'_>| match get(r, name) {
                    Some(Value::Message(m)) => Some(Box::new(item_rule(&m, ctx))),
                    _ => None,
                };
                let keys = sub("keys", ctx);
                let values = sub("values", ctx);
                ctx.kind("map");
                Some(Rule::Map {
                    min: get_u64(r, "min_pairs"),
                    max: get_u64(r, "max_pairs"),
                    keys,
                    values,
                    ignore_empty: get_bool(r, "ignore_empty"),
                })
            }
            "any" => {
                ctx.kind("any");
                Some(Rule::Any {
                    required: get_bool(r, "required"),
                    in_: get_strings(r, "in"),
                    not_in: get_strings(r, "not_in"),
                })
            }
            "duration" => {
                ctx.kind("duration");
                Some(Rule::Duration {
                    required: get_bool(r, "required"),
                    range: range(r, duration_nanos),
                })
            }
            "timestamp" => {
                for name in [
                    "const", "lt", "lte", "gt", "gte", "lt_now", "gt_now", "within",
                ] {
                    if r.has_field_by_name(name) {
                        ctx.unsupported(&format!("timestamp.{name}"));
                    }
                }
                ctx.kind("timestamp");
                Some(Rule::Timestamp {
                    required: get_bool(r, "required"),
                })
            }
            other => {
                ctx.unsupported(other);
                None
            }
        };
    }
    (required, skip, rule)
}

fn numeric_kind(name: &str) -> &'static str {
    match name {
        "float" | "double" => "number.float",
        _ => "number.integer",
    }
}

fn item_rule(rules: &DynamicMessage, ctx: &mut Ctx<'_>) -> ItemRule {
    let (required, skip, rule) = field_rules(rules, ctx);
    if required {
        // PGV C++ ignores `required` on list items and map values (always present).
        ctx.kind("items.message.required");
    }
    ItemRule { skip, rule }
}

fn string_rule(r: &DynamicMessage, ctx: &mut Ctx<'_>) -> StringRule {
    let mut s = StringRule {
        konst: get_string(r, "const"),
        len: get_u64(r, "len"),
        min_len: get_u64(r, "min_len"),
        max_len: get_u64(r, "max_len"),
        len_bytes: get_u64(r, "len_bytes"),
        min_bytes: get_u64(r, "min_bytes"),
        max_bytes: get_u64(r, "max_bytes"),
        prefix: get_string(r, "prefix"),
        suffix: get_string(r, "suffix"),
        contains: get_string(r, "contains"),
        not_contains: get_string(r, "not_contains"),
        in_: get_strings(r, "in"),
        not_in: get_strings(r, "not_in"),
        ignore_empty: get_bool(r, "ignore_empty"),
        ..StringRule::default()
    };
    for (name, set) in [
        ("string.const", s.konst.is_some()),
        ("string.len", s.len.is_some()),
        ("string.min_len", s.min_len.is_some()),
        ("string.max_len", s.max_len.is_some()),
        ("string.len_bytes", s.len_bytes.is_some()),
        ("string.min_bytes", s.min_bytes.is_some()),
        ("string.max_bytes", s.max_bytes.is_some()),
        ("string.prefix", s.prefix.is_some()),
        ("string.suffix", s.suffix.is_some()),
        ("string.contains", s.contains.is_some()),
        ("string.not_contains", s.not_contains.is_some()),
        ("string.in", !s.in_.is_empty()),
        ("string.not_in", !s.not_in.is_empty()),
        ("string.ignore_empty", s.ignore_empty),
    ] {
        if set {
            ctx.kind(name);
        }
    }
    let mut pattern = get_string(r, "pattern");
    if pattern.is_some() {
        ctx.kind("string.pattern");
    }
    let strict = get(r, "strict").and_then(|v| v.as_bool()).unwrap_or(true);
    for (name, value) in r.fields() {
        match (name.name(), value) {
            ("well_known_regex", Value::EnumNumber(n)) => {
                // PGV turns these into patterns (module/checker.go).
                pattern = match (*n, strict) {
                    (1 | 2, false) => Some(r"^[^\x00\n\r]*$".to_string()),
                    (1, true) => Some(r"^:?[0-9a-zA-Z!#$%&'*+\-.^_|~`]+$".to_string()),
                    (2, true) => Some(r"^[^\x00-\x08\x0A-\x1F\x7F]*$".to_string()),
                    _ => pattern,
                };
                ctx.kind(match (*n, strict) {
                    (1, true) => "string.well_known_regex.HTTP_HEADER_NAME",
                    (2, true) => "string.well_known_regex.HTTP_HEADER_VALUE",
                    _ => "string.well_known_regex.non_strict",
                });
            }
            ("ip", Value::Bool(true)) => s.well_known = Some(WellKnown::Ip),
            ("ipv4", Value::Bool(true)) => s.well_known = Some(WellKnown::Ipv4),
            ("ipv6", Value::Bool(true)) => s.well_known = Some(WellKnown::Ipv6),
            ("hostname", Value::Bool(true)) => s.well_known = Some(WellKnown::Hostname),
            ("address", Value::Bool(true)) => s.well_known = Some(WellKnown::Address),
            ("uuid", Value::Bool(true)) => s.well_known = Some(WellKnown::Uuid),
            ("email" | "uri" | "uri_ref", Value::Bool(true)) => {
                ctx.unsupported(&format!("string.{}", name.name()));
            }
            _ => {}
        }
    }
    if s.well_known.is_some() {
        ctx.kind("string.well_known");
    }
    if let Some(p) = pattern {
        match regex::Regex::new(&format!("^(?:{p})$")) {
            Ok(re) => s.pattern = Some((p, re)),
            Err(_) => ctx.unsupported(&format!("string.pattern {p:?}")),
        }
    }
    s
}

fn bytes_rule(r: &DynamicMessage, ctx: &mut Ctx<'_>) -> BytesRule {
    let bytes = |name: &str| match get(r, name) {
        Some(Value::Bytes(b)) => Some(b.to_vec()),
        _ => None,
    };
    let list = |name: &str| match get(r, name) {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|v| match v {
                Value::Bytes(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut b = BytesRule {
        konst: bytes("const"),
        len: get_u64(r, "len"),
        min_len: get_u64(r, "min_len"),
        max_len: get_u64(r, "max_len"),
        prefix: bytes("prefix"),
        suffix: bytes("suffix"),
        contains: bytes("contains"),
        in_: list("in"),
        not_in: list("not_in"),
        ignore_empty: get_bool(r, "ignore_empty"),
        ..BytesRule::default()
    };
    ctx.kind("bytes");
    if let Some(p) = get_string(r, "pattern") {
        match regex::bytes::Regex::new(&format!("^(?:{p})$")) {
            Ok(re) => b.pattern = Some((p, re)),
            Err(_) => ctx.unsupported(&format!("bytes.pattern {p:?}")),
        }
    }
    for name in ["ip", "ipv4", "ipv6"] {
        if get_bool(r, name) {
            ctx.unsupported(&format!("bytes.{name}"));
        }
    }
    b
}

fn range(r: &DynamicMessage, num: impl Fn(&Value) -> Option<Num>) -> Range {
    let one = |name: &str| get(r, name).and_then(|v| num(&v));
    let many = |name: &str| match get(r, name) {
        Some(Value::List(items)) => items.iter().filter_map(&num).collect(),
        _ => Vec::new(),
    };
    Range {
        konst: one("const"),
        lt: one("lt"),
        lte: one("lte"),
        gt: one("gt"),
        gte: one("gte"),
        in_: many("in"),
        not_in: many("not_in"),
    }
}

/// A `Duration` message value as nanoseconds.
fn duration_nanos(value: &Value) -> Option<Num> {
    let Value::Message(m) = value else {
        return None;
    };
    let seconds = get(m, "seconds").and_then(|v| v.as_i64()).unwrap_or(0);
    let nanos = get(m, "nanos").and_then(|v| v.as_i32()).unwrap_or(0);
    Some(Num::Int(
        i128::from(seconds) * 1_000_000_000 + i128::from(nanos),
    ))
}

/// A field's value when set (`None` when unset, also for fields without presence).
fn get(m: &DynamicMessage, name: &str) -> Option<Value> {
    let field = m.descriptor().get_field_by_name(name)?;
    m.has_field(&field)
        .then(|| m.get_field(&field).into_owned())
}

fn get_bool(m: &DynamicMessage, name: &str) -> bool {
    get(m, name).and_then(|v| v.as_bool()).unwrap_or(false)
}

fn get_u64(m: &DynamicMessage, name: &str) -> Option<u64> {
    get(m, name).and_then(|v| v.as_u64())
}

fn get_string(m: &DynamicMessage, name: &str) -> Option<String> {
    get(m, name).and_then(|v| v.as_str().map(str::to_string))
}

fn get_strings(m: &DynamicMessage, name: &str) -> Vec<String> {
    match get(m, name) {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

// --- checking ---------------------------------------------------------------------------

fn violation(path: &str, message: impl Into<String>) -> DecodeError {
    DecodeError::Invalid {
        at: Location::new("", path),
        message: message.into(),
    }
}

fn check_message(message: &DynamicMessage, path: &str, depth: u32) -> Result<(), DecodeError> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let desc = message.descriptor();
    if desc.full_name() == "google.protobuf.Any" {
        return check_any_payload(message, path, depth);
    }
    let rules = rules_for(&desc);
    for oneof in &rules.required_oneofs {
        if !oneof.fields().any(|f| message.has_field(&f)) {
            return Err(violation(
                path,
                format!(
                    "one of the fields {} is required (oneof {})",
                    oneof_names(oneof),
                    oneof.name()
                ),
            ));
        }
    }
    if let Some(oneof) = &rules.extension
        && !oneof.fields().any(|f| message.has_field(&f))
        && !optional_http_filter(message)
    {
        let others: Vec<String> = oneof
            .fields()
            .filter(|f| f.name() != "typed_config")
            .map(|f| format!(" (or {})", f.name()))
            .collect();
        return Err(violation(
            path,
            format!(
                "typed_config is required{}: Envoy finds the extension {} by the type URL \
                 of its typed_config",
                others.concat(),
                extension_name(message)
            ),
        ));
    }
    for check in &rules.fields {
        let field = &check.field;
        let set = message.has_field(field);
        if check.only_if_set && !set {
            continue;
        }
        let at = join_path(path, field.name());
        if check.required && !set {
            return Err(violation(&at, "value is required"));
        }
        if field.is_list() || field.is_map() || !matches!(field.kind(), Kind::Message(_)) {
            let value = message.get_field(field);
            if let Some(rule) = &check.rule {
                apply(rule, &value, &field.kind(), &at)?;
            }
            if check.holds_messages && !check.skip {
                recurse(&value, &at, depth, check)?;
            }
            continue;
        }
        // A singular message field.
        if !set {
            if let Some(rule) = &check.rule
                && rule_requires(rule)
            {
                return Err(violation(&at, "value is required"));
            }
            continue;
        }
        let value = message.get_field(field);
        if let Some(rule) = &check.rule {
            apply(rule, &value, &field.kind(), &at)?;
        }
        if check.names_extension
            && let Value::Message(any) = &*value
            && is_empty_any(any)
            && !optional_http_filter(message)
        {
            return Err(empty_any(&extension_name(message), &at));
        }
        if !check.skip {
            recurse(&value, &at, depth, check)?;
        }
    }
    // What Envoy's TLS context loader refuses once the proto constraints pass.
    crate::tls::check(message, path)
}

fn oneof_names(oneof: &OneofDescriptor) -> String {
    let names: Vec<String> = oneof.fields().map(|f| f.name().to_string()).collect();
    names.join(", ")
}

/// `"envoy.filters.http.router"`, from the message's `name` field.
fn extension_name(message: &DynamicMessage) -> String {
    match message
        .get_field_by_name("name")
        .as_deref()
        .and_then(Value::as_str)
    {
        Some(name) => format!("{name:?}"),
        None => "(unnamed)".to_string(),
    }
}

fn optional_http_filter(message: &DynamicMessage) -> bool {
    message
        .get_field_by_name("is_optional")
        .is_some_and(|v| v.as_bool() == Some(true))
}

fn empty_any(name: &str, at: &str) -> DecodeError {
    violation(
        at,
        format!(
            "an empty Any names no extension: Envoy finds no implementation of {name} \
             for type URL ''"
        ),
    )
}

fn is_empty_any(any: &DynamicMessage) -> bool {
    let url = any.get_field_by_name("type_url");
    let url = url.as_deref().and_then(Value::as_str).unwrap_or_default();
    url.is_empty() || url == EMPTY_ANY_URL
}

/// Whether a rule on a singular message field requires it to be set.
fn rule_requires(rule: &Rule) -> bool {
    matches!(
        rule,
        Rule::Any { required: true, .. }
            | Rule::Duration { required: true, .. }
            | Rule::Timestamp { required: true }
    )
}

/// Recurses into the messages of a field's value (singular, list items, map values).
fn recurse(value: &Value, at: &str, depth: u32, check: &FieldCheck) -> Result<(), DecodeError> {
    match value {
        Value::Message(m) => {
            if check.opaque {
                return Ok(());
            }
            check_message(m, at, depth + 1)
        }
        Value::List(items) => {
            if matches!(&check.rule, Some(Rule::Repeated { items: Some(item), .. }) if item.skip) {
                return Ok(());
            }
            for (i, item) in items.iter().enumerate() {
                if let Value::Message(m) = item {
                    check_message(m, &format!("{at}[{i}]"), depth + 1)?;
                }
            }
            Ok(())
        }
        Value::Map(entries) => {
            if check.opaque {
                return Ok(());
            }
            for (key, v) in sorted(entries) {
                let Value::Message(m) = v else { continue };
                let item_at = join_path(at, &key_text(key));
                if check.names_extension && is_empty_any(m) {
                    let name = match key {
                        MapKey::String(k) => format!("{k:?}"),
                        other => format!("{other:?}"),
                    };
                    return Err(empty_any(&name, &item_at));
                }
                check_message(m, &item_at, depth + 1)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Map entries in key order, so the first violation reported is deterministic.
fn sorted(entries: &HashMap<MapKey, Value>) -> Vec<(&MapKey, &Value)> {
    let mut out: Vec<(&MapKey, &Value)> = entries.iter().collect();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

fn key_text(key: &MapKey) -> String {
    match key {
        MapKey::String(s) => key_segment(s),
        MapKey::Bool(b) => format!("[{b}]"),
        MapKey::I32(v) => format!("[{v}]"),
        MapKey::I64(v) => format!("[{v}]"),
        MapKey::U32(v) => format!("[{v}]"),
        MapKey::U64(v) => format!("[{v}]"),
    }
}

/// An `Any`'s payload, checked with the rules of the type it names.
fn check_any_payload(any: &DynamicMessage, path: &str, depth: u32) -> Result<(), DecodeError> {
    let url = any.get_field_by_name("type_url");
    let Some(url) = url.as_deref().and_then(Value::as_str) else {
        return Ok(());
    };
    if url.is_empty() || url == EMPTY_ANY_URL {
        return Ok(());
    }
    let Some(desc) = registry::resolve_type_url(url) else {
        return Ok(());
    };
    let payload = any.get_field_by_name("value");
    let bytes = payload
        .as_deref()
        .and_then(Value::as_bytes)
        .cloned()
        .unwrap_or_default();
    match DynamicMessage::decode(desc, bytes) {
        Ok(inner) => check_message(&inner, path, depth + 1),
        // The decoder wrote these bytes; they always decode.
        Err(_) => Ok(()),
    }
}

/// Applies a type rule to a field's value (or a list item / map key / map value).
fn apply(rule: &Rule, value: &Value, kind: &Kind, at: &str) -> Result<(), DecodeError> {
    match rule {
        Rule::Num {
            range,
            ignore_empty,
        } => {
            let Some(v) = scalar(value).and_then(|v| Num::of(&v)) else {
                return Ok(());
            };
            if *ignore_empty && v.is_zero() {
                return Ok(());
            }
            check_range(range, v, at, &|n| n.to_string())
        }
        Rule::Bool(konst) => match (konst, scalar(value).and_then(|v| v.as_bool())) {
            (Some(k), Some(v)) if *k != v => Err(violation(at, format!("value must equal {k}"))),
            _ => Ok(()),
        },
        Rule::Str(s) => match scalar(value).as_deref() {
            Some(Value::String(v)) => check_string(s, v, at),
            _ => Ok(()),
        },
        Rule::Bytes(b) => match scalar(value).as_deref() {
            Some(Value::Bytes(v)) => check_bytes(b, v, at),
            _ => Ok(()),
        },
        Rule::Enum {
            range,
            defined_only,
        } => {
            let Value::EnumNumber(n) = value else {
                return Ok(());
            };
            let enum_desc = match kind {
                Kind::Enum(e) => Some(e.clone()),
                _ => None,
            };
            let name = |v: Num| match (&enum_desc, v) {
                (Some(e), Num::Int(n)) => i32::try_from(n)
                    .ok()
                    .and_then(|n| e.get_value(n))
                    .map_or_else(|| n.to_string(), |v| v.name().to_string()),
                _ => v.to_string(),
            };
            check_range(range, Num::Int(i128::from(*n)), at, &name)?;
            if *defined_only
                && enum_desc
                    .as_ref()
                    .is_some_and(|e| e.get_value(*n).is_none())
            {
                return Err(violation(
                    at,
                    "value must be one of the defined enum values",
                ));
            }
            Ok(())
        }
        Rule::Repeated {
            min,
            max,
            unique,
            items,
            ignore_empty,
        } => {
            let Value::List(list) = value else {
                return Ok(());
            };
            if *ignore_empty && list.is_empty() {
                return Ok(());
            }
            check_count(list.len(), *min, *max, at, "item(s)")?;
            if *unique {
                check_unique(list, at)?;
            }
            if let Some(item) = items {
                for (i, v) in list.iter().enumerate() {
                    apply_item(item, v, kind, &format!("{at}[{i}]"))?;
                }
            }
            Ok(())
        }
        Rule::Map {
            min,
            max,
            keys,
            values,
            ignore_empty,
        } => {
            let Value::Map(map) = value else {
                return Ok(());
            };
            if *ignore_empty && map.is_empty() {
                return Ok(());
            }
            check_count(map.len(), *min, *max, at, "pair(s)")?;
            let Kind::Message(entry) = kind else {
                return Ok(());
            };
            let key_kind = entry.map_entry_key_field().kind();
            let value_kind = entry.map_entry_value_field().kind();
            for (key, v) in sorted(map) {
                let item_at = join_path(at, &key_text(key));
                if let Some(k) = keys {
                    let key_value = match key {
                        MapKey::String(s) => Value::String(s.clone()),
                        MapKey::Bool(b) => Value::Bool(*b),
                        MapKey::I32(n) => Value::I32(*n),
                        MapKey::I64(n) => Value::I64(*n),
                        MapKey::U32(n) => Value::U32(*n),
                        MapKey::U64(n) => Value::U64(*n),
                    };
                    apply_item(k, &key_value, &key_kind, &format!("{item_at} (key)"))?;
                }
                if let Some(values) = values {
                    apply_item(values, v, &value_kind, &item_at)?;
                }
            }
            Ok(())
        }
        Rule::Any { in_, not_in, .. } => {
            let Value::Message(any) = value else {
                return Ok(());
            };
            let url = any.get_field_by_name("type_url");
            let url = url.as_deref().and_then(Value::as_str).unwrap_or_default();
            if !in_.is_empty() && !in_.iter().any(|u| u == url) {
                return Err(violation(at, format!("type URL must be in list {in_:?}")));
            }
            if not_in.iter().any(|u| u == url) {
                return Err(violation(
                    at,
                    format!("type URL must not be in list {not_in:?}"),
                ));
            }
            Ok(())
        }
        Rule::Duration { range, .. } => match duration_nanos(value) {
            Some(v) => check_range(range, v, at, &duration_text),
            None => Ok(()),
        },
        Rule::Timestamp { .. } => Ok(()),
    }
}

/// A list item or map key/value rule; message items are recursed into by the walk.
fn apply_item(item: &ItemRule, value: &Value, kind: &Kind, at: &str) -> Result<(), DecodeError> {
    let Some(rule) = &item.rule else {
        return Ok(());
    };
    // A list's kind is its item kind already; a wrapper item is checked by its value.
    apply(rule, value, kind, at)
}

/// The scalar inside a value: the value itself, or a wrapper's (`UInt32Value`, …)
/// `value` field, which PGV checks with the rules of the wrapped type.
fn scalar(value: &Value) -> Option<Cow<'_, Value>> {
    match value {
        Value::Message(m) if crate::lenient::is_wrapper(m.descriptor().full_name()) => {
            m.get_field_by_number(1)
        }
        Value::Message(_) => None,
        other => Some(Cow::Borrowed(other)),
    }
}

fn check_count(
    n: usize,
    min: Option<u64>,
    max: Option<u64>,
    at: &str,
    unit: &str,
) -> Result<(), DecodeError> {
    let n = n as u64;
    if let Some(min) = min
        && n < min
    {
        return Err(violation(
            at,
            format!("value must contain at least {min} {unit}"),
        ));
    }
    if let Some(max) = max
        && n > max
    {
        return Err(violation(
            at,
            format!("value must contain no more than {max} {unit}"),
        ));
    }
    Ok(())
}

fn check_unique(list: &[Value], at: &str) -> Result<(), DecodeError> {
    let mut seen_strings = HashSet::new();
    for (i, v) in list.iter().enumerate() {
        let duplicate = match v {
            Value::String(s) => !seen_strings.insert(s.as_str()),
            other => list[..i].contains(other),
        };
        if duplicate {
            return Err(violation(
                &format!("{at}[{i}]"),
                "repeated value must contain unique items",
            ));
        }
    }
    Ok(())
}

fn check_range(
    r: &Range,
    v: Num,
    at: &str,
    show: &dyn Fn(Num) -> String,
) -> Result<(), DecodeError> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let is = |bound: Option<Num>, ok: &[std::cmp::Ordering]| {
        bound.is_none_or(|b| v.cmp(b).is_some_and(|o| ok.contains(&o)))
    };
    if let Some(k) = r.konst
        && v.cmp(k) != Some(Equal)
    {
        return Err(violation(at, format!("value must equal {}", show(k))));
    }
    let lower = (r.gt, r.gte);
    let upper = (r.lt, r.lte);
    let above = is(lower.0, &[Greater]) && is(lower.1, &[Greater, Equal]);
    let below = is(upper.0, &[Less]) && is(upper.1, &[Less, Equal]);
    // PGV: with both bounds and upper < lower, the value must lie outside the range.
    let lo = lower.0.or(lower.1);
    let hi = upper.0.or(upper.1);
    let exclusive = matches!((lo, hi), (Some(l), Some(h)) if h.cmp(l) != Some(Greater));
    let ok = if exclusive {
        above || below
    } else {
        above && below
    };
    if !ok {
        let describe = |b: Option<Num>, word: &str| b.map(|b| format!("{word} {}", show(b)));
        let parts: Vec<String> = [
            describe(r.gt, "greater than"),
            describe(r.gte, "greater than or equal to"),
            describe(r.lt, "less than"),
            describe(r.lte, "less than or equal to"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let joiner = if exclusive { " or " } else { " and " };
        return Err(violation(
            at,
            format!("value must be {}", parts.join(joiner)),
        ));
    }
    if !r.in_.is_empty() && !r.in_.iter().any(|k| v.cmp(*k) == Some(Equal)) {
        let list: Vec<String> = r.in_.iter().map(|k| show(*k)).collect();
        return Err(violation(
            at,
            format!("value must be in list [{}]", list.join(", ")),
        ));
    }
    if r.not_in.iter().any(|k| v.cmp(*k) == Some(Equal)) {
        let list: Vec<String> = r.not_in.iter().map(|k| show(*k)).collect();
        return Err(violation(
            at,
            format!("value must not be in list [{}]", list.join(", ")),
        ));
    }
    Ok(())
}

fn duration_text(n: Num) -> String {
    let Num::Int(nanos) = n else {
        return n.to_string();
    };
    let (seconds, rest) = (nanos / 1_000_000_000, (nanos % 1_000_000_000).abs());
    if rest == 0 {
        format!("{seconds}s")
    } else {
        let sign = if nanos < 0 && seconds == 0 { "-" } else { "" };
        let frac = format!("{rest:09}");
        format!("{sign}{seconds}.{}s", frac.trim_end_matches('0'))
    }
}

fn check_string(s: &StringRule, v: &str, at: &str) -> Result<(), DecodeError> {
    if s.ignore_empty && v.is_empty() {
        return Ok(());
    }
    let err = |m: String| Err(violation(at, m));
    if let Some(k) = &s.konst
        && v != k
    {
        return err(format!("value must equal {k:?}"));
    }
    if !s.in_.is_empty() && !s.in_.iter().any(|k| k == v) {
        return err(format!("value must be in list {:?}", s.in_));
    }
    if s.not_in.iter().any(|k| k == v) {
        return err(format!("value must not be in list {:?}", s.not_in));
    }
    let chars = v.chars().count() as u64;
    if let Some(len) = s.len
        && chars != len
    {
        return err(format!("value must be {len} characters"));
    }
    if let Some(min) = s.min_len
        && chars < min
    {
        return err(format!("value length must be at least {min} characters"));
    }
    if let Some(max) = s.max_len
        && chars > max
    {
        return err(format!("value length must be at most {max} characters"));
    }
    let bytes = v.len() as u64;
    if let Some(len) = s.len_bytes
        && bytes != len
    {
        return err(format!("value length must be {len} bytes"));
    }
    if let Some(min) = s.min_bytes
        && bytes < min
    {
        return err(format!("value length must be at least {min} bytes"));
    }
    if let Some(max) = s.max_bytes
        && bytes > max
    {
        return err(format!("value length must be at most {max} bytes"));
    }
    if let Some(p) = &s.prefix
        && !v.starts_with(p.as_str())
    {
        return err(format!("value does not have prefix {p:?}"));
    }
    if let Some(p) = &s.suffix
        && !v.ends_with(p.as_str())
    {
        return err(format!("value does not have suffix {p:?}"));
    }
    if let Some(p) = &s.contains
        && !v.contains(p.as_str())
    {
        return err(format!("value does not contain substring {p:?}"));
    }
    if let Some(p) = &s.not_contains
        && v.contains(p.as_str())
    {
        return err(format!("value contains substring {p:?}"));
    }
    if let Some((p, re)) = &s.pattern
        && !re.is_match(v)
    {
        return err(format!("value does not match regex pattern {p:?}"));
    }
    if let Some(wk) = s.well_known {
        let ok = match wk {
            WellKnown::Ip => v.parse::<std::net::IpAddr>().is_ok(),
            WellKnown::Ipv4 => v.parse::<std::net::Ipv4Addr>().is_ok(),
            WellKnown::Ipv6 => v.parse::<std::net::Ipv6Addr>().is_ok(),
            WellKnown::Hostname => is_hostname(v),
            WellKnown::Address => is_hostname(v) || v.parse::<std::net::IpAddr>().is_ok(),
            WellKnown::Uuid => is_uuid(v),
        };
        if !ok {
            return err(match wk {
                WellKnown::Ip => "value must be a valid IP Address",
                WellKnown::Ipv4 => "value must be a valid IPv4 Address",
                WellKnown::Ipv6 => "value must be a valid IPv6 Address",
                WellKnown::Hostname => "value must be a valid hostname",
                WellKnown::Address => "value must be an ip address, or a hostname.",
                WellKnown::Uuid => "value must be a valid UUID",
            }
            .to_string());
        }
    }
    Ok(())
}

/// PGV's `IsHostname`: at most 253 bytes, dot-separated labels of 1-63 letters, digits
/// or hyphens, not starting or ending with a hyphen.
fn is_hostname(v: &str) -> bool {
    v.len() <= 253
        && v.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-')
        })
}

fn is_uuid(v: &str) -> bool {
    v.len() == 36
        && v.bytes().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn check_bytes(b: &BytesRule, v: &[u8], at: &str) -> Result<(), DecodeError> {
    if b.ignore_empty && v.is_empty() {
        return Ok(());
    }
    let err = |m: String| Err(violation(at, m));
    if let Some(k) = &b.konst
        && v != k.as_slice()
    {
        return err("value must equal the constant bytes".to_string());
    }
    if !b.in_.is_empty() && !b.in_.iter().any(|k| k.as_slice() == v) {
        return err("value must be in the list of allowed bytes".to_string());
    }
    if b.not_in.iter().any(|k| k.as_slice() == v) {
        return err("value must not be in the list of refused bytes".to_string());
    }
    let n = v.len() as u64;
    if let Some(len) = b.len
        && n != len
    {
        return err(format!("value length must be {len} bytes"));
    }
    if let Some(min) = b.min_len
        && n < min
    {
        return err(format!("value length must be at least {min} bytes"));
    }
    if let Some(max) = b.max_len
        && n > max
    {
        return err(format!("value length must be at most {max} bytes"));
    }
    if let Some(p) = &b.prefix
        && !v.starts_with(p)
    {
        return err("value does not have the required prefix".to_string());
    }
    if let Some(p) = &b.suffix
        && !v.ends_with(p)
    {
        return err("value does not have the required suffix".to_string());
    }
    if let Some(p) = &b.contains
        && !v.windows(p.len().max(1)).any(|w| w == p.as_slice())
    {
        return err("value does not contain the required bytes".to_string());
    }
    if let Some((p, re)) = &b.pattern
        && !re.is_match(v)
    {
        return err(format!("value does not match regex pattern {p:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let r = Range {
            gt: Some(Num::Int(0)),
            lte: Some(Num::Int(100)),
            ..Range::default()
        };
        let show = |n: Num| n.to_string();
        assert!(check_range(&r, Num::Int(1), "x", &show).is_ok());
        assert!(check_range(&r, Num::Int(100), "x", &show).is_ok());
        let e = check_range(&r, Num::Int(0), "x", &show).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x: value must be greater than 0 and less than or equal to 100"
        );
        assert!(check_range(&r, Num::Int(101), "x", &show).is_err());
        // Upper below lower: outside the range.
        let outside = Range {
            lt: Some(Num::Int(0)),
            gt: Some(Num::Int(10)),
            ..Range::default()
        };
        assert!(check_range(&outside, Num::Int(-1), "x", &show).is_ok());
        assert!(check_range(&outside, Num::Int(11), "x", &show).is_ok());
        assert!(check_range(&outside, Num::Int(5), "x", &show).is_err());
        let float = Range {
            gte: Some(Num::Float(0.0)),
            lte: Some(Num::Float(1.0)),
            ..Range::default()
        };
        assert!(check_range(&float, Num::Float(0.5), "x", &show).is_ok());
        assert!(check_range(&float, Num::Float(1.5), "x", &show).is_err());
        let set = Range {
            in_: vec![Num::Int(1), Num::Int(2)],
            not_in: vec![Num::Int(2)],
            ..Range::default()
        };
        assert!(check_range(&set, Num::Int(1), "x", &show).is_ok());
        assert!(check_range(&set, Num::Int(2), "x", &show).is_err());
        assert!(check_range(&set, Num::Int(3), "x", &show).is_err());
    }

    #[test]
    fn durations_print_like_envoy_writes_them() {
        assert_eq!(duration_text(Num::Int(0)), "0s");
        assert_eq!(duration_text(Num::Int(1_500_000_000)), "1.5s");
        assert_eq!(duration_text(Num::Int(1_000_000)), "0.001s");
        assert_eq!(duration_text(Num::Int(-1_000_000)), "-0.001s");
    }

    #[test]
    fn well_known_strings() {
        assert!(is_hostname("example.com"));
        assert!(!is_hostname("-a.com"));
        assert!(!is_hostname("a..com"));
        assert!(is_uuid("123e4567-e89b-12d3-a456-426614174000"));
        assert!(!is_uuid("123e4567e89b12d3a456426614174000"));
    }

    /// Every rule of every message in the registry is one this checker implements, and
    /// every rule kind Envoy's API uses is seen (the survey the module doc relies on).
    #[test]
    fn every_rule_in_the_registry_is_supported() {
        let pool = registry::pool().unwrap();
        let mut unsupported = Vec::new();
        let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
        let mut messages = 0;
        for desc in pool.all_messages() {
            let rules = compile(&desc);
            messages += 1;
            for u in &rules.unsupported {
                unsupported.push(format!("{}.{u}", desc.full_name()));
            }
            for k in &rules.kinds {
                *kinds.entry(k).or_default() += 1;
            }
        }
        eprintln!("{messages} messages; rule kinds in use: {kinds:#?}");
        assert!(
            unsupported.is_empty(),
            "unsupported rules: {unsupported:#?}"
        );
        for kind in [
            "message.required",
            "oneof.required",
            "string.min_len",
            "string.well_known_regex.HTTP_HEADER_NAME",
            "string.well_known_regex.non_strict",
            "string.pattern",
            "enum.defined_only",
            "number.integer",
            "number.float",
            "repeated",
            "repeated.items",
            "map",
            "duration",
            "any",
            "bool.const",
        ] {
            assert!(kinds.contains_key(kind), "{kind} not seen");
        }
    }
}
