//! A discovery service with several replicas in one test process (`docs/ha.md` §7): one
//! stateful fake API server ([`marin3r_testkit::apiserver`]), each replica a real
//! discovery service in Kubernetes mode with `--leader-elect` ([`InProcess`] with a
//! `KubernetesBackend::with_ha`) on its own ADS port, and a TCP balancer standing in for
//! the Service (Envoys dial it; it routes each new connection to a live replica, as
//! kube-proxy does). The test keeps the Service's EndpointSlice and the replicas' Pods in
//! the fake API server as Kubernetes would (the Pods running, selected by the Service, each
//! reachable through `pods/portforward`): a replica is a ready endpoint once it serves,
//! terminating while it drains, and gone (with its Pod, whose garbage collection removes
//! its report) once it stopped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use marin3r_certs::Bundle;
use marin3r_control_plane::kubernetes::KubernetesBackend;
use marin3r_control_plane::kubernetes::ha::HaConfig;
use marin3r_testkit::apiserver::{FakeApiServer, ResourceKind};
use marin3r_testkit::proxy::TcpBalancer;
use marin3r_testkit::wait::poll_ok;
use marin3r_wire::DOMAIN;
use marin3r_xds::AdsConfig;
use serde_json::{Value, json};

use crate::in_process::{CertFiles, InProcess, bind_localhost};
use crate::xds::issue_bundle_for;

/// The namespace of everything.
pub const NS: &str = "default";
/// The DiscoveryService the replicas belong to (Service `marin3r-<DS>`).
pub const DS: &str = "discoveryservice";

/// The fake API server with marin3r's kinds registered.
pub fn api_server() -> FakeApiServer {
    let api = FakeApiServer::new();
    for (plural, kind) in [
        ("envoyconfigs", "EnvoyConfig"),
        ("envoyconfigrevisions", "EnvoyConfigRevision"),
        ("discoveryservicereplicas", "DiscoveryServiceReplica"),
    ] {
        api.register(ResourceKind::new(DOMAIN, "v1alpha1", plural, kind).with_status());
    }
    api
}

/// An EnvoyConfig object named `name` in [`NS`] with `spec`.
pub fn envoyconfig(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("{DOMAIN}/v1alpha1"),
        "kind": "EnvoyConfig",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
}

/// The labels of the replicas' Pods (and the Service's selector), as
/// `manifests/discovery-service` sets them.
fn pod_labels() -> Value {
    use marin3r_wire::app_labels::{COMPONENT, MARIN3R, NAME};
    json!({NAME: MARIN3R, COMPONENT: "discoveryservice"})
}

/// How a fleet's replicas run.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// `--nack-threshold`.
    pub threshold: u64,
    /// `--lease-duration` (seconds).
    pub lease_seconds: u64,
    /// `--drain-delay`, `--drain-time`.
    pub drain_delay: Duration,
    pub drain_time: Duration,
    /// How often each replica evaluates the NACK statistics.
    pub evaluate_interval: Duration,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            threshold: 3,
            lease_seconds: 4,
            drain_delay: Duration::from_millis(500),
            drain_time: Duration::from_millis(500),
            evaluate_interval: Duration::from_millis(250),
        }
    }
}

/// One replica: its Pod's name and UID, and the running discovery service.
pub struct Replica {
    pub name: String,
    pub uid: String,
    pub server: InProcess,
    /// Draining (SIGTERM received): its endpoint is terminating.
    pub terminating: bool,
}

/// Several replicas of one discovery service; see the module docs.
pub struct Fleet {
    pub api: FakeApiServer,
    pub balancer: TcpBalancer,
    pub bundle: Bundle,
    pub options: FleetOptions,
    pub replicas: BTreeMap<String, Replica>,
    certs: CertFiles,
    dir: tempfile::TempDir,
    started: usize,
}

