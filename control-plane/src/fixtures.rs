//! Fixtures shared by the unit tests of this crate.

use std::sync::Arc;

use marin3r_envoyconfig::envoyconfig::EnvoyConfigSpec;

/// `secs` seconds after the Unix epoch: a fixed "now".
pub(crate) use marin3r_testkit::unix_time as t;

/// The spec of node `kuard` with one cluster, `c<port>`, that decodes: distinct `port`s
/// give distinct versions.
pub(crate) fn spec(port: u64) -> Arc<EnvoyConfigSpec> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "nodeID": "kuard",
            "resources": [{"type": "cluster", "value": {"name": format!("c{port}"), "connect_timeout": "1s"}}]
        }))
        .unwrap_or_else(|e| panic!("the fixture spec: {e}")),
    )
}
