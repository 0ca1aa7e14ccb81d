//! Annotation parsing and Pod mutation on arbitrary annotation maps.
//!
//! Keys are drawn mostly from the real `marin3r.3scale.net/*` keys (so the fuzzer reaches
//! every validator) with arbitrary values; the Pod around them has arbitrary container
//! names and volumes. Properties: `annotations::parse` and `mutate_pod` never panic, and
//! injection is idempotent (re-injecting an injected Pod yields the same Pod,
//! design.md §1.3).
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use marin3r_sidecar::annotations::{self, Defaults, keys};
use marin3r_sidecar::{Mutation, mutate_pod};
use marin3r_wire::{DOMAIN, INJECTION_ENABLED, INJECTION_LABEL};
use serde_json::{Value, json};

const KEYS: &[&str] = &[
    keys::NODE_ID,
    keys::CLUSTER_ID,
    keys::CONTAINER_NAME,
    keys::ENVOY_IMAGE,
    keys::ENVOY_API_VERSION,
    keys::PORTS,
    keys::HOST_PORT_MAPPINGS,
    keys::ENVOY_EXTRA_ARGS,
    keys::CONFIG_VOLUME,
    keys::TLS_VOLUME,
    keys::CLIENT_CERTIFICATE,
    keys::DISCOVERY_SERVICE_NAME,
    keys::DISCOVERY_SERVICE_ADDRESS,
    keys::ADMIN_PORT,
    keys::ADMIN_BIND_ADDRESS,
    keys::ADMIN_ACCESS_LOG_PATH,
    keys::REQUESTS_CPU,
    keys::REQUESTS_MEMORY,
    keys::LIMITS_CPU,
    keys::LIMITS_MEMORY,
    keys::SHTDN_ENABLED,
    keys::SHTDN_PORT,
    keys::SHTDN_IMAGE,
    keys::SHTDN_HOOKS,
    keys::SHTDN_DRAIN_TIME,
    keys::SHTDN_DRAIN_STRATEGY,
    keys::INIT_MANAGER_IMAGE,
    keys::NATIVE_SIDECAR,
    "sidecar-status",
];

#[derive(Debug, Arbitrary)]
enum Key {
    Known(u8),
    Other(String),
}

#[derive(Debug, Arbitrary)]
struct Input {
    annotations: Vec<(Key, String)>,
    containers: Vec<String>,
    init_containers: Vec<String>,
    volumes: Vec<String>,
    namespace: Option<String>,
    labelled: bool,
    grace_period: Option<i64>,
}

fn key(k: &Key) -> String {
    match k {
        Key::Known(i) => format!("{DOMAIN}/{}", KEYS[usize::from(*i) % KEYS.len()]),
        Key::Other(s) => s.clone(),
    }
}

fuzz_target!(|input: Input| {
    let map: BTreeMap<String, String> = input
        .annotations
        .iter()
        .map(|(k, v)| (key(k), v.clone()))
        .collect();
    let names: BTreeSet<String> = input.containers.iter().cloned().collect();
    let defaults = Defaults::default();
    let namespace = input.namespace.as_deref().unwrap_or("default");
    let _ = annotations::parse(&map, namespace, &names, &defaults);

    let named = |list: &[String]| -> Vec<Value> {
        list.iter()
            .map(|n| json!({"name": n, "image": "app"}))
            .collect()
    };
    let mut labels = serde_json::Map::new();
    if input.labelled {
        labels.insert(INJECTION_LABEL.into(), json!(INJECTION_ENABLED));
    }
    let mut spec = json!({
        "containers": named(&input.containers),
        "initContainers": named(&input.init_containers),
        "volumes": input.volumes.iter().map(|n| json!({"name": n, "emptyDir": {}})).collect::<Vec<_>>(),
    });
    if let Some(g) = input.grace_period {
        spec["terminationGracePeriodSeconds"] = json!(g);
    }
    let pod = json!({
        "metadata": {"name": "fuzz", "labels": labels, "annotations": map},
        "spec": spec,
    });
    if let Ok(Mutation::Injected(once)) = mutate_pod(&pod, input.namespace.as_deref(), &defaults) {
        match mutate_pod(&once, input.namespace.as_deref(), &defaults) {
            Ok(Mutation::Injected(twice)) => {
                assert_eq!(once, twice, "re-injection changed the Pod");
            }
            other => panic!("re-injecting an injected Pod failed: {other:?}"),
        }
    }
});
