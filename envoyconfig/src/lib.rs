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
//!
//! The modules stand in layers, each using only those below it:
//!
//! - the custom resources: [`discoveryservicereplica`] (what each replica of a
//!   discovery service with several replicas reports), [`envoyconfigrevision`] over
//!   [`envoyconfig`] (resolving a
//!   spec, remembering decoded resources in [`memo`]), which reads files with
//!   [`manifest`] and Secrets through `secret`
//!   (`SecretData`, `SecretSource`, re-exported by [`envoyconfig`]);
//! - decoding: [`decode`], the pipeline, over `lenient` (Envoy's loader leniencies),
//!   `pgv` (Envoy's constraints: PGV rules, extension lookups, then `tls`, the TLS
//!   loader's checks), `strict` (strict protojson with field paths) and `canonical`
//!   (canonical bytes and JSON);
//! - the ground: `error` (`DecodeError`, `Location`, field paths; re-exported by
//!   [`decode`]), [`sensitive`] (the fields Envoy marks sensitive, and keeping their
//!   values out of every error text; [`redact`]: out of every resource we show),
//!   [`registry`], `text` (JSON/YAML and the YAML
//!   parser's options), `wellknown` (well-known types, the empty-`Any` placeholder)
//!   and [`resource`].
#![forbid(unsafe_code)]

mod canonical;
pub mod decode;
pub mod discoveryservicereplica;
pub mod endpoints;
pub mod envoyconfig;
pub mod envoyconfigrevision;
mod error;
mod lenient;
pub mod manifest;
pub mod memo;
pub mod pem;
mod pgv;
pub mod redact;
pub mod registry;
pub mod resource;
mod secret;
pub mod sensitive;
mod strict;
mod text;
mod tls;
mod wellknown;

pub use decode::{DecodeError, Serialization, decode_resource, decode_str};
pub use envoyconfig::config_version;
pub use resource::{Resource, ResourceType};
