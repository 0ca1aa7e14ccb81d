//! An ADS client swarm: `n` SotW streams, each on its own mTLS connection (tonic, a
//! client certificate from the discovery service's CA), each subscribing to clusters and
//! listeners for its node id and answering every response like an Envoy does: an ACK, or
//! a NACK when the swarm's [`Rejection`] says so (with `error_detail` and the version it
//! accepted before; the server paces its re-sends, the stream answers each one). The
//! driver learns every version each stream accepts and every NACK it sends, so it can
//! time how long a config change takes to reach all of them.
//!
//! With [`SwarmConfig::eds`], the streams of a node also subscribe to the
//! ClusterLoadAssignments of its clusters and report each one they receive
//! ([`EdsUpdate`]: when, its [`endpoint_marker`], whether its endpoints changed);
//! [`SwarmConfig::api`] picks SotW or incremental (delta) ADS; [`Swarm::replace`] closes
//! a stream and opens it again as a new pod (pod churn).
//!
//! Streams connect to [`SwarmConfig::targets`] round-robin, skipping an address that
//! refuses (as the test balancer and kube-proxy do). With [`SwarmConfig::reconnect`] a
//! stream that ends connects again with Envoy's backoff ([`reconnect_delay`]) and keeps
//! the versions it accepted, as Envoy keeps its config.

use std::collections::BTreeSet;
use std::hash::BuildHasher as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use marin3r_xds::NodeInfo;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::stats::nearest_rank;

/// The two subscribed types, in the order of a stream's version pair.
pub const TYPE_URLS: [&str; 2] = [
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
];
/// The slot of listeners in a stream's version pair.
pub const LISTENER: usize = 1;
/// ClusterLoadAssignments (subscribed by name, [`SwarmConfig::eds`]).
pub const EDS_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Which ADS flavour the streams speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AdsApi {
    /// State of the world (`StreamAggregatedResources`).
    #[default]
    Sotw,
    /// Incremental (`DeltaAggregatedResources`).
    Delta,
}

/// The marker endpoint address of write `seq` (the churn bench gives each EndpointSlice
/// write a new one): `10.(128 + seq / 65536).(seq / 256 % 256).(seq % 256)`; addresses of
/// other endpoints stay below `10.128.0.0`. [`endpoint_marker`] reads it back.
pub fn marker_ip(seq: u64) -> String {
    let seq = seq.min(MAX_MARKER);
    format!(
        "10.{}.{}.{}",
        128 + (seq >> 16),
        (seq >> 8) & 0xff,
        seq & 0xff
    )
}

/// The highest marker [`marker_ip`] can write.
pub const MAX_MARKER: u64 = (127 << 16) | 0xffff;

/// The highest write marker ([`marker_ip`]) among the endpoints of `cla` (0: none).
pub fn endpoint_marker(cla: &ClusterLoadAssignment) -> u64 {
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
            _ => None,
        })
        .filter_map(|a| match &a.address {
            Some(AddressKind::SocketAddress(sa)) => sa.address.parse::<std::net::Ipv4Addr>().ok(),
            _ => None,
        })
        .filter_map(|ip| {
            let [a, b, c, d] = ip.octets();
            (a == 10 && b >= 128)
                .then(|| (u64::from(b - 128) << 16) | (u64::from(c) << 8) | u64::from(d))
        })
        .max()
        .unwrap_or(0)
}

/// One ClusterLoadAssignment a stream received (and ACKed).
#[derive(Debug, Clone)]
pub struct EdsUpdate {
    pub stream: usize,
    pub cluster: Arc<str>,
    /// Its highest write marker ([`endpoint_marker`]).
    pub marker: u64,
    /// The first one of this cluster on this connection.
    pub initial: bool,
    /// Its endpoints differ from the last one of this cluster on this connection
    /// (always true for the first).
    pub changed: bool,
    pub at: Instant,
}

/// Bound of one connection attempt (TCP + TLS + HTTP/2).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Envoy's ADS reconnect backoff: base and cap ([`reconnect_delay`]).
pub const RECONNECT_BASE: Duration = Duration::from_millis(500);
pub const RECONNECT_CAP: Duration = Duration::from_secs(2);

/// Who the swarm connects to and as whom.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// Where the streams connect, round-robin ([`Swarm::set_targets`] changes them).
    pub targets: Vec<SocketAddr>,
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// Stream `i` is of node `node_ids[i % len]` (pod `<node>-pod-<i>`).
    pub node_ids: Vec<String>,
    pub streams: usize,
    /// Connections being set up at once.
    pub connect_parallelism: usize,
    /// A stream that ends connects again (Envoy's backoff); otherwise it fails the swarm.
    pub reconnect: bool,
    /// Per node id, the clusters whose ClusterLoadAssignments its streams subscribe to
    /// (none: no EDS subscription).
    pub eds: std::collections::BTreeMap<String, Vec<String>>,
    pub api: AdsApi,
}

