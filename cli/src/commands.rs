//! Subcommand wiring: build each library's config from the parsed flags and call it.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Context as _, Result};

use crate::terminal;

use crate::args::{
    CertsArgs, Command, CrdsArgs, DiscoveryServiceArgs, InitManagerArgs, InjectArgs,
    OperatorCommand, OperatorRunArgs, RenderArgs, ShutdownManagerArgs, StatusArgs, StatusOutput,
    ValidateArgs, WebhookArgs,
};

pub fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Webhook(a) => runtime()?.block_on(webhook(a)),
        Command::ShutdownManager(a) => {
            exec_shutdown_manager_binary();
            run_shutdown_manager(a)
        }
        Command::Inject(a) => inject(a),
        Command::InitManager(a) => init_manager(a),
        Command::Certs(a) => certs(a),
        Command::DiscoveryService(a) => runtime()?.block_on(discovery_service(a)),
        Command::Validate(a) => validate(a),
        Command::Status(a) => status(a),
        Command::Crds(a) => crds(a),
        Command::Operator(a) => match a.command {
            Some(OperatorCommand::Render(r)) => operator_render(r),
            None => runtime()?.block_on(operator(a.run)),
        },
    }
}

/// Local mode with `--config-dir`; otherwise Kubernetes mode: EnvoyConfigs of
/// `WATCH_NAMESPACE` (every namespace when empty or unset) through the in-cluster config
/// or the current kubeconfig context.
async fn discovery_service(a: DiscoveryServiceArgs) -> Result<ExitCode> {
    let config = marin3r_control_plane::Config {
        xdss_addr: SocketAddr::new(a.xdss_bind_address, a.xdss_port),
        server_cert: a
            .server_certificate_path
            .join(marin3r_wire::secret_keys::TLS_CRT),
        server_key: a
            .server_certificate_path
            .join(marin3r_wire::secret_keys::TLS_KEY),
        ca_file: marin3r_certs::ca_file_in_dir(&a.ca_certificate_path),
        metrics_addr: a.metrics_bind_address,
        health_addr: a.health_probe_bind_address,
        ads: marin3r_xds::AdsConfig {
            drain_time: a.drain_time,
            drain_delay: a.drain_delay,
            max_connection_age: a.max_connection_age,
            ..marin3r_xds::AdsConfig::default()
        },
    };
    match a.config_dir {
        Some(_) if a.leader_elect => anyhow::bail!(
            "--leader-elect needs Kubernetes mode: local mode (--config-dir) is a single process"
        ),
        Some(config_dir) => {
            let mut backend = marin3r_control_plane::local::LocalBackend::new(config_dir)
                .with_nack_threshold(a.nack_threshold);
            if let Some(dir) = a.state_dir {
                backend = backend.with_state_dir(dir);
            }
            run_discovery_service(config, backend).await
        }
        None => {
            let watch = std::env::var("WATCH_NAMESPACE").ok();
            let namespace = match marin3r_kube::watch::watch_namespaces(watch.as_deref()).as_slice()
            {
                [] => String::new(),
                [one] => one.clone(),
                many => anyhow::bail!(
                    "WATCH_NAMESPACE={:?}: the discovery service watches one namespace, or every namespace when empty (got {})",
                    watch.unwrap_or_default(),
                    many.join(", ")
                ),
            };
            let client = marin3r_kube::client::try_default().await.context(
                "Kubernetes mode (no --config-dir): cannot configure the Kubernetes client",
            )?;
            let mut backend = marin3r_control_plane::kubernetes::KubernetesBackend::new(
                client.clone(),
                namespace.clone(),
                a.nack_threshold,
            );
            if a.leader_elect {
                backend = backend.with_ha(ha_config(&a, &client, &namespace)?);
            }
            run_discovery_service(config, backend).await
        }
    }
}

