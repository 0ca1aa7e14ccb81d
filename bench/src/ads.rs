//! An ADS client swarm: `n` SotW streams, each on its own mTLS connection (tonic, a
//! client certificate from the discovery service's CA), each subscribing to clusters and
//! listeners for one node id and ACKing every response, like an Envoy does. The driver
//! learns every version each stream receives, so it can time how long a config change
//! takes to reach all of them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use marin3r_xds::NodeInfo;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::stats::nearest_rank;

/// The two subscribed types, in the order of a stream's version pair.
pub const TYPE_URLS: [&str; 2] = [
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
];

/// Bound of one connection attempt (TCP + TLS + HTTP/2).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Who the swarm connects to and as whom.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    pub node_id: String,
    pub streams: usize,
    /// Connections being set up at once.
    pub connect_parallelism: usize,
}

enum Event {
    Version {
        stream: usize,
        slot: usize,
        version: Arc<str>,
        at: Instant,
    },
    Failed {
        stream: usize,
        error: String,
    },
}

/// The time a config change took to reach the streams, from the edit.
#[derive(Debug, Clone, Copy)]
pub struct FanOut {
    /// The first stream that had the new cluster and listener versions.
    pub first: Duration,
    /// Half of the streams had them.
    pub median: Duration,
    /// Every stream had them.
    pub all: Duration,
}

/// `n` live ADS streams; their tasks are aborted (connections closed) on drop.
pub struct Swarm {
    n: usize,
    events: mpsc::UnboundedReceiver<Event>,
    versions: Vec<[Option<Arc<str>>; 2]>,
    tasks: JoinSet<()>,
}

fn node(node_id: &str, index: usize) -> Node {
    Node {
        cluster: node_id.to_string(),
        ..NodeInfo {
            id: node_id.to_string(),
            pod_name: format!("{node_id}-pod-{index}"),
        }
        .to_node()
    }
}

async fn stream(
    index: usize,
    endpoint: Endpoint,
    node: Node,
    connecting: Arc<Semaphore>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<()> {
    let channel = {
        let _permit = connecting.acquire().await?;
        endpoint.connect().await.context("connect")?
    };
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let (tx, rx) = mpsc::channel(4);
    for (i, type_url) in TYPE_URLS.iter().enumerate() {
        tx.send(DiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: (*type_url).to_string(),
            ..Default::default()
        })
        .await?;
    }
    let mut inbound = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .context("open the ADS stream")?
        .into_inner();
    while let Some(response) = inbound.message().await.context("ADS stream")? {
        let at = Instant::now();
        let Some(slot) = TYPE_URLS.iter().position(|t| *t == response.type_url) else {
            bail!("unexpected type {}", response.type_url);
        };
        events.send(Event::Version {
            stream: index,
            slot,
            version: response.version_info.as_str().into(),
            at,
        })?;
        // ACK, as Envoy does.
        tx.send(DiscoveryRequest {
            version_info: response.version_info,
            response_nonce: response.nonce,
            type_url: response.type_url,
            ..Default::default()
        })
        .await?;
    }
    bail!("the server closed the stream")
}

