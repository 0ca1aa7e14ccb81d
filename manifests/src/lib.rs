//! Kubernetes manifests of MARIN3R. The CustomResourceDefinitions are generated from the
//! Rust types: EnvoyConfig, EnvoyConfigRevision and DiscoveryServiceReplica from
//! `marin3r-envoyconfig` ([`crds`], into `manifests/crds/`, which both
//! `manifests/default` and `manifests/operator` install), and the operator's DiscoveryService,
//! DiscoveryServiceCertificate and EnvoyDeployment from `marin3r-operator-api`
//! ([`operator_crds`], into `manifests/operator/crds/`). Each folder holds one file per
//! CRD plus a `kustomization.yaml`, kept in sync by this crate's tests.
//!
//! Regenerate the checked-in files after changing a CRD type:
//! `UPDATE_CRDS=1 cargo test -p marin3r-manifests` (or `marin3r crds` and
//! `marin3r crds --operator`, which print the same documents).
//!
//! [`kustomize`] renders the kustomizations under `manifests/` (install, discovery
//! service, examples) for the install tests. The monitoring component
//! `manifests/observability/` is read for its tests by `marin3r_testkit::observability`
//! (test support, not part of this crate's shipped code).
#![forbid(unsafe_code)]

pub mod kustomize;
pub mod olm;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
use marin3r_envoyconfig::discoveryservicereplica::DiscoveryServiceReplica;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;

/// Errors of manifest generation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot serialize CustomResourceDefinition {name} to YAML")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::SerializeError,
    },
    /// A source of the OLM bundle (the kustomize install it is generated from) that does
    /// not read as it must.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Header of every generated file under `manifests/crds/`.
pub const GENERATED_HEADER: &str = "# Generated from the Rust types by `marin3r crds`; do not edit.\n\
# Regenerate: UPDATE_CRDS=1 cargo test -p marin3r-manifests\n";

/// Header of every generated file under `manifests/operator/crds/`.
pub const OPERATOR_GENERATED_HEADER: &str = "# Generated from the Rust types by `marin3r crds --operator`; do not edit.\n\
# Regenerate: UPDATE_CRDS=1 cargo test -p marin3r-manifests\n";

/// The CustomResourceDefinitions of MARIN3R: EnvoyConfig, EnvoyConfigRevision and
/// DiscoveryServiceReplica (the reports of a discovery service's replicas,
/// `docs/ha.md`).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        EnvoyConfig::crd(),
        EnvoyConfigRevision::crd(),
        DiscoveryServiceReplica::crd(),
    ]
    .into_iter()
    .map(upstream_shape)
    .collect()
}

/// The CustomResourceDefinitions of the operator (`operator.marin3r.3scale.net`):
/// DiscoveryService, DiscoveryServiceCertificate and EnvoyDeployment.
pub fn operator_crds() -> Vec<CustomResourceDefinition> {
    marin3r_operator_api::crds()
        .into_iter()
        .map(upstream_shape)
        .collect()
}

/// The generated schema in the shape of upstream MARIN3R's (kubebuilder) CRDs, so that
/// ours are a safe upgrade of upstream v0.13's (OLM v1's CRD upgrade-safety preflight,
/// `manifests/tests/upstream_upgrade.rs`, docs/olm.md):
///
/// - no `nullable: true` (which the schema generator sets on every `Option` field):
///   upstream's fields are not nullable, and making one nullable is a change the
///   preflight refuses. The API server drops a `null` sent for a non-nullable field
///   without a default, which reads as an absent field, as `None`: the same objects;
/// - the root `apiVersion`, `kind` and `metadata` properties upstream's schemas have
///   (removing an existing field is refused), and no root `title`;
/// - int-or-string fields as controller-gen writes them (`anyOf: [integer, string]`
///   beside `x-kubernetes-int-or-string`), Kubernetes quantities with Kubernetes' own
///   quantity `pattern`: the values the API server accepts for them in a Pod or an HPA;
/// - `spec` not required at the root (upstream's is optional): an object without one
///   reaches our code as a DiscoveryService with the default spec, or as a malformed
///   object (`missing field spec`) that the EnvoyConfig and EnvoyDeployment webhooks
///   refuse and the controllers' lenient watches skip, naming it;
/// - the markers controller-gen writes for Kubernetes' own types ([`kubernetes_markers`]).
fn upstream_shape(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    if let Some(versions) = value["spec"]["versions"].as_array_mut() {
        for version in versions {
            let root = &mut version["schema"]["openAPIV3Schema"];
            kubebuilder_shape(root);
            if let Some(root) = root.as_object_mut() {
                root.remove("title");
                optional_spec(root);
                let properties = root
                    .entry("properties")
                    .or_insert_with(|| serde_json::json!({}));
                if let Some(properties) = properties.as_object_mut() {
                    for (name, schema) in [
                        ("apiVersion", root_api_version as fn() -> serde_json::Value),
                        ("kind", root_kind),
                        ("metadata", root_metadata),
                    ] {
                        properties.entry(name).or_insert_with(schema);
                    }
                }
            }
        }
    }
    serde_json::from_value(value).unwrap_or(crd)
}

