//! `marin3r status` end to end: the EnvoyConfigs (local mode: `GET /status`; Kubernetes
//! mode: the API server), then the Envoys from each discovery service replica's CSDS,
//! printed as one text. The outcome's exit code tells whether every part was shown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use marin3r_control_plane::status::StatusReport;
use marin3r_wire::object_names;
use serde::Serialize;

use super::csds::{self, CertificateFiles, ClientCertificate, Query};
use super::envoys::{self, EnvoyReport, Unavailable};
use super::forward::{self, PodTarget};
use super::kubernetes::{self, KubeError};
use super::local::{self, ClientError};
use super::node::{self, EnvoyDump};
use super::table::render_table;
use crate::terminal;

/// Exit code when the EnvoyConfigs are shown but the Envoys of at least one replica are
/// not (CSDS unreachable, refused, no certificate, no `--csds-address`).
pub const EXIT_ENVOYS_MISSING: u8 = 3;

/// Where local mode looks for a client certificate when none is given: the one
/// `scripts/quickstart` writes (relative to the working directory).
pub const QUICKSTART_CLIENT_CERTS: &str = ".local/quickstart/certs/client";

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// What to show and how to reach the Envoys.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only this node id: its EnvoyConfig, and with JSON/YAML its Envoys' configuration.
    pub node: Option<String>,
    pub revisions: bool,
    pub format: Format,
    /// CSDS addresses (HOST:PORT), one per discovery service replica; empty: the default
    /// of the mode.
    pub csds_addresses: Vec<String>,
    pub certificate: CertificateFiles,
    /// The TLS name to verify; default: the address's host (local mode), the
    /// discovery service's Service name (Kubernetes mode).
    pub server_name: Option<String>,
    /// Kubernetes mode: the discovery service (`--discovery-service-name`) whose replicas
    /// are reached through port-forwards when no CSDS address is given.
    pub discovery_service: String,
    /// Bounds every request.
    pub timeout: Duration,
}

/// What to print and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub text: String,
    pub code: u8,
}

/// Errors that stop `marin3r status` (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("cannot get the status from {url}")]
    Local {
        url: String,
        #[source]
        source: Box<ClientError>,
    },
    #[error(transparent)]
    Kube(#[from] Box<KubeError>),
    #[error("cannot reach the API server (kubeconfig or in-cluster config)")]
    KubeConfig(#[source] Box<kube::Error>),
    #[error("cannot render {0}")]
    Render(String),
}

/// The `-o json` / `-o yaml` document of the whole status: the `/status` JSON (both
/// modes) with the Envoys added.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusDocument<'a> {
    #[serde(flatten)]
    report: &'a StatusReport,
    envoys: &'a [EnvoyReport],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    envoys_unavailable: &'a [Unavailable],
}

/// The `-o json` / `-o yaml` document of `marin3r status NODE`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeDocument<'a> {
    #[serde(rename = "nodeID")]
    node_id: &'a str,
    envoys: &'a [EnvoyDump],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    envoys_unavailable: &'a [Unavailable],
}

/// Where the Envoys are asked and with which certificate, once the mode resolved them.
struct Target {
    replicas: Vec<Replica>,
    certificate: Result<ClientCertificate, String>,
    server_name: Option<String>,
}

/// One discovery service replica.
enum Replica {
    /// A CSDS address (HOST:PORT).
    Address(String),
    /// A Pod, reached through a port-forward by the API server of `client`.
    Pod {
        client: kube::Client,
        namespace: String,
        target: PodTarget,
    },
}

impl Replica {
    /// Its name in the ENVOYS table and in messages.
    fn label(&self) -> String {
        match self {
            Replica::Address(address) => address.clone(),
            Replica::Pod { target, .. } => target.label(),
        }
    }
}

/// What the replicas answered.
#[derive(Default)]
struct Envoys {
    rows: Vec<EnvoyReport>,
    dumps: Vec<EnvoyDump>,
    unavailable: Vec<Unavailable>,
    several: bool,
}

