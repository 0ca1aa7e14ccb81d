//! The `EnvoyConfig` custom resource (`marin3r.3scale.net/v1alpha1`, design.md §4) and its
//! normalisation into the list of Envoy resources to serve.
//!
//! Both spellings upstream MARIN3R accepts are supported: `spec.resources[]` (objects,
//! generated secrets and endpoints) and the deprecated `spec.envoyResources` (resources
//! as JSON/YAML *strings*, per `spec.serialization`). [`resolve`] turns either into one
//! `Vec<Resource>` and reports **every** problem with its path, e.g.
//! `listener "https": spec.resources[3].value.filter_chains[0]: unknown field "bogus"`.
//!
//! Secrets come from a [`SecretSource`] (the Kubernetes API, or `kind: Secret` manifests
//! in local mode); their data never appears in errors or `Debug` output.

use std::collections::HashMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::{ObjectReference, SecretReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use marin3r_wire::secret_keys::{CA_CRT, TLS_CRT, TLS_KEY};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::decode::{decode_resource, parse_text};
use crate::error::{DecodeError, Location, join_path};
use crate::memo::{DecodeMemo, Input};
use crate::resource::{Resource, ResourceType};
use crate::text::Serialization;

pub use crate::secret::{NoSecrets, SecretData, SecretSource, parse_secret};

/// The config version of a spec: a stable hash of its resources (both forms), which is
/// what names an EnvoyConfigRevision. Secret *contents* are not part of it (like
/// upstream): a Secret change is re-published within the same revision.
pub fn config_version(spec: &EnvoyConfigSpec) -> String {
    let canonical = serde_json::json!({
        "resources": spec.resources,
        "envoyResources": spec.envoy_resources,
        "serialization": spec.serialization,
    });
    // serde_json maps are sorted, so the text is canonical.
    crate::resource::version_string(crate::resource::fnv1a64(canonical.to_string().as_bytes()))
}

/// Desired state of an EnvoyConfig: the Envoy resources for one node id.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "marin3r.3scale.net",
    version = "v1alpha1",
    kind = "EnvoyConfig",
    plural = "envoyconfigs",
    namespaced,
    shortname = "ec",
    status = "EnvoyConfigStatus",
    derive = "PartialEq",
    doc = "EnvoyConfig holds the Envoy configuration (listeners, routes, clusters, secrets, …) \
           served by the discovery service to every Envoy with node id spec.nodeID.",
    printcolumn = r#"{"name": "Node ID", "type": "string", "jsonPath": ".spec.nodeID"}"#,
    printcolumn = r#"{"name": "Envoy API", "type": "string", "jsonPath": ".spec.envoyAPI"}"#,
    printcolumn = r#"{"name": "Desired Version", "type": "string", "jsonPath": ".status.desiredVersion"}"#,
    printcolumn = r#"{"name": "Published Version", "type": "string", "jsonPath": ".status.publishedVersion"}"#,
    printcolumn = r#"{"name": "Cache State", "type": "string", "jsonPath": ".status.cacheState"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigSpec {
    /// The Envoy node id (`--service-node`) these resources are served to.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// Envoy API version; only `v3` exists (the default).
    #[serde(rename = "envoyAPI", default, skip_serializing_if = "Option::is_none")]
    pub envoy_api: Option<EnvoyApi>,
    /// Format of the strings in the deprecated `envoyResources` (`json` if unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serialization: Option<Serialization>,
    /// The resources, one entry each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceSpec>>,
    /// DEPRECATED: use `resources`. Resources as serialized strings, grouped by type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_resources: Option<EnvoyResources>,
}

/// The Envoy xDS API version.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum EnvoyApi {
    /// Envoy's v3 xDS API.
    #[default]
    #[serde(rename = "v3")]
    V3,
}

impl EnvoyApi {
    /// How the API is written: `envoyAPI`, the `envoy-api` label of a revision, the
    /// `envoy-api-version` annotation (`v3`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V3 => marin3r_wire::ENVOY_API_V3,
        }
    }
}

