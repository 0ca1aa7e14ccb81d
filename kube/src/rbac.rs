//! RBAC tables: the API permissions a process needs, written once and checked both ways
//! (against the requests a recording mock API server sees, and against the Role or
//! ClusterRole YAML and the Roles the operator generates), and the discovery service's
//! own tables, which the operator and the manifests both need: [`DISCOVERY_SERVICE`]
//! (every replica count) and [`DISCOVERY_SERVICE_HA`] (added with `--leader-elect`).

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;

/// Which objects of a resource an [`ApiAccess`] covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Names {
    /// Every object of the resource (a rule without `resourceNames`).
    Any,
    /// Only the discovery service's leader Lease, `marin3r-<name>-leader`
    /// ([`marin3r_wire::object_names::discovery_service_lease`]): `resourceNames` in
    /// the rule.
    LeaderLease,
}

/// Verbs on one resource (or `resource/subresource`) of one API group (`""` = core),
/// on every object or only on named ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub names: Names,
}

impl ApiAccess {
    /// The `resourceNames` of this entry in the Role of the discovery service named
    /// `discovery_service` (empty: every object).
    pub fn resource_names(&self, discovery_service: &str) -> Vec<String> {
        match self.names {
            Names::Any => Vec::new(),
            Names::LeaderLease => vec![marin3r_wire::object_names::discovery_service_lease(
                discovery_service,
            )],
        }
    }
}

/// Every `(group, resource, verb)` that `tables` grant, whatever objects they are
/// restricted to: how a table is compared with a ClusterRole that must hold it (a grant
/// on every object covers a restricted one).
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

/// One grant: `(group, resource, verb, object name)`, the name `None` for every object.
pub type NamedAccess = (String, String, String, Option<String>);

/// Every grant of `tables` in the Role of the discovery service named
/// `discovery_service`, with the object each is restricted to: how a table is compared
/// with a Role's rules (their `resourceNames` included) and with the requests a process
/// makes.
pub fn named_grants<'a>(
    tables: impl IntoIterator<Item = &'a ApiAccess>,
    discovery_service: &str,
) -> BTreeSet<NamedAccess> {
    let mut out = BTreeSet::new();
    for a in tables {
        let names = a.resource_names(discovery_service);
        for v in a.verbs {
            let grant = |name: Option<String>| {
                (
                    a.group.to_string(),
                    a.resource.to_string(),
                    v.to_string(),
                    name,
                )
            };
            if names.is_empty() {
                out.insert(grant(None));
            }
            for n in &names {
                out.insert(grant(Some(n.clone())));
            }
        }
    }
    out
}

/// The grant among `granted` that allows `verb` on `group`/`resource` for the object
/// `name` (the one a request addresses: in its path, or for list and watch in a
/// `metadata.name=` field selector), as the RBAC authorizer matches `resourceNames`: a
/// grant on every object, else one restricted to that name.
pub fn allowing<'a>(
    granted: &'a BTreeSet<NamedAccess>,
    (group, resource, verb): (&str, &str, &str),
    name: Option<&str>,
) -> Option<&'a NamedAccess> {
    let key = |n: Option<&str>| {
        (
            group.to_string(),
            resource.to_string(),
            verb.to_string(),
            n.map(str::to_string),
        )
    };
    granted
        .get(&key(None))
        .or_else(|| name.and_then(|n| granted.get(&key(Some(n)))))
}

/// The Role rules of `tables` for the discovery service named `discovery_service`: one
/// rule per entry, in order.
pub fn policy_rules<'a>(
    tables: impl IntoIterator<Item = &'a ApiAccess>,
    discovery_service: &str,
) -> Vec<PolicyRule> {
    tables
        .into_iter()
        .map(|a| {
            let names = a.resource_names(discovery_service);
            PolicyRule {
                api_groups: Some(vec![a.group.to_string()]),
                resources: Some(vec![a.resource.to_string()]),
                resource_names: (!names.is_empty()).then_some(names),
                verbs: a.verbs.iter().map(|v| (*v).to_string()).collect(),
                ..PolicyRule::default()
            }
        })
        .collect()
}

