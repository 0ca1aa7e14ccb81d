//! The Kubernetes Secrets that resources are generated from, as resolving a spec sees
//! them: a Secret's type and data ([`SecretData`], whose `Debug` never shows the data),
//! where Secrets (and, in Kubernetes mode, EndpointSlices) are looked up
//! ([`SecretSource`]), and reading a `kind: Secret` manifest ([`parse_secret`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

/// The `type` and `data` of a Kubernetes Secret. `Debug` shows key names and sizes only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData {
    /// The Secret type, e.g. `kubernetes.io/tls` or `Opaque` (may be empty if unknown).
    pub type_: String,
    /// Decoded data (`data` base64-decoded, `stringData` as is).
    pub data: BTreeMap<String, Vec<u8>>,
}

impl fmt::Debug for SecretData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: BTreeMap<&str, String> = self
            .data
            .iter()
            .map(|(k, v)| (k.as_str(), format!("<{} bytes>", v.len())))
            .collect();
        f.debug_struct("SecretData")
            .field("type_", &self.type_)
            .field("data", &sizes)
            .finish()
    }
}

/// Where [`resolve`](crate::envoyconfig::resolve) reads Kubernetes objects from: Secrets (local manifests or the API)
/// and, in Kubernetes mode, EndpointSlices.
pub trait SecretSource {
    /// The Secret `name` in the EnvoyConfig's namespace.
    fn get(&self, name: &str) -> Option<SecretData>;

    /// The EndpointSlices matching `selector` in the EnvoyConfig's namespace, or `None`
    /// where EndpointSlices cannot be listed (local mode; the default). Shared with the
    /// watch cache, not copied.
    fn endpoint_slices(&self, selector: Option<&LabelSelector>) -> Option<Vec<Arc<EndpointSlice>>> {
        let _ = selector;
        None
    }
}

/// A source without any Secret (and without EndpointSlices).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSecrets;

impl SecretSource for NoSecrets {
    fn get(&self, _: &str) -> Option<SecretData> {
        None
    }
}

impl SecretSource for BTreeMap<String, SecretData> {
    fn get(&self, name: &str) -> Option<SecretData> {
        BTreeMap::get(self, name).cloned()
    }
}

impl SecretSource for HashMap<String, SecretData> {
    fn get(&self, name: &str) -> Option<SecretData> {
        HashMap::get(self, name).cloned()
    }
}

/// Reads a `kind: Secret` manifest: (namespace, name, data). `data` is base64-decoded,
/// `stringData` overrides it as Kubernetes does. Errors never quote the data.
pub fn parse_secret(doc: &Value) -> Result<(Option<String>, String, SecretData), String> {
    let name = doc["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or("metadata.name is missing")?
        .to_string();
    let namespace = doc["metadata"]["namespace"].as_str().map(str::to_string);
    let mut secret = SecretData {
        type_: doc["type"].as_str().unwrap_or_default().to_string(),
        data: BTreeMap::new(),
    };
    if let Some(data) = doc.get("data").filter(|d| !d.is_null()) {
        let map = data.as_object().ok_or("data must be a map")?;
        for (key, value) in map {
            let text = value
                .as_str()
                .ok_or_else(|| format!("data.{key}: must be a string"))?;
            let bytes = BASE64
                .decode(text.trim())
                .map_err(|_| format!("data.{key}: invalid base64"))?;
            secret.data.insert(key.clone(), bytes);
        }
    }
    if let Some(data) = doc.get("stringData").filter(|d| !d.is_null()) {
        let map = data.as_object().ok_or("stringData must be a map")?;
        for (key, value) in map {
            let text = value
                .as_str()
                .ok_or_else(|| format!("stringData.{key}: must be a string"))?;
            secret.data.insert(key.clone(), text.as_bytes().to_vec());
        }
    }
    Ok((namespace, name, secret))
}
