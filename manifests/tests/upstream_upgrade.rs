//! Our CRDs are a safe upgrade of upstream MARIN3R v0.13.1's (github 3scale-ops/marin3r
//! tag v0.13.1, 4b8752a, `config/crd/bases/`, kept in `manifests/tests/data/upstream-crds/`): what
//! OLM v1's CRD upgrade-safety preflight (operator-controller with kubernetes-sigs/crdify,
//! descriptions not enforced, new enum values allowed, every other change fail-closed)
//! refuses, and what OLM v0 and `kubectl apply` users would trip over the same way:
//!
//! - the scope changes, or a stored version is no longer served;
//! - a field upstream had is gone (existing objects would lose it);
//! - a field's type changes; an enum is added to an existing field or loses a value; a
//!   default is added, changed or removed; a field becomes required; a maximum
//!   (`maximum`, `maxLength`, `maxItems`, `maxProperties`) is added or lowered, a minimum
//!   added or raised; a `pattern` or `nullable` changes;
//! - any other change to a schema keyword of an existing field (`format`,
//!   `x-kubernetes-*`, `anyOf`, ...): crdify has no rule for it and fails closed.
//!
//! New fields, new versions and new CRDs (DiscoveryServiceReplica) are allowed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

fn upstream_crds() -> BTreeMap<String, Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/upstream-crds");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
            for crd in docs
                .into_iter()
                .filter(|d| d["kind"] == "CustomResourceDefinition")
            {
                out.insert(crd["metadata"]["name"].as_str().unwrap().to_string(), crd);
            }
        }
    }
    out
}

