//! How marin3r writes objects: server-side apply under the writer's field manager
//! (forced: it owns the fields it applies, and only those, so fields other managers set
//! are kept), statuses through the status subresource, reads and deletes that treat 404
//! as "absent".

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::is_status;

/// Server-side applies `object` (named by its metadata) in `namespace` as
/// `field_manager`; returns what the API server answered.
pub async fn apply<K>(
    client: &Client,
    namespace: &str,
    object: &K,
    field_manager: &str,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(object),
    )
    .await
}

/// Server-side apply (forced, as `field_manager`) of `status` on the status subresource
/// of `name`.
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl Serialize,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    apply_status_at(api, name, None, status, field_manager).await
}

/// [`apply_status`], fenced: with `resource_version`, the API server refuses the write
/// (409 Conflict) unless the object is still at that version, so a write judged on an
/// older copy (another writer, a replica that led meanwhile) never lands.
pub async fn apply_status_at<K>(
    api: &Api<K>,
    name: &str,
    resource_version: Option<&str>,
    status: &impl Serialize,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(version) = resource_version {
        body["metadata"] = json!({"name": name, "resourceVersion": version});
    }
    api.patch_status(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// [`apply_status`] of `status` on `name` in `namespace`, unless it is `current` already.
pub async fn write_status<K, S>(
    client: &Client,
    namespace: &str,
    name: &str,
    current: Option<&S>,
    status: &S,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    apply_status(&api, name, status, field_manager).await
}

/// Reads `name` in `namespace`, `None` when it does not exist.
pub async fn get<K>(client: &Client, namespace: &str, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
}

/// Deletes `name` in `namespace` if it exists (in the background: dependents are
/// garbage collected); returns whether it existed.
pub async fn delete_if_exists<K>(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, 404) => Ok(false),
        Err(e) => Err(e),
    }
}
