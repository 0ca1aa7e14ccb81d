//! The replicas the leader expects a report from: the pods behind the discovery
//! service's Service, read from its EndpointSlices (label
//! `kubernetes.io/service-name`). An endpoint that is ready or terminating counts: a
//! terminating replica still serves its Envoys until its drain ends, and its report
//! must be read until then.

use std::collections::BTreeSet;

use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label EndpointSlices carry with their Service's name.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The names of the pods with a ready or terminating endpoint in `slices` (those of
/// Service `service`; others are ignored).
pub fn replicas_with_endpoints<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    service: &str,
) -> BTreeSet<String> {
    slices
        .into_iter()
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|name| name == service)
        })
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| {
            let c = e.conditions.as_ref();
            // Kubernetes: a nil `ready` means ready (unknown state is ready).
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            ready || terminating
        })
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter_map(|r| r.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
