//! Every field Envoy marks sensitive is redacted in what we show of a resource
//! (`marin3r_envoyconfig::redact`, Envoy's `/config_dump` rule). The table runs over
//! **every** sensitive field of the registry, each set in a message of its type inside
//! the `typed_config` `Any` of an `extensionConfig` resource (and again inside a
//! `TypedStruct`), with each kind of value it can hold: a string or bytes value, a list
//! item, a map value, and, for a message field (a `DataSource`, …), each of its string
//! and bytes fields in turn. The encoded answer must not hold the value, and a string
//! or bytes value must read `[redacted]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use prost::Message as _;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};

use marin3r_envoyconfig::redact::{REDACTED, redact_encoded};
use marin3r_envoyconfig::registry;
use marin3r_envoyconfig::resource::ResourceType;
use marin3r_envoyconfig::sensitive::sensitive_fields;

const NEEDLE: &str = "n33dle-S3cr3t-value";

fn is_string_like(kind: &Kind) -> bool {
    matches!(kind, Kind::String | Kind::Bytes)
}

fn scalar(kind: &Kind) -> Option<Value> {
    match kind {
        Kind::String => Some(Value::String(NEEDLE.into())),
        Kind::Bytes => Some(Value::Bytes(NEEDLE.as_bytes().to_vec().into())),
        _ => None,
    }
}

/// The values to set at `field`, each with what it shows: a label and whether
/// `[redacted]` must appear.
fn values(field: &FieldDescriptor) -> Vec<(String, Value)> {
    let kind = field.kind();
    let one = |v: Value| {
        if field.is_list() {
            Value::List(vec![v])
        } else {
            v
        }
    };
    if field.is_map() {
        let Kind::Message(entry) = &kind else {
            return Vec::new();
        };
        let value_kind = entry.map_entry_value_field().kind();
        let entries = |v: Value| {
            let mut m = HashMap::new();
            m.insert(MapKey::String("key".into()), v);
            Value::Map(m)
        };
        return match &value_kind {
            Kind::Message(m) => messages(m)
                .into_iter()
                .map(|(what, v)| (format!("map value {what}"), entries(v)))
                .collect(),
            k => scalar(k)
                .map(|v| vec![("map value".to_string(), entries(v))])
                .unwrap_or_default(),
        };
    }
    match &kind {
        Kind::Message(m) => messages(m)
            .into_iter()
            .map(|(what, v)| (what, one(v)))
            .collect(),
        k => scalar(k)
            .map(|v| vec![("value".to_string(), one(v))])
            .unwrap_or_default(),
    }
}

/// A message of type `desc` with one of its string or bytes fields set, for each.
fn messages(desc: &MessageDescriptor) -> Vec<(String, Value)> {
    desc.fields()
        .filter(|f| is_string_like(&f.kind()) && !f.is_map())
        // A type URL names a type, it holds no secret (the payload does).
        .filter(|f| f.full_name() != "google.protobuf.Any.type_url")
        .map(|f| {
            let mut m = DynamicMessage::new(desc.clone());
            let v = scalar(&f.kind()).unwrap();
            m.set_field(&f, if f.is_list() { Value::List(vec![v]) } else { v });
            (format!("{}.{}", desc.name(), f.name()), Value::Message(m))
        })
        .collect()
}

fn any(message: &DynamicMessage) -> DynamicMessage {
    let desc = registry::pool()
        .unwrap()
        .get_message_by_name("google.protobuf.Any")
        .unwrap();
    let mut any = DynamicMessage::new(desc);
    any.set_field_by_name(
        "type_url",
        Value::String(format!(
            "type.googleapis.com/{}",
            message.descriptor().full_name()
        )),
    );
    any.set_field_by_name("value", Value::Bytes(message.encode_to_vec().into()));
    any
}

/// An `extensionConfig` resource whose `typed_config` holds `payload` (an `Any`).
fn extension_config(payload: DynamicMessage) -> Vec<u8> {
    let desc = registry::message_descriptor(ResourceType::ExtensionConfig).unwrap();
    let mut ec = DynamicMessage::new(desc);
    ec.set_field_by_name("name", Value::String("ext".into()));
    ec.set_field_by_name("typed_config", Value::Message(payload));
    ec.encode_to_vec()
}

/// `payload` inside a `TypedStruct` inside the `Any`.
fn typed_struct(message: &DynamicMessage) -> Option<DynamicMessage> {
    let pool = registry::pool().unwrap();
    let ts_desc = pool.get_message_by_name("xds.type.v3.TypedStruct")?;
    let struct_desc = pool.get_message_by_name("google.protobuf.Struct")?;
    let json = serde_json::to_value(message).ok()?;
    let value = DynamicMessage::deserialize(struct_desc, &json).ok()?;
    let mut ts = DynamicMessage::new(ts_desc);
    ts.set_field_by_name(
        "type_url",
        Value::String(format!(
            "type.googleapis.com/{}",
            message.descriptor().full_name()
        )),
    );
    ts.set_field_by_name("value", Value::Message(value));
    Some(any(&ts))
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The value, or its base64 (a bytes field written as JSON in a `TypedStruct`).
fn shows_needle(bytes: &[u8]) -> bool {
    contains(bytes, NEEDLE.as_bytes()) || contains(bytes, b64(NEEDLE).as_bytes())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn every_sensitive_field_is_redacted_in_every_shape_and_wrapping() {
    let url = ResourceType::ExtensionConfig.type_url();
    let mut checked = 0;
    let mut fields_seen = 0;
    let mut in_typed_struct = 0;
    for field in sensitive_fields() {
        let cases = values(field);
        if cases.is_empty() {
            continue;
        }
        fields_seen += 1;
        for (what, value) in cases {
            let mut holder = DynamicMessage::new(field.parent_message().clone());
            holder.set_field(field, value);
            let mut wrapped = vec![("Any", extension_config(any(&holder)))];
            if let Some(ts) = typed_struct(&holder) {
                wrapped.push(("TypedStruct", extension_config(ts)));
                in_typed_struct += 1;
            }
            for (how, body) in wrapped {
                assert!(shows_needle(&body), "the case holds its value");
                let out = redact_encoded(url, &body)
                    .unwrap_or_else(|e| panic!("{} {what} in {how}: {e}", field.full_name()));
                assert!(
                    !shows_needle(&out),
                    "{} ({what}, in {how}): the value is shown",
                    field.full_name()
                );
                assert!(
                    contains(&out, REDACTED.as_bytes()) || contains(&out, b64(REDACTED).as_bytes()),
                    "{} ({what}, in {how}): no {REDACTED}",
                    field.full_name()
                );
                checked += 1;
            }
        }
    }
    // Every sensitive field of the registry holds strings, bytes or messages of them.
    assert_eq!(fields_seen, sensitive_fields().len());
    assert!(checked > 2 * sensitive_fields().len(), "{checked}");
    assert!(
        in_typed_struct >= sensitive_fields().len(),
        "{in_typed_struct}"
    );
}