/// CSDS of one replica.
async fn ask_one(
    replica: &Replica,
    certificate: &ClientCertificate,
    server_name: Option<&str>,
    query: &Query,
    timeout: Duration,
) -> Result<envoy_types::pb::envoy::service::status::v3::ClientStatusResponse, String> {
    match replica {
        Replica::Address(address) => csds::fetch(address, certificate, server_name, query, timeout)
            .await
            .map_err(|e| e.to_string()),
        Replica::Pod {
            client,
            namespace,
            target,
        } => {
            let label = target.label();
            let opened = tokio::time::timeout(timeout, forward::open(client, namespace, target))
                .await
                .map_err(|_| format!("{label}: no port-forward within {timeout:?}"))?;
            let (stream, mut forwarder) = opened.map_err(|e| e.to_string())?;
            let pod_error = forwarder.take_error(target.port);
            let name = server_name.unwrap_or_default();
            let answer = csds::fetch_over(&label, stream, certificate, name, query, timeout).await;
            forwarder.abort();
            match answer {
                Ok(response) => Ok(response),
                Err(e) => {
                    // What the kubelet said about the port, if it said something.
                    let said = match pod_error {
                        Some(said) => tokio::time::timeout(Duration::ZERO, said)
                            .await
                            .ok()
                            .flatten(),
                        None => None,
                    };
                    Err(match said {
                        Some(said) => format!("{e} ({})", marin3r_wire::quote::bounded(&said)),
                        None => e.to_string(),
                    })
                }
            }
        }
    }
}

async fn ask(target: &Target, options: &Options) -> Envoys {
    let mut out = Envoys {
        several: target.replicas.len() > 1,
        ..Envoys::default()
    };
    let certificate = match &target.certificate {
        Ok(c) => c,
        Err(reason) => {
            out.unavailable.push(Unavailable {
                address: String::new(),
                reason: reason.clone(),
            });
            return out;
        }
    };
    let query = match &options.node {
        Some(id) => Query::Node(id.clone()),
        None => Query::AllNodes,
    };
    for replica in &target.replicas {
        let name = replica.label();
        let label = out.several.then_some(name.as_str());
        match ask_one(
            replica,
            certificate,
            target.server_name.as_deref(),
            &query,
            options.timeout,
        )
        .await
        {
            Ok(response) => {
                out.rows.extend(envoys::envoys(&response, label));
                out.dumps.extend(node::dump(&response, label));
            }
            Err(reason) => out.unavailable.push(Unavailable {
                address: name.clone(),
                reason,
            }),
        }
    }
    out.rows.sort_by(|a, b| {
        (&a.node_id, &a.pod, &a.replica, &a.api).cmp(&(&b.node_id, &b.pod, &b.replica, &b.api))
    });
    if let Some(id) = &options.node {
        // Exact matching is the server's job; keep the rule here too.
        out.rows.retain(|e| &e.node_id == id);
        out.dumps.retain(|e| &e.node_id == id);
    }
    out
}

/// `served` is the namespace whose discovery service was asked (Kubernetes mode: each
/// namespace has its own), `None` for every EnvoyConfig (local mode): only those are
/// paired with the Envoys.
fn render(
    mut report: StatusReport,
    envoys: &Envoys,
    options: &Options,
    served: Option<&str>,
) -> Result<Outcome, StatusError> {
    if let Some(id) = &options.node {
        report.envoy_configs.retain(|ec| &ec.node_id == id);
    }
    // Nothing a terminal acts on: `crate::terminal` (tables: every cell; JSON: what
    // serde_json leaves raw; YAML: serde_saphyr escapes C0, DEL and C1 itself).
    let to_text = |value: &dyn erased::Document| -> Result<String, StatusError> {
        match options.format {
            Format::Json => value.json().map(|t| terminal::json(&t).into_owned()),
            Format::Yaml => value.yaml(),
            Format::Table => Ok(String::new()),
        }
    };
    let text = match (options.format, &options.node) {
        (Format::Table, _) => {
            let mut text = render_table(&report, options.revisions);
            text.push('\n');
            text.push_str(&envoys::render_envoys(
                &envoys.rows,
                &envoys.unavailable,
                envoys.several,
            ));
            if envoys.unavailable.is_empty() {
                let ids: Vec<&str> = report
                    .envoy_configs
                    .iter()
                    .filter(|ec| served.is_none_or(|ns| ec.namespace == ns))
                    .map(|ec| ec.node_id.as_str())
                    .filter(|id| !id.is_empty())
                    .collect();
                text.push_str(&envoys::unpaired(&ids, &envoys.rows));
            }
            terminal::text(&text).into_owned()
        }
        (_, Some(id)) => to_text(&NodeDocument {
            node_id: id,
            envoys: &envoys.dumps,
            envoys_unavailable: &envoys.unavailable,
        })?,
        (_, None) => to_text(&StatusDocument {
            report: &report,
            envoys: &envoys.rows,
            envoys_unavailable: &envoys.unavailable,
        })?,
    };
    Ok(Outcome {
        text,
        code: if envoys.unavailable.is_empty() {
            0
        } else {
            EXIT_ENVOYS_MISSING
        },
    })
}

