//! Kubernetes manifests of MARIN3R. The CustomResourceDefinitions are generated from the
//! Rust types of `marin3r-xds` ([`crds`]); `manifests/crds/` holds the generated YAML
//! (one file per CRD plus a `kustomization.yaml`), kept in sync by this crate's tests.
//!
//! Regenerate the checked-in files after changing a CRD type:
//! `UPDATE_CRDS=1 cargo test -p marin3r-manifests` (or `marin3r crds`, which prints
//! the same documents).
//!
//! [`kustomize`] renders the kustomizations under `manifests/` (install, discovery
//! service, examples) for the install tests.
#![forbid(unsafe_code)]

pub mod kustomize;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
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

/// Header of every generated file.
pub const GENERATED_HEADER: &str = "# Generated from the Rust types by `marin3r crds`; do not edit.\n\
# Regenerate: UPDATE_CRDS=1 cargo test -p marin3r-manifests\n";

/// The CustomResourceDefinitions of MARIN3R: EnvoyConfig and EnvoyConfigRevision.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![EnvoyConfig::crd(), EnvoyConfigRevision::crd()]
}

/// Each CRD as a YAML file: (file name under `manifests/crds/`, content).
pub fn crd_files() -> Result<Vec<(String, String)>, Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| Error::Yaml {
                name: name.clone(),
                source,
            })?;
            let plural = name.split('.').next().unwrap_or_default();
            Ok((
                format!("{plural}.yaml"),
                format!("{GENERATED_HEADER}---\n{yaml}"),
            ))
        })
        .collect()
}

/// `manifests/crds/kustomization.yaml`: lists the CRD files.
pub fn kustomization_yaml() -> Result<String, Error> {
    let mut out = format!(
        "{GENERATED_HEADER}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
    );
    for (file, _) in crd_files()? {
        out.push_str(&format!("  - {file}\n"));
    }
    Ok(out)
}

/// Every CRD as one multi-document YAML stream (what `marin3r crds` prints).
pub fn crds_yaml() -> Result<String, Error> {
    let mut out = String::from(GENERATED_HEADER);
    for (_, content) in crd_files()? {
        out.push_str(content.trim_start_matches(GENERATED_HEADER));
    }
    Ok(out)
}
