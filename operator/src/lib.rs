//! The MARIN3R operator (`marin3r operator`, `docs/operator.md`): the DiscoveryService,
//! DiscoveryServiceCertificate and EnvoyDeployment controllers of
//! `operator.marin3r.3scale.net/v1alpha1` ([`marin3r_operator_api`]).
//!
//! Every object a controller writes is built by a pure generator (no I/O, unit-tested
//! and shown by `marin3r operator render`) and written with server-side apply under the
//! field manager [`FIELD_MANAGER`], with a controller owner reference to the object it
//! belongs to. Only the fields the operator owns are applied, so fields other managers
//! set (a `kubectl rollout restart` annotation, an HPA's replica count) are kept
//! (operator-design.md §1 \[R\], Q10).
//!
//! Layout: [`objects`] holds what every generated object shares (labels, owner
//! references); the generators and controllers are one module per kind.

#![forbid(unsafe_code)]

pub mod apply;
pub mod certificate;
pub mod discovery_service;
pub mod discovery_service_controller;
pub mod envoy_deployment;
pub mod envoy_deployment_controller;
pub mod leader;
pub mod objects;
pub mod rbac;
pub mod render;
pub mod security;

/// Failures of the operator process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A listener could not bind or failed.
    #[error(transparent)]
    Process(#[from] marin3r_process::Error),
    /// Leader election failed.
    #[error(transparent)]
    Leader(leader::LeaseError),
    /// An operator resource whose spec cannot be turned into objects (a duration or a
    /// port out of range); the source names the field.
    #[error("invalid {kind} {name:?}: {source}")]
    InvalidSpec {
        kind: &'static str,
        name: String,
        source: marin3r_operator_api::Error,
    },
}

/// Field manager of every server-side apply of the operator.
pub const FIELD_MANAGER: &str = "marin3r-operator";

/// The images the operator puts in what it generates when a resource does not name one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// The marin3r image: the discovery service, the init manager and the shutdown
    /// manager (`MARIN3R_IMAGE`, default this build's image).
    pub marin3r: String,
    /// Envoy of EnvoyDeployments without `spec.image`.
    pub envoy: String,
}

impl Default for Images {
    fn default() -> Self {
        Self {
            marin3r: marin3r_wire::images::MARIN3R.to_string(),
            envoy: marin3r_wire::images::ENVOY.to_string(),
        }
    }
}

/// Runs the three controllers (certificates, DiscoveryServices, EnvoyDeployments) over
/// `namespaces` (empty: every namespace; else one set of controllers per namespace)
/// until `shutdown` completes, counting into `metrics`.
pub async fn run(
    client: kube::Client,
    namespaces: &[String],
    images: Images,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use futures::FutureExt as _;
    let shutdown = shutdown.boxed().shared();
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    let mut tasks: Vec<futures::future::BoxFuture<'static, ()>> = Vec::new();
    for namespace in scopes {
        tasks.push(
            certificate::controller(
                client.clone(),
                namespace.as_deref(),
                metrics.clone(),
                shutdown.clone(),
            )
            .boxed(),
        );
        tasks.push(
            discovery_service_controller::run(
                client.clone(),
                namespace.clone(),
                images.clone(),
                metrics.reconciles.clone(),
                shutdown.clone(),
            )
            .boxed(),
        );
        tasks.push(
            envoy_deployment_controller::run(
                client.clone(),
                namespace,
                images.clone(),
                metrics.reconciles.clone(),
                shutdown.clone(),
            )
            .boxed(),
        );
    }
    futures::future::join_all(tasks).await;
}

/// The operator process's metrics its controllers feed: made and registered once by
/// [`serve`] and handed to every controller, also across leader terms (clones share the
/// series).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// The certificates' expiry series ([`certificate::Context::issued`]).
    pub issued: marin3r_process::IssuedCertificates,
    /// `controller_runtime_reconcile*` of every controller.
    pub reconciles: marin3r_kube::watch::ReconcileMetrics,
}

