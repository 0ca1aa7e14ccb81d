//! Criterion benches of the CPU-bound cores, on the same fixtures as `marin3r-bench`:
//! `mutate_pod` and the whole AdmissionReview path on the realistic Pod, `resolve` of the
//! 100-resource EnvoyConfig and `decode_resource` of one listener. Same allocator as the
//! `marin3r` binary (mimalloc).
//!
//! `cargo bench -p marin3r-bench --bench cores`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use marin3r_bench::cores::{hundred_resource_spec, listener};
use marin3r_bench::webhook::{realistic_pod, realistic_review};
use marin3r_envoyconfig::decode::decode_resource;
use marin3r_envoyconfig::envoyconfig::{NoSecrets, resolve};
use marin3r_envoyconfig::resource::ResourceType;
use marin3r_sidecar::{Defaults, mutate_pod};
use marin3r_webhook::admission::mutate;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn injection(c: &mut Criterion) {
    let defaults = Defaults::default();
    let pod = realistic_pod();
    c.bench_function("mutate_pod (pure injection)", |b| {
        b.iter(|| mutate_pod(black_box(&pod), Some("default"), &defaults).unwrap())
    });
    let body = serde_json::to_vec(&realistic_review()).unwrap();
    c.bench_function("admission review (parse + plan + patch + encode)", |b| {
        b.iter(|| {
            let (out, _) = mutate(black_box(&body), &defaults).unwrap();
            out.to_json().unwrap()
        })
    });
}

fn decoding(c: &mut Criterion) {
    let spec = hundred_resource_spec().unwrap();
    // Load the registry outside the measurement.
    assert_eq!(resolve(&spec, &NoSecrets).unwrap().len(), 100);
    c.bench_function("resolve 100-resource EnvoyConfig", |b| {
        b.iter(|| resolve(black_box(&spec), &NoSecrets).unwrap())
    });
    let one = listener(0);
    c.bench_function("decode_resource listener (HCM + Router)", |b| {
        b.iter(|| decode_resource(ResourceType::Listener, black_box(&one)).unwrap())
    });
}

/// The ClusterLoadAssignment of a Service with 3 slices of 20 endpoints: built as a typed
/// message (what `generateFromEndpointSlices` does), and the same assignment written as
/// protojson and decoded through the registry (what it did before).
fn endpoints(c: &mut Criterion) {
    use k8s_openapi::api::discovery::v1::{
        Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
    };
    let slices: Vec<EndpointSlice> = (0..3)
        .map(|s| EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(
                (0..20)
                    .map(|e| Endpoint {
                        addresses: vec![format!("10.{s}.0.{e}")],
                        conditions: Some(EndpointConditions {
                            ready: Some(e % 7 != 0),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..Default::default()
            }]),
            ..Default::default()
        })
        .collect();
    let typed =
        marin3r_envoyconfig::endpoints::cluster_load_assignment("svc", "http", &slices).unwrap();
    let json = marin3r_envoyconfig::decode::to_json(&typed).unwrap();
    assert_eq!(
        decode_resource(ResourceType::Endpoint, &json).unwrap(),
        typed
    );
    c.bench_function("cluster_load_assignment 3x20 endpoints (typed)", |b| {
        b.iter(|| {
            marin3r_envoyconfig::endpoints::cluster_load_assignment(
                "svc",
                "http",
                black_box(&slices),
            )
            .unwrap()
        })
    });
    c.bench_function(
        "cluster_load_assignment 3x20 endpoints (protojson + registry decode)",
        |b| b.iter(|| decode_resource(ResourceType::Endpoint, black_box(&json)).unwrap()),
    );
}

criterion_group!(benches, injection, decoding, endpoints);
criterion_main!(benches);
