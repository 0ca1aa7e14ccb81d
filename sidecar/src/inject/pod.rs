//! Reading the raw Pod JSON: typed views of the fields injection reads, each failing
//! with the field's path.

use std::collections::BTreeMap;

use marin3r_wire::quote::quoted;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::Error;

pub(super) fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::InvalidPod {
        field: field.to_string(),
        message: message.into(),
    }
}

/// `metadata[key]` as a map of strings, borrowed from the Pod.
pub(super) fn string_map<'a>(
    meta: Option<&'a Map<String, Value>>,
    key: &str,
) -> Result<BTreeMap<&'a str, &'a str>, Error> {
    match meta.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.as_str(), s.as_str())),
                _ => Err(invalid(
                    &format!("metadata.{key}[{}]", quoted(k)),
                    "must be a string",
                )),
            })
            .collect(),
        Some(_) => Err(invalid(
            &format!("metadata.{key}"),
            "must be a map of strings",
        )),
    }
}

/// `spec[key]` as a list: `(entries, present)`; absent and `null` are an empty list that
/// is not present.
pub(super) fn list<'a>(
    spec: &'a Map<String, Value>,
    key: &str,
) -> Result<(&'a [Value], bool), Error> {
    match spec.get(key) {
        None | Some(Value::Null) => Ok((&[], false)),
        Some(Value::Array(a)) => Ok((a, true)),
        Some(_) => Err(invalid(&format!("spec.{key}"), "must be a list")),
    }
}

pub(super) fn names(list: &[Value]) -> impl Iterator<Item = &str> {
    list.iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
}

pub(super) fn to_value<T: Serialize>(t: &T) -> Result<Value, Error> {
    serde_json::to_value(t).map_err(Error::Serialize)
}
