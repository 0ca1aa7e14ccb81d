//! Kubernetes mode of `marin3r status`: the EnvoyConfigs and EnvoyConfigRevisions read
//! through the API server (any `kube::Client`: kubeconfig, in-cluster, or a test's),
//! turned into the same [`StatusReport`] local mode's `GET /status` answers, so one
//! renderer prints both; and the sidecars' client certificate Secret, the default
//! certificate of the CSDS client.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use marin3r_control_plane::status::{EnvoyConfigReport, RevisionReport, StatusReport};
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::{EnvoyConfigRevision, REVISION_TAINTED};
use marin3r_kube::Lenient;
use marin3r_wire::{object_names, secret_keys};

use super::csds::ClientCertificate;

/// Errors of Kubernetes mode.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("cannot list {what}{}: {}", scope(namespace.as_deref()), marin3r_wire::error_chain(source))]
    List {
        what: &'static str,
        namespace: Option<String>,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot read the client certificate Secret {namespace}/{name} (give one with \
         --csds-certificate-path): {}",
        marin3r_wire::error_chain(source)
    )]
    Secret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the Secret {namespace}/{name} has no {key}")]
    SecretKey {
        namespace: String,
        name: String,
        key: &'static str,
    },
}

fn scope(namespace: Option<&str>) -> String {
    namespace.map_or_else(
        || " in every namespace".to_string(),
        |ns| format!(" in namespace {ns}"),
    )
}

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> String {
    marin3r_kube::time::truncate_to_seconds(t.0).to_string()
}

