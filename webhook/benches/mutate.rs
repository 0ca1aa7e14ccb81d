//! Mutation core benchmarks: µs per Pod for the pure injection (`mutate_pod`) and for the
//! whole AdmissionReview path (parse JSON, inject, diff, base64, serialise).
//! Run: `cargo bench -p marin3r-webhook --bench mutate`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::hint::black_box;

use marin3r_sidecar::{Defaults, mutate_pod};
use marin3r_webhook::admission::mutate;

/// A realistic Pod: two app containers with env, probes and mounts, the kuard walkthrough
/// annotations plus shutdown manager and resources.
fn realistic_pod() -> Value {
    let app = |name: &str| {
        json!({
            "name": name, "image": format!("registry.example.com/team/{name}:1.2.3"),
            "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
            "env": (0..12).map(|i| json!({"name": format!("VAR_{i}"), "value": format!("value-{i}")})).collect::<Vec<_>>(),
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]
        })
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "kuard-6d8f7c9b5-", "namespace": "default",
            "labels": {"app": "kuard", "pod-template-hash": "6d8f7c9b5", "marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "kuard",
                "marin3r.3scale.net/ports": "envoy-https:8443,envoy-http:8081",
                "marin3r.3scale.net/host-port-mappings": "envoy-https:3443",
                "marin3r.3scale.net/resources.requests.cpu": "50m",
                "marin3r.3scale.net/resources.limits.memory": "256Mi",
                "marin3r.3scale.net/envoy-extra-args": "--log-level info --component-log-level 'upstream:debug'",
                "marin3r.3scale.net/shutdown-manager.enabled": "true",
                "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "kuard"
            },
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "kuard-6d8f7c9b5", "uid": "0b5f7a3e", "controller": true}]
        },
        "spec": {
            "containers": [app("kuard"), app("worker")],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "serviceAccountName": "kuard"
        }
    })
}

fn bench(c: &mut Criterion) {
    let defaults = Defaults::default();
    let pod = realistic_pod();
    c.bench_function("mutate_pod (pure injection)", |b| {
        b.iter(|| mutate_pod(black_box(&pod), Some("default"), &defaults).unwrap())
    });
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "namespace": "default", "operation": "CREATE", "object": pod}
    }))
    .unwrap();
    c.bench_function("admission review (parse + inject + diff + encode)", |b| {
        b.iter(|| {
            let (out, _) = mutate(black_box(&body), &defaults).unwrap();
            serde_json::to_vec(&out).unwrap()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
