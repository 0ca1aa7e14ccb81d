//! Field ownership (`metadata.managedFields`) at leaf granularity, as server-side apply
//! tracks it: each entry (manager, operation, subresource) owns a set of leaf paths.
//!
//! A leaf is a value that is not a non-empty object: a scalar, an empty object or a
//! whole list (lists are atomic, as in a CRD without `x-kubernetes-list-type`).
//! Labels and annotations are maps, so each key is its own leaf.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::object::SERVER_METADATA;

/// A path of object keys from the root, e.g. `["spec", "holderIdentity"]`.
pub(crate) type FieldPath = Vec<String>;
pub(crate) type FieldSet = BTreeSet<FieldPath>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Apply,
    Update,
}

/// Who writes: the key of a managedFields entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Writer {
    pub(crate) manager: String,
    pub(crate) operation: Operation,
    pub(crate) subresource: Option<String>,
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub(crate) writer: Writer,
    pub(crate) api_version: String,
    pub(crate) time: String,
    pub(crate) fields: FieldSet,
}

/// A field another manager owns that a write would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub(crate) manager: String,
    pub(crate) api_version: String,
    pub(crate) path: FieldPath,
}

/// The leaves of `object` a manager can own (not `apiVersion`, `kind` nor the metadata
/// the server sets).
pub(crate) fn leaves(object: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(top) = object.as_object() else {
        return out;
    };
    for (key, value) in top {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for (mkey, mvalue) in value.as_object().into_iter().flatten() {
                    if !SERVER_METADATA.contains(&mkey.as_str()) {
                        walk(vec!["metadata".into(), mkey.clone()], mvalue, &mut out);
                    }
                }
            }
            _ => walk(vec![key.clone()], value, &mut out),
        }
    }
    out
}

fn walk(path: FieldPath, value: &Value, out: &mut FieldSet) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (key, child) in map {
                let mut child_path = path.clone();
                child_path.push(key.clone());
                walk(child_path, child, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// The value at `path`, if any.
pub(crate) fn get<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(object, |v, key| v.as_object()?.get(key))
}

/// Removes the value at `path`, and the maps left empty by it (but `metadata`).
pub(crate) fn remove(object: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(map) = object.as_object_mut() else {
        return;
    };
    if rest.is_empty() {
        map.remove(first);
        return;
    }
    if let Some(child) = map.get_mut(first) {
        remove(child, rest);
        let emptied = child.as_object().is_some_and(Map::is_empty);
        if emptied && first != "metadata" {
            map.remove(first);
        }
    }
}

/// Whether the value at a path differs between `old` and `new`. A map that stays a
/// map is not changed itself (its fields are).
fn changed(old: &Value, new: &Value, path: &[String]) -> bool {
    match (get(old, path), get(new, path)) {
        (Some(Value::Object(_)), Some(Value::Object(_))) => false,
        (before, after) => before != after,
    }
}

/// `.spec.holderIdentity`, as conflicts name fields.
pub(crate) fn display(path: &[String]) -> String {
    path.iter().map(|k| format!(".{k}")).collect()
}

/// The entries of `object`'s `metadata.managedFields` (unknown shapes are skipped).
pub(crate) fn read(object: &Value) -> Vec<Entry> {
    let Some(entries) = object["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let operation = match e["operation"].as_str()? {
                "Apply" => Operation::Apply,
                _ => Operation::Update,
            };
            let mut fields = FieldSet::new();
            decode(&e["fieldsV1"], &mut Vec::new(), &mut fields);
            Some(Entry {
                writer: Writer {
                    manager: e["manager"].as_str().unwrap_or_default().to_string(),
                    operation,
                    subresource: e["subresource"].as_str().map(str::to_string),
                },
                api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
                time: e["time"].as_str().unwrap_or_default().to_string(),
                fields,
            })
        })
        .collect()
}

