//! The operator's CRDs under `manifests/operator/crds/` are what the Rust types of
//! `marin3r-operator-api` generate, and their structure is upstream's
//! (operator-design.md §2.4, `manifests/tests/data/operator-crds-upstream-structure.yaml`)
//! plus exactly the [R] additions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("operator/crds")
}

fn expected_files() -> Vec<(String, String)> {
    let mut files = marin3r_manifests::operator_crd_files().unwrap();
    files.push((
        "kustomization.yaml".to_string(),
        marin3r_manifests::operator_kustomization_yaml().unwrap(),
    ));
    files
}

#[test]
fn checked_in_operator_crds_are_up_to_date() {
    let update = std::env::var_os("UPDATE_CRDS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (file, content) in expected_files() {
        let path = crds_dir().join(&file);
        if update {
            std::fs::create_dir_all(crds_dir()).unwrap();
            std::fs::write(&path, &content).unwrap();
            continue;
        }
        if std::fs::read_to_string(&path).ok().as_deref() != Some(content.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated CRDs: {stale:?}\nregenerate them with: UPDATE_CRDS=1 cargo test -p marin3r-manifests"
    );
    // Nothing else lives there.
    let present: BTreeSet<String> = std::fs::read_dir(crds_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = expected_files().into_iter().map(|(f, _)| f).collect();
    assert_eq!(present, expected);
}

#[test]
fn operator_crds_parse_and_the_stream_matches_the_files() {
    let docs: Vec<CustomResourceDefinition> =
        serde_saphyr::from_multiple(&marin3r_manifests::operator_crds_yaml().unwrap()).unwrap();
    let names: Vec<String> = docs
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "discoveryservices.operator.marin3r.3scale.net",
            "discoveryservicecertificates.operator.marin3r.3scale.net",
            "envoydeployments.operator.marin3r.3scale.net",
        ]
    );
    if std::env::var_os("UPDATE_CRDS").is_some() {
        return;
    }
    for (file, _) in marin3r_manifests::operator_crd_files().unwrap() {
        let text = std::fs::read_to_string(crds_dir().join(&file)).unwrap();
        let parsed: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        assert!(docs.contains(&parsed), "{file}");
    }
}