fn our_crds() -> BTreeMap<String, Value> {
    marin3r_manifests::crds()
        .into_iter()
        .chain(marin3r_manifests::operator_crds())
        .map(|c| {
            let v = serde_json::to_value(&c).unwrap();
            (v["metadata"]["name"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

/// Keywords a rule below handles, or that are walked as children.
const HANDLED: [&str; 18] = [
    "description",
    "properties",
    "items",
    "additionalProperties",
    "type",
    "enum",
    "default",
    "required",
    "maximum",
    "maxLength",
    "maxItems",
    "maxProperties",
    "minimum",
    "minLength",
    "minItems",
    "minProperties",
    "pattern",
    "nullable",
];

/// Every upgrade-safety violation between two schemas of the same field.
fn compare(old: &Value, new: &Value, path: &str, out: &mut Vec<String>) {
    let mut flag = |rule: &str, detail: String| out.push(format!("{path}: {rule}: {detail}"));
    if old["type"] != new["type"] {
        flag(
            "type changed",
            format!("{} -> {}", old["type"], new["type"]),
        );
    }
    match (old["enum"].as_array(), new["enum"].as_array()) {
        (None, Some(_)) => flag("enum added", format!("{}", new["enum"])),
        (Some(o), Some(n)) => {
            for v in o.iter().filter(|v| !n.contains(v)) {
                flag("enum value removed", v.to_string());
            }
        }
        (Some(_), None) | (None, None) => {}
    }
    if old.get("default") != new.get("default") {
        flag(
            "default changed",
            format!("{:?} -> {:?}", old.get("default"), new.get("default")),
        );
    }
    let old_required: Vec<&Value> = old["required"].as_array().into_iter().flatten().collect();
    for r in new["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| !old_required.contains(r))
    {
        flag(&format!("new required field {r}"), String::new());
    }
    for key in ["maximum", "maxLength", "maxItems", "maxProperties"] {
        match (old[key].as_f64(), new[key].as_f64()) {
            (None, Some(n)) => flag(&format!("{key} added"), n.to_string()),
            (Some(o), Some(n)) if n < o => flag(&format!("{key} lowered"), format!("{o} -> {n}")),
            _ => {}
        }
    }
    for key in ["minimum", "minLength", "minItems", "minProperties"] {
        match (old[key].as_f64(), new[key].as_f64()) {
            (None, Some(n)) => flag(&format!("{key} added"), n.to_string()),
            (Some(o), Some(n)) if n > o => flag(&format!("{key} raised"), format!("{o} -> {n}")),
            _ => {}
        }
    }
    for key in ["pattern", "nullable"] {
        if old.get(key) != new.get(key) {
            flag(
                &format!("{key} changed"),
                format!("{:?} -> {:?}", old.get(key), new.get(key)),
            );
        }
    }
    // Everything else fails closed.
    let keys: std::collections::BTreeSet<&String> = old
        .as_object()
        .into_iter()
        .flatten()
        .chain(new.as_object().into_iter().flatten())
        .map(|(k, _)| k)
        .filter(|k| !HANDLED.contains(&k.as_str()))
        .collect();
    for k in keys {
        if old.get(k) != new.get(k) {
            flag(
                &format!("{k} changed (no crdify rule, fails closed)"),
                format!("{:?} -> {:?}", old.get(k), new.get(k)),
            );
        }
    }
    // additionalProperties: a schema is walked, a boolean must stay.
    match (&old["additionalProperties"], &new["additionalProperties"]) {
        (Value::Object(_), Value::Object(_)) => compare(
            &old["additionalProperties"],
            &new["additionalProperties"],
            &format!("{path}.additionalProperties"),
            out,
        ),
        (o, n) if o != n => out.push(format!(
            "{path}: additionalProperties changed (no crdify rule, fails closed): {o} -> {n}"
        )),
        _ => {}
    }
    for (name, old_prop) in old["properties"].as_object().into_iter().flatten() {
        let child = format!("{path}.{name}");
        match new["properties"].get(name) {
            Some(new_prop) => compare(old_prop, new_prop, &child, out),
            None => out.push(format!("{child}: existing field removed")),
        }
    }
    if old["items"].is_object() {
        if new["items"].is_object() {
            compare(&old["items"], &new["items"], &format!("{path}[*]"), out);
        } else {
            out.push(format!("{path}[*]: existing field removed (items)"));
        }
    }
}

/// Every violation of upgrading from `old` to `new` CRDs (by name).
fn upgrade_problems(old: &BTreeMap<String, Value>, new: &BTreeMap<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, o) in old {
        let Some(n) = new.get(name) else {
            out.push(format!("{name}: CRD removed"));
            continue;
        };
        if o["spec"]["scope"] != n["spec"]["scope"] {
            out.push(format!("{name}: scope changed"));
        }
        let versions = |crd: &Value| -> BTreeMap<String, Value> {
            crd["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap_or_default().to_string(),
                        v.clone(),
                    )
                })
                .collect()
        };
        let (ov, nv) = (versions(o), versions(n));
        for (vname, over) in &ov {
            let Some(nver) = nv.get(vname) else {
                out.push(format!("{name} {vname}: version removed"));
                continue;
            };
            if over["storage"] == true && nver["served"] != true {
                out.push(format!("{name} {vname}: stored version no longer served"));
            }
            compare(
                &over["schema"]["openAPIV3Schema"],
                &nver["schema"]["openAPIV3Schema"],
                &format!("{name} {vname} ^"),
                &mut out,
            );
        }
    }
    out
}

/// No violation at all: every rule our schemas would add on upstream's fields is the Rust
/// validation's (docs/olm.md "Upgrading over upstream's CRDs").
#[test]
fn our_crds_are_a_safe_upgrade_of_upstream_v0_13() {
    let old = upstream_crds();
    assert_eq!(old.len(), 5, "upstream's five CRDs");
    let found = upgrade_problems(&old, &our_crds());
    assert!(
        found.is_empty(),
        "{} upgrade-safety violations over upstream v0.13.1:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_upgrade_checker_catches_what_it_checks() {
    let old = upstream_crds();
    let name = "envoyconfigs.marin3r.3scale.net";
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Mutation, &str)> = vec![
        (
            "a removed field",
            Box::new(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["properties"]
                    .as_object_mut()
                    .unwrap()
                    .remove("nodeID");
            }),
            "existing field removed",
        ),
        (
            "a new required field",
            Box::new(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["required"]
                    .as_array_mut()
                    .unwrap()
                    .push(Value::from("envoyAPI"))
            }),
            "new required field",
        ),
        (
            "a new enum",
            Box::new(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["nodeID"]["enum"] = serde_json::json!(["a"])
            }),
            "enum added",
        ),
        (
            "a new default",
            Box::new(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["nodeID"]["default"] = serde_json::json!("a")
            }),
            "default changed",
        ),
        (
            "a tighter bound",
            Box::new(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["nodeID"]["maxLength"] = serde_json::json!(3)
            }),
            "maxLength added",
        ),
        (
            "a changed type",
            Box::new(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["nodeID"]["type"] = serde_json::json!("integer")
            }),
            "type changed",
        ),
        (
            "a stored version dropped",
            Box::new(|c| c["spec"]["versions"][0]["served"] = serde_json::json!(false)),
            "stored version no longer served",
        ),
    ];
    for (what, mutate, expected) in cases {
        let mut new = old.clone();
        mutate(new.get_mut(name).unwrap());
        let problems = upgrade_problems(&old, &new);
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "{what}: expected {expected:?} in {problems:?}"
        );
    }
    assert!(upgrade_problems(&old, &old).is_empty());
}