/// `--leader-elect`: who this replica is, from the downward API (`POD_NAME`, `POD_UID`,
/// `POD_NAMESPACE`; outside a pod: the host name, no owner, the watched namespace or the
/// kubeconfig's).
fn ha_config(
    a: &DiscoveryServiceArgs,
    client: &kube::Client,
    watched: &str,
) -> Result<marin3r_control_plane::kubernetes::ha::HaConfig> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let replica = env("POD_NAME").or_else(|| env("HOSTNAME")).context(
        "--leader-elect: POD_NAME is not set (give the pod its name with the downward API)",
    )?;
    let namespace = env("POD_NAMESPACE")
        .or_else(|| (!watched.is_empty()).then(|| watched.to_string()))
        .unwrap_or_else(|| client.default_namespace().to_string());
    if env("POD_UID").is_none() {
        tracing::warn!(
            "--leader-elect: POD_UID is not set; this replica's report has no owner and outlives a crash until it is stale"
        );
    }
    Ok(marin3r_control_plane::kubernetes::ha::HaConfig::new(
        &a.discovery_service_name,
        &namespace,
        &replica,
        env("POD_UID"),
        a.lease_duration.as_secs().max(1),
    ))
}

async fn run_discovery_service(
    config: marin3r_control_plane::Config,
    backend: impl marin3r_control_plane::Backend,
) -> Result<ExitCode> {
    marin3r_control_plane::run(config, backend, marin3r_process::shutdown_signal())
        .await
        .context("discovery service failed")?;
    Ok(ExitCode::SUCCESS)
}

/// `marin3r crds`: the CRDs as multi-document YAML (what `manifests/crds/` holds);
/// with `--operator`, the operator's (what `manifests/operator/crds/` holds).
fn crds(a: CrdsArgs) -> Result<ExitCode> {
    let yaml = if a.operator {
        marin3r_manifests::operator_crds_yaml()
    } else {
        marin3r_manifests::crds_yaml()
    };
    print!("{}", yaml.context("cannot generate the CRDs")?);
    Ok(ExitCode::SUCCESS)
}

/// `marin3r status`: the EnvoyConfigs (local mode: `GET /status`; Kubernetes mode: the
/// API server) and the Envoys from CSDS (`crate::status::run`).
fn status(a: StatusArgs) -> Result<ExitCode> {
    use crate::status::csds::CertificateFiles;
    use crate::status::run::{self, Format, Options};
    let options = Options {
        node: a.node,
        revisions: a.revisions,
        format: match a.output {
            StatusOutput::Table => Format::Table,
            StatusOutput::Json => Format::Json,
            StatusOutput::Yaml => Format::Yaml,
        },
        csds_addresses: a.csds_address,
        certificate: CertificateFiles {
            dir: a.csds_certificate_path,
            ca: a.csds_ca,
            cert: a.csds_cert,
            key: a.csds_key,
        },
        server_name: a.csds_server_name,
        discovery_service: a.discovery_service_name,
        timeout: std::time::Duration::from_secs(10),
    };
    let kubernetes = a.kubernetes || a.namespace.is_some() || a.all_namespaces;
    let outcome = small_runtime()?.block_on(async {
        if kubernetes {
            run::kubernetes_default(a.namespace.as_deref(), a.all_namespaces, &options).await
        } else {
            let cwd = std::env::current_dir().unwrap_or_default();
            run::local(&a.url, &options, &cwd).await
        }
    })?;
    print!("{}", outcome.text);
    Ok(ExitCode::from(outcome.code))
}

/// Largest input file (`-f FILE`, or `-f -` for standard input) read.
const MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;

/// Reads `-f FILE` through the one file reader (a regular file, bounded, never blocking),
/// or standard input for `-` (bounded too).
fn read_input(file: &std::path::Path) -> Result<String> {
    let bytes = if file.as_os_str() == "-" {
        marin3r_fsread::read_bounded(
            std::io::stdin(),
            MAX_INPUT_BYTES,
            std::path::Path::new("standard input"),
        )?
    } else {
        marin3r_fsread::read_regular_file(file, MAX_INPUT_BYTES)?
    };
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", file.display()))
}

