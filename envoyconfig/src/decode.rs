//! Envoy resource decoding: JSON or YAML (text or [`serde_json::Value`]) → protobuf, with
//! protojson semantics, resolved against the complete Envoy type registry
//! ([`crate::registry`]). This module is the pipeline: the loader leniencies
//! (`lenient`), strict protojson (`strict`), the resource name, Envoy's constraints
//! (`pgv`) and the canonical encoding (`canonical`); its errors and their locations are
//! `error`'s, the text forms `text`'s (both re-exported here).
//!
//! - Field names in `snake_case` or `lowerCamelCase`; enums by name (or number);
//!   well-known types (`"1s"` durations, `Struct`, wrappers, timestamps, …); `Any` with
//!   `@type`, nested to any depth (`typed_config` inside `typed_config`).
//! - What Envoy's loader reads beyond protojson is read too ([`crate::lenient`]): enums
//!   in any case, one value for a list, `{seconds: 5}` durations, `{}` as an empty `Any`,
//!   …; a `TypedStruct`'s `value` is checked against the type it names.
//! - Unknown fields and unknown `@type` URLs are errors that name the field path:
//!   `listener "https": filter_chains[0].filters[0].typed_config: unknown type URL
//!   type.googleapis.com/foo.Bar`. Paths reach inside `Any` values because serde_json's
//!   map keeps keys sorted, so `@type` is read first (were serde_json's `preserve_order`
//!   feature ever enabled, errors in fields written before `@type` would be reported at
//!   the `Any` itself).
//! - The encoded body is canonical: map entries are sorted, so equal content gives equal
//!   bytes (prost-reflect keeps maps in a `HashMap`). The digest is FNV-1a 64 of the
//!   message re-serialised as protojson with sorted keys, so it is stable across
//!   processes and independent of the input's spelling (camelCase or snake_case, YAML or
//!   JSON, `"1s"` or `"1.000s"`).

use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, ReflectMessage};
use prost_types::Any;
use serde_json::Value;

use crate::canonical::{EmptyAny, canonical_bytes, message_to_json, write_canonical_json};
use crate::registry;
use crate::resource::{Resource, ResourceType, fnv1a64};
use crate::wellknown::EMPTY_ANY_URL;
use crate::{lenient, pgv, sensitive, strict};

pub use crate::error::{DecodeError, Location};
pub use crate::text::{MAX_BUFFERED_COMMENTS, Serialization, yaml_options};

/// Decodes one resource of type `kind` from a JSON value (already parsed from YAML or
/// JSON) with protojson semantics.
///
/// No error shows a value written at or under a field Envoy marks sensitive
/// ([`crate::sensitive`]): it names the field and the rule instead.
pub fn decode_resource(kind: ResourceType, value: &Value) -> Result<Resource, DecodeError> {
    let desc = registry::message_descriptor(kind)?;
    decode_checked(kind, &desc, value).map_err(|e| sensitive::redact(e, &desc, value))
}

/// [`decode_resource`] before its errors are redacted.
fn decode_checked(
    kind: ResourceType,
    desc: &MessageDescriptor,
    value: &Value,
) -> Result<Resource, DecodeError> {
    let label = resource_label(kind, value);
    let desc = desc.clone();
    let relabel = |mut e: DecodeError| {
        if let Some(at) = e.location_mut() {
            at.resource = label.clone();
        }
        e
    };
    let message = decode_message(desc, value).map_err(relabel)?;
    // The resource name first (marin3r's own rule), then Envoy's constraints.
    let resource = finish(kind, &message, label.clone())?;
    pgv::check(&message).map_err(relabel)?;
    Ok(resource)
}

/// Decodes one resource of type `kind` from JSON or YAML text.
pub fn decode_str(
    kind: ResourceType,
    text: &str,
    serialization: Serialization,
) -> Result<Resource, DecodeError> {
    let value = parse_text(text, serialization).map_err(|mut e| {
        if let Some(at) = e.location_mut() {
            at.resource = kind.to_string();
        }
        e
    })?;
    decode_resource(kind, &value)
}

