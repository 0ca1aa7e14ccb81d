//! Reading and writing the parts of an object's JSON the server cares about: its
//! metadata, its status, and which of its changes bump `generation`.

use serde_json::{Map, Value};

use super::error::ApiError;
use super::kinds::ResourceKind;

/// Metadata only the server sets: writes keep the stored values, and no manager owns
/// them.
pub(crate) const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// `metadata.<field>` as a string ("" if absent).
pub(crate) fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object["metadata"][field].as_str().unwrap_or_default()
}

/// Sets `metadata.<field>` (making `object` an object with a `metadata` map if needed).
pub(crate) fn set_meta(object: &mut Value, field: &str, value: Value) {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    if let Value::Object(top) = object {
        let metadata = top
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if !metadata.is_object() {
            *metadata = Value::Object(Map::new());
        }
        if let Value::Object(metadata) = metadata {
            metadata.insert(field.to_string(), value);
        }
    }
}

/// Removes `metadata.<field>`.
pub(crate) fn remove_meta(object: &mut Value, field: &str) {
    if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
        metadata.remove(field);
    }
}

/// A request body must be a JSON object whose `metadata`, if any, is an object.
pub(crate) fn check_shape(body: &Value) -> Result<(), ApiError> {
    match body {
        Value::Object(map) => match map.get("metadata") {
            None | Some(Value::Object(_)) => Ok(()),
            Some(_) => Err(ApiError::bad_request("metadata must be an object")),
        },
        _ => Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        )),
    }
}

/// Whether the object waits for finalizers: `metadata.finalizers` is non-empty.
pub(crate) fn has_finalizers(object: &Value) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
}

pub(crate) fn is_deleting(object: &Value) -> bool {
    object["metadata"]["deletionTimestamp"].is_string()
}

/// The owners' uids (`metadata.ownerReferences[].uid`).
pub(crate) fn owner_uids(object: &Value) -> Vec<&str> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str())
        .collect()
}

/// Removes `null` members of maps, recursively (a JSON null is an absent field once
/// the API server has decoded it).
pub(crate) fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Whether `old` → `new` changes what bumps `generation`: anything outside metadata,
/// and outside `.status` for kinds with a status subresource.
pub(crate) fn spec_changed(kind: &ResourceKind, old: &Value, new: &Value) -> bool {
    let outside = |v: &Value| -> Map<String, Value> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| match k.as_str() {
                "metadata" | "apiVersion" | "kind" => false,
                "status" => !kind.status_subresource,
                _ => true,
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    outside(old) != outside(new)
}

/// The `generation` of an object (0 if unset).
pub(crate) fn generation(object: &Value) -> i64 {
    object["metadata"]["generation"].as_i64().unwrap_or(0)
}

/// The object with only its type and metadata, as `PartialObjectMetadata`.
pub(crate) fn partial_metadata(object: &Value) -> Value {
    serde_json::json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": object["metadata"],
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn generation_ignores_metadata_and_status_of_status_kinds() {
        let plain = ResourceKind::new("", "v1", "configmaps", "ConfigMap");
        let with_status = plain.clone().with_status();
        let old = json!({"metadata": {"labels": {}}, "spec": 1, "status": 1});
        let labels = json!({"metadata": {"labels": {"a": "b"}}, "spec": 1, "status": 1});
        let status = json!({"metadata": {}, "spec": 1, "status": 2});
        let spec = json!({"metadata": {}, "spec": 2, "status": 1});
        assert!(!spec_changed(&with_status, &old, &labels));
        assert!(!spec_changed(&with_status, &old, &status));
        assert!(spec_changed(&plain, &old, &status));
        assert!(spec_changed(&with_status, &old, &spec));
    }

    #[test]
    fn nulls_are_absent_fields() {
        let mut v = json!({"a": null, "b": {"c": null, "d": 1}, "e": [null]});
        strip_nulls(&mut v);
        assert_eq!(v, json!({"b": {"d": 1}, "e": [null]}));
    }
}
