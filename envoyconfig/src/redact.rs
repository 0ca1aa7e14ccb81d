//! Sensitive values out of every resource we show, as Envoy's admin `/config_dump` does
//! (`MessageUtil::redact`): the one rule for every output path that shows a resource's
//! content (the CSDS answer of the discovery service, every format of `marin3r status`).
//!
//! The rule ([`redact_message`]) walks every field set in a decoded message; a field is
//! sensitive when Envoy marks it (`(udpa.annotations.sensitive) = true`,
//! [`crate::sensitive::is_sensitive`]) or when it is under a sensitive field:
//!
//! - a sensitive string or bytes value (a list item, a map value) becomes
//!   [`REDACTED`], `[redacted]` (bytes: those 10 bytes, `W3JlZGFjdGVkXQ==` in
//!   protojson); any other sensitive scalar is cleared; a message is walked with the
//!   sensitive flag passed down (so `private_key: {inline_string: …}`,
//!   `{inline_bytes: …}`, `{filename: …}` and `{environment_variable: …}` all show
//!   `[redacted]`); of a map only the values are redacted, never the keys;
//! - an `Any` is unpacked by its type URL, redacted and packed again; a `TypedStruct`
//!   (`xds.type.v3` and `udpa.type.v1`) is read as the message its `type_url` names,
//!   redacted and written back. A type the registry does not know is left as it is,
//!   as Envoy does, except that the payload of an `Any` under a sensitive field
//!   becomes `[redacted]` (Envoy would show it); a `TypedStruct` that does not read as
//!   its type is emptied (served ones were checked against their type when loaded, so
//!   this never hides a good one).
//!
//! [`redact_encoded`] applies it to an encoded message and gives the bytes back
//! unchanged (borrowed) when nothing was sensitive.

use std::borrow::Cow;

use prost::Message as _;
use prost_reflect::{DynamicMessage, Kind, MessageDescriptor, ReflectMessage, Value};

use crate::canonical::{EmptyAny, canonical_bytes, message_to_json};
use crate::error::DecodeError;
use crate::registry;
use crate::sensitive::is_sensitive;

/// What a sensitive string or bytes value is replaced with, as Envoy's `/config_dump`
/// shows it.
pub const REDACTED: &str = "[redacted]";

/// Nesting bound (protobuf's own recursion limit is 100 per encoded message; `Any`s
/// nest messages decoded one by one).
const MAX_DEPTH: u32 = 128;

/// The encoded message `body` of type `type_url` as Envoy's `/config_dump` shows it:
/// borrowed when it holds nothing sensitive, re-encoded (canonical) otherwise. An
/// error when the type is unknown or the bytes do not decode: the caller then shows
/// no content at all.
pub fn redact_encoded<'a>(type_url: &str, body: &'a [u8]) -> Result<Cow<'a, [u8]>, DecodeError> {
    let desc = registry::resolve_type_url(type_url)
        .ok_or_else(|| DecodeError::Registry(format!("unknown type URL {type_url}")))?;
    let mut message = DynamicMessage::decode(desc.clone(), body)
        .map_err(|e| DecodeError::Registry(format!("cannot decode {}: {e}", desc.full_name())))?;
    if !redact_message(&mut message)? {
        return Ok(Cow::Borrowed(body));
    }
    let raw = message.encode_to_vec();
    Ok(Cow::Owned(
        canonical_bytes(&raw, &desc, 0, EmptyAny::Strip).unwrap_or(raw),
    ))
}

/// Redacts `message` in place (see the module documentation); whether anything was
/// sensitive.
pub fn redact_message(message: &mut DynamicMessage) -> Result<bool, DecodeError> {
    redact_in(message, false, 0)
}

fn too_deep() -> DecodeError {
    DecodeError::Registry(format!(
        "messages nested deeper than {MAX_DEPTH}: not shown"
    ))
}

