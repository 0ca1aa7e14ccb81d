//! The pure sidecar toolkit: MARIN3R pod annotations → validated [`SidecarConfig`] →
//! Envoy sidecar containers, init container, volumes and pod changes; plus the Envoy
//! bootstrap that `marin3r init-manager` writes. No sockets, no async runtime.
#![forbid(unsafe_code)]

pub mod bootstrap;
