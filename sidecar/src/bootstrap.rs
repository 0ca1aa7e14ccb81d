//! The Envoy v3 bootstrap written by `marin3r init-manager` (design.md §2).
//!
//! [`bootstrap`] renders the bootstrap (`config.json`) and [`sds_secret`] the file-based
//! SDS resource holding the client certificate Envoy presents to the discovery service.
//! Both are pure functions of [`BootstrapOptions`]; only [`write_files`] touches the
//! filesystem, and it replaces each file atomically (temp file in the same directory,
//! then `rename`) so an Envoy watching the directory never reads half a file.
//!
//! The JSON uses the proto3 field names (snake_case), which Envoy accepts for
//! bootstraps. Output is deterministic: the same options always give the same bytes.

use std::fmt;
use std::fs;
use std::io::Write as _;
use std::net::{AddrParseError, IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use marin3r_wire::{paths, ports};
use serde_json::{Value, json};

/// Name of the static cluster that points at the discovery service.
pub const XDS_CLUSTER_NAME: &str = "xds_cluster";
/// Name of the SDS secret carrying the xDS client certificate.
pub const SDS_SECRET_NAME: &str = "xds_client_certificate";
/// File name, under [`BootstrapOptions::resources_path`], of the SDS secret file.
pub const SDS_SECRET_FILE_NAME: &str = "tls_certificate_sds_secret.json";

const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const UPSTREAM_TLS_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
const HTTP_PROTOCOL_OPTIONS_NAME: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const FILE_ACCESS_LOG_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";

/// Errors from building or writing the bootstrap. Each variant names the offending
/// option or path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A required option was empty.
    #[error("{field} must not be empty")]
    Empty {
        /// The [`BootstrapOptions`] field name.
        field: &'static str,
    },
    /// An option had a value Envoy would reject or misread.
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// The [`BootstrapOptions`] field name.
        field: &'static str,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// `admin_bind_address` is not `<ip>:<port>`.
    #[error(
        "invalid admin_bind_address {value:?}: expected <ip>:<port>, e.g. 0.0.0.0:{port} or [::1]:{port}",
        port = marin3r_wire::ports::ENVOY_ADMIN
    )]
    AdminBindAddress {
        /// The rejected value.
        value: String,
        /// The parse failure.
        #[source]
        source: AddrParseError,
    },
    /// `--api-type` was neither `sotw` nor `delta`.
    #[error("invalid api_type {0:?}: expected \"sotw\" or \"delta\"")]
    UnknownApiType(String),
    /// A path option is not valid UTF-8, so it cannot be put into the JSON bootstrap.
    #[error("{field} is not valid UTF-8: {}", path.display())]
    NonUtf8Path {
        /// The [`BootstrapOptions`] field name.
        field: &'static str,
        /// The offending path.
        path: PathBuf,
    },
    /// Creating the directory that holds an output file failed.
    #[error("cannot create directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// Serialising an output file failed.
    #[error("cannot serialise {}", path.display())]
    Serialize {
        /// The file being produced.
        path: PathBuf,
        /// The serialisation failure.
        #[source]
        source: serde_json::Error,
    },
    /// Writing or renaming an output file failed.
    #[error("cannot write {}", path.display())]
    Write {
        /// The destination file.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
}

/// Which xDS protocol variant Envoy uses on its ADS stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ApiType {
    /// State-of-the-world gRPC (`api_type: GRPC`).
    #[default]
    Sotw,
    /// Incremental gRPC (`api_type: DELTA_GRPC`).
    Delta,
}

impl ApiType {
    /// The command-line spelling: `sotw` or `delta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sotw => "sotw",
            Self::Delta => "delta",
        }
    }

    /// The `ApiConfigSource.api_type` enum value Envoy expects.
    pub fn envoy_api_type(self) -> &'static str {
        match self {
            Self::Sotw => "GRPC",
            Self::Delta => "DELTA_GRPC",
        }
    }
}

impl fmt::Display for ApiType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApiType {
    type Err = BootstrapError;

    /// Parses `sotw` or `delta` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("sotw") {
            Ok(Self::Sotw)
        } else if s.eq_ignore_ascii_case("delta") {
            Ok(Self::Delta)
        } else {
            Err(BootstrapError::UnknownApiType(s.to_string()))
        }
    }
}

