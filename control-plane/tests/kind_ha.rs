//! A discovery service with several replicas on a real cluster (docs/kind.md, "Several
//! replicas in the cluster"; the model is docs/ha.md). Every test is
//! `#[ignore = "needs cluster"]` and runs against the cluster of the current kubeconfig
//! context, where `manifests/default` is installed and `manifests/discovery-service`
//! (3 replicas) runs in namespace `MARIN3R_HA_NAMESPACE` (default `demo`, the
//! walkthroughs' namespace) under the name `MARIN3R_HA_DISCOVERY_SERVICE` (default
//! `discoveryservice`; a DiscoveryService of the operator with that name works too):
//!
//! ```sh
//! cargo test -p marin3r-control-plane --test kind_ha -- --ignored
//! ```
//!
//! - the replicas: 3 pods, all ready, one DiscoveryServiceReplica each with a fresh
//!   heartbeat, exactly one says it leads, and it is the Lease holder;
//! - each replica's `/metrics` (through the API server's pod proxy): `marin3r_ha_leader`
//!   is 1 on the Lease holder only, and every replica sees every report;
//! - deleting the leader pod (as `kubectl delete pod` does): another replica holds the
//!   Lease within the Lease duration + 5 s of the old leader's last renewal, and an
//!   EnvoyConfig edit afterwards reaches `InSync`;
//! - `ReplicasInSync` is True, "3/3 replicas serve <revision>".
//!
//! The tests create their own EnvoyConfigs (`marin3r-ha-it-*`, node ids
//! `marin3r-rs-ha-it-*`, which no Envoy uses) in that namespace and delete them at the
//! end. They run one at a time, and each first waits for the whole fleet (3 ready pods,
//! their reports, one leader), so their order does not matter: the one that deletes the
//! leader leaves the fleet whole again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fixtures;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use marin3r_control_plane::fleet::FRESHNESS;
use marin3r_control_plane::kubernetes::ha::LEASE_DURATION_SECONDS;
use marin3r_control_plane::kubernetes::plan::revision_name;
use marin3r_control_plane::status::REPLICAS_IN_SYNC;
use marin3r_envoyconfig::discoveryservicereplica::DiscoveryServiceReplica;
use marin3r_envoyconfig::envoyconfig::{CacheState, EnvoyApi, EnvoyConfig};
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_testkit::poll_ok;
use marin3r_wire::object_names;
use serde_json::{Value, json};

/// The replicas of `manifests/discovery-service` (and of a DiscoveryService's default).
const REPLICAS: usize = 3;
/// Time between two looks at the cluster.
const EVERY: Duration = Duration::from_millis(250);
/// How long the fleet may take to be whole again (a replaced pod: scheduling, warm
/// start, readiness, its first report; the old pod's shutdown takes up to 22 s).
const SETTLE: Duration = Duration::from_secs(180);
/// How long an EnvoyConfig change may take to be published and reported.
const CONVERGE: Duration = Duration::from_secs(60);
/// Margin over the Lease duration for a new leader (docs/ha.md §6: the others look again
/// when the last renewal they saw expires, plus up to 1 s).
const TAKEOVER_MARGIN: Duration = Duration::from_secs(5);

/// One test at a time (each has its own runtime; tokio's mutex is not tied to one).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The discovery service under test.
struct Cluster {
    client: Client,
    namespace: String,
    /// `--discovery-service-name`: Deployment and Service `marin3r-<name>`, Lease
    /// `marin3r-<name>-leader`.
    name: String,
}

/// A fleet with every replica in place.
#[derive(Debug)]
struct Whole {
    /// The ready pods, which are also the reports' names.
    pods: BTreeSet<String>,
    /// The replica whose report says it leads, and which holds the Lease.
    leader: String,
    lease: Lease,
}