/// Which responses the streams NACK, as Envoys rejecting a broken resource would;
/// [`Swarm::set_rejection`] changes it while the swarm runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Rejection {
    /// ACK everything.
    #[default]
    None,
    /// NACK `version` of the type in `slot`.
    Version { slot: usize, version: String },
    /// NACK every version of the type in `slot` that the stream has not accepted
    /// before: set from the start, every version after the first; set before an edit,
    /// the edit (a rollback to a version it accepted is accepted again).
    NewVersions { slot: usize },
}

impl Rejection {
    fn rejects(&self, slot: usize, version: &str, accepted: &[Arc<str>]) -> bool {
        match self {
            Rejection::None => false,
            Rejection::Version {
                slot: s,
                version: v,
            } => *s == slot && v == version,
            Rejection::NewVersions { slot: s } => {
                *s == slot && !accepted.is_empty() && !accepted.iter().any(|a| &**a == version)
            }
        }
    }
}

/// One NACK a stream sent.
#[derive(Debug, Clone)]
pub struct Nack {
    pub stream: usize,
    pub slot: usize,
    pub version: Arc<str>,
    /// When it was handed to the connection.
    pub at: Instant,
}

/// What a stream task reports; `generation` tells the tasks of a replaced stream
/// ([`Swarm::replace`]) apart, so the events of a closed one are ignored.
enum Event {
    /// The ADS stream is open on `addr`.
    Connected {
        stream: usize,
        generation: u32,
        addr: SocketAddr,
        at: Instant,
    },
    /// A response was ACKed; `initial`: the first of its type on this connection.
    Version {
        stream: usize,
        generation: u32,
        slot: usize,
        version: Arc<str>,
        initial: bool,
        at: Instant,
    },
    Endpoints {
        generation: u32,
        update: EdsUpdate,
    },
    Nacked(Nack),
    /// The stream ended; it connects again after its backoff.
    Disconnected {
        stream: usize,
        generation: u32,
        at: Instant,
    },
    /// The stream ended and does not reconnect.
    Failed {
        stream: usize,
        generation: u32,
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

/// What a stream knows of its connection.
#[derive(Debug, Clone, Default)]
struct Link {
    /// Where its ADS stream is open (`None` while it is down).
    addr: Option<SocketAddr>,
    /// When its last connection ended.
    down_at: Option<Instant>,
    /// When its ADS stream opened last.
    up_at: Option<Instant>,
    /// The versions accepted on the current connection.
    fresh: [Option<Arc<str>>; 2],
    /// When `fresh` became complete.
    served_at: Option<Instant>,
    /// Reconnect attempts that failed before an ADS stream opened, so far.
    failed: u32,
}

/// Reconnected streams: the time from a moment (a kill) until each one's ADS stream was
/// open again, and until it had accepted both versions again on it.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// When each one saw its connection end; sorted.
    pub down: Vec<Duration>,
    /// Sorted.
    pub reopened: Vec<Duration>,
    /// Sorted.
    pub served: Vec<Duration>,
    /// Per stream, from when it saw its connection end until it was served again;
    /// sorted.
    pub served_after_down: Vec<Duration>,
    /// Streams that lost their connection although they were not on the address that
    /// went away.
    pub others_lost: usize,
}

/// Where streams connect: the live addresses, round-robin, an address that refuses
/// skipped.
struct Targets {
    tls: ClientTlsConfig,
    live: Mutex<Vec<(SocketAddr, Endpoint)>>,
    next: AtomicUsize,
}

impl Targets {
    fn new(tls: ClientTlsConfig, addrs: &[SocketAddr]) -> Result<Self> {
        let targets = Self {
            tls,
            live: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
        };
        targets.set(addrs)?;
        Ok(targets)
    }

    fn set(&self, addrs: &[SocketAddr]) -> Result<()> {
        let endpoints = addrs
            .iter()
            .map(|addr| {
                let endpoint = Endpoint::from_shared(format!("https://{addr}"))?
                    .tls_config(self.tls.clone())?
                    .connect_timeout(CONNECT_TIMEOUT);
                Ok((*addr, endpoint))
            })
            .collect::<Result<Vec<_>>>()?;
        *self.live.lock().unwrap_or_else(PoisonError::into_inner) = endpoints;
        Ok(())
    }

    /// A connection to the next live address that accepts one.
    async fn connect(&self) -> Result<(SocketAddr, Channel)> {
        let live = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = anyhow!("no address to connect to");
        for i in 0..live.len() {
            let Some((addr, endpoint)) = live.get((start + i) % live.len()) else {
                continue;
            };
            match endpoint.connect().await {
                Ok(channel) => return Ok((*addr, channel)),
                Err(e) => last = anyhow::Error::new(e).context(format!("connect {addr}")),
            }
        }
        Err(last)
    }
}

/// Envoy's ADS reconnect delay (`JitteredExponentialBackOffStrategy`, base
/// [`RECONNECT_BASE`], cap [`RECONNECT_CAP`]) before attempt `attempt` (1, 2, …):
/// uniform in `[0, min(base · 2^(attempt-1), cap))`; `random` is any 64-bit value.
pub fn reconnect_delay(attempt: u32, random: u64) -> Duration {
    let base = RECONNECT_BASE.as_millis() as u64;
    let cap = RECONNECT_CAP.as_millis() as u64;
    let ceiling = base
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
        .min(cap);
    Duration::from_millis(random % ceiling.max(1))
}

/// Responses counted over a swarm's life ([`Swarm::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponseCounts {
    /// Cluster and listener responses after the first of their type on a connection.
    pub cds_lds_pushes: u64,
    /// ClusterLoadAssignments after the first of their cluster on a connection.
    pub eds_pushes: u64,
    /// Of those, the ones whose endpoints had not changed (no-op pushes).
    pub eds_noops: u64,
    /// ClusterLoadAssignments that were the first of their cluster on a connection.
    pub eds_initial: u64,
}

