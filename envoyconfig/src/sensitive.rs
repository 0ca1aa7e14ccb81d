//! Values Envoy marks sensitive never appear in an error text.
//!
//! Envoy's protos mark the fields that hold key material, passwords and tokens with the
//! field option `(udpa.annotations.sensitive) = true` (`TlsCertificate.private_key`,
//! `password`, `GenericSecret.secret`, `TlsSessionTicketKeys.keys`, `BasicAuth.users`,
//! …). The registry keeps field options (protoc writes them into the descriptor set and
//! `udpa/annotations/sensitive.proto` is in the pool), so the set of sensitive fields is
//! read from it ([`sensitive_fields`]): one source of truth, updated with the registry.
//!
//! The rule, in one place ([`redact`], applied by `decode` to every error of a
//! resource): an error at or under a sensitive field is rewritten to name the field path
//! (cut at the last segment that is a field of the schema, never a map key or an unknown
//! name written by the user) and the rule, and never the value, whatever its spelling (a
//! plain string where a `DataSource` object is expected, `inline_string` or
//! `inlineString`, `inline_bytes`, camelCase field names, JSON or YAML, a number, list or
//! map, unknown nested fields, inside a `typed_config` `Any` or a `TypedStruct`):
//! `private_key: expected a DataSource object, found a string (value not shown:
//! sensitive)`. Every other error is searched for the text of every sensitive value of
//! the input, which is replaced where it occurs.
//!
//! Defence in depth for text from anywhere is [`crate::pem::redact_pem`].

use std::collections::HashSet;
use std::sync::LazyLock;

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::Value;

use crate::error::{DecodeError, Location, join_path, key_segment};
use crate::registry;
use crate::wellknown::is_well_known;

/// The field option Envoy marks sensitive fields with.
const SENSITIVE_OPTION: &str = "udpa.annotations.sensitive";

/// What a sensitive value is replaced with in a text.
pub const NOT_SHOWN: &str = "(value not shown: sensitive)";

/// Every field of the registry marked sensitive, sorted by full name.
static SENSITIVE: LazyLock<Vec<FieldDescriptor>> = LazyLock::new(|| {
    let Ok(pool) = registry::pool() else {
        return Vec::new();
    };
    let Some(option) = pool.get_extension_by_name(SENSITIVE_OPTION) else {
        return Vec::new();
    };
    let mut fields: Vec<FieldDescriptor> = pool
        .all_messages()
        .flat_map(|m| m.fields().collect::<Vec<_>>())
        .filter(|f| {
            let options = f.options();
            options.has_extension(&option) && options.get_extension(&option).as_bool() == Some(true)
        })
        .collect();
    fields.sort_by(|a, b| a.full_name().cmp(b.full_name()));
    fields
});

static SENSITIVE_NAMES: LazyLock<HashSet<String>> = LazyLock::new(|| {
    SENSITIVE
        .iter()
        .map(|f| f.full_name().to_string())
        .collect()
});

/// Every field of the registry marked `(udpa.annotations.sensitive) = true`, by full
/// name. Empty only if the registry is unusable (a broken build).
pub fn sensitive_fields() -> &'static [FieldDescriptor] {
    &SENSITIVE
}

/// Whether Envoy marks `field` sensitive.
pub fn is_sensitive(field: &FieldDescriptor) -> bool {
    SENSITIVE_NAMES.contains(field.full_name())
}

/// A sensitive field as written in one input: where (as written, e.g.
/// `tlsCertificate.privateKey`), its descriptor, and the value written there.
struct Span<'a> {
    path: String,
    field: FieldDescriptor,
    value: &'a Value,
}

/// Nesting bound of the walk (protobuf's own recursion limit is 100).
const MAX_DEPTH: u32 = 128;

/// The sensitive fields set in `value` (a message of type `desc`, as written: either
/// spelling of field names, `Any` by `@type`, `TypedStruct` by its `type_url`).
fn spans<'a>(desc: &MessageDescriptor, value: &'a Value) -> Vec<Span<'a>> {
    let mut out = Vec::new();
    walk(desc, value, "", 0, &mut out);
    out
}