impl Cluster {
    async fn connect() -> Self {
        let client = Client::try_default()
            .await
            .expect("a kubeconfig whose current context is the cluster (docs/kind.md)");
        Self {
            client,
            namespace: env_or("MARIN3R_HA_NAMESPACE", "demo"),
            name: env_or(
                "MARIN3R_HA_DISCOVERY_SERVICE",
                object_names::DEFAULT_DISCOVERY_SERVICE,
            ),
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The Deployment and Service of the discovery service.
    fn service(&self) -> String {
        object_names::discovery_service(&self.name)
    }

    fn lease_name(&self) -> String {
        object_names::discovery_service_lease(&self.name)
    }

    async fn deployment(&self) -> Deployment {
        self.api::<Deployment>()
            .get(&self.service())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "Deployment {}/{}: {e} (install manifests/discovery-service there, \
                     docs/kind.md; or set MARIN3R_HA_NAMESPACE / MARIN3R_HA_DISCOVERY_SERVICE)",
                    self.namespace,
                    self.service()
                )
            })
    }

    /// The label selector of the discovery service's pods (the Deployment's).
    async fn selector(&self) -> String {
        let labels = self
            .deployment()
            .await
            .spec
            .selector
            .match_labels
            .unwrap_or_default();
        assert!(
            !labels.is_empty(),
            "the Deployment selects its pods by label"
        );
        labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The discovery service's pods, but those that ended (`Failed` or `Succeeded`: e.g.
    /// evicted by the kubelet, which leaves them behind).
    async fn pods(&self, selector: &str) -> Result<Vec<Pod>, String> {
        let pods = self
            .api::<Pod>()
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| format!("listing the pods: {e}"))?;
        Ok(pods
            .items
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Failed" | "Succeeded"))
            })
            .collect())
    }

    async fn lease(&self) -> Result<Lease, String> {
        self.api::<Lease>()
            .get(&self.lease_name())
            .await
            .map_err(|e| format!("Lease {}: {e}", self.lease_name()))
    }

    /// The reports of this discovery service's replicas that are not being deleted.
    async fn reports(&self) -> Result<Vec<DiscoveryServiceReplica>, String> {
        let service = self.service();
        let all = self
            .api::<DiscoveryServiceReplica>()
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing the DiscoveryServiceReplicas: {e}"))?;
        Ok(all
            .items
            .into_iter()
            .filter(|r| r.metadata.deletion_timestamp.is_none())
            .filter(|r| r.spec.discovery_service.as_deref() == Some(service.as_str()))
            .collect())
    }

    /// The fleet when it is whole: [`REPLICAS`] pods, all ready and none terminating; one
    /// report per pod and no other, each with a fresh heartbeat; exactly one report says
    /// it leads, and that replica holds the Lease. Otherwise what is not there yet.
    async fn whole(&self, selector: &str) -> Result<Whole, String> {
        let pods = self.pods(selector).await?;
        let terminating: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(ResourceExt::name_any)
            .collect();
        let ready: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
            .map(ResourceExt::name_any)
            .collect();
        if pods.len() != REPLICAS || ready.len() != REPLICAS || !terminating.is_empty() {
            return Err(format!(
                "{} pods, {} ready ({ready:?}), terminating {terminating:?}; want {REPLICAS} ready",
                pods.len(),
                ready.len()
            ));
        }
        let reports = self.reports().await?;
        let reporting: BTreeSet<String> = reports.iter().map(ResourceExt::name_any).collect();
        if reporting != ready {
            return Err(format!(
                "reports of {reporting:?}, ready pods {ready:?}: want one report per pod"
            ));
        }
        let now = SystemTime::now();
        for report in &reports {
            let heartbeat = report
                .status
                .as_ref()
                .and_then(|s| s.heartbeat.as_ref())
                .map(|t| SystemTime::from(t.0));
            let age = heartbeat.map(|h| now.duration_since(h).unwrap_or_default());
            if age.is_none_or(|a| a > FRESHNESS) {
                return Err(format!(
                    "the report of {} is not fresh (heartbeat {age:?} old)",
                    report.name_any()
                ));
            }
        }
        let leaders: Vec<String> = reports
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|s| s.leader))
            .map(ResourceExt::name_any)
            .collect();
        let [leader] = leaders.as_slice() else {
            return Err(format!(
                "reports saying they lead: {leaders:?}; want exactly one"
            ));
        };
        let lease = self.lease().await?;
        let holder = holder(&lease);
        if holder.as_deref() != Some(leader.as_str()) {
            return Err(format!(
                "Lease {} held by {holder:?}, the report of {leader} says it leads",
                self.lease_name()
            ));
        }
        Ok(Whole {
            pods: ready,
            leader: leader.clone(),
            lease,
        })
    }

    /// Waits for [`Cluster::whole`].
    async fn wait_whole(&self) -> Whole {
        let selector = self.selector().await;
        poll_ok("the whole fleet", SETTLE, EVERY, || self.whole(&selector))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `/metrics` of `pod`, through the API server's pod proxy.
    async fn metrics(&self, pod: &Pod) -> Result<String, String> {
        let port = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some("metrics"))
            .map_or(i32::from(marin3r_wire::ports::METRICS), |p| {
                p.container_port
            });
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}:{port}/proxy/metrics",
            self.namespace,
            pod.name_any()
        );
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        self.client
            .request_text(request)
            .await
            .map_err(|e| format!("/metrics of {}: {e}", pod.name_any()))
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

