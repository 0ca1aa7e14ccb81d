//! The complete Envoy v3 type registry: every message of the Envoy API and its
//! extensions, as shipped by the `envoy-types` crate, in one [`DescriptorPool`].
//!
//! The descriptor set is produced at build time by `build.rs` from envoy-types' own
//! `.proto` sources (`protoc --include_imports`) and embedded in the binary, so any
//! `@type` Envoy knows resolves here, and nothing is downloaded at run time.
//!
//! Regenerating: the set is rebuilt automatically when `Cargo.lock` changes (an
//! `envoy-types` upgrade) or `build.rs` changes; `touch xds/build.rs` forces it. The build
//! needs `protoc` (Debian `protobuf-compiler` + `libprotobuf-dev`, or `$PROTOC`).

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, MessageDescriptor};

use crate::decode::DecodeError;
use crate::resource::ResourceType;

/// The encoded `FileDescriptorSet` written by `build.rs`.
pub static DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptor_set.bin"));

static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    let pool = DescriptorPool::decode(DESCRIPTOR_SET).map_err(|e| e.to_string())?;
    // Every served resource type must be present, or nothing can be decoded.
    for kind in ResourceType::ALL {
        if pool.get_message_by_name(kind.message_name()).is_none() {
            return Err(format!("message {} is missing", kind.message_name()));
        }
    }
    Ok(pool)
});

/// The Envoy type registry, loaded once on first use.
///
/// Fails only if the embedded descriptor set is corrupt (a broken build), never because
/// of user input.
pub fn pool() -> Result<&'static DescriptorPool, DecodeError> {
    POOL.as_ref()
        .map_err(|e| DecodeError::Registry(format!("embedded Envoy descriptor set: {e}")))
}

/// The message descriptor of a resource type.
pub fn message_descriptor(kind: ResourceType) -> Result<MessageDescriptor, DecodeError> {
    pool()?
        .get_message_by_name(kind.message_name())
        .ok_or_else(|| DecodeError::Registry(format!("message {} is missing", kind.message_name())))
}

/// Resolves an `Any` type URL (`type.googleapis.com/<full message name>`; any host part
/// before the last `/` is accepted, as protobuf does) to its message descriptor.
pub fn resolve_type_url(type_url: &str) -> Option<MessageDescriptor> {
    let name = type_url.rsplit_once('/').map_or(type_url, |(_, n)| n);
    if name.is_empty() {
        return None;
    }
    pool().ok()?.get_message_by_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_type_resolves() {
        for kind in ResourceType::ALL {
            let desc = message_descriptor(kind).unwrap();
            assert_eq!(desc.full_name(), kind.message_name());
            assert!(
                desc.get_field_by_name(kind.name_field()).is_some(),
                "{kind}"
            );
            assert_eq!(resolve_type_url(kind.type_url()).unwrap(), desc);
        }
    }

    #[test]
    fn registry_is_complete() {
        let pool = pool().unwrap();
        // Every envoy/**/*.proto of data-plane-api, plus xds/udpa and imports.
        let envoy_files = pool
            .files()
            .filter(|f| f.name().starts_with("envoy/"))
            .count();
        assert!(envoy_files >= 450, "only {envoy_files} envoy files");
        for name in [
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "envoy.extensions.filters.http.router.v3.Router",
            "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "envoy.extensions.filters.http.lua.v3.Lua",
            "envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "envoy.config.bootstrap.v3.Bootstrap",
            "envoy.service.discovery.v3.DiscoveryRequest",
            "xds.type.matcher.v3.Matcher",
            "google.protobuf.Struct",
            "google.protobuf.Duration",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name} missing");
        }
        assert!(resolve_type_url("type.googleapis.com/foo.Bar").is_none());
        assert!(resolve_type_url("type.googleapis.com/").is_none());
    }
}