impl fmt::Display for EnvoyApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of `spec.resources`: an Envoy resource given as an object (`value`) or
/// generated from a Kubernetes object.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSpec {
    /// listener, route, scopedRoute, cluster, endpoint, secret, runtime or extensionConfig.
    #[serde(rename = "type")]
    #[schemars(schema_with = "resource_type_schema")]
    pub type_: String,
    /// The Envoy v3 message (protojson: snake_case or camelCase, `@type` for Any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_fields")]
    pub value: Option<Value>,
    /// Name of a `kubernetes.io/tls` Secret to generate an Envoy secret from (type secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_from_tls_secret: Option<String>,
    /// Key of an Opaque Secret to generate an Envoy generic secret from (type secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_from_opaque_secret: Option<GenerateFromOpaqueSecret>,
    /// EndpointSlices to generate a ClusterLoadAssignment from (type endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_from_endpoint_slices: Option<GenerateFromEndpointSlices>,
    /// What to generate from a TLS Secret (default tlsCertificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blueprint: Option<Blueprint>,
}

/// What `generateFromTlsSecret` produces.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Blueprint {
    /// `tls_certificate` with the certificate chain (`tls.crt`) and key (`tls.key`).
    #[default]
    TlsCertificate,
    /// `validation_context` trusting `ca.crt` (or `tls.crt` when there is no `ca.crt`).
    ValidationContext,
}

/// `generateFromOpaqueSecret`: one key of a Secret as an Envoy generic secret.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct GenerateFromOpaqueSecret {
    /// The Secret's name (same namespace).
    pub name: String,
    /// The key within the Secret.
    pub key: String,
    /// The Envoy secret name.
    pub alias: String,
}

/// `generateFromEndpointSlices`: a ClusterLoadAssignment from the EndpointSlices that
/// match `selector`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GenerateFromEndpointSlices {
    /// Label selector of the EndpointSlices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The cluster the endpoints belong to (`cluster_name`).
    pub cluster_name: String,
    /// The EndpointSlice port name to send traffic to.
    pub target_port: String,
}

/// DEPRECATED resource form: serialized strings grouped by type.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyResources {
    /// ClusterLoadAssignments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<EnvoyResource>,
    /// Clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<EnvoyResource>,
    /// RouteConfigurations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<EnvoyResource>,
    /// ScopedRouteConfigurations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoped_routes: Vec<EnvoyResource>,
    /// Listeners.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<EnvoyResource>,
    /// Runtimes (older upstream releases spelled it `runtime`).
    #[serde(default, alias = "runtime", skip_serializing_if = "Vec::is_empty")]
    pub runtimes: Vec<EnvoyResource>,
    /// TLS certificates from `kubernetes.io/tls` Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<EnvoySecretResource>,
    /// TypedExtensionConfigs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_configs: Vec<EnvoyResource>,
}

/// DEPRECATED: one serialized resource.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EnvoyResource {
    /// Ignored (the name is read from the resource itself), kept for compatibility.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The resource as JSON or YAML text (per `spec.serialization`).
    pub value: String,
}

/// DEPRECATED: a TLS certificate secret from a `kubernetes.io/tls` Secret.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EnvoySecretResource {
    /// The Envoy secret name (and the Secret's name when `ref` is unset).
    pub name: String,
    /// The Secret to read (same namespace).
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<SecretReference>,
}

/// Observed state of an EnvoyConfig.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigStatus {
    /// InSync, Rollback or RollbackFailed. A plain string in the schema, as upstream's
    /// (an enum there would make our CRD an unsafe upgrade of upstream's, docs/olm.md);
    /// only the discovery service writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub cache_state: Option<CacheState>,
    /// The version being served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_version: Option<String>,
    /// The version of the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    /// `CacheOutOfSync`, `RollbackFailed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// EnvoyConfigRevisions, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<ConfigRevisionRef>,
}

