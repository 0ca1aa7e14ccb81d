//! Envoy discovery service (ADS SotW/Delta, type registry, snapshot cache).
//! Stub: filled by the discovery-service issue.
#![forbid(unsafe_code)]
