//! Envoy resource decoding: JSON or YAML (text or [`serde_json::Value`]) → protobuf, with
//! protojson semantics, resolved against the complete Envoy type registry
//! ([`crate::registry`]).
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

use std::fmt;

use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};
use prost_reflect::{
    DeserializeOptions, DynamicMessage, Kind, MessageDescriptor, ReflectMessage, SerializeOptions,
};
use prost_types::Any;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_path_to_error::Segment;

use crate::lenient::EMPTY_ANY_URL;
use crate::registry;
use crate::resource::{Resource, ResourceType, fnv1a64};

/// How the text of a resource (or of the deprecated `envoyResources` values) is written.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Serialization {
    /// JSON (the default, as upstream).
    #[default]
    Json,
    /// YAML (a superset of JSON).
    Yaml,
}

impl fmt::Display for Serialization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Serialization::Json => "json",
            Serialization::Yaml => "yaml",
        })
    }
}

/// Where a decoding problem is: which resource (`listener "https"`, may be empty) and
/// the field path (`spec.resources[3].value.filter_chains[0]`, may be empty).
///
/// Displays as the non-empty parts joined by `": "`, followed by `": "`, so errors read
/// `listener "https": filter_chains[0]: unknown field "bogus"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// The resource the problem belongs to, like `listener "https"`.
    pub resource: String,
    /// The field path, like `filter_chains[0].filters[0].typed_config`.
    pub path: String,
}

impl Location {
    pub(crate) fn new(resource: impl Into<String>, path: impl Into<String>) -> Self {
        Location {
            resource: resource.into(),
            path: path.into(),
        }
    }

    /// Prefixes the path (`spec.resources[3].value` + `filter_chains[0]`).
    pub fn prefix(&mut self, prefix: &str) {
        self.path = join_path(prefix, &self.path);
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.resource.is_empty() {
            write!(f, "{}: ", self.resource)?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        Ok(())
    }
}

/// Joins two field paths: `a` + `b` → `a.b`, `a` + `[0]` → `a[0]`.
pub(crate) fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) if path.starts_with('[') => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

/// Every way decoding or resolving a resource can fail. None of them carries secret
/// material: secret errors name the Secret and the key, never the data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The text is not valid JSON/YAML.
    #[error("{at}invalid {serialization}: {message}")]
    Syntax {
        at: Location,
        serialization: Serialization,
        message: String,
    },
    /// A field that the message type does not have.
    #[error("{at}unknown field {field:?}")]
    UnknownField { at: Location, field: String },
    /// An `Any` whose `@type` is not in the Envoy registry.
    #[error("{at}unknown type URL {type_url}")]
    UnknownType { at: Location, type_url: String },
    /// A value that does not fit its field (wrong type, bad duration, bad enum name, …).
    #[error("{at}{message}")]
    Invalid { at: Location, message: String },
    /// Certificate or key data that Envoy's TLS context loader refuses (placeholder PEM,
    /// unknown curve, …). The message names the field and the rule, never the data.
    #[error("{at}{message}")]
    TlsMaterial { at: Location, message: String },
    /// The resource has no (or an empty) name field.
    #[error("{at}missing resource name (field {field})")]
    MissingName { at: Location, field: &'static str },
    /// Two resources of one type share a name.
    #[error("{at}duplicate {kind} name {name:?} (first at {first})")]
    DuplicateName {
        at: Location,
        kind: ResourceType,
        name: String,
        first: String,
    },
    /// A referenced Kubernetes Secret does not exist.
    #[error("{at}secret {secret:?} not found")]
    MissingSecret { at: Location, secret: String },
    /// A referenced Kubernetes Secret lacks a key.
    #[error("{at}secret {secret:?} has no key {key:?}")]
    MissingSecretKey {
        at: Location,
        secret: String,
        key: String,
    },
    /// A referenced Kubernetes Secret has the wrong type.
    #[error("{at}secret {secret:?} has type {actual:?}, expected {expected:?}")]
    SecretType {
        at: Location,
        secret: String,
        expected: &'static str,
        actual: String,
    },
    /// `generateFromEndpointSlices` was used where no EndpointSlices can be listed.
    #[error("{at}generateFromEndpointSlices needs Kubernetes mode")]
    NeedsKubernetes { at: Location },
    /// An EnvoyConfig that is not well-formed (both forms, no value, wrong combination).
    #[error("{at}{message}")]
    Spec { at: Location, message: String },
    /// The embedded Envoy descriptor set is unusable (a broken build, not user input).
    #[error("Envoy type registry: {0}")]
    Registry(String),
}

