//! [`Lenient`]: a watched custom resource that may fail to deserialize.
//!
//! A watch (and its list) of `EnvoyConfig` fails as a whole when one object does not
//! deserialize, which would stop the controller for every object. Like Linkerd's policy
//! controller, the watched type is a wrapper: the object's metadata is always read, its
//! body is kept as an error message when it does not fit the Rust type, and the
//! controller logs and skips that one object.
//!
//! Why not kube-core's `DeserializeGuard` (kube 5), which has the same shape: its error is
//! serde's bare message ("invalid type: integer `42`, expected a string"), without the
//! field path. A user fixing a malformed EnvoyConfig needs the path
//! (`spec.nodeID: invalid type …`), which `Lenient` keeps by deserializing through
//! `serde_path_to_error`; the test below asserts it.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

/// A custom resource `K`, or the metadata of an object that is not a valid `K`.
#[derive(Clone, PartialEq)]
pub enum Lenient<K> {
    /// The object deserialized.
    Valid(K),
    /// The object did not deserialize: its metadata and the error (with its field path).
    Malformed {
        metadata: Box<ObjectMeta>,
        error: String,
    },
}

impl<K> Lenient<K> {
    /// The object, or the deserialization error.
    pub fn valid(&self) -> Result<&K, &str> {
        match self {
            Lenient::Valid(k) => Ok(k),
            Lenient::Malformed { error, .. } => Err(error),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for Lenient<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lenient::Valid(k) => k.fmt(f),
            Lenient::Malformed { metadata, error } => f
                .debug_struct("Malformed")
                .field("name", &metadata.name)
                .field("namespace", &metadata.namespace)
                .field("error", error)
                .finish(),
        }
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Valid(k) => k.meta(),
            Lenient::Malformed { metadata, .. } => metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Valid(k) => k.meta_mut(),
            Lenient::Malformed { metadata, .. } => metadata,
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(k) => Ok(Lenient::Valid(k)),
            Err(e) => {
                // Without readable metadata the object cannot even be named: that is an
                // API server bug, and fails the list as usual.
                let metadata =
                    ObjectMeta::deserialize(&value["metadata"]).map_err(D::Error::custom)?;
                Ok(Lenient::Malformed {
                    metadata: Box::new(metadata),
                    error: e.to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_envoyconfig::envoyconfig::EnvoyConfig;

    #[test]
    fn one_malformed_item_does_not_fail_the_list() {
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"},
            "items": [
                {"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                 "metadata": {"name": "good", "namespace": "default"}, "spec": {"nodeID": "a"}},
                {"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                 "metadata": {"name": "bad", "namespace": "default"}, "spec": {"nodeID": 42}}
            ]
        });
        let list: kube::core::ObjectList<Lenient<EnvoyConfig>> =
            serde_json::from_value(list).unwrap();
        assert!(list.items[0].valid().is_ok());
        let Lenient::Malformed { metadata, error } = &list.items[1] else {
            panic!("expected malformed");
        };
        assert_eq!(metadata.name.as_deref(), Some("bad"));
        assert!(error.contains("spec.nodeID"), "{error}");
        assert_eq!(list.items[1].meta().name.as_deref(), Some("bad"));
        assert_eq!(Lenient::<EnvoyConfig>::plural(&()), "envoyconfigs");
        assert!(format!("{:?}", list.items[1]).contains("Malformed"));
    }

    #[test]
    fn unreadable_metadata_is_an_error() {
        let bad = serde_json::json!({"metadata": {"name": 1}, "spec": 2});
        assert!(serde_json::from_value::<Lenient<EnvoyConfig>>(bad).is_err());
    }
}
