//! RBAC tables: the API permissions a process needs, written once and checked both ways
//! (against the requests a recording mock API server sees, and against the Role or
//! ClusterRole YAML and the Roles the operator generates), and [`DISCOVERY_SERVICE`],
//! the discovery service's own table, which the operator and the manifests both need.

use std::collections::BTreeSet;

/// Verbs on one resource (or `resource/subresource`) of one API group (`""` = core).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

/// Every `(group, resource, verb)` that `tables` grant: how an RBAC table is compared
/// with a Role's rules and with the requests a controller makes.
pub fn grants<'a>(
    tables: impl IntoIterator<Item = &'a ApiAccess>,
) -> BTreeSet<(String, String, String)> {
    tables
        .into_iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.to_string(), a.resource.to_string(), v.to_string()))
        })
        .collect()
}

const MARIN3R: &str = marin3r_wire::DOMAIN;

/// Everything the discovery service in Kubernetes mode (its controllers, reflectors and
/// Pod watch) asks the API server for, in the watched namespace: the single source of
/// its Role (`manifests/discovery-service/role.yaml`, and the Role the operator creates
/// for a DiscoveryService). The discovery service's tests check it against its real
/// requests; the manifests tests against the YAML.
///
/// - `envoyconfigs`: watched (list, watch); read directly by the revision finalizer
///   (get); status written with server-side apply (patch on `status`).
/// - `envoyconfigs/finalizers` (update): revisions are created with an owner reference
///   that sets `blockOwnerDeletion`, which the API server's
///   `OwnerReferencesPermissionEnforcement` admission (on by default in OpenShift)
///   only allows to whoever may update the owner's finalizers.
/// - `envoyconfigrevisions`: watched; created, patched (applied-at annotation,
///   finalizer) and deleted (retention) by the EnvoyConfig reconciler; status written
///   with server-side apply. Never read one by one.
/// - `secrets`, `endpointslices`: watched only (resolution reads the watch caches).
/// - `pods`: metadata watched, to forget the NACK counts of deleted pods.
///
/// No Events are emitted and there is no leader election (no Leases).
pub const DISCOVERY_SERVICE: &[ApiAccess] = &[
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigs",
        verbs: &["get", "list", "watch"],
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigs/status",
        verbs: &["patch"],
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigs/finalizers",
        verbs: &["update"],
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigrevisions",
        verbs: &["list", "watch", "create", "patch", "delete"],
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigrevisions/status",
        verbs: &["patch"],
    },
    ApiAccess {
        group: "",
        resource: "secrets",
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: "discovery.k8s.io",
        resource: "endpointslices",
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_flatten_a_table() {
        let table = [ApiAccess {
            group: "g",
            resource: "r",
            verbs: &["get", "list"],
        }];
        let got: Vec<(String, String, String)> = grants(&table).into_iter().collect();
        let want = [("g", "r", "get"), ("g", "r", "list")]
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(got, want);
    }
}
