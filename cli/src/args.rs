//! Command-line interface. Every flag can also be set by `MARIN3R_<FLAG>`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use marin3r_wire::{olm, paths, ports, secret_keys};

use crate::logging::LogFormat;

/// Flag defaults composed from the wire facts (clap takes a `&'static str`).
mod compose {
    use std::sync::LazyLock;

    use marin3r_wire::ports;

    /// `:8383`: /metrics of the discovery service and the operator.
    pub static METRICS_BIND: LazyLock<String> = LazyLock::new(|| format!(":{}", ports::METRICS));
    /// `:8384`: /healthz and /readyz of the discovery service and the operator.
    pub static PROBES_BIND: LazyLock<String> = LazyLock::new(|| format!(":{}", ports::PROBES));
    /// `http://127.0.0.1:8383`: the discovery service `marin3r status` asks.
    pub static STATUS_URL: LazyLock<String> =
        LazyLock::new(|| format!("http://127.0.0.1:{}", ports::METRICS));
}

#[derive(Debug, Parser)]
#[command(
    name = "marin3r",
    version,
    about = "MARIN3R: Envoy sidecar injection and control plane for Kubernetes"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags of every subcommand.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "json",
        env = "MARIN3R_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Log level or tracing filter (RUST_LOG overrides it).
    #[arg(long, global = true, default_value = "info", env = "MARIN3R_LOG_LEVEL")]
    pub log_level: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar-injection admission webhook (HTTPS).
    Webhook(WebhookArgs),
    /// Inject the sidecar into Pods and workload templates from a file, offline.
    Inject(InjectArgs),
    /// Write Envoy's bootstrap and the client-certificate SDS file (init container).
    InitManager(InitManagerArgs),
    /// Drain Envoy's connections before the pod stops (sidecar).
    ShutdownManager(ShutdownManagerArgs),
    /// Issue a CA, a server and a client certificate.
    Certs(CertsArgs),
    /// Run the Envoy discovery service (ADS over mTLS).
    DiscoveryService(DiscoveryServiceArgs),
    /// Decode every resource of every EnvoyConfig in a file; exit 1 listing all errors.
    Validate(ValidateArgs),
    /// Show the EnvoyConfigs like `kubectl get ec`, and the Envoys connected (CSDS).
    ///
    /// Local mode (the default): the EnvoyConfigs from `GET /status` of the discovery
    /// service at --url, then the Envoys from its CSDS at --csds-address (default: the host
    /// of --url on the ADS port 18000, i.e. 127.0.0.1:18000). CSDS is on the mTLS ADS
    /// listener: the client certificate is --csds-certificate-path DIR (DIR/tls.crt,
    /// DIR/tls.key, DIR/ca.crt, as `marin3r certs --out X` writes X/client), else
    /// `.local/quickstart/certs/client` when it exists (the quickstart's). The server
    /// certificate must name the address's host (the quickstart's names 127.0.0.1 and
    /// localhost), or --csds-server-name.
    ///
    /// Kubernetes mode (--kubernetes, -n or -A; never guessed from a kubeconfig being
    /// present, so the quickstart on a laptop with a cluster context stays local): the
    /// EnvoyConfigs (with --revisions, their EnvoyConfigRevisions) through the API server
    /// (kubeconfig or in-cluster config; -n NAMESPACE, default the context's namespace; -A
    /// every namespace), then the Envoys from every replica of the discovery service:
    /// the running Pods its Service `marin3r-<--discovery-service-name>` selects, each
    /// reached through a port-forward by the API server (as `kubectl port-forward`; needs
    /// `get` on services, `list` on pods, `get` and `create` on pods/portforward), rows
    /// labelled `pod/<name>`. --csds-address instead asks those addresses (repeat it for
    /// several replicas). The client certificate defaults to the Secret
    /// `envoy-sidecar-client-cert` of the namespace, the server name to the Service's
    /// name.
    ///
    /// NODE: only that node id; with -o json|yaml, the configuration its Envoys hold (each
    /// resource decoded; Secrets as name and version only).
    ///
    /// Exit codes: 0 everything shown; 1 the EnvoyConfigs could not be read; 3 the
    /// EnvoyConfigs are shown but the Envoys of at least one replica are not (a line says
    /// why).
    Status(StatusArgs),
    /// Print the CustomResourceDefinitions (EnvoyConfig, EnvoyConfigRevision) as YAML.
    Crds(CrdsArgs),
    /// The operator (DiscoveryService, DiscoveryServiceCertificate, EnvoyDeployment).
    Operator(OperatorArgs),
}