/// Summary of the discovery service cache for an EnvoyConfig.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum CacheState {
    /// The desired version is published.
    InSync,
    /// An older revision is published because newer ones are tainted.
    Rollback,
    /// Every revision is tainted; the last good snapshot keeps being served.
    RollbackFailed,
}

impl fmt::Display for CacheState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheState::InSync => "InSync",
            CacheState::Rollback => "Rollback",
            CacheState::RollbackFailed => "RollbackFailed",
        })
    }
}

/// A reference to the EnvoyConfigRevision holding one version.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ConfigRevisionRef {
    /// The version (hash of `spec.resources`).
    pub version: String,
    /// The EnvoyConfigRevision object.
    #[serde(rename = "ref")]
    pub reference: ObjectReference,
}

fn preserve_unknown_fields(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

fn resource_type_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = ResourceType::ALL.iter().map(|t| t.as_str()).collect();
    schemars::json_schema!({ "type": "string", "enum": names })
}

/// Turns an EnvoyConfig spec (either form) into the resources to serve, or every error
/// found, each with its path (`spec.resources[3].value.filter_chains[0]…`,
/// `spec.envoyResources.listeners[0].value…`).
///
/// Rules (as upstream's validating webhook): exactly one of `resources` and
/// `envoyResources`; `secret` entries use `generateFromTlsSecret` or
/// `generateFromOpaqueSecret`; `endpoint` entries use `value` or
/// `generateFromEndpointSlices`; every other type needs `value`; `blueprint` goes with
/// `generateFromTlsSecret` only; names are unique per type.
pub fn resolve(
    spec: &EnvoyConfigSpec,
    secrets: &dyn SecretSource,
) -> Result<Vec<Resource>, Vec<DecodeError>> {
    resolve_with(spec, secrets, None)
}

/// [`resolve`], taking the resources decoded from the spec's own text (`value`s and
/// `envoyResources` strings) from `memo` when it has them: same result, same errors
/// (failures are decoded again, see [`crate::memo`]). Generated resources (EndpointSlices,
/// Secrets) are built every time.
pub fn resolve_cached(
    spec: &EnvoyConfigSpec,
    secrets: &dyn SecretSource,
    memo: &DecodeMemo,
) -> Result<Vec<Resource>, Vec<DecodeError>> {
    resolve_with(spec, secrets, Some(memo))
}

fn resolve_with(
    spec: &EnvoyConfigSpec,
    secrets: &dyn SecretSource,
    memo: Option<&DecodeMemo>,
) -> Result<Vec<Resource>, Vec<DecodeError>> {
    let mut r = Resolver {
        secrets,
        memo,
        resources: Vec::new(),
        errors: Vec::new(),
        seen: HashMap::new(),
    };
    match (&spec.resources, &spec.envoy_resources) {
        (Some(_), Some(_)) => r.errors.push(DecodeError::spec(
            "spec",
            "set either resources or the deprecated envoyResources, not both",
        )),
        (None, None) => r.errors.push(DecodeError::spec(
            "spec",
            "one of resources or envoyResources must be set",
        )),
        _ => {}
    }
    for (i, entry) in spec.resources.iter().flatten().enumerate() {
        r.entry(&format!("spec.resources[{i}]"), entry);
    }
    if let Some(deprecated) = &spec.envoy_resources {
        r.deprecated(deprecated, spec.serialization.unwrap_or_default());
    }
    if r.errors.is_empty() {
        Ok(r.resources)
    } else {
        Err(r.errors)
    }
}

struct Resolver<'a> {
    secrets: &'a dyn SecretSource,
    /// Where resources decoded from the spec's own text are remembered, if anywhere.
    memo: Option<&'a DecodeMemo>,
    resources: Vec<Resource>,
    errors: Vec<DecodeError>,
    /// (type, name) → path of the first resource with that name.
    seen: HashMap<(ResourceType, String), String>,
}

