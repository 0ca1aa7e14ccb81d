//! Kubernetes mode's Pod watch against a list of N injected Pods (issue 15: "the
//! discovery service's Pod watch stores only what it needs, measured with 10,000 Pods"):
//! `cargo run --release -p marin3r-bench --example pod_watch -- 10000`.
//!
//! An in-process fake API server (a `tower::service_fn` behind `kube::Client`) answers the
//! watcher's paginated LIST of `PartialObjectMetadata` (real-shaped items: name,
//! namespace, uid, labels, the node-id annotation, an owner reference) in pages of 500.
//! The watch runs with the discovery service's own config
//! ([`pod_watch_config`]) and, like the discovery service, keeps no store. Prints the
//! time to the end of the initial list, the peak RSS growth, and the bytes listed.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Result;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use marin3r_control_plane::kubernetes::pod_watch_config;
use serde_json::json;

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn pod(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {
            "name": format!("app-{i:05}-7c9d8f6b5-x2x{i:05}"),
            "namespace": "apps",
            "uid": format!("0b5c2a7e-3f1d-4c2a-9e7b-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"app": "app", "pod-template-hash": "7c9d8f6b5", "marin3r.3scale.net/status": "enabled"},
            "annotations": {"marin3r.3scale.net/node-id": format!("node-{}", i % 50), "marin3r.3scale.net/ports": "http:8080"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-7c9d8f6b5",
                                 "uid": "4d1f0c3b-2a9e-4b7c-8d6e-5f4a3b2c1d0e", "controller": true, "blockOwnerDeletion": true}],
        }
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let total: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let listed = Arc::new(AtomicUsize::new(0));
    let bytes = listed.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let bytes = bytes.clone();
        async move {
            let query = req.uri().query().unwrap_or_default().to_string();
            let param = |name: &str| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_string))
            };
            if param("watch").is_some() {
                // Never reached: the measurement stops at the end of the initial list.
                return Ok::<_, std::convert::Infallible>(http::Response::new(
                    kube::client::Body::from(Vec::new()),
                ));
            }
            let limit: usize = param("limit").and_then(|l| l.parse().ok()).unwrap_or(total);
            let start: usize = param("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
            let end = (start + limit).min(total);
            let items: Vec<_> = (start..end).map(pod).collect();
            let mut metadata = json!({"resourceVersion": "200000"});
            if end < total {
                metadata["continue"] = json!(end.to_string());
            }
            let list = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                              "metadata": metadata, "items": items});
            let body = serde_json::to_vec(&list).unwrap_or_default();
            bytes.fetch_add(body.len(), Ordering::Relaxed);
            let mut response = http::Response::new(kube::client::Body::from(body));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok(response)
        }
    });
    let client = kube::Client::new(service, "default");
    let api: Api<PartialObjectMeta<Pod>> = Api::namespaced(client, "apps");
    let rss_before = rss_kib("VmRSS:");
    let started = Instant::now();
    let mut stream = std::pin::pin!(watcher(api, pod_watch_config()));
    let mut seen = 0usize;
    while let Some(event) = stream.next().await {
        match event? {
            watcher::Event::InitApply(_) => seen += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    let elapsed = started.elapsed();
    let peak = rss_kib("VmHWM:");
    println!(
        "pods {seen} of {total}; listed {:.1} MiB of JSON in {} pages; initial list {:.0} ms; RSS before {:.1} MiB, peak {:.1} MiB (+{:.1} MiB)",
        listed.load(Ordering::Relaxed) as f64 / 1048576.0,
        total.div_ceil(500),
        elapsed.as_secs_f64() * 1000.0,
        rss_before as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(rss_before) as f64 / 1024.0,
    );
    Ok(())
}
