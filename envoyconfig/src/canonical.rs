//! The canonical forms of a decoded message, so that equal content gives equal bytes
//! and an equal digest whatever the input's spelling: protobuf bytes with every map's
//! entries sorted (prost-reflect keeps maps in a `HashMap`) and with empty `Any`s as
//! Envoy reads them, and protojson with stable options and sorted keys.

use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};
use prost_reflect::{DynamicMessage, Kind, MessageDescriptor, SerializeOptions};
use serde_json::Value;

use crate::error::DecodeError;
use crate::registry;
use crate::wellknown::EMPTY_ANY_URL;

/// The message as protojson with stable options (camelCase names, defaults skipped,
/// enums by name, 64-bit integers as strings).
/// An empty `Any` (decoded with the placeholder type [`EMPTY_ANY_URL`]) prints as `{}`.
pub(crate) fn message_to_json(message: &DynamicMessage) -> Result<Value, DecodeError> {
    let mut json = message
        .serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new())
        .map_err(|e| DecodeError::Registry(format!("cannot serialise message: {e}")))?;
    restore_empty_anys(&mut json);
    Ok(json)
}

/// `{"@type": EMPTY_ANY_URL}` → `{}`, at any depth.
fn restore_empty_anys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.len() == 1 && map.get("@type").and_then(Value::as_str) == Some(EMPTY_ANY_URL) {
                map.clear();
            }
            map.values_mut().for_each(restore_empty_anys);
        }
        Value::Array(items) => items.iter_mut().for_each(restore_empty_anys),
        _ => {}
    }
}

/// Writes JSON with object keys sorted, whatever serde_json's map order is.
pub(crate) fn write_canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(serde_json::to_string(key).unwrap_or_default().as_bytes());
                out.push(b':');
                write_canonical_json(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical_json(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

/// Nesting bound of [`canonical_bytes`] (protobuf's own recursion limit is 100).
const MAX_DEPTH: u32 = 128;

/// What [`canonical_bytes`] does with an empty `Any`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum EmptyAny {
    /// Writes an `Any` of the placeholder type [`EMPTY_ANY_URL`] as an empty `Any` (what
    /// Envoy reads `{}` as), for serving.
    Strip,
    /// Gives an `Any` without type URL the placeholder type, for printing.
    Mark,
}

/// Re-encodes protobuf bytes of `desc` with every map field's entries in a deterministic
/// order (sorted by their encoding), recursing into sub-messages and into `Any` payloads
/// whose type is in the registry, and with empty `Any`s as `empty_any` says. Everything
/// else keeps its order. `None` if the bytes cannot be walked (the caller then keeps them
/// as they are).
pub(crate) fn canonical_bytes(
    bytes: &[u8],
    desc: &MessageDescriptor,
    depth: u32,
    empty_any: EmptyAny,
) -> Option<Vec<u8>> {
    if depth > MAX_DEPTH {
        return None;
    }
    let is_any = desc.full_name() == "google.protobuf.Any";
    let mut any_type_url: Option<String> = None;
    // (field number, is a map entry, the re-encoded field)
    let mut fields: Vec<(u32, bool, Vec<u8>)> = Vec::new();
    let mut buf = bytes;
    while !buf.is_empty() {
        let (number, wire_type) = decode_key(&mut buf).ok()?;
        let mut encoded = Vec::new();
        let mut is_map = false;
        match wire_type {
            WireType::Varint => {
                let v = decode_varint(&mut buf).ok()?;
                encode_key(number, wire_type, &mut encoded);
                encode_varint(v, &mut encoded);
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let n = if wire_type == WireType::SixtyFourBit {
                    8
                } else {
                    4
                };
                let (payload, rest) = buf.split_at_checked(n)?;
                buf = rest;
                encode_key(number, wire_type, &mut encoded);
                encoded.extend_from_slice(payload);
            }
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
                let (payload, rest) = buf.split_at_checked(len)?;
                buf = rest;
                let field = desc.get_field(number);
                let payload = match field.as_ref().map(|f| (f.kind(), f.is_map())) {
                    Some((Kind::Message(sub), map)) => {
                        is_map = map;
                        canonical_bytes(payload, &sub, depth + 1, empty_any)?
                    }
                    _ if is_any && number == 1 => {
                        any_type_url = std::str::from_utf8(payload).ok().map(str::to_string);
                        payload.to_vec()
                    }
                    _ if is_any && number == 2 => {
                        match any_type_url.as_deref().and_then(registry::resolve_type_url) {
                            Some(inner) => canonical_bytes(payload, &inner, depth + 1, empty_any)?,
                            None => payload.to_vec(),
                        }
                    }
                    _ => payload.to_vec(),
                };
                encode_key(number, wire_type, &mut encoded);
                encode_varint(payload.len() as u64, &mut encoded);
                encoded.extend_from_slice(&payload);
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        }
        fields.push((number, is_map, encoded));
    }
    // Sort each run of entries of one map field.
    let mut start = 0;
    while start < fields.len() {
        let mut end = start + 1;
        while end < fields.len() && fields[end].0 == fields[start].0 {
            end += 1;
        }
        if fields[start].1 {
            fields[start..end].sort_by(|a, b| a.2.cmp(&b.2));
        }
        start = end;
    }
    if is_any {
        match (empty_any, any_type_url.as_deref()) {
            (EmptyAny::Strip, Some(EMPTY_ANY_URL)) => return Some(Vec::new()),
            (EmptyAny::Mark, None | Some("")) => {
                let mut marked = Vec::new();
                encode_key(1, WireType::LengthDelimited, &mut marked);
                encode_varint(EMPTY_ANY_URL.len() as u64, &mut marked);
                marked.extend_from_slice(EMPTY_ANY_URL.as_bytes());
                return Some(marked);
            }
            _ => {}
        }
    }
    Some(fields.into_iter().flat_map(|(_, _, bytes)| bytes).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys() {
        let mut out = Vec::new();
        write_canonical_json(&json!({"b": [1, {"d": 1, "c": "x"}], "a": null}), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":null,"b":[1,{"c":"x","d":1}]}"#
        );
    }
}