impl Resolver<'_> {
    fn entry(&mut self, path: &str, entry: &ResourceSpec) {
        let kind: ResourceType = match entry.type_.parse() {
            Ok(kind) => kind,
            Err(e) => {
                self.errors
                    .push(DecodeError::spec(join_path(path, "type"), e.to_string()));
                return;
            }
        };
        if !self.check_shape(path, kind, entry) {
            return;
        }
        if let Some(value) = &entry.value {
            let value_path = join_path(path, "value");
            match self.decode_value(kind, value) {
                Ok(resource) => self.add(&value_path, resource),
                Err(e) => self.errors.push(e.prefixed(&value_path)),
            }
        } else if let Some(secret) = &entry.generate_from_tls_secret {
            let at_path = join_path(path, "generateFromTlsSecret");
            let blueprint = entry.blueprint.unwrap_or_default();
            self.tls_secret(&at_path, secret, secret, blueprint);
        } else if let Some(opaque) = &entry.generate_from_opaque_secret {
            let at_path = join_path(path, "generateFromOpaqueSecret");
            self.opaque_secret(&at_path, opaque);
        } else if let Some(slices) = &entry.generate_from_endpoint_slices {
            let at_path = join_path(path, "generateFromEndpointSlices");
            self.endpoints(&at_path, slices);
        }
    }

    /// Checks which fields an entry of `kind` may and must set; records errors.
    fn check_shape(&mut self, path: &str, kind: ResourceType, e: &ResourceSpec) -> bool {
        let before = self.errors.len();
        let mut problem = |field: &str, message: String| {
            self.errors
                .push(DecodeError::spec(join_path(path, field), message));
        };
        let tls = e.generate_from_tls_secret.is_some();
        let opaque = e.generate_from_opaque_secret.is_some();
        let slices = e.generate_from_endpoint_slices.is_some();
        let value = e.value.is_some();
        match kind {
            ResourceType::Secret => {
                if value {
                    problem("value", "type secret takes generateFromTlsSecret or generateFromOpaqueSecret, not value".into());
                }
                if tls && opaque {
                    problem(
                        "",
                        "set only one of generateFromTlsSecret, generateFromOpaqueSecret".into(),
                    );
                } else if !tls && !opaque && !value {
                    problem(
                        "",
                        "type secret needs generateFromTlsSecret or generateFromOpaqueSecret"
                            .into(),
                    );
                }
            }
            ResourceType::Endpoint => {
                if value && slices {
                    problem(
                        "",
                        "set only one of value, generateFromEndpointSlices".into(),
                    );
                } else if !value && !slices {
                    problem(
                        "value",
                        "type endpoint needs value or generateFromEndpointSlices".into(),
                    );
                }
            }
            _ => {
                if !value {
                    problem("value", format!("type {kind} needs value"));
                }
            }
        }
        if tls && kind != ResourceType::Secret {
            problem("generateFromTlsSecret", "only for type secret".into());
        }
        if opaque && kind != ResourceType::Secret {
            problem("generateFromOpaqueSecret", "only for type secret".into());
        }
        if slices && kind != ResourceType::Endpoint {
            problem(
                "generateFromEndpointSlices",
                "only for type endpoint".into(),
            );
        }
        if e.blueprint.is_some() && !tls {
            problem("blueprint", "only with generateFromTlsSecret".into());
        }
        self.errors.len() == before
    }

    fn deprecated(&mut self, d: &EnvoyResources, serialization: Serialization) {
        let groups: [(&str, ResourceType, &Vec<EnvoyResource>); 7] = [
            ("endpoints", ResourceType::Endpoint, &d.endpoints),
            ("clusters", ResourceType::Cluster, &d.clusters),
            ("routes", ResourceType::Route, &d.routes),
            ("scopedRoutes", ResourceType::ScopedRoute, &d.scoped_routes),
            ("listeners", ResourceType::Listener, &d.listeners),
            ("runtimes", ResourceType::Runtime, &d.runtimes),
            (
                "extensionConfigs",
                ResourceType::ExtensionConfig,
                &d.extension_configs,
            ),
        ];
        for (field, kind, items) in groups {
            for (i, item) in items.iter().enumerate() {
                let path = format!("spec.envoyResources.{field}[{i}].value");
                let decoded = self.decode_text(kind, &item.value, serialization);
                match decoded {
                    Ok(resource) => self.add(&path, resource),
                    Err(e) => self.errors.push(e.prefixed(&path)),
                }
            }
        }
        for (i, s) in d.secrets.iter().enumerate() {
            let path = format!("spec.envoyResources.secrets[{i}]");
            let secret = s
                .reference
                .as_ref()
                .and_then(|r| r.name.as_deref())
                .filter(|n| !n.is_empty())
                .unwrap_or(&s.name);
            if s.name.is_empty() {
                self.errors.push(DecodeError::spec(
                    join_path(&path, "name"),
                    "must not be empty",
                ));
                continue;
            }
            self.tls_secret(&path, &s.name, secret, Blueprint::TlsCertificate);
        }
    }

    /// Decodes a `spec.resources[].value` (through the memo if there is one).
    fn decode_value(&self, kind: ResourceType, value: &Value) -> Result<Resource, DecodeError> {
        match self.memo {
            Some(memo) => memo.get_or_decode(kind, Input::Value(value.to_string()), || {
                decode_resource(kind, value)
            }),
            None => decode_resource(kind, value),
        }
    }

    /// Decodes a deprecated `envoyResources` string (through the memo if there is one).
    fn decode_text(
        &self,
        kind: ResourceType,
        text: &str,
        serialization: Serialization,
    ) -> Result<Resource, DecodeError> {
        let decode = || {
            parse_text(text, serialization)
                .map_err(|e| relabel(e, kind.as_str()))
                .and_then(|value| decode_resource(kind, &value))
        };
        match self.memo {
            Some(memo) => {
                memo.get_or_decode(kind, Input::Text(serialization, text.to_string()), decode)
            }
            None => decode(),
        }
    }

    /// Records a resource, or a duplicate-name error.
    fn add(&mut self, path: &str, resource: Resource) {
        if self.claim(path, resource.kind, &resource.name) {
            self.resources.push(resource);
        }
    }

    /// Reserves (kind, name); false (and an error) if another resource has it.
    fn claim(&mut self, path: &str, kind: ResourceType, name: &str) -> bool {
        match self.seen.get(&(kind, name.to_string())) {
            Some(first) => {
                self.errors.push(DecodeError::DuplicateName {
                    at: Location {
                        resource: format!("{kind} {name:?}"),
                        path: path.to_string(),
                    },
                    kind,
                    name: name.to_string(),
                    first: first.clone(),
                });
                false
            }
            None => {
                self.seen.insert((kind, name.to_string()), path.to_string());
                true
            }
        }
    }

    /// Envoy secret `envoy_name` from the `kubernetes.io/tls` Secret `secret`.
    fn tls_secret(&mut self, path: &str, envoy_name: &str, secret: &str, blueprint: Blueprint) {
        if !self.claim(path, ResourceType::Secret, envoy_name) {
            return;
        }
        let at = Location {
            resource: format!("secret {envoy_name:?}"),
            path: path.to_string(),
        };
        let result = self
            .secret_data(&at, secret, Some("kubernetes.io/tls"))
            .and_then(|data| {
                let key = |k: &str| {
                    data.data.get(k).ok_or_else(|| DecodeError::MissingSecretKey {
                        at: at.clone(),
                        secret: secret.to_string(),
                        key: k.to_string(),
                    })
                };
                let body = match blueprint {
                    Blueprint::TlsCertificate => json!({
                        "name": envoy_name,
                        "tls_certificate": {
                            "certificate_chain": {"inline_bytes": BASE64.encode(key(TLS_CRT)?)},
                            "private_key": {"inline_bytes": BASE64.encode(key(TLS_KEY)?)},
                        }
                    }),
                    Blueprint::ValidationContext => {
                        let ca = data
                            .data
                            .get(CA_CRT)
                            .map_or_else(|| key(TLS_CRT), Ok)?;
                        json!({
                            "name": envoy_name,
                            "validation_context": {"trusted_ca": {"inline_bytes": BASE64.encode(ca)}}
                        })
                    }
                };
                generated(&at, ResourceType::Secret, &body)
            });
        self.push(result);
    }

    /// Envoy generic secret `alias` from one key of a Secret.
    fn opaque_secret(&mut self, path: &str, o: &GenerateFromOpaqueSecret) {
        for (field, v) in [("name", &o.name), ("key", &o.key), ("alias", &o.alias)] {
            if v.is_empty() {
                self.errors.push(DecodeError::spec(
                    join_path(path, field),
                    "must not be empty",
                ));
                return;
            }
        }
        if !self.claim(path, ResourceType::Secret, &o.alias) {
            return;
        }
        let at = Location {
            resource: format!("secret {:?}", o.alias),
            path: path.to_string(),
        };
        let result = self.secret_data(&at, &o.name, None).and_then(|data| {
            let value = data
                .data
                .get(&o.key)
                .ok_or_else(|| DecodeError::MissingSecretKey {
                    at: at.clone(),
                    secret: o.name.clone(),
                    key: o.key.clone(),
                })?;
            let body = json!({
                "name": o.alias,
                "generic_secret": {"secret": {"inline_bytes": BASE64.encode(value)}}
            });
            generated(&at, ResourceType::Secret, &body)
        });
        self.push(result);
    }

    fn endpoints(&mut self, path: &str, g: &GenerateFromEndpointSlices) {
        if g.cluster_name.is_empty() {
            self.errors.push(DecodeError::spec(
                join_path(path, "clusterName"),
                "must not be empty",
            ));
            return;
        }
        if !self.claim(path, ResourceType::Endpoint, &g.cluster_name) {
            return;
        }
        let at = Location {
            resource: format!("endpoint {:?}", g.cluster_name),
            path: path.to_string(),
        };
        let result = match self.secrets.endpoint_slices(g.selector.as_ref()) {
            None => Err(DecodeError::NeedsKubernetes { at }),
            Some(slices) => crate::endpoints::cluster_load_assignment(
                &g.cluster_name,
                &g.target_port,
                slices.iter().map(|s| &**s),
            )
            .map_err(|message| DecodeError::Invalid {
                at: at.clone(),
                message,
            }),
        };
        self.push(result);
    }

    fn secret_data(
        &self,
        at: &Location,
        secret: &str,
        expected_type: Option<&'static str>,
    ) -> Result<SecretData, DecodeError> {
        let data = self
            .secrets
            .get(secret)
            .ok_or_else(|| DecodeError::MissingSecret {
                at: at.clone(),
                secret: secret.to_string(),
            })?;
        if let Some(expected) = expected_type {
            // An unset type (a local manifest without `type:`) is accepted.
            if !data.type_.is_empty() && data.type_ != expected {
                return Err(DecodeError::SecretType {
                    at: at.clone(),
                    secret: secret.to_string(),
                    expected,
                    actual: data.type_.clone(),
                });
            }
        }
        Ok(data)
    }

    fn push(&mut self, result: Result<Resource, DecodeError>) {
        match result {
            Ok(resource) => self.resources.push(resource),
            Err(e) => self.errors.push(e),
        }
    }
}