/// The value of the series `series` (name and labels, as exposed) in a Prometheus text
/// exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .and_then(|(_, v)| v.parse().ok())
}

/// An EnvoyConfig of these tests: node `marin3r-rs-ha-it-<suffix>`, no Envoy.
struct TestConfig<'c> {
    cluster: &'c Cluster,
    name: String,
    node: String,
}

impl<'c> TestConfig<'c> {
    /// Deletes what a previous run left (and waits until its revisions are gone), then
    /// creates the EnvoyConfig with a listener on `port`.
    async fn create(cluster: &'c Cluster, suffix: &str, port: u64) -> Self {
        let config = Self {
            cluster,
            name: format!("marin3r-ha-it-{suffix}"),
            node: format!("marin3r-rs-ha-it-{suffix}"),
        };
        let configs = config.configs();
        let _ = configs.delete(&config.name, &DeleteParams::default()).await;
        let revisions: Api<EnvoyConfigRevision> = cluster.api();
        let by_node =
            ListParams::default().labels(&format!("marin3r.3scale.net/node-id={}", config.node));
        let name = &config.name;
        poll_ok(
            "a previous run's EnvoyConfig to go",
            CONVERGE,
            EVERY,
            || {
                let (configs, revisions, by_node) = (&configs, &revisions, &by_node);
                async move {
                    let left = configs.get_opt(name).await.map_err(|e| e.to_string())?;
                    let revisions = revisions.list(by_node).await.map_err(|e| e.to_string())?;
                    if left.is_none() && revisions.items.is_empty() {
                        Ok(())
                    } else {
                        Err(format!(
                            "EnvoyConfig left: {}, revisions left: {}",
                            left.is_some(),
                            revisions.items.len()
                        ))
                    }
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let ec: EnvoyConfig = serde_json::from_value(json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
            "metadata": {"name": config.name}, "spec": config.spec(port)
        }))
        .unwrap();
        configs
            .create(&PostParams::default(), &ec)
            .await
            .unwrap_or_else(|e| panic!("creating EnvoyConfig {}: {e}", config.name));
        config
    }

    fn configs(&self) -> Api<EnvoyConfig> {
        self.cluster.api()
    }

    fn spec(&self, port: u64) -> Value {
        let mut spec = fixtures::spec(port);
        spec["nodeID"] = json!(self.node);
        spec
    }

    fn version(&self, port: u64) -> String {
        fixtures::version_of(&self.spec(port))
    }

    /// The name of the revision of the spec with a listener on `port`.
    fn revision(&self, port: u64) -> String {
        revision_name(&self.node, EnvoyApi::V3, &self.version(port))
    }

    /// Edits the spec: the listener moves to `port`.
    async fn set_port(&self, port: u64) {
        self.configs()
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": self.spec(port)})),
            )
            .await
            .unwrap_or_else(|e| panic!("editing EnvoyConfig {}: {e}", self.name));
    }

