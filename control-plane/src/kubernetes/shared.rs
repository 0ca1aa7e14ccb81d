//! What the two reconcilers, the triggers and the periodic judgement share: the watch
//! caches, the revision groups, the writer, the xDS cache and what this replica serves
//! each node; and the cache operations on them (publish a snapshot, forget a node, the
//! start-up load).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt as _};

use super::coalesce::{self, Coalescer};
use super::group::{GroupIndex, GroupKey};
use super::ha::{self, Ha, ServedNodes};
use super::plan;
use super::source::{SliceIndex, StoreSource};
use super::writer::Writer;
use crate::fleet::Served;
use crate::publisher;
use marin3r_envoyconfig::discoveryservicereplica::NodeDigest;
use marin3r_envoyconfig::envoyconfig::EnvoyConfig;
use marin3r_envoyconfig::envoyconfigrevision::EnvoyConfigRevision;
use marin3r_envoyconfig::memo::DecodeMemo;
use marin3r_kube::Lenient;
use marin3r_kube::lease::Leadership;
use marin3r_xds::ResourceType;
use marin3r_xds::snapshot::Snapshot;

/// What the reconcilers read and write.
pub struct Shared {
    /// Reads not served by the caches (the owner of a revision being finalized).
    pub client: Client,
    /// Every write, gated on the Lease ([`Writer`]).
    pub writer: Writer,
    pub configs: Store<Lenient<EnvoyConfig>>,
    pub revisions: Store<Lenient<EnvoyConfigRevision>>,
    /// The revisions by group (EnvoyConfig), fed by the revision watch: every election
    /// reads its [`Group`]s.
    pub groups: GroupIndex,
    pub secrets: Store<Secret>,
    /// The EndpointSlice watch cache, by namespace.
    pub slices: SliceIndex,
    /// The xDS snapshot cache and ACK/NACK statistics.
    pub xds: crate::Context,
    /// `--nack-threshold`.
    pub nack_threshold: u64,
    /// Serialises "is it still elected? then set the cache", so a reconcile that read an
    /// older state cannot overwrite a newer revision's snapshot.
    pub(super) publish_lock: tokio::sync::Mutex<()>,
    /// What this replica serves each node (the revisions of the cache's snapshots):
    /// what "newly served" means for the NACK counts, and the source of its digests.
    pub served: ServedNodes,
    /// One of several replicas: the leadership writes are gated on, and the fleet's
    /// reports. `None`: a single replica, which always writes.
    pub ha: Option<Arc<Ha>>,
    /// The revisions' status writes per EnvoyConfig (namespace, UID): a re-publication
    /// within the same revision is written at most once per [`coalesce::STATUS_WINDOW`].
    pub(super) status_writes: std::sync::Mutex<Coalescer<GroupKey>>,
    /// How many times a reconcile resolved a revision's spec ([`Shared::resolutions`]).
    pub(super) resolutions: std::sync::atomic::AtomicU64,
    /// The resources decoded from the specs' own text, for every resolution of this
    /// backend ([`publisher::resolution`]).
    pub(super) memo: DecodeMemo,
}

impl Shared {
    pub fn new(
        client: Client,
        configs: Store<Lenient<EnvoyConfig>>,
        revisions: Store<Lenient<EnvoyConfigRevision>>,
        secrets: Store<Secret>,
        slices: SliceIndex,
        xds: crate::Context,
        nack_threshold: u64,
    ) -> Self {
        Self {
            writer: Writer::new(client.clone(), Leadership::always()),
            client,
            configs,
            groups: GroupIndex::new(revisions.clone()),
            revisions,
            secrets,
            slices,
            xds,
            nack_threshold,
            publish_lock: tokio::sync::Mutex::new(()),
            served: ServedNodes::default(),
            ha: None,
            status_writes: std::sync::Mutex::new(Coalescer::new(coalesce::STATUS_WINDOW)),
            resolutions: std::sync::atomic::AtomicU64::new(0),
            memo: DecodeMemo::new(),
        }
    }