fn decode(fields_v1: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    let Some(map) = fields_v1.as_object() else {
        return;
    };
    for (key, child) in map {
        if key == "." {
            out.insert(path.clone());
        } else if let Some(name) = key.strip_prefix("f:") {
            path.push(name.to_string());
            if child.as_object().is_none_or(Map::is_empty) {
                out.insert(path.clone());
            } else {
                decode(child, path, out);
            }
            path.pop();
        }
    }
}

/// Writes `entries` as `metadata.managedFields` (removing it when there are none).
pub(crate) fn write(object: &mut Value, entries: &[Entry]) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if entries.is_empty() {
        metadata.remove("managedFields");
        return;
    }
    let encoded = entries
        .iter()
        .map(|e| {
            let mut entry = json!({
                "manager": e.writer.manager,
                "operation": match e.writer.operation {
                    Operation::Apply => "Apply",
                    Operation::Update => "Update",
                },
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": encode(&e.fields),
            });
            if let Some(sub) = &e.writer.subresource {
                entry["subresource"] = json!(sub);
            }
            entry
        })
        .collect();
    metadata.insert("managedFields".into(), Value::Array(encoded));
}

fn encode(fields: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in fields {
        // Owning a map whose children are owned too: the "." marker. Paths extending
        // `path` come right after it in the set's order.
        let mut later = fields.range(path.clone()..).skip(1);
        let parent = later.next().is_some_and(|next| next.starts_with(path));
        insert(&mut root, path, parent);
    }
    Value::Object(root)
}

fn insert(node: &mut Map<String, Value>, path: &[String], marker: bool) {
    let Some((first, rest)) = path.split_first() else {
        if marker {
            node.insert(".".into(), json!({}));
        }
        return;
    };
    let child = node
        .entry(format!("f:{first}"))
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(child) = child {
        insert(child, rest, marker);
    }
}

/// The fields of `new` that entries other than `writer`'s would lose by the write
/// `old` → `new`, as conflicts.
pub(crate) fn conflicts(
    entries: &[Entry],
    writer: &Writer,
    old: &Value,
    new: &Value,
) -> Vec<Conflict> {
    entries
        .iter()
        .filter(|e| &e.writer != writer)
        .flat_map(|e| {
            e.fields
                .iter()
                .filter(|path| changed(old, new, path))
                .map(|path| Conflict {
                    manager: e.writer.manager.clone(),
                    api_version: e.api_version.clone(),
                    path: path.clone(),
                })
        })
        .collect()
}

/// Whether some entry other than `writer`'s owns `path`.
pub(crate) fn owned_by_other(entries: &[Entry], writer: &Writer, path: &FieldPath) -> bool {
    entries
        .iter()
        .any(|e| &e.writer != writer && e.fields.contains(path))
}

/// What `writer` owns after its write.
pub(crate) enum Claim {
    /// An apply: exactly these fields (the applied configuration); without `force`, it
    /// may not change fields other entries own.
    Apply { fields: FieldSet, force: bool },
    /// An update: what it owned, plus every leaf the write changed.
    Changed,
}

