//! The Envoy config model of MARIN3R, free of I/O: the complete Envoy v3 type registry
//! ([`registry`]), protojson decoding of JSON/YAML resources ([`decode`]), the served
//! resource kinds ([`resource`]), the `EnvoyConfig` and `EnvoyConfigRevision` custom
//! resources ([`envoyconfig`], [`envoyconfigrevision`]) with resolving a spec into the
//! resources to serve (Secrets included), and reading Kubernetes manifest files
//! ([`manifest`]).
//!
//! It has no async runtime, no gRPC and no Kubernetes client in its dependency tree:
//! the webhook and `marin3r validate` depend on it alone; the xDS server and the control
//! plane build on it.
#![forbid(unsafe_code)]

pub mod decode;
pub mod envoyconfig;
pub mod envoyconfigrevision;
mod lenient;
pub mod manifest;
mod pgv;
pub mod registry;
pub mod resource;
mod tls;

pub use decode::{DecodeError, Serialization, decode_resource, decode_str};
pub use envoyconfig::config_version;
pub use resource::{Resource, ResourceType};