impl From<registry::RegistryError> for DecodeError {
    fn from(e: registry::RegistryError) -> Self {
        DecodeError::Registry(e.0)
    }
}

impl DecodeError {
    /// Where the problem is (`None` for registry errors).
    pub fn location(&self) -> Option<&Location> {
        match self {
            DecodeError::Syntax { at, .. }
            | DecodeError::UnknownField { at, .. }
            | DecodeError::UnknownType { at, .. }
            | DecodeError::Invalid { at, .. }
            | DecodeError::TlsMaterial { at, .. }
            | DecodeError::MissingName { at, .. }
            | DecodeError::DuplicateName { at, .. }
            | DecodeError::MissingSecret { at, .. }
            | DecodeError::MissingSecretKey { at, .. }
            | DecodeError::SecretType { at, .. }
            | DecodeError::NeedsKubernetes { at }
            | DecodeError::Spec { at, .. } => Some(at),
            DecodeError::Registry(_) => None,
        }
    }

    fn location_mut(&mut self) -> Option<&mut Location> {
        match self {
            DecodeError::Syntax { at, .. }
            | DecodeError::UnknownField { at, .. }
            | DecodeError::UnknownType { at, .. }
            | DecodeError::Invalid { at, .. }
            | DecodeError::TlsMaterial { at, .. }
            | DecodeError::MissingName { at, .. }
            | DecodeError::DuplicateName { at, .. }
            | DecodeError::MissingSecret { at, .. }
            | DecodeError::MissingSecretKey { at, .. }
            | DecodeError::SecretType { at, .. }
            | DecodeError::NeedsKubernetes { at }
            | DecodeError::Spec { at, .. } => Some(at),
            DecodeError::Registry(_) => None,
        }
    }

    /// The same error with its path prefixed (`spec.resources[3].value` + `…`).
    pub fn prefixed(mut self, prefix: &str) -> Self {
        if let Some(at) = self.location_mut() {
            at.prefix(prefix);
        }
        self
    }

    pub(crate) fn spec(path: impl Into<String>, message: impl Into<String>) -> Self {
        DecodeError::Spec {
            at: Location::new("", path),
            message: message.into(),
        }
    }
}

/// Decodes one resource of type `kind` from a JSON value (already parsed from YAML or
/// JSON) with protojson semantics.
pub fn decode_resource(kind: ResourceType, value: &Value) -> Result<Resource, DecodeError> {
    let label = resource_label(kind, value);
    let desc = registry::message_descriptor(kind)?;
    let relabel = |mut e: DecodeError| {
        if let Some(at) = e.location_mut() {
            at.resource = label.clone();
        }
        e
    };
    let message = decode_message(desc, value).map_err(relabel)?;
    // The resource name first (marin3r's own rule), then Envoy's constraints.
    let resource = finish(kind, &message, label.clone())?;
    crate::pgv::check(&message).map_err(relabel)?;
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

/// YAML parser options for text whose errors end up in logs and statuses: an error names
/// the line and column but does not quote the input. (serde-saphyr's default source
/// snippet prints the offending lines, which may hold a Secret's data or an inline
/// private key; see docs/reliability.md.)
///
/// Comments: serde-saphyr (with its `comments` feature, which kube-client turns on for the
/// whole build anyway) buffers the comments it meets while looking ahead for the next
/// list item, 32 by default, and refuses the file beyond that ("too many buffered
/// comments"); Envoy's own example configs have more. The cap is raised to
/// [`MAX_BUFFERED_COMMENTS`]; their total size stays bounded by the parser's 64 MiB
/// comment budget.
///
/// Scalars are typed closer to Envoy's YAML loader (yaml-cpp, then protobuf's JSON
/// parser; `tests/envoy_leniencies.rs` §5): an integer with a leading `0` is octal
/// (`010` is 8, as Envoy and YAML 1.1 read it; YAML 1.2 would read 10), and a number
/// written with underscores (`1_000`) is text (yaml-cpp knows no underscores: Envoy
/// refuses it in a numeric field and keeps the text in a string field). Still typed
/// as numbers where Envoy keeps the text: floats (`1.50`), `0o`/`0b` integers, and
/// integers outside the `int32` range, so such a scalar in a string field is refused
/// (quote it).
pub fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        with_snippet: false,
        legacy_octal_numbers: true,
        underscored_numbers_as_strings: true,
        budget: serde_saphyr::budget! { max_buffered_comment_events: MAX_BUFFERED_COMMENTS },
    }
}