/// `marin3r operator`: with no subcommand, runs the controllers.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    #[command(subcommand)]
    pub command: Option<OperatorCommand>,
    #[command(flatten)]
    pub run: OperatorRunArgs,
}

/// `marin3r operator` (run).
#[derive(Debug, Args)]
pub struct OperatorRunArgs {
    /// Plain-HTTP address of /metrics.
    #[arg(long, env = "MARIN3R_METRICS_BIND_ADDRESS", default_value = compose::METRICS_BIND.as_str(), value_parser = bind_address)]
    pub metrics_bind_address: SocketAddr,
    /// Plain-HTTP address of /healthz and /readyz.
    #[arg(long, env = "MARIN3R_HEALTH_PROBE_BIND_ADDRESS", default_value = compose::PROBES_BIND.as_str(), value_parser = bind_address)]
    pub health_probe_bind_address: SocketAddr,
    /// Run the controllers only while holding the leader Lease (in POD_NAMESPACE, as
    /// POD_NAME); `--leader-elect=false` runs them at once (one replica only).
    #[arg(long, env = "MARIN3R_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    #[command(flatten)]
    pub images: OperatorImages,
}

/// The images the operator puts in what it generates (`marin3r operator` and
/// `marin3r operator render`).
#[derive(Debug, Args)]
pub struct OperatorImages {
    /// Image of the discovery service, the init manager and the shutdown manager when a
    /// resource names none.
    #[arg(long = "marin3r-image", env = "MARIN3R_IMAGE", default_value = marin3r_wire::images::MARIN3R)]
    pub marin3r_image: String,
    /// Envoy image of EnvoyDeployments without `spec.image`.
    #[arg(long = "envoy-image", env = "MARIN3R_ENVOY_IMAGE", default_value = marin3r_wire::images::ENVOY)]
    pub envoy_image: String,
}