/// `marin3r operator`: the controllers, over `WATCH_NAMESPACE` (unset or empty: every
/// namespace; `a,b`: those), with leader election on a Lease in `POD_NAMESPACE` held as
/// `POD_NAME` (outside a pod: the kubeconfig's namespace and the host name).
async fn operator(a: OperatorRunArgs) -> Result<ExitCode> {
    use marin3r_operator as operator;
    let client = marin3r_kube::client::try_default()
        .await
        .context("cannot configure the Kubernetes client (in-cluster config or kubeconfig)")?;
    let watch = std::env::var("WATCH_NAMESPACE").ok();
    let namespaces = operator::watch_namespaces(watch.as_deref());
    if watch.is_none() {
        tracing::info!("WATCH_NAMESPACE is not set: watching every namespace");
    }
    let leader = a.leader_elect.then(|| operator::LeaderConfig {
        namespace: std::env::var("POD_NAMESPACE")
            .unwrap_or_else(|_| client.default_namespace().to_string()),
        identity: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "marin3r-operator".to_string()),
    });
    let config = operator::OperatorConfig {
        metrics_addr: a.metrics_bind_address,
        health_addr: a.health_probe_bind_address,
        namespaces,
        images: a.images.into(),
        leader,
    };
    operator::serve(client, config, marin3r_process::shutdown_signal())
        .await
        .context("operator failed")?;
    Ok(ExitCode::SUCCESS)
}