impl Fleet {
    /// `replicas` replicas (named `ds-0`, `ds-1`, …) behind a balancer, against `api`.
    pub async fn start(
        api: FakeApiServer,
        replicas: usize,
        options: FleetOptions,
    ) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        // The server certificate names the Service too, as the operator's does (what
        // `marin3r status` verifies through a port-forward).
        let bundle = issue_bundle_for(&[&marin3r_wire::object_names::discovery_service(DS)])?;
        let certs_dir = dir.path().join("certs");
        bundle
            .write_to(&certs_dir)
            .map_err(|e| format!("write certificates: {e}"))?;
        let mut fleet = Self {
            api,
            balancer: TcpBalancer::start(Vec::new()).await,
            bundle,
            options,
            replicas: BTreeMap::new(),
            certs: CertFiles::in_dir(&certs_dir),
            dir,
            started: 0,
        };
        // The Service, as the manifests ship it: it selects the replicas' Pods.
        let xds = marin3r_wire::ports::XDSS;
        fleet
            .api
            .put(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": marin3r_wire::object_names::discovery_service(DS), "namespace": NS},
                "spec": {"selector": pod_labels(),
                         "ports": [{"name": "discovery", "port": xds, "targetPort": xds}]},
            }))
            .map_err(|e| format!("create the Service: {e:?}"))?;
        for _ in 0..replicas {
            fleet.add_replica().await?;
        }
        Ok(fleet)
    }

    /// Where the Envoys' certificates are (`client/`, `ca/`).
    pub fn certs_dir(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// The Service's address (the balancer).
    pub fn service(&self) -> SocketAddr {
        self.balancer.addr()
    }

    /// Starts one more replica (a new Pod) and waits until it is ready; it then becomes
    /// a ready endpoint of the Service. Returns its name.
    pub async fn add_replica(&mut self) -> Result<String, String> {
        let name = format!("ds-{}", self.started);
        self.started += 1;
        let pod = self
            .api
            .put(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": pod_labels()},
                "spec": {"containers": [{"name": "discovery-service", "image": "marin3r"}]},
                "status": {"phase": "Running"},
            }))
            .map_err(|e| format!("create pod {name}: {e:?}"))?;
        let uid = pod["metadata"]["uid"]
            .as_str()
            .ok_or("the pod has no uid")?
            .to_string();
        let o = &self.options;
        // The client every process uses: each request and watch bounded
        // (`marin3r_kube::client`).
        let client = marin3r_kube::client::bounded(self.api.service(), NS);
        let backend = KubernetesBackend::new(client, NS, o.threshold)
            .with_evaluate_interval(o.evaluate_interval)
            .with_ha(HaConfig::new(
                DS,
                NS,
                &name,
                Some(uid.clone()),
                o.lease_seconds,
            ));
        let ads = AdsConfig {
            drain_delay: o.drain_delay,
            drain_time: o.drain_time,
            ..AdsConfig::default()
        };
        let server = InProcess::launch(bind_localhost().await?, &self.certs, ads, backend).await?;
        // `kubectl port-forward pod/<name> 18000` reaches this replica's ADS listener.
        self.api
            .forward_pod_port(NS, &name, marin3r_wire::ports::XDSS, server.xdss);
        let health = server.health;
        self.replicas.insert(
            name.clone(),
            Replica {
                name: name.clone(),
                uid,
                server,
                terminating: false,
            },
        );
        poll_ok(
            format!("replica {name} ready"),
            Duration::from_secs(30),
            marin3r_testkit::wait::POLL,
            || async move {
                let r = crate::xds::get(health, "/readyz").await?;
                if r.status == 200 {
                    Ok(())
                } else {
                    Err(format!("/readyz {}", r.status))
                }
            },
        )
        .await?;
        self.sync_endpoints()?;
        Ok(name)
    }

    /// Writes the Service's EndpointSlice (ready and terminating replicas) and points the
    /// balancer at the ready ones.
    pub fn sync_endpoints(&self) -> Result<(), String> {
        let endpoints: Vec<Value> = self
            .replicas
            .values()
            .map(|r| {
                json!({
                    "addresses": [r.server.xdss.ip().to_string()],
                    "conditions": {"ready": !r.terminating, "serving": true, "terminating": r.terminating},
                    "targetRef": {"kind": "Pod", "name": r.name, "namespace": NS, "uid": r.uid},
                })
            })
            .collect();
        let service = marin3r_wire::object_names::discovery_service(DS);
        self.api
            .put(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{service}-abcde"), "namespace": NS,
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "discovery", "port": 18000, "protocol": "TCP"}],
            }))
            .map_err(|e| format!("write the EndpointSlice: {e:?}"))?;
        self.balancer.set_backends(
            self.replicas
                .values()
                .filter(|r| !r.terminating)
                .map(|r| r.server.xdss)
                .collect(),
        );
        Ok(())
    }

    /// Stops replica `name` as Kubernetes does on a rolling update or a drain: its
    /// endpoint turns terminating and SIGTERM arrives; once it has exited, its Pod (and
    /// with it, by garbage collection, its report) and endpoint are gone.
    pub async fn stop_replica(&mut self, name: &str) -> Result<(), String> {
        let replica = self
            .replicas
            .get_mut(name)
            .ok_or_else(|| format!("no replica {name}"))?;
        replica.terminating = true;
        replica.server.signal_stop();
        self.sync_endpoints()?;
        let replica = self
            .replicas
            .remove(name)
            .ok_or_else(|| format!("no replica {name}"))?;
        replica.server.stop(Duration::from_secs(30)).await?;
        self.remove_pod(name)?;
        self.sync_endpoints()
    }

    /// Kills replica `name` at once (a crash, a lost node): no drain, no farewell; its
    /// endpoint and Pod go away afterwards, as Kubernetes notices.
    pub fn kill_replica(&mut self, name: &str) -> Result<(), String> {
        let replica = self
            .replicas
            .remove(name)
            .ok_or_else(|| format!("no replica {name}"))?;
        drop(replica.server);
        self.sync_endpoints()?;
        self.remove_pod(name)
    }

    fn remove_pod(&self, name: &str) -> Result<(), String> {
        self.api
            .delete("pods", NS, name)
            .map(|_| ())
            .map_err(|e| format!("delete pod {name}: {e:?}"))
    }

    /// The holder of the leader Lease, as the Lease says.
    pub fn lease_holder(&self) -> Option<String> {
        let lease = self.api.get(
            "leases",
            NS,
            &marin3r_wire::object_names::discovery_service_lease(DS),
        )?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_string)
    }

    /// The replica whose `marin3r_ha_leader` says it leads (the one writing).
    pub async fn leader(&self) -> Option<String> {
        for r in self.replicas.values() {
            let text = crate::xds::get(r.server.metrics, "/metrics")
                .await
                .ok()?
                .body;
            if text.lines().any(|l| l.trim() == "marin3r_ha_leader 1") {
                return Some(r.name.clone());
            }
        }
        None
    }

    /// Waits until one replica leads; returns it.
    pub async fn wait_leader(&self, within: Duration) -> Result<String, String> {
        poll_ok(
            "a replica leads",
            within,
            marin3r_testkit::wait::POLL,
            || async { self.leader().await.ok_or("no leader yet") },
        )
        .await
    }

    /// The EnvoyConfig `name`.
    pub fn envoyconfig(&self, name: &str) -> Option<Value> {
        self.api.get("envoyconfigs", NS, name)
    }

    /// Every EnvoyConfigRevision.
    pub fn revisions(&self) -> Vec<Value> {
        self.api.list("envoyconfigrevisions")
    }

    /// Every report (DiscoveryServiceReplica).
    pub fn reports(&self) -> Vec<Value> {
        self.api.list("discoveryservicereplicas")
    }
}

