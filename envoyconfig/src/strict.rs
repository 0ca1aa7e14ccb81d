//! Strict protojson → message, as prost-reflect reads it (the input has already been
//! through the loader leniencies, [`crate::lenient`]), with prost-reflect's errors
//! turned into [`DecodeError`]s that name the field path
//! (`filter_chains[0].filters[0].typed_config`) and the kind of problem (unknown field,
//! unknown type URL, invalid value).

use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor};
use serde_json::Value;
use serde_path_to_error::Segment;

use crate::error::{DecodeError, Location, join_path, key_segment};

/// protojson → message, as prost-reflect reads it.
pub(crate) fn decode(
    desc: MessageDescriptor,
    value: &Value,
) -> Result<DynamicMessage, DecodeError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
