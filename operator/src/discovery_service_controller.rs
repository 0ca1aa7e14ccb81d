//! The DiscoveryService controller (operator-design.md §3 with the [R] decisions): applies
//! what [`super::discovery_service::generate`] builds, in order — the CA, server and client
//! certificates, the ServiceAccount, Role, RoleBinding and Service — and the Deployment
//! once the server certificate's Secret holds `tls.crt`, `tls.key` and `ca.crt` (or when it
//! already exists: it is updated whatever the certificates do, and never deleted because an
//! input is missing). A renewal changes only Secrets, which the discovery service re-reads:
//! nothing restarts. With several replicas the PodDisruptionBudget `marin3r-<ds>` is
//! applied too, and deleted when `spec.replicas` drops to 1 (it is owned and watched, so
//! deleting it by hand brings it back).
//!
//! One DiscoveryService per namespace (Q1): the oldest serves it; any other gets
//! `Ready=False`, reason `DuplicateDiscoveryService`, and nothing else, and is looked at
//! again every minute (it takes over when the first is deleted).
//!
//! Status: `deploymentName`, `deploymentStatus` (a copy of the Deployment's),
//! `observedGeneration` and a `Ready` condition (`DeploymentAvailable`,
//! `DeploymentUnavailable`, `CertificateNotReady`, `DuplicateDiscoveryService`,
//! `InvalidSpec`), written only when it changes.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};
use marin3r_operator_api::conditions::{READY, REASON_DUPLICATE_DISCOVERY_SERVICE};
use marin3r_operator_api::{DiscoveryService, DiscoveryServiceCertificate, DiscoveryServiceStatus};

use super::Images;
use super::apply::{apply, delete_if_exists, get, scoped, write_status};
use super::discovery_service::generate;
use super::render::primary_discovery_service;
use marin3r_kube::conditions::set_condition;
use marin3r_kube::watch::Inputs as _;
use marin3r_kube::{Error, Lenient};
use marin3r_wire::secret_keys::{CA_CRT, TLS_CRT, TLS_KEY};

/// Reason: the Deployment has an available replica.
pub const REASON_DEPLOYMENT_AVAILABLE: &str = "DeploymentAvailable";
/// Reason: the Deployment has no available replica.
pub const REASON_DEPLOYMENT_UNAVAILABLE: &str =
    marin3r_operator_api::conditions::REASON_DEPLOYMENT_UNAVAILABLE;
/// Reason: waiting for the server certificate's Secret.
pub const REASON_CERTIFICATE_NOT_READY: &str =
    marin3r_operator_api::conditions::REASON_CERTIFICATE_NOT_READY;
/// Reason: the spec cannot be turned into objects.
pub const REASON_INVALID_SPEC: &str = marin3r_operator_api::conditions::REASON_INVALID_SPEC;
/// How often a DiscoveryService waiting for something is looked at again.
pub const RECHECK: Duration = Duration::from_secs(10);
/// How often a duplicate DiscoveryService is looked at again.
pub const DUPLICATE_RECHECK: Duration = Duration::from_secs(60);

/// What the reconciler reads and writes.
pub struct Context {
    pub client: Client,
    /// Every watched DiscoveryService (the controller's own store), for the
    /// one-per-namespace rule.
    pub discovery_services: Store<Lenient<DiscoveryService>>,
    pub images: Images,
}

/// Whether a certificate Secret holds what a server needs.
pub fn secret_is_ready(secret: Option<&Secret>) -> bool {
    secret.and_then(|s| s.data.as_ref()).is_some_and(|d| {
        [TLS_CRT, TLS_KEY, CA_CRT]
            .iter()
            .all(|k| d.get(*k).is_some_and(|v| !v.0.is_empty()))
    })
}

