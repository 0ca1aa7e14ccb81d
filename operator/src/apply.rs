//! How the operator writes: [`marin3r_kube::apply`] under the operator's field manager
//! [`FIELD_MANAGER`] (forced: the operator owns the fields it applies).

use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use marin3r_kube::apply::{delete_if_exists, get};
pub use marin3r_kube::scoped;

use super::FIELD_MANAGER;

/// Server-side applies `object` (named by its metadata) in `namespace` as the operator;
/// returns what the API server answered.
pub async fn apply<K>(client: &Client, namespace: &str, object: &K) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    marin3r_kube::apply::apply(client, namespace, object, FIELD_MANAGER).await
}

/// Applies `status` on the status subresource of `name` as the operator, unless it is
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
    marin3r_kube::apply::write_status::<K, S>(
        client,
        namespace,
        name,
        current,
        status,
        FIELD_MANAGER,
    )
    .await
}