impl Swarm {
    /// Starts connecting `config.streams` streams (at most `connect_parallelism` at a
    /// time); [`Swarm::wait_converged`] waits for them.
    pub fn connect(config: &SwarmConfig) -> Result<Self> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&config.ca_pem))
            .identity(Identity::from_pem(
                &config.client_cert_pem,
                &config.client_key_pem,
            ))
            .domain_name("localhost");
        let endpoint = Endpoint::from_shared(format!("https://{}", config.addr))?
            .tls_config(tls)?
            .connect_timeout(CONNECT_TIMEOUT);
        let (tx, events) = mpsc::unbounded_channel();
        let connecting = Arc::new(Semaphore::new(config.connect_parallelism.max(1)));
        let mut tasks = JoinSet::new();
        for i in 0..config.streams {
            let endpoint = endpoint.clone();
            let node = node(&config.node_id, i);
            let connecting = connecting.clone();
            let tx = tx.clone();
            tasks.spawn(async move {
                if let Err(e) = stream(i, endpoint, node, connecting, tx.clone()).await {
                    let _ = tx.send(Event::Failed {
                        stream: i,
                        error: format!("{e:#}"),
                    });
                }
            });
        }
        Ok(Self {
            n: config.streams,
            events,
            versions: vec![[None, None]; config.streams],
            tasks,
        })
    }

    /// Number of streams.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Applies one event; `Err` for a failed stream.
    fn apply(&mut self, event: Event) -> Result<(usize, Instant)> {
        match event {
            Event::Version {
                stream,
                slot,
                version,
                at,
            } => {
                let entry = self
                    .versions
                    .get_mut(stream)
                    .and_then(|v| v.get_mut(slot))
                    .ok_or_else(|| anyhow!("event for unknown stream {stream}"))?;
                *entry = Some(version);
                Ok((stream, at))
            }
            Event::Failed { stream, error } => Err(anyhow!("stream {stream} failed: {error}")),
        }
    }

    async fn next(&mut self, deadline: Instant, what: &str) -> Result<Event> {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.events.recv()).await {
            Ok(Some(e)) => Ok(e),
            Ok(None) => bail!("every stream task is gone"),
            Err(_) => {
                let have = self
                    .versions
                    .iter()
                    .filter(|v| v.iter().all(Option::is_some))
                    .count();
                bail!(
                    "{what}: timed out ({have}/{} streams with both types)",
                    self.n
                )
            }
        }
    }

    /// Waits until every stream has received a cluster and a listener version, all
    /// streams the same ones; returns how long that took from `since`.
    pub async fn wait_converged(&mut self, since: Instant, timeout: Duration) -> Result<Duration> {
        let deadline = Instant::now() + timeout;
        let mut last = since;
        loop {
            if self.common_pair().is_some() {
                return Ok(last.saturating_duration_since(since));
            }
            let event = self.next(deadline, "initial config").await?;
            let (_, at) = self.apply(event)?;
            last = last.max(at);
        }
    }

    /// The version pair every stream has, if they all have the same complete one.
    fn common_pair(&self) -> Option<[Arc<str>; 2]> {
        let first = self.versions.first()?;
        let pair = [first[0].clone()?, first[1].clone()?];
        self.versions
            .iter()
            .all(|v| v[0].as_ref() == Some(&pair[0]) && v[1].as_ref() == Some(&pair[1]))
            .then_some(pair)
    }

    /// Runs `edit` (a config change that must change both the cluster and the listener
    /// version) and times how long until every stream had both new versions.
    pub async fn measure_change(
        &mut self,
        edit: impl FnOnce() -> Result<()>,
        timeout: Duration,
    ) -> Result<FanOut> {
        let before = self
            .common_pair()
            .ok_or_else(|| anyhow!("the streams do not agree on a version before the edit"))?;
        // Nothing should be in flight; drain anything that is.
        while let Ok(event) = self.events.try_recv() {
            self.apply(event)?;
        }
        edit()?;
        let edited = Instant::now();
        let deadline = edited + timeout;
        let mut done: Vec<Option<Instant>> = vec![None; self.n];
        let mut pending = self.n;
        while pending > 0 {
            let event = self.next(deadline, "config change").await?;
            let (stream, at) = self.apply(event)?;
            let v = &self.versions[stream];
            let changed = v[0].as_ref().is_some_and(|x| *x != before[0])
                && v[1].as_ref().is_some_and(|x| *x != before[1]);
            if changed && done[stream].is_none() {
                done[stream] = Some(at);
                pending -= 1;
            }
        }
        let mut times: Vec<Duration> = done
            .into_iter()
            .flatten()
            .map(|t| t.saturating_duration_since(edited))
            .collect();
        times.sort_unstable();
        Ok(FanOut {
            first: times.first().copied().unwrap_or_default(),
            median: nearest_rank(&times, 50.0).unwrap_or_default(),
            all: times.last().copied().unwrap_or_default(),
        })
    }

    /// Closes every stream.
    pub async fn shutdown(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// The header of an EnvoyConfig for `node_id`, up to its `resources:` list.
fn envoy_config_head(node_id: &str) -> String {
    format!(
        "apiVersion: marin3r.3scale.net/v1alpha1\nkind: EnvoyConfig\nmetadata:\n  name: {node_id}\n  namespace: default\nspec:\n  nodeID: {node_id}\n  envoyAPI: v3\n  resources:\n"
    )
}

/// A `resources` entry pair: cluster `cluster` with one endpoint on `endpoint_port`, and
/// listener `listener` on `listen_port` answering `body` to every request.
fn cluster_and_listener(
    cluster: &str,
    endpoint_port: u32,
    listener: &str,
    listen_port: u32,
    body: &str,
) -> String {
    format!(
        r#"    - type: cluster
      value:
        name: {cluster}
        connect_timeout: 1s
        type: STATIC
        load_assignment:
          cluster_name: {cluster}
          endpoints:
            - lb_endpoints:
                - endpoint:
                    address:
                      socket_address: {{address: 127.0.0.1, port_value: {endpoint_port}}}
    - type: listener
      value:
        name: {listener}
        address:
          socket_address: {{address: 127.0.0.1, port_value: {listen_port}}}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: {listener}
                  route_config:
                    name: {listener}-route
                    virtual_hosts:
                      - name: any
                        domains: ["*"]
                        routes:
                          - match: {{prefix: "/"}}
                            direct_response: {{status: 200, body: {{inline_string: "{body}\n"}}}}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// An EnvoyConfig for `node_id` with one cluster and one direct-response listener;
/// `revision` changes both (the cluster's endpoint port and the listener's body).
pub fn swarm_config_yaml(node_id: &str, revision: u32) -> String {
    let port = 20000 + revision % 20000;
    envoy_config_head(node_id)
        + &cluster_and_listener(
            "backend",
            port,
            "http",
            8080,
            &format!("revision {revision}"),
        )
}

/// An EnvoyConfig for `node_id` with `n` clusters and `n` direct-response listeners (the
/// fleet beside the edited EnvoyConfig in the "other EnvoyConfigs" scaling table).
pub fn fleet_config_yaml(node_id: &str, n: usize) -> String {
    let mut out = envoy_config_head(node_id);
    for i in 0..n {
        let port = 30000 + i as u32;
        out.push_str(&cluster_and_listener(
            &format!("backend-{i}"),
            port,
            &format!("http-{i}"),
            port,
            &format!("{node_id} {i}"),
        ));
    }
    out
}