/// `n` live ADS streams; their tasks are aborted (connections closed) on drop.
pub struct Swarm {
    n: usize,
    node_ids: Vec<String>,
    /// Per stream: its task's generation ([`Swarm::replace`]) and abort handle.
    generations: Vec<u32>,
    handles: Vec<Option<AbortHandle>>,
    template: StreamTemplate,
    /// ClusterLoadAssignments received since the last [`Swarm::take_eds`].
    eds: Vec<EdsUpdate>,
    counts: ResponseCounts,
    events: mpsc::UnboundedReceiver<Event>,
    /// The versions each stream accepted last (kept over reconnects).
    versions: Vec<[Option<Arc<str>>; 2]>,
    /// When each stream ACKed each type last.
    acked: Vec<[Option<Instant>; 2]>,
    links: Vec<Link>,
    nacks: Vec<Nack>,
    disconnects: usize,
    targets: Arc<Targets>,
    rejection: watch::Sender<Rejection>,
    tasks: JoinSet<()>,
}

/// The pod name of stream `index` of `node_id` in its `generation` (replacements are new
/// pods): `<node>-pod-<index>`, then `<node>-p<generation, 2 digits>-<index>`, of the
/// same length up to generation 99, so that pod churn alone does not grow the
/// discovery service's per-pod metric labels.
pub fn pod_name(node_id: &str, index: usize, generation: u32) -> String {
    if generation == 0 {
        format!("{node_id}-pod-{index}")
    } else {
        format!("{node_id}-p{generation:02}-{index}")
    }
}

fn node(node_id: &str, pod_name: String) -> Node {
    Node {
        cluster: node_id.to_string(),
        ..NodeInfo {
            id: node_id.to_string(),
            pod_name,
        }
        .to_node()
    }
}

/// What every stream task shares.
#[derive(Clone)]
struct StreamTemplate {
    targets: Arc<Targets>,
    connecting: Arc<Semaphore>,
    events: mpsc::UnboundedSender<Event>,
    rejection: watch::Receiver<Rejection>,
    reconnect: bool,
    eds: Arc<std::collections::BTreeMap<String, Vec<String>>>,
    api: AdsApi,
}

/// What one stream task needs.
struct StreamTask {
    index: usize,
    generation: u32,
    node: Node,
    /// The clusters whose ClusterLoadAssignments it subscribes to.
    eds: Vec<String>,
    targets: Arc<Targets>,
    connecting: Arc<Semaphore>,
    events: mpsc::UnboundedSender<Event>,
    rejection: watch::Receiver<Rejection>,
    reconnect: bool,
    api: AdsApi,
}

impl StreamTemplate {
    fn task(&self, index: usize, generation: u32, node_id: &str) -> StreamTask {
        StreamTask {
            index,
            generation,
            node: node(node_id, pod_name(node_id, index, generation)),
            eds: self.eds.get(node_id).cloned().unwrap_or_default(),
            targets: self.targets.clone(),
            connecting: self.connecting.clone(),
            events: self.events.clone(),
            rejection: self.rejection.clone(),
            reconnect: self.reconnect,
            api: self.api,
        }
    }
}

/// What a stream holds of its EDS subscription on the current connection: per cluster,
/// a digest of the last ClusterLoadAssignment.
type HeldEndpoints = std::collections::HashMap<String, u64>;

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// What a stream accepted, per type (the last one is its current version).
type Accepted = [Vec<Arc<str>>; 2];

impl StreamTask {
    async fn run(self) {
        let mut accepted: Accepted = Default::default();
        let mut attempt = 0u32;
        let mut opened = false;
        let seeds = std::hash::RandomState::new();
        loop {
            let Err(error) = match self.api {
                AdsApi::Sotw => self.session(&mut accepted, &mut attempt, &mut opened).await,
                AdsApi::Delta => {
                    self.session_delta(&mut accepted, &mut attempt, &mut opened)
                        .await
                }
            };
            if !self.reconnect {
                let _ = self.events.send(Event::Failed {
                    stream: self.index,
                    generation: self.generation,
                    error: format!("{error:#}"),
                });
                return;
            }
            let down = Event::Disconnected {
                stream: self.index,
                generation: self.generation,
                at: Instant::now(),
            };
            if self.events.send(down).is_err() {
                return;
            }
            attempt = attempt.saturating_add(1);
            let random = seeds.hash_one((self.index, attempt, Instant::now()));
            tokio::time::sleep(reconnect_delay(attempt, random)).await;
        }
    }