/// The entries after the write `old` → `new` by `writer`: other entries lose the
/// fields whose value changed or that are gone; `writer`'s entry owns what `claim`
/// says. Entries whose fields did not change keep their `time`.
pub(crate) fn record(
    entries: Vec<Entry>,
    writer: &Writer,
    claim: Claim,
    old: &Value,
    new: &Value,
    api_version: &str,
    now: &str,
) -> Vec<Entry> {
    let new_leaves = leaves(new);
    let differs = |path: &FieldPath| changed(old, new, path);
    let mut mine = match claim {
        Claim::Apply { fields, .. } => fields,
        Claim::Changed => {
            let mut fields: FieldSet = new_leaves.iter().filter(|p| differs(p)).cloned().collect();
            if let Some(e) = entries.iter().find(|e| &e.writer == writer) {
                fields.extend(e.fields.iter().cloned());
            }
            fields
        }
    };
    mine.retain(|p| new_leaves.contains(p));

    let mut out = Vec::with_capacity(entries.len() + 1);
    let mut found = false;
    for mut e in entries {
        let fields = if e.writer == *writer {
            found = true;
            std::mem::take(&mut mine)
        } else {
            e.fields
                .iter()
                .filter(|p| new_leaves.contains(*p) && !differs(p))
                .cloned()
                .collect()
        };
        if fields != e.fields || (e.writer == *writer && e.api_version != api_version) {
            e.fields = fields;
            e.time = now.to_string();
            if e.writer == *writer {
                e.api_version = api_version.to_string();
            }
        }
        if !e.fields.is_empty() {
            out.push(e);
        }
    }
    if !found && !mine.is_empty() {
        out.push(Entry {
            writer: writer.clone(),
            api_version: api_version.to_string(),
            time: now.to_string(),
            fields: mine,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> FieldPath {
        p.split('.').map(str::to_string).collect()
    }

    fn writer(manager: &str, operation: Operation) -> Writer {
        Writer {
            manager: manager.into(),
            operation,
            subresource: None,
        }
    }

    #[test]
    fn leaves_skip_server_metadata_and_keep_lists_whole() {
        let obj = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "uid": "u", "labels": {"app": "x"}},
            "data": {"k": "v"}, "list": [1, 2], "empty": {}
        });
        let expected: FieldSet = ["metadata.labels.app", "data.k", "list", "empty"]
            .into_iter()
            .map(path)
            .collect();
        assert_eq!(leaves(&obj), expected);
    }

    #[test]
    fn removing_a_field_removes_the_maps_it_leaves_empty() {
        let mut obj = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"x": {"y": 1}, "z": 2}});
        remove(&mut obj, &path("spec.x.y"));
        remove(&mut obj, &path("metadata.labels.a"));
        assert_eq!(obj, json!({"metadata": {}, "spec": {"z": 2}}));
    }

    #[test]
    fn a_map_filled_by_another_manager_is_no_conflict() {
        let old = json!({"spec": {}});
        let new = json!({"spec": {"holderIdentity": "b"}});
        let creator = writer("creator", Operation::Update);
        let entries = vec![Entry {
            writer: creator,
            api_version: "v1".into(),
            time: "t0".into(),
            fields: [path("spec")].into_iter().collect(),
        }];
        let applier = writer("applier", Operation::Apply);
        assert!(conflicts(&entries, &applier, &old, &new).is_empty());
    }

    #[test]
    fn managed_fields_round_trip_through_fields_v1() {
        let mut obj = json!({"metadata": {"name": "a"}});
        let entries = vec![Entry {
            writer: Writer {
                manager: "m".into(),
                operation: Operation::Apply,
                subresource: Some("status".into()),
            },
            api_version: "v1".into(),
            time: "t".into(),
            fields: [path("spec.a"), path("spec.b.c"), path("status")]
                .into_iter()
                .collect(),
        }];
        write(&mut obj, &entries);
        assert_eq!(
            obj["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:spec": {"f:a": {}, "f:b": {"f:c": {}}}, "f:status": {}})
        );
        assert_eq!(read(&obj), entries);
    }

    #[test]
    fn updates_take_changed_fields_from_other_managers() {
        let old = json!({"spec": {"a": 1, "b": 2}});
        let new = json!({"spec": {"a": 1, "b": 3, "c": 4}});
        let a = writer("a", Operation::Apply);
        let b = writer("b", Operation::Update);
        let entries = vec![Entry {
            writer: a.clone(),
            api_version: "v1".into(),
            time: "t0".into(),
            fields: [path("spec.a"), path("spec.b")].into_iter().collect(),
        }];
        assert_eq!(conflicts(&entries, &b, &old, &new).len(), 1);
        let after = record(entries, &b, Claim::Changed, &old, &new, "v1", "t1");
        assert_eq!(after[0].fields, [path("spec.a")].into_iter().collect());
        assert_eq!(after[0].time, "t1", "its fields changed");
        assert_eq!(
            after[1].fields,
            [path("spec.b"), path("spec.c")].into_iter().collect()
        );
    }
}
