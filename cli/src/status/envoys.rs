//! The Envoys of `marin3r status`: what CSDS tells about each open ADS stream, as a
//! report (`-o json`) and as the `ENVOYS` table: one row per Envoy and resource type,
//! with the number of resources, the ACKed version, the worst status of the type's
//! resources and Envoy's NACK message (cut to [`NACK_CELL_CHARS`] in the table, whole in
//! JSON). Pure: the CSDS answer in, text out.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::{ClientStatusResponse, ConfigStatus};
use envoy_types::pb::google::protobuf::Timestamp;
use marin3r_envoyconfig::ResourceType;
use marin3r_envoyconfig::pem::redact_pem;
use serde::Serialize;

use super::table::table;
use crate::terminal::cell;

/// Node metadata keys the discovery service reports (the injected bootstrap sets the pod's;
/// the CSDS server adds the stream's API).
use marin3r_wire::{POD_NAME_METADATA_KEY, POD_NAMESPACE_METADATA_KEY};
use marin3r_xds::csds::API_METADATA_KEY;

/// The NACK column shows at most this many characters of Envoy's message, which names
/// the rejected resource (`-o json` has it whole, with the rejected version).
pub const NACK_CELL_CHARS: usize = 80;

/// One Envoy (one open ADS stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyReport {
    /// The discovery service replica that reported it (its `--csds-address`), when more
    /// than one was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(rename = "nodeID")]
    pub node_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// `namespace/name` of its pod (node metadata), or the name alone, or empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// `sotw` or `delta`.
    pub api: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    /// Per resource type, in ADS push order.
    pub types: Vec<TypeReport>,
}

/// The resources of one type an Envoy subscribed to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeReport {
    /// `cluster`, `listener`, … (an EnvoyConfig's names), else the type URL.
    #[serde(rename = "type")]
    pub type_: String,
    pub resources: usize,
    /// The ACKed versions of the type's resources, each once (one with SotW).
    pub acked_versions: Vec<String>,
    /// The worst client status of its resources: NACKED, DOES_NOT_EXIST, REQUESTED,
    /// ACKED (…, UNKNOWN).
    pub status: String,
    /// The worst config status: ERROR, STALE, NOT_SENT, SYNCED (…, UNKNOWN).
    pub sync: String,
    /// Every resource Envoy rejected.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nacks: Vec<NackReport>,
}

/// A rejected resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NackReport {
    pub resource: String,
    pub rejected_version: String,
    /// Envoy's message, whole.
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_update_attempt: Option<String>,
}

/// A metadata string of `node`.
pub use marin3r_xds::node::metadata_string as metadata;

/// `namespace/name` of the node's pod, its name alone, or empty.
pub fn pod_of(node: &Node) -> String {
    match (
        metadata(node, POD_NAMESPACE_METADATA_KEY),
        metadata(node, POD_NAME_METADATA_KEY),
    ) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => format!("{ns}/{name}"),
        (_, Some(name)) => name.to_string(),
        _ => String::new(),
    }
}

/// The short name of a type URL: an EnvoyConfig type name, else the URL itself.
pub fn type_name(type_url: &str) -> String {
    ResourceType::from_type_url(type_url)
        .map_or_else(|| type_url.to_string(), |t| t.as_str().to_string())
}

/// Push order of a type URL (known types first, in ADS order).
fn type_order(type_url: &str) -> (usize, String) {
    let known = ResourceType::ALL
        .iter()
        .position(|t| t.type_url() == type_url)
        .unwrap_or(ResourceType::ALL.len());
    (known, type_url.to_string())
}

/// Badness of a client status: the summary of a type is its worst resource.
fn client_rank(status: ClientResourceStatus) -> u8 {
    match status {
        ClientResourceStatus::Nacked => 6,
        ClientResourceStatus::ReceivedError => 5,
        ClientResourceStatus::Timeout => 4,
        ClientResourceStatus::DoesNotExist => 3,
        ClientResourceStatus::Requested => 2,
        ClientResourceStatus::Unknown => 1,
        ClientResourceStatus::Acked => 0,
    }
}

fn config_rank(status: ConfigStatus) -> u8 {
    match status {
        ConfigStatus::Error => 4,
        ConfigStatus::Stale => 3,
        ConfigStatus::NotSent => 2,
        ConfigStatus::Unknown => 1,
        ConfigStatus::Synced => 0,
    }
}

/// RFC 3339 UTC of a protobuf timestamp (whole seconds).
pub fn timestamp(t: &Timestamp) -> Option<String> {
    let secs = u64::try_from(t.seconds).ok()?;
    Some(marin3r_control_plane::status::rfc3339(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
    ))
}