fn relabel(mut e: DecodeError, resource: &str) -> DecodeError {
    if let DecodeError::Syntax { at, .. } = &mut e {
        at.resource = resource.to_string();
    }
    e
}

/// Decodes a generated body. Such bodies fail only through a bug, or (a Secret's
/// certificate data) when Envoy's TLS loader would refuse the data: that error names
/// the generated field and the rule, never the data, and is kept; any other is replaced
/// by a fixed message so that no secret material can leak through it.
fn generated(at: &Location, kind: ResourceType, body: &Value) -> Result<Resource, DecodeError> {
    decode_resource(kind, body).map_err(|e| match e {
        DecodeError::TlsMaterial { at: field, message } => DecodeError::TlsMaterial {
            at: at.clone(),
            message: format!("the Envoy {kind}'s {}: {message}", field.path),
        },
        _ => DecodeError::Invalid {
            at: at.clone(),
            message: format!("cannot build the Envoy {kind}"),
        },
    })
}

/// Reads an EnvoyConfig manifest; errors name the field path (`spec.resources[0].blueprint`).
pub fn parse_envoy_config(doc: &Value) -> Result<EnvoyConfig, DecodeError> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let expected = <EnvoyConfig as kube::Resource>::api_version(&());
    if api_version != expected {
        return Err(DecodeError::spec(
            "apiVersion",
            format!("expected {expected}, got {api_version:?}"),
        ));
    }
    serde_path_to_error::deserialize::<_, EnvoyConfig>(doc).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        DecodeError::spec(path, e.into_inner().to_string())
    })
}

