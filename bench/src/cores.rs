//! The CPU-bound cores, timed in a loop on one thread: Pod injection (`mutate_pod`), the
//! whole AdmissionReview path, and decoding a 100-resource EnvoyConfig.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};

use marin3r_envoyconfig::envoyconfig::{EnvoyConfigSpec, NoSecrets, resolve};
use marin3r_sidecar::{Defaults, Mutation, mutate_pod};

use crate::webhook::{realistic_pod, realistic_review};

/// Mean time of one call of `f`, calling it for about `run_for` (after one warm-up call).
pub fn time_per_op(run_for: Duration, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    f()?;
    let start = Instant::now();
    let mut calls: u32 = 0;
    loop {
        for _ in 0..16 {
            f()?;
        }
        calls += 16;
        let elapsed = start.elapsed();
        if elapsed >= run_for {
            return Ok(elapsed / calls);
        }
    }
}

/// One run of `mutate_pod` on [`realistic_pod`]: mean time per Pod.
pub fn injection(run_for: Duration) -> Result<Duration> {
    let defaults = Defaults::default();
    let pod = realistic_pod();
    time_per_op(run_for, || {
        match mutate_pod(black_box(&pod), Some("default"), &defaults) {
            Ok(Mutation::Injected(p)) => {
                black_box(p);
                Ok(())
            }
            Ok(other) => bail!("the realistic Pod was not injected: {other:?}"),
            Err(e) => bail!("mutate_pod failed: {e}"),
        }
    })
}

/// One run of the whole AdmissionReview path (parse JSON, plan the injection, build the patch, base64,
/// serialise): mean time per review.
pub fn admission_review(run_for: Duration) -> Result<Duration> {
    let defaults = Defaults::default();
    let body = serde_json::to_vec(&realistic_review())?;
    time_per_op(run_for, || {
        let (out, _) = marin3r_webhook::admission::mutate(black_box(&body), &defaults)
            .map_err(|e| anyhow!("admission: {e}"))?;
        black_box(out.to_json()?);
        Ok(())
    })
}

/// A listener with an HttpConnectionManager (RDS) and the Router filter.
pub fn listener(i: usize) -> Value {
    json!({
        "name": format!("listener-{i}"),
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10000 + i}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("l{i}"),
                "rds": {"route_config_name": format!("route-{i}"), "config_source": {"ads": {}, "resource_api_version": "V3"}},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    })
}

/// A 100-resource EnvoyConfig: 50 clusters, 25 listeners with an
/// HttpConnectionManager + Router, 25 routes.
pub fn hundred_resource_spec() -> Result<EnvoyConfigSpec> {
    let mut resources = Vec::new();
    for i in 0..50 {
        resources.push(json!({"type": "cluster", "value": {
            "name": format!("cluster-{i}"), "connect_timeout": "1s", "type": "STRICT_DNS",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": {"cluster_name": format!("cluster-{i}"), "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}]}]}
        }}));
    }
    for i in 0..25 {
        resources.push(json!({"type": "listener", "value": listener(i)}));
        resources.push(json!({"type": "route", "value": {"name": format!("route-{i}"), "virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": format!("cluster-{i}"), "timeout": "15s"}}]
        }]}}));
    }
    Ok(serde_json::from_value(
        json!({"nodeID": "bench", "resources": resources}),
    )?)
}

/// One run of decoding [`hundred_resource_spec`] (`resolve`, every resource through the
/// type registry): mean time per EnvoyConfig. The registry is loaded before timing.
pub fn decode(run_for: Duration) -> Result<Duration> {
    let spec = hundred_resource_spec()?;
    let n = resolve(&spec, &NoSecrets)
        .map_err(|e| anyhow!("decode: {e:?}"))?
        .len();
    if n != 100 {
        bail!("expected 100 resources, decoded {n}");
    }
    time_per_op(run_for, || {
        black_box(resolve(black_box(&spec), &NoSecrets).map_err(|e| anyhow!("decode: {e:?}"))?);
        Ok(())
    })
}
