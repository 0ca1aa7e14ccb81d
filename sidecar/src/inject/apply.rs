//! Carrying an [`Injection`] out: as the admission response's JSON patch, or as the
//! injected Pod. Both walk the same edits.

use serde_json::{Map, Value};

use super::edit::{Added, GraceEdit, Injection, LISTS};
use super::patch::{InjectionPatch, OpValue, add, remove};

impl<F: Added> Injection<'_, F> {
    /// The JSON patch (RFC 6902) that turns the Pod into [`Injection::into_pod`], built from
    /// the edits, never from a diff of two trees: removals (from the end), lifecycle
    /// changes of kept containers, appends, the grace period and the status annotation.
    /// Nothing else of the Pod is touched, fields this build does not know included.
    /// Objects an earlier injection added that come back unchanged stay in place, so
    /// re-injecting an injected Pod gives an empty patch.
    pub fn patch(self) -> InjectionPatch<F> {
        let mut ops = Vec::new();
        for (key, mut edit) in LISTS.iter().zip(self.lists) {
            if !edit.present {
                if !edit.appended.is_empty() {
                    ops.push(add(&["spec", key], OpValue::List(edit.appended)));
                }
                continue;
            }
            let (tail, reused) = edit.reused_tail();
            for i in (0..edit.original.len()).rev() {
                if edit.removed[i] && !(tail..tail + reused).contains(&i) {
                    ops.push(remove(&["spec", key, &i.to_string()]));
                }
            }
            let kept: Vec<(usize, &Value)> = edit.kept().collect();
            for (at, (i, entry)) in kept.into_iter().enumerate() {
                let Some(after) = edit.lifecycle.remove(&i) else {
                    continue;
                };
                let index = at.to_string();
                let path = ["spec", key, index.as_str(), "lifecycle"];
                match (entry.get("lifecycle"), after) {
                    (before, Some(after)) if before != Some(&after) => {
                        ops.push(add(&path, OpValue::Value(after)));
                    }
                    (Some(_), None) => ops.push(remove(&path)),
                    _ => {}
                }
            }
            for entry in edit.appended.into_iter().skip(reused) {
                ops.push(add(&["spec", key, "-"], OpValue::Added(entry)));
            }
        }
        let at = |parent: &str, key: &str| self.pod.get(parent).and_then(|p| p.get(key));
        let original_grace = at("spec", "terminationGracePeriodSeconds");
        match self.grace {
            GraceEdit::Set(v) if original_grace != Some(&Value::from(v)) => {
                ops.push(add(
                    &["spec", "terminationGracePeriodSeconds"],
                    OpValue::Value(v.into()),
                ));
            }
            GraceEdit::Remove if original_grace.is_some() => {
                ops.push(remove(&["spec", "terminationGracePeriodSeconds"]));
            }
            _ => {}
        }
        match at("metadata", "annotations") {
            Some(Value::Object(a)) => {
                if a.get(marin3r_wire::SIDECAR_STATUS_ANNOTATION)
                    .and_then(Value::as_str)
                    != Some(self.status.as_str())
                {
                    ops.push(add(
                        &[
                            "metadata",
                            "annotations",
                            marin3r_wire::SIDECAR_STATUS_ANNOTATION,
                        ],
                        OpValue::Value(Value::String(self.status)),
                    ));
                }
            }
            _ => {
                let mut a = Map::new();
                a.insert(
                    marin3r_wire::SIDECAR_STATUS_ANNOTATION.into(),
                    Value::String(self.status),
                );
                ops.push(add(
                    &["metadata", "annotations"],
                    OpValue::Value(Value::Object(a)),
                ));
            }
        }
        InjectionPatch(ops)
    }
}

impl Injection<'_> {
    /// The injected Pod: a copy of the Pod with the edits applied.
    pub fn into_pod(self) -> Value {
        let mut out = self.pod.clone();
        if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
            for (key, mut edit) in LISTS.iter().zip(self.lists) {
                let slot = spec
                    .entry(key.to_string())
                    .or_insert_with(|| Value::Array(Vec::new()));
                let mut entries = match std::mem::take(slot) {
                    Value::Array(a) => a,
                    _ => Vec::new(),
                };
                let mut i = 0;
                entries.retain(|_| {
                    i += 1;
                    !edit.removed[i - 1]
                });
                let kept: Vec<usize> = edit.kept().map(|(i, _)| i).collect();
                for (i, entry) in kept.into_iter().zip(entries.iter_mut()) {
                    let (Some(after), Some(obj)) =
                        (edit.lifecycle.remove(&i), entry.as_object_mut())
                    else {
                        continue;
                    };
                    match after {
                        Some(l) => obj.insert("lifecycle".into(), l),
                        None => obj.remove("lifecycle"),
                    };
                }
                entries.append(&mut edit.appended);
                *slot = Value::Array(entries);
            }
            match self.grace {
                GraceEdit::Keep => None,
                GraceEdit::Set(v) => spec.insert("terminationGracePeriodSeconds".into(), v.into()),
                GraceEdit::Remove => spec.remove("terminationGracePeriodSeconds"),
            };
        }
        if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !annotations.is_object() {
                *annotations = Value::Object(Map::new());
            }
            if let Some(a) = annotations.as_object_mut() {
                a.insert(
                    marin3r_wire::SIDECAR_STATUS_ANNOTATION.into(),
                    Value::String(self.status),
                );
            }
        }
        out
    }
}
