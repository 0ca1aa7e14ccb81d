//! The `marin3r.3scale.net/sidecar-status` record: what an injection added and changed,
//! so that a second injection first undoes it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the webhook injected, recorded in the `marin3r.3scale.net/sidecar-status`
/// annotation so a second injection first removes these objects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarStatus {
    #[serde(default)]
    pub containers: Vec<String>,
    #[serde(default)]
    pub init_containers: Vec<String>,
    #[serde(default)]
    pub volumes: Vec<String>,
    /// The `terminationGracePeriodSeconds` injection raised (shutdown manager on), so a
    /// re-injection without the shutdown manager can put it back. Absent in statuses
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<GracePeriodChange>,
    /// The containers whose preStop injection replaced with `GET /drain`
    /// (`shutdown-manager.extra-lifecycle-hooks`), with their lifecycle before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_stop_hooks: Vec<PreStopChange>,
    /// The extra Secret and ConfigMap volumes injection added and mounted into Envoy
    /// (`envoy-extra-secret-volumes`, `envoy-extra-configmap-volumes`). Absent when there
    /// are none, and in statuses written before they existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_volumes: Vec<ExtraVolumeMount>,
}

/// An extra volume injection added, and where it mounted it in the Envoy container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtraVolumeMount {
    pub name: String,
    pub mount_path: String,
}

/// `spec.terminationGracePeriodSeconds` before and after injection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GracePeriodChange {
    /// The Pod's own value; `None` when it had none.
    #[serde(default)]
    pub previous: Option<i64>,
    /// The value injection set.
    pub injected: i64,
}

/// A container's `lifecycle` before injection set its preStop to `GET /drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreStopChange {
    pub container: String,
    /// The container's `lifecycle`; `None` when it had none.
    #[serde(default)]
    pub lifecycle: Option<Value>,
}