/// JSON and YAML of the two documents through one function each.
mod erased {
    use super::StatusError;

    pub trait Document {
        fn json(&self) -> Result<String, StatusError>;
        fn yaml(&self) -> Result<String, StatusError>;
    }

    impl<T: serde::Serialize> Document for T {
        fn json(&self) -> Result<String, StatusError> {
            serde_json::to_string_pretty(self)
                .map(|mut s| {
                    s.push('\n');
                    s
                })
                .map_err(|e| StatusError::Render(format!("JSON: {e}")))
        }
        fn yaml(&self) -> Result<String, StatusError> {
            serde_saphyr::to_string(self).map_err(|e| StatusError::Render(format!("YAML: {e}")))
        }
    }
}

/// The client certificate named by the flags, if any.
fn files_certificate(files: &CertificateFiles) -> Option<Result<ClientCertificate, String>> {
    (!files.is_empty()).then(|| files.read().map_err(|e| e.to_string()))
}

/// Local mode: `GET {url}/status`, then CSDS at `--csds-address` (default: the host of
/// `url` on the ADS port, `127.0.0.1:18000`) with the flags' certificate, else the
/// quickstart's ([`QUICKSTART_CLIENT_CERTS`] under `cwd`).
pub async fn local(url: &str, options: &Options, cwd: &Path) -> Result<Outcome, StatusError> {
    let report = local::fetch(url, options.timeout)
        .await
        .map_err(|source| StatusError::Local {
            url: url.to_string(),
            source: Box::new(source),
        })?;
    let addresses = if options.csds_addresses.is_empty() {
        local::csds_address_of(url).into_iter().collect()
    } else {
        options.csds_addresses.clone()
    };
    let certificate = files_certificate(&options.certificate).unwrap_or_else(|| {
        let dir: PathBuf = cwd.join(QUICKSTART_CLIENT_CERTS);
        if dir.is_dir() {
            CertificateFiles {
                dir: Some(dir),
                ..CertificateFiles::default()
            }
            .read()
            .map_err(|e| e.to_string())
        } else {
            Err(format!(
                "no client certificate for CSDS: pass --csds-certificate-path DIR with \
                 {} of the discovery service's CA (`marin3r certs --out X` writes X/client)",
                csds::describe_dir(Path::new("DIR"))
            ))
        }
    });
    let target = Target {
        replicas: addresses.into_iter().map(Replica::Address).collect(),
        certificate,
        server_name: options.server_name.clone(),
    };
    let envoys = ask(&target, options).await;
    render(report, &envoys, options, None)
}