    /// One of several replicas (`docs/ha.md`): writes only while it leads, and judges
    /// NACKs over the fleet.
    /// Writes only while `leadership` is current (what [`Shared::with_ha`] sets from
    /// the Lease election; a single replica always writes).
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.writer = Writer::new(self.client.clone(), leadership);
        self
    }

    /// Reads the revision groups from `groups` (another `Shared` over the same caches;
    /// [`Shared::new`] starts an empty index fed by the caller's revision events).
    pub fn with_groups(mut self, groups: GroupIndex) -> Self {
        self.groups = groups;
        self
    }

    pub fn with_ha(mut self, ha: Arc<Ha>) -> Self {
        self = self.with_leadership(ha.leadership.clone());
        self.ha = Some(ha);
        self
    }

    /// How many times the revision reconciles resolved a spec (Secrets and
    /// EndpointSlices read, resources decoded): for tests and profiles.
    pub fn resolutions(&self) -> u64 {
        self.resolutions.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This replica's digest of every node it serves or has streams for.
    pub fn digests(&self) -> Vec<NodeDigest> {
        let configs = self.configs.state();
        let claimed: std::collections::BTreeSet<&str> = configs
            .iter()
            .filter_map(|c| c.valid().ok())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| c.spec.node_id.as_str())
            .collect();
        ha::digests(
            &self.served.snapshot(),
            &self.xds.stats,
            self.nack_threshold,
            |node| claimed.contains(node),
        )
    }

    /// The EnvoyConfig that controls `ecr` ([`plan::owner`]), looked up by name in the
    /// cache; `None` when it is not cached (yet), malformed, or another object of that
    /// name.
    pub(super) fn owner_config(
        &self,
        ecr: &EnvoyConfigRevision,
    ) -> Option<Arc<Lenient<EnvoyConfig>>> {
        let owner = plan::owner(&ecr.metadata)?;
        let namespace = ecr.metadata.namespace.as_deref()?;
        let config = self
            .configs
            .get(&ObjectRef::new(&owner.name).within(namespace))?;
        let uid = config.valid().ok()?.metadata.uid.as_deref();
        (uid == Some(owner.uid.as_str())).then_some(config)
    }

    /// Another live EnvoyConfig that holds `ec`'s node id ([`publisher::node_owners`]:
    /// the first by namespace/name, as in local mode).
    pub(super) fn node_claimed_by_other(&self, ec: &EnvoyConfig) -> Option<String> {
        let key = |c: &EnvoyConfig| (c.namespace().unwrap_or_default(), c.name_any());
        let configs = self.configs.state();
        let live: Vec<((String, String), &str)> = configs
            .iter()
            .filter_map(|c| c.valid().ok())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter(|c| c.spec.node_id == ec.spec.node_id)
            .map(|c| (key(c), c.spec.node_id.as_str()))
            .collect();
        let owner = publisher::node_owner(live.iter().map(|(k, n)| (k, *n)), &ec.spec.node_id)?;
        (*owner != key(ec)).then(|| format!("{}/{}", owner.0, owner.1))
    }
}

/// A lock that a panic elsewhere does not poison for good.
pub(super) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Stores `snapshot` (with `versions`) for the node of `ecr` and records what is served.
/// The NACK counts of those versions start afresh when the revision becomes the served
/// one (`reset_nacks`, from the publisher), and when the revision served is published
/// anew (its `lastPublishedAt` changed: another replica led an episode this one missed).
pub(super) fn set_snapshot(
    ctx: &Shared,
    ecr: &EnvoyConfigRevision,
    snapshot: Snapshot,
    versions: BTreeMap<ResourceType, String>,
    reset_nacks: bool,
) {
    let node_id = &ecr.spec.node_id;
    let served = Served {
        uid: ecr.metadata.uid.clone().unwrap_or_default(),
        name: ecr.name_any(),
        version: ecr.spec.version.clone(),
        epoch: ecr
            .status
            .as_ref()
            .and_then(|s| s.last_published_at.clone()),
        versions,
    };
    let before = ctx.served.set(node_id, served.clone());
    let republished = before
        .as_ref()
        .is_some_and(|b| b.uid == served.uid && b.epoch.is_some() && b.epoch != served.epoch);
    if reset_nacks || republished {
        for (t, v) in &served.versions {
            ctx.xds.stats.reset_version(node_id, *t, v);
        }
    }
    if ctx.xds.cache.set(node_id, snapshot) {
        tracing::info!(node_id, revision = served.name, "published snapshot");
    }
}

