//! The kube-runtime shell of the DiscoveryServiceCertificate controller: reads a DSC's
//! Secret and its CA Secret, calls [`plan`], applies what it says; the watches and the
//! CA → signed certificates mapper.

use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource as _, ResourceExt as _};
use marin3r_operator_api::discoveryservicecertificate::DiscoveryServiceCertificate;

use super::plan::{needs_recovery, plan_recovering, signer_secret_name, trusted_cas};
use crate::apply::{apply, write_status};
use marin3r_kube::watch::Inputs as _;
use marin3r_kube::{Error, Lenient};
use marin3r_process::IssuedCertificates;

/// The DSCs in `all` that the CA DSC `ca` signs: CA-signed by its Secret, in its
/// namespace (namespace AND name, operator-design.md §8 Q9). Nothing for a DSC that is
/// not a CA.
pub fn signed_by(
    ca: &DiscoveryServiceCertificate,
    all: &[Arc<Lenient<DiscoveryServiceCertificate>>],
) -> Vec<ObjectRef<Lenient<DiscoveryServiceCertificate>>> {
    let Some(namespace) = ca.namespace() else {
        return Vec::new();
    };
    if !ca.spec.is_ca() || ca.spec.secret_name().is_empty() {
        return Vec::new();
    }
    all.iter()
        .filter_map(|d| d.valid().ok())
        .filter(|d| d.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|d| {
            signer_secret_name(d, &namespace) == Some(ca.spec.secret_name())
                && d.name_any() != ca.name_any()
        })
        .map(|d| ObjectRef::new(&d.name_any()).within(&namespace))
        .collect()
}

/// The DSCs in `all` signed by the CA DSC `ca` of `namespace`, sorted by name.
fn signed<'a>(
    ca: &DiscoveryServiceCertificate,
    namespace: &str,
    all: &'a [Arc<Lenient<DiscoveryServiceCertificate>>],
) -> Vec<&'a DiscoveryServiceCertificate> {
    if !ca.spec.is_ca() {
        return Vec::new();
    }
    let mut signed: Vec<&DiscoveryServiceCertificate> = all
        .iter()
        .filter_map(|d| d.valid().ok())
        .filter(|d| d.namespace().as_deref() == Some(namespace))
        .filter(|d| signer_secret_name(d, namespace) == Some(ca.spec.secret_name()))
        .filter(|d| d.name_any() != ca.name_any())
        .collect();
    signed.sort_by_key(|d| d.name_any());
    signed
}

/// `validFor` of every DSC in `all` signed by the CA DSC `ca` of `namespace`.
fn signed_valid_for(
    ca: &DiscoveryServiceCertificate,
    namespace: &str,
    all: &[Arc<Lenient<DiscoveryServiceCertificate>>],
) -> Vec<i64> {
    signed(ca, namespace, all)
        .iter()
        .map(|d| d.spec.valid_for)
        .collect()
}

const KIND: &str = "DiscoveryServiceCertificate";

/// Updates `issued` ([`Context::issued`]) for `namespace/name`, whose status is now
/// `status`, and drops the series of the objects of `namespace` no longer in `live`.
fn observe_expiry(
    issued: &IssuedCertificates,
    namespace: &str,
    name: &str,
    status: &marin3r_operator_api::discoveryservicecertificate::DiscoveryServiceCertificateStatus,
    live: &[Arc<Lenient<DiscoveryServiceCertificate>>],
) {
    match &status.not_after {
        Some(t) => issued.set(KIND, namespace, name, t.0.as_second()),
        None => issued.remove(KIND, namespace, name),
    }
    // Only this namespace: with one controller per watched namespace, `live` holds the
    // objects of this one.
    issued.retain(KIND, |ns, n| {
        ns != namespace
            || live.iter().any(|d| {
                d.meta().namespace.as_deref() == Some(ns)
                    && d.meta().name.as_deref() == Some(n)
                    && d.meta().deletion_timestamp.is_none()
            })
    });
}

/// What the reconciler reads and writes.
pub struct Context {
    pub client: Client,
    /// Every watched DSC (the controller's own store).
    pub certificates: Store<Lenient<DiscoveryServiceCertificate>>,
    /// `marin3r_certificate_expiration_timestamp_seconds` of every
    /// DiscoveryServiceCertificate (`certificate="discoveryservicecertificate/<ns>/<name>"`),
    /// from the `notAfter` its status is written with; the series goes with the object.
    /// One set per operator process, shared by every namespace's controller (clones share
    /// the series); `crate::serve` makes and registers it.
    pub issued: IssuedCertificates,
}

/// Reconciles one DSC: reads its Secret and its CA Secret, [`plan`](super::plan())s, applies the
/// Secret and the status.
pub async fn reconcile(
    obj: Arc<Lenient<DiscoveryServiceCertificate>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    reconcile_at(obj, ctx, SystemTime::now()).await
}

