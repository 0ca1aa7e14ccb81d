//! The Kubernetes API permissions of `marin3r operator`, the single source of its
//! ClusterRole and lease Role (`manifests/operator/`, compared with these tables both
//! ways by the `marin3r-manifests` tests).
//!
//! Writes are server-side applies (`patch`; creating through an apply also needs
//! `create`). Objects are created with an owner reference that sets
//! `blockOwnerDeletion`, which needs `update` on the owner's `finalizers` where
//! `OwnerReferencesPermissionEnforcement` is on. The operator also holds everything the
//! discovery-service Role it creates grants ([`marin3r_kube::rbac::DISCOVERY_SERVICE`],
//! and [`marin3r_kube::rbac::DISCOVERY_SERVICE_HA`] for several replicas): Kubernetes
//! only lets a subject grant what it holds (RBAC escalation prevention). The HA Role
//! restricts Lease access to the discovery service's leader Lease by `resourceNames`;
//! those names differ per DiscoveryService, so the ClusterRole holds the same verbs on
//! every Lease.

use marin3r_kube::rbac::{ApiAccess, Names, grants};

const OPERATOR: &str = marin3r_wire::OPERATOR_GROUP;

/// What the three controllers read and write, cluster-wide (or in `WATCH_NAMESPACE`).
///
/// - DiscoveryServices, DiscoveryServiceCertificates, EnvoyDeployments: watched (list,
///   watch) and read one by one (get: an EnvoyDeployment's DiscoveryService); statuses
///   applied; certificates also applied (the DiscoveryService and EnvoyDeployment
///   controllers create them); `finalizers` for owner references.
/// - EnvoyConfigs: an EnvoyDeployment's node id (get), and watched to follow changes.
/// - Namespaces: an EnvoyDeployment's namespace (get: its OpenShift uid-range, the user
///   of the Envoy pods).
/// - Secrets: the certificates (watched label-selected, read, applied).
/// - Deployments: watched (owned), read (is it there yet?), applied.
/// - Services: watched (owned), applied. ServiceAccounts, Roles, RoleBindings: applied.
/// - HPAs and PDBs: watched (owned), applied, deleted when the spec drops them.
pub const OPERATOR_RBAC: &[ApiAccess] = &[
    ApiAccess {
        group: OPERATOR,
        resource: "discoveryservices",
        verbs: &["get", "list", "watch"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "discoveryservices/status",
        verbs: &["patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "discoveryservices/finalizers",
        verbs: &["update"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "discoveryservicecertificates",
        verbs: &["get", "list", "watch", "create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "discoveryservicecertificates/status",
        verbs: &["patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "discoveryservicecertificates/finalizers",
        verbs: &["update"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "envoydeployments",
        verbs: &["get", "list", "watch"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "envoydeployments/status",
        verbs: &["patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: OPERATOR,
        resource: "envoydeployments/finalizers",
        verbs: &["update"],
        names: Names::Any,
    },
    ApiAccess {
        group: marin3r_wire::DOMAIN,
        resource: "envoyconfigs",
        verbs: &["get", "list", "watch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        names: Names::Any,
    },
    ApiAccess {
        group: "",
        resource: "secrets",
        verbs: &["get", "list", "watch", "create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "",
        resource: "services",
        verbs: &["list", "watch", "create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "",
        resource: "serviceaccounts",
        verbs: &["create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "rbac.authorization.k8s.io",
        resource: "roles",
        verbs: &["create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: &["create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "apps",
        resource: "deployments",
        verbs: &["get", "list", "watch", "create", "patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "autoscaling",
        resource: "horizontalpodautoscalers",
        verbs: &["list", "watch", "create", "patch", "delete"],
        names: Names::Any,
    },
    ApiAccess {
        group: "policy",
        resource: "poddisruptionbudgets",
        verbs: &["list", "watch", "create", "patch", "delete"],
        names: Names::Any,
    },
];

/// The leader-election Lease, in the operator's own namespace
/// ([`super::leader`]: read, created when missing, applied and patched).
pub const LEASE_RBAC: &[ApiAccess] = &[ApiAccess {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "patch"],
    names: Names::Any,
}];

/// Every `(group, resource, verb)` the operator's ClusterRole must grant: its own
/// ([`OPERATOR_RBAC`]) and the discovery service's with several replicas
/// ([`marin3r_kube::rbac::discovery_service`]`(true)`, a superset of the single
/// replica's).
pub fn cluster_role_access() -> std::collections::BTreeSet<(String, String, String)> {
    grants(
        OPERATOR_RBAC
            .iter()
            .chain(marin3r_kube::rbac::discovery_service(true)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_role_holds_what_the_discovery_service_role_grants() {
        let all = cluster_role_access();
        for ha in [false, true] {
            for a in marin3r_kube::rbac::discovery_service(ha) {
                for v in a.verbs {
                    assert!(all.contains(&(a.group.into(), a.resource.into(), (*v).into())));
                }
            }
        }
        assert!(all.contains(&(
            "coordination.k8s.io".into(),
            "leases".into(),
            "watch".into()
        )));
        assert!(all.contains(&("apps".into(), "deployments".into(), "patch".into())));
    }
}
