//! Envoy's loader leniencies, as a rewrite of the input into the strict protojson that
//! prost-reflect reads.
//!
//! Envoy reads JSON and YAML config with protobuf's `JsonStringToMessage` (YAML is first
//! turned into JSON), whose `allow_legacy_syntax` is on (protobuf's `json.cc`: "TODO:
//! Drop this setting"). With it, an `Any` written `{}` is an empty `Any` (an `Any` with
//! other fields but no `@type` stays an error); checked against Envoy 1.40's
//! `--mode validate` (see `tests/envoy_leniencies.rs`).
//!
//! Anything else is left as written, so prost-reflect reports it with its field path.
//! The rewrite also checks the `value` of a `TypedStruct` (`xds.type.v3` or
//! `udpa.type.v1`) against the message its `type_url` names when the registry has it, as
//! Envoy does when it turns the struct into that message.

use prost_reflect::{Kind, MessageDescriptor};
use serde_json::{Map, Value};

use crate::decode::{DecodeError, Location, join_path};
use crate::registry;

/// The type URL an empty `Any` (`{}`) is decoded with; the canonical encoding writes it
/// back as an empty `Any` (see [`crate::decode`]). Not accepted from the input.
pub(crate) const EMPTY_ANY_URL: &str = "type.googleapis.com/marin3r.internal.EmptyAny";

/// Rewrites `value` (a message of type `desc`) in place. Errors name the field path.
pub(crate) fn normalize(desc: &MessageDescriptor, value: &mut Value) -> Result<(), DecodeError> {
    message(desc, value, "")
}

fn message(desc: &MessageDescriptor, value: &mut Value, path: &str) -> Result<(), DecodeError> {
    match desc.full_name() {
        "google.protobuf.Any" => return any(value, path),
        "google.protobuf.Struct" | "google.protobuf.Value" => return Ok(()),
        _ => {}
    }
    let Value::Object(map) = value else {
        return Ok(());
    };
    for (key, v) in map.iter_mut() {
        let Some(field) = desc
            .get_field_by_json_name(key)
            .or_else(|| desc.get_field_by_name(key))
        else {
            continue;
        };
        let at = join_path(path, &key_segment(key));
        if field.is_map() {
            if let (Value::Object(entries), Kind::Message(entry)) = (v, field.kind()) {
                let value_kind = entry.map_entry_value_field().kind();
                for (k, entry_value) in entries.iter_mut() {
                    singular(&value_kind, entry_value, &join_path(&at, &key_segment(k)))?;
                }
            }
        } else if field.is_list() {
            list(&field.kind(), v, &at)?;
        } else {
            singular(&field.kind(), v, &at)?;
        }
    }
    if is_typed_struct(desc) {
        typed_struct(map, path)?;
    }
    Ok(())
}

/// A repeated field: each element.
fn list(kind: &Kind, value: &mut Value, path: &str) -> Result<(), DecodeError> {
    if let Value::Array(items) = value {
        for (i, item) in items.iter_mut().enumerate() {
            singular(kind, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn singular(kind: &Kind, value: &mut Value, path: &str) -> Result<(), DecodeError> {
    match kind {
        Kind::Message(desc) if !value.is_null() => message(desc, value, path),
        _ => Ok(()),
    }
}

fn any(value: &mut Value, path: &str) -> Result<(), DecodeError> {
    let Value::Object(map) = value else {
        return Ok(());
    };
    let Some(type_url) = map.get("@type").and_then(Value::as_str).map(str::to_string) else {
        if map.is_empty() {
            map.insert("@type".into(), Value::String(EMPTY_ANY_URL.into()));
        }
        return Ok(());
    };
    if is_empty_any_url(&type_url) {
        return Err(DecodeError::UnknownType {
            at: Location::new("", path),
            type_url,
        });
    }
    let Some(desc) = registry::resolve_type_url(&type_url) else {
        return Ok(());
    };
    if is_well_known(desc.full_name()) {
        if let Some(inner) = map.get_mut("value") {
            message(&desc, inner, &join_path(path, "value"))?;
        }
        return Ok(());
    }
    let type_field = map.remove("@type");
    let result = message(&desc, value, path);
    if let (Value::Object(map), Some(t)) = (value, type_field) {
        map.insert("@type".into(), t);
    }
    result
}

pub(crate) fn is_empty_any_url(type_url: &str) -> bool {
    let name = |u: &str| {
        u.rsplit_once('/')
            .map_or(u.to_string(), |(_, n)| n.to_string())
    };
    name(type_url) == name(EMPTY_ANY_URL)
}

fn is_typed_struct(desc: &MessageDescriptor) -> bool {
    matches!(
        desc.full_name(),
        "xds.type.v3.TypedStruct" | "udpa.type.v1.TypedStruct"
    )
}

/// Envoy turns a `TypedStruct` into the message its `type_url` names (through JSON, with
/// the same leniencies); a `value` that does not fit is refused, with its path.
fn typed_struct(map: &Map<String, Value>, path: &str) -> Result<(), DecodeError> {
    let Some(type_url) = map
        .get("type_url")
        .or_else(|| map.get("typeUrl"))
        .and_then(Value::as_str)
    else {
        return Ok(());
    };
    let Some(desc) = registry::resolve_type_url(type_url) else {
        return Ok(());
    };
    let mut inner = map
        .get("value")
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let at = join_path(path, "value");
    message(&desc, &mut inner, &at)?;
    crate::decode::check_message(desc, &inner).map_err(|e| e.prefixed(&at))
}

/// The types whose `Any` form carries the payload under `"value"` (prost-reflect's list).
fn is_well_known(name: &str) -> bool {
    matches!(
        name,
        "google.protobuf.Any"
            | "google.protobuf.Timestamp"
            | "google.protobuf.Duration"
            | "google.protobuf.Struct"
            | "google.protobuf.FieldMask"
            | "google.protobuf.ListValue"
            | "google.protobuf.Value"
            | "google.protobuf.Empty"
            | "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

/// A path segment for a map key: plain identifiers as is, anything else quoted
/// (`["envoy.filters.http.cors"]`), as [`crate::decode`] writes paths.
fn key_segment(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@')
    {
        key.to_string()
    } else {
        format!("[{}]", serde_json::to_string(key).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_segments() {
        assert_eq!(key_segment("a_b"), "a_b");
        assert_eq!(key_segment("a.b"), r#"["a.b"]"#);
    }
}
