//! Schema pieces the derives cannot express, and the CRD fix-ups shared by the types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON, JSONSchemaProps,
};

/// A Kubernetes port: `int32` in 1–65535.
pub(crate) fn port(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": 1,
        "maximum": 65535
    })
}

/// A Go duration string (`"48h"`, `"1h30m"`), as `metav1.Duration` serialises.
pub(crate) fn go_duration(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string" })
}

/// The root schema of every CRD version, mutably.
fn root_schemas(crd: &mut CustomResourceDefinition) -> impl Iterator<Item = &mut JSONSchemaProps> {
    crd.spec
        .versions
        .iter_mut()
        .filter_map(|v| v.schema.as_mut())
        .filter_map(|s| s.open_api_v3_schema.as_mut())
}

/// Makes `spec` optional, defaulted to `{}` by the API server: upstream's DiscoveryService
/// has no required field, and its README applies one without any `spec`.
pub(crate) fn optional_spec(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for root in root_schemas(&mut crd) {
        if let Some(required) = root.required.as_mut() {
            required.retain(|r| r != "spec");
        }
        if root.required.as_ref().is_some_and(Vec::is_empty) {
            root.required = None;
        }
        if let Some(spec) = root.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            spec.default = Some(JSON(serde_json::json!({})));
        }
    }
    crd
}
