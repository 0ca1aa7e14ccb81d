//! Envoy's loader leniencies, as a rewrite of the input into the strict protojson that
//! prost-reflect reads.
//!
//! Envoy reads JSON and YAML config with protobuf's `JsonStringToMessage` (YAML is first
//! turned into JSON) with `case_insensitive_enum_parsing = true` and
//! `ignore_unknown_fields = false` (`MessageUtil::loadFromJson`,
//! `source/common/protobuf/utility.cc`); protobuf's JSON parser runs with its
//! `allow_legacy_syntax` on (`json.cc`: "TODO: Drop this setting"). Of what that
//! accepts beyond protojson (protobuf's `json/internal/parser.cc`), this module accepts:
//!
//! - an enum by its name in any case (`strict_dns`, `Round_Robin`), or by its number
//!   written as a string (`"1"`);
//! - a single value where a list is expected (`filters: {name: …}`, `domains: "*"`), a
//!   list nested in a list (flattened), and `null` in a list (the default element);
//! - a well-known type written as its plain message: `Duration` and `Timestamp` as
//!   `{seconds, nanos}`, a wrapper as `{value: …}`, `ListValue` as `{values: […]}`;
//! - a boolean written as a string (`"true"`, `"yes"`, `"0"`, … as absl's `SimpleAtob`);
//! - an empty `Any` written `{}` (an `Any` with other fields but no `@type` stays an
//!   error).
//!
//! Checked against Envoy 1.40's `--mode validate`
//! (`envoyconfig/tests/envoy_leniencies.rs`): enums in any case and as numeric strings,
//! one value for a list, nested lists, `Duration` and wrappers as objects, quoted
//! booleans, `{}` for an `Any`, `null` in a list (seen in the element index of Envoy's
//! later constraint error). Taken from the parser's source only: `Timestamp` and
//! `ListValue` as objects.
//!
//! How YAML scalars are typed before this rewrite (octal with a leading `0`, numbers
//! with underscores as text) is the YAML parser's part: see
//! [`crate::text::yaml_options`]. An untagged number or boolean given to a string
//! field is refused, as Envoy refuses an `int32` or a boolean there.
//!
//! Anything else is left as written, so prost-reflect reports it with its field path.
//! The rewrite also checks the `value` of a `TypedStruct` (`xds.type.v3` or `udpa.type.v1`)
//! against the message its `type_url` names when the registry has it, as Envoy does
//! when it turns the struct into that message.

use prost_reflect::{Kind, MessageDescriptor};
use serde_json::{Map, Value};

use crate::error::{DecodeError, Location, join_path, key_segment};
use crate::wellknown::{EMPTY_ANY_URL, is_empty_any_url, is_well_known, is_wrapper};
use crate::{pgv, registry, strict};

/// Rewrites `value` (a message of type `desc`) in place. Errors name the field path.
pub(crate) fn normalize(desc: &MessageDescriptor, value: &mut Value) -> Result<(), DecodeError> {
    message(desc, value, "")
}

