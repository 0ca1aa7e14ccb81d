//! `marin3r operator render`: the objects the controllers would apply for a set of
//! DiscoveryService, EnvoyDeployment and EnvoyConfig manifests, computed by the same
//! generators the controllers call ([`super::discovery_service::generate`],
//! [`super::envoy_deployment::generate`]), without a cluster.
//!
//! Rules, as the controllers apply them:
//! - a manifest without `metadata.namespace` is in `default`;
//! - one DiscoveryService per namespace: the oldest (`creationTimestamp`, then name)
//!   is served; any other gets nothing and is reported ([`primary_discovery_service`],
//!   operator-design.md §8 Q1);
//! - an EnvoyDeployment is rendered only when its DiscoveryService (the served one) and
//!   its EnvoyConfig are in the input, in its namespace; otherwise it is reported with
//!   the reason its `Ready` condition would carry;
//! - every DiscoveryService and EnvoyDeployment is validated first (the one check the
//!   controllers and the EnvoyDeployment webhook run: [`DiscoveryService::validate`],
//!   [`EnvoyDeployment::validate`]); one with errors is reported with each field;
//! - a field the type does not have (`replicas.statik`) is an error naming its path, as
//!   the API server's strict field validation reports it (never silently dropped);
//! - the same object (kind, namespace, name) given twice is refused the second time;
//! - a `v1` Namespace in the input gives its `openshift.io/sa.scc.uid-range` annotation
//!   to the EnvoyDeployments in it, as the controller reads it from the cluster: their
//!   containers run as its first UID (OpenShift's restricted-v2 admits only those).
//!
//! Objects come out in apply order: per DiscoveryService its certificates, account,
//! Role, RoleBinding, Service, Deployment and PDB (several replicas); per
//! EnvoyDeployment its certificate, Deployment, HPA and PDB. Owner references are left out (the objects of a file have
//! no uid). Certificate Secrets are the certificate controller's and hold key material:
//! they are not rendered.

use std::collections::BTreeMap;

use marin3r_envoyconfig::envoyconfig::{EnvoyConfig, parse_envoy_config};
use marin3r_operator_api::conditions;
use marin3r_operator_api::{DiscoveryService, EnvoyDeployment};
use serde::Serialize;
use serde_json::Value;

use marin3r_wire::openshift::UID_RANGE_ANNOTATION;

use super::Images;
use super::{discovery_service, envoy_deployment};

/// What `render` produced: the objects, and what could not be rendered (with why).
#[derive(Debug, Default, PartialEq)]
pub struct Rendered {
    pub objects: Vec<Value>,
    /// `kind namespace/name: problem`, one per line of output.
    pub problems: Vec<String>,
}

/// The DiscoveryService a namespace is served by among `candidates` (all in one
/// namespace): the oldest by `creationTimestamp`, then by name. The others get a
/// `DuplicateDiscoveryService` condition and nothing else.
pub fn primary_discovery_service<'a>(
    candidates: impl IntoIterator<Item = &'a DiscoveryService>,
) -> Option<&'a DiscoveryService> {
    candidates.into_iter().min_by(|a, b| {
        let key = |d: &'a DiscoveryService| {
            (
                d.metadata.creation_timestamp.as_ref().map(|t| t.0),
                d.metadata.name.clone(),
            )
        };
        // An object without a timestamp (from a file) sorts after dated ones.
        let (ta, na) = key(a);
        let (tb, nb) = key(b);
        match (ta, tb) {
            (Some(x), Some(y)) => x.cmp(&y).then(na.cmp(&nb)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => na.cmp(&nb),
        }
    })
}

fn to_value(object: &impl Serialize, problems: &mut Vec<String>) -> Option<Value> {
    match serde_json::to_value(object) {
        Ok(v) => Some(v),
        Err(e) => {
            problems.push(format!("cannot serialize a generated object: {e}"));
            None
        }
    }
}

/// `doc` decoded as `T`, or why not: a value of the wrong type names its path, and so
/// does every field `T` does not have ([`marin3r_operator_api::unknown_fields`]).
fn decode<T: serde::de::DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let object: T = serde_path_to_error::deserialize(doc)
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    let again = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    let unknown = marin3r_operator_api::unknown_fields(doc, &again);
    if unknown.is_empty() {
        Ok(object)
    } else {
        Err(marin3r_operator_api::Error::Invalid(unknown).to_string())
    }
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    marin3r_wire::namespace_or_default(meta.namespace.as_deref()).to_string()
}