impl From<OperatorImages> for marin3r_operator::Images {
    fn from(i: OperatorImages) -> Self {
        Self {
            marin3r: i.marin3r_image,
            envoy: i.envoy_image,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Print, as YAML, the objects the operator's controllers would apply for the
    /// DiscoveryService, EnvoyDeployment and EnvoyConfig manifests of a file (no cluster
    /// needed; a Namespace in the file gives its OpenShift uid-range, the Envoy pods'
    /// user); exit 1 listing what cannot be rendered.
    Render(RenderArgs),
}

/// `marin3r operator render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// YAML/JSON file (multi-document); `-` reads standard input.
    #[arg(short = 'f', long = "filename", env = "MARIN3R_FILENAME")]
    pub file: PathBuf,
    #[command(flatten)]
    pub images: OperatorImages,
}

/// `marin3r crds`.
#[derive(Debug, Args, Clone, Copy)]
pub struct CrdsArgs {
    /// Print the operator's CRDs instead (DiscoveryService, DiscoveryServiceCertificate,
    /// EnvoyDeployment; what `manifests/operator/crds/` holds).
    #[arg(long)]
    pub operator: bool,
}

/// Parses a listen address: `:8081` (all interfaces), `127.0.0.1:8081`, `[::1]:8081`.
pub fn bind_address(s: &str) -> Result<SocketAddr, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("{s:?}: invalid port"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not an address like :8081 or 127.0.0.1:8081"))
}

/// Defaults used when a Pod does not set the corresponding annotation.
#[derive(Debug, Args, Clone)]
pub struct InjectionDefaults {
    /// Envoy image when `marin3r.3scale.net/envoy-image` is not set.
    #[arg(long, env = "MARIN3R_DEFAULT_ENVOY_IMAGE", default_value = marin3r_wire::images::ENVOY)]
    pub default_envoy_image: String,
    /// Discovery service name when `marin3r.3scale.net/discovery-service.name` is not set.
    #[arg(long, env = "MARIN3R_DEFAULT_DISCOVERY_SERVICE", default_value = marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE)]
    pub default_discovery_service: String,
    /// Image of the init and shutdown managers (normally this marin3r image).
    #[arg(long, env = "MARIN3R_MARIN3R_IMAGE", default_value = marin3r_wire::images::MARIN3R)]
    pub marin3r_image: String,
}

impl From<InjectionDefaults> for marin3r_sidecar::Defaults {
    fn from(d: InjectionDefaults) -> Self {
        Self {
            envoy_image: d.default_envoy_image,
            discovery_service: d.default_discovery_service,
            marin3r_image: d.marin3r_image,
        }
    }
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// HTTPS port of the admission endpoint `/pod-v1-mutate`.
    #[arg(long, env = "MARIN3R_WEBHOOK_PORT", default_value_t = 9443)]
    pub webhook_port: u16,
    /// Address the HTTPS port binds to.
    #[arg(long, env = "MARIN3R_WEBHOOK_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub webhook_bind_address: IpAddr,
    /// Directory holding the serving certificate and key (re-read when they change).
    /// Alone, it may hold either OLM v0's `apiserver.crt`/`apiserver.key` or a
    /// `kubernetes.io/tls` Secret's `tls.crt`/`tls.key` (looked for in that order, again
    /// at every reload).
    #[arg(long, env = "MARIN3R_TLS_DIR", default_value = olm::APISERVER_CERT_DIR)]
    pub tls_dir: PathBuf,
    /// Certificate file name inside --tls-dir (given: only this layout is read; the key
    /// defaults to `tls.key`).
    #[arg(long, env = "MARIN3R_TLS_CERT_NAME")]
    pub tls_cert_name: Option<String>,
    /// Key file name inside --tls-dir (given: only this layout is read; the certificate
    /// defaults to `tls.crt`).
    #[arg(long, env = "MARIN3R_TLS_KEY_NAME")]
    pub tls_key_name: Option<String>,
    /// Plain-HTTP address of /healthz and /readyz.
    #[arg(long, env = "MARIN3R_HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081", value_parser = bind_address)]
    pub health_probe_bind_address: SocketAddr,
    /// Plain-HTTP address of /metrics.
    #[arg(long, env = "MARIN3R_METRICS_BIND_ADDRESS", default_value = ":8080", value_parser = bind_address)]
    pub metrics_bind_address: SocketAddr,
    #[command(flatten)]
    pub defaults: InjectionDefaults,
}

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// YAML file with Pods and workloads (multi-document); `-` reads standard input.
    #[arg(short = 'f', long = "filename", env = "MARIN3R_FILENAME")]
    pub file: PathBuf,
    #[command(flatten)]
    pub defaults: InjectionDefaults,
}

#[derive(Debug, Args)]
pub struct InitManagerArgs {
    /// Discovery service host.
    #[arg(long, env = "MARIN3R_XDSS_HOST")]
    pub xdss_host: String,
    /// Discovery service port.
    #[arg(long, env = "MARIN3R_XDSS_PORT", default_value_t = ports::XDSS)]
    pub xdss_port: u16,
    /// Envoy node id.
    #[arg(long, env = "MARIN3R_NODE_ID")]
    pub node_id: String,
    /// Envoy cluster id (defaults to the node id).
    #[arg(long, env = "MARIN3R_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Envoy admin listener, ip:port.
    #[arg(
        long,
        env = "MARIN3R_ADMIN_BIND_ADDRESS",
        default_value_t = marin3r_sidecar::bootstrap::BootstrapOptions::default().admin_bind_address
    )]
    pub admin_bind_address: String,
    /// Envoy admin access log path.
    #[arg(
        long,
        env = "MARIN3R_ADMIN_ACCESS_LOG_PATH",
        default_value = paths::ENVOY_ADMIN_ACCESS_LOG
    )]
    pub admin_access_log_path: String,
    /// Directory of the client certificate (tls.crt, tls.key, ca.crt).
    #[arg(
        long,
        env = "MARIN3R_CLIENT_CERTIFICATE_PATH",
        default_value = paths::ENVOY_TLS_CLIENT
    )]
    pub client_certificate_path: PathBuf,
    /// Bootstrap file to write [default: <resources-path>/config.json, i.e.
    /// /etc/envoy/bootstrap/config.json].
    #[arg(long, env = "MARIN3R_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
    /// Directory of the bootstrap (unless --config-file says otherwise) and the SDS file.
    #[arg(
        long,
        env = "MARIN3R_RESOURCES_PATH",
        default_value = paths::ENVOY_BOOTSTRAP
    )]
    pub resources_path: PathBuf,
    /// Name of the RTDS runtime layer.
    #[arg(long, env = "MARIN3R_RTDS_RESOURCE_NAME", default_value = "runtime")]
    pub rtds_resource_name: String,
    /// Envoy image (recorded in the node metadata).
    #[arg(long, env = "MARIN3R_ENVOY_IMAGE", default_value = marin3r_wire::images::ENVOY)]
    pub envoy_image: String,
    /// xDS flavour: state of the world or incremental.
    #[arg(long, env = "MARIN3R_API_TYPE", default_value = "sotw")]
    pub api_type: marin3r_sidecar::bootstrap::ApiType,
    /// Pod name; falls back to $POD_NAME (downward API), then empty.
    #[arg(long, env = "MARIN3R_POD_NAME")]
    pub pod_name: Option<String>,
    /// Pod namespace; falls back to $POD_NAMESPACE (downward API), then empty.
    #[arg(long, env = "MARIN3R_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Node host name; falls back to $HOST_NAME (downward API), then empty.
    #[arg(long, env = "MARIN3R_HOST_NAME")]
    pub host_name: Option<String>,
}

