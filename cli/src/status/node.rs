//! `marin3r status NODE -o yaml|json`: the effective configuration of one node's Envoys,
//! as CSDS reports it (asked with an exact node id and the resource contents): per Envoy
//! and per resource type, each resource with its name, ACKed version, status and its
//! content decoded from its `Any` with the Envoy type registry (protojson, as Envoy's
//! config dump shows it). Secrets are name and version only: the discovery service never
//! sends their contents over CSDS and this dump never prints key material. Every field
//! Envoy marks sensitive (an inline TLS key or password of a listener or cluster) shows
//! `[redacted]`, as in Envoy's `/config_dump` ([`marin3r_envoyconfig::redact`]): the
//! discovery service redacts its answer, and this dump redacts what any server sent.
//! Pure.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::service::status::v3::ClientStatusResponse;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use marin3r_envoyconfig::redact::redact_encoded;
use marin3r_envoyconfig::{Resource, ResourceType, decode};
use serde::Serialize;
use serde_json::Value;

use super::envoys::{metadata, pod_of, type_name};
use marin3r_xds::csds::API_METADATA_KEY;

/// The configuration one Envoy holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyDump {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(rename = "nodeID")]
    pub node_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod: String,
    pub api: String,
    /// Per type (`cluster`, `listener`, …), the resources in name order.
    pub resources: BTreeMap<String, Vec<ResourceDump>>,
}

/// One resource of an Envoy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDump {
    pub name: String,
    /// The version Envoy ACKed.
    pub version: String,
    /// ACKED, NACKED, REQUESTED, DOES_NOT_EXIST, …
    pub status: String,
    /// The resource (protojson); absent for Secrets and when CSDS sent no content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Why `config` could not be decoded (an unknown type, a registry error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The decoded content of one resource, redacted: `None` for Secrets (never shown) and
/// when CSDS sent none; an error text when it does not decode.
pub fn decode_config(c: &GenericXdsConfig) -> Result<Option<Value>, String> {
    let Some(any) = c.xds_config.as_ref() else {
        return Ok(None);
    };
    let kind = ResourceType::from_type_url(&any.type_url)
        .ok_or_else(|| format!("unknown type {}", any.type_url))?;
    if kind == ResourceType::Secret {
        return Ok(None);
    }
    // Redacted here too: the server may be another one that sends what it holds.
    let shown = redact_encoded(&any.type_url, &any.value).map_err(|e| e.to_string())?;
    let resource = Resource {
        kind,
        name: c.name.clone(),
        body: prost_types::Any {
            type_url: any.type_url.clone(),
            value: shown.into_owned(),
        },
        digest: 0,
    };
    decode::to_json(&resource)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Every Envoy of `response` with its resources; `replica` labels them.
pub fn dump(response: &ClientStatusResponse, replica: Option<&str>) -> Vec<EnvoyDump> {
    response
        .config
        .iter()
        .map(|client| {
            let node = client.node.clone().unwrap_or_default();
            let mut resources: BTreeMap<String, Vec<ResourceDump>> = BTreeMap::new();
            for c in &client.generic_xds_configs {
                let (config, error) = match decode_config(c) {
                    Ok(config) => (config, None),
                    Err(e) => (None, Some(e)),
                };
                resources
                    .entry(type_name(&c.type_url))
                    .or_default()
                    .push(ResourceDump {
                        name: c.name.clone(),
                        version: c.version_info.clone(),
                        status: ClientResourceStatus::try_from(c.client_status)
                            .unwrap_or_default()
                            .as_str_name()
                            .to_string(),
                        config,
                        error,
                    });
            }
            for list in resources.values_mut() {
                list.sort_by(|a, b| a.name.cmp(&b.name));
            }
            EnvoyDump {
                replica: replica.map(str::to_string),
                node_id: node.id.clone(),
                pod: pod_of(&node),
                api: metadata(&node, API_METADATA_KEY)
                    .unwrap_or_default()
                    .to_string(),
                resources,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::status::v3::ClientConfig;
    use envoy_types::pb::google::protobuf::Any;

    #[test]
    fn resources_are_decoded_and_secrets_are_name_and_version_only() {
        let cluster = marin3r_envoyconfig::decode_resource(
            ResourceType::Cluster,
            &serde_json::json!({"name": "kuard", "connect_timeout": "1s"}),
        )
        .unwrap();
        let any = |type_url: &str, value: Vec<u8>| Any {
            type_url: type_url.into(),
            value,
        };
        let response = ClientStatusResponse {
            config: vec![ClientConfig {
                generic_xds_configs: vec![
                    GenericXdsConfig {
                        type_url: ResourceType::Cluster.type_url().into(),
                        name: "kuard".into(),
                        version_info: "v1".into(),
                        client_status: ClientResourceStatus::Acked as i32,
                        xds_config: Some(any(&cluster.body.type_url, cluster.body.value.clone())),
                        ..GenericXdsConfig::default()
                    },
                    GenericXdsConfig {
                        type_url: ResourceType::Secret.type_url().into(),
                        name: "tls".into(),
                        version_info: "s1".into(),
                        client_status: ClientResourceStatus::Acked as i32,
                        // Even if a server sent one, it is never decoded nor printed.
                        xds_config: Some(any(ResourceType::Secret.type_url(), vec![10, 3])),
                        ..GenericXdsConfig::default()
                    },
                    GenericXdsConfig {
                        type_url: "type.googleapis.com/x.Unknown".into(),
                        name: "u".into(),
                        xds_config: Some(any("type.googleapis.com/x.Unknown", vec![])),
                        ..GenericXdsConfig::default()
                    },
                ],
                ..ClientConfig::default()
            }],
        };
        let dumps = dump(&response, None);
        let json = serde_json::to_value(&dumps).unwrap();
        assert_eq!(
            json[0]["resources"]["cluster"][0],
            serde_json::json!({"name": "kuard", "version": "v1", "status": "ACKED",
                "config": {"name": "kuard", "connectTimeout": "1s"}})
        );
        assert_eq!(
            json[0]["resources"]["secret"][0],
            serde_json::json!({"name": "tls", "version": "s1", "status": "ACKED"})
        );
        assert_eq!(
            json[0]["resources"]["type.googleapis.com/x.Unknown"][0]["error"],
            "unknown type type.googleapis.com/x.Unknown"
        );
    }
}