impl Fleet {
    /// The sum of `metric` with `labels` over every live replica's `/metrics`.
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let mut sum = 0.0;
        for r in self.replicas.values() {
            if let Ok(m) = crate::xds::get(r.server.metrics, "/metrics").await {
                sum += crate::xds::metric_sum(&m.body, metric, labels);
            }
        }
        sum
    }

    /// Open ADS streams of `node_id` on each live replica.
    pub async fn streams(&self, node_id: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for r in self.replicas.values() {
            let text = crate::xds::get(r.server.metrics, "/metrics")
                .await
                .map(|m| m.body)
                .unwrap_or_default();
            out.insert(
                r.name.clone(),
                crate::xds::metric_sum(&text, "marin3r_xdss_streams", &[("node_id", node_id)]),
            );
        }
        out
    }

    /// Whether every live replica answers `/readyz` 200.
    pub async fn all_ready(&self) -> Result<(), String> {
        for r in self.replicas.values() {
            let status = crate::xds::get(r.server.health, "/readyz").await?.status;
            if status != 200 {
                return Err(format!("{} /readyz {status}", r.name));
            }
        }
        Ok(())
    }

    /// Applies (creates or replaces) the EnvoyConfig `name` with `spec`, as a user does.
    pub fn apply(&self, name: &str, spec: Value) -> Result<(), String> {
        self.api
            .put(envoyconfig(name, spec))
            .map(|_| ())
            .map_err(|e| format!("apply EnvoyConfig {name}: {e:?}"))
    }
}

/// Requests sent to `GET http://127.0.0.1:<port>/` every few milliseconds while it runs,
/// counting the answers that are not `200 <body>`.
pub struct Traffic {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<TrafficReport>,
}

/// What [`Traffic`] saw.
#[derive(Debug, Clone, Default)]
pub struct TrafficReport {
    pub ok: usize,
    /// Each failed request: what came back instead.
    pub failed: Vec<String>,
}

impl Traffic {
    /// Starts sending; an answer counts as good when its body is one of `bodies` (the
    /// configs the test switches between).
    pub fn start(port: u16, bodies: Vec<String>) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut report = TrafficReport::default();
            let addr = crate::xds::localhost(port);
            loop {
                match crate::xds::get(addr, "/").await {
                    Ok(r) if r.status == 200 && bodies.contains(&r.body) => report.ok += 1,
                    Ok(r) => report.failed.push(format!("{} {:?}", r.status, r.body)),
                    Err(e) => report.failed.push(e),
                }
                tokio::select! {
                    _ = stopped.changed() => return report,
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
        });
        Self { stop, task }
    }

    /// Stops sending; what was seen.
    pub async fn stop(self) -> Result<TrafficReport, String> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|e| format!("the traffic task ended without a report: {e}"))
    }

    /// Stops sending; an error unless every request was answered as expected and some
    /// were sent at all.
    pub async fn stop_all_served(self) -> Result<TrafficReport, String> {
        let report = self.stop().await?;
        if !report.failed.is_empty() || report.ok == 0 {
            return Err(format!(
                "{} failed of {}: {:?}",
                report.failed.len(),
                report.failed.len() + report.ok,
                report.failed
            ));
        }
        Ok(report)
    }
}
