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

criterion_group!(benches, injection, decoding);
criterion_main!(benches);