/// Drops `spec` from the root's `required` (and `required` when that empties it).
fn optional_spec(root: &mut serde_json::Map<String, serde_json::Value>) {
    let Some(required) = root.get_mut("required").and_then(|r| r.as_array_mut()) else {
        return;
    };
    required.retain(|r| r != "spec");
    if required.is_empty() {
        root.remove("required");
    }
}

fn root_api_version() -> serde_json::Value {
    serde_json::json!({
        "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
        "type": "string",
    })
}

fn root_kind() -> serde_json::Value {
    serde_json::json!({
        "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
        "type": "string",
    })
}

fn root_metadata() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

/// Kubernetes' quantity format (apimachinery `resource.Quantity`, as controller-gen
/// writes it into CRDs).
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// How k8s-openapi describes a `Quantity` (the schema carries no other mark of it).
const QUANTITY_DESCRIPTION: &str = "Quantity is a fixed-point representation of a number.";

/// The rules of [`upstream_shape`] on a schema and every sub-schema (properties, items,
/// additionalProperties, allOf/anyOf/oneOf, not).
fn kubebuilder_shape(schema: &mut serde_json::Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    map.remove("nullable");
    kubernetes_markers(map);
    if map.get("x-kubernetes-int-or-string") == Some(&serde_json::Value::Bool(true)) {
        map.entry("anyOf")
            .or_insert_with(|| serde_json::json!([{"type": "integer"}, {"type": "string"}]));
        let quantity = map
            .get("description")
            .and_then(|d| d.as_str())
            .is_some_and(|d| d.starts_with(QUANTITY_DESCRIPTION));
        if quantity {
            map.entry("pattern")
                .or_insert_with(|| serde_json::json!(QUANTITY_PATTERN));
        }
    }
    if let Some(props) = map.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.values_mut().for_each(kubebuilder_shape);
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = map.get_mut(key) {
            kubebuilder_shape(child);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(list) = map.get_mut(key).and_then(|l| l.as_array_mut()) {
            list.iter_mut().for_each(kubebuilder_shape);
        }
    }
}

/// `metav1.Condition`'s `reason` pattern (as controller-gen writes it).
const CONDITION_REASON_PATTERN: &str = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// `metav1.Condition`'s `type` pattern (a qualified name).
const CONDITION_TYPE_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";

/// The Kubernetes types whose markers (from the Go types' `+structType`, `+listType`,
/// `+listMapKey` and `+kubebuilder:validation:Pattern` comments) controller-gen writes
/// into upstream's CRDs and k8s-openapi's schemas lack, each recognised by its exact set
/// of properties: (properties, markers on the object, markers on a property).
type Markers = (
    &'static [&'static str],
    &'static [(&'static str, MarkerValue)],
    &'static [(&'static str, &'static str, MarkerValue)],
);

/// A marker's value.
#[derive(Clone, Copy)]
enum MarkerValue {
    Str(&'static str),
    List(&'static [&'static str]),
}

impl MarkerValue {
    fn json(self) -> serde_json::Value {
        match self {
            MarkerValue::Str(s) => serde_json::Value::from(s),
            MarkerValue::List(l) => serde_json::Value::from(l.to_vec()),
        }
    }
}

const MAP_ATOMIC: (&str, MarkerValue) = ("x-kubernetes-map-type", MarkerValue::Str("atomic"));