/// Forgets the nodes no live EnvoyConfig configures any more (their EnvoyConfig was
/// deleted, or its nodeID changed): their snapshot, what is served and their NACK
/// counts. Level-triggered (every evaluation), on every replica: the revisions'
/// finalizer does the same on the leader at once. Connected Envoys keep their config
/// (see [`marin3r_xds::SnapshotCache::remove`]).
pub fn forget_unclaimed_nodes(ctx: &Shared) {
    let configs = ctx.configs.state();
    let live: Vec<&EnvoyConfig> = configs
        .iter()
        .filter_map(|c| c.valid().ok())
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    let claimed: std::collections::BTreeSet<&str> =
        live.iter().map(|c| c.spec.node_id.as_str()).collect();
    // Every tick: one set of the live EnvoyConfigs, not a scan of them per key shown.
    let names: std::collections::BTreeSet<(&str, &str)> = live
        .iter()
        .filter_map(|c| {
            Some((
                c.metadata.namespace.as_deref()?,
                c.metadata.name.as_deref()?,
            ))
        })
        .collect();
    ctx.xds
        .revisions
        .retain(|namespace, name| names.contains(&(namespace, name)));
    for node_id in ctx.served.snapshot().into_keys() {
        if !claimed.contains(node_id.as_str()) {
            forget_node(ctx, &node_id, None);
        }
    }
    if let Some(ha) = &ctx.ha {
        ha.retain_nodes(|node_id| claimed.contains(node_id));
    }
}

pub(super) fn forget_node(ctx: &Shared, node_id: &str, revision: Option<&str>) {
    if ctx.xds.cache.remove(node_id) {
        tracing::info!(
            node_id,
            revision,
            "EnvoyConfig removed; node no longer configured"
        );
    }
    ctx.served.remove(node_id);
    ctx.xds.stats.clear_node(node_id);
    ctx.xds.revisions.forget_node(node_id);
}

/// Loads the elected, already published revisions into the cache without writing
/// anything (the discovery service's start: Envoys that reconnect get their config at
/// once instead of an empty one). Returns how many nodes were loaded.
pub fn warm_start(ctx: &Shared) -> usize {
    let mut loaded = 0;
    for (namespace, uid) in ctx.groups.keys(None) {
        let group = ctx.groups.group(&namespace, &uid);
        let Some(ecr) = group.elected() else { continue };
        let published = ecr
            .status
            .as_ref()
            .is_some_and(|s| s.is_published() && !s.is_tainted());
        if !published {
            continue;
        }
        match ctx.owner_config(ecr).as_deref().map(Lenient::valid) {
            Some(Ok(owner)) if ctx.node_claimed_by_other(owner).is_none() => {}
            _ => continue,
        }
        let source = StoreSource {
            namespace: &namespace,
            secrets: &ctx.secrets,
            slices: &ctx.slices,
        };
        match publisher::resolution(&ecr.spec.config_spec(), &source, &ctx.memo) {
            publisher::Resolution::Ready(snapshot) => {
                let versions = snapshot.versions();
                set_snapshot(ctx, ecr, *snapshot, versions, false);
                loaded += 1;
            }
            publisher::Resolution::Invalid(message) | publisher::Resolution::Waiting(message) => {
                tracing::warn!(
                    namespace,
                    revision = ecr.name_any(),
                    node_id = ecr.spec.node_id,
                    message,
                    "cannot load the published revision at start"
                );
            }
        }
    }
    loaded
}
