//! The `EnvoyConfigRevision` custom resource (`marin3r.3scale.net/v1alpha1`, short name
//! `ecr`, design.md §4): one immutable version of an EnvoyConfig's resources. The
//! EnvoyConfig controller creates one per distinct
//! [`config_version`](crate::envoyconfig::config_version) and deletes the oldest beyond
//! ten; the revision controller publishes the elected one into the xDS cache and reports
//! `published`, `tainted` and the per-type versions.
//!
//! Field names, printer columns, labels and conditions follow upstream MARIN3R, so
//! `kubectl get ecr` reads the same.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envoyconfig::{EnvoyApi, EnvoyConfigSpec, EnvoyResources, ResourceSpec};
use crate::resource::ResourceType;
use crate::text::Serialization;

/// Condition: this revision is the one served for its node.
pub const REVISION_PUBLISHED: &str = "RevisionPublished";
/// Condition: this revision must not be published (rejected by Envoy, or undecodable).
pub const REVISION_TAINTED: &str = "RevisionTainted";
/// Condition: the cache holds this revision's resources with the current Secrets and
/// EndpointSlices.
pub const RESOURCES_IN_SYNC: &str = "ResourcesInSync";

/// One version of an EnvoyConfig's resources for one node id.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "marin3r.3scale.net",
    version = "v1alpha1",
    kind = "EnvoyConfigRevision",
    plural = "envoyconfigrevisions",
    namespaced,
    shortname = "ecr",
    status = "EnvoyConfigRevisionStatus",
    derive = "PartialEq",
    doc = "EnvoyConfigRevision is an internal resource that stores a specific version of an \
           EnvoyConfig's resources. EnvoyConfigRevisions are created and deleted by the \
           EnvoyConfig controller; use EnvoyConfig objects instead.",
    printcolumn = r#"{"name": "Node ID", "type": "string", "jsonPath": ".spec.nodeID"}"#,
    printcolumn = r#"{"name": "Envoy API", "type": "string", "jsonPath": ".spec.envoyAPI"}"#,
    printcolumn = r#"{"name": "Version", "type": "string", "jsonPath": ".spec.version"}"#,
    printcolumn = r#"{"name": "Published", "type": "boolean", "jsonPath": ".status.published"}"#,
    printcolumn = r#"{"name": "Created At", "type": "string", "format": "date-time", "jsonPath": ".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name": "Last Published At", "type": "string", "format": "date-time", "jsonPath": ".status.lastPublishedAt"}"#,
    printcolumn = r#"{"name": "Tainted", "type": "boolean", "jsonPath": ".status.tainted"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigRevisionSpec {
    /// The Envoy node id these resources are served to.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// Hash of the resources (the EnvoyConfig's config version).
    pub version: String,
    /// Envoy API version; only `v3` exists (the default).
    #[serde(rename = "envoyAPI", default, skip_serializing_if = "Option::is_none")]
    pub envoy_api: Option<EnvoyApi>,
    /// Format of the strings in the deprecated `envoyResources` (`json` if unset). The
    /// schema also admits upstream's `b64json` (its CRD listed it; dropping a value is an
    /// unsafe upgrade, docs/olm.md), which no EnvoyConfig can produce: a revision carrying
    /// it does not decode and the discovery service skips it, naming the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "revision_serialization_schema")]
    pub serialization: Option<Serialization>,
    /// The resources, one entry each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceSpec>>,
    /// DEPRECATED: use `resources`. Resources as serialized strings, grouped by type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_resources: Option<EnvoyResources>,
}

/// `spec.serialization` of a revision: [`Serialization`]'s values plus upstream's
/// `b64json`.
fn revision_serialization_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": [Serialization::Json.to_string(), UPSTREAM_B64JSON, Serialization::Yaml.to_string()]
    })
}

/// The `serialization` value upstream's EnvoyConfigRevision CRD listed beside `json` and
/// `yaml`.
const UPSTREAM_B64JSON: &str = "b64json";

