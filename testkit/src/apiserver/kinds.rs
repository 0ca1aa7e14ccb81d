//! The kinds a [`FakeApiServer`](super::FakeApiServer) serves: group, version, plural,
//! kind, scope and whether writes to `.status` go through a `/status` subresource.

/// One served resource, as a CRD (or the built-in registry) declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceKind {
    /// API group, `""` for the core group (`/api/v1`).
    pub group: String,
    pub version: String,
    /// The URL segment, e.g. `envoyconfigs`.
    pub plural: String,
    /// The `kind` of objects, e.g. `EnvoyConfig` (lists are `EnvoyConfigList`).
    pub kind: String,
    pub namespaced: bool,
    /// Writes to the main resource ignore `.status`; writes to `/status` change only it.
    pub status_subresource: bool,
    /// Field selector labels served besides `metadata.name` and `metadata.namespace`
    /// (dotted paths into the object, compared as strings).
    pub field_labels: Vec<String>,
    /// A custom resource: strategic merge patches are refused (`415`), as for CRDs.
    pub custom: bool,
}

impl ResourceKind {
    /// A namespaced custom resource without status subresource.
    pub fn new(group: &str, version: &str, plural: &str, kind: &str) -> Self {
        ResourceKind {
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            kind: kind.to_string(),
            namespaced: true,
            status_subresource: false,
            field_labels: Vec::new(),
            custom: true,
        }
    }

    /// A namespaced built-in kind.
    fn builtin(group: &str, version: &str, plural: &str, kind: &str) -> Self {
        ResourceKind {
            custom: false,
            ..ResourceKind::new(group, version, plural, kind)
        }
    }

    /// The same kind, cluster-scoped.
    pub fn cluster_scoped(mut self) -> Self {
        self.namespaced = false;
        self
    }

    /// The same kind, with a `/status` subresource.
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    /// The same kind, also selectable by the field `label` (e.g. `type` of Secrets).
    pub fn with_field_label(mut self, label: &str) -> Self {
        self.field_labels.push(label.to_string());
        self
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (`plural` for the core group): the name of the resource in
    /// messages and in [`FakeApiServer::get`](super::FakeApiServer::get).
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The kinds every [`FakeApiServer`](super::FakeApiServer) serves from the start:
    /// the ones marin3r reads or writes.
    pub fn builtins() -> Vec<ResourceKind> {
        let core = |plural: &str, kind: &str| ResourceKind::builtin("", "v1", plural, kind);
        vec![
            core("namespaces", "Namespace")
                .cluster_scoped()
                .with_status(),
            core("secrets", "Secret").with_field_label("type"),
            core("configmaps", "ConfigMap"),
            core("pods", "Pod")
                .with_status()
                .with_field_label("spec.nodeName")
                .with_field_label("status.phase"),
            core("services", "Service").with_status(),
            core("serviceaccounts", "ServiceAccount"),
            core("endpoints", "Endpoints"),
            core("events", "Event"),
            ResourceKind::builtin("apps", "v1", "deployments", "Deployment").with_status(),
            ResourceKind::builtin("coordination.k8s.io", "v1", "leases", "Lease"),
            ResourceKind::builtin("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
            ResourceKind::builtin(
                "policy",
                "v1",
                "poddisruptionbudgets",
                "PodDisruptionBudget",
            )
            .with_status(),
            ResourceKind::builtin(
                "autoscaling",
                "v2",
                "horizontalpodautoscalers",
                "HorizontalPodAutoscaler",
            )
            .with_status(),
            ResourceKind::builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
            ResourceKind::builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "rolebindings",
                "RoleBinding",
            ),
            ResourceKind::builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterroles",
                "ClusterRole",
            )
            .cluster_scoped(),
            ResourceKind::builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterrolebindings",
                "ClusterRoleBinding",
            )
            .cluster_scoped(),
            ResourceKind::builtin(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
            )
            .cluster_scoped()
            .with_status(),
            ResourceKind::builtin(
                "admissionregistration.k8s.io",
                "v1",
                "mutatingwebhookconfigurations",
                "MutatingWebhookConfiguration",
            )
            .cluster_scoped(),
            ResourceKind::builtin(
                "admissionregistration.k8s.io",
                "v1",
                "validatingwebhookconfigurations",
                "ValidatingWebhookConfiguration",
            )
            .cluster_scoped(),
        ]
    }
}

/// The registry: registered kinds, found by URL parts, by `apiVersion` + `kind`, or by
/// (qualified) plural.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kinds(Vec<ResourceKind>);

impl Kinds {
    pub(crate) fn with_builtins() -> Self {
        Kinds(ResourceKind::builtins())
    }

    /// Adds `kind`, replacing a registration of the same group, version and plural.
    pub(crate) fn register(&mut self, kind: ResourceKind) {
        self.0.retain(|k| {
            (&k.group, &k.version, &k.plural) != (&kind.group, &kind.version, &kind.plural)
        });
        self.0.push(kind);
    }

    pub(crate) fn by_url(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceKind> {
        self.0
            .iter()
            .find(|k| k.group == group && k.version == version && k.plural == plural)
    }

    pub(crate) fn by_type(&self, api_version: &str, kind: &str) -> Option<&ResourceKind> {
        self.0
            .iter()
            .find(|k| k.api_version() == api_version && k.kind == kind)
    }

    /// `plural` or `plural.group`; a bare plural served by several groups is ambiguous
    /// and found in none.
    pub(crate) fn by_name(&self, name: &str) -> Option<&ResourceKind> {
        if let Some(k) = self.0.iter().find(|k| k.qualified_plural() == name) {
            return Some(k);
        }
        let mut found = self.0.iter().filter(|k| k.plural == name);
        match (found.next(), found.next()) {
            (Some(k), None) => Some(k),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_found_by_url_type_and_name() {
        let mut kinds = Kinds::with_builtins();
        kinds.register(ResourceKind::new("example.com", "v1", "leases", "Lease"));
        let lease = kinds.by_url("coordination.k8s.io", "v1", "leases");
        assert_eq!(lease.map(|k| k.kind.as_str()), Some("Lease"));
        assert!(kinds.by_type("coordination.k8s.io/v1", "Lease").is_some());
        assert!(kinds.by_type("v1", "Secret").is_some());
        // Two groups serve `leases`: the bare plural is ambiguous.
        assert!(kinds.by_name("leases").is_none());
        assert_eq!(
            kinds
                .by_name("leases.example.com")
                .map(|k| k.group.as_str()),
            Some("example.com")
        );
        assert_eq!(
            kinds.by_name("secrets").map(|k| k.api_version()),
            Some("v1".into())
        );
    }
}