#[derive(Debug, Args)]
pub struct ShutdownManagerArgs {
    /// HTTP port of /healthz, /drain and /shutdown.
    #[arg(long, env = "MARIN3R_PORT", default_value_t = ports::SHUTDOWN_MANAGER)]
    pub port: u16,
    /// Address the port binds to.
    #[arg(long, env = "MARIN3R_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// Envoy admin URL.
    #[arg(
        long,
        env = "MARIN3R_ENVOY_ADMIN_ADDRESS",
        default_value_t = marin3r_shutdown_manager::Config::default().envoy_admin_address
    )]
    pub envoy_admin_address: String,
    /// File created when draining finished.
    #[arg(long, env = "MARIN3R_READY_FILE", default_value = "/tmp/shutdown-ok")]
    pub ready_file: PathBuf,
    /// How often /shutdown checks for the ready file.
    #[arg(long, env = "MARIN3R_CHECK_READY_INTERVAL", default_value = "1s", value_parser = duration)]
    pub check_ready_interval: std::time::Duration,
    /// How often open connections are polled while draining.
    #[arg(long, env = "MARIN3R_CHECK_DRAIN_INTERVAL", default_value = "5s", value_parser = duration)]
    pub check_drain_interval: std::time::Duration,
    /// Wait before failing Envoy's health check.
    #[arg(long, env = "MARIN3R_START_DRAIN_DELAY", default_value = "0s", value_parser = duration)]
    pub start_drain_delay: std::time::Duration,
    /// Wait after failing the health check before polling connections.
    #[arg(long, env = "MARIN3R_CHECK_DRAIN_DELAY", default_value = "15s", value_parser = duration)]
    pub check_drain_delay: std::time::Duration,
    /// Open connections at or below which draining is done.
    #[arg(long, env = "MARIN3R_MIN_OPEN_CONNECTIONS", default_value_t = 0)]
    pub min_open_connections: u64,
    /// Minimum time a drain lasts.
    #[arg(long, env = "MARIN3R_MIN_DRAIN_DURATION", value_parser = duration)]
    pub min_drain_duration: Option<std::time::Duration>,
    /// Give up draining after this long.
    #[arg(long, env = "MARIN3R_DRAIN_TIMEOUT", value_parser = duration)]
    pub drain_timeout: Option<std::time::Duration>,
    /// /shutdown answers 500 after waiting this long for the ready file.
    #[arg(long, env = "MARIN3R_READY_TIMEOUT", value_parser = duration)]
    pub ready_timeout: Option<std::time::Duration>,
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    marin3r_shutdown_manager::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct DiscoveryServiceArgs {
    /// gRPC port (ADS SotW and Delta, grpc.health.v1), mTLS only.
    #[arg(long, env = "MARIN3R_XDSS_PORT", default_value_t = ports::XDSS)]
    pub xdss_port: u16,
    /// Address the gRPC port binds to.
    #[arg(long, env = "MARIN3R_XDSS_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub xdss_bind_address: IpAddr,
    /// Directory with the server certificate (tls.crt, tls.key), re-read on change.
    #[arg(
        long,
        env = "MARIN3R_SERVER_CERTIFICATE_PATH",
        default_value = paths::DISCOVERY_SERVICE_SERVER_CERT
    )]
    pub server_certificate_path: PathBuf,
    /// Directory with the CA client certificates must chain to (ca.crt, else tls.crt).
    #[arg(
        long,
        env = "MARIN3R_CA_CERTIFICATE_PATH",
        default_value = paths::DISCOVERY_SERVICE_CA
    )]
    pub ca_certificate_path: PathBuf,
    /// Local mode: serve the EnvoyConfig and Secret manifests of this folder (watched).
    #[arg(long, env = "MARIN3R_CONFIG_DIR")]
    pub config_dir: Option<PathBuf>,
    /// Plain-HTTP address of /metrics.
    #[arg(long, env = "MARIN3R_METRICS_BIND_ADDRESS", default_value = compose::METRICS_BIND.as_str(), value_parser = bind_address)]
    pub metrics_bind_address: SocketAddr,
    /// Plain-HTTP address of /healthz and /readyz.
    #[arg(long, env = "MARIN3R_HEALTH_PROBE_BIND_ADDRESS", default_value = compose::PROBES_BIND.as_str(), value_parser = bind_address)]
    pub health_probe_bind_address: SocketAddr,
    /// Self-healing: NACKs from every subscribed Envoy of a node (each) that taint the
    /// published revision and roll back to the previous one.
    #[arg(long, env = "MARIN3R_NACK_THRESHOLD", default_value_t = marin3r_control_plane::revisions::DEFAULT_NACK_THRESHOLD, value_parser = clap::value_parser!(u64).range(1..))]
    pub nack_threshold: u64,
    /// Local mode: persist the revisions of every EnvoyConfig in this folder (JSON, one
    /// file each, replaced atomically) so taints and rollbacks survive restarts.
    #[arg(long, env = "MARIN3R_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// On SIGTERM, after --drain-delay, close the open connections (GOAWAY; their ADS
    /// streams end with UNAVAILABLE) spread evenly over this window so the Envoys
    /// reconnect to another replica a few at a time (0s: all at once). Keep
    /// --drain-delay + --drain-time + 12s below the pod's termination grace period (30s
    /// by default).
    #[arg(long, env = "MARIN3R_DRAIN_TIME", default_value = "5s", value_parser = duration)]
    pub drain_time: std::time::Duration,
    /// On SIGTERM, keep serving fully (new connections and streams) this long while
    /// Kubernetes removes the pod's endpoint, then start the drain (--drain-time).
    /// Skipped when no Envoy is connected.
    #[arg(long, env = "MARIN3R_DRAIN_DELAY", default_value = "5s", value_parser = duration)]
    pub drain_delay: std::time::Duration,
    /// Close each connection (GOAWAY; its ADS streams end with UNAVAILABLE, the Envoy
    /// reconnects, possibly to another replica) once it is this old, ± 10 % jitter per
    /// connection, so the streams rebalance over the replicas after a rollout (0: never).
    #[arg(long, env = "MARIN3R_MAX_CONNECTION_AGE", default_value = "30m", value_parser = duration)]
    pub max_connection_age: std::time::Duration,
    /// Kubernetes mode: run as one of several replicas (docs/ha.md). Every replica
    /// serves; only the holder of the Lease `marin3r-<--discovery-service-name>-leader`
    /// writes to the API server, and NACKs are judged over every replica's report
    /// (DiscoveryServiceReplica). Needs POD_NAME, POD_UID and POD_NAMESPACE from the
    /// downward API. Without it: a single replica (no Lease, no reports).
    #[arg(long, env = "MARIN3R_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The DiscoveryService this replica belongs to: its Service is `marin3r-<name>`
    /// (whose EndpointSlices tell which replicas to expect) and its Lease
    /// `marin3r-<name>-leader`.
    #[arg(long, env = "MARIN3R_DISCOVERY_SERVICE_NAME", default_value = marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE)]
    pub discovery_service_name: String,
    /// How long the leader's Lease lasts without renewal (renewed a third of it, at
    /// most 5s, before it expires); writes stop 2s before.
    #[arg(long, env = "MARIN3R_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusOutput {
    /// A table like `kubectl get ec`, then the ENVOYS table.
    Table,
    /// The JSON of `GET /status` with `envoys` (and `envoysUnavailable`) added; with
    /// NODE: that node's Envoys and their resources.
    Json,
    /// The same document as YAML.
    Yaml,
}