/// Everything `marin3r init-manager` needs to render the bootstrap; one field per flag
/// (design.md §7), plus the pod identity the CLI reads from `POD_NAME`, `POD_NAMESPACE` and
/// `HOST_NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// Host name (or IP) of the discovery service; also the TLS SNI.
    pub xdss_host: String,
    /// Port of the discovery service (default 18000).
    pub xdss_port: u16,
    /// Envoy node id (`node.id`), the key the discovery service serves config by.
    pub node_id: String,
    /// Envoy node cluster (`node.cluster`); required, Envoy's file-based SDS needs it.
    pub cluster_id: String,
    /// Admin listener as `<ip>:<port>`; IPv6 as `[::1]:9901` (default `0.0.0.0:9901`).
    pub admin_bind_address: String,
    /// File the admin access log goes to (default `/dev/null`).
    pub admin_access_log_path: String,
    /// Directory holding `tls.crt`, `tls.key` and `ca.crt` (default `/etc/envoy/tls/client`).
    pub client_certificate_path: PathBuf,
    /// Where the bootstrap is written (default `/etc/envoy/bootstrap/config.json`).
    pub config_file: PathBuf,
    /// Directory for the SDS secret file (default `/etc/envoy/bootstrap`).
    pub resources_path: PathBuf,
    /// Name of the RTDS runtime layer and resource (default `runtime`).
    pub rtds_resource_name: String,
    /// The Envoy image, reported in node metadata `envoy_image`.
    pub envoy_image: String,
    /// SotW or Delta ADS.
    pub api_type: ApiType,
    /// Node metadata `pod_name`.
    pub pod_name: String,
    /// Node metadata `pod_namespace`.
    pub pod_namespace: String,
    /// Node metadata `host_name`.
    pub host_name: String,
}

impl Default for BootstrapOptions {
    fn default() -> Self {
        Self {
            xdss_host: String::new(),
            xdss_port: ports::XDSS,
            node_id: String::new(),
            cluster_id: String::new(),
            admin_bind_address: format!("0.0.0.0:{}", ports::ENVOY_ADMIN),
            admin_access_log_path: paths::ENVOY_ADMIN_ACCESS_LOG.to_string(),
            client_certificate_path: PathBuf::from(paths::ENVOY_TLS_CLIENT),
            config_file: PathBuf::from(paths::ENVOY_BOOTSTRAP_FILE),
            resources_path: PathBuf::from(paths::ENVOY_BOOTSTRAP),
            rtds_resource_name: "runtime".to_string(),
            envoy_image: String::new(),
            api_type: ApiType::Sotw,
            pod_name: String::new(),
            pod_namespace: String::new(),
            host_name: String::new(),
        }
    }
}

impl BootstrapOptions {
    /// Path of the SDS secret file: `<resources_path>/tls_certificate_sds_secret.json`.
    pub fn sds_secret_path(&self) -> PathBuf {
        self.resources_path.join(SDS_SECRET_FILE_NAME)
    }
}

/// Options checked and converted to the strings that go into the JSON.
struct Validated<'a> {
    xdss_host: &'a str,
    admin: SocketAddr,
    sds_secret_path: String,
    ca_cert_path: String,
}

fn non_empty(field: &'static str, value: &str) -> Result<(), BootstrapError> {
    if value.trim().is_empty() {
        Err(BootstrapError::Empty { field })
    } else {
        Ok(())
    }
}

fn path_str(field: &'static str, path: &Path) -> Result<String, BootstrapError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| BootstrapError::NonUtf8Path {
            field,
            path: path.to_path_buf(),
        })
}

/// Accepts a DNS name, an IPv4 address or an IPv6 address (bare or in brackets); rejects
/// `host:port` and whitespace, which Envoy would only fail on at DNS resolution time.
fn xdss_host(value: &str) -> Result<&str, BootstrapError> {
    non_empty("xdss_host", value)?;
    let invalid = |reason| BootstrapError::Invalid {
        field: "xdss_host",
        value: value.to_string(),
        reason,
    };
    if value.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(invalid("must be a host name or IP address"));
    }
    let unbracketed = value
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(value);
    if unbracketed.contains(':') && unbracketed.parse::<Ipv6Addr>().is_err() {
        return Err(invalid(
            "must be a host name or IP address without a port (use xdss_port)",
        ));
    }
    Ok(unbracketed)
}