/// Kubernetes mode through `client`: the EnvoyConfigs of `namespace` (every namespace
/// when `None`), then CSDS of the discovery service of `cert_namespace`: at each
/// `--csds-address` when given, else at each of its replicas through a port-forward
/// ([`forward`]); with the flags' certificate, else the sidecars' client certificate
/// Secret of `cert_namespace`.
pub async fn kubernetes(
    client: &kube::Client,
    namespace: Option<&str>,
    cert_namespace: &str,
    options: &Options,
) -> Result<Outcome, StatusError> {
    let report = kubernetes::fetch(client, namespace, options.revisions)
        .await
        .map_err(Box::new)?;
    let replicas = if options.csds_addresses.is_empty() {
        forward::replicas(client, cert_namespace, &options.discovery_service)
            .await
            .map(|pods| {
                pods.into_iter()
                    .map(|target| Replica::Pod {
                        client: client.clone(),
                        namespace: cert_namespace.to_string(),
                        target,
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    } else {
        Ok(options
            .csds_addresses
            .iter()
            .cloned()
            .map(Replica::Address)
            .collect())
    };
    let target = match replicas {
        Ok(replicas) => {
            let certificate = match files_certificate(&options.certificate) {
                Some(c) => c,
                None => kubernetes::client_certificate(client, cert_namespace)
                    .await
                    .map_err(|e| e.to_string()),
            };
            Target {
                replicas,
                certificate,
                server_name: Some(options.server_name.clone().unwrap_or_else(|| {
                    object_names::discovery_service(&options.discovery_service)
                })),
            }
        }
        Err(reason) => Target {
            replicas: Vec::new(),
            certificate: Err(reason),
            server_name: None,
        },
    };
    let envoys = ask(&target, options).await;
    render(report, &envoys, options, Some(cert_namespace))
}

/// Kubernetes mode with the kubeconfig (or in-cluster) client: `-A` lists every
/// namespace, `-n` one, else the context's namespace.
pub async fn kubernetes_default(
    namespace: Option<&str>,
    all_namespaces: bool,
    options: &Options,
) -> Result<Outcome, StatusError> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| StatusError::KubeConfig(Box::new(e)))?;
    let cert_namespace = namespace
        .map(str::to_string)
        .unwrap_or_else(|| client.default_namespace().to_string());
    let listed = (!all_namespaces).then_some(cert_namespace.as_str());
    kubernetes(&client, listed, &cert_namespace, options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(format: Format) -> Options {
        Options {
            node: None,
            revisions: false,
            format,
            csds_addresses: Vec::new(),
            certificate: CertificateFiles::default(),
            server_name: None,
            discovery_service: object_names::DEFAULT_DISCOVERY_SERVICE.into(),
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn envoyconfigs_are_printed_when_the_envoys_are_missing_and_the_code_says_so() {
        let envoys = Envoys {
            unavailable: vec![Unavailable {
                address: "127.0.0.1:1".into(),
                reason: "CSDS 127.0.0.1:1: cannot connect".into(),
            }],
            ..Envoys::default()
        };
        let out = render(
            StatusReport::default(),
            &envoys,
            &options(Format::Table),
            None,
        )
        .unwrap();
        assert_eq!(
            out,
            Outcome {
                text: "No EnvoyConfigs found.\n\nENVOYS\nEnvoys of 127.0.0.1:1 not shown: CSDS \
                       127.0.0.1:1: cannot connect\n"
                    .into(),
                code: EXIT_ENVOYS_MISSING
            }
        );
        let json = render(
            StatusReport::default(),
            &envoys,
            &options(Format::Json),
            None,
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&json.text).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"envoyConfigs": [], "envoys": [], "envoysUnavailable": [
                {"address": "127.0.0.1:1", "reason": "CSDS 127.0.0.1:1: cannot connect"}]})
        );
        let all_there = render(
            StatusReport::default(),
            &Envoys::default(),
            &options(Format::Yaml),
            None,
        )
        .unwrap();
        assert_eq!(all_there.code, 0);
        assert!(all_there.text.contains("envoys: []"), "{}", all_there.text);
    }

    /// A P-256 key made for this test, inline in a listener (`inline_string`) and a
    /// cluster (`inline_bytes`, with a `password`), as a server that does not redact
    /// would send them.
    const KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQggn38lrYNOeHoEtpZ
ORKmMC83m2eEU9DfhbkhlULqagShRANCAAQV7LtfEZpm4h6J5eSnfG4suXaOJeUM
zAiGOwxEXf3x0jOlarx5NMg8ABmkpPRrUSZFzLcjJarpeSoU2gYDPgob
-----END PRIVATE KEY-----
";
    const PASSWORD: &str = "hunter2-p4ssw0rd";

    fn b64(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn with_inline_keys() -> envoy_types::pb::envoy::service::status::v3::ClientStatusResponse {
        use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
        use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
        use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ClientStatusResponse};
        use marin3r_envoyconfig::ResourceType;
        let tls = |context: &str, key: serde_json::Value| {
            serde_json::json!({"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": format!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{context}"),
                "common_tls_context": {"tls_certificates": [{
                    "certificate_chain": {"filename": "/etc/envoy/tls.crt"},
                    "private_key": key,
                    "password": {"inline_string": PASSWORD}}]}}})
        };
        let listener = marin3r_envoyconfig::decode_resource(
            ResourceType::Listener,
            &serde_json::json!({"name": "https",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
                "filter_chains": [{"filters": [{"name": "tcp", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "tcp", "cluster": "kuard"}}],
                    "transport_socket": tls("DownstreamTlsContext", serde_json::json!({"inline_string": KEY}))}]}),
        )
        .unwrap();
        let cluster = marin3r_envoyconfig::decode_resource(
            ResourceType::Cluster,
            &serde_json::json!({"name": "kuard", "connect_timeout": "1s",
                "transport_socket": tls("UpstreamTlsContext", serde_json::json!({"inline_bytes": b64(KEY)}))}),
        )
        .unwrap();
        let config = |r: &marin3r_envoyconfig::Resource, nack: Option<&str>| GenericXdsConfig {
            type_url: r.body.type_url.clone(),
            name: r.name.clone(),
            version_info: "v1".into(),
            client_status: if nack.is_some() {
                ClientResourceStatus::Nacked
            } else {
                ClientResourceStatus::Acked
            } as i32,
            xds_config: Some(envoy_types::pb::google::protobuf::Any {
                type_url: r.body.type_url.clone(),
                value: r.body.value.clone(),
            }),
            error_state: nack.map(|m| UpdateFailureState {
                details: m.to_string(),
                version_info: "v2".into(),
                ..UpdateFailureState::default()
            }),
            ..GenericXdsConfig::default()
        };
        let node = marin3r_xds::NodeInfo {
            id: "kuard".into(),
            pod_name: "kuard-0".into(),
        }
        .to_node();
        ClientStatusResponse {
            config: vec![ClientConfig {
                node: Some(node),
                generic_xds_configs: vec![
                    config(&listener, None),
                    config(&cluster, Some(&format!("bad key {KEY}"))),
                ],
                ..ClientConfig::default()
            }],
        }
    }

    /// Every format, of the whole status and of one node.
    fn every_output(envoys: &Envoys) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for format in [Format::Table, Format::Json, Format::Yaml] {
            for node in [None, Some("kuard")] {
                let mut o = options(format);
                o.node = node.map(str::to_string);
                let text = render(StatusReport::default(), envoys, &o, None)
                    .unwrap()
                    .text;
                out.push((format!("{format:?} node {node:?}"), text));
            }
        }
        out
    }

    #[test]
    fn no_output_shows_an_inline_key_or_password_whatever_the_server_sent() {
        let response = with_inline_keys();
        let envoys = Envoys {
            rows: envoys::envoys(&response, None),
            dumps: node::dump(&response, None),
            ..Envoys::default()
        };
        let key_line = KEY.lines().nth(1).unwrap();
        let b64_key = b64(KEY);
        for (what, text) in every_output(&envoys) {
            for needle in [&key_line[..40], "PRIVATE KEY", PASSWORD, &b64_key[..40]] {
                assert!(!text.contains(needle), "{what}: {needle} in\n{text}");
            }
            if what.contains("Some") && !what.starts_with("Table") {
                // As Envoy's config dump shows them.
                assert!(text.contains("[redacted]"), "{what}:\n{text}");
                assert!(text.contains(&b64("[redacted]")), "{what}:\n{text}");
                assert!(text.contains("/etc/envoy/tls.crt"), "{what}:\n{text}");
            }
        }
    }

    /// Every field of every source of `marin3r status` (the EnvoyConfigs, each
    /// replica's CSDS answer, the replicas that could not be asked) holding `h`.
    fn hostile_status(h: &str) -> (StatusReport, Envoys, String) {
        use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
        use envoy_types::pb::envoy::config::core::v3::Node;
        use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
        use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ClientStatusResponse};
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        use marin3r_control_plane::status::{EnvoyConfigReport, FileReport, RevisionReport};
        let v = |what: &str| format!("{what}-{h}-end");
        let id = v("node");
        let report = StatusReport {
            envoy_configs: vec![EnvoyConfigReport {
                name: v("name"),
                namespace: v("ns"),
                node_id: id.clone(),
                envoy_api: v("api"),
                desired_version: Some(v("desired")),
                published_version: Some(v("published")),
                cache_state: None,
                conditions: vec![Condition {
                    type_: v("Type"),
                    status: "True".into(),
                    reason: v("reason"),
                    message: v("message"),
                    last_transition_time: marin3r_kube::time::time(std::time::UNIX_EPOCH),
                    observed_generation: None,
                }],
                revisions: vec![RevisionReport {
                    version: v("rev"),
                    published: true,
                    tainted: true,
                    taint_reason: Some(v("taint")),
                    created_at: v("created"),
                    last_published_at: Some(v("last")),
                    provides_versions: [(v("type"), v("version"))].into(),
                }],
                errors: vec![v("error")],
            }],
            files: vec![FileReport {
                path: v("path"),
                error: v("file-error"),
            }],
        };
        let s = |x: String| Value {
            kind: Some(Kind::StringValue(x)),
        };
        let node = Node {
            id: id.clone(),
            cluster: v("cluster"),
            user_agent_name: v("agent"),
            metadata: Some(Struct {
                fields: [
                    (marin3r_wire::POD_NAME_METADATA_KEY.to_string(), s(v("pod"))),
                    (
                        marin3r_wire::POD_NAMESPACE_METADATA_KEY.to_string(),
                        s(v("podns")),
                    ),
                    (
                        marin3r_xds::csds::API_METADATA_KEY.to_string(),
                        s(v("sotw")),
                    ),
                ]
                .into(),
            }),
            ..Node::default()
        };
        let resource = |type_url: String, nack: Option<String>| GenericXdsConfig {
            type_url,
            name: v("resource"),
            version_info: v("version"),
            client_status: ClientResourceStatus::Nacked as i32,
            error_state: nack.map(|m| UpdateFailureState {
                details: m,
                version_info: v("rejected"),
                ..UpdateFailureState::default()
            }),
            ..GenericXdsConfig::default()
        };
        let response = ClientStatusResponse {
            config: vec![ClientConfig {
                node: Some(node),
                generic_xds_configs: vec![
                    resource(
                        marin3r_envoyconfig::ResourceType::Listener
                            .type_url()
                            .to_string(),
                        Some(v("nack")),
                    ),
                    resource(v("type.googleapis.com/x.Unknown"), Some(v("nack2"))),
                ],
                ..ClientConfig::default()
            }],
        };
        let replica = v("replica");
        let envoys = Envoys {
            rows: envoys::envoys(&response, Some(&replica)),
            dumps: node::dump(&response, Some(&replica)),
            unavailable: vec![Unavailable {
                address: v("address"),
                reason: v("reason"),
            }],
            several: true,
        };
        (report, envoys, id)
    }

    #[test]
    fn no_output_writes_a_control_character_from_any_source() {
        use crate::terminal::tests::{HOSTILE, is_control};
        for (what, h) in HOSTILE {
            let (report, envoys, id) = hostile_status(h);
            for format in [Format::Table, Format::Json, Format::Yaml] {
                for node in [None, Some(id.clone())] {
                    for revisions in [false, true] {
                        let mut o = options(format);
                        o.node = node.clone();
                        o.revisions = revisions;
                        let text = render(report.clone(), &envoys, &o, None).unwrap().text;
                        let raw: Vec<char> = text
                            .chars()
                            .filter(|c| *c != '\n' && is_control(*c))
                            // serde_saphyr leaves bidi controls (they drive no terminal).
                            .filter(|c| format != Format::Yaml || (*c as u32) < 0x200)
                            .collect();
                        assert!(
                            raw.is_empty(),
                            "{what} in {format:?} (node {}, revisions {revisions}): {raw:?} in\n{text}",
                            node.is_some()
                        );
                        // The values are shown (escaped), not dropped; no value adds a
                        // line (a row) to a table.
                        assert!(text.contains("node-"), "{text}");
                        if format == Format::Table {
                            let (report, envoys, id) = hostile_status("plain");
                            o.node = node.as_ref().map(|_| id);
                            let plain = render(report, &envoys, &o, None).unwrap().text;
                            assert_eq!(
                                text.lines().count(),
                                plain.lines().count(),
                                "{what}:\n{text}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_envoyconfigs_of_the_asked_discovery_service_are_paired_with_envoys() {
        let ec = |ns: &str, node: &str| marin3r_control_plane::status::EnvoyConfigReport {
            name: node.into(),
            namespace: ns.into(),
            node_id: node.into(),
            envoy_api: "v3".into(),
            desired_version: None,
            published_version: None,
            cache_state: None,
            conditions: Vec::new(),
            revisions: Vec::new(),
            errors: Vec::new(),
        };
        let report = StatusReport {
            envoy_configs: vec![ec("a", "in-a"), ec("b", "in-b")],
            files: Vec::new(),
        };
        let text = |served| {
            render(
                report.clone(),
                &Envoys::default(),
                &options(Format::Table),
                served,
            )
            .unwrap()
            .text
        };
        assert!(text(Some("a")).ends_with("No Envoy connected for node in-a.\n"));
        assert!(text(None).ends_with("No Envoy connected for node in-a, in-b.\n"));
    }
}