/// The discovery service's whole table: [`DISCOVERY_SERVICE`], plus
/// [`DISCOVERY_SERVICE_HA`] when it runs as several replicas (`--leader-elect`).
pub fn discovery_service(ha: bool) -> impl Iterator<Item = &'static ApiAccess> {
    let ha: &'static [ApiAccess] = if ha { DISCOVERY_SERVICE_HA } else { &[] };
    DISCOVERY_SERVICE.iter().chain(ha)
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
/// No Events are emitted; the Lease and the replicas' reports of several replicas are
/// [`DISCOVERY_SERVICE_HA`].
pub const DISCOVERY_SERVICE: &[ApiAccess] = &[
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigs",
        verbs: &["get", "list", "watch"],
        names: Names::Any,
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigs/status",
        verbs: &["patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigs/finalizers",
        verbs: &["update"],
        names: Names::Any,
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigrevisions",
        verbs: &["list", "watch", "create", "patch", "delete"],
        names: Names::Any,
    },
    ApiAccess {
        group: MARIN3R,
        resource: "envoyconfigrevisions/status",
        verbs: &["patch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "",
        resource: "secrets",
        verbs: &["list", "watch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "discovery.k8s.io",
        resource: "endpointslices",
        verbs: &["list", "watch"],
        names: Names::Any,
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        names: Names::Any,
    },
];

const COORDINATION: &str = "coordination.k8s.io";

/// What a discovery service run as one of several replicas (`--leader-elect`,
/// `docs/ha.md`) asks for on top of [`DISCOVERY_SERVICE`], in its own namespace. The
/// single-replica Role stays without it.
///
/// - `leases`, restricted to the leader Lease `marin3r-<name>-leader`
///   ([`Names::LeaderLease`]): read, and written with merge patches preconditioned on
///   its resourceVersion (taking the lock, renewal, release: [`crate::lease`]); listed
///   and watched with the field selector `metadata.name=<lease>` (a release is taken at
///   once), which is what lets `resourceNames` restrict a list or a watch.
/// - `leases` `create`: the Lease is created (held) when it is missing.
///   Kubernetes cannot restrict `create` by `resourceNames` (the name of a new object
///   is not known when it is authorized), hence a separate rule on every Lease.
/// - `discoveryservicereplicas`: every replica's report is watched (list, watch); a
///   replica creates its own with a server-side apply (`patch`, and `create`: the API
///   server authorizes an apply that creates the object as a create too), writes its
///   status, and deletes it at shutdown. Names are the pods', so no `resourceNames`.
/// - The Service's EndpointSlices (the replicas to expect) are already watched by
///   [`DISCOVERY_SERVICE`].
pub const DISCOVERY_SERVICE_HA: &[ApiAccess] = &[
    ApiAccess {
        group: COORDINATION,
        resource: "leases",
        verbs: &["get", "list", "watch", "patch"],
        names: Names::LeaderLease,
    },
    ApiAccess {
        group: COORDINATION,
        resource: "leases",
        verbs: &["create"],
        names: Names::Any,
    },
    ApiAccess {
        group: MARIN3R,
        resource: "discoveryservicereplicas",
        verbs: &["list", "watch", "create", "patch", "delete"],
        names: Names::Any,
    },
    ApiAccess {
        group: MARIN3R,
        resource: "discoveryservicereplicas/status",
        verbs: &["patch"],
        names: Names::Any,
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
            names: Names::Any,
        }];
        let got: Vec<(String, String, String)> = grants(&table).into_iter().collect();
        let want = [("g", "r", "get"), ("g", "r", "list")]
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(got, want);
    }

    #[test]
    fn the_leader_lease_rule_names_the_discovery_services_lease() {
        let s = |v: &str| v.to_string();
        let granted = named_grants(DISCOVERY_SERVICE_HA, "edge");
        let lease = s("marin3r-edge-leader");
        let leases = ("coordination.k8s.io", "leases", "watch");
        assert_eq!(
            allowing(&granted, leases, Some("marin3r-edge-leader")),
            Some(&(s(leases.0), s(leases.1), s(leases.2), Some(lease.clone())))
        );
        assert_eq!(allowing(&granted, leases, Some("other")), None);
        assert_eq!(
            allowing(&granted, leases, None),
            None,
            "a watch of every Lease"
        );
        let create = ("coordination.k8s.io", "leases", "create");
        assert_eq!(
            allowing(&granted, create, None),
            Some(&(s(create.0), s(create.1), s(create.2), None))
        );
        let rules = policy_rules(DISCOVERY_SERVICE_HA, "edge");
        assert_eq!(rules[0].resource_names, Some(vec![lease]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch", "patch"]);
        assert_eq!(rules[1].resource_names, None);
        assert_eq!(rules.len(), DISCOVERY_SERVICE_HA.len());
        // grants() ignores the names: a ClusterRole that must hold the table.
        assert!(grants(DISCOVERY_SERVICE_HA).contains(&(s(leases.0), s(leases.1), s(leases.2))));
        assert_eq!(
            discovery_service(false).count() + DISCOVERY_SERVICE_HA.len(),
            discovery_service(true).count()
        );
    }
}