/// Upstream's structure (operator-design.md §2.4), by kind.
fn upstream(kind: &str) -> Value {
    let text = include_str!("data/operator-crds-upstream-structure.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
    docs.into_iter()
        .find(|d| d["spec"]["names"]["kind"] == kind)
        .unwrap_or_else(|| panic!("no upstream structure for {kind}"))
}

fn ours(kind: &str) -> Value {
    let crd = marin3r_manifests::operator_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    serde_json::to_value(crd).unwrap()
}

/// Schema keys that constrain values (what a [R] addition may add).
const VALIDATION_KEYS: [&str; 7] = [
    "minimum",
    "maximum",
    "enum",
    "default",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
];

/// Walks upstream's schema and ours side by side. Differences go to `diffs`; the
/// validation keys ours adds go to `added` as `path key`.
fn compare(path: &str, up: &Value, ours: &Value, diffs: &mut Vec<String>, added: &mut Vec<String>) {
    if ours.is_null() {
        diffs.push(format!("{path}: missing"));
        return;
    }
    if up.get("x-elided").is_some() {
        // A standard Kubernetes schema: k8s-openapi's, only the shape is checked.
        if up["type"] != ours["type"] {
            diffs.push(format!("{path}: type {} != {}", up["type"], ours["type"]));
        }
        let deep = ours.get("properties").or(ours["items"].get("properties"));
        if deep.is_none_or(|p| p.as_object().is_none_or(|m| m.is_empty())) {
            diffs.push(format!("{path}: the Kubernetes schema is empty"));
        }
        return;
    }
    for key in [
        "type",
        "format",
        "x-kubernetes-int-or-string",
        "x-kubernetes-map-type",
    ] {
        if up.get(key) != ours.get(key) {
            diffs.push(format!(
                "{path}: {key} {:?} != {:?}",
                up.get(key),
                ours.get(key)
            ));
        }
    }
    for key in VALIDATION_KEYS {
        match (up.get(key), ours.get(key)) {
            (Some(u), Some(o)) if u != o => diffs.push(format!("{path}: {key} {u} != {o}")),
            (Some(_), None) => diffs.push(format!("{path}: {key} missing")),
            (None, Some(_)) => added.push(format!("{path} {key}")),
            _ => {}
        }
    }
    let required = |v: &Value| -> BTreeSet<String> {
        v["required"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    if required(up) != required(ours) {
        diffs.push(format!(
            "{path}: required {:?} != {:?}",
            required(up),
            required(ours)
        ));
    }
    let keys = |v: &Value| -> BTreeSet<String> {
        v["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect()
    };
    for extra in keys(ours).difference(&keys(up)) {
        diffs.push(format!("{path}.{extra}: not upstream"));
    }
    for key in keys(up) {
        compare(
            &format!("{path}.{key}"),
            &up["properties"][&key],
            &ours["properties"][&key],
            diffs,
            added,
        );
    }
    if let Some(items) = up.get("items") {
        compare(&format!("{path}[]"), items, &ours["items"], diffs, added);
    }
}

struct Expect {
    kind: &'static str,
    /// Differences from upstream that are [R] decisions.
    diffs: &'static [&'static str],
    /// Validation the [R] items add on upstream's fields: none, so that our CRDs are a
    /// safe upgrade of upstream's (docs/olm.md "Upgrading over upstream's CRDs"); those
    /// rules are `validate()`'s (ranges, enums, the rules upstream's webhook checked).
    added: &'static [&'static str],
    /// Printer columns (name, jsonPath).
    columns: &'static [(&'static str, &'static str)],
}

const EXPECTED: [Expect; 3] = [
    Expect {
        kind: "DiscoveryService",
        diffs: &[
            // OpenShift (docs/operator.md "Security context"): optional securityContext
            // fields set over the generated ones, as Envoy Gateway's EnvoyProxy has.
            "spec.podSecurityContext: not upstream",
            // docs/ha.md §6 [R]: several replicas (default 3, at least 1).
            "spec.replicas: not upstream",
            "spec.securityContext: not upstream",
            // operator-design.md §8 Q11 [R]: conditions and observedGeneration.
            "status.conditions: not upstream",
            "status.observedGeneration: not upstream",
        ],
        added: &[],
        columns: &[
            ("Ready", ".status.deploymentStatus.readyReplicas"),
            ("Age", ".metadata.creationTimestamp"),
        ],
    },
    Expect {
        kind: "DiscoveryServiceCertificate",
        diffs: &[],
        added: &[],
        columns: &[
            ("Ready", ".status.ready"),
            ("Not Before", ".status.notBefore"),
            ("Not After", ".status.notAfter"),
        ],
    },
    Expect {
        kind: "EnvoyDeployment",
        diffs: &[
            // Extra Secret/ConfigMap volumes for Envoy (upstream issue #218), the rule of
            // the sidecar annotations (marin3r_sidecar::extra_volumes).
            "spec.extraVolumes: not upstream",
            // OpenShift (docs/operator.md "Security context"): optional securityContext
            // fields set over the generated ones, as Envoy Gateway's EnvoyProxy has.
            "spec.podSecurityContext: not upstream",
            "spec.securityContext: not upstream",
            "status.conditions: not upstream",
            "status.observedGeneration: not upstream",
        ],
        added: &[],
        columns: &[
            ("Replicas", ".status.deploymentStatus.replicas"),
            ("Ready", ".status.deploymentStatus.readyReplicas"),
            ("Age", ".metadata.creationTimestamp"),
        ],
    },
];

#[test]
fn structure_is_upstreams_plus_the_r_additions() {
    for expect in EXPECTED {
        let up = upstream(expect.kind);
        let ours = ours(expect.kind);
        let (u, o) = (&up["spec"], &ours["spec"]);
        for key in ["group", "scope"] {
            assert_eq!(u[key], o[key], "{} {key}", expect.kind);
        }
        for key in ["kind", "plural", "singular"] {
            assert_eq!(u["names"][key], o["names"][key], "{} {key}", expect.kind);
        }
        assert!(o["names"].get("shortNames").is_none(), "{}", expect.kind);
        assert_eq!(o["versions"].as_array().unwrap().len(), 1);
        let (uv, ov) = (&u["versions"][0], &o["versions"][0]);
        for key in ["name", "served", "storage", "subresources"] {
            assert_eq!(uv[key], ov[key], "{} {key}", expect.kind);
        }
        assert_eq!(ov["subresources"], json!({"status": {}}));

        let mut diffs = Vec::new();
        let mut added = Vec::new();
        let (us, os) = (
            &uv["schema"]["openAPIV3Schema"],
            &ov["schema"]["openAPIV3Schema"],
        );
        // The root: spec and status (apiVersion, kind, metadata are boilerplate).
        if us["type"] != os["type"] {
            diffs.push("(root): type".to_string());
        }
        let root_required = |v: &Value| -> BTreeSet<String> {
            v["required"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        if root_required(us) != root_required(os) {
            diffs.push(format!(
                "(root): required {:?} != {:?}",
                root_required(us),
                root_required(os)
            ));
        }
        for part in ["spec", "status"] {
            compare(
                part,
                &us["properties"][part],
                &os["properties"][part],
                &mut diffs,
                &mut added,
            );
        }
        added.sort();
        assert_eq!(
            diffs, expect.diffs,
            "{}: differences from upstream",
            expect.kind
        );
        assert_eq!(added, expect.added, "{}: validation added", expect.kind);

        let columns: Vec<(String, String)> = ov["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["jsonPath"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = expect
            .columns
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect();
        assert_eq!(columns, want, "{} printer columns", expect.kind);
        if expect.kind == "DiscoveryServiceCertificate" {
            assert_eq!(
                ov["additionalPrinterColumns"],
                uv["additionalPrinterColumns"]
            );
        }
    }
}

/// The rules upstream's schemas lacked are not in ours (they are `validate()`'s, which the
/// EnvoyDeployment webhook, `marin3r operator render` and the controllers run); the
/// schemas keep upstream's own (`drainStrategy`'s enum) and the rules of fields upstream
/// did not have (`replicas` of a DiscoveryService).
#[test]
fn upstream_fields_carry_no_added_rules() {
    let schema =
        |kind: &str| ours(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    let ed = schema("EnvoyDeployment");
    let spec = &ed["properties"]["spec"]["properties"];
    for node in [
        &spec["replicas"],
        &spec["replicas"]["properties"]["dynamic"],
        &spec["replicas"]["properties"]["static"],
        &spec["podDisruptionBudget"],
        &spec["adminPort"],
        &spec["shutdownManager"]["properties"]["serverPort"],
        &spec["shutdownManager"]["properties"]["drainTime"],
        &spec["ports"],
        &spec["ports"]["items"]["properties"]["port"],
    ] {
        for key in [
            "x-kubernetes-validations",
            "minimum",
            "maximum",
            "x-kubernetes-list-type",
        ] {
            assert!(node.get(key).is_none(), "{key} in {node}");
        }
    }
    assert_eq!(
        spec["shutdownManager"]["properties"]["drainStrategy"]["enum"],
        json!(["gradual", "immediate"])
    );
    let dsc = schema("DiscoveryServiceCertificate");
    assert!(
        dsc["properties"]["spec"]["properties"]["signer"]
            .get("x-kubernetes-validations")
            .is_none()
    );
    let ds = schema("DiscoveryService");
    let spec = &ds["properties"]["spec"];
    assert!(spec.get("default").is_none());
    assert!(
        spec["properties"]["serviceConfig"]["properties"]["type"]
            .get("enum")
            .is_none()
    );
    assert_eq!(
        spec["properties"]["replicas"]["minimum"].as_f64(),
        Some(1.0),
        "spec.replicas (not upstream's): at least 1"
    );
    for root in [&ed, &dsc, &ds] {
        assert!(root.get("required").is_none(), "{root}");
    }
}
