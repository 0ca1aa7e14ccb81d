//! Every upstream manifest of the operator API (`operator-api/tests/data/upstream/`, see
//! its README for sources and commit) decodes into our types without losing a field,
//! re-encodes to the same object, and passes `validate()`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use marin3r_operator_api::envoydeployment::Replicas;
use marin3r_sidecar::annotations::DrainStrategy;

/// The Envoy image the operator passes as the default (sidecar injection's).
const DEFAULT_ENVOY_IMAGE: &str = "envoyproxy/envoy:v1.40.0";
use marin3r_operator_api::{DiscoveryService, DiscoveryServiceCertificate, EnvoyDeployment};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/upstream")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

/// Every operator object of every data file: (file, object).
fn objects() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    yaml_files(&data_dir(), &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.strip_prefix(data_dir()).unwrap().display().to_string();
        for doc in docs {
            if doc["apiVersion"] == "operator.marin3r.3scale.net/v1alpha1" {
                out.push((name.clone(), doc));
            }
        }
    }
    out
}

/// Decodes `doc` as `T` and checks that encoding it again gives the same object (so no
/// field was unknown or dropped); a missing `spec` comes back as `{}`.
fn round_trip<T: DeserializeOwned + serde::Serialize>(file: &str, doc: &Value) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut expected = doc.clone();
    if expected.get("spec").is_none() {
        expected["spec"] = json!({});
    }
    assert_eq!(serde_json::to_value(&typed).unwrap(), expected, "{file}");
    typed
}

#[test]
fn every_upstream_manifest_decodes_round_trips_and_validates() {
    let mut kinds = Vec::new();
    for (file, doc) in objects() {
        let kind = doc["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "DiscoveryService" => {
                let ds: DiscoveryService = round_trip(&file, &doc);
                ds.spec.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
            }
            "DiscoveryServiceCertificate" => {
                let dsc: DiscoveryServiceCertificate = round_trip(&file, &doc);
                dsc.spec
                    .validate()
                    .unwrap_or_else(|e| panic!("{file}: {e}"));
            }
            "EnvoyDeployment" => {
                let ed: EnvoyDeployment = round_trip(&file, &doc);
                ed.spec.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
            }
            other => panic!("{file}: unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    kinds.sort();
    kinds.dedup_by(|a, b| a == b);
    assert_eq!(
        kinds,
        [
            "DiscoveryService",
            "DiscoveryServiceCertificate",
            "EnvoyDeployment"
        ]
    );
    assert_eq!(objects().len(), 11);
}

fn load<T: DeserializeOwned>(file: &str) -> T {
    let text = std::fs::read_to_string(data_dir().join(file)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[test]
fn the_readme_discovery_service() {
    let ds: DiscoveryService = load("readme-discoveryservice.yaml");
    assert_eq!(ds.metadata.name.as_deref(), Some("discoveryservice"));
    assert_eq!(ds.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(ds.resource_name(), "marin3r-discoveryservice");
    assert_eq!(
        ds.xds_host("default"),
        "marin3r-discoveryservice.default.svc"
    );
    assert_eq!(ds.xds_server_port(), Ok(18000));
    assert_eq!(
        ds.root_certificate_authority().unwrap().secret_name,
        "marin3r-ca-cert-discoveryservice"
    );
    assert_eq!(
        ds.server_certificate().unwrap().secret_name,
        "marin3r-server-cert-discoveryservice"
    );
}

#[test]
fn the_connection_draining_walkthrough_envoy_deployment() {
    let ed: EnvoyDeployment = load("walkthrough-connection-draining-envoydeployment.yaml");
    let s = &ed.spec;
    assert_eq!(s.discovery_service_ref, "discoveryservice");
    assert_eq!(s.envoy_config_ref, "envoy");
    assert_eq!(
        s.ports()
            .iter()
            .map(|p| (p.name.as_str(), p.port, p.protocol.as_deref()))
            .collect::<Vec<_>>(),
        [("http", 8080, None)]
    );
    assert_eq!(s.replicas(), Replicas::Static(1));
    let sm = s
        .shutdown_manager()
        .expect("shutdownManager: {} enables it");
    assert_eq!(sm.drain_time(), 300);
    assert_eq!(sm.drain_strategy(), DrainStrategy::Gradual);
    assert_eq!(sm.server_port(), Ok(8090));
    assert_eq!(s.image(DEFAULT_ENVOY_IMAGE), "envoyproxy/envoy:v1.40.0");
    assert_eq!(ed.deployment_name(), "marin3r-envoydeployment-envoy");
    assert_eq!(ed.client_certificate_name(), "envoy-client-cert-envoy");
    // The walkthrough's scale-down patch.
    let mut patched = serde_json::to_value(&ed).unwrap();
    patched["spec"]["replicas"] = json!({"static": 0});
    let scaled: EnvoyDeployment = serde_json::from_value(patched).unwrap();
    assert_eq!(scaled.spec.replicas(), Replicas::Static(0));
    assert_eq!(scaled.spec.validate(), Ok(()));
}

#[test]
fn the_dynamic_replicas_example() {
    let ed: EnvoyDeployment = load("examples-envoydeployment-v0.12.0/envoydeployment.yaml");
    let Replicas::Dynamic(d) = ed.spec.replicas() else {
        panic!("dynamic replicas expected")
    };
    assert_eq!((d.min_replicas, d.max_replicas), (Some(1), 10));
    let metric = &d.metrics.as_ref().unwrap()[0];
    assert_eq!(metric.type_, "Resource");
    assert!(!ed.spec.pod_disruption_budget().is_empty());
    assert_eq!(
        ed.spec.init_manager_image("default"),
        "quay.io/3scale/marin3r:test"
    );
    assert_eq!(ed.spec.admin_access_log_path(), "/dev/stdout");
}
