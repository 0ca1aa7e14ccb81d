//! The webhook under test: `marin3r_webhook::serve` on 127.0.0.1 port 0 (HTTPS, probes
//! and metrics), in the current runtime, fed a realistic Pod AdmissionReview.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use marin3r_sidecar::Defaults;

/// A running webhook; stopped (and its task aborted) on drop.
pub struct WebhookServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<(), marin3r_webhook::Error>>,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

impl WebhookServer {
    /// Starts the webhook with the certificate and key files and waits for `/readyz`.
    pub async fn start(cert: &Path, key: &Path) -> Result<Self> {
        let https = std::net::TcpListener::bind("127.0.0.1:0")?;
        https.set_nonblocking(true)?;
        let probes = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = https.local_addr()?;
        let health = probes.local_addr()?;
        let config = marin3r_webhook::Config {
            webhook_addr: addr,
            tls: marin3r_certs::ServingFiles::pair(cert, key),
            health_addr: health,
            metrics_addr: metrics.local_addr()?,
            defaults: Defaults::default(),
        };
        let listeners = marin3r_webhook::Listeners {
            https,
            probes,
            metrics,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(marin3r_webhook::serve(config, listeners, async move {
            let _ = stopped.await;
        }));
        let server = Self {
            addr,
            stop: Some(stop),
            task,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if server.task.is_finished() {
                bail!("the webhook stopped while starting");
            }
            if let Ok(r) = marin3r_tests::xds::get(health, "/readyz").await
                && r.status == 200
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                bail!("the webhook was not ready within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A realistic Pod (also used by `bench/benches/cores.rs`): two app containers with env,
/// probes and mounts, the kuard walkthrough annotations plus shutdown manager and
/// resources.
pub fn realistic_pod() -> Value {
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

/// The AdmissionReview v1 the API server sends for a `CREATE` of [`realistic_pod`] (with
/// the request fields a real API server fills in).
pub fn realistic_review() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "6f1e2b8c-5a1d-4a7e-9d1c-1b2e3f4a5b6c",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": realistic_pod(),
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Checks that `body` is an AdmissionReview allowing the Pod with a JSON patch (a real
/// injection, not a skip or a denial).
pub fn check_injected(body: &[u8]) -> Result<()> {
    let v: Value = serde_json::from_slice(body).context("the answer is not JSON")?;
    let response = v
        .get("response")
        .ok_or_else(|| anyhow!("the answer has no response: {v}"))?;
    if response.get("allowed") != Some(&Value::Bool(true)) {
        bail!("the Pod was not allowed: {response}");
    }
    if response.get("patchType").and_then(Value::as_str) != Some("JSONPatch")
        || response.get("patch").and_then(Value::as_str).is_none()
    {
        bail!("no JSON patch in the answer (not injected): {response}");
    }
    Ok(())
}
