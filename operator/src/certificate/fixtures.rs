//! Test fixtures shared by the certificate controller's modules.
#![allow(clippy::unwrap_used)]

use marin3r_operator_api::DiscoveryServiceCertificate;
use serde_json::json;

/// The namespace of the fixtures.
pub const NS: &str = "ns";

/// A DiscoveryServiceCertificate `name` in `namespace` (generation 3, labelled with its
/// DiscoveryService `instance`) with `spec` and its defaults.
pub fn dsc(name: &str, namespace: &str, spec: serde_json::Value) -> DiscoveryServiceCertificate {
    let mut d: DiscoveryServiceCertificate = serde_json::from_value(json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"), "generation": 3,
                     "labels": {"app.kubernetes.io/instance": "instance"}},
        "spec": spec,
    }))
    .unwrap();
    d.spec = d.spec.with_defaults();
    d
}

/// The CA certificate of DiscoveryService `instance` in [`NS`].
pub fn ca() -> DiscoveryServiceCertificate {
    dsc(
        "marin3r-ca-cert-instance",
        NS,
        json!({"commonName": "marin3r-ca-instance", "isCA": true, "validFor": 1000 * 3600,
               "signer": {"selfSigned": {}}, "secretRef": {"name": "marin3r-ca-cert-instance"}}),
    )
}