    /// One connection's life; returns why it ended. `attempt` is reset by a response
    /// (as Envoy resets its backoff when a message arrives). Until a stream `opened`
    /// once, it connects under the swarm's parallelism limit; its reconnects do not
    /// wait for one another, as separate Envoys do not.
    async fn session(
        &self,
        accepted: &mut Accepted,
        attempt: &mut u32,
        opened: &mut bool,
    ) -> Result<std::convert::Infallible> {
        let (addr, channel) = if *opened {
            self.targets.connect().await?
        } else {
            let _permit = self.connecting.acquire().await?;
            self.targets.connect().await?
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024);
        let (tx, rx) = mpsc::channel(4);
        for (i, type_url) in TYPE_URLS.iter().enumerate() {
            tx.send(DiscoveryRequest {
                node: (i == 0).then(|| self.node.clone()),
                type_url: (*type_url).to_string(),
                version_info: current(accepted, i),
                ..Default::default()
            })
            .await?;
        }
        if !self.eds.is_empty() {
            tx.send(DiscoveryRequest {
                type_url: EDS_TYPE_URL.to_string(),
                resource_names: self.eds.clone(),
                ..Default::default()
            })
            .await?;
        }
        let mut inbound = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .context("open the ADS stream")?
            .into_inner();
        *opened = true;
        self.events.send(Event::Connected {
            stream: self.index,
            generation: self.generation,
            addr,
            at: Instant::now(),
        })?;
        let mut fresh = [false; 2];
        let mut held = HeldEndpoints::new();
        while let Some(response) = inbound.message().await.context("ADS stream")? {
            let at = Instant::now();
            *attempt = 0;
            if response.type_url == EDS_TYPE_URL {
                for any in &response.resources {
                    self.endpoints(&mut held, &any.value, at)?;
                }
                tx.send(DiscoveryRequest {
                    version_info: response.version_info,
                    response_nonce: response.nonce,
                    type_url: response.type_url,
                    resource_names: self.eds.clone(),
                    ..Default::default()
                })
                .await?;
                continue;
            }
            let Some(slot) = TYPE_URLS.iter().position(|t| *t == response.type_url) else {
                bail!("unexpected type {}", response.type_url);
            };
            let version: Arc<str> = response.version_info.as_str().into();
            let kept = accepted.get(slot).map_or(&[][..], Vec::as_slice);
            if self.rejection.borrow().rejects(slot, &version, kept) {
                // As Envoy: the version it still runs, and why it rejected this one.
                tx.send(DiscoveryRequest {
                    version_info: current(accepted, slot),
                    response_nonce: response.nonce,
                    type_url: response.type_url,
                    error_detail: Some(Status {
                        code: 13,
                        message: format!("the bench swarm rejects version {version}"),
                        details: Vec::new(),
                    }),
                    ..Default::default()
                })
                .await?;
                self.events.send(Event::Nacked(Nack {
                    stream: self.index,
                    slot,
                    version,
                    at: Instant::now(),
                }))?;
                continue;
            }
            self.accept(accepted, &mut fresh, slot, version, at)?;
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

    /// Records an accepted version of the type in `slot`.
    fn accept(
        &self,
        accepted: &mut Accepted,
        fresh: &mut [bool; 2],
        slot: usize,
        version: Arc<str>,
        at: Instant,
    ) -> Result<()> {
        if let Some(list) = accepted.get_mut(slot) {
            list.retain(|v| *v != version);
            list.push(version.clone());
        }
        let initial = fresh.get(slot).is_some_and(|seen| !seen);
        if let Some(seen) = fresh.get_mut(slot) {
            *seen = true;
        }
        self.events.send(Event::Version {
            stream: self.index,
            generation: self.generation,
            slot,
            version,
            initial,
            at,
        })?;
        Ok(())
    }

    /// Reports one received ClusterLoadAssignment (`bytes`, protobuf).
    fn endpoints(&self, held: &mut HeldEndpoints, bytes: &[u8], at: Instant) -> Result<()> {
        let cla = <ClusterLoadAssignment as prost::Message>::decode(bytes)
            .context("decode a ClusterLoadAssignment")?;
        let d = digest(bytes);
        let previous = held.insert(cla.cluster_name.clone(), d);
        self.events.send(Event::Endpoints {
            generation: self.generation,
            update: EdsUpdate {
                stream: self.index,
                cluster: cla.cluster_name.as_str().into(),
                marker: endpoint_marker(&cla),
                initial: previous.is_none(),
                changed: previous != Some(d),
                at,
            },
        })?;
        Ok(())
    }

    /// [`StreamTask::session`] over incremental (delta) ADS: clusters and listeners by
    /// wildcard, the ClusterLoadAssignments by name; the type version of a response is
    /// its `system_version_info`.
    async fn session_delta(
        &self,
        accepted: &mut Accepted,
        attempt: &mut u32,
        opened: &mut bool,
    ) -> Result<std::convert::Infallible> {
        let (addr, channel) = if *opened {
            self.targets.connect().await?
        } else {
            let _permit = self.connecting.acquire().await?;
            self.targets.connect().await?
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024);
        let (tx, rx) = mpsc::channel(4);
        for (i, type_url) in TYPE_URLS.iter().enumerate() {
            tx.send(DeltaDiscoveryRequest {
                node: (i == 0).then(|| self.node.clone()),
                type_url: (*type_url).to_string(),
                resource_names_subscribe: vec!["*".to_string()],
                ..Default::default()
            })
            .await?;
        }
        if !self.eds.is_empty() {
            tx.send(DeltaDiscoveryRequest {
                type_url: EDS_TYPE_URL.to_string(),
                resource_names_subscribe: self.eds.clone(),
                ..Default::default()
            })
            .await?;
        }
        let mut inbound = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .context("open the delta ADS stream")?
            .into_inner();
        *opened = true;
        self.events.send(Event::Connected {
            stream: self.index,
            generation: self.generation,
            addr,
            at: Instant::now(),
        })?;
        let mut fresh = [false; 2];
        let mut held = HeldEndpoints::new();
        while let Some(response) = inbound.message().await.context("delta ADS stream")? {
            let at = Instant::now();
            *attempt = 0;
            if response.type_url == EDS_TYPE_URL {
                for r in &response.resources {
                    if let Some(any) = &r.resource {
                        self.endpoints(&mut held, &any.value, at)?;
                    }
                }
                for name in &response.removed_resources {
                    held.remove(name);
                }
                tx.send(DeltaDiscoveryRequest {
                    response_nonce: response.nonce,
                    type_url: response.type_url,
                    ..Default::default()
                })
                .await?;
                continue;
            }
            let Some(slot) = TYPE_URLS.iter().position(|t| *t == response.type_url) else {
                bail!("unexpected type {}", response.type_url);
            };
            let version: Arc<str> = response.system_version_info.as_str().into();
            let kept = accepted.get(slot).map_or(&[][..], Vec::as_slice);
            if self.rejection.borrow().rejects(slot, &version, kept) {
                tx.send(DeltaDiscoveryRequest {
                    response_nonce: response.nonce,
                    type_url: response.type_url,
                    error_detail: Some(Status {
                        code: 13,
                        message: format!("the bench swarm rejects version {version}"),
                        details: Vec::new(),
                    }),
                    ..Default::default()
                })
                .await?;
                self.events.send(Event::Nacked(Nack {
                    stream: self.index,
                    slot,
                    version,
                    at: Instant::now(),
                }))?;
                continue;
            }
            self.accept(accepted, &mut fresh, slot, version, at)?;
            tx.send(DeltaDiscoveryRequest {
                response_nonce: response.nonce,
                type_url: response.type_url,
                ..Default::default()
            })
            .await?;
        }
        bail!("the server closed the delta stream")
    }
}

/// The version a stream runs for `slot` ("" before the first).
fn current(accepted: &Accepted, slot: usize) -> String {
    accepted
        .get(slot)
        .and_then(|l| l.last())
        .map(|v| v.to_string())
        .unwrap_or_default()
}

impl Swarm {
    /// Starts connecting `config.streams` streams (at most `connect_parallelism` at a
    /// time); [`Swarm::wait_converged`] or [`Swarm::wait_configured`] waits for them.
    pub fn connect(config: &SwarmConfig) -> Result<Self> {
        if config.node_ids.is_empty() {
            bail!("the swarm needs a node id");
        }
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&config.ca_pem))
            .identity(Identity::from_pem(
                &config.client_cert_pem,
                &config.client_key_pem,
            ))
            .domain_name("localhost");
        let targets = Arc::new(Targets::new(tls, &config.targets)?);
        let (tx, events) = mpsc::unbounded_channel();
        let (rejection, rejection_rx) = watch::channel(Rejection::None);
        let connecting = Arc::new(Semaphore::new(config.connect_parallelism.max(1)));
        let template = StreamTemplate {
            targets: targets.clone(),
            connecting,
            events: tx,
            rejection: rejection_rx,
            reconnect: config.reconnect,
            eds: Arc::new(config.eds.clone()),
            api: config.api,
        };
        let mut tasks = JoinSet::new();
        let mut handles = Vec::with_capacity(config.streams);
        for i in 0..config.streams {
            let node_id = &config.node_ids[i % config.node_ids.len()];
            handles.push(Some(tasks.spawn(template.task(i, 0, node_id).run())));
        }
        Ok(Self {
            n: config.streams,
            node_ids: config.node_ids.clone(),
            generations: vec![0; config.streams],
            handles,
            template,
            eds: Vec::new(),
            counts: ResponseCounts::default(),
            events,
            versions: vec![[None, None]; config.streams],
            acked: vec![[None, None]; config.streams],
            links: vec![Link::default(); config.streams],
            nacks: Vec::new(),
            disconnects: 0,
            targets,
            rejection,
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

    /// The node id of stream `i`.
    pub fn node_of(&self, i: usize) -> &str {
        self.node_ids
            .get(i % self.node_ids.len().max(1))
            .map_or("", String::as_str)
    }

    /// The streams of `node_id`.
    pub fn streams_of(&self, node_id: &str) -> Vec<usize> {
        (0..self.n)
            .filter(|&i| self.node_of(i) == node_id)
            .collect()
    }

    /// The streams whose ADS stream is open on `addr`.
    pub fn streams_on(&self, addr: SocketAddr) -> Vec<usize> {
        (0..self.n)
            .filter(|&i| self.links.get(i).and_then(|l| l.addr) == Some(addr))
            .collect()
    }

    /// Open streams per address.
    pub fn spread(&self) -> std::collections::BTreeMap<SocketAddr, usize> {
        let mut out = std::collections::BTreeMap::new();
        for addr in self.links.iter().filter_map(|l| l.addr) {
            *out.entry(addr).or_default() += 1;
        }
        out
    }

    /// The version pair each stream accepted last.
    pub fn versions(&self) -> &[[Option<Arc<str>>; 2]] {
        &self.versions
    }

    /// When the last stream ACKed a response of the type in `slot` at or after `since`,
    /// once every stream did.
    pub fn all_acked_since(&self, slot: usize, since: Instant) -> Option<Instant> {
        self.acked
            .iter()
            .map(|a| a.get(slot).copied().flatten().filter(|t| *t >= since))
            .collect::<Option<Vec<Instant>>>()?
            .into_iter()
            .max()
    }

    /// Connections that ended so far (reconnecting swarms).
    pub fn disconnects(&self) -> usize {
        self.disconnects
    }

    /// Reconnect attempts of `streams` that failed before an ADS stream opened, so far.
    pub fn failed_attempts(&self, streams: &[usize]) -> u32 {
        streams
            .iter()
            .filter_map(|&i| self.links.get(i))
            .map(|l| l.failed)
            .sum()
    }

    /// Changes which responses the streams NACK (from their next response on).
    pub fn set_rejection(&self, rejection: Rejection) {
        self.rejection.send_replace(rejection);
    }

    /// Changes where streams connect from now on (open streams stay where they are).
    pub fn set_targets(&self, targets: &[SocketAddr]) -> Result<()> {
        self.targets.set(targets)
    }

    /// The NACKs sent so far (since [`Swarm::clear_nacks`]), in the order the driver
    /// learnt of them.
    pub fn nacks(&self) -> &[Nack] {
        &self.nacks
    }

    pub fn clear_nacks(&mut self) {
        self.nacks.clear();
    }

    /// The pod name stream `i` runs as now.
    pub fn pod_of(&self, i: usize) -> String {
        pod_name(
            self.node_of(i),
            i,
            self.generations.get(i).copied().unwrap_or_default(),
        )
    }

    /// Closes stream `i` and opens it again as a new pod (its next generation, a new
    /// pod name, nothing accepted yet), as a replaced pod's Envoy; returns the old and
    /// the new pod name.
    pub fn replace(&mut self, i: usize) -> Result<(String, String)> {
        let old = self.pod_of(i);
        let handle = self
            .handles
            .get_mut(i)
            .ok_or_else(|| anyhow!("no stream {i}"))?;
        if let Some(h) = handle.take() {
            h.abort();
        }
        let generation = self.generations.get(i).copied().unwrap_or_default() + 1;
        if let Some(g) = self.generations.get_mut(i) {
            *g = generation;
        }
        let node_id = self.node_of(i).to_string();
        let task = self.template.task(i, generation, &node_id);
        let spawned = self.tasks.spawn(task.run());
        if let Some(h) = self.handles.get_mut(i) {
            *h = Some(spawned);
        }
        if let Some(v) = self.versions.get_mut(i) {
            *v = [None, None];
        }
        if let Some(a) = self.acked.get_mut(i) {
            *a = [None, None];
        }
        *self.link(i)? = Link::default();
        // Reap the aborted tasks now and then (a JoinSet keeps them until joined).
        while self.tasks.try_join_next().is_some() {}
        Ok((old, self.pod_of(i)))
    }

    /// The ClusterLoadAssignments received since the last call, in arrival order.
    pub fn take_eds(&mut self) -> Vec<EdsUpdate> {
        std::mem::take(&mut self.eds)
    }

    /// Responses counted so far.
    pub fn counts(&self) -> ResponseCounts {
        self.counts
    }

    /// Streams whose ADS stream is open now.
    pub fn open(&self) -> usize {
        self.links.iter().filter(|l| l.addr.is_some()).count()
    }

    fn current(&self, stream: usize, generation: u32) -> bool {
        self.generations.get(stream) == Some(&generation)
    }

    fn link(&mut self, stream: usize) -> Result<&mut Link> {
        self.links
            .get_mut(stream)
            .ok_or_else(|| anyhow!("event for unknown stream {stream}"))
    }

    /// Applies one event; `Ok(Some((stream, at)))` for an accepted version, `Err` for a
    /// failed stream.
    fn apply(&mut self, event: Event) -> Result<Option<(usize, Instant)>> {
        let generation = match &event {
            Event::Connected { generation, .. }
            | Event::Version { generation, .. }
            | Event::Endpoints { generation, .. }
            | Event::Disconnected { generation, .. }
            | Event::Failed { generation, .. } => Some(*generation),
            Event::Nacked(_) => None,
        };
        let stream = match &event {
            Event::Connected { stream, .. }
            | Event::Version { stream, .. }
            | Event::Disconnected { stream, .. }
            | Event::Failed { stream, .. } => *stream,
            Event::Endpoints { update, .. } => update.stream,
            Event::Nacked(n) => n.stream,
        };
        if generation.is_some_and(|g| !self.current(stream, g)) {
            // From the task of a replaced stream.
            return Ok(None);
        }
        match event {
            Event::Endpoints { update, .. } => {
                if update.initial {
                    self.counts.eds_initial += 1;
                } else {
                    self.counts.eds_pushes += 1;
                    self.counts.eds_noops += u64::from(!update.changed);
                }
                self.eds.push(update);
                Ok(None)
            }
            Event::Version {
                stream,
                slot,
                version,
                initial,
                at,
                ..
            } => {
                self.counts.cds_lds_pushes += u64::from(!initial);
                let entry = self
                    .versions
                    .get_mut(stream)
                    .and_then(|v| v.get_mut(slot))
                    .ok_or_else(|| anyhow!("event for unknown stream {stream}"))?;
                *entry = Some(version.clone());
                if let Some(acked) = self.acked.get_mut(stream).and_then(|a| a.get_mut(slot)) {
                    *acked = Some(at);
                }
                let l = self.link(stream)?;
                if let Some(fresh) = l.fresh.get_mut(slot) {
                    *fresh = Some(version);
                }
                if l.served_at.is_none() && l.fresh.iter().all(Option::is_some) {
                    l.served_at = Some(at);
                }
                Ok(Some((stream, at)))
            }
            Event::Connected {
                stream, addr, at, ..
            } => {
                let l = self.link(stream)?;
                l.addr = Some(addr);
                l.up_at = Some(at);
                Ok(None)
            }
            Event::Nacked(nack) => {
                self.nacks.push(nack);
                Ok(None)
            }
            Event::Disconnected { stream, at, .. } => {
                self.disconnects += 1;
                let link = self.link(stream)?;
                // Down again without having been up: a reconnect attempt failed.
                let failed = u32::from(link.down_at.is_some() && link.up_at.is_none());
                *link = Link {
                    down_at: Some(at),
                    failed: link.failed + failed,
                    ..Link::default()
                };
                Ok(None)
            }
            Event::Failed { stream, error, .. } => Err(anyhow!("stream {stream} failed: {error}")),
        }
    }

    /// Applies every event that has arrived, without waiting.
    pub fn drain(&mut self) -> Result<()> {
        while let Ok(event) = self.events.try_recv() {
            self.apply(event)?;
        }
        Ok(())
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
                let open = self.links.iter().filter(|l| l.addr.is_some()).count();
                bail!(
                    "{what}: timed out ({have}/{} streams with both types, {open} open)",
                    self.n
                )
            }
        }
    }

    /// Waits for events until `done` holds (checked before each one), at most `timeout`.
    pub async fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.drain()?;
            if done(self) {
                return Ok(());
            }
            let event = self.next(deadline, what).await?;
            self.apply(event)?;
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
            if let Some((_, at)) = self.apply(event)? {
                last = last.max(at);
            }
        }
    }

    /// Waits until every stream has both types and the streams of each node agree
    /// (several nodes); returns how long that took from `since`.
    pub async fn wait_configured(&mut self, since: Instant, timeout: Duration) -> Result<Duration> {
        let deadline = Instant::now() + timeout;
        let mut last = since;
        loop {
            if self.every_node_agrees() {
                return Ok(last.saturating_duration_since(since));
            }
            let event = self.next(deadline, "initial config").await?;
            if let Some((_, at)) = self.apply(event)? {
                last = last.max(at);
            }
        }
    }

    fn every_node_agrees(&self) -> bool {
        let mut pairs: std::collections::HashMap<&str, &[Option<Arc<str>>; 2]> =
            std::collections::HashMap::new();
        self.versions.iter().enumerate().all(|(i, v)| {
            v.iter().all(Option::is_some) && *pairs.entry(self.node_of(i)).or_insert(v) == v
        })
    }

    /// The version pair every stream has, if they all have the same complete one.
    fn common_pair(&self) -> Option<[Arc<str>; 2]> {
        Self::common_pair_of(&self.versions, 0..self.n)
    }

    fn common_pair_of(
        versions: &[[Option<Arc<str>>; 2]],
        streams: impl IntoIterator<Item = usize>,
    ) -> Option<[Arc<str>; 2]> {
        let mut streams = streams.into_iter();
        let first = versions.get(streams.next()?)?;
        let pair = [first[0].clone()?, first[1].clone()?];
        streams
            .all(|i| {
                versions.get(i).is_some_and(|v| {
                    v[0].as_ref() == Some(&pair[0]) && v[1].as_ref() == Some(&pair[1])
                })
            })
            .then_some(pair)
    }

    /// Runs `edit` (a config change that must change both the cluster and the listener
    /// version) and times how long until every stream had both new versions.
    pub async fn measure_change(
        &mut self,
        edit: impl FnOnce() -> Result<()>,
        timeout: Duration,
    ) -> Result<FanOut> {
        let all: Vec<usize> = (0..self.n).collect();
        self.measure_change_of(&all, edit, timeout).await
    }

    /// [`Swarm::measure_change`] for `streams` only (those of one node).
    pub async fn measure_change_of(
        &mut self,
        streams: &[usize],
        edit: impl FnOnce() -> Result<()>,
        timeout: Duration,
    ) -> Result<FanOut> {
        // Nothing should be in flight; drain anything that is.
        self.drain()?;
        let before = Self::common_pair_of(&self.versions, streams.iter().copied())
            .ok_or_else(|| anyhow!("the streams do not agree on a version before the edit"))?;
        edit()?;
        let edited = Instant::now();
        let deadline = edited + timeout;
        let mut done: std::collections::HashMap<usize, Option<Instant>> =
            streams.iter().map(|&i| (i, None)).collect();
        let mut pending = done.len();
        while pending > 0 {
            let event = self.next(deadline, "config change").await?;
            let Some((stream, at)) = self.apply(event)? else {
                continue;
            };
            let v = &self.versions[stream];
            let changed = v[0].as_ref().is_some_and(|x| *x != before[0])
                && v[1].as_ref().is_some_and(|x| *x != before[1]);
            if let Some(slot) = done.get_mut(&stream)
                && changed
                && slot.is_none()
            {
                *slot = Some(at);
                pending -= 1;
            }
        }
        let mut times: Vec<Duration> = done
            .into_values()
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

    /// After the address the streams `victims` were on went away at `since`: waits
    /// until each of them is open again elsewhere and has accepted again the versions
    /// it had (`expected`, per stream), and every other stream is still open.
    pub async fn wait_recovered(
        &mut self,
        victims: &[usize],
        expected: &[[Option<Arc<str>>; 2]],
        since: Instant,
        timeout: Duration,
    ) -> Result<Recovery> {
        let victim_set: BTreeSet<usize> = victims.iter().copied().collect();
        let recovered = |s: &Self, i: usize| {
            s.links.get(i).is_some_and(|l| {
                l.addr.is_some()
                    && l.down_at.is_some_and(|d| d >= since)
                    && l.served_at.is_some()
                    && expected.get(i).is_some_and(|e| *e == l.fresh)
            })
        };
        self.wait_until("every stream served again", timeout, |s| {
            victim_set.iter().all(|&i| recovered(s, i)) && s.links.iter().all(|l| l.addr.is_some())
        })
        .await?;
        let mut out = Recovery::default();
        for &i in &victim_set {
            let Some(l) = self.links.get(i) else { continue };
            let after = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(since));
            out.down.extend(after(l.down_at));
            out.reopened.extend(after(l.up_at));
            out.served.extend(after(l.served_at));
            if let (Some(down), Some(served)) = (l.down_at, l.served_at) {
                out.served_after_down
                    .push(served.saturating_duration_since(down));
            }
        }
        out.others_lost = self
            .links
            .iter()
            .enumerate()
            .filter(|(i, l)| !victim_set.contains(i) && l.up_at.is_some_and(|u| u >= since))
            .count();
        out.down.sort_unstable();
        out.reopened.sort_unstable();
        out.served.sort_unstable();
        out.served_after_down.sort_unstable();
        Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_follow_envoy_s_jittered_backoff() {
        let ms = Duration::from_millis;
        for random in [0, 1, 499, 500, 1_234_567, u64::MAX] {
            assert!(reconnect_delay(1, random) < ms(500));
            assert!(reconnect_delay(2, random) < ms(1000));
            assert!(reconnect_delay(3, random) < ms(2000));
            assert!(reconnect_delay(40, random) < ms(2000), "capped");
        }
        assert_eq!(reconnect_delay(1, 499), ms(499));
        assert_eq!(reconnect_delay(2, 999), ms(999));
        assert_eq!(reconnect_delay(9, 1999), ms(1999));
    }

    #[test]
    fn replaced_pods_keep_the_name_length() {
        let first = pod_name("n", 7, 0);
        assert_eq!(first, "n-pod-7");
        for g in [1, 9, 10, 99] {
            let name = pod_name("n", 7, g);
            assert_eq!(name.len(), first.len(), "{name}");
            assert_ne!(name, first);
        }
        assert_ne!(pod_name("n", 7, 1), pod_name("n", 7, 2));
    }

    #[test]
    fn rejections() {
        let v = |s: &str| -> Arc<str> { s.into() };
        let accepted = [v("a"), v("b")];
        let new = Rejection::NewVersions { slot: LISTENER };
        assert!(new.rejects(LISTENER, "c", &accepted));
        assert!(!new.rejects(LISTENER, "a", &accepted), "accepted before");
        assert!(!new.rejects(0, "c", &accepted), "another type");
        assert!(!new.rejects(LISTENER, "c", &[]), "the first version");
        let one = Rejection::Version {
            slot: LISTENER,
            version: "b".into(),
        };
        assert!(one.rejects(LISTENER, "b", &accepted));
        assert!(!one.rejects(LISTENER, "c", &accepted));
        assert!(!Rejection::None.rejects(LISTENER, "c", &accepted));
    }
}
