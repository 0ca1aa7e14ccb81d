//! Resource kinds served over xDS and the decoded resource value shared by the decoder,
//! the snapshot cache and the ADS state machines.

use std::fmt;
use std::str::FromStr;

use prost_types::Any;

/// The xDS resource types MARIN3R serves (design.md §3), in ADS push order:
/// cluster → endpoint → listener → route → the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    Cluster,
    Endpoint,
    Listener,
    Route,
    ScopedRoute,
    Secret,
    Runtime,
    ExtensionConfig,
}

impl ResourceType {
    /// Every type, in push order.
    pub const ALL: [ResourceType; 8] = [
        ResourceType::Cluster,
        ResourceType::Endpoint,
        ResourceType::Listener,
        ResourceType::Route,
        ResourceType::ScopedRoute,
        ResourceType::Secret,
        ResourceType::Runtime,
        ResourceType::ExtensionConfig,
    ];

    /// Fully qualified protobuf message name of the resource.
    pub fn message_name(self) -> &'static str {
        match self {
            ResourceType::Cluster => "envoy.config.cluster.v3.Cluster",
            ResourceType::Endpoint => "envoy.config.endpoint.v3.ClusterLoadAssignment",
            ResourceType::Listener => "envoy.config.listener.v3.Listener",
            ResourceType::Route => "envoy.config.route.v3.RouteConfiguration",
            ResourceType::ScopedRoute => "envoy.config.route.v3.ScopedRouteConfiguration",
            ResourceType::Secret => "envoy.extensions.transport_sockets.tls.v3.Secret",
            ResourceType::Runtime => "envoy.service.runtime.v3.Runtime",
            ResourceType::ExtensionConfig => "envoy.config.core.v3.TypedExtensionConfig",
        }
    }

    /// The xDS type URL (`type.googleapis.com/<message>`).
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            ResourceType::Endpoint => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            ResourceType::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            ResourceType::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            ResourceType::ScopedRoute => {
                "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration"
            }
            ResourceType::Secret => {
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
            }
            ResourceType::Runtime => "type.googleapis.com/envoy.service.runtime.v3.Runtime",
            ResourceType::ExtensionConfig => {
                "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
            }
        }
    }

    /// The type for an xDS type URL.
    pub fn from_type_url(url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.type_url() == url)
    }

    /// The name used in EnvoyConfig `spec.resources[].type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceType::Cluster => "cluster",
            ResourceType::Endpoint => "endpoint",
            ResourceType::Listener => "listener",
            ResourceType::Route => "route",
            ResourceType::ScopedRoute => "scopedRoute",
            ResourceType::Secret => "secret",
            ResourceType::Runtime => "runtime",
            ResourceType::ExtensionConfig => "extensionConfig",
        }
    }

    /// The field of the message that holds the resource name.
    pub fn name_field(self) -> &'static str {
        match self {
            ResourceType::Endpoint => "cluster_name",
            _ => "name",
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown EnvoyConfig resource type name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown resource type {0:?} (expected listener, route, scopedRoute, cluster, endpoint, secret, runtime or extensionConfig)"
)]
pub struct UnknownResourceType(pub String);

impl FromStr for ResourceType {
    type Err = UnknownResourceType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownResourceType(s.to_string()))
    }
}

/// As its EnvoyConfig name (`"cluster"`, `"scopedRoute"`, …), e.g. as a map key.
impl serde::Serialize for ResourceType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ResourceType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// One decoded resource, ready to be served.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub kind: ResourceType,
    /// The resource name (`name`, or `cluster_name` for endpoints).
    pub name: String,
    /// The encoded protobuf, with the type URL of `kind`.
    pub body: Any,
    /// Stable digest of the resource's canonical JSON form: equal for equal content
    /// across processes (protobuf encoding of maps is not ordered, so bytes are not).
    pub digest: u64,
}

/// FNV-1a 64: a small, stable, dependency-free hash for versions (not for security).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Formats a digest as a version string (16 hex digits).
pub fn version_string(digest: u64) -> String {
    format!("{digest:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls_round_trip() {
        for t in ResourceType::ALL {
            assert_eq!(ResourceType::from_type_url(t.type_url()), Some(t));
            assert_eq!(t.as_str().parse::<ResourceType>(), Ok(t));
            assert!(t.type_url().ends_with(t.message_name()));
        }
        assert!("bogus".parse::<ResourceType>().is_err());
        assert_eq!(
            ResourceType::ALL[..4],
            [
                ResourceType::Cluster,
                ResourceType::Endpoint,
                ResourceType::Listener,
                ResourceType::Route
            ]
        );
    }

    #[test]
    fn serde_uses_the_envoyconfig_names() {
        let map = std::collections::BTreeMap::from([(ResourceType::ScopedRoute, "v")]);
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, r#"{"scopedRoute":"v"}"#);
        let back: std::collections::BTreeMap<ResourceType, String> =
            serde_json::from_str(&json).unwrap();
        assert_eq!(back[&ResourceType::ScopedRoute], "v");
        assert!(serde_json::from_str::<ResourceType>(r#""bogus""#).is_err());
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(version_string(255), "00000000000000ff");
    }
}