fn validate(opts: &BootstrapOptions) -> Result<Validated<'_>, BootstrapError> {
    non_empty("node_id", &opts.node_id)?;
    // Envoy refuses file-based SDS without a node cluster ("TlsCertificateSdsApi: node 'id'
    // and 'cluster' are required"), so the bootstrap must carry one on its own.
    non_empty("cluster_id", &opts.cluster_id)?;
    let xdss_host = xdss_host(&opts.xdss_host)?;
    if opts.xdss_port == 0 {
        return Err(BootstrapError::Invalid {
            field: "xdss_port",
            value: "0".to_string(),
            reason: "must be between 1 and 65535",
        });
    }
    let admin = opts
        .admin_bind_address
        .trim()
        .parse::<SocketAddr>()
        .map_err(|source| BootstrapError::AdminBindAddress {
            value: opts.admin_bind_address.clone(),
            source,
        })?;
    non_empty("admin_access_log_path", &opts.admin_access_log_path)?;
    non_empty("rtds_resource_name", &opts.rtds_resource_name)?;
    // The SDS file content (see `sds_secret`) also embeds these paths; checking them here
    // means `write_files` never writes a lossily converted path.
    path_str(
        "client_certificate_path",
        &opts
            .client_certificate_path
            .join(marin3r_wire::secret_keys::TLS_CRT),
    )?;
    Ok(Validated {
        xdss_host,
        admin,
        sds_secret_path: path_str("resources_path", &opts.sds_secret_path())?,
        ca_cert_path: path_str(
            "client_certificate_path",
            &opts
                .client_certificate_path
                .join(marin3r_wire::secret_keys::CA_CRT),
        )?,
    })
}

fn socket_address(address: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": address, "port_value": port } })
}

/// First delay of Envoy's ADS reconnect backoff (`envoy_grpc.retry_policy`; Envoy's own
/// default too). Each retry waits a random time below the current interval, which
/// doubles up to [`ADS_RETRY_MAX_INTERVAL`].
pub const ADS_RETRY_BASE_INTERVAL: &str = "0.5s";
/// Cap of Envoy's ADS reconnect backoff. Envoy's default (30 s) leaves an Envoy up to
/// 30 s without config updates after the discovery service was down for a while (a
/// restart, a node drain); with 2 s it is back within about 2 s of the new server being
/// up, for at most one connection attempt per second per Envoy while it is down
/// (docs/reliability.md).
pub const ADS_RETRY_MAX_INTERVAL: &str = "2s";

/// The bootstrap extension that lets Envoy serve internal listeners
/// (`internal_listener: {}`, reached through an `envoy_internal_address`): without it
/// Envoy 1.40 refuses such a listener ("InternalListener bootstrap extension is
/// mandatory"). It costs nothing when no internal listener is served.
const INTERNAL_LISTENER_EXTENSION: &str = "envoy.bootstrap.internal_listener";
const INTERNAL_LISTENER_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener";

/// `{ads: {}, resource_api_version: V3}`: a resource delivered over the ADS stream.
fn ads_config_source() -> Value {
    json!({ "ads": {}, "resource_api_version": "V3" })
}