fn walk<'a>(
    desc: &MessageDescriptor,
    value: &'a Value,
    path: &str,
    depth: u32,
    out: &mut Vec<Span<'a>>,
) {
    let Value::Object(map) = value else {
        return;
    };
    if depth > MAX_DEPTH {
        return;
    }
    if is_any(desc) {
        let inner = map
            .get("@type")
            .and_then(Value::as_str)
            .and_then(registry::resolve_type_url);
        match inner {
            // An `Any` in an `Any`: the payload is under "value".
            Some(inner) if is_any(&inner) => {
                if let Some(v) = map.get("value") {
                    walk(&inner, v, &join_path(path, "value"), depth + 1, out);
                }
            }
            Some(inner) if !is_well_known(inner.full_name()) => {
                walk(&inner, value, path, depth + 1, out);
            }
            _ => {}
        }
        return;
    }
    if is_well_known(desc.full_name()) {
        return;
    }
    if matches!(
        desc.full_name(),
        "xds.type.v3.TypedStruct" | "udpa.type.v1.TypedStruct"
    ) {
        let inner = map
            .get("type_url")
            .or_else(|| map.get("typeUrl"))
            .and_then(Value::as_str)
            .and_then(registry::resolve_type_url);
        if let (Some(inner), Some(v)) = (inner, map.get("value")) {
            walk(&inner, v, &join_path(path, "value"), depth + 1, out);
        }
        return;
    }
    for (key, v) in map {
        let Some(field) = field_named(desc, key) else {
            continue;
        };
        let at = join_path(path, &key_segment(key));
        if is_sensitive(&field) {
            out.push(Span {
                path: at,
                field,
                value: v,
            });
            continue;
        }
        let Kind::Message(sub) = field.kind() else {
            continue;
        };
        if field.is_map() {
            let value_kind = sub.map_entry_value_field().kind();
            if let (Value::Object(entries), Kind::Message(entry)) = (v, value_kind) {
                for (k, entry_value) in entries {
                    let entry_at = join_path(&at, &key_segment(k));
                    walk(&entry, entry_value, &entry_at, depth + 1, out);
                }
            }
        } else if field.is_list() {
            match v {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(&sub, item, &format!("{at}[{i}]"), depth + 1, out);
                    }
                }
                single => walk(&sub, single, &format!("{at}[0]"), depth + 1, out),
            }
        } else {
            walk(&sub, v, &at, depth + 1, out);
        }
    }
}

fn is_any(desc: &MessageDescriptor) -> bool {
    desc.full_name() == "google.protobuf.Any"
}

/// A field by its JSON (lowerCamelCase) or proto name.
fn field_named(desc: &MessageDescriptor, key: &str) -> Option<FieldDescriptor> {
    desc.get_field_by_json_name(key)
        .or_else(|| desc.get_field_by_name(key))
}

/// One segment of a field path: a name (`private_key`) or a bracketed part (`[0]`,
/// `["envoy.filters.http.cors"]`), as written.
fn segments(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = path.as_bytes();
    let (mut i, mut start) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'.' => {
                if i > start {
                    out.push(&path[start..i]);
                }
                i += 1;
                start = i;
            }
            b'[' => {
                if i > start {
                    out.push(&path[start..i]);
                }
                let open = i;
                i += 1;
                let mut quoted = false;
                while i < bytes.len() {
                    match bytes[i] {
                        b'\\' if quoted => i += 1,
                        b'"' => quoted = !quoted,
                        b']' if !quoted => break,
                        _ => {}
                    }
                    i += 1;
                }
                i = (i + 1).min(bytes.len());
                out.push(&path[open..i]);
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < bytes.len() {
        out.push(&path[start..]);
    }
    out
}

/// A segment in a form shared by both spellings: names in snake_case (the proto name of
/// an Envoy field), list indices as `[]` (the loader flattens and wraps lists, so an
/// index may shift; a match on any index only hides more).
fn canonical(segment: &str) -> String {
    if segment.starts_with('[') {
        let inner = &segment[1..segment.len().saturating_sub(1)];
        return if inner.bytes().all(|b| b.is_ascii_digit()) {
            "[]".to_string()
        } else {
            segment.to_string()
        };
    }
    let mut out = String::with_capacity(segment.len() + 4);
    for c in segment.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The segments of `path` after `span`'s, when `path` is at or under it.
fn under<'p>(path: &'p str, span: &str) -> Option<Vec<&'p str>> {
    let path_segments = segments(path);
    let span_segments = segments(span);
    if path_segments.len() < span_segments.len() {
        return None;
    }
    let same = path_segments
        .iter()
        .zip(&span_segments)
        .all(|(a, b)| canonical(a) == canonical(b));
    same.then(|| path_segments[span_segments.len()..].to_vec())
}