impl Metrics {
    /// Registers every series with `registry`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        self.issued.register(registry);
        self.reconciles.register(registry);
    }
}

/// Who holds the leader Lease: the pod's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    pub namespace: String,
    pub identity: String,
}

/// `marin3r operator` settings.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// `/metrics` (`--metrics-bind-address`).
    pub metrics_addr: std::net::SocketAddr,
    /// `/healthz`, `/readyz` (`--health-probe-bind-address`).
    pub health_addr: std::net::SocketAddr,
    /// Watched namespaces (`WATCH_NAMESPACE`); empty: every namespace.
    pub namespaces: Vec<String>,
    pub images: Images,
    /// Leader election (`None`: `--leader-elect=false`, the controllers run at once).
    pub leader: Option<LeaderConfig>,
}

pub use marin3r_kube::watch::watch_namespaces;

/// How long the operator may take to stop after its shutdown signal: the controllers'
/// reconciles in flight ([`leader::STOP_TIMEOUT`]), the Lease release
/// ([`leader::RELEASE_TIMEOUT`]) and a margin; 8 s.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(
    leader::STOP_TIMEOUT.as_secs() + leader::RELEASE_TIMEOUT.as_secs() + 2,
);

/// Runs the operator: the probe and metrics listeners at once (ready as soon as they
/// listen: a standby replica is ready too), and the controllers while this replica leads
/// (or at once without leader election), until `shutdown`.
///
/// Run by [`marin3r_process::Process::serve`]: on `shutdown` the operator is not ready at
/// once, the controllers stop, the Lease is released, all within [`SHUTDOWN_GRACE`]
/// even when the API server does not answer.
pub async fn serve(
    client: kube::Client,
    config: OperatorConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    use prometheus_client::metrics::gauge::Gauge;

    let metrics = marin3r_process::bind(config.metrics_addr).await?;
    let health = marin3r_process::bind(config.health_addr).await?;
    let mut registry = prometheus_client::registry::Registry::default();
    let leader_gauge: Gauge = Gauge::default();
    registry.register(
        "marin3r_operator_leader",
        "1 while this replica holds the leader Lease and runs the controllers",
        leader_gauge.clone(),
    );
    marin3r_kube::client::register_metrics(&mut registry);
    let controller_metrics = Metrics::default();
    controller_metrics.register(&mut registry);
    let readiness = marin3r_process::Readiness::new();
    readiness.set_synced();
    marin3r_process::register_ready_metric(&mut registry, readiness.clone());
    let process = marin3r_process::Process {
        name: "operator",
        health,
        metrics,
        metrics_routes: marin3r_process::metrics_router(std::sync::Arc::new(registry)),
        readiness,
        grace: SHUTDOWN_GRACE,
    };
    tracing::info!(
        namespaces = ?config.namespaces,
        leader_election = config.leader.is_some(),
        "operator started"
    );
    process
        .serve(shutdown, move |stopping| async move {
            let OperatorConfig {
                namespaces,
                images,
                leader,
                ..
            } = config;
            match leader {
                None => {
                    leader_gauge.set(1);
                    run(
                        client,
                        &namespaces,
                        images,
                        controller_metrics,
                        stopping.wait(),
                    )
                    .await;
                    Ok(())
                }
                Some(leader) => leader::run_while_leader(
                    client.clone(),
                    &leader.namespace,
                    &leader.identity,
                    |stop| {
                        let (client, namespaces, images, metrics) = (
                            client.clone(),
                            namespaces.clone(),
                            images.clone(),
                            controller_metrics.clone(),
                        );
                        async move {
                            run(client, &namespaces, images, metrics, async {
                                let _ = stop.await;
                            })
                            .await;
                        }
                    },
                    |leading| {
                        leader_gauge.set(i64::from(leading));
                    },
                    stopping.wait(),
                )
                .await
                .map_err(Error::Leader),
            }
        })
        .await
}
