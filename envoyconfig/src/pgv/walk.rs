//! The walk over a decoded message: required oneofs, the extension lookups that fail on
//! a missing or empty `typed_config`, each field's rules, every nested message, list
//! item, map value and `Any` payload in turn, and after its rules each message's TLS
//! material ([`crate::tls`]).

use prost_reflect::{DynamicMessage, Kind, MapKey, OneofDescriptor, ReflectMessage, Value};

use super::apply::apply;
use super::compile::rules_for;
use super::rules::{FieldCheck, Rule};
use super::value::{key_text, sorted};
use crate::error::{DecodeError, join_path};
use crate::registry;
use crate::wellknown::EMPTY_ANY_URL;

/// Nesting bound of the walk (protobuf's own recursion limit is 100).
const MAX_DEPTH: u32 = 128;

/// Checks `message` (and everything in it, `Any` payloads included) against Envoy's
/// constraints. The error names the first violation with its field path.
pub(crate) fn check(message: &DynamicMessage) -> Result<(), DecodeError> {
    check_message(message, "", 0)
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
            return Err(DecodeError::invalid(
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
        return Err(DecodeError::invalid(
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
            return Err(DecodeError::invalid(&at, "value is required"));
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
                return Err(DecodeError::invalid(&at, "value is required"));
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
    DecodeError::invalid(
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