/// Renders what the controllers would apply for the DiscoveryServices, EnvoyDeployments
/// and EnvoyConfigs among `docs`, with the uid-range of the Namespaces among them (other
/// kinds are ignored).
pub fn render(docs: &[Value], images: &Images) -> Rendered {
    let mut out = Rendered::default();
    let mut discovery_services: BTreeMap<String, Vec<DiscoveryService>> = BTreeMap::new();
    let mut envoy_deployments: Vec<EnvoyDeployment> = Vec::new();
    let mut envoy_configs: BTreeMap<(String, String), EnvoyConfig> = BTreeMap::new();
    // Namespace name -> its `openshift.io/sa.scc.uid-range`, as the controller reads it.
    let mut uid_ranges: BTreeMap<String, String> = BTreeMap::new();

    let operator_api = <DiscoveryService as kube::Resource>::api_version(&());
    // (kind, namespace, name) -> the document that defined it first.
    let mut seen: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (i, doc) in docs.iter().enumerate() {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or("?");
        let at = format!("document {} ({kind} {name})", i + 1);
        let is_operator_api = doc["apiVersion"].as_str() == Some(&*operator_api);
        let rendered_kind = matches!(
            (is_operator_api, kind),
            (true, "DiscoveryService" | "EnvoyDeployment") | (_, "EnvoyConfig")
        );
        if rendered_kind {
            let namespace =
                marin3r_wire::namespace_or_default(doc["metadata"]["namespace"].as_str());
            let key = (kind.to_string(), namespace.to_string(), name.to_string());
            if let Some(first) = seen.get(&key) {
                out.problems.push(format!(
                    "{at}: {kind} {namespace}/{name} is already defined by document {first}; the same object given twice is refused"
                ));
                continue;
            }
            seen.insert(key, i + 1);
        }
        match (is_operator_api, kind) {
            (true, "DiscoveryService") => match decode::<DiscoveryService>(doc) {
                Ok(ds) => match ds.validate() {
                    Ok(()) => discovery_services
                        .entry(namespace_of(&ds.metadata))
                        .or_default()
                        .push(ds),
                    Err(e) => out.problems.push(format!("{at}: {e}")),
                },
                Err(e) => out.problems.push(format!("{at}: {e}")),
            },
            (true, "EnvoyDeployment") => match decode::<EnvoyDeployment>(doc) {
                Ok(ed) => match ed.validate() {
                    Ok(()) => envoy_deployments.push(ed),
                    Err(e) => out.problems.push(format!("{at}: {e}")),
                },
                Err(e) => out.problems.push(format!("{at}: {e}")),
            },
            (false, "Namespace") if doc["apiVersion"] == "v1" => {
                let range = &doc["metadata"]["annotations"][UID_RANGE_ANNOTATION];
                if let (Some(ns), Some(range)) = (doc["metadata"]["name"].as_str(), range.as_str())
                {
                    uid_ranges.insert(ns.to_string(), range.to_string());
                }
            }
            (_, "EnvoyConfig") => match parse_envoy_config(doc) {
                Ok(ec) => {
                    let key = (
                        namespace_of(&ec.metadata),
                        ec.metadata.name.clone().unwrap_or_default(),
                    );
                    envoy_configs.insert(key, ec);
                }
                Err(e) => out.problems.push(format!("{at}: {e}")),
            },
            _ => {}
        }
    }

    let mut primaries: BTreeMap<String, &DiscoveryService> = BTreeMap::new();
    for (namespace, candidates) in &discovery_services {
        let Some(primary) = primary_discovery_service(candidates) else {
            continue;
        };
        primaries.insert(namespace.clone(), primary);
        for other in candidates.iter().filter(|d| !std::ptr::eq(*d, primary)) {
            out.problems.push(format!(
                "DiscoveryService {namespace}/{}: {}: DiscoveryService {} already serves the namespace; nothing is created for this one",
                other.metadata.name.as_deref().unwrap_or_default(),
                conditions::REASON_DUPLICATE_DISCOVERY_SERVICE,
                primary.metadata.name.as_deref().unwrap_or_default(),
            ));
        }
        match discovery_service::generate(primary, namespace, images) {
            Ok(o) => {
                for object in [
                    to_value(&o.ca, &mut out.problems),
                    to_value(&o.server, &mut out.problems),
                    to_value(&o.client, &mut out.problems),
                    to_value(&o.service_account, &mut out.problems),
                    to_value(&o.role, &mut out.problems),
                    to_value(&o.role_binding, &mut out.problems),
                    to_value(&o.service, &mut out.problems),
                    to_value(&o.deployment, &mut out.problems),
                ]
                .into_iter()
                .chain(o.pdb.as_ref().map(|p| to_value(p, &mut out.problems)))
                .flatten()
                {
                    out.objects.push(object);
                }
            }
            Err(e) => out.problems.push(e.to_string()),
        }
    }

    for ed in &envoy_deployments {
        let namespace = namespace_of(&ed.metadata);
        let name = ed.metadata.name.as_deref().unwrap_or_default();
        let at = format!("EnvoyDeployment {namespace}/{name}");
        let ds = primaries
            .get(&namespace)
            .copied()
            .filter(|d| d.metadata.name.as_deref() == Some(ed.spec.discovery_service_ref.as_str()));
        let Some(ds) = ds else {
            out.problems.push(format!(
                "{at}: {}: DiscoveryService {namespace}/{} is not in the input (or does not serve the namespace)",
                conditions::REASON_DISCOVERY_SERVICE_NOT_FOUND,
                ed.spec.discovery_service_ref
            ));
            continue;
        };
        let Some(ec) = envoy_configs.get(&(namespace.clone(), ed.spec.envoy_config_ref.clone()))
        else {
            out.problems.push(format!(
                "{at}: {}: EnvoyConfig {namespace}/{} is not in the input",
                conditions::REASON_ENVOY_CONFIG_NOT_FOUND,
                ed.spec.envoy_config_ref
            ));
            continue;
        };
        let uid_range = uid_ranges.get(&namespace).map(String::as_str);
        match envoy_deployment::generate(ed, ds, ec, &namespace, uid_range, images) {
            Ok(o) => {
                let objects = [
                    to_value(&o.client_certificate, &mut out.problems),
                    to_value(&o.deployment, &mut out.problems),
                ]
                .into_iter()
                .chain(o.hpa.as_ref().map(|h| to_value(h, &mut out.problems)))
                .chain(o.pdb.as_ref().map(|p| to_value(p, &mut out.problems)))
                .flatten()
                .collect::<Vec<_>>();
                out.objects.extend(objects);
            }
            Err(e) => out.problems.push(e.to_string()),
        }
    }
    out
}