const KUBERNETES_TYPES: &[Markers] = &[
    // metav1.LabelSelector
    (&["matchExpressions", "matchLabels"], &[MAP_ATOMIC], &[]),
    // corev1.NodeSelectorTerm
    (&["matchExpressions", "matchFields"], &[MAP_ATOMIC], &[]),
    // corev1.NodeSelector
    (&["nodeSelectorTerms"], &[MAP_ATOMIC], &[]),
    // corev1.SecretReference
    (&["name", "namespace"], &[MAP_ATOMIC], &[]),
    // corev1.ObjectReference
    (
        &[
            "apiVersion",
            "fieldPath",
            "kind",
            "name",
            "namespace",
            "resourceVersion",
            "uid",
        ],
        &[MAP_ATOMIC],
        &[],
    ),
    // corev1.PodAffinityTerm
    (
        &[
            "labelSelector",
            "matchLabelKeys",
            "mismatchLabelKeys",
            "namespaceSelector",
            "namespaces",
            "topologyKey",
        ],
        &[],
        &[
            (
                "matchLabelKeys",
                "x-kubernetes-list-type",
                MarkerValue::Str("atomic"),
            ),
            (
                "mismatchLabelKeys",
                "x-kubernetes-list-type",
                MarkerValue::Str("atomic"),
            ),
        ],
    ),
    // autoscalingv2.HPAScalingRules (with and without 1.33's `tolerance`)
    (
        &["policies", "selectPolicy", "stabilizationWindowSeconds"],
        &[],
        &[(
            "policies",
            "x-kubernetes-list-type",
            MarkerValue::Str("atomic"),
        )],
    ),
    (
        &[
            "policies",
            "selectPolicy",
            "stabilizationWindowSeconds",
            "tolerance",
        ],
        &[],
        &[(
            "policies",
            "x-kubernetes-list-type",
            MarkerValue::Str("atomic"),
        )],
    ),
    // corev1.ResourceRequirements
    (
        &["claims", "limits", "requests"],
        &[],
        &[
            ("claims", "x-kubernetes-list-type", MarkerValue::Str("map")),
            (
                "claims",
                "x-kubernetes-list-map-keys",
                MarkerValue::List(&["name"]),
            ),
        ],
    ),
    // metav1.Condition
    (
        &[
            "lastTransitionTime",
            "message",
            "observedGeneration",
            "reason",
            "status",
            "type",
        ],
        &[],
        &[
            (
                "reason",
                "pattern",
                MarkerValue::Str(CONDITION_REASON_PATTERN),
            ),
            ("type", "pattern", MarkerValue::Str(CONDITION_TYPE_PATTERN)),
        ],
    ),
    // autoscalingv2.MetricTarget: `value` and `averageValue` are quantities
    (
        &["averageUtilization", "averageValue", "type", "value"],
        &[],
        &[
            (
                "averageValue",
                "pattern",
                MarkerValue::Str(QUANTITY_PATTERN),
            ),
            ("value", "pattern", MarkerValue::Str(QUANTITY_PATTERN)),
        ],
    ),
];

/// Adds the markers of [`KUBERNETES_TYPES`] to `map` when its properties are exactly one
/// of those types'.
fn kubernetes_markers(map: &mut serde_json::Map<String, serde_json::Value>) {
    let Some(props) = map.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
    names.sort_unstable();
    let Some((_, own, children)) = KUBERNETES_TYPES
        .iter()
        .find(|(shape, _, _)| names == **shape)
    else {
        return;
    };
    for (key, value) in *own {
        map.insert((*key).to_string(), value.json());
    }
    if let Some(props) = map.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for (name, key, value) in *children {
            if let Some(child) = props.get_mut(*name).and_then(|c| c.as_object_mut()) {
                child.insert((*key).to_string(), value.json());
            }
        }
    }
}

/// Each CRD as a YAML file: (file name under `manifests/crds/`, content).
pub fn crd_files() -> Result<Vec<(String, String)>, Error> {
    files(crds(), GENERATED_HEADER)
}

/// Each operator CRD as a YAML file: (file name under `manifests/operator/crds/`,
/// content).
pub fn operator_crd_files() -> Result<Vec<(String, String)>, Error> {
    files(operator_crds(), OPERATOR_GENERATED_HEADER)
}

fn files(
    crds: Vec<CustomResourceDefinition>,
    header: &str,
) -> Result<Vec<(String, String)>, Error> {
    crds.into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| Error::Yaml {
                name: name.clone(),
                source,
            })?;
            let plural = name.split('.').next().unwrap_or_default();
            Ok((format!("{plural}.yaml"), format!("{header}---\n{yaml}")))
        })
        .collect()
}

/// `manifests/crds/kustomization.yaml`: lists the CRD files.
pub fn kustomization_yaml() -> Result<String, Error> {
    Ok(kustomization(&crd_files()?, GENERATED_HEADER))
}

/// `manifests/operator/crds/kustomization.yaml`: lists the operator CRD files.
pub fn operator_kustomization_yaml() -> Result<String, Error> {
    Ok(kustomization(
        &operator_crd_files()?,
        OPERATOR_GENERATED_HEADER,
    ))
}

fn kustomization(files: &[(String, String)], header: &str) -> String {
    let mut out = format!(
        "{header}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
    );
    for (file, _) in files {
        out.push_str(&format!("  - {file}\n"));
    }
    out
}

/// Every CRD as one multi-document YAML stream (what `marin3r crds` prints).
pub fn crds_yaml() -> Result<String, Error> {
    stream(crd_files()?, GENERATED_HEADER)
}

/// Every operator CRD as one multi-document YAML stream (what
/// `marin3r crds --operator` prints).
pub fn operator_crds_yaml() -> Result<String, Error> {
    stream(operator_crd_files()?, OPERATOR_GENERATED_HEADER)
}

