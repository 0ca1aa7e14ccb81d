//! The one lease-gated writer of Kubernetes mode: every API write of the reconcilers
//! (create, merge patch, delete, server-side apply of a status) goes through
//! [`Writer`], which checks the Lease right before the request and reports
//! [`Written::Skipped`] instead of writing when this replica may not write (one of
//! several replicas that does not hold a current Lease, `docs/ha.md`). A single replica
//! always writes ([`Leadership::always`]).
//!
//! Outside it: each replica's own `DiscoveryServiceReplica` report
//! ([`super::ha::report_loop`], every replica writes its own) and the Lease
//! ([`marin3r_kube::lease::elect`]).

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource};
use marin3r_kube::lease::Leadership;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Field manager of every write (server-side apply of the status subresources).
pub const FIELD_MANAGER: &str = "marin3r";
/// Retry delay of a write skipped while this replica's Lease renewal is late.
const RETRY_RENEWAL: Duration = Duration::from_secs(1);

/// What a write through [`Writer`] did.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The API server answered it (with success).
    Done,
    /// Not sent: this replica may not write now.
    Skipped,
}

/// The lease-gated writer (see the module docs).
#[derive(Clone)]
pub struct Writer {
    client: Client,
    leadership: Leadership,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("leadership", &self.leadership)
            .finish_non_exhaustive()
    }
}

impl Writer {
    pub fn new(client: Client, leadership: Leadership) -> Self {
        Self { client, leadership }
    }

    /// The gate: whether this replica may write now (its Lease is current). The
    /// writes check it themselves; the reconcilers ask it only for what the leader
    /// alone does besides writing (judging NACKs over the fleet, showing its cacheState).
    pub fn leads(&self) -> bool {
        self.leadership.is_current()
    }

    /// What a reconcile does after a skipped write: while this replica still holds the
    /// Lease (a renewal is late, or in flight) it looks again soon; otherwise
    /// `otherwise` — winning the Lease reconciles everything.
    pub fn skipped(&self, otherwise: Action) -> Action {
        if self.leadership.view().holder {
            Action::requeue(RETRY_RENEWAL)
        } else {
            otherwise
        }
    }

    fn api<K: Object>(&self, namespace: &str) -> Api<K> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The gate itself, once for every kind of write: `write` is sent (polled) only
    /// while this replica may write.
    async fn gated<T>(
        &self,
        write: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Written, kube::Error> {
        if !self.leads() {
            return Ok(Written::Skipped);
        }
        write.await?;
        Ok(Written::Done)
    }

    /// Creates `object` in `namespace`.
    pub async fn create<K: Object + Serialize>(
        &self,
        namespace: &str,
        object: &K,
    ) -> Result<Written, kube::Error> {
        let api = self.api::<K>(namespace);
        self.gated(api.create(&PostParams::default(), object)).await
    }

    /// A JSON merge patch of `name` (with `metadata.resourceVersion` in `patch`, a
    /// change made meanwhile makes it fail with 409 Conflict).
    pub async fn merge_patch<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Written, kube::Error> {
        let api = self.api::<K>(namespace);
        let params = PatchParams::default();
        self.gated(api.patch(name, &params, &Patch::Merge(patch)))
            .await
    }

    /// Deletes `name`.
    pub async fn delete<K: Object>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Written, kube::Error> {
        let api = self.api::<K>(namespace);
        self.gated(api.delete(name, &DeleteParams::default())).await
    }

    /// Server-side apply of `status` on the status subresource of `name`, as
    /// [`FIELD_MANAGER`]; fenced by `resource_version` when given
    /// ([`marin3r_kube::apply::apply_status_at`]).
    pub async fn apply_status<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: Option<&str>,
        status: &impl Serialize,
    ) -> Result<Written, kube::Error> {
        let api = self.api::<K>(namespace);
        let write = marin3r_kube::apply::apply_status_at(
            &api,
            name,
            resource_version,
            status,
            FIELD_MANAGER,
        );
        self.gated(write).await
    }
}

/// A namespaced kind the writer writes (the bounds of kube's `Api` calls, once).
pub trait Object:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Object for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
{
}

#[cfg(test)]
mod tests {
    /// No write bypasses the writer: the reconcilers' modules name none of what an API
    /// write needs (kube's write parameters, the apply helpers). `ha.rs` is not among
    /// them: each replica writes its own report, whoever leads.
    #[test]
    fn every_write_of_the_reconcilers_goes_through_the_writer() {
        let modules = [
            ("controller.rs", include_str!("controller.rs")),
            ("mod.rs", include_str!("mod.rs")),
            ("plan.rs", include_str!("plan.rs")),
            ("source.rs", include_str!("source.rs")),
            ("coalesce.rs", include_str!("coalesce.rs")),
        ];
        let writes = [
            "PatchParams",
            "PostParams",
            "DeleteParams",
            "marin3r_kube::apply",
            ".patch_status(",
            ".replace(",
        ];
        for (file, source) in modules {
            for (n, line) in source.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                for w in writes {
                    assert!(
                        !code.contains(w),
                        "{file}:{}: `{w}` outside the writer: {line}",
                        n + 1
                    );
                }
            }
        }
    }
}