    /// Waits until the spec with a listener on `port` is desired and published, the
    /// state `InSync` and `CacheOutOfSync` False.
    async fn wait_in_sync(&self, port: u64) -> EnvoyConfig {
        let version = self.version(port);
        let configs = self.configs();
        poll_ok(
            format!("EnvoyConfig {} InSync at {version}", self.name),
            CONVERGE,
            EVERY,
            || {
                let (configs, version) = (&configs, &version);
                async move {
                    let ec = configs.get(&self.name).await.map_err(|e| e.to_string())?;
                    let status = ec.status.clone().unwrap_or_default();
                    let synced = status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "CacheOutOfSync" && c.status == "False");
                    if status.desired_version.as_ref() == Some(version)
                        && status.published_version.as_ref() == Some(version)
                        && status.cache_state == Some(CacheState::InSync)
                        && synced
                    {
                        Ok(ec)
                    } else {
                        Err(format!("status {status:?}"))
                    }
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn delete(self) {
        let _ = self
            .configs()
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

/// (a) 3 pods, one report each, exactly one says it leads and it holds the Lease.
#[tokio::test]
#[ignore = "needs cluster"]
async fn three_replicas_one_leader_which_holds_the_lease() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::connect().await;
    let replicas = cluster.deployment().await.spec.replicas;
    assert_eq!(
        replicas,
        i32::try_from(REPLICAS).ok(),
        "Deployment {}: spec.replicas",
        cluster.service()
    );
    let whole = cluster.wait_whole().await;
    assert_eq!(whole.pods.len(), REPLICAS);
    assert!(whole.pods.contains(&whole.leader));
    assert_eq!(holder(&whole.lease).as_deref(), Some(whole.leader.as_str()));
    let duration = whole
        .lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds);
    assert_eq!(
        duration.and_then(|d| u64::try_from(d).ok()),
        Some(LEASE_DURATION_SECONDS),
        "--lease-duration's default"
    );
    println!("replicas {:?}, leader {}", whole.pods, whole.leader);
}

/// Every replica's metrics: `marin3r_ha_leader` is 1 on the Lease holder only, and each
/// replica sees a fresh report of every replica.
#[tokio::test]
#[ignore = "needs cluster"]
async fn the_metrics_name_the_leader_and_every_report() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::connect().await;
    let whole = cluster.wait_whole().await;
    let selector = cluster.selector().await;
    poll_ok("the replicas' metrics", CONVERGE, EVERY, || {
        let (cluster, whole, selector) = (&cluster, &whole, &selector);
        async move {
            let holder = holder(&cluster.lease().await?);
            let pods = cluster.pods(selector).await?;
            let mut leaders = BTreeMap::new();
            for pod in pods.iter().filter(|p| whole.pods.contains(&p.name_any())) {
                let text = cluster.metrics(pod).await?;
                let leads = sample(&text, "marin3r_ha_leader")
                    .ok_or_else(|| format!("{}: no marin3r_ha_leader", pod.name_any()))?;
                leaders.insert(pod.name_any(), leads);
                for replica in &whole.pods {
                    let series = format!("marin3r_ha_report_age_seconds{{replica=\"{replica}\"}}");
                    match sample(&text, &series) {
                        Some(age) if age <= FRESHNESS.as_secs_f64() => {}
                        other => {
                            return Err(format!("{}: {series} is {other:?}", pod.name_any()));
                        }
                    }
                }
            }
            let leading: Vec<&String> = leaders
                .iter()
                .filter(|(_, v)| **v == 1.0)
                .map(|(k, _)| k)
                .collect();
            if leaders.len() == REPLICAS
                && leading.len() == 1
                && holder.as_ref() == Some(leading[0])
            {
                Ok(())
            } else {
                Err(format!(
                    "marin3r_ha_leader per replica {leaders:?}, Lease holder {holder:?}"
                ))
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// (b) Deleting the leader pod (gracefully, as `kubectl delete pod` does): another replica
/// holds the Lease within the Lease duration + 5 s of the old leader's last renewal
/// (docs/ha.md §6), and an EnvoyConfig edit made afterwards reaches InSync.
#[tokio::test]
#[ignore = "needs cluster"]
async fn deleting_the_leader_pod_moves_the_lease_and_edits_still_reach_in_sync() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::connect().await;
    let before = cluster.wait_whole().await;
    let config = TestConfig::create(&cluster, "leader", 8080).await;
    config.wait_in_sync(8080).await;

    let old = before.leader.clone();
    let spec = before.lease.spec.clone().unwrap_or_default();
    let duration = spec
        .lease_duration_seconds
        .and_then(|d| u64::try_from(d).ok())
        .unwrap_or(LEASE_DURATION_SECONDS);
    let mut last_renewal = spec
        .renew_time
        .map(|t| SystemTime::from(t.0))
        .expect("a held Lease has a renewTime");
    cluster
        .api::<Pod>()
        .delete(&old, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting pod {old}: {e}"));
    let deleted = tokio::time::Instant::now();
    // The old leader drains (up to the pod's 30 s grace) and keeps renewing meanwhile;
    // follow the Lease until another replica holds it, keeping its last renewal.
    let deadline = Duration::from_secs(30 + duration) + TAKEOVER_MARGIN;
    let (new, acquired) = loop {
        assert!(
            deleted.elapsed() < deadline,
            "no other replica holds Lease {} {deadline:?} after {old} was deleted",
            cluster.lease_name()
        );
        match cluster.lease().await {
            Ok(lease) => {
                let spec = lease.spec.unwrap_or_default();
                match spec.holder_identity {
                    Some(h) if h == old => {
                        if let Some(renewed) = spec.renew_time {
                            last_renewal = last_renewal.max(SystemTime::from(renewed.0));
                        }
                    }
                    Some(h) => {
                        let acquired = spec
                            .acquire_time
                            .or(spec.renew_time)
                            .map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
                        break (h, acquired);
                    }
                    // Released by the old leader on its way out.
                    None => {}
                }
            }
            Err(e) => eprintln!("{e}; looking again"),
        }
        tokio::time::sleep(EVERY).await;
    };
    let after_renewal = acquired.duration_since(last_renewal).unwrap_or_default();
    println!(
        "{new} holds the Lease {:?} after {old} was deleted, {after_renewal:?} after its last renewal",
        deleted.elapsed()
    );
    assert!(
        after_renewal <= Duration::from_secs(duration) + TAKEOVER_MARGIN,
        "{new} took the Lease {after_renewal:?} after {old}'s last renewal (duration {duration} s)"
    );
    let new_pod = cluster
        .api::<Pod>()
        .get_opt(&new)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the new holder {new} is no pod"));
    assert!(
        new_pod.metadata.deletion_timestamp.is_none(),
        "the new holder {new} is being deleted"
    );

    // The new leader writes: an edit is published and its status reported.
    config.set_port(8081).await;
    config.wait_in_sync(8081).await;

    // Leave the fleet whole for the next test: the replacement pod ready and reporting.
    let whole = cluster.wait_whole().await;
    assert!(!whole.pods.contains(&old), "{old} is gone");
    println!("replicas {:?}, leader {}", whole.pods, whole.leader);
    config.delete().await;
}

/// (c) With the fleet whole, an EnvoyConfig's `ReplicasInSync` is True: "3/3 replicas
/// serve <its revision>".
#[tokio::test]
#[ignore = "needs cluster"]
async fn replicas_in_sync_is_true_with_every_replica() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::connect().await;
    cluster.wait_whole().await;
    let config = TestConfig::create(&cluster, "sync", 8080).await;
    config.wait_in_sync(8080).await;
    let want = format!(
        "{REPLICAS}/{REPLICAS} replicas serve {}",
        config.revision(8080)
    );
    let configs = config.configs();
    poll_ok(
        format!("{REPLICAS_IN_SYNC} True, \"{want}\""),
        CONVERGE,
        EVERY,
        || {
            let (configs, config, want) = (&configs, &config, &want);
            async move {
                let ec = configs.get(&config.name).await.map_err(|e| e.to_string())?;
                let status = ec.status.unwrap_or_default();
                let condition = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == REPLICAS_IN_SYNC)
                    .ok_or("no ReplicasInSync condition yet")?;
                if condition.status == "True"
                    && condition.reason == REPLICAS_IN_SYNC
                    && &condition.message == want
                {
                    Ok(())
                } else {
                    Err(format!(
                        "{} ({}): {}",
                        condition.status, condition.reason, condition.message
                    ))
                }
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    config.delete().await;
}