/// Reconciles one DiscoveryService.
pub async fn reconcile(
    obj: Arc<Lenient<DiscoveryService>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let ds = match obj.valid() {
        Ok(ds) => ds,
        Err(error) => {
            tracing::error!(
                namespace,
                name,
                error,
                "malformed DiscoveryService; skipped"
            );
            return Ok(Action::await_change());
        }
    };
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let generation = ds.metadata.generation;
    let mut status = ds.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let ready = |status: &mut DiscoveryServiceStatus, ok: bool, reason: &str, message: String| {
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
    let write = async |status: &DiscoveryServiceStatus| {
        write_status::<DiscoveryService, _>(
            &ctx.client,
            &namespace,
            &name,
            ds.status.as_ref(),
            status,
        )
        .await
    };

    let same_namespace: Vec<DiscoveryService> = ctx
        .discovery_services
        .state()
        .iter()
        .filter_map(|d| d.valid().ok())
        .filter(|d| d.namespace().as_deref() == Some(namespace.as_str()))
        .cloned()
        .collect();
    if let Some(primary) = primary_discovery_service(&same_namespace)
        && primary.name_any() != name
    {
        ready(
            &mut status,
            false,
            REASON_DUPLICATE_DISCOVERY_SERVICE,
            format!(
                "DiscoveryService {} already serves namespace {namespace}; only one per namespace is supported, nothing is created for this one",
                primary.name_any()
            ),
        );
        write(&status).await?;
        return Ok(Action::requeue(DUPLICATE_RECHECK));
    }

    let objects = match generate(ds, &namespace, &ctx.images) {
        Ok(objects) => objects,
        Err(e) => {
            ready(&mut status, false, REASON_INVALID_SPEC, e.to_string());
            write(&status).await?;
            return Ok(Action::await_change());
        }
    };
    let ignored = ds.ignored_fields();
    if !ignored.is_empty() {
        tracing::warn!(
            namespace,
            name,
            ?ignored,
            "DiscoveryService fields accepted for compatibility and ignored"
        );
    }
    let client = &ctx.client;
    for certificate in [&objects.ca, &objects.server, &objects.client] {
        apply::<DiscoveryServiceCertificate>(client, &namespace, certificate).await?;
    }
    apply(client, &namespace, &objects.service_account).await?;
    apply(client, &namespace, &objects.role).await?;
    apply(client, &namespace, &objects.role_binding).await?;
    apply::<Service>(client, &namespace, &objects.service).await?;

    let deployment_name = objects.deployment.name_any();
    status.deployment_name = Some(deployment_name.clone());
    let server_secret = objects.server.spec.secret_name().to_string();
    let secret: Option<Secret> = get(client, &namespace, &server_secret).await?;
    let existing: Option<Deployment> = get(client, &namespace, &deployment_name).await?;
    let action = if secret_is_ready(secret.as_ref()) || existing.is_some() {
        let applied = apply(client, &namespace, &objects.deployment).await?;
        status.deployment_status = applied.status.clone();
        let available = applied
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        if available > 0 {
            ready(
                &mut status,
                true,
                REASON_DEPLOYMENT_AVAILABLE,
                format!("Deployment {deployment_name} has {available} available replica(s)"),
            );
        } else {
            ready(
                &mut status,
                false,
                REASON_DEPLOYMENT_UNAVAILABLE,
                format!("Deployment {deployment_name} has no available replica yet"),
            );
        }
        // The Deployment's own events wake the controller (it is owned).
        Action::await_change()
    } else {
        ready(
            &mut status,
            false,
            REASON_CERTIFICATE_NOT_READY,
            format!(
                "waiting for Secret {server_secret} (tls.crt, tls.key, ca.crt) before creating Deployment {deployment_name}"
            ),
        );
        Action::requeue(RECHECK)
    };
    match &objects.pdb {
        Some(pdb) => {
            apply(client, &namespace, pdb).await?;
        }
        None => {
            delete_if_exists::<PodDisruptionBudget>(client, &namespace, &deployment_name).await?;
        }
    }
    write(&status).await?;
    Ok(action)
}

/// The DiscoveryServices of the namespace of `changed` (the one-per-namespace rule:
/// a deletion lets the next one take over).
fn same_namespace(
    changed: &Lenient<DiscoveryService>,
    store: &Store<Lenient<DiscoveryService>>,
) -> Vec<ObjectRef<Lenient<DiscoveryService>>> {
    let namespace = changed.namespace();
    store
        .state()
        .iter()
        .filter(|d| d.namespace() == namespace && d.name_any() != changed.name_any())
        .map(|d| ObjectRef::from_obj(d.as_ref()))
        .collect()
}

/// Runs the DiscoveryService controller over `namespace` (`None`: every namespace)
/// until `shutdown` completes (at once if its first list is not in yet:
/// [`marin3r_kube::watch::run_until_shutdown`]).
pub async fn run(
    client: Client,
    namespace: Option<String>,
    images: Images,
    reconciles: marin3r_kube::watch::ReconcileMetrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = namespace.as_deref();
    let discovery_services: Api<Lenient<DiscoveryService>> = scoped(&client, namespace);
    let wc = watcher::Config::default();
    let owned = wc
        .clone()
        .labels(marin3r_wire::app_labels::MANAGED_BY_OPERATOR);
    let controller = marin3r_kube::watch::controller(discovery_services.clone(), wc.clone());
    let store = controller.store();
    let own = controller.store();
    let ctx = Arc::new(Context {
        client: client.clone(),
        discovery_services: store.clone(),
        images,
    });
    let shutdown = futures::FutureExt::shared(shutdown);
    let reconciling = controller
        .owns_objects(
            scoped::<PartialObjectMeta<Deployment>>(&client, namespace),
            owned.clone(),
        )
        .owns_objects(
            scoped::<PartialObjectMeta<Service>>(&client, namespace),
            owned.clone(),
        )
        .owns_objects(
            scoped::<PartialObjectMeta<PodDisruptionBudget>>(&client, namespace),
            owned.clone(),
        )
        .owns_objects(
            scoped::<PartialObjectMeta<DiscoveryServiceCertificate>>(&client, namespace),
            owned,
        )
        .watches_objects(discovery_services, wc, move |ds| {
            same_namespace(&ds, &store)
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, marin3r_kube::watch::error_policy, ctx)
        .for_each(move |result| {
            marin3r_kube::watch::log_result(&reconciles, "DiscoveryService", result)
        });
    marin3r_kube::watch::run_until_shutdown(reconciling, &own, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    #[test]
    fn a_server_secret_is_ready_with_its_three_keys() {
        let secret = |keys: &[&str]| Secret {
            data: Some(
                keys.iter()
                    .map(|k| (k.to_string(), ByteString(b"x".to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        };
        assert!(!secret_is_ready(None));
        assert!(!secret_is_ready(Some(&secret(&["tls.crt", "tls.key"]))));
        assert!(secret_is_ready(Some(&secret(&[
            "tls.crt", "tls.key", "ca.crt"
        ]))));
    }
}
