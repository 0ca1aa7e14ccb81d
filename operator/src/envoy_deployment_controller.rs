//! The EnvoyDeployment controller (operator-design.md §5 with the [R] decisions of Q4,
//! Q9–Q12): reads the EnvoyDeployment's DiscoveryService and EnvoyConfig (same namespace),
//! applies what [`super::envoy_deployment::generate`] builds — the client certificate, the
//! Deployment, the HPA and the PDB (deleted when the spec no longer asks for them) — and
//! reports conditions.
//!
//! - A missing DiscoveryService or EnvoyConfig is a state, not an error: `Ready=False`
//!   with reason `DiscoveryServiceNotFound` / `EnvoyConfigNotFound`, looked at again in
//!   10 s, and at once when it appears (both kinds are watched, mapped to the
//!   EnvoyDeployments that name them in **their namespace**, Q9).
//! - The Deployment is created only once its client certificate is ready (no
//!   `FailedMount` churn, Q12); after that it is updated whatever the certificate does.
//! - Server-side apply: fields the operator does not set (a `kubectl rollout restart`
//!   annotation, user annotations, the replica count under an HPA) are left alone.
//! - Status: `deploymentName`, `deploymentStatus`, `observedGeneration`, `Ready`
//!   (`DeploymentAvailable`, `DeploymentUnavailable`, `CertificateNotReady`,
//!   `DiscoveryServiceNotFound`, `EnvoyConfigNotFound`, `InvalidSpec`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_operator_api::conditions::{
    READY, REASON_DISCOVERY_SERVICE_NOT_FOUND, REASON_ENVOY_CONFIG_NOT_FOUND,
};
use marin3r_operator_api::{
    DiscoveryService, DiscoveryServiceCertificate, EnvoyDeployment, EnvoyDeploymentStatus,
};

use super::Images;
use super::apply::{apply, delete_if_exists, get, scoped, write_status};
use super::discovery_service_controller::{
    REASON_CERTIFICATE_NOT_READY, REASON_DEPLOYMENT_AVAILABLE, REASON_DEPLOYMENT_UNAVAILABLE,
    REASON_INVALID_SPEC, RECHECK,
};
use super::envoy_deployment::generate;
use marin3r_kube::conditions::set_condition;
use marin3r_kube::watch::Inputs as _;
use marin3r_kube::{Error, Lenient};
use marin3r_wire::openshift::UID_RANGE_ANNOTATION;

/// How soon a Deployment waiting for its client certificate is looked at again (the
/// certificate's status change also wakes it: it is owned).
pub const CERTIFICATE_RECHECK: Duration = Duration::from_secs(5);

/// What the reconciler reads and writes.
pub struct Context {
    pub client: Client,
    pub images: Images,
}

