//! Kubernetes manifests of MARIN3R. The CustomResourceDefinitions are generated from the
//! Rust types: EnvoyConfig, EnvoyConfigRevision and DiscoveryServiceReplica from
//! `marin3r-envoyconfig` ([`crds`], into `manifests/crds/`, which both
//! `manifests/default` and `manifests/operator` install), and the operator's DiscoveryService,
//! DiscoveryServiceCertificate and EnvoyDeployment from `marin3r-operator-api`
//! ([`operator_crds`], into `manifests/operator/crds/`). Each folder holds one file per
//! CRD plus a `kustomization.yaml`, kept in sync by this crate's tests.
//!
//! Regenerate the checked-in files after changing a CRD type:
//! `UPDATE_CRDS=1 cargo test -p marin3r-manifests` (or `marin3r crds` and
//! `marin3r crds --operator`, which print the same documents).
//!
//! [`kustomize`] renders the kustomizations under `manifests/` (install, discovery
//! service, examples) for the install tests. The monitoring component
//! `manifests/observability/` is read for its tests by `marin3r_testkit::observability`
//! (test support, not part of this crate's shipped code).
#![forbid(unsafe_code)]

pub mod kustomize;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
use marin3r_envoyconfig::discoveryservicereplica::DiscoveryServiceReplica;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;

/// Errors of manifest generation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot serialize CustomResourceDefinition {name} to YAML")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// Header of every generated file under `manifests/crds/`.
pub const GENERATED_HEADER: &str = "# Generated from the Rust types by `marin3r crds`; do not edit.\n\
# Regenerate: UPDATE_CRDS=1 cargo test -p marin3r-manifests\n";

/// Header of every generated file under `manifests/operator/crds/`.
pub const OPERATOR_GENERATED_HEADER: &str = "# Generated from the Rust types by `marin3r crds --operator`; do not edit.\n\
# Regenerate: UPDATE_CRDS=1 cargo test -p marin3r-manifests\n";

/// The CustomResourceDefinitions of MARIN3R: EnvoyConfig, EnvoyConfigRevision and
/// DiscoveryServiceReplica (the reports of a discovery service's replicas,
/// `docs/ha.md`).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        EnvoyConfig::crd(),
        EnvoyConfigRevision::crd(),
        DiscoveryServiceReplica::crd(),
    ]
}

/// The CustomResourceDefinitions of the operator (`operator.marin3r.3scale.net`):
/// DiscoveryService, DiscoveryServiceCertificate and EnvoyDeployment.
pub fn operator_crds() -> Vec<CustomResourceDefinition> {
    marin3r_operator_api::crds()
}

/// Each CRD as a YAML file: (file name under `manifests/crds/`, content).
pub fn crd_files() -> Result<Vec<(String, String)>, Error> {
    files(crds(), GENERATED_HEADER)
}

/// Each operator CRD as a YAML file: (file name under `manifests/operator/crds/`,
/// content).
pub fn operator_crd_files() -> Result<Vec<(String, String)>, Error> {
    files(operator_crds(), OPERATOR_GENERATED_HEADER)
}

fn files(
    crds: Vec<CustomResourceDefinition>,
    header: &str,
) -> Result<Vec<(String, String)>, Error> {
    crds.into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| Error::Yaml {
                name: name.clone(),
                source,
            })?;
            let plural = name.split('.').next().unwrap_or_default();
            Ok((format!("{plural}.yaml"), format!("{header}---\n{yaml}")))
        })
        .collect()
}

/// `manifests/crds/kustomization.yaml`: lists the CRD files.
pub fn kustomization_yaml() -> Result<String, Error> {
    Ok(kustomization(&crd_files()?, GENERATED_HEADER))
}

/// `manifests/operator/crds/kustomization.yaml`: lists the operator CRD files.
pub fn operator_kustomization_yaml() -> Result<String, Error> {
    Ok(kustomization(
        &operator_crd_files()?,
        OPERATOR_GENERATED_HEADER,
    ))
}

fn kustomization(files: &[(String, String)], header: &str) -> String {
    let mut out = format!(
        "{header}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
    );
    for (file, _) in files {
        out.push_str(&format!("  - {file}\n"));
    }
    out
}

/// Every CRD as one multi-document YAML stream (what `marin3r crds` prints).
pub fn crds_yaml() -> Result<String, Error> {
    stream(crd_files()?, GENERATED_HEADER)
}

/// Every operator CRD as one multi-document YAML stream (what
/// `marin3r crds --operator` prints).
pub fn operator_crds_yaml() -> Result<String, Error> {
    stream(operator_crd_files()?, OPERATOR_GENERATED_HEADER)
}

fn stream(files: Vec<(String, String)>, header: &str) -> Result<String, Error> {
    let mut out = String::from(header);
    for (_, content) in files {
        out.push_str(content.trim_start_matches(header));
    }
    Ok(out)
}