/// [`reconcile`] with the clock as an argument.
pub async fn reconcile_at(
    obj: Arc<Lenient<DiscoveryServiceCertificate>>,
    ctx: Arc<Context>,
    now: SystemTime,
) -> Result<Action, Error> {
    let meta = obj.meta();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let dsc = match obj.valid() {
        Ok(dsc) => dsc,
        Err(error) => {
            tracing::error!(
                namespace,
                name,
                error,
                "malformed DiscoveryServiceCertificate; skipped"
            );
            return Ok(Action::await_change());
        }
    };
    if dsc.metadata.deletion_timestamp.is_some() {
        ctx.issued.remove(KIND, &namespace, &name);
        // Its Secret is garbage collected through its owner reference.
        return Ok(Action::await_change());
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let secret_name = dsc.spec.secret_name();
    let current = if secret_name.is_empty() {
        None
    } else {
        secrets.get_opt(secret_name).await?
    };
    let signer = match signer_secret_name(dsc, &namespace) {
        Some(signer) => secrets.get_opt(signer).await?,
        None => None,
    };
    let all = ctx.certificates.state();
    let signed_valid_for = signed_valid_for(dsc, &namespace, &all);
    // A CA whose Secret is gone or damaged: what it was is still in its leaves' ca.crt.
    let mut recovered = Vec::new();
    if dsc.spec.is_ca() && needs_recovery(current.as_ref()) {
        let mut leaves = Vec::new();
        for leaf in signed(dsc, &namespace, &all) {
            let name = leaf.spec.secret_name();
            if !name.is_empty()
                && let Some(secret) = secrets.get_opt(name).await?
            {
                leaves.push(secret);
            }
        }
        recovered = trusted_cas(&leaves);
    }
    let plan = plan_recovering(
        dsc,
        &namespace,
        current.as_ref(),
        signer.as_ref(),
        &signed_valid_for,
        &recovered,
        now,
    );
    if let Some(secret) = &plan.secret {
        apply(&ctx.client, &namespace, secret).await?;
        match &plan.reissued {
            Some(reason) => tracing::info!(
                namespace,
                name,
                secret = secret_name,
                reason,
                "issued certificate"
            ),
            None => tracing::info!(
                namespace,
                name,
                secret = secret_name,
                "updated certificate Secret (trust bundle or metadata)"
            ),
        }
    }
    if dsc.status.as_ref() != Some(&plan.status)
        && let Some(c) = plan.status.conditions.iter().find(|c| c.status == "False")
    {
        tracing::warn!(
            namespace,
            name,
            reason = c.reason,
            message = c.message,
            "certificate not ready"
        );
    }
    write_status::<DiscoveryServiceCertificate, _>(
        &ctx.client,
        &namespace,
        &name,
        dsc.status.as_ref(),
        &plan.status,
    )
    .await?;
    observe_expiry(&ctx.issued, &namespace, &name, &plan.status, &all);
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Runs the DiscoveryServiceCertificate controller until `shutdown` completes, over
/// `namespaces` (`WATCH_NAMESPACE` split on commas): none means every namespace, one or
/// more mean one controller per namespace (a CA only ever signs certificates of its own
/// namespace, so they share nothing but the process's `metrics`, [`Context::issued`]).
pub async fn run(
    client: Client,
    namespaces: &[String],
    metrics: crate::Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use futures::FutureExt as _;
    let shutdown = shutdown.shared();
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    futures::future::join_all(scopes.into_iter().map(|ns| {
        controller(
            client.clone(),
            ns.as_deref(),
            metrics.clone(),
            shutdown.clone(),
        )
    }))
    .await;
}

/// The controller over one namespace (`None`: all), as a future that ends after
/// `shutdown` (at once if its first list is not in yet:
/// [`marin3r_kube::watch::run_until_shutdown`]).
pub fn controller<F>(
    client: Client,
    namespace: Option<&str>,
    metrics: crate::Metrics,
    shutdown: F,
) -> impl std::future::Future<Output = ()> + Send + use<F>
where
    F: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let certificates: Api<Lenient<DiscoveryServiceCertificate>> =
        crate::apply::scoped(&client, namespace);
    let secrets: Api<PartialObjectMeta<Secret>> = crate::apply::scoped(&client, namespace);
    let wc = watcher::Config::default();
    let controller = marin3r_kube::watch::controller(certificates.clone(), wc.clone());
    let store = controller.store();
    let own = controller.store();
    let ctx = Arc::new(Context {
        client,
        certificates: store.clone(),
        issued: metrics.issued,
    });
    let reconciles = metrics.reconciles;
    let shutdown = futures::FutureExt::shared(shutdown);
    let reconciling = controller
        .owns_objects(
            secrets,
            wc.clone()
                .labels(marin3r_wire::app_labels::MANAGED_BY_OPERATOR),
        )
        .watches_objects(
            certificates,
            wc,
            move |ca: Lenient<DiscoveryServiceCertificate>| match ca.valid() {
                Ok(ca) => signed_by(ca, &store.state()),
                Err(_) => Vec::new(),
            },
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, marin3r_kube::watch::error_policy, ctx)
        .for_each(move |result| {
            marin3r_kube::watch::log_result(&reconciles, "DiscoveryServiceCertificate", result)
        });
    async move { marin3r_kube::watch::run_until_shutdown(reconciling, &own, shutdown).await }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::certificate::fixtures::{NS, ca, dsc};
    use serde_json::json;

    fn leaf(name: &str, namespace: &str, valid_for: i64) -> DiscoveryServiceCertificate {
        dsc(
            name,
            namespace,
            json!({"commonName": name, "validFor": valid_for,
                   "signer": {"caSigned": {"caSecretRef": {"name": "marin3r-ca-cert-instance"}}},
                   "secretRef": {"name": name}}),
        )
    }

    fn server() -> DiscoveryServiceCertificate {
        leaf("marin3r-server-cert-instance", NS, 10 * 3600)
    }

    #[test]
    fn an_issued_certificate_expiry_is_shown_until_its_object_goes() {
        use marin3r_operator_api::discoveryservicecertificate::DiscoveryServiceCertificateStatus;
        let mut registry = prometheus_client::registry::Registry::default();
        let issued = IssuedCertificates::default();
        issued.register(&mut registry);
        let text = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        let ns = "observe-expiry-test";
        let lenient = |d: DiscoveryServiceCertificate| Arc::new(Lenient::Valid(d));
        let (a, b) = (leaf("a", ns, 3600), leaf("b", ns, 3600));
        let elsewhere = leaf("c", "observe-expiry-other", 3600);
        let status = |secs: u64| DiscoveryServiceCertificateStatus {
            not_after: Some(marin3r_kube::time::time(
                SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs),
            )),
            ..DiscoveryServiceCertificateStatus::default()
        };
        let all = vec![lenient(a), lenient(b), lenient(elsewhere)];
        observe_expiry(&issued, ns, "a", &status(1_000), &all);
        observe_expiry(&issued, ns, "b", &status(2_000), &all);
        observe_expiry(&issued, "observe-expiry-other", "c", &status(3_000), &all);
        let series = |name: &str, value: u64| {
            format!(
                "marin3r_certificate_expiration_timestamp_seconds{{certificate=\"discoveryservicecertificate/{name}\"}} {value}"
            )
        };
        let out = text();
        for line in [
            series("observe-expiry-test/a", 1_000),
            series("observe-expiry-test/b", 2_000),
            series("observe-expiry-other/c", 3_000),
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
        // `b` deleted (no reconcile sees it go): gone at the next reconcile of its
        // namespace; the other namespace's series stays.
        let left = vec![all[0].clone()];
        observe_expiry(&issued, ns, "a", &status(1_500), &left);
        let out = text();
        assert!(
            out.lines()
                .any(|l| l == series("observe-expiry-test/a", 1_500)),
            "{out}"
        );
        assert!(!out.contains("observe-expiry-test/b"), "{out}");
        assert!(out.contains("observe-expiry-other/c"), "{out}");
        // No certificate (any more): no series.
        observe_expiry(
            &issued,
            ns,
            "a",
            &DiscoveryServiceCertificateStatus::default(),
            &left,
        );
        assert!(!text().contains("observe-expiry-test/a"));
    }

    #[test]
    fn a_ca_event_reconciles_the_certificates_it_signs_in_its_namespace_only() {
        let lenient = |d: DiscoveryServiceCertificate| Arc::new(Lenient::Valid(d));
        let elsewhere = leaf("marin3r-server-cert-instance", "other", 3600);
        let all = vec![
            lenient(ca()),
            lenient(server()),
            lenient(leaf("envoy-sidecar-client-cert", NS, 3600)),
            lenient(elsewhere),
            lenient(dsc(
                "self",
                NS,
                json!({"commonName": "x", "validFor": 1, "signer": {"selfSigned": {}}, "secretRef": {"name": "x"}}),
            )),
        ];
        let got: Vec<String> = signed_by(&ca(), &all)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "DiscoveryServiceCertificate.v1alpha1.operator.marin3r.3scale.net/marin3r-server-cert-instance.ns",
                "DiscoveryServiceCertificate.v1alpha1.operator.marin3r.3scale.net/envoy-sidecar-client-cert.ns"
            ]
        );
        assert!(signed_by(&server(), &all).is_empty(), "not a CA");
        assert_eq!(
            signed_valid_for(&ca(), NS, &all),
            [3600, 10 * 3600],
            "by name"
        );
    }
}
