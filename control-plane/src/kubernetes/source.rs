//! [`StoreSource`]: the [`SecretSource`] of Kubernetes mode, reading Secrets and
//! EndpointSlices from the reflector stores (no API call while resolving).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt as _;
use kube::runtime::reflector::{ObjectRef, Store};

use super::plan::selector_matches;
use marin3r_envoyconfig::envoyconfig::{SecretData, SecretSource};

/// Secrets and EndpointSlices of one namespace, from the watch caches.
pub struct StoreSource<'a> {
    /// The namespace of the EnvoyConfig being resolved.
    pub namespace: &'a str,
    pub secrets: &'a Store<Secret>,
    pub slices: &'a Store<EndpointSlice>,
}

/// The type and decoded data of a Secret (`data`, then `stringData` on top).
pub fn secret_data(secret: &Secret) -> SecretData {
    let mut data: std::collections::BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), v.as_bytes().to_vec());
    }
    SecretData {
        type_: secret.type_.clone().unwrap_or_default(),
        data,
    }
}

impl SecretSource for StoreSource<'_> {
    fn get(&self, name: &str) -> Option<SecretData> {
        let key = ObjectRef::<Secret>::new(name).within(self.namespace);
        self.secrets.get(&key).map(|s| secret_data(&s))
    }

    fn endpoint_slices(&self, selector: Option<&LabelSelector>) -> Option<Vec<EndpointSlice>> {
        let mut slices: Vec<EndpointSlice> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(self.namespace)
                    && selector_matches(selector, s.labels())
            })
            .map(|s| (*s).clone())
            .collect();
        // Stable order, so the generated ClusterLoadAssignment (and its version) is too.
        slices.sort_by_key(|s| s.name_any());
        Some(slices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::runtime::{reflector, watcher};
    use std::collections::BTreeMap;

    #[test]
    fn reads_secrets_and_slices_of_its_namespace_only() {
        let (secrets, mut w) = reflector::store::<Secret>();
        let mut secret = Secret::default();
        secret.metadata.name = Some("tls".into());
        secret.metadata.namespace = Some("a".into());
        secret.type_ = Some("kubernetes.io/tls".into());
        secret.data = Some(BTreeMap::from([(
            "tls.crt".to_string(),
            ByteString(b"C".to_vec()),
        )]));
        w.apply_watcher_event(&watcher::Event::Apply(secret.clone()));
        secret.metadata.namespace = Some("b".into());
        w.apply_watcher_event(&watcher::Event::Apply(secret));

        let (slices, mut w) = reflector::store::<EndpointSlice>();
        for (ns, name) in [("a", "s2"), ("a", "s1"), ("b", "s3")] {
            let mut s = EndpointSlice::default();
            s.metadata.name = Some(name.into());
            s.metadata.namespace = Some(ns.into());
            s.metadata.labels = Some(BTreeMap::from([("app".to_string(), "kuard".to_string())]));
            w.apply_watcher_event(&watcher::Event::Apply(s));
        }
        let source = StoreSource {
            namespace: "a",
            secrets: &secrets,
            slices: &slices,
        };
        let data = source.get("tls").unwrap();
        assert_eq!(data.type_, "kubernetes.io/tls");
        assert_eq!(data.data["tls.crt"], b"C");
        assert!(source.get("other").is_none());
        let all = LabelSelector::default();
        let names: Vec<String> = source
            .endpoint_slices(Some(&all))
            .unwrap()
            .iter()
            .map(|s| s.name_any())
            .collect();
        assert_eq!(names, ["s1", "s2"]);
        assert!(source.endpoint_slices(None).unwrap().is_empty());
    }
}