impl EnvoyConfigRevisionSpec {
    /// The revision of `spec` with config version `version`.
    pub fn from_config(spec: &EnvoyConfigSpec, version: impl Into<String>) -> Self {
        Self {
            node_id: spec.node_id.clone(),
            version: version.into(),
            envoy_api: Some(spec.envoy_api.unwrap_or_default()),
            serialization: spec.serialization,
            resources: spec.resources.clone(),
            envoy_resources: spec.envoy_resources.clone(),
        }
    }

    /// The EnvoyConfig spec this revision publishes (what [`crate::envoyconfig::resolve`]
    /// takes).
    pub fn config_spec(&self) -> EnvoyConfigSpec {
        EnvoyConfigSpec {
            node_id: self.node_id.clone(),
            envoy_api: self.envoy_api,
            serialization: self.serialization,
            resources: self.resources.clone(),
            envoy_resources: self.envoy_resources.clone(),
        }
    }
}

/// Observed state of an EnvoyConfigRevision.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigRevisionStatus {
    /// Whether this revision is the one currently served for its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// The version this revision publishes for each resource type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provides_versions: Option<VersionTracker>,
    /// The last time this revision became the published one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_published_at: Option<Time>,
    /// Whether this revision is excluded from publishing (never cleared: delete the
    /// revision to try the same config again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tainted: Option<bool>,
    /// `RevisionPublished`, `RevisionTainted`, `ResourcesInSync`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl EnvoyConfigRevisionStatus {
    /// `published: true`.
    pub fn is_published(&self) -> bool {
        self.published == Some(true)
    }

    /// `tainted: true`.
    pub fn is_tainted(&self) -> bool {
        self.tainted == Some(true)
    }

    /// The condition of type `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// The version a revision publishes for each resource type (upstream's field names).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionTracker {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoped_routes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listeners: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtimes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_configs: Option<String>,
}

impl VersionTracker {
    fn slot(&mut self, t: ResourceType) -> &mut Option<String> {
        match t {
            ResourceType::Endpoint => &mut self.endpoints,
            ResourceType::Cluster => &mut self.clusters,
            ResourceType::Route => &mut self.routes,
            ResourceType::ScopedRoute => &mut self.scoped_routes,
            ResourceType::Listener => &mut self.listeners,
            ResourceType::Secret => &mut self.secrets,
            ResourceType::Runtime => &mut self.runtimes,
            ResourceType::ExtensionConfig => &mut self.extension_configs,
        }
    }

    /// The versions of a snapshot (see [`crate::Snapshot::versions`]).
    pub fn from_versions(versions: &BTreeMap<ResourceType, String>) -> Self {
        let mut tracker = Self::default();
        for (t, v) in versions {
            *tracker.slot(*t) = Some(v.clone());
        }
        tracker
    }