/// Rewrites `error` (of decoding `input`, a message of type `desc`) so that it shows no
/// sensitive value of `input` (see the module documentation).
pub(crate) fn redact(error: DecodeError, desc: &MessageDescriptor, input: &Value) -> DecodeError {
    let spans = spans(desc, input);
    if spans.is_empty() {
        return error;
    }
    let hit = error.location().and_then(|at| {
        spans
            .iter()
            .find_map(|span| under(&at.path, &span.path).map(|rest| (at.clone(), span, rest)))
    });
    let error = match hit {
        Some((at, span, rest)) if !matches!(error, DecodeError::TlsMaterial { .. }) => {
            let (path, rule) = rule_under(&error, span, &rest);
            DecodeError::Invalid {
                at: Location {
                    resource: at.resource,
                    path,
                },
                message: if rule.contains("not shown") {
                    rule
                } else {
                    format!("{rule} {NOT_SHOWN}")
                },
            }
        }
        _ => error,
    };
    let needles = needles(&spans);
    error.map_texts(|text| scrub(text, &needles))
}

/// The path to show (the span's, then the schema fields below it that the error path
/// goes through) and the rule that was broken, described without the value.
fn rule_under(error: &DecodeError, span: &Span<'_>, rest: &[&str]) -> (String, String) {
    let mut path = span.path.clone();
    // The value the error is about, and the field (or list item) it was written to.
    let mut field = span.field.clone();
    let mut value = Some(span.value);
    let mut item = false;
    for segment in rest {
        if segment.starts_with('[') && segment[1..].starts_with(|c: char| c.is_ascii_digit()) {
            if !field.is_list() || item {
                break;
            }
            item = true;
            value = match value {
                Some(Value::Array(items)) => segment[1..segment.len() - 1]
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i)),
                other => other,
            };
            path.push_str(segment);
            continue;
        }
        let Kind::Message(desc) = field.kind() else {
            break;
        };
        if field.is_map() || (field.is_list() && !item) {
            break;
        }
        let target = if is_any(&desc) {
            value
                .and_then(|v| v.get("@type"))
                .and_then(Value::as_str)
                .and_then(registry::resolve_type_url)
        } else {
            Some(desc)
        };
        let Some(next) = target.and_then(|d| field_named(&d, segment)) else {
            break;
        };
        path = join_path(&path, segment);
        value = value.and_then(|v| v.get(*segment));
        field = next;
        item = false;
    }
    let expected = expected_shape(&field, item);
    let found = value.map(shape);
    if let (Some(expected), Some(found)) = (expected, found)
        && !fits(&field, item, value)
    {
        return (path, format!("expected {expected}, found {found}"));
    }
    let rule = match error {
        DecodeError::UnknownField { .. } => {
            "unknown field (its name and value not shown: sensitive)".to_string()
        }
        DecodeError::UnknownType { .. } => "unknown type URL".to_string(),
        DecodeError::Invalid { message, .. } => rule_of(message),
        DecodeError::Syntax { .. } => "invalid syntax".to_string(),
        _ => "invalid value".to_string(),
    };
    (path, rule)
}

/// The rule of an error message, as far as it can be told without quoting the value.
/// Constraint messages (`value length must be at least 1 characters`, `value is
/// required`) never quote the value and are kept; a parser's message may, and is
/// reduced to its kind.
fn rule_of(message: &str) -> String {
    const OWN: [&str; 4] = [
        "value ",
        "one of the fields",
        "typed_config is required",
        "type URL must",
    ];
    if OWN.iter().any(|p| message.starts_with(p)) {
        return message.to_string();
    }
    let lower = message.to_ascii_lowercase();
    let rule = if lower.contains("base64") {
        "invalid base64"
    } else if lower.contains("enum") || lower.contains("variant") {
        "unknown enum value"
    } else if lower.starts_with("invalid type") {
        "wrong type"
    } else if lower.contains("duplicate") || lower.contains("multiple") {
        "set more than once"
    } else {
        "invalid value"
    };
    rule.to_string()
}