fn summarise(type_url: &str, configs: &[&GenericXdsConfig]) -> TypeReport {
    let client = configs
        .iter()
        .map(|c| ClientResourceStatus::try_from(c.client_status).unwrap_or_default())
        .max_by_key(|s| client_rank(*s))
        .unwrap_or_default();
    let sync = configs
        .iter()
        .map(|c| ConfigStatus::try_from(c.config_status).unwrap_or_default())
        .max_by_key(|s| config_rank(*s))
        .unwrap_or_default();
    let mut acked_versions: Vec<String> = Vec::new();
    for c in configs {
        if !c.version_info.is_empty() && !acked_versions.contains(&c.version_info) {
            acked_versions.push(c.version_info.clone());
        }
    }
    let nacks = configs
        .iter()
        .filter_map(|c| {
            let e = c.error_state.as_ref()?;
            Some(NackReport {
                resource: c.name.clone(),
                rejected_version: e.version_info.clone(),
                // Stored redacted by the discovery service; again here, for any server.
                message: redact_pem(&e.details).into_owned(),
                last_update_attempt: e.last_update_attempt.as_ref().and_then(timestamp),
            })
        })
        .collect();
    TypeReport {
        type_: type_name(type_url),
        resources: configs.len(),
        acked_versions,
        status: client.as_str_name().to_string(),
        sync: sync.as_str_name().to_string(),
        nacks,
    }
}

/// The Envoys of one CSDS answer, ordered by node id, pod and API; `replica` labels them.
pub fn envoys(response: &ClientStatusResponse, replica: Option<&str>) -> Vec<EnvoyReport> {
    let mut out: Vec<EnvoyReport> = response
        .config
        .iter()
        .map(|client| {
            let node = client.node.clone().unwrap_or_default();
            let mut by_type: BTreeMap<(usize, String), Vec<&GenericXdsConfig>> = BTreeMap::new();
            for c in &client.generic_xds_configs {
                by_type.entry(type_order(&c.type_url)).or_default().push(c);
            }
            EnvoyReport {
                replica: replica.map(str::to_string),
                node_id: node.id.clone(),
                cluster: node.cluster.clone(),
                pod: pod_of(&node),
                api: metadata(&node, API_METADATA_KEY)
                    .unwrap_or_default()
                    .to_string(),
                user_agent: node.user_agent_name.clone(),
                types: by_type
                    .iter()
                    .map(|((_, url), configs)| summarise(url, configs))
                    .collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.replica, &a.node_id, &a.pod, &a.api).cmp(&(&b.replica, &b.node_id, &b.pod, &b.api))
    });
    out
}