/// Parses JSON or YAML text into a JSON value (YAML: one document).
pub fn parse_text(text: &str, serialization: Serialization) -> Result<Value, DecodeError> {
    let parsed = match serialization {
        Serialization::Json => serde_json::from_str::<Value>(text).map_err(|e| e.to_string()),
        Serialization::Yaml => serde_saphyr::from_str_with_options::<Value>(text, yaml_options())
            .map_err(|e| e.to_string()),
    };
    parsed.map_err(|message| DecodeError::Syntax {
        at: Location::default(),
        serialization,
        message,
    })
}

/// The protojson form of a decoded resource (field names in lowerCamelCase, as Envoy's
/// config dump shows them). For status pages and tests.
pub fn to_json(resource: &Resource) -> Result<Value, DecodeError> {
    let desc = registry::message_descriptor(resource.kind)?;
    // Empty `Any`s get their placeholder type back, so prost-reflect can print them.
    let bytes = canonical_bytes(&resource.body.value, &desc, 0, EmptyAny::Mark)
        .unwrap_or_else(|| resource.body.value.clone());
    let message = DynamicMessage::decode(desc, bytes.as_slice())
        .map_err(|e| DecodeError::Registry(format!("cannot decode {}: {e}", resource.kind)))?;
    message_to_json(&message)
}

/// Encodes an already-built message as a [`Resource`] (name, canonical bytes, digest).
pub(crate) fn finish(
    kind: ResourceType,
    message: &DynamicMessage,
    label: String,
) -> Result<Resource, DecodeError> {
    let name = message
        .get_field_by_name(kind.name_field())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    if name.is_empty() {
        return Err(DecodeError::MissingName {
            at: Location::new(label, ""),
            field: kind.name_field(),
        });
    }
    let json = message_to_json(message)?;
    let mut canonical = Vec::new();
    write_canonical_json(&json, &mut canonical);
    let raw = message.encode_to_vec();
    let value = match canonical_bytes(&raw, &message.descriptor(), 0, EmptyAny::Strip) {
        Some(value) => value,
        // The placeholder of an empty `Any` must never be served.
        None if raw
            .windows(EMPTY_ANY_URL.len())
            .any(|w| w == EMPTY_ANY_URL.as_bytes()) =>
        {
            return Err(DecodeError::Registry(format!(
                "cannot re-encode {label} with an empty Any"
            )));
        }
        None => raw,
    };
    Ok(Resource {
        kind,
        name,
        body: Any {
            type_url: kind.type_url().to_string(),
            value,
        },
        digest: fnv1a64(&canonical),
    })
}

/// `listener "https"` from the input's name field (either spelling), or just `listener`.
fn resource_label(kind: ResourceType, value: &Value) -> String {
    let field = kind.name_field();
    let name = value
        .get(field)
        .or_else(|| value.get(snake_to_camel(field)))
        .and_then(Value::as_str);
    match name {
        Some(name) if !name.is_empty() => format!("{kind} {name:?}"),
        _ => kind.to_string(),
    }
}

fn snake_to_camel(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut upper = false;
    for c in s.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// protojson → message with Envoy's leniencies ([`crate::lenient`]), mapping serde
/// errors to path-carrying [`DecodeError`]s.
pub(crate) fn decode_message(
    desc: MessageDescriptor,
    value: &Value,
) -> Result<DynamicMessage, DecodeError> {
    let mut value = value.clone();
    lenient::normalize(&desc, &mut value)?;
    strict::decode(desc, &value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_uses_either_spelling() {
        assert_eq!(
            resource_label(ResourceType::Endpoint, &json!({"clusterName": "x"})),
            r#"endpoint "x""#
        );
        assert_eq!(resource_label(ResourceType::Cluster, &json!({})), "cluster");
    }
}
