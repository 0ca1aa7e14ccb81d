//! PGV options → compiled rules: the `(validate.rules)`, `(validate.required)`,
//! `(validate.disabled)` and `(validate.ignored)` options that protoc keeps in the
//! registry's descriptors, read once per message type and cached; rules this checker
//! does not implement are recorded (a test surveys the whole registry).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use prost_reflect::{
    DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor, Value,
};

use super::rules::{
    BytesRule, FieldCheck, ItemRule, MessageRules, Range, Rule, StringRule, WellKnown,
};
use super::value::{Num, duration_nanos, get};

static CACHE: LazyLock<RwLock<HashMap<String, Arc<MessageRules>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The compiled rules of `desc`, from the cache.
pub(super) fn rules_for(desc: &MessageDescriptor) -> Arc<MessageRules> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry;

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
