//! How the operator writes: server-side apply under [`FIELD_MANAGER`] (forced: the
//! operator owns the fields it applies), status through the status subresource, and
//! deletion of objects a spec no longer asks for.

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::FIELD_MANAGER;

/// Server-side applies `object` (named by its metadata) in `namespace`; returns what the
/// API server answered.
pub async fn apply<K>(client: &Client, namespace: &str, object: &K) -> Result<K, kube::Error>
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
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
}

/// Server-side applies `status` on the status subresource of `name`, unless it is
/// `current` already.
pub async fn write_status<K, S>(
    client: &Client,
    namespace: &str,
    name: &str,
    current: Option<&S>,
    status: &S,
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
    crate::kubernetes::controller::apply_status_as(&api, name, status, FIELD_MANAGER).await
}

/// `K` in `namespace`, or in every namespace (`None`).
pub fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
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

/// Deletes `name` in `namespace` if it exists (a spec that no longer asks for it);
/// returns whether it existed.
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
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}