/// What a field (or, `item`, one element of a list field) takes, in words.
fn expected_shape(field: &FieldDescriptor, item: bool) -> Option<String> {
    let one = match field.kind() {
        Kind::Message(m) if field.is_map() => {
            let v = m.map_entry_value_field();
            return Some(format!("a map of {}", plural(&v.kind())));
        }
        Kind::Message(m) => format!("a {} object", m.name()),
        Kind::String => "a string".to_string(),
        Kind::Bytes => "base64 text".to_string(),
        Kind::Bool => "a boolean".to_string(),
        Kind::Enum(_) => "an enum name".to_string(),
        _ => "a number".to_string(),
    };
    Some(if field.is_list() && !item {
        format!("a list of {}", plural(&field.kind()))
    } else {
        one
    })
}

fn plural(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => format!("{} objects", m.name()),
        Kind::String => "strings".to_string(),
        Kind::Bytes => "base64 texts".to_string(),
        Kind::Bool => "booleans".to_string(),
        Kind::Enum(_) => "enum names".to_string(),
        _ => "numbers".to_string(),
    }
}

/// Whether the JSON type of `value` can be what the field takes (the loader's
/// leniencies included: one value for a list, a boolean or a number as a string).
fn fits(field: &FieldDescriptor, item: bool, value: Option<&Value>) -> bool {
    let Some(value) = value else {
        return true;
    };
    if value.is_null() {
        return true;
    }
    if field.is_map() {
        return value.is_object();
    }
    if field.is_list() && !item {
        return match value {
            Value::Array(items) => items.iter().all(|v| fits(field, true, Some(v))),
            single => fits(field, true, Some(single)),
        };
    }
    match field.kind() {
        Kind::Message(m) => match m.full_name() {
            "google.protobuf.Value" => true,
            "google.protobuf.ListValue" => value.is_array() || value.is_object(),
            "google.protobuf.Duration"
            | "google.protobuf.Timestamp"
            | "google.protobuf.FieldMask" => value.is_string() || value.is_object(),
            name if name.starts_with("google.protobuf.") && name.ends_with("Value") => {
                !value.is_array()
            }
            _ => value.is_object(),
        },
        Kind::String | Kind::Bytes => value.is_string(),
        Kind::Bool => value.is_boolean() || value.is_string(),
        Kind::Enum(_) => value.is_string() || value.is_number(),
        _ => value.is_number() || value.is_string(),
    }
}

