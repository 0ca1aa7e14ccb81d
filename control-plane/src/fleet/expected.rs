//! The replicas the leader expects a report from: the pods behind the discovery
//! service's Service, read from its EndpointSlices (label
//! `kubernetes.io/service-name`). An endpoint that is ready or terminating counts: a
//! terminating replica still serves its Envoys until its drain ends, and its report
//! must be read until then.
//!
//! And the reports that count at all ([`admit`]): **a report is bound to its discovery
//! service** — it names this discovery service's Service, it is named after a pod that
//! is an endpoint of that Service (in any state), and it is owned by that very pod (the
//! endpoint's pod UID). Anything else in the namespace — another discovery service's
//! replicas, a leftover, a forgery — is ignored (and counted), so it can neither veto a
//! taint nor vote for one.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use marin3r_envoyconfig::discoveryservicereplica::DiscoveryServiceReplica;

/// The label EndpointSlices carry with their Service's name.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The endpoints of the EndpointSlices of Service `service` in `slices` (others are
/// ignored), with the Pod each one targets.
fn pod_endpoints<'a, 's>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    service: &'s str,
) -> impl Iterator<Item = (&'a Endpoint, &'a ObjectReference)> {
    slices
        .into_iter()
        .filter(move |s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|name| name == service)
        })
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter_map(|e| Some((e, e.target_ref.as_ref()?)))
        .filter(|(_, r)| r.kind.as_deref() == Some("Pod"))
}

/// The names of the pods with a ready or terminating endpoint in `slices` (those of
/// Service `service`; others are ignored).
pub fn replicas_with_endpoints<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    service: &str,
) -> BTreeSet<String> {
    pod_endpoints(slices, service)
        .filter(|(e, _)| {
            let c = e.conditions.as_ref();
            // Kubernetes: a nil `ready` means ready (unknown state is ready).
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            ready || terminating
        })
        .filter_map(|(_, r)| r.name.clone())
        .collect()
}

/// Every pod with an endpoint (in any state) in the EndpointSlices of Service
/// `service`, with its UID when the endpoint names it.
pub fn endpoint_pods<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    service: &str,
) -> BTreeMap<String, Option<String>> {
    pod_endpoints(slices, service)
        .filter_map(|(_, r)| Some((r.name.clone()?, r.uid.clone())))
        .collect()
}

/// Why a report does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ignored {
    /// It names another discovery service (or none).
    OtherDiscoveryService,
    /// Its name is no pod with an endpoint in the Service.
    NotAnEndpoint,
    /// It is not owned by the pod of that name (the endpoint's pod UID).
    NotOwnedByThePod,
}

impl Ignored {
    /// Every reason (the label values of the metric).
    pub const ALL: [Ignored; 3] = [
        Ignored::OtherDiscoveryService,
        Ignored::NotAnEndpoint,
        Ignored::NotOwnedByThePod,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::OtherDiscoveryService => "other_discovery_service",
            Ignored::NotAnEndpoint => "not_an_endpoint",
            Ignored::NotOwnedByThePod => "not_owned_by_the_pod",
        }
    }
}

/// Whether `report` counts for the discovery service whose Service is `service` and
/// whose endpoints are `pods` ([`endpoint_pods`]): see the module docs. An endpoint
/// that does not name its pod's UID binds by name only.
pub fn admit(
    report: &DiscoveryServiceReplica,
    service: &str,
    pods: &BTreeMap<String, Option<String>>,
) -> Result<(), Ignored> {
    let named = report.spec.discovery_service.as_deref();
    if named != Some(service) {
        return Err(Ignored::OtherDiscoveryService);
    }
    let name = report.metadata.name.as_deref().unwrap_or_default();
    let Some(uid) = pods.get(name) else {
        return Err(Ignored::NotAnEndpoint);
    };
    let Some(uid) = uid else {
        return Ok(());
    };
    let owned = report
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Pod" && o.name == name && &o.uid == uid);
    if owned {
        Ok(())
    } else {
        Err(Ignored::NotOwnedByThePod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, service: &str, owner_uid: Option<&str>) -> DiscoveryServiceReplica {
        let owners: Vec<serde_json::Value> = owner_uid
            .map(|uid| serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}))
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "DiscoveryServiceReplica",
            "metadata": {"name": name, "namespace": "ns", "ownerReferences": owners},
            "spec": {"discoveryService": service},
        }))
        .unwrap()
    }

    #[test]
    fn only_reports_of_this_discovery_service_s_endpoint_pods_count() {
        let ours = slice(
            "marin3r-instance",
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "ds-a", "uid": "uid-a"}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "ds-b", "uid": "uid-b"}},
                {"addresses": ["10.0.0.3"], "targetRef": {"kind": "Pod", "name": "ds-c"}}
            ]),
        );
        let other = slice(
            "marin3r-other",
            serde_json::json!([{"addresses": ["10.0.1.1"], "targetRef": {"kind": "Pod", "name": "other-a", "uid": "uid-o"}}]),
        );
        let pods = endpoint_pods([&ours, &other], "marin3r-instance");
        assert_eq!(pods.len(), 3, "{pods:?}");
        let svc = "marin3r-instance";
        assert_eq!(
            admit(&report("ds-a", svc, Some("uid-a")), svc, &pods),
            Ok(())
        );
        assert_eq!(
            admit(&report("ds-b", svc, Some("uid-b")), svc, &pods),
            Ok(()),
            "a not-ready endpoint is still one of ours"
        );
        assert_eq!(
            admit(&report("ds-c", svc, None), svc, &pods),
            Ok(()),
            "no UID to bind to"
        );
        // Another discovery service's replica, in the same namespace.
        assert_eq!(
            admit(
                &report("other-a", "marin3r-other", Some("uid-o")),
                svc,
                &pods
            ),
            Err(Ignored::OtherDiscoveryService)
        );
        // Forged: naming our service, for a pod that is no endpoint of it...
        assert_eq!(
            admit(&report("forged", svc, Some("uid-x")), svc, &pods),
            Err(Ignored::NotAnEndpoint)
        );
        assert_eq!(
            admit(&report("other-a", svc, Some("uid-o")), svc, &pods),
            Err(Ignored::NotAnEndpoint)
        );
        // ...or named after one of ours but not owned by that pod.
        assert_eq!(
            admit(&report("ds-a", svc, Some("uid-x")), svc, &pods),
            Err(Ignored::NotOwnedByThePod)
        );
        assert_eq!(
            admit(&report("ds-a", svc, None), svc, &pods),
            Err(Ignored::NotOwnedByThePod)
        );
    }

    fn slice(service: &str, endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{service}-abc"), "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    #[test]
    fn ready_and_terminating_pods_are_expected() {
        let ours = slice(
            "marin3r-instance",
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "ds-a"}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "terminating": true}, "targetRef": {"kind": "Pod", "name": "ds-b"}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "ds-c"}},
                {"addresses": ["10.0.0.4"], "targetRef": {"kind": "Pod", "name": "ds-d"}},
                {"addresses": ["10.0.0.5"], "conditions": {"ready": true}}
            ]),
        );
        let other = slice(
            "kuard",
            serde_json::json!([{"addresses": ["10.0.1.1"], "targetRef": {"kind": "Pod", "name": "kuard-1"}}]),
        );
        let got = replicas_with_endpoints([&ours, &other], "marin3r-instance");
        assert_eq!(
            got,
            BTreeSet::from(["ds-a".into(), "ds-b".into(), "ds-d".into()])
        );
    }
}