fn stream(files: Vec<(String, String)>, header: &str) -> Result<String, Error> {
    let mut out = String::from(header);
    for (_, content) in files {
        out.push_str(content.trim_start_matches(header));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::json;

    use super::*;

    fn shaped(mut schema: serde_json::Value) -> serde_json::Value {
        kubebuilder_shape(&mut schema);
        schema
    }

    #[test]
    fn kubernetes_types_get_their_markers_by_shape_at_any_depth() {
        let selector = json!({"type": "object", "properties": {
            "matchExpressions": {"type": "array"}, "matchLabels": {"type": "object"}}});
        let term = json!({"type": "object", "properties": {
            "labelSelector": selector, "matchLabelKeys": {"type": "array"},
            "mismatchLabelKeys": {"type": "array"}, "namespaceSelector": selector,
            "namespaces": {"type": "array"}, "topologyKey": {"type": "string"}}});
        let out = shaped(json!({"type": "object", "properties": {
            "terms": {"type": "array", "items": term},
            "condition": {"type": "object", "properties": {
                "lastTransitionTime": {"type": "string"}, "message": {"type": "string"},
                "observedGeneration": {"type": "integer"}, "reason": {"type": "string"},
                "status": {"type": "string"}, "type": {"type": "string"}}},
            "resources": {"type": "object", "properties": {
                "claims": {"type": "array"}, "limits": {"type": "object"},
                "requests": {"type": "object"}}},
            "target": {"type": "object", "properties": {
                "averageUtilization": {"type": "integer"}, "averageValue": {"x-kubernetes-int-or-string": true},
                "type": {"type": "string"}, "value": {"x-kubernetes-int-or-string": true}}},
        }}));
        let term = &out["properties"]["terms"]["items"];
        assert_eq!(
            term["properties"]["labelSelector"]["x-kubernetes-map-type"],
            "atomic"
        );
        assert_eq!(
            term["properties"]["namespaceSelector"]["x-kubernetes-map-type"],
            "atomic"
        );
        assert_eq!(
            term["properties"]["matchLabelKeys"]["x-kubernetes-list-type"],
            "atomic"
        );
        assert_eq!(
            term["properties"]["mismatchLabelKeys"]["x-kubernetes-list-type"],
            "atomic"
        );
        assert!(
            term["properties"]["namespaces"]
                .get("x-kubernetes-list-type")
                .is_none()
        );
        assert!(term.get("x-kubernetes-map-type").is_none());
        let condition = &out["properties"]["condition"]["properties"];
        assert_eq!(condition["reason"]["pattern"], CONDITION_REASON_PATTERN);
        assert_eq!(condition["type"]["pattern"], CONDITION_TYPE_PATTERN);
        assert!(condition["message"].get("pattern").is_none());
        let claims = &out["properties"]["resources"]["properties"]["claims"];
        assert_eq!(claims["x-kubernetes-list-type"], "map");
        assert_eq!(claims["x-kubernetes-list-map-keys"], json!(["name"]));
        let target = &out["properties"]["target"]["properties"];
        assert_eq!(target["value"]["pattern"], QUANTITY_PATTERN);
        assert_eq!(target["averageValue"]["pattern"], QUANTITY_PATTERN);
        assert!(target["type"].get("pattern").is_none());
    }

    #[test]
    fn only_the_exact_shape_is_marked() {
        // A LabelSelector's properties plus one more is some other type.
        let out = shaped(json!({"type": "object", "properties": {
            "matchExpressions": {"type": "array"}, "matchLabels": {"type": "object"},
            "other": {"type": "string"}}}));
        assert!(out.get("x-kubernetes-map-type").is_none());
        let out = shaped(json!({"type": "object", "properties": {"name": {"type": "string"}}}));
        assert!(out.get("x-kubernetes-map-type").is_none());
        let out = shaped(json!({"type": "object", "properties": {
            "name": {"type": "string"}, "namespace": {"type": "string"}}}));
        assert_eq!(out["x-kubernetes-map-type"], "atomic");
    }

    #[test]
    fn spec_is_optional_at_the_root_of_every_crd() {
        for crd in crds().into_iter().chain(operator_crds()) {
            let value = serde_json::to_value(&crd).unwrap();
            for version in value["spec"]["versions"].as_array().unwrap() {
                let root = &version["schema"]["openAPIV3Schema"];
                let required = root["required"].as_array().cloned().unwrap_or_default();
                assert!(
                    !required.contains(&json!("spec")),
                    "{}",
                    value["metadata"]["name"]
                );
                assert!(root["properties"]["spec"].get("default").is_none());
            }
        }
        let mut root = json!({"required": ["spec"]}).as_object().unwrap().clone();
        optional_spec(&mut root);
        assert!(root.get("required").is_none());
        let mut root = json!({"required": ["spec", "x"]})
            .as_object()
            .unwrap()
            .clone();
        optional_spec(&mut root);
        assert_eq!(root["required"], json!(["x"]));
    }
}