/// The JSON type of a value, in words.
fn shape(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Texts that must not appear in an error: every string, number and object key at or
/// under a sensitive field (but not the names of the schema's fields), each line of a
/// multi-line string, and the text a base64 string decodes to. Short texts (under 4
/// characters) are left: they would match words of any message and are not key
/// material.
fn needles(spans: &[Span<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for span in spans {
        collect_field(&span.field, span.value, &mut out);
    }
    // The longest first, so that a text is replaced whole before its parts.
    out.sort_by_key(|n| std::cmp::Reverse(n.len()));
    out.dedup();
    out
}

fn collect_field(field: &FieldDescriptor, value: &Value, out: &mut Vec<String>) {
    let kind = field.kind();
    match (value, &kind) {
        (Value::Object(entries), Kind::Message(entry)) if field.is_map() => {
            let value_kind = entry.map_entry_value_field().kind();
            for (k, v) in entries {
                push_text(k, out);
                collect_value(Some(&value_kind), v, out);
            }
        }
        (Value::Array(items), _) if field.is_list() => {
            items
                .iter()
                .for_each(|v| collect_value(Some(&kind), v, out));
        }
        _ => collect_value(Some(&kind), value, out),
    }
}

/// The texts of `value`, written where `kind` is expected (`None`: anything).
fn collect_value(kind: Option<&Kind>, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => push_text(s, out),
        Value::Number(n) => push_text(&n.to_string(), out),
        Value::Array(items) => items.iter().for_each(|v| collect_value(None, v, out)),
        Value::Object(map) => {
            let desc = match kind {
                Some(Kind::Message(m)) if is_any(m) => map
                    .get("@type")
                    .and_then(Value::as_str)
                    .and_then(registry::resolve_type_url),
                Some(Kind::Message(m)) => Some(m.clone()),
                _ => None,
            };
            for (k, v) in map {
                match desc.as_ref().and_then(|d| field_named(d, k)) {
                    Some(field) => collect_field(&field, v, out),
                    None if k == "@type" => collect_value(None, v, out),
                    None => {
                        push_text(k, out);
                        collect_value(None, v, out);
                    }
                }
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

fn push_text(s: &str, out: &mut Vec<String>) {
    use base64::Engine as _;
    const MIN: usize = 4;
    if s.chars().count() >= MIN {
        out.push(s.to_string());
        // As Rust's `{:?}` writes it (escaped newlines and quotes).
        let debug = format!("{s:?}");
        out.push(debug[1..debug.len() - 1].to_string());
    }
    out.extend(
        s.lines()
            .map(str::trim)
            .filter(|l| l.chars().count() >= 8)
            .map(str::to_string),
    );
    if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(s.trim())
        && let Ok(text) = String::from_utf8(bytes)
        && text.chars().count() >= MIN
    {
        out.push(text);
    }
}

/// `text` with every needle replaced.
fn scrub(text: &str, needles: &[String]) -> String {
    let mut out = text.to_string();
    for needle in needles {
        if out.contains(needle.as_str()) {
            out = out.replace(needle.as_str(), NOT_SHOWN);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_registry_keeps_the_sensitive_option() {
        let names: Vec<&str> = sensitive_fields().iter().map(|f| f.full_name()).collect();
        for name in [
            "envoy.extensions.transport_sockets.tls.v3.TlsCertificate.private_key",
            "envoy.extensions.transport_sockets.tls.v3.TlsCertificate.password",
            "envoy.extensions.transport_sockets.tls.v3.TlsCertificate.pkcs12",
            "envoy.extensions.transport_sockets.tls.v3.GenericSecret.secret",
            "envoy.extensions.transport_sockets.tls.v3.TlsSessionTicketKeys.keys",
            "envoy.extensions.filters.http.basic_auth.v3.BasicAuth.users",
        ] {
            assert!(
                names.contains(&name),
                "{name} not marked sensitive: {names:?}"
            );
        }
    }

    #[test]
    fn paths_split_and_match_in_either_spelling() {
        assert_eq!(
            segments(r#"a.b[0]["x.y]"].c"#),
            vec!["a", "b", "[0]", r#"["x.y]"]"#, "c"]
        );
        assert_eq!(
            under(
                "tlsCertificate.privateKey.inlineString",
                "tls_certificate.private_key"
            ),
            Some(vec!["inlineString"])
        );
        assert_eq!(under("keys[2]", "keys[0]"), Some(vec![]));
        assert_eq!(
            under("tls_certificate", "tls_certificate.private_key"),
            None
        );
        assert_eq!(under("tls_certificates", "tls_certificate"), None);
    }

    #[test]
    fn a_string_for_a_data_source_names_the_rule_not_the_value() {
        let desc = registry::pool()
            .unwrap()
            .get_message_by_name("envoy.extensions.transport_sockets.tls.v3.Secret")
            .unwrap();
        let input = json!({"name": "s", "tlsCertificate": {"privateKey": "s3cr3t-value"}});
        let error = DecodeError::Invalid {
            at: Location {
                resource: "secret \"s\"".into(),
                path: "tlsCertificate.privateKey".into(),
            },
            message: "invalid type: string \"s3cr3t-value\", expected a map".into(),
        };
        assert_eq!(
            redact(error, &desc, &input).to_string(),
            "secret \"s\": tlsCertificate.privateKey: expected a DataSource object, found a \
             string (value not shown: sensitive)"
        );
    }
}
