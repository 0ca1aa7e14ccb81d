//! The discovery service's side of the mock API server (`marin3r_testkit::kube`, kube-rs'
//! tower-test pattern): the watch caches a test plays events into ([`World`]) and
//! EnvoyConfig objects as the API server returns them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use marin3r_control_plane::Context;
use marin3r_control_plane::kubernetes::{LabelSet, Lenient, Shared, SliceIndex};
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_xds::SharedStats;
use serde_json::{Value, json};

pub use marin3r_testkit::kube::*;

/// The watch caches, with their writers so a test can play the watch events.
pub struct World {
    pub shared: Arc<Shared>,
    pub configs: Writer<Lenient<EnvoyConfig>>,
    pub revisions: Writer<Lenient<EnvoyConfigRevision>>,
    pub secrets: Writer<Secret>,
}

impl World {
    pub fn new(client: Client, threshold: u64) -> Self {
        Self::with_context(client, threshold, Context::new(SharedStats::new()))
    }

    /// [`World::new`] feeding `xds` (e.g. with registered metrics).
    pub fn with_context(client: Client, threshold: u64, xds: Context) -> Self {
        let (config_store, configs) = reflector::store();
        let (revision_store, revisions) = reflector::store();
        let (secret_store, secrets) = reflector::store();
        let shared = Arc::new(Shared::new(
            client,
            config_store,
            revision_store,
            secret_store,
            SliceIndex::new(),
            xds,
            threshold,
        ));
        Self {
            shared,
            configs,
            revisions,
            secrets,
        }
    }

    pub fn xds(&self) -> &Context {
        &self.shared.xds
    }

    /// Plays a watch event for an EnvoyConfig (JSON as the API server sends it).
    pub fn put_config(&mut self, doc: &Value) -> Arc<Lenient<EnvoyConfig>> {
        let obj: Lenient<EnvoyConfig> = serde_json::from_value(doc.clone()).unwrap();
        self.configs
            .apply_watcher_event(&watcher::Event::Apply(obj.clone()));
        Arc::new(obj)
    }

    pub fn put_revision(&mut self, doc: &Value) -> Arc<Lenient<EnvoyConfigRevision>> {
        let obj: Lenient<EnvoyConfigRevision> = serde_json::from_value(doc.clone()).unwrap();
        self.feed_revision(&watcher::Event::Apply(obj.clone()));
        Arc::new(obj)
    }

    /// A revision watch event: the group index, then the watch cache (the backend's
    /// order).
    pub fn feed_revision(&mut self, event: &watcher::Event<Lenient<EnvoyConfigRevision>>) {
        self.shared.groups.apply(event);
        self.revisions.apply_watcher_event(event);
    }

    pub fn put_secret(&mut self, doc: &Value) {
        let obj: Secret = serde_json::from_value(doc.clone()).unwrap();
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(obj));
    }

    /// Plays a watch event for an EndpointSlice; returns the label sets it changed.
    pub fn put_slice(&mut self, doc: &Value) -> Vec<LabelSet> {
        let obj: EndpointSlice = serde_json::from_value(doc.clone()).unwrap();
        self.shared
            .slices
            .apply_watcher_event(&watcher::Event::Apply(obj))
    }

    pub fn revision(&self, name: &str) -> Arc<Lenient<EnvoyConfigRevision>> {
        self.shared
            .revisions
            .get(&reflector::ObjectRef::new(name).within("default"))
            .unwrap_or_else(|| panic!("revision {name} not in the cache"))
    }

    pub fn config(&self, name: &str) -> Arc<Lenient<EnvoyConfig>> {
        self.shared
            .configs
            .get(&reflector::ObjectRef::new(name).within("default"))
            .unwrap_or_else(|| panic!("EnvoyConfig {name} not in the cache"))
    }
}

/// An EnvoyConfig as the API server returns it.
pub fn envoyconfig(name: &str, spec: Value, status: Option<Value>) -> Value {
    let mut doc = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {
            "name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "generation": 1, "resourceVersion": "100",
            "creationTimestamp": "2025-01-01T00:00:00Z"
        },
        "spec": spec,
    });
    if let Some(status) = status {
        doc["status"] = status;
    }
    doc
}
