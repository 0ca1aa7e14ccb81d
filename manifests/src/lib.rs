//! Kubernetes manifests (CRDs, kustomize bases). Stub: filled by the cluster-install issue.
#![forbid(unsafe_code)]