/// `marin3r status` (its help is on [`Command::Status`]).
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this node id: its EnvoyConfig and its Envoys (with -o json|yaml: their
    /// configuration).
    #[arg(value_name = "NODE")]
    pub node: Option<String>,
    /// Local mode: URL of the discovery service's metrics listener
    /// (`--metrics-bind-address`).
    #[arg(long, env = "MARIN3R_URL", default_value = compose::STATUS_URL.as_str())]
    pub url: String,
    /// Kubernetes mode: read the EnvoyConfigs through the API server (implied by -n, -A).
    #[arg(long, env = "MARIN3R_KUBERNETES")]
    pub kubernetes: bool,
    /// Kubernetes mode: the namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long, env = "MARIN3R_NAMESPACE")]
    pub namespace: Option<String>,
    /// Kubernetes mode: every namespace.
    #[arg(short = 'A', long, env = "MARIN3R_ALL_NAMESPACES")]
    pub all_namespaces: bool,
    /// Also list the revisions of every EnvoyConfig.
    #[arg(long, env = "MARIN3R_REVISIONS")]
    pub revisions: bool,
    /// Output format.
    #[arg(
        short = 'o',
        long,
        env = "MARIN3R_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: StatusOutput,
    /// CSDS (the ADS port) of a discovery service replica, HOST:PORT; repeat it (or
    /// comma-separate) for several replicas. Local mode default: the host of --url on port
    /// 18000.
    #[arg(long, env = "MARIN3R_CSDS_ADDRESS", value_delimiter = ',')]
    pub csds_address: Vec<String>,
    /// Directory with the CSDS client certificate: tls.crt, tls.key and ca.crt.
    #[arg(long, env = "MARIN3R_CSDS_CERTIFICATE_PATH")]
    pub csds_certificate_path: Option<PathBuf>,
    /// The CA the discovery service's certificate chains to (default: ca.crt of
    /// --csds-certificate-path).
    #[arg(long, env = "MARIN3R_CSDS_CA")]
    pub csds_ca: Option<PathBuf>,
    /// The CSDS client certificate (default: tls.crt of --csds-certificate-path).
    #[arg(long, env = "MARIN3R_CSDS_CERT")]
    pub csds_cert: Option<PathBuf>,
    /// Its key (default: tls.key of --csds-certificate-path).
    #[arg(long, env = "MARIN3R_CSDS_KEY")]
    pub csds_key: Option<PathBuf>,
    /// The name the discovery service's certificate must have (default: the host of
    /// --csds-address in local mode, marin3r-<--discovery-service-name> in Kubernetes
    /// mode).
    #[arg(long, env = "MARIN3R_CSDS_SERVER_NAME")]
    pub csds_server_name: Option<String>,
    /// Kubernetes mode: the discovery service whose replicas are asked (its Service is
    /// `marin3r-<name>`; a DiscoveryService's name with the operator).
    #[arg(long, env = "MARIN3R_DISCOVERY_SERVICE_NAME", default_value = marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE)]
    pub discovery_service_name: String,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// YAML/JSON file with EnvoyConfigs (and the Secrets they use); `-` reads stdin.
    #[arg(short = 'f', long = "filename", env = "MARIN3R_FILENAME")]
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Output directory: DIR/{ca,server,client}/{tls.crt,tls.key,ca.crt}.
    #[arg(long, env = "MARIN3R_OUT")]
    pub out: PathBuf,
    /// DNS names and IP addresses of the server certificate, comma separated.
    #[arg(long, env = "MARIN3R_HOSTS", value_delimiter = ',', required = true)]
    pub hosts: Vec<String>,
    /// Common name of the client certificate.
    #[arg(long, env = "MARIN3R_CLIENT_CN", default_value = marin3r_certs::DEFAULT_CLIENT_CN)]
    pub client_cn: String,
    /// Validity of every certificate (e.g. 8760h, 30m, plain seconds).
    #[arg(long, env = "MARIN3R_VALIDITY", default_value = "8760h", value_parser = duration)]
    pub validity: std::time::Duration,
    /// Key algorithm.
    #[arg(long, env = "MARIN3R_KEY_TYPE", default_value = "ecdsa")]
    pub key_type: marin3r_certs::KeyType,
}

