//! What every object the operator generates shares: its labels and its controller owner
//! reference.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use marin3r_wire::app_labels;

/// Component label of what a DiscoveryService generates.
pub const DISCOVERY_SERVICE_COMPONENT: &str = "discovery-service";
/// Component label of what an EnvoyDeployment generates.
pub const ENVOY_DEPLOYMENT_COMPONENT: &str = "envoy-deployment";

/// `L(owner)` of operator-design.md §3.3 / §5.3: the labels of every object generated for
/// the owner `instance` of `component`.
pub fn labels(component: &str, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            app_labels::NAME.to_string(),
            app_labels::MARIN3R.to_string(),
        ),
        (
            app_labels::MANAGED_BY.to_string(),
            app_labels::OPERATOR.to_string(),
        ),
        (app_labels::COMPONENT.to_string(), component.to_string()),
        (app_labels::INSTANCE.to_string(), instance.to_string()),
    ])
}

/// The controller owner reference to `owner` (`controller: true`,
/// `blockOwnerDeletion: true`), or `None` when the owner has no uid yet (an object read
/// from a file by `marin3r operator render`, which prints no owner references).
pub fn owner_reference<K>(owner: &K) -> Option<OwnerReference>
where
    K: kube::Resource<DynamicType = ()>,
{
    let meta = owner.meta();
    Some(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Metadata of an object named `name` in `namespace`, labelled `labels` and owned by
/// `owner`.
pub fn metadata<K>(
    name: &str,
    namespace: &str,
    labels: BTreeMap<String, String>,
    owner: &K,
) -> ObjectMeta
where
    K: kube::Resource<DynamicType = ()>,
{
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(labels),
        owner_references: owner_reference(owner).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_operator_api::DiscoveryService;

    #[test]
    fn objects_are_labelled_and_owned_by_their_controller_object() {
        let mut ds = DiscoveryService::new("instance", Default::default());
        assert_eq!(owner_reference(&ds), None, "no uid: rendered from a file");
        ds.metadata.uid = Some("u-1".into());
        let meta = metadata(
            "marin3r-instance",
            "ns",
            labels(DISCOVERY_SERVICE_COMPONENT, "instance"),
            &ds,
        );
        let owner = &meta.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "DiscoveryService");
        assert_eq!(owner.api_version, "operator.marin3r.3scale.net/v1alpha1");
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        let labels = meta.labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], app_labels::OPERATOR);
        assert_eq!(labels["app.kubernetes.io/instance"], "instance");
        assert_eq!(
            marin3r_wire::app_labels::MANAGED_BY_OPERATOR,
            format!("app.kubernetes.io/managed-by={}", app_labels::OPERATOR)
        );
    }
}