fn message(desc: &MessageDescriptor, value: &mut Value, path: &str) -> Result<(), DecodeError> {
    match desc.full_name() {
        "google.protobuf.Any" => return any(value, path),
        "google.protobuf.Struct" | "google.protobuf.Value" => return Ok(()),
        "google.protobuf.ListValue" => {
            if let Some(values) = plain_message(value, &["values"], path)? {
                *value = values.into_iter().next().map_or(Value::Null, |(_, v)| v);
                if !value.is_array() && !value.is_null() {
                    *value = Value::Array(vec![value.take()]);
                }
            }
            return Ok(());
        }
        "google.protobuf.Duration" => {
            if let Some(fields) = plain_message(value, &["seconds", "nanos"], path)? {
                let (seconds, nanos) = seconds_nanos(&fields, path)?;
                *value = Value::String(duration_text(seconds, nanos));
            }
            return Ok(());
        }
        "google.protobuf.Timestamp" => {
            if let Some(fields) = plain_message(value, &["seconds", "nanos"], path)? {
                let (seconds, nanos) = seconds_nanos(&fields, path)?;
                *value = Value::String(timestamp_text(seconds, nanos, path)?);
            }
            return Ok(());
        }
        name if is_wrapper(name) => {
            if let Some(fields) = plain_message(value, &["value"], path)? {
                *value = fields.into_iter().next().map_or(Value::Null, |(_, v)| v);
            }
            if let Some(inner) = desc.get_field(1) {
                singular(&inner.kind(), value, path)?;
            }
            return Ok(());
        }
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

/// A repeated field: one value becomes a list of it, nested lists are flattened, `null`
/// elements become the default element (protobuf's legacy JSON syntax).
fn list(kind: &Kind, value: &mut Value, path: &str) -> Result<(), DecodeError> {
    if value.is_null() {
        return Ok(());
    }
    let free_form = matches!(kind, Kind::Message(m)
        if matches!(m.full_name(), "google.protobuf.Value" | "google.protobuf.ListValue"));
    let items = match value.take() {
        Value::Array(items) => items,
        single => vec![single],
    };
    let mut flat = Vec::with_capacity(items.len());
    flatten(items, free_form, kind, &mut flat);
    for (i, item) in flat.iter_mut().enumerate() {
        singular(kind, item, &format!("{path}[{i}]"))?;
    }
    *value = Value::Array(flat);
    Ok(())
}

fn flatten(items: Vec<Value>, free_form: bool, kind: &Kind, out: &mut Vec<Value>) {
    for item in items {
        match item {
            Value::Array(inner) if !free_form => flatten(inner, free_form, kind, out),
            Value::Null if !free_form && !is_null_value(kind) => out.push(default_of(kind)),
            other => out.push(other),
        }
    }
}

fn is_null_value(kind: &Kind) -> bool {
    matches!(kind, Kind::Enum(e) if e.full_name() == "google.protobuf.NullValue")
}

/// The protojson of a field's default value (what protobuf's legacy syntax puts for a
/// `null` list element).
fn default_of(kind: &Kind) -> Value {
    match kind {
        Kind::Message(_) => Value::Object(Map::new()),
        Kind::Bool => Value::Bool(false),
        Kind::String | Kind::Bytes => Value::String(String::new()),
        _ => Value::from(0),
    }
}

fn singular(kind: &Kind, value: &mut Value, path: &str) -> Result<(), DecodeError> {
    match kind {
        Kind::Message(desc) if !value.is_null() => message(desc, value, path),
        Kind::Enum(desc) if desc.full_name() != "google.protobuf.NullValue" => {
            if let Value::String(name) = value
                && desc.get_value_by_name(name).is_none()
            {
                if let Some(v) = desc.values().find(|v| v.name().eq_ignore_ascii_case(name)) {
                    *value = Value::String(v.name().to_string());
                } else if let Ok(number) = name.parse::<i32>() {
                    *value = Value::from(number);
                }
            }
            Ok(())
        }
        Kind::Bool => {
            if let Value::String(text) = value
                && let Some(flag) = simple_atob(text)
            {
                *value = Value::Bool(flag);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// absl's `SimpleAtob`, which protobuf's legacy syntax reads quoted booleans with.
fn simple_atob(text: &str) -> Option<bool> {
    const TRUE: [&str; 5] = ["true", "t", "yes", "y", "1"];
    const FALSE: [&str; 5] = ["false", "f", "no", "n", "0"];
    if TRUE.iter().any(|t| t.eq_ignore_ascii_case(text)) {
        Some(true)
    } else if FALSE.iter().any(|f| f.eq_ignore_ascii_case(text)) {
        Some(false)
    } else {
        None
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
    check_message(desc, &inner).map_err(|e| e.prefixed(&at))
}

/// Checks that strict protojson (already through this rewrite) is a `desc` that meets
/// Envoy's constraints ([`crate::pgv`]).
fn check_message(desc: MessageDescriptor, value: &Value) -> Result<(), DecodeError> {
    pgv::check(&strict::decode(desc, value)?)
}

/// A well-known type written as its plain message (`{seconds: 5}`): its fields, which
/// must be among `fields`; `None` when the value is not an object.
fn plain_message(
    value: &mut Value,
    fields: &[&str],
    path: &str,
) -> Result<Option<Vec<(String, Value)>>, DecodeError> {
    let Value::Object(map) = value else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (key, v) in std::mem::take(map) {
        if !fields.contains(&key.as_str()) {
            return Err(DecodeError::UnknownField {
                at: Location::new("", path),
                field: key,
            });
        }
        out.push((key, v));
    }
    out.sort_by_key(|(k, _)| fields.iter().position(|f| f == k));
    Ok(Some(out))
}

/// `seconds` (int64, a number or a string) and `nanos` (int32) of a plain
/// `Duration`/`Timestamp`.
fn seconds_nanos(fields: &[(String, Value)], path: &str) -> Result<(i64, i32), DecodeError> {
    let mut seconds = 0i64;
    let mut nanos = 0i32;
    for (key, v) in fields {
        let at = join_path(path, key);
        let n = match v {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15)
                    .map(|f| f as i64)
            }),
            Value::String(s) if !s.contains(char::is_whitespace) => s.parse::<i64>().ok(),
            Value::Null => Some(0),
            _ => None,
        };
        let Some(n) = n else {
            return Err(DecodeError::invalid(&at, "expected an integer"));
        };
        if key == "nanos" {
            nanos =
                i32::try_from(n).map_err(|_| DecodeError::invalid(&at, "integer out of range"))?;
        } else {
            seconds = n;
        }
    }
    Ok((seconds, nanos))
}

/// protojson's text of a duration (`5s`, `-1.500s`); out-of-range values are left for
/// prost-reflect to refuse.
fn duration_text(seconds: i64, nanos: i32) -> String {
    let negative = seconds < 0 || nanos < 0;
    let sign = if negative { "-" } else { "" };
    let (s, n) = (seconds.unsigned_abs(), nanos.unsigned_abs());
    if n == 0 {
        format!("{sign}{s}s")
    } else {
        format!("{sign}{s}.{n:09}s")
    }
}

/// RFC 3339 text of a timestamp (`1970-01-01T00:00:05Z`).
fn timestamp_text(seconds: i64, nanos: i32, path: &str) -> Result<String, DecodeError> {
    // 0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59Z, as protobuf allows.
    if !(-62_135_596_800..=253_402_300_799).contains(&seconds)
        || !(0..1_000_000_000).contains(&nanos)
    {
        return Err(DecodeError::invalid(path, "timestamp out of range"));
    }
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}")
    };
    Ok(format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}{frac}Z"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts() {
        assert_eq!(duration_text(5, 0), "5s");
        assert_eq!(duration_text(5, 500_000_000), "5.500000000s");
        assert_eq!(duration_text(0, -1), "-0.000000001s");
        assert_eq!(timestamp_text(5, 0, "").unwrap(), "1970-01-01T00:00:05Z");
        assert_eq!(
            timestamp_text(951_782_400, 1, "").unwrap(),
            "2000-02-29T00:00:00.000000001Z"
        );
        assert_eq!(simple_atob("YES"), Some(true));
        assert_eq!(simple_atob("0"), Some(false));
        assert_eq!(simple_atob("maybe"), None);
    }
}
