//! Kubernetes mode of `marin3r status` without `--csds-address`: every replica of the
//! discovery service reached by itself, as `istioctl proxy-status` does. The replicas are
//! the running Pods its Service `marin3r-<name>` selects (the one rule for the shipped
//! manifests and the operator's DiscoveryServices, whose labels differ), each reached on
//! the Service's target port through a port-forward by the API server (`pods/portforward`),
//! and CSDS spoken over the forwarded stream.

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use marin3r_wire::object_names;

/// One replica to ask: its Pod and the container port of the ADS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTarget {
    pub name: String,
    pub port: u16,
}

impl PodTarget {
    /// How the replica is named in the ENVOYS table and in messages.
    pub fn label(&self) -> String {
        format!("pod/{}", self.name)
    }
}

/// Why the replicas could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(
        "cannot read the Service {namespace}/{name} of the discovery service (give its \
         name with --discovery-service-name, or --csds-address): {}",
        marin3r_wire::error_chain(source)
    )]
    Service {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the Service {namespace}/{name} selects no Pods (spec.selector is empty)")]
    NoSelector { namespace: String, name: String },
    #[error(
        "cannot list the Pods of the Service {namespace}/{name}: {}",
        marin3r_wire::error_chain(source)
    )]
    Pods {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the Service {namespace}/{name} selects no running Pod")]
    NoPods { namespace: String, name: String },
    #[error(
        "{label}: cannot open a port-forward to port {port}: {}",
        marin3r_wire::error_chain(source)
    )]
    PortForward {
        label: String,
        port: u16,
        #[source]
        source: kube::Error,
    },
    #[error("{label}: the port-forward to port {port} gave no stream")]
    NoStream { label: String, port: u16 },
}

/// The label selector of `service` (`k=v,…`, sorted), None when it selects nothing.
pub fn selector(service: &Service) -> Option<String> {
    let selector = service.spec.as_ref()?.selector.as_ref()?;
    (!selector.is_empty()).then(|| {
        selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// The container port behind the Service's xDS port in `pod`: the port named
/// `discovery` (else the only one), its `targetPort` (a number, or a container port
/// name looked up in the Pod), else its `port`; the ADS port 18000 when the Service has
/// no port.
pub fn target_port(service: &Service, pod: &Pod) -> Option<u16> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let Some(port) = ports
        .iter()
        .find(|p| p.name.as_deref() == Some(marin3r_wire::ports::XDSS_NAME))
        .or_else(|| ports.first().filter(|_| ports.len() == 1))
    else {
        return Some(marin3r_wire::ports::XDSS);
    };
    let number = |n: i32| u16::try_from(n).ok().filter(|n| *n != 0);
    match &port.target_port {
        Some(IntOrString::Int(n)) => number(*n),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.as_deref().unwrap_or_default())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| number(p.container_port)),
        None => number(port.port),
    }
}

/// The replicas among `pods`: running, not being deleted, with a target port; by name.
pub fn targets(service: &Service, pods: &[Pod]) -> Vec<PodTarget> {
    let mut out: Vec<PodTarget> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| {
            Some(PodTarget {
                name: p.metadata.name.clone()?,
                port: target_port(service, p)?,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The replicas of the discovery service `name` in `namespace`.
pub async fn replicas(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<PodTarget>, ForwardError> {
    let service_name = object_names::discovery_service(name);
    let service = Api::<Service>::namespaced(client.clone(), namespace)
        .get(&service_name)
        .await
        .map_err(|source| ForwardError::Service {
            namespace: namespace.to_string(),
            name: service_name.clone(),
            source,
        })?;
    let selector = selector(&service).ok_or_else(|| ForwardError::NoSelector {
        namespace: namespace.to_string(),
        name: service_name.clone(),
    })?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| ForwardError::Pods {
            namespace: namespace.to_string(),
            name: service_name.clone(),
            source,
        })?;
    let found = targets(&service, &pods.items);
    if found.is_empty() {
        return Err(ForwardError::NoPods {
            namespace: namespace.to_string(),
            name: service_name,
        });
    }
    Ok(found)
}

/// A port-forward to `target`: the stream of its port (bytes to and from the container)
/// and the forwarder, which must live as long as the stream is used.
pub async fn open(
    client: &kube::Client,
    namespace: &str,
    target: &PodTarget,
) -> Result<(tokio::io::DuplexStream, kube::api::Portforwarder), ForwardError> {
    let mut forwarder = Api::<Pod>::namespaced(client.clone(), namespace)
        .portforward(&target.name, &[target.port])
        .await
        .map_err(|source| ForwardError::PortForward {
            label: target.label(),
            port: target.port,
            source,
        })?;
    let stream = forwarder
        .take_stream(target.port)
        .ok_or_else(|| ForwardError::NoStream {
            label: target.label(),
            port: target.port,
        })?;
    Ok((stream, forwarder))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "marin3r-discoveryservice"},
            "spec": {"selector": {"app.kubernetes.io/name": "marin3r",
                                  "app.kubernetes.io/component": "discoveryservice"},
                     "ports": ports},
        }))
        .unwrap()
    }

    fn pod(name: &str, phase: &str, deleting: bool) -> Pod {
        let mut metadata = json!({"name": name});
        if deleting {
            metadata["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({
            "metadata": metadata,
            "spec": {"containers": [{"name": "ds", "ports": [
                {"name": "xds", "containerPort": 18001}]}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn the_selector_is_the_services() {
        assert_eq!(
            selector(&service(json!([]))).as_deref(),
            Some("app.kubernetes.io/component=discoveryservice,app.kubernetes.io/name=marin3r")
        );
        let empty: Service = serde_json::from_value(json!({"spec": {"selector": {}}})).unwrap();
        assert_eq!(selector(&empty), None);
    }

    #[test]
    fn the_port_is_the_discovery_ports_target() {
        let p = pod("a", "Running", false);
        let by = |ports| target_port(&service(ports), &p);
        assert_eq!(
            by(json!([{"name": "metrics", "port": 8383},
                      {"name": "discovery", "port": 443, "targetPort": 18000}])),
            Some(18000)
        );
        assert_eq!(
            by(json!([{"name": "discovery", "port": 18000, "targetPort": "xds"}])),
            Some(18001)
        );
        assert_eq!(
            by(json!([{"name": "discovery", "port": 18002}])),
            Some(18002)
        );
        assert_eq!(
            by(json!([{"port": 18003, "targetPort": 18004}])),
            Some(18004)
        );
        assert_eq!(by(json!([])), Some(18000));
        assert_eq!(
            by(json!([{"name": "discovery", "port": 1, "targetPort": "missing"}])),
            None
        );
    }

    #[test]
    fn only_running_pods_not_being_deleted_are_replicas_by_name() {
        let s = service(json!([{"name": "discovery", "port": 18000, "targetPort": 18000}]));
        let pods = [
            pod("ds-c", "Running", false),
            pod("ds-a", "Running", false),
            pod("pending", "Pending", false),
            pod("leaving", "Running", true),
        ];
        let names: Vec<String> = targets(&s, &pods).into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["ds-a", "ds-c"]);
    }
}