/// The report of one revision object.
pub fn revision_report(ecr: &EnvoyConfigRevision) -> RevisionReport {
    let status = ecr.status.clone().unwrap_or_default();
    RevisionReport {
        version: ecr.spec.version.clone(),
        published: status.is_published(),
        tainted: status.is_tainted(),
        taint_reason: status
            .condition(REVISION_TAINTED)
            .filter(|c| c.status == "True")
            .map(|c| c.message.clone()),
        created_at: ecr
            .metadata
            .creation_timestamp
            .as_ref()
            .map(time)
            .unwrap_or_default(),
        last_published_at: status.last_published_at.as_ref().map(time),
        provides_versions: status
            .provides_versions
            .as_ref()
            .map(|v| {
                v.to_versions()
                    .into_iter()
                    .map(|(t, v)| (t.as_str().to_string(), v))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The report of EnvoyConfig objects and the revision objects of their namespaces: each
/// EnvoyConfig with the revisions of its node id, oldest first (the order of its
/// `status.revisions`, then by creation time). An object that does not fit the CRD types
/// is listed with its error.
pub fn report(
    configs: &[Lenient<EnvoyConfig>],
    revisions: &[Lenient<EnvoyConfigRevision>],
) -> StatusReport {
    use kube::ResourceExt as _;
    let mut envoy_configs: Vec<EnvoyConfigReport> = configs
        .iter()
        .map(|object| {
            let name = object.name_any();
            let namespace = object.namespace().unwrap_or_default();
            let ec = match object {
                Lenient::Valid(ec) => ec,
                Lenient::Malformed { error, .. } => {
                    return EnvoyConfigReport {
                        name,
                        namespace,
                        node_id: String::new(),
                        envoy_api: String::new(),
                        desired_version: None,
                        published_version: None,
                        cache_state: None,
                        conditions: Vec::new(),
                        revisions: Vec::new(),
                        errors: vec![format!("does not fit the EnvoyConfig type: {error}")],
                    };
                }
            };
            let status = ec.status.clone().unwrap_or_default();
            let order = |version: &str| {
                status
                    .revisions
                    .iter()
                    .position(|r| r.version == version)
                    .unwrap_or(usize::MAX)
            };
            let mut mine: Vec<&EnvoyConfigRevision> = revisions
                .iter()
                .filter_map(|r| r.valid().ok())
                .filter(|r| {
                    r.namespace().as_deref() == Some(namespace.as_str())
                        && r.spec.node_id == ec.spec.node_id
                })
                .collect();
            mine.sort_by_key(|r| {
                (
                    order(&r.spec.version),
                    r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    r.name_any(),
                )
            });
            EnvoyConfigReport {
                name,
                namespace,
                node_id: ec.spec.node_id.clone(),
                envoy_api: ec.spec.envoy_api.unwrap_or_default().as_str().to_string(),
                desired_version: status.desired_version.clone(),
                published_version: status.published_version.clone(),
                cache_state: status.cache_state,
                conditions: status.conditions.clone(),
                revisions: mine.into_iter().map(revision_report).collect(),
                errors: Vec::new(),
            }
        })
        .collect();
    envoy_configs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    StatusReport {
        envoy_configs,
        files: Vec::new(),
    }
}

/// Lists the EnvoyConfigs (and, with `revisions`, the EnvoyConfigRevisions) of
/// `namespace` (every namespace when `None`) and reports them.
pub async fn fetch(
    client: &kube::Client,
    namespace: Option<&str>,
    revisions: bool,
) -> Result<StatusReport, KubeError> {
    let configs = api::<Lenient<EnvoyConfig>>(client, namespace)
        .list(&ListParams::default())
        .await
        .map_err(|source| KubeError::List {
            what: "EnvoyConfigs",
            namespace: namespace.map(str::to_string),
            source,
        })?;
    let revs = if revisions {
        api::<Lenient<EnvoyConfigRevision>>(client, namespace)
            .list(&ListParams::default())
            .await
            .map_err(|source| KubeError::List {
                what: "EnvoyConfigRevisions",
                namespace: namespace.map(str::to_string),
                source,
            })?
            .items
    } else {
        Vec::new()
    };
    Ok(report(&configs.items, &revs))
}

/// The sidecars' client certificate (`envoy-sidecar-client-cert` in `namespace`): the
/// discovery service accepts it, as it accepts its Envoys.
pub async fn client_certificate(
    client: &kube::Client,
    namespace: &str,
) -> Result<ClientCertificate, KubeError> {
    let name = object_names::SIDECAR_CLIENT_CERTIFICATE;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|source| KubeError::Secret {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        })?;
    let data = secret.data.unwrap_or_default();
    let key = |key: &'static str| {
        data.get(key)
            .map(|v| v.0.clone())
            .ok_or_else(|| KubeError::SecretKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
                key,
            })
    };
    Ok(ClientCertificate {
        ca_pem: key(secret_keys::CA_CRT)?,
        cert_pem: key(secret_keys::TLS_CRT)?,
        key_pem: key(secret_keys::TLS_KEY)?,
        origin: format!("Secret {namespace}/{name}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn object<K: serde::de::DeserializeOwned>(value: Value) -> Lenient<K> {
        serde_json::from_value(value).unwrap()
    }

    fn revision(name: &str, node: &str, version: &str, created: &str, status: Value) -> Value {
        json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigRevision",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
            "spec": {"nodeID": node, "version": version, "resources": []},
            "status": status,
        })
    }

    #[test]
    fn objects_become_the_local_report_with_revisions_in_status_order() {
        let configs = vec![
            object::<EnvoyConfig>(json!({
                "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                "metadata": {"name": "kuard", "namespace": "default"},
                "spec": {"nodeID": "kuard", "resources": []},
                "status": {"cacheState": "Rollback", "desiredVersion": "b", "publishedVersion": "a",
                    "revisions": [
                        {"version": "a", "ref": {"name": "kuard-a"}},
                        {"version": "b", "ref": {"name": "kuard-b"}}]},
            })),
            object::<EnvoyConfig>(json!({
                "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                "metadata": {"name": "bad", "namespace": "default"},
                "spec": {"nodeID": 42},
            })),
        ];
        let revisions = vec![
            // Created later but first in the EnvoyConfig's list.
            object::<EnvoyConfigRevision>(revision(
                "kuard-a",
                "kuard",
                "a",
                "2025-01-01T10:00:05Z",
                json!({"published": true, "lastPublishedAt": "2025-01-01T10:00:06Z"}),
            )),
            object::<EnvoyConfigRevision>(revision(
                "kuard-b",
                "kuard",
                "b",
                "2025-01-01T10:00:00Z",
                json!({"tainted": true, "conditions": [{"type": "RevisionTainted",
                    "status": "True", "reason": "RejectedByEnvoy", "message": "NACKed",
                    "lastTransitionTime": "2025-01-01T10:00:01Z"}]}),
            )),
            object::<EnvoyConfigRevision>(revision(
                "other",
                "other",
                "c",
                "2025-01-01T10:00:00Z",
                json!({}),
            )),
        ];
        let report = report(&configs, &revisions);
        let names: Vec<&str> = report
            .envoy_configs
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(names, ["bad", "kuard"]);
        let bad = &report.envoy_configs[0];
        assert!(bad.errors[0].contains("spec.nodeID"), "{:?}", bad.errors);
        let kuard = &report.envoy_configs[1];
        assert_eq!(kuard.envoy_api, "v3");
        assert_eq!(
            (
                kuard.desired_version.as_deref(),
                kuard.published_version.as_deref()
            ),
            (Some("b"), Some("a"))
        );
        let versions: Vec<(&str, bool, bool)> = kuard
            .revisions
            .iter()
            .map(|r| (r.version.as_str(), r.published, r.tainted))
            .collect();
        assert_eq!(versions, [("a", true, false), ("b", false, true)]);
        assert_eq!(kuard.revisions[0].created_at, "2025-01-01T10:00:05Z");
        assert_eq!(
            kuard.revisions[0].last_published_at.as_deref(),
            Some("2025-01-01T10:00:06Z")
        );
        assert_eq!(kuard.revisions[1].taint_reason.as_deref(), Some("NACKed"));
        // The same table as local mode.
        assert!(crate::status::render_table(&report, false).contains(
            "kuard   kuard     v3          b                 a                   Rollback"
        ));
    }
}