/// Renders the Envoy v3 bootstrap for `opts` (design.md §2).
///
/// Validates the options first: `node_id`, `cluster_id` and `xdss_host` must be
/// non-empty (and the host carries no port), `xdss_port` non-zero, `admin_bind_address` an `<ip>:<port>`,
/// `admin_access_log_path` and `rtds_resource_name` non-empty, paths valid UTF-8.
pub fn bootstrap(opts: &BootstrapOptions) -> Result<Value, BootstrapError> {
    let v = validate(opts)?;
    let admin_ip = match v.admin.ip() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => ip.to_string(),
    };
    let rtds = opts.rtds_resource_name.as_str();

    let bootstrap = json!({
        "node": {
            "id": opts.node_id,
            "cluster": opts.cluster_id,
            "metadata": {
                marin3r_wire::POD_NAME_METADATA_KEY: opts.pod_name,
                marin3r_wire::POD_NAMESPACE_METADATA_KEY: opts.pod_namespace,
                "host_name": opts.host_name,
                "envoy_image": opts.envoy_image,
            },
        },
        "admin": {
            "address": socket_address(&admin_ip, v.admin.port()),
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": FILE_ACCESS_LOG_TYPE_URL,
                    "path": opts.admin_access_log_path,
                },
            }],
        },
        "static_resources": {
            "clusters": [{
                "name": XDS_CLUSTER_NAME,
                "type": "STRICT_DNS",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    HTTP_PROTOCOL_OPTIONS_NAME: {
                        "@type": format!("type.googleapis.com/{HTTP_PROTOCOL_OPTIONS_NAME}"),
                        "explicit_http_config": {
                            "http2_protocol_options": {
                                "connection_keepalive": { "interval": "30s", "timeout": "10s" },
                            },
                        },
                    },
                },
                "load_assignment": {
                    "cluster_name": XDS_CLUSTER_NAME,
                    "endpoints": [{
                        "lb_endpoints": [{
                            "endpoint": { "address": socket_address(v.xdss_host, opts.xdss_port) },
                        }],
                    }],
                },
                "transport_socket": {
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": UPSTREAM_TLS_TYPE_URL,
                        // design.md §2: SNI = xdss-host, also for an IP address. RFC 6066
                        // allows only DNS names there; Envoy sends it anyway and our
                        // discovery service (rustls) ignores an IP SNI with a warning.
                        "sni": v.xdss_host,
                        "common_tls_context": {
                            "tls_certificate_sds_secret_configs": [{
                                "name": SDS_SECRET_NAME,
                                "sds_config": {
                                    "path_config_source": { "path": v.sds_secret_path },
                                    "resource_api_version": "V3",
                                },
                            }],
                            "validation_context": {
                                "trusted_ca": { "filename": v.ca_cert_path },
                            },
                        },
                    },
                },
            }],
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": opts.api_type.envoy_api_type(),
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": {
                    "cluster_name": XDS_CLUSTER_NAME,
                    "retry_policy": { "retry_back_off": {
                        "base_interval": ADS_RETRY_BASE_INTERVAL,
                        "max_interval": ADS_RETRY_MAX_INTERVAL,
                    } },
                } }],
                "set_node_on_first_message_only": true,
            },
            "cds_config": ads_config_source(),
            "lds_config": ads_config_source(),
        },
        "layered_runtime": {
            "layers": [{
                "name": rtds,
                "rtds_layer": { "name": rtds, "rtds_config": ads_config_source() },
            }],
        },
        "bootstrap_extensions": [{
            "name": INTERNAL_LISTENER_EXTENSION,
            "typed_config": { "@type": INTERNAL_LISTENER_TYPE_URL },
        }],
    });
    Ok(bootstrap)
}

/// Renders the file-based SDS resource (a `DiscoveryResponse` in JSON) with the client
/// certificate `xds_client_certificate`: `tls.crt` and `tls.key` under
/// `client_certificate_path`.
///
/// Envoy watches the directories of those files and reloads the secret when they are
/// replaced, including Kubernetes' atomic Secret-volume symlink swap.
///
/// Infallible; a non-UTF-8 certificate path is converted lossily here, but [`bootstrap`]
/// and [`write_files`] reject such options before anything is written.
pub fn sds_secret(opts: &BootstrapOptions) -> Value {
    let file = |name: &str| {
        opts.client_certificate_path
            .join(name)
            .to_string_lossy()
            .into_owned()
    };
    json!({
        "resources": [{
            "@type": SECRET_TYPE_URL,
            "name": SDS_SECRET_NAME,
            "tls_certificate": {
                "certificate_chain": { "filename": file(marin3r_wire::secret_keys::TLS_CRT) },
                "private_key": { "filename": file(marin3r_wire::secret_keys::TLS_KEY) },
            },
        }],
    })
}