    /// Back to a per-type map (types without a version are left out).
    pub fn to_versions(&self) -> BTreeMap<ResourceType, String> {
        let mut copy = self.clone();
        ResourceType::ALL
            .into_iter()
            .filter_map(|t| copy.slot(t).take().map(|v| (t, v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::{CustomResourceExt as _, Resource as _};

    #[test]
    fn the_derive_literals_are_the_wire_facts() {
        // `#[kube(group, version)]` and `#[serde(rename)]` take literals: these tie them
        // to their home in marin3r_wire.
        use crate::envoyconfig::EnvoyConfig;
        assert_eq!(EnvoyConfig::group(&()), marin3r_wire::DOMAIN);
        assert_eq!(EnvoyConfigRevision::group(&()), marin3r_wire::DOMAIN);
        assert_eq!(EnvoyConfig::version(&()), marin3r_wire::API_VERSION);
        assert_eq!(EnvoyConfigRevision::version(&()), marin3r_wire::API_VERSION);
        assert_eq!(
            serde_json::to_value(EnvoyApi::V3).unwrap(),
            EnvoyApi::V3.as_str()
        );
        assert_eq!(EnvoyApi::V3.as_str(), marin3r_wire::ENVOY_API_V3);
        assert_eq!(EnvoyApi::V3.to_string(), "v3");
    }

    #[test]
    fn api_identity_matches_upstream() {
        assert_eq!(
            EnvoyConfigRevision::api_version(&()),
            "marin3r.3scale.net/v1alpha1"
        );
        assert_eq!(EnvoyConfigRevision::kind(&()), "EnvoyConfigRevision");
        assert_eq!(EnvoyConfigRevision::plural(&()), "envoyconfigrevisions");
        let crd = EnvoyConfigRevision::crd();
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["ecr".to_string()][..])
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let columns: Vec<(String, String)> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.json_path.clone()))
            .collect();
        let expected = [
            ("Node ID", ".spec.nodeID"),
            ("Envoy API", ".spec.envoyAPI"),
            ("Version", ".spec.version"),
            ("Published", ".status.published"),
            ("Created At", ".metadata.creationTimestamp"),
            ("Last Published At", ".status.lastPublishedAt"),
            ("Tainted", ".status.tainted"),
        ];
        assert_eq!(
            columns,
            expected.map(|(a, b)| (a.to_string(), b.to_string()))
        );
        assert!(
            crd.spec.versions[0].subresources.is_some(),
            "status subresource"
        );
    }

    #[test]
    fn upstream_manifest_round_trips() {
        let doc = serde_json::json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfigRevision",
            "metadata": {"name": "kuard-v3-abc", "namespace": "default"},
            "spec": {
                "nodeID": "kuard",
                "version": "abc",
                "envoyAPI": "v3",
                "resources": [{"type": "cluster", "value": {"name": "c"}}]
            },
            "status": {
                "published": true,
                "tainted": false,
                "lastPublishedAt": "2024-01-02T03:04:05Z",
                "providesVersions": {"clusters": "1", "scopedRoutes": "2"},
                "conditions": [{
                    "type": "RevisionPublished", "status": "True", "reason": "Published",
                    "message": "", "lastTransitionTime": "2024-01-02T03:04:05Z"
                }]
            }
        });
        let ecr: EnvoyConfigRevision = serde_json::from_value(doc.clone()).unwrap();
        let status = ecr.status.clone().unwrap();
        assert!(status.is_published() && !status.is_tainted());
        assert_eq!(
            status
                .condition(REVISION_PUBLISHED)
                .map(|c| c.status.as_str()),
            Some("True")
        );
        let versions = status.provides_versions.unwrap().to_versions();
        assert_eq!(versions[&ResourceType::ScopedRoute], "2");
        assert_eq!(serde_json::to_value(&ecr).unwrap(), doc);
    }

    #[test]
    fn the_schema_admits_upstream_b64json_which_does_not_decode() {
        let crd = serde_json::to_value(EnvoyConfigRevision::crd()).unwrap();
        let field = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["serialization"];
        assert_eq!(
            field["enum"],
            serde_json::json!(["json", "b64json", "yaml"])
        );
        assert_eq!(field["type"], "string");
        let spec = serde_json::json!({"nodeID": "n", "version": "v", "serialization": "b64json"});
        let error = serde_json::from_value::<EnvoyConfigRevisionSpec>(spec).unwrap_err();
        assert!(error.to_string().contains("b64json"), "{error}");
    }

    #[test]
    fn spec_converts_both_ways() {
        let spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "n", "serialization": "yaml",
            "envoyResources": {"clusters": [{"value": "name: c"}]}
        }))
        .unwrap();
        let rev = EnvoyConfigRevisionSpec::from_config(&spec, "v1");
        assert_eq!(rev.envoy_api, Some(EnvoyApi::V3), "defaulted");
        let back = rev.config_spec();
        assert_eq!(back.envoy_resources, spec.envoy_resources);
        assert_eq!(
            crate::envoyconfig::config_version(&back),
            crate::envoyconfig::config_version(&spec)
        );
    }

    #[test]
    fn version_tracker_round_trips() {
        let versions: BTreeMap<ResourceType, String> = ResourceType::ALL
            .into_iter()
            .map(|t| (t, t.as_str().to_string()))
            .collect();
        let tracker = VersionTracker::from_versions(&versions);
        assert_eq!(
            tracker.extension_configs.as_deref(),
            Some("extensionConfig")
        );
        assert_eq!(tracker.to_versions(), versions);
    }
}