fn redact_in(
    message: &mut DynamicMessage,
    sensitive: bool,
    depth: u32,
) -> Result<bool, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    let desc = message.descriptor();
    match desc.full_name() {
        "google.protobuf.Any" => return redact_any(message, sensitive, depth),
        "xds.type.v3.TypedStruct" | "udpa.type.v1.TypedStruct" => {
            return redact_typed_struct(message, sensitive, depth);
        }
        _ => {}
    }
    let mut changed = false;
    let mut clear = Vec::new();
    for (field, value) in message.fields_mut() {
        let sensitive = sensitive || is_sensitive(&field);
        match value {
            Value::Message(m) => changed |= redact_in(m, sensitive, depth + 1)?,
            Value::List(items) => {
                for item in items.iter_mut() {
                    match item {
                        Value::Message(m) => changed |= redact_in(m, sensitive, depth + 1)?,
                        scalar if sensitive => {
                            if !replace(scalar) {
                                clear.push(field.clone());
                                break;
                            }
                            changed = true;
                        }
                        _ => {}
                    }
                }
            }
            Value::Map(entries) => {
                let value_kind = match field.kind() {
                    Kind::Message(entry) => Some(entry.map_entry_value_field().kind()),
                    _ => None,
                };
                for (_, v) in entries.iter_mut() {
                    match v {
                        Value::Message(m) => changed |= redact_in(m, sensitive, depth + 1)?,
                        scalar if sensitive => {
                            if !replace(scalar)
                                && let Some(kind) = &value_kind
                            {
                                *scalar = Value::default_value(kind);
                            }
                            changed = true;
                        }
                        _ => {}
                    }
                }
            }
            scalar if sensitive => {
                if !replace(scalar) {
                    clear.push(field.clone());
                }
                changed = true;
            }
            _ => {}
        }
    }
    for field in &clear {
        message.clear_field(field);
    }
    Ok(changed || !clear.is_empty())
}

/// A string or bytes value becomes [`REDACTED`]; `false` for any other scalar.
fn replace(value: &mut Value) -> bool {
    match value {
        Value::String(s) => {
            *s = REDACTED.to_string();
            true
        }
        Value::Bytes(b) => {
            *b = REDACTED.as_bytes().to_vec().into();
            true
        }
        _ => false,
    }
}

/// An `Any`: its payload, unpacked by type URL, redacted and packed again.
fn redact_any(any: &mut DynamicMessage, sensitive: bool, depth: u32) -> Result<bool, DecodeError> {
    let type_url = any
        .get_field_by_name("type_url")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let Some(inner_desc) = registry::resolve_type_url(&type_url) else {
        // Not readable: left as it is, unless it is sensitive itself.
        let set = any.has_field_by_name("value");
        if sensitive && set {
            any.set_field_by_name("value", Value::Bytes(REDACTED.as_bytes().to_vec().into()));
        }
        return Ok(sensitive && set);
    };
    let bytes = any
        .get_field_by_name("value")
        .and_then(|v| v.as_bytes().cloned())
        .unwrap_or_default();
    let mut inner = DynamicMessage::decode(inner_desc, bytes.as_ref())
        .map_err(|e| DecodeError::Registry(format!("cannot decode {type_url}: {e}")))?;
    if !redact_in(&mut inner, sensitive, depth + 1)? {
        return Ok(false);
    }
    any.set_field_by_name("value", Value::Bytes(inner.encode_to_vec().into()));
    Ok(true)
}

/// A `TypedStruct`: its `value` read as the message `type_url` names, redacted and
/// written back; emptied when it does not read as that type.
fn redact_typed_struct(
    typed: &mut DynamicMessage,
    sensitive: bool,
    depth: u32,
) -> Result<bool, DecodeError> {
    let type_url = typed
        .get_field_by_name("type_url")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let Some(inner_desc) = registry::resolve_type_url(&type_url) else {
        return Ok(false);
    };
    let Some(Value::Message(value)) = typed.get_field_by_name("value").map(Cow::into_owned) else {
        return Ok(false);
    };
    let struct_desc = value.descriptor();
    let read =
        message_to_json(&value).and_then(|json| crate::decode::decode_message(inner_desc, &json));
    let Ok(mut inner) = read else {
        typed.clear_field_by_name("value");
        return Ok(true);
    };
    if !redact_in(&mut inner, sensitive, depth + 1)? {
        return Ok(false);
    }
    let written = message_to_json(&inner).and_then(|json| struct_of(struct_desc, &json));
    match written {
        Ok(s) => typed.set_field_by_name("value", Value::Message(s)),
        Err(_) => typed.clear_field_by_name("value"),
    }
    Ok(true)
}