/// `marin3r operator render`: the generated objects as a YAML stream on stdout, what
/// cannot be rendered on stderr (exit 1).
fn operator_render(a: RenderArgs) -> Result<ExitCode> {
    let text = read_input(&a.file)?;
    let docs = marin3r_envoyconfig::manifest::documents(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    let images = a.images.into();
    let rendered = marin3r_operator::render::render(&docs, &images);
    print!("{}", yaml_stream(&rendered.objects)?);
    for problem in &rendered.problems {
        eprintln!(
            "{}",
            terminal::text(&format!("{}: {problem}", a.file.display()))
        );
    }
    Ok(if rendered.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Objects as a YAML stream (`---` between documents).
fn yaml_stream<T: serde::Serialize>(objects: &[T]) -> Result<String> {
    let mut out = String::new();
    for (i, obj) in objects.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_saphyr::to_string(obj).context("cannot render YAML")?);
    }
    Ok(out)
}

fn validate(a: ValidateArgs) -> Result<ExitCode> {
    let text = read_input(&a.file)?;
    match marin3r_envoyconfig::envoyconfig::validate_file(&text) {
        Ok(n) => {
            println!(
                "{}",
                terminal::text(&format!("{}: {n} EnvoyConfig(s) valid", a.file.display()))
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors {
                println!("{}", terminal::text(&format!("{}: {e}", a.file.display())));
            }
            eprintln!("{} error(s)", errors.len());
            Ok(ExitCode::FAILURE)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// A current-thread runtime, for the shutdown manager and one-shot clients.
fn small_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

async fn webhook(a: WebhookArgs) -> Result<ExitCode> {
    let config = marin3r_webhook::Config {
        webhook_addr: SocketAddr::new(a.webhook_bind_address, a.webhook_port),
        tls: a.serving_files(),
        health_addr: a.health_probe_bind_address,
        metrics_addr: a.metrics_bind_address,
        defaults: a.defaults.into(),
    };
    marin3r_webhook::run(config, marin3r_process::shutdown_signal())
        .await
        .context("webhook failed")?;
    Ok(ExitCode::SUCCESS)
}

/// The shutdown-manager-only binary that `marin3r shutdown-manager` execs when it is
/// installed in the same directory as `marin3r`.
pub const SHUTDOWN_MANAGER_BIN: &str = "marin3r-shutdown-manager";

/// Replaces this process by [`SHUTDOWN_MANAGER_BIN`] from the directory of the running
/// binary, with the same arguments and environment (same PID, so Kubernetes sees no
/// difference). The sidecar then maps the pages of a small binary instead of the
/// multi-role one. Returns when that file is missing or cannot be executed; the caller
/// then runs the shutdown manager in this process.
fn exec_shutdown_manager_binary() {
    use std::os::unix::process::CommandExt as _;
    let Some(path) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(SHUTDOWN_MANAGER_BIN)))
        .filter(|p| p.is_file())
    else {
        return;
    };
    let error = std::process::Command::new(&path)
        .args(std::env::args_os().skip(1))
        .exec();
    tracing::warn!(
        path = %path.display(),
        %error,
        "cannot run the shutdown-manager binary; running the shutdown manager in this process"
    );
}

/// Runs the shutdown manager until SIGTERM/SIGINT. A current-thread runtime keeps the
/// sidecar's footprint small.
pub fn run_shutdown_manager(a: ShutdownManagerArgs) -> Result<ExitCode> {
    small_runtime()?.block_on(shutdown_manager(a))
}

async fn shutdown_manager(a: ShutdownManagerArgs) -> Result<ExitCode> {
    let defaults = marin3r_shutdown_manager::Config::default();
    let config = marin3r_shutdown_manager::Config {
        port: a.port,
        bind_address: a.bind_address,
        envoy_admin_address: a.envoy_admin_address,
        ready_file: a.ready_file,
        check_ready_interval: a.check_ready_interval,
        check_drain_interval: a.check_drain_interval,
        start_drain_delay: a.start_drain_delay,
        check_drain_delay: a.check_drain_delay,
        min_open_connections: a.min_open_connections,
        min_drain_duration: a.min_drain_duration.unwrap_or(defaults.min_drain_duration),
        drain_timeout: a.drain_timeout.unwrap_or(defaults.drain_timeout),
        ready_timeout: a.ready_timeout.unwrap_or(defaults.ready_timeout),
        ..defaults
    };
    marin3r_shutdown_manager::run(config, marin3r_process::shutdown_signal())
        .await
        .context("shutdown manager failed")?;
    Ok(ExitCode::SUCCESS)
}

/// The flag (or `MARIN3R_<VAR>`), else the downward-API variable `var` that the injected
/// init container sets (design.md §1.3), else empty.
fn downward(flag: Option<String>, var: &str) -> String {
    flag.or_else(|| std::env::var(var).ok()).unwrap_or_default()
}

fn init_manager(a: InitManagerArgs) -> Result<ExitCode> {
    let cluster_id = a.cluster_id.unwrap_or_else(|| a.node_id.clone());
    let opts = marin3r_sidecar::bootstrap::BootstrapOptions {
        xdss_host: a.xdss_host,
        xdss_port: a.xdss_port,
        node_id: a.node_id,
        cluster_id,
        admin_bind_address: a.admin_bind_address,
        admin_access_log_path: a.admin_access_log_path,
        client_certificate_path: a.client_certificate_path,
        config_file: a
            .config_file
            .unwrap_or_else(|| a.resources_path.join("config.json")),
        resources_path: a.resources_path,
        rtds_resource_name: a.rtds_resource_name,
        envoy_image: a.envoy_image,
        api_type: a.api_type,
        pod_name: downward(a.pod_name, "POD_NAME"),
        pod_namespace: downward(a.pod_namespace, "POD_NAMESPACE"),
        host_name: downward(a.host_name, "HOST_NAME"),
    };
    let written = marin3r_sidecar::bootstrap::write_files(&opts)
        .context("cannot write the Envoy bootstrap")?;
    for path in written {
        tracing::info!(path = %path.display(), "wrote file");
    }
    Ok(ExitCode::SUCCESS)
}

fn certs(a: CertsArgs) -> Result<ExitCode> {
    let opts = marin3r_certs::IssueOptions {
        hosts: a.hosts,
        client_cn: a.client_cn,
        validity: a.validity,
        key_type: a.key_type,
    };
    let bundle = marin3r_certs::issue(&opts).context("cannot issue certificates")?;
    bundle
        .write_to(&a.out)
        .with_context(|| format!("cannot write certificates to {}", a.out.display()))?;
    tracing::info!(out = %a.out.display(), "wrote ca/, server/ and client/ (tls.crt, tls.key, ca.crt)");
    Ok(ExitCode::SUCCESS)
}

fn inject(a: InjectArgs) -> Result<ExitCode> {
    let text = read_input(&a.file)?;
    let docs = marin3r_envoyconfig::manifest::documents(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    let defaults: marin3r_sidecar::Defaults = a.defaults.into();
    let out = marin3r_sidecar::workload::inject_documents(docs, &defaults)
        .map_err(|errors| anyhow::anyhow!("{}", errors.join("\n")))?;
    print!("{}", yaml_stream(&out)?);
    Ok(ExitCode::SUCCESS)
}