/// Comment lines allowed in a row where the YAML parser looks ahead (see [`yaml_options`]).
pub const MAX_BUFFERED_COMMENTS: usize = 100_000;

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
fn decode_message(desc: MessageDescriptor, value: &Value) -> Result<DynamicMessage, DecodeError> {
    let mut value = value.clone();
    crate::lenient::normalize(&desc, &mut value)?;
    strict_decode(desc, &value)
}

/// Checks that strict protojson (already through [`crate::lenient`]) is a `desc` that
/// meets Envoy's constraints ([`crate::pgv`]).
pub(crate) fn check_message(desc: MessageDescriptor, value: &Value) -> Result<(), DecodeError> {
    crate::pgv::check(&strict_decode(desc, value)?)
}

/// protojson → message, as prost-reflect reads it.
fn strict_decode(desc: MessageDescriptor, value: &Value) -> Result<DynamicMessage, DecodeError> {
    let mut track = serde_path_to_error::Track::new();
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let result = DynamicMessage::deserialize_with_options(
        desc,
        serde_path_to_error::Deserializer::new(value, &mut track),
        &options,
    );
    match result {
        Ok(message) => Ok(message),
        Err(err) => {
            let path = track.path();
            let segments: Vec<&Segment> = path.iter().collect();
            Err(classify(err.to_string(), &segments, value))
        }
    }
}

/// Turns prost-reflect's message into the matching error kind.
fn classify(message: String, segments: &[&Segment], input: &Value) -> DecodeError {
    let at = Location::new("", format_path(segments));
    if let Some(field) = message
        .strip_prefix("unrecognized field name '")
        .and_then(|m| m.strip_suffix('\''))
    {
        return DecodeError::UnknownField {
            at,
            field: field.to_string(),
        };
    }
    if let Some(name) = message
        .strip_prefix("message '")
        .and_then(|m| m.strip_suffix("' not found"))
    {
        // The Any at `path` names an unknown message: report its type URL as written.
        let type_url = value_at(input, segments)
            .and_then(|v| v.get("@type"))
            .and_then(Value::as_str)
            .map_or_else(|| format!("type.googleapis.com/{name}"), str::to_string);
        return DecodeError::UnknownType { at, type_url };
    }
    DecodeError::Invalid { at, message }
}

/// `filter_chains[0].filters[0].typed_config`; map keys that are not plain identifiers
/// are quoted: `typed_per_filter_config["envoy.filters.http.cors"]`.
fn format_path(segments: &[&Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out = join_path(&out, &key_segment(key));
            }
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    out
}

/// A path segment for a map key or field name: plain identifiers as they are, anything
/// else quoted in brackets (`["envoy.filters.http.cors"]`).
pub(crate) fn key_segment(key: &str) -> String {
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

fn value_at<'a>(root: &'a Value, segments: &[&Segment]) -> Option<&'a Value> {
    let mut current = root;
    for segment in segments {
        current = match segment {
            Segment::Seq { index } => current.get(*index)?,
            Segment::Map { key } => current.get(key.as_str())?,
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    Some(current)
}

/// The message as protojson with stable options (camelCase names, defaults skipped,
/// enums by name, 64-bit integers as strings).
/// An empty `Any` (decoded with the placeholder type [`EMPTY_ANY_URL`]) prints as `{}`.
fn message_to_json(message: &DynamicMessage) -> Result<Value, DecodeError> {
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
fn write_canonical_json(value: &Value, out: &mut Vec<u8>) {
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
enum EmptyAny {
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
fn canonical_bytes(
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
    fn paths_are_readable() {
        let segs = [
            Segment::Map {
                key: "filter_chains".into(),
            },
            Segment::Seq { index: 0 },
            Segment::Map {
                key: "envoy.filters.http.cors".into(),
            },
        ];
        let refs: Vec<&Segment> = segs.iter().collect();
        assert_eq!(
            format_path(&refs),
            r#"filter_chains[0]["envoy.filters.http.cors"]"#
        );
        assert_eq!(
            join_path("spec.resources[1].value", "a[0]"),
            "spec.resources[1].value.a[0]"
        );
        assert_eq!(join_path("spec.resources", "[1]"), "spec.resources[1]");
        assert_eq!(join_path("", "a"), "a");
        assert_eq!(join_path("a", ""), "a");
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let mut out = Vec::new();
        write_canonical_json(&json!({"b": [1, {"d": 1, "c": "x"}], "a": null}), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":null,"b":[1,{"c":"x","d":1}]}"#
        );
    }

    #[test]
    fn label_uses_either_spelling() {
        assert_eq!(
            resource_label(ResourceType::Endpoint, &json!({"clusterName": "x"})),
            r#"endpoint "x""#
        );
        assert_eq!(resource_label(ResourceType::Cluster, &json!({})), "cluster");
    }
}