/// Writes the bootstrap to `config_file` and the SDS secret to
/// `<resources_path>/tls_certificate_sds_secret.json`, creating missing directories.
///
/// Returns the written paths (bootstrap first). Nothing is written when the options are
/// invalid. Each file is replaced atomically: written to a temporary file in the same
/// directory, flushed, then renamed over the destination.
pub fn write_files(opts: &BootstrapOptions) -> Result<Vec<PathBuf>, BootstrapError> {
    let config = bootstrap(opts)?;
    let secret = sds_secret(opts);
    let outputs = [
        (opts.config_file.clone(), config),
        (opts.sds_secret_path(), secret),
    ];
    let mut written = Vec::with_capacity(outputs.len());
    for (path, value) in outputs {
        let mut bytes =
            serde_json::to_vec_pretty(&value).map_err(|source| BootstrapError::Serialize {
                path: path.clone(),
                source,
            })?;
        bytes.push(b'\n');
        write_atomic(&path, &bytes)?;
        written.push(path);
    }
    Ok(written)
}

/// Distinguishes temporary files of concurrent writers within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` via a temporary sibling file and `rename`, so readers see
/// either the old or the new content, never a partial file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BootstrapError> {
    let write_err = |source| BootstrapError::Write {
        path: path.to_path_buf(),
        source,
    };
    let file_name = path.file_name().ok_or_else(|| {
        write_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "path has no file name",
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|source| BootstrapError::CreateDir {
        path: dir.clone(),
        source,
    })?;

    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);

    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        // Readable by Envoy, which runs as another user than the init manager
        // (`generate::ENVOY_UID`); the files hold no secret (only paths to them).
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if let Err(source) = result {
        // Best effort: do not leave the temporary file behind.
        let _ = fs::remove_file(&tmp);
        return Err(write_err(source));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> BootstrapOptions {
        BootstrapOptions {
            xdss_host: "marin3r-instance.default.svc".to_string(),
            node_id: "node-1".to_string(),
            cluster_id: "cluster-1".to_string(),
            envoy_image: "envoyproxy/envoy:v1.40.0".to_string(),
            pod_name: "pod-a".to_string(),
            pod_namespace: "ns-a".to_string(),
            host_name: "host-a".to_string(),
            ..BootstrapOptions::default()
        }
    }

    fn cluster(b: &Value) -> &Value {
        &b["static_resources"]["clusters"][0]
    }

    fn tls(b: &Value) -> &Value {
        &cluster(b)["transport_socket"]["typed_config"]
    }

    #[test]
    fn defaults_match_the_cli_defaults() {
        let d = BootstrapOptions::default();
        assert_eq!(d.xdss_port, 18000);
        assert_eq!(d.admin_bind_address, "0.0.0.0:9901");
        assert_eq!(d.admin_access_log_path, "/dev/null");
        assert_eq!(
            d.client_certificate_path,
            Path::new("/etc/envoy/tls/client")
        );
        assert_eq!(d.config_file, Path::new("/etc/envoy/bootstrap/config.json"));
        assert_eq!(d.resources_path, Path::new("/etc/envoy/bootstrap"));
        assert_eq!(d.rtds_resource_name, "runtime");
        assert_eq!(d.api_type, ApiType::Sotw);
        assert!(d.node_id.is_empty() && d.xdss_host.is_empty());
    }

    #[test]
    fn api_type_parses_and_displays() {
        assert_eq!("sotw".parse::<ApiType>().unwrap(), ApiType::Sotw);
        assert_eq!("delta".parse::<ApiType>().unwrap(), ApiType::Delta);
        assert_eq!("DELTA".parse::<ApiType>().unwrap(), ApiType::Delta);
        for t in [ApiType::Sotw, ApiType::Delta] {
            assert_eq!(t.to_string().parse::<ApiType>().unwrap(), t);
        }
        let err = "grpc".parse::<ApiType>().unwrap_err();
        assert!(matches!(err, BootstrapError::UnknownApiType(ref s) if s == "grpc"));
        assert!(err.to_string().contains("api_type"), "{err}");
    }

    #[test]
    fn node_carries_id_cluster_and_metadata() {
        let b = bootstrap(&opts()).unwrap();
        assert_eq!(
            b["node"],
            json!({
                "id": "node-1",
                "cluster": "cluster-1",
                "metadata": {
                    "pod_name": "pod-a",
                    "pod_namespace": "ns-a",
                    "host_name": "host-a",
                    "envoy_image": "envoyproxy/envoy:v1.40.0",
                },
            })
        );
    }

    #[test]
    fn admin_uses_address_and_file_access_log() {
        let b = bootstrap(&BootstrapOptions {
            admin_bind_address: "127.0.0.1:15000".to_string(),
            admin_access_log_path: "/tmp/admin.log".to_string(),
            ..opts()
        })
        .unwrap();
        let admin = &b["admin"];
        assert_eq!(
            admin["address"]["socket_address"],
            json!({ "address": "127.0.0.1", "port_value": 15000 })
        );
        assert!(admin.get("access_log_path").is_none());
        assert_eq!(admin["access_log"][0]["name"], "envoy.access_loggers.file");
        assert_eq!(
            admin["access_log"][0]["typed_config"],
            json!({ "@type": FILE_ACCESS_LOG_TYPE_URL, "path": "/tmp/admin.log" })
        );
    }

    #[test]
    fn admin_accepts_ipv6() {
        let b = bootstrap(&BootstrapOptions {
            admin_bind_address: "[::1]:9901".to_string(),
            ..opts()
        })
        .unwrap();
        assert_eq!(
            b["admin"]["address"]["socket_address"],
            json!({ "address": "::1", "port_value": 9901 })
        );
    }

    #[test]
    fn sotw_and_delta_select_the_ads_api_type() {
        let sotw = bootstrap(&opts()).unwrap();
        let delta = bootstrap(&BootstrapOptions {
            api_type: ApiType::Delta,
            ..opts()
        })
        .unwrap();
        assert_eq!(sotw["dynamic_resources"]["ads_config"]["api_type"], "GRPC");
        assert_eq!(
            delta["dynamic_resources"]["ads_config"]["api_type"],
            "DELTA_GRPC"
        );
        // Nothing else differs.
        let mut patched = delta.clone();
        patched["dynamic_resources"]["ads_config"]["api_type"] = json!("GRPC");
        assert_eq!(patched, sotw);
    }

    #[test]
    fn dynamic_resources_and_runtime_come_from_ads() {
        let b = bootstrap(&opts()).unwrap();
        let dr = &b["dynamic_resources"];
        assert_eq!(
            dr["ads_config"],
            json!({
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": {
                    "cluster_name": "xds_cluster",
                    "retry_policy": { "retry_back_off": { "base_interval": "0.5s", "max_interval": "2s" } },
                } }],
                "set_node_on_first_message_only": true,
            })
        );
        let ads = json!({ "ads": {}, "resource_api_version": "V3" });
        assert_eq!(dr["cds_config"], ads);
        assert_eq!(dr["lds_config"], ads);
        assert_eq!(
            b["layered_runtime"],
            json!({ "layers": [{
                "name": "runtime",
                "rtds_layer": { "name": "runtime", "rtds_config": ads },
            }] })
        );

        let custom = bootstrap(&BootstrapOptions {
            rtds_resource_name: "rt".to_string(),
            ..opts()
        })
        .unwrap();
        let layer = &custom["layered_runtime"]["layers"][0];
        assert_eq!(layer["name"], "rt");
        assert_eq!(layer["rtds_layer"]["name"], "rt");
    }

    #[test]
    fn internal_listeners_can_be_served() {
        let b = bootstrap(&opts()).unwrap();
        assert_eq!(
            b["bootstrap_extensions"],
            json!([{
                "name": "envoy.bootstrap.internal_listener",
                "typed_config": { "@type":
                    "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener" },
            }])
        );
    }

    #[test]
    fn xds_cluster_is_strict_dns_http2_with_keepalive() {
        let b = bootstrap(&BootstrapOptions {
            xdss_port: 18443,
            ..opts()
        })
        .unwrap();
        let c = cluster(&b);
        assert_eq!(c["name"], "xds_cluster");
        assert_eq!(c["type"], "STRICT_DNS");
        assert_eq!(c["connect_timeout"], "1s");
        let po = &c["typed_extension_protocol_options"][HTTP_PROTOCOL_OPTIONS_NAME];
        assert_eq!(
            po["@type"],
            "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        );
        assert_eq!(
            po["explicit_http_config"]["http2_protocol_options"]["connection_keepalive"],
            json!({ "interval": "30s", "timeout": "10s" })
        );
        assert_eq!(c["load_assignment"]["cluster_name"], "xds_cluster");
        assert_eq!(
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
            json!({ "socket_address": {
                "address": "marin3r-instance.default.svc",
                "port_value": 18443,
            } })
        );
    }

    #[test]
    fn tls_uses_sni_sds_client_cert_and_ca_validation() {
        let b = bootstrap(&BootstrapOptions {
            client_certificate_path: PathBuf::from("/certs/client"),
            resources_path: PathBuf::from("/res"),
            ..opts()
        })
        .unwrap();
        assert_eq!(
            cluster(&b)["transport_socket"]["name"],
            "envoy.transport_sockets.tls"
        );
        let t = tls(&b);
        assert_eq!(t["@type"], UPSTREAM_TLS_TYPE_URL);
        assert_eq!(t["sni"], "marin3r-instance.default.svc");
        assert_eq!(
            t["common_tls_context"],
            json!({
                "tls_certificate_sds_secret_configs": [{
                    "name": "xds_client_certificate",
                    "sds_config": {
                        "path_config_source": { "path": "/res/tls_certificate_sds_secret.json" },
                        "resource_api_version": "V3",
                    },
                }],
                "validation_context": {
                    "trusted_ca": { "filename": "/certs/client/ca.crt" },
                },
            })
        );
    }

    #[test]
    fn bracketed_ipv6_xdss_host_is_unbracketed() {
        let b = bootstrap(&BootstrapOptions {
            xdss_host: "[fd00::1]".to_string(),
            ..opts()
        })
        .unwrap();
        assert_eq!(tls(&b)["sni"], "fd00::1", "SNI = xdss-host, also for an IP");
        assert_eq!(
            cluster(&b)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["address"],
            "fd00::1"
        );
    }

    #[test]
    fn sds_secret_references_client_cert_files() {
        let s = sds_secret(&BootstrapOptions {
            client_certificate_path: PathBuf::from("/certs/client"),
            ..opts()
        });
        assert_eq!(
            s,
            json!({ "resources": [{
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
                "name": "xds_client_certificate",
                "tls_certificate": {
                    "certificate_chain": { "filename": "/certs/client/tls.crt" },
                    "private_key": { "filename": "/certs/client/tls.key" },
                },
            }] })
        );
    }

    #[test]
    fn output_is_deterministic() {
        let a = serde_json::to_string(&bootstrap(&opts()).unwrap()).unwrap();
        let b = serde_json::to_string(&bootstrap(&opts()).unwrap()).unwrap();
        assert_eq!(a, b);
    }

    fn field_of(err: BootstrapError) -> &'static str {
        match err {
            BootstrapError::Empty { field }
            | BootstrapError::Invalid { field, .. }
            | BootstrapError::NonUtf8Path { field, .. } => field,
            BootstrapError::AdminBindAddress { .. } => "admin_bind_address",
            other => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn invalid_inputs_name_the_field() {
        let cases: Vec<(BootstrapOptions, &str)> = vec![
            (
                BootstrapOptions {
                    node_id: String::new(),
                    ..opts()
                },
                "node_id",
            ),
            (
                BootstrapOptions {
                    node_id: "  ".to_string(),
                    ..opts()
                },
                "node_id",
            ),
            (
                BootstrapOptions {
                    cluster_id: String::new(),
                    ..opts()
                },
                "cluster_id",
            ),
            (
                BootstrapOptions {
                    xdss_host: String::new(),
                    ..opts()
                },
                "xdss_host",
            ),
            (
                BootstrapOptions {
                    xdss_host: "xds.svc:18000".to_string(),
                    ..opts()
                },
                "xdss_host",
            ),
            (
                BootstrapOptions {
                    xdss_host: "bad host".to_string(),
                    ..opts()
                },
                "xdss_host",
            ),
            (
                BootstrapOptions {
                    xdss_port: 0,
                    ..opts()
                },
                "xdss_port",
            ),
            (
                BootstrapOptions {
                    admin_bind_address: "localhost:9901".to_string(),
                    ..opts()
                },
                "admin_bind_address",
            ),
            (
                BootstrapOptions {
                    admin_bind_address: "0.0.0.0".to_string(),
                    ..opts()
                },
                "admin_bind_address",
            ),
            (
                BootstrapOptions {
                    admin_bind_address: "::1:9901".to_string(),
                    ..opts()
                },
                "admin_bind_address",
            ),
            (
                BootstrapOptions {
                    admin_access_log_path: String::new(),
                    ..opts()
                },
                "admin_access_log_path",
            ),
            (
                BootstrapOptions {
                    rtds_resource_name: String::new(),
                    ..opts()
                },
                "rtds_resource_name",
            ),
        ];
        for (o, field) in cases {
            let err = bootstrap(&o).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(field), "{msg:?} should name {field}");
            assert_eq!(field_of(err), field);
        }
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_paths_are_rejected() {
        use std::os::unix::ffi::OsStrExt as _;
        let bad = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xff"));
        let err = bootstrap(&BootstrapOptions {
            client_certificate_path: bad.clone(),
            ..opts()
        })
        .unwrap_err();
        assert_eq!(field_of(err), "client_certificate_path");
        let err = bootstrap(&BootstrapOptions {
            resources_path: bad,
            ..opts()
        })
        .unwrap_err();
        assert_eq!(field_of(err), "resources_path");
    }

    #[test]
    fn write_files_writes_both_files_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let o = BootstrapOptions {
            config_file: dir.path().join("a/b/config.json"),
            resources_path: dir.path().join("res"),
            ..opts()
        };
        let written = write_files(&o).unwrap();
        assert_eq!(
            written,
            vec![
                dir.path().join("a/b/config.json"),
                dir.path().join("res/tls_certificate_sds_secret.json"),
            ]
        );
        let config: Value = serde_json::from_slice(&fs::read(&written[0]).unwrap()).unwrap();
        assert_eq!(config, bootstrap(&o).unwrap());
        let secret: Value = serde_json::from_slice(&fs::read(&written[1]).unwrap()).unwrap();
        assert_eq!(secret, sds_secret(&o));

        // Rewriting replaces the content and leaves no temporary files behind.
        let o2 = BootstrapOptions {
            node_id: "node-2".to_string(),
            ..o
        };
        write_files(&o2).unwrap();
        let config: Value = serde_json::from_slice(&fs::read(&written[0]).unwrap()).unwrap();
        assert_eq!(config["node"]["id"], "node-2");
        for d in [dir.path().join("a/b"), dir.path().join("res")] {
            let names: Vec<_> = fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names.len(), 1, "{names:?} in {}", d.display());
        }
    }

    #[test]
    fn write_files_rejects_invalid_options_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let o = BootstrapOptions {
            node_id: String::new(),
            config_file: dir.path().join("config.json"),
            resources_path: dir.path().to_path_buf(),
            ..opts()
        };
        assert!(matches!(
            write_files(&o),
            Err(BootstrapError::Empty { field: "node_id" })
        ));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn write_errors_carry_the_path() {
        let dir = tempfile::tempdir().unwrap();
        // A regular file where a directory is needed.
        let blocker = dir.path().join("blocker");
        fs::write(&blocker, b"x").unwrap();
        let o = BootstrapOptions {
            config_file: blocker.join("config.json"),
            resources_path: dir.path().join("res"),
            ..opts()
        };
        let err = write_files(&o).unwrap_err();
        match &err {
            BootstrapError::CreateDir { path, .. } => assert_eq!(path, &blocker),
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("blocker"), "{err}");

        // A directory where the file should go: rename fails, temp file is cleaned up.
        let o = BootstrapOptions {
            config_file: dir.path().join("cfgdir"),
            resources_path: dir.path().join("res"),
            ..opts()
        };
        fs::create_dir(dir.path().join("cfgdir")).unwrap();
        fs::write(dir.path().join("cfgdir/keep"), b"x").unwrap();
        match write_files(&o).unwrap_err() {
            BootstrapError::Write { path, .. } => assert_eq!(path, dir.path().join("cfgdir")),
            other => panic!("unexpected {other:?}"),
        }
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
