//! The checked-in CRDs under `manifests/crds/` are what the Rust types generate; they
//! parse as `CustomResourceDefinition`s and describe the upstream-compatible API, plus
//! the DiscoveryServiceReplica of a discovery service with several replicas.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds")
}

fn expected_files() -> Vec<(String, String)> {
    let mut files = marin3r_manifests::crd_files().unwrap();
    files.push((
        "kustomization.yaml".to_string(),
        marin3r_manifests::kustomization_yaml().unwrap(),
    ));
    files
}

#[test]
fn checked_in_crds_are_up_to_date() {
    let update = std::env::var_os("UPDATE_CRDS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (file, content) in expected_files() {
        let path = crds_dir().join(&file);
        if update {
            std::fs::write(&path, &content).unwrap();
            continue;
        }
        if std::fs::read_to_string(&path).ok().as_deref() != Some(content.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated CRDs: {stale:?}\nregenerate them with: UPDATE_CRDS=1 cargo test -p marin3r-manifests"
    );
}

#[test]
fn crds_parse_and_match_upstream_names() {
    let docs: Vec<CustomResourceDefinition> =
        serde_saphyr::from_multiple(&marin3r_manifests::crds_yaml().unwrap()).unwrap();
    let summary: Vec<(String, String, String, Vec<String>)> = docs
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap(),
                c.spec.names.kind.clone(),
                c.spec.scope.clone(),
                c.spec.names.short_names.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "envoyconfigs.marin3r.3scale.net".to_string(),
                "EnvoyConfig".to_string(),
                "Namespaced".to_string(),
                vec!["ec".to_string()]
            ),
            (
                "envoyconfigrevisions.marin3r.3scale.net".to_string(),
                "EnvoyConfigRevision".to_string(),
                "Namespaced".to_string(),
                vec!["ecr".to_string()]
            ),
            (
                "discoveryservicereplicas.marin3r.3scale.net".to_string(),
                "DiscoveryServiceReplica".to_string(),
                "Namespaced".to_string(),
                vec!["dsr".to_string()]
            ),
        ]
    );
    for crd in &docs {
        let version = &crd.spec.versions[0];
        assert_eq!(
            (version.name.as_str(), version.served, version.storage),
            ("v1alpha1", true, true)
        );
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
        if crd.spec.names.kind == "DiscoveryServiceReplica" {
            // Written by its replica only: the digests are in the status.
            let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
            for field in ["heartbeat", "seq", "leader", "nodes"] {
                assert!(status.get(field).is_some(), "status.{field}");
            }
            continue;
        }
        assert_eq!(
            spec["required"],
            serde_json::json!(if crd.spec.names.kind == "EnvoyConfig" {
                vec!["nodeID"]
            } else {
                vec!["nodeID", "version"]
            })
        );
        assert_eq!(
            spec["properties"]["resources"]["items"]["properties"]["value"]["x-kubernetes-preserve-unknown-fields"],
            true
        );
    }
    // The checked-in files are the same documents (unless being rewritten right now).
    if std::env::var_os("UPDATE_CRDS").is_some() {
        return;
    }
    for (file, _) in marin3r_manifests::crd_files().unwrap() {
        let text = std::fs::read_to_string(crds_dir().join(&file)).unwrap();
        let parsed: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        assert!(docs.contains(&parsed), "{file}");
    }
}

#[test]
fn printer_columns_match_upstream() {
    let columns = |kind: &str| -> Vec<String> {
        marin3r_manifests::crds()
            .into_iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap()
            .spec
            .versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.name.to_uppercase())
            .collect()
    };
    assert_eq!(
        columns("EnvoyConfig"),
        [
            "NODE ID",
            "ENVOY API",
            "DESIRED VERSION",
            "PUBLISHED VERSION",
            "CACHE STATE"
        ]
    );
    assert_eq!(
        columns("EnvoyConfigRevision"),
        [
            "NODE ID",
            "ENVOY API",
            "VERSION",
            "PUBLISHED",
            "CREATED AT",
            "LAST PUBLISHED AT",
            "TAINTED"
        ]
    );
}