/// `message` on one line (whitespace runs become one space), cut to `max` characters
/// with `…` when longer.
pub fn one_line(message: &str, max: usize) -> String {
    let flat = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Why the Envoy rows are missing (the CSDS of one replica could not be asked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unavailable {
    /// The `--csds-address`, or empty when none could be tried.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub address: String,
    pub reason: String,
}

/// The `ENVOYS` section: a title line, then the table (`REPLICA` first when
/// `with_replica`), then one line per replica that could not be asked.
pub fn render_envoys(
    envoys: &[EnvoyReport],
    unavailable: &[Unavailable],
    with_replica: bool,
) -> String {
    let mut out = String::from("ENVOYS\n");
    if envoys.is_empty() && unavailable.is_empty() {
        out.push_str("No Envoy is connected.\n");
    } else if !envoys.is_empty() {
        let mut header = vec![
            "NODE ID",
            "POD",
            "API",
            "TYPE",
            "RESOURCES",
            "ACKED VERSION",
            "STATUS",
            "SYNC",
            "NACK",
        ];
        if with_replica {
            header.insert(0, "REPLICA");
        }
        let mut rows = Vec::new();
        for e in envoys {
            let lead = |type_cells: Vec<String>| {
                let mut row = vec![e.node_id.clone(), e.pod.clone(), e.api.clone()];
                row.extend(type_cells);
                if with_replica {
                    row.insert(0, e.replica.clone().unwrap_or_default());
                }
                row
            };
            if e.types.is_empty() {
                rows.push(lead(vec![
                    "-".into(),
                    "0".into(),
                    String::new(),
                    "NO SUBSCRIPTION".into(),
                    String::new(),
                    String::new(),
                ]));
            }
            for t in &e.types {
                let version = match t.acked_versions.as_slice() {
                    [] => String::new(),
                    [one] => one.clone(),
                    many => format!("{} versions", many.len()),
                };
                let nack = t
                    .nacks
                    .first()
                    .map(|n| {
                        let more = match t.nacks.len() {
                            1 => String::new(),
                            n => format!("(+{} more) ", n - 1),
                        };
                        one_line(&format!("{more}{}", n.message), NACK_CELL_CHARS)
                    })
                    .unwrap_or_default();
                rows.push(lead(vec![
                    t.type_.clone(),
                    t.resources.to_string(),
                    version,
                    t.status.clone(),
                    t.sync.clone(),
                    nack,
                ]));
            }
        }
        out.push_str(&table(&header, &rows));
    }
    for u in unavailable {
        if u.address.is_empty() {
            out.push_str(&format!("Envoys not shown: {}\n", cell(&u.reason)));
        } else {
            out.push_str(&format!(
                "Envoys of {} not shown: {}\n",
                cell(&u.address),
                cell(&u.reason)
            ));
        }
    }
    out
}

/// The lines under the `ENVOYS` table that pair EnvoyConfigs with Envoys: node ids with
/// an EnvoyConfig and no Envoy connected, and Envoys whose node id has no EnvoyConfig
/// (the discovery service holds them: nothing is sent). Only meaningful when every
/// replica answered.
pub fn unpaired(node_ids: &[&str], envoys: &[EnvoyReport]) -> String {
    let mut out = String::new();
    let mut idle: Vec<&str> = node_ids
        .iter()
        .copied()
        .filter(|id| !envoys.iter().any(|e| e.node_id == *id))
        .collect();
    idle.sort_unstable();
    idle.dedup();
    if !idle.is_empty() {
        out.push_str(&format!(
            "No Envoy connected for node {}.\n",
            marin3r_wire::quote::listed(idle.iter().map(|s| cell(s).into_owned()), ", ")
        ));
    }
    let mut stray: Vec<String> = envoys
        .iter()
        .filter(|e| !node_ids.contains(&e.node_id.as_str()))
        .map(|e| {
            if e.pod.is_empty() {
                cell(&e.node_id).into_owned()
            } else {
                format!("{} ({})", cell(&e.node_id), cell(&e.pod))
            }
        })
        .collect();
    stray.dedup();
    if !stray.is_empty() {
        out.push_str(&format!(
            "No EnvoyConfig for the node of: {}.\n",
            marin3r_wire::quote::listed(stray, ", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::admin::v3::UpdateFailureState;
    use envoy_types::pb::envoy::service::status::v3::ClientConfig;
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

    fn node(id: &str, pod: &str, api: &str) -> Node {
        let s = |v: &str| Value {
            kind: Some(Kind::StringValue(v.into())),
        };
        Node {
            id: id.into(),
            metadata: Some(Struct {
                fields: [
                    (POD_NAME_METADATA_KEY.to_string(), s(pod)),
                    (POD_NAMESPACE_METADATA_KEY.to_string(), s("default")),
                    (API_METADATA_KEY.to_string(), s(api)),
                ]
                .into(),
            }),
            ..Node::default()
        }
    }

    fn config(
        kind: ResourceType,
        name: &str,
        version: &str,
        client: ClientResourceStatus,
        nack: Option<&str>,
    ) -> GenericXdsConfig {
        GenericXdsConfig {
            type_url: kind.type_url().into(),
            name: name.into(),
            version_info: version.into(),
            client_status: client as i32,
            config_status: if nack.is_some() {
                ConfigStatus::Error as i32
            } else {
                ConfigStatus::Synced as i32
            },
            error_state: nack.map(|m| UpdateFailureState {
                details: m.into(),
                version_info: "bad1".into(),
                last_update_attempt: Some(Timestamp {
                    seconds: 10,
                    nanos: 0,
                }),
                failed_configuration: None,
            }),
            ..GenericXdsConfig::default()
        }
    }

    const LONG_NACK: &str = "Error adding/updating listener(s) http: malformed IP address: \
                             not-an-ip. Consider setting resolver_name or setting cluster type \
                             to 'STRICT_DNS' or 'LOGICAL_DNS'";

    fn fleet() -> ClientStatusResponse {
        ClientStatusResponse {
            config: vec![
                ClientConfig {
                    node: Some(node("kuard", "kuard-b", "delta")),
                    generic_xds_configs: vec![
                        config(
                            ResourceType::Listener,
                            "http",
                            "v1",
                            ClientResourceStatus::Nacked,
                            Some(LONG_NACK),
                        ),
                        config(
                            ResourceType::Cluster,
                            "a",
                            "c1",
                            ClientResourceStatus::Acked,
                            None,
                        ),
                        config(
                            ResourceType::Cluster,
                            "b",
                            "c2",
                            ClientResourceStatus::Acked,
                            None,
                        ),
                    ],
                    ..ClientConfig::default()
                },
                ClientConfig {
                    node: Some(node("kuard", "kuard-a", "sotw")),
                    generic_xds_configs: vec![config(
                        ResourceType::Cluster,
                        "a",
                        "v1",
                        ClientResourceStatus::Acked,
                        None,
                    )],
                    ..ClientConfig::default()
                },
                ClientConfig {
                    node: Some(node("idle", "idle-0", "sotw")),
                    ..ClientConfig::default()
                },
            ],
        }
    }

    #[test]
    fn rows_per_envoy_and_type_with_the_nack_cut_in_the_table_whole_in_json() {
        let envoys = envoys(&fleet(), None);
        let text = render_envoys(&envoys, &[], false);
        let expected = "\
ENVOYS
NODE ID   POD               API     TYPE       RESOURCES   ACKED VERSION   STATUS            SYNC     NACK
idle      default/idle-0    sotw    -          0                           NO SUBSCRIPTION
kuard     default/kuard-a   sotw    cluster    1           v1              ACKED             SYNCED
kuard     default/kuard-b   delta   cluster    2           2 versions      ACKED             SYNCED
kuard     default/kuard-b   delta   listener   1           v1              NACKED            ERROR    Error adding/updating listener(s) http: malformed IP address: not-an-ip. Consid…
";
        assert_eq!(text, expected);
        let nack_cell = text
            .lines()
            .last()
            .unwrap()
            .split("ERROR    ")
            .nth(1)
            .unwrap();
        assert_eq!(nack_cell.chars().count(), NACK_CELL_CHARS);

        let json = serde_json::to_value(&envoys).unwrap();
        let listener = &json[2]["types"][1];
        assert_eq!(listener["type"], "listener");
        assert_eq!(listener["nacks"][0]["message"], LONG_NACK);
        assert_eq!(listener["nacks"][0]["rejectedVersion"], "bad1");
        assert_eq!(
            listener["nacks"][0]["lastUpdateAttempt"],
            "1970-01-01T00:00:10Z"
        );
        assert_eq!(json[2]["api"], "delta");
        assert!(json[0].get("replica").is_none());
    }

    #[test]
    fn an_empty_fleet_and_unreachable_replicas_say_so() {
        assert_eq!(
            render_envoys(&[], &[], false),
            "ENVOYS\nNo Envoy is connected.\n"
        );
        let down = Unavailable {
            address: "127.0.0.1:18000".into(),
            reason: "CSDS 127.0.0.1:18000: cannot connect: connection refused".into(),
        };
        assert_eq!(
            render_envoys(&[], std::slice::from_ref(&down), false),
            "ENVOYS\nEnvoys of 127.0.0.1:18000 not shown: CSDS 127.0.0.1:18000: cannot connect: \
             connection refused\n"
        );
        // One replica answers, the other does not: its rows are labelled, the other named.
        let envoys = envoys(&fleet(), Some("10.0.0.1:18000"));
        let text = render_envoys(&envoys[..1], &[down], true);
        assert!(
            text.starts_with("ENVOYS\nREPLICA          NODE ID   POD"),
            "{text}"
        );
        assert!(text.contains("\n10.0.0.1:18000   idle "), "{text}");
        assert!(text.ends_with("Envoys of 127.0.0.1:18000 not shown: CSDS 127.0.0.1:18000: cannot connect: connection refused\n"), "{text}");
        let none = Unavailable {
            address: String::new(),
            reason: "no client certificate".into(),
        };
        assert_eq!(
            render_envoys(&[], &[none], false),
            "ENVOYS\nEnvoys not shown: no client certificate\n"
        );
    }

    #[test]
    fn envoyconfigs_without_envoys_and_envoys_without_envoyconfig_are_named() {
        let envoys = envoys(&fleet(), None);
        assert_eq!(
            unpaired(&["kuard", "other", "idle"], &envoys),
            "No Envoy connected for node other.\n"
        );
        assert_eq!(
            unpaired(&["kuard"], &envoys),
            "No EnvoyConfig for the node of: idle (default/idle-0).\n"
        );
        assert_eq!(unpaired(&["kuard", "idle"], &envoys), "");
    }

    #[test]
    fn messages_are_put_on_one_line_and_cut_at_characters() {
        assert_eq!(one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(one_line("ééééé", 5), "ééééé");
        assert_eq!(one_line("éééééé", 5), "éééé…");
        assert_eq!(one_line("", 5), "");
    }
}