/// Checks one EnvoyConfig manifest without a cluster, as `marin3r validate` and the
/// validating admission webhook do: [`parse_envoy_config`], then [`resolve`] against
/// `secrets`. A Secret that `secrets` does not have is **not** an error (it normally
/// lives in the cluster; the generated resource is skipped), and
/// `generateFromEndpointSlices` is only shape-checked; every other problem is returned,
/// each with its path.
pub fn validate_envoy_config(
    doc: &Value,
    secrets: &dyn SecretSource,
) -> Result<(), Vec<DecodeError>> {
    let config = parse_envoy_config(doc).map_err(|e| vec![e])?;
    let errors: Vec<DecodeError> = match resolve(&config.spec, secrets) {
        Ok(_) => return Ok(()),
        Err(errors) => errors
            .into_iter()
            .filter(|e| {
                !matches!(
                    e,
                    DecodeError::MissingSecret { .. } | DecodeError::NeedsKubernetes { .. }
                )
            })
            .collect(),
    };
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Checks every EnvoyConfig in a multi-document YAML (or JSON) file, as
/// `marin3r validate -f FILE` does: returns how many EnvoyConfigs were checked, or one
/// line per problem: `[<document, 1-based>] EnvoyConfig <namespace>/<name>: <error>`.
///
/// Secrets that the configs generate from are taken from `kind: Secret` documents of
/// the same file. A Secret that is **not** in the file is not an error here (it
/// normally lives in the cluster): the generated resource is skipped, while everything
/// checkable offline still is (entry shape, duplicate names, a Secret that *is* in the
/// file but lacks a key). Likewise `generateFromEndpointSlices` is only shape-checked.
/// Documents of other kinds are ignored; empty documents are skipped; document numbers
/// count the items of a `kind: List` as documents.
pub fn validate_file(text: &str) -> Result<usize, Vec<String>> {
    let docs = crate::manifest::documents(text).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut secrets = crate::manifest::ManifestSecrets::default();
    for (i, doc) in docs.iter().enumerate() {
        if doc["kind"].as_str() == Some("Secret") {
            match parse_secret(doc) {
                Ok(secret) => secrets.0.push(secret),
                Err(e) => errors.push(format!("[{}] Secret: {e}", i + 1)),
            }
        }
    }
    let mut checked = 0;
    for (i, doc) in docs.iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let Some(kind) = doc["kind"].as_str() else {
            errors.push(format!("[{}] not a Kubernetes object (no kind)", i + 1));
            continue;
        };
        if kind != "EnvoyConfig" {
            continue;
        }
        checked += 1;
        let namespace = doc["metadata"]["namespace"].as_str();
        let name = doc["metadata"]["name"].as_str().unwrap_or("<no name>");
        let id = match namespace {
            Some(ns) => format!("[{}] EnvoyConfig {ns}/{name}", i + 1),
            None => format!("[{}] EnvoyConfig {name}", i + 1),
        };
        if let Err(errs) = validate_envoy_config(doc, &secrets.for_namespace(namespace)) {
            errors.extend(errs.into_iter().map(|e| format!("{id}: {e}")));
        }
    }
    if errors.is_empty() {
        Ok(checked)
    } else {
        Err(errors)
    }
}