impl WebhookArgs {
    /// The serving files: `--tls-dir` with either layout, or the names given.
    pub fn serving_files(&self) -> marin3r_certs::ServingFiles {
        if self.tls_cert_name.is_none() && self.tls_key_name.is_none() {
            return marin3r_certs::ServingFiles::dir(&self.tls_dir);
        }
        let name = |given: &Option<String>, default: &str| {
            self.tls_dir.join(given.as_deref().unwrap_or(default))
        };
        marin3r_certs::ServingFiles::pair(
            name(&self.tls_cert_name, secret_keys::TLS_CRT),
            name(&self.tls_key_name, secret_keys::TLS_KEY),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bind_addresses() {
        assert_eq!(bind_address(":8081").unwrap().to_string(), "0.0.0.0:8081");
        assert_eq!(
            bind_address("127.0.0.1:1").unwrap().to_string(),
            "127.0.0.1:1"
        );
        assert_eq!(bind_address("[::1]:1").unwrap().to_string(), "[::1]:1");
        assert!(bind_address("8081").is_err());
        assert!(bind_address(":x").is_err());
    }

    #[test]
    fn discovery_service_drain_and_max_age_flags_default_to_the_library_defaults() {
        use clap::Parser as _;
        use std::time::Duration;
        let parse = |args: &[&str]| {
            let args = [&["marin3r", "discovery-service"], args].concat();
            Cli::try_parse_from(args).map(|cli| {
                let Command::DiscoveryService(a) = cli.command else {
                    panic!("not the discovery service");
                };
                (a.drain_delay, a.drain_time, a.max_connection_age)
            })
        };
        let library = marin3r_xds::AdsConfig::default();
        assert_eq!(
            parse(&[]).unwrap(),
            (
                library.drain_delay,
                library.drain_time,
                library.max_connection_age
            )
        );
        assert_eq!(library.max_connection_age, Duration::from_secs(30 * 60));
        let set = [
            "--drain-delay",
            "1.5s",
            "--drain-time",
            "0s",
            "--max-connection-age",
            "0",
        ];
        assert_eq!(
            parse(&set).unwrap(),
            (Duration::from_millis(1500), Duration::ZERO, Duration::ZERO)
        );
        assert!(parse(&["--max-connection-age", "-1m"]).is_err());
    }

    #[test]
    fn webhook_tls_dir_alone_serves_either_layout_and_given_names_win() {
        use clap::Parser as _;
        use marin3r_certs::ServingFiles;
        let files = |args: &[&str]| {
            let args = [&["marin3r", "webhook"], args].concat();
            let Command::Webhook(a) = Cli::try_parse_from(args).unwrap().command else {
                panic!("not the webhook");
            };
            a.serving_files()
        };
        assert_eq!(files(&[]), ServingFiles::dir(olm::APISERVER_CERT_DIR));
        assert_eq!(files(&["--tls-dir", "/certs"]), ServingFiles::dir("/certs"));
        assert_eq!(
            files(&["--tls-dir", "/certs", "--tls-cert-name", "a.pem"]),
            ServingFiles::pair("/certs/a.pem", "/certs/tls.key")
        );
        assert_eq!(
            files(&["--tls-dir=/c", "--tls-cert-name=x", "--tls-key-name=y"]),
            ServingFiles::pair("/c/x", "/c/y")
        );
    }

    #[test]
    fn operator_runs_without_a_subcommand_with_leader_election_on_by_default() {
        use clap::Parser as _;
        let leader_elect = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::Operator(a) = cli.command else {
                panic!("not the operator");
            };
            assert!(a.command.is_none());
            a.run.leader_elect
        };
        assert!(leader_elect(&["marin3r", "operator"]));
        assert!(leader_elect(&["marin3r", "operator", "--leader-elect"]));
        assert!(!leader_elect(&[
            "marin3r",
            "operator",
            "--leader-elect=false"
        ]));
        let cli = Cli::try_parse_from(["marin3r", "operator", "render", "-f", "-"]).unwrap();
        let Command::Operator(a) = cli.command else {
            panic!("not the operator");
        };
        assert!(matches!(a.command, Some(OperatorCommand::Render(_))));
    }
}