/// A `google.protobuf.Struct` of JSON.
fn struct_of(
    desc: MessageDescriptor,
    json: &serde_json::Value,
) -> Result<DynamicMessage, DecodeError> {
    DynamicMessage::deserialize(desc, json)
        .map_err(|e| DecodeError::Registry(format!("cannot write a Struct: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode_resource, to_json};
    use crate::resource::{Resource, ResourceType};
    use base64::Engine as _;
    use serde_json::json;

    /// A P-256 key made for this test (its certificate is not inline, so only the key
    /// is checked by the loader's rules).
    const KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQggn38lrYNOeHoEtpZ
ORKmMC83m2eEU9DfhbkhlULqagShRANCAAQV7LtfEZpm4h6J5eSnfG4suXaOJeUM
zAiGOwxEXf3x0jOlarx5NMg8ABmkpPRrUSZFzLcjJarpeSoU2gYDPgob
-----END PRIVATE KEY-----
";
    const PASSWORD: &str = "hunter2-p4ssw0rd";

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    /// A listener whose TLS key is inline (`inline_string`) and a cluster whose key is
    /// `inline_bytes` with a `password`.
    fn listener_and_cluster() -> (Resource, Resource) {
        let tls_socket = |context: &str, key: serde_json::Value| {
            json!({"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": format!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{context}"),
                "common_tls_context": {"tls_certificates": [{
                    "certificate_chain": {"filename": "/etc/envoy/tls.crt"},
                    "private_key": key,
                    "password": {"inline_string": PASSWORD}
                }]}
            }})
        };
        let listener = decode_resource(
            ResourceType::Listener,
            &json!({"name": "https", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
                "filter_chains": [{
                    "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": "tcp", "cluster": "kuard"}}],
                    "transport_socket": tls_socket("DownstreamTlsContext", json!({"inline_string": KEY}))
                }]}),
        )
        .unwrap();
        let cluster = decode_resource(
            ResourceType::Cluster,
            &json!({"name": "kuard", "connect_timeout": "1s",
                "transport_socket": tls_socket("UpstreamTlsContext", json!({"inline_bytes": b64(KEY)}))}),
        )
        .unwrap();
        (listener, cluster)
    }

    fn redacted(r: &Resource) -> Resource {
        let body = redact_encoded(&r.body.type_url, &r.body.value).unwrap();
        Resource {
            body: prost_types::Any {
                type_url: r.body.type_url.clone(),
                value: body.into_owned(),
            },
            ..r.clone()
        }
    }

    #[test]
    fn inline_keys_and_passwords_show_redacted_as_envoy_config_dump_does() {
        let (listener, cluster) = listener_and_cluster();
        let key_line = KEY.lines().nth(1).unwrap();
        // Before: the key is in the body and in its JSON.
        assert!(
            to_json(&listener)
                .unwrap()
                .to_string()
                .contains(&key_line[..40])
        );
        for r in [&listener, &cluster] {
            let out = redacted(r);
            let text = to_json(&out).unwrap().to_string();
            let bytes = String::from_utf8_lossy(&out.body.value).into_owned();
            for needle in [&key_line[..40], "PRIVATE KEY", PASSWORD, &b64(KEY)[..40]] {
                assert!(!text.contains(needle), "{needle} in {text}");
                assert!(!bytes.contains(needle), "{needle} in the bytes");
            }
            // Everything else is kept.
            assert!(text.contains("/etc/envoy/tls.crt"), "{text}");
        }
        let tls = |r: &Resource| {
            let json = to_json(&redacted(r)).unwrap();
            let socket = if r.kind == ResourceType::Listener {
                json["filterChains"][0]["transportSocket"].clone()
            } else {
                json["transportSocket"].clone()
            };
            socket["typedConfig"]["commonTlsContext"]["tlsCertificates"][0].clone()
        };
        let l = tls(&listener);
        assert_eq!(l["privateKey"], json!({"inlineString": "[redacted]"}));
        assert_eq!(l["password"], json!({"inlineString": "[redacted]"}));
        let c = tls(&cluster);
        assert_eq!(c["privateKey"], json!({"inlineBytes": b64(REDACTED)}));
        // A resource with nothing sensitive comes back as it was, not re-encoded.
        let plain = decode_resource(
            ResourceType::Cluster,
            &json!({"name": "plain", "connect_timeout": "1s"}),
        )
        .unwrap();
        assert!(matches!(
            redact_encoded(&plain.body.type_url, &plain.body.value).unwrap(),
            Cow::Borrowed(_)
        ));
        // Redacting is idempotent.
        let once = redacted(&listener);
        assert_eq!(redacted(&once).body.value, once.body.value);
    }

    #[test]
    fn bytes_that_do_not_decode_are_an_error_not_a_pass() {
        assert!(redact_encoded(ResourceType::Listener.type_url(), &[0xff, 0xff]).is_err());
        assert!(redact_encoded("type.googleapis.com/x.Unknown", &[]).is_err());
    }
}