/// The namespace's `openshift.io/sa.scc.uid-range` annotation (OpenShift's UIDs of the
/// namespace; `None` elsewhere): the Envoy pods run as its first UID. Without the right
/// to read the Namespace (a narrower Role than `manifests/operator`'s), the pods keep
/// the images' users, with a warning: on OpenShift they will then be refused.
async fn namespace_uid_range(client: &Client, namespace: &str) -> Result<Option<String>, Error> {
    match kube::Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
    {
        Ok(ns) => Ok(ns
            .and_then(|ns| ns.metadata.annotations)
            .and_then(|mut a| a.remove(UID_RANGE_ANNOTATION))),
        Err(e) if marin3r_kube::is_status(&e, 403) => {
            tracing::warn!(
                namespace,
                "cannot read the Namespace (RBAC: get namespaces); the Envoy pods keep the images' users and ignore any OpenShift uid-range"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Reconciles one EnvoyDeployment.
pub async fn reconcile(
    obj: Arc<Lenient<EnvoyDeployment>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let ed = match obj.valid() {
        Ok(ed) => ed,
        Err(error) => {
            tracing::error!(namespace, name, error, "malformed EnvoyDeployment; skipped");
            return Ok(Action::await_change());
        }
    };
    if ed.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let generation = ed.metadata.generation;
    let mut status = ed.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    status.deployment_name = Some(ed.deployment_name());
    let ready = |status: &mut EnvoyDeploymentStatus, ok: bool, reason: &str, message: String| {
        set_condition(
            &mut status.conditions,
            READY,
            ok,
            reason,
            message,
            generation,
            now,
        );
    };
    let client = &ctx.client;
    let write = async |status: &EnvoyDeploymentStatus| {
        write_status::<EnvoyDeployment, _>(client, &namespace, &name, ed.status.as_ref(), status)
            .await
    };

    if let Err(e) = ed.validate() {
        ready(&mut status, false, REASON_INVALID_SPEC, e.to_string());
        write(&status).await?;
        return Ok(Action::await_change());
    }
    let ds_name = &ed.spec.discovery_service_ref;
    let Some(ds) = get::<DiscoveryService>(client, &namespace, ds_name).await? else {
        ready(
            &mut status,
            false,
            REASON_DISCOVERY_SERVICE_NOT_FOUND,
            format!("DiscoveryService {namespace}/{ds_name} does not exist"),
        );
        write(&status).await?;
        return Ok(Action::requeue(RECHECK));
    };
    let ec_name = &ed.spec.envoy_config_ref;
    let Some(ec) = get::<EnvoyConfig>(client, &namespace, ec_name).await? else {
        ready(
            &mut status,
            false,
            REASON_ENVOY_CONFIG_NOT_FOUND,
            format!("EnvoyConfig {namespace}/{ec_name} does not exist"),
        );
        write(&status).await?;
        return Ok(Action::requeue(RECHECK));
    };
    let uid_range = namespace_uid_range(client, &namespace).await?;
    let objects = match generate(ed, &ds, &ec, &namespace, uid_range.as_deref(), &ctx.images) {
        Ok(objects) => objects,
        Err(e) => {
            ready(&mut status, false, REASON_INVALID_SPEC, e.to_string());
            write(&status).await?;
            return Ok(Action::await_change());
        }
    };

    let certificate =
        apply::<DiscoveryServiceCertificate>(client, &namespace, &objects.client_certificate)
            .await?;
    let deployment_name = objects.deployment.name_any();
    let existing: Option<Deployment> = get(client, &namespace, &deployment_name).await?;
    let action = if certificate.is_ready() || existing.is_some() {
        let applied = apply(client, &namespace, &objects.deployment).await?;
        status.deployment_status = applied.status.clone();
        let s = applied.status.clone().unwrap_or_default();
        let wanted = applied.spec.replicas.unwrap_or(1);
        let available = s.available_replicas.unwrap_or(0);
        if available >= wanted {
            ready(
                &mut status,
                true,
                REASON_DEPLOYMENT_AVAILABLE,
                format!("Deployment {deployment_name}: {available}/{wanted} replicas available"),
            );
        } else {
            ready(
                &mut status,
                false,
                REASON_DEPLOYMENT_UNAVAILABLE,
                format!("Deployment {deployment_name}: {available}/{wanted} replicas available"),
            );
        }
        Action::await_change()
    } else {
        ready(
            &mut status,
            false,
            REASON_CERTIFICATE_NOT_READY,
            format!(
                "waiting for certificate {} before creating Deployment {deployment_name}",
                certificate.name_any()
            ),
        );
        Action::requeue(CERTIFICATE_RECHECK)
    };
    let hpa_name = ed.deployment_name();
    match &objects.hpa {
        Some(hpa) => {
            apply(client, &namespace, hpa).await?;
        }
        None => {
            delete_if_exists::<HorizontalPodAutoscaler>(client, &namespace, &hpa_name).await?;
        }
    }
    match &objects.pdb {
        Some(pdb) => {
            apply(client, &namespace, pdb).await?;
        }
        None => {
            delete_if_exists::<PodDisruptionBudget>(client, &namespace, &hpa_name).await?;
        }
    }
    write(&status).await?;
    Ok(action)
}

/// The EnvoyDeployments of `namespace` whose reference (`pick`) is `name` (Q9: never
/// across namespaces).
pub fn referencing(
    store: &Store<Lenient<EnvoyDeployment>>,
    namespace: Option<&str>,
    name: &str,
    pick: fn(&EnvoyDeployment) -> &str,
) -> Vec<ObjectRef<Lenient<EnvoyDeployment>>> {
    store
        .state()
        .iter()
        .filter(|ed| ed.namespace().as_deref() == namespace)
        .filter(|ed| ed.valid().is_ok_and(|ed| pick(ed) == name))
        .map(|ed| ObjectRef::from_obj(ed.as_ref()))
        .collect()
}

/// Runs the EnvoyDeployment controller over `namespace` (`None`: every namespace) until
/// `shutdown` completes (at once if its first list is not in yet:
/// [`marin3r_kube::watch::run_until_shutdown`]).
pub async fn run(
    client: Client,
    namespace: Option<String>,
    images: Images,
    reconciles: marin3r_kube::watch::ReconcileMetrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = namespace.as_deref();
    let wc = watcher::Config::default();
    let owned = wc
        .clone()
        .labels(marin3r_wire::app_labels::MANAGED_BY_OPERATOR);
    let controller = marin3r_kube::watch::controller(
        scoped::<Lenient<EnvoyDeployment>>(&client, namespace),
        wc.clone(),
    );
    let by_config = controller.store();
    let by_ds = controller.store();
    let own = controller.store();
    let ctx = Arc::new(Context {
        client: client.clone(),
        images,
    });
    let shutdown = futures::FutureExt::shared(shutdown);
    let reconciling = controller
        .owns_objects(
            scoped::<PartialObjectMeta<Deployment>>(&client, namespace),
            owned.clone(),
        )
        .owns_objects(
            scoped::<PartialObjectMeta<DiscoveryServiceCertificate>>(&client, namespace),
            owned.clone(),
        )
        .owns_objects(
            scoped::<PartialObjectMeta<HorizontalPodAutoscaler>>(&client, namespace),
            owned.clone(),
        )
        .owns_objects(
            scoped::<PartialObjectMeta<PodDisruptionBudget>>(&client, namespace),
            owned,
        )
        .watches_objects(
            scoped::<Lenient<EnvoyConfig>>(&client, namespace),
            wc.clone(),
            move |ec| {
                referencing(
                    &by_config,
                    ec.namespace().as_deref(),
                    &ec.name_any(),
                    |ed| &ed.spec.envoy_config_ref,
                )
            },
        )
        .watches_objects(
            scoped::<Lenient<DiscoveryService>>(&client, namespace),
            wc,
            move |ds| {
                referencing(&by_ds, ds.namespace().as_deref(), &ds.name_any(), |ed| {
                    &ed.spec.discovery_service_ref
                })
            },
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, marin3r_kube::watch::error_policy, ctx)
        .for_each(move |result| {
            marin3r_kube::watch::log_result(&reconciles, "EnvoyDeployment", result)
        });
    marin3r_kube::watch::run_until_shutdown(reconciling, &own, shutdown).await;
}
