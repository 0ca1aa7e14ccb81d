//! The one publisher (design.md §4): what to serve for one EnvoyConfig, which revisions to
//! taint, when to wait and whose NACK counts start afresh — every self-healing rule in
//! one pure function, [`decide`], that both sources apply: local mode
//! ([`crate::local`]) and the Kubernetes controllers ([`crate::kubernetes`]).
//!
//! Inputs: the revisions (oldest → newest, with their taints), the version whose snapshot
//! the cache holds for the node, a way to resolve a revision's spec
//! ([`Resolution`]), and the NACK statistics ([`NackView`]). Outputs ([`Decision`]):
//!
//! - **NACK verdict** ([`served_verdict`], over [`crate::nacks::nack_verdict`]): the
//!   served revision, when it is the published one (topmost untainted), is tainted once
//!   every subscribed Envoy of the node rejected one of the versions it provides at least
//!   `threshold` times; the reason quotes Envoy's own message. Partial rejection never
//!   taints. A caller that already derived it (local mode's evaluate tick) hands it to
//!   [`decide_given`] instead of having it derived again.
//! - **Candidate**: the topmost untainted revision is resolved. Resources that do not
//!   decode (the config's own fault) taint it, and the next one is tried. A Secret or
//!   EndpointSlice that is missing or unusable is **not** a taint: the revision **waits**
//!   (reason naming what is missing), nothing else is published meanwhile, the cache keeps
//!   what it serves, and it is published as soon as the dependency is there.
//! - **Publish**: a revision that becomes the served one (first publication, rollback,
//!   retry after its tainted twin was deleted) starts from fresh NACK counts for every
//!   version it provides; re-publishing the served revision (a Secret rotated) keeps them.
//!   The snapshot's per-type versions are derived once, here ([`Publish::versions`]).
//! - Nothing untainted left: nothing is published; the cache keeps the last good
//!   snapshot (`RollbackFailed`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use marin3r_envoyconfig::envoyconfig::{EnvoyConfigSpec, SecretData, SecretSource, resolve_cached};
use marin3r_envoyconfig::memo::DecodeMemo;
use marin3r_envoyconfig::pem::redact_pem;
use marin3r_envoyconfig::{DecodeError, Resource, ResourceType};
use marin3r_xds::Snapshot;

use crate::nacks::{Taint, TaintCause};
use crate::revisions::{Revision, Revisions};

/// The NACK statistics as the publisher reads them (defined in [`crate::nacks`], the leaf
/// both the publisher and the revision engine use).
pub use crate::nacks::NackView;

/// The RTDS layer every injected Envoy asks for (`init-manager --rtds-resource-name`).
pub const DEFAULT_RTDS_LAYER: &str = "runtime";
/// Resolve errors quoted in a taint or wait reason (the rest are counted).
const MAX_QUOTED_ERRORS: usize = 10;

/// A revision's spec resolved against the Secrets (and EndpointSlices) it reads.
#[derive(Debug)]
pub enum Resolution {
    /// The snapshot to serve (with the default runtime layer; boxed, it is large).
    Ready(Box<Snapshot>),
    /// The resources do not decode: the config's own fault, retrying cannot help (taint).
    Invalid(String),
    /// A Secret or EndpointSlice it needs is missing or not usable yet (wait).
    Waiting(String),
}

/// Whether a resolve error is the config's own fault (taint: retrying cannot help)
/// rather than a Secret or EndpointSlice that is missing or not ready yet (wait: it may
/// appear, e.g. cert-manager issuing the certificate after the EnvoyConfig is applied).
pub fn is_config_error(e: &DecodeError) -> bool {
    match e {
        DecodeError::MissingSecret { .. }
        | DecodeError::MissingSecretKey { .. }
        | DecodeError::SecretType { .. }
        | DecodeError::NeedsKubernetes { .. }
        | DecodeError::Registry(_) => false,
        DecodeError::Invalid { at, .. } => !at.path.contains("generateFromEndpointSlices"),
        // A Kubernetes Secret whose data Envoy would refuse may still be fixed (e.g.
        // cert-manager writing the certificate): wait. Inline data is the config's own.
        DecodeError::TlsMaterial { at, .. } => !at.path.contains("generateFromTlsSecret"),
        _ => true,
    }
}

/// The empty runtime layer named [`DEFAULT_RTDS_LAYER`], decoded once per process (it
/// never changes); `None` if it cannot be decoded (logged once).
static DEFAULT_RUNTIME: LazyLock<Option<Resource>> = LazyLock::new(|| {
    let empty = serde_json::json!({"name": DEFAULT_RTDS_LAYER, "layer": {}});
    marin3r_envoyconfig::decode_resource(ResourceType::Runtime, &empty)
        .inspect_err(|e| tracing::error!(error = %e, "cannot build the default runtime layer"))
        .ok()
});

/// Adds an empty runtime layer named [`DEFAULT_RTDS_LAYER`] unless the config has one:
/// Envoy's RTDS init target waits for that named resource (15 s `initial_fetch_timeout`)
/// before it even asks for clusters and listeners.
pub fn with_default_runtime(mut resources: Vec<Resource>) -> Vec<Resource> {
    let has_layer = resources
        .iter()
        .any(|r| r.kind == ResourceType::Runtime && r.name == DEFAULT_RTDS_LAYER);
    if !has_layer && let Some(layer) = DEFAULT_RUNTIME.as_ref() {
        resources.push(layer.clone());
    }
    resources
}

/// Resolves `spec` with `secrets` into what to serve, or the reason it cannot be served:
/// [`Resolution::Invalid`] when any error is the config's own ([`is_config_error`]),
/// else [`Resolution::Waiting`]. At most `MAX_QUOTED_ERRORS` (10) errors are quoted.
///
/// Every text of a resolution ends up in a log, `/status`, the state file or a
/// revision's status, so it goes through [`redact_pem`] (no PEM block, no long base64
/// run) whatever produced it; decode errors never show a sensitive field's value in the
/// first place (`marin3r_envoyconfig::sensitive`).
///
/// `memo` holds the resources decoded from specs' own text: one per config source (the
/// local engine's, the Kubernetes backend's), handed to every resolution of it, so an
/// EndpointSlice or Secret event re-decodes only what it generates. Bounded, see
/// [`DecodeMemo`].
pub fn resolution(
    spec: &EnvoyConfigSpec,
    secrets: &dyn SecretSource,
    memo: &DecodeMemo,
) -> Resolution {
    match resolve_cached(spec, secrets, memo) {
        Ok(resources) => match Snapshot::new(with_default_runtime(resources)) {
            Ok(snapshot) => Resolution::Ready(Box::new(snapshot)),
            Err(e) => Resolution::Invalid(redact_pem(&e.to_string()).into_owned()),
        },
        Err(errors) => {
            let mut quoted: Vec<String> = errors
                .iter()
                .take(MAX_QUOTED_ERRORS)
                .map(ToString::to_string)
                .collect();
            if errors.len() > MAX_QUOTED_ERRORS {
                quoted.push(format!("and {} more", errors.len() - MAX_QUOTED_ERRORS));
            }
            let text = redact_pem(&quoted.join("; ")).into_owned();
            if errors.iter().any(is_config_error) {
                Resolution::Invalid(text)
            } else {
                Resolution::Waiting(text)
            }
        }
    }
}

/// The taint reason of a revision whose resources do not decode.
pub fn invalid_reason(errors: &str) -> String {
    format!("resources do not decode: {errors}")
}

/// The NACK verdict on what the cache serves for the node: the published (topmost
/// untainted) revision is judged ([`Revision::nack_verdict`]) only while it is the
/// served one (`served`).
pub fn served_verdict(
    revisions: &Revisions,
    served: Option<&str>,
    nacks: &dyn NackView,
    threshold: u64,
) -> Option<Taint> {
    let published = revisions.published()?;
    if served != Some(published.version.as_str()) {
        return None;
    }
    published.nack_verdict(&revisions.node_id, nacks, threshold)
}

/// The revision to serve and its snapshot.
#[derive(Debug)]
pub struct Publish {
    pub version: String,
    pub snapshot: Snapshot,
    /// `snapshot.versions()`, derived once: what the revision now provides, and the
    /// versions whose NACK counts `reset_nacks` resets.
    pub versions: BTreeMap<ResourceType, String>,
    /// It becomes the served revision (or was never published since it was created): the
    /// NACK counts of every version it provides start afresh, so old NACKs (of a deleted
    /// twin, of an earlier push of the same content) do not judge it.
    pub reset_nacks: bool,
}

/// A revision that cannot be served yet: it is kept, untainted, and retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub version: String,
    /// What it waits for (the resolve errors, naming the Secret).
    pub reason: String,
}

/// What [`decide`] decided for one EnvoyConfig.
#[derive(Debug, Default)]
pub struct Decision {
    /// Revisions to taint, in order (rejected by every Envoy, or not decodable).
    pub taints: Vec<Taint>,
    /// What to serve; `None`: the cache keeps what it has (waiting, or nothing untainted).
    pub publish: Option<Publish>,
    /// The elected revision waits for a Secret or EndpointSlice.
    pub waiting: Option<Waiting>,
}

/// Decides what to serve for one EnvoyConfig (see the module docs). `served` is the
/// version whose snapshot the cache holds for its node; `resolve` is called for the
/// candidates only, topmost first.
pub fn decide(
    revisions: &Revisions,
    served: Option<&str>,
    resolve: impl FnMut(&Revision) -> Resolution,
    nacks: &dyn NackView,
    threshold: u64,
) -> Decision {
    let verdict = served_verdict(revisions, served, nacks, threshold);
    decide_given(revisions, served, verdict, resolve)
}

/// [`decide`] with the NACK verdict already derived ([`served_verdict`]), for a caller
/// that needed it to know whether to decide at all (local mode's evaluate tick).
pub fn decide_given(
    revisions: &Revisions,
    served: Option<&str>,
    verdict: Option<Taint>,
    mut resolve: impl FnMut(&Revision) -> Resolution,
) -> Decision {
    let mut decision = Decision {
        taints: verdict.into_iter().collect(),
        ..Decision::default()
    };
    let tainted = |d: &Decision, r: &Revision| {
        r.tainted.is_some() || d.taints.iter().any(|t| t.version == r.version)
    };
    for candidate in revisions.revisions.iter().rev() {
        if tainted(&decision, candidate) {
            continue;
        }
        match resolve(candidate) {
            Resolution::Ready(snapshot) => {
                decision.publish = Some(Publish {
                    version: candidate.version.clone(),
                    versions: snapshot.versions(),
                    snapshot: *snapshot,
                    reset_nacks: candidate.last_published_at.is_none()
                        || served != Some(candidate.version.as_str()),
                });
                break;
            }
            Resolution::Waiting(reason) => {
                decision.waiting = Some(Waiting {
                    version: candidate.version.clone(),
                    reason,
                });
                break;
            }
            Resolution::Invalid(errors) => decision.taints.push(Taint {
                version: candidate.version.clone(),
                reason: invalid_reason(&errors),
                cause: TaintCause::ResourcesFailedToDecode,
            }),
        }
    }
    decision
}

/// Which EnvoyConfig serves each node id when several name the same one: the first by
/// `(namespace, name)` ([`node_owner`]). The others are reported and serve nothing.
pub fn node_owners<'a, K: Ord + Clone + 'a>(
    configs: impl IntoIterator<Item = (&'a K, &'a str)>,
) -> BTreeMap<String, K> {
    let mut owners: BTreeMap<String, K> = BTreeMap::new();
    for (key, node_id) in configs {
        match owners.get_mut(node_id) {
            Some(owner) if !first_owner(key, owner) => {}
            Some(owner) => *owner = key.clone(),
            None => {
                owners.insert(node_id.to_string(), key.clone());
            }
        }
    }
    owners
}

/// The owner [`node_owners`] gives `node_id`, without building the map of every node (a
/// reconcile asks for one node; the churn benchmark's profile had the whole map at 12 %
/// of the discovery service's CPU with 1,000 EnvoyConfigs).
pub fn node_owner<'a, K: Ord + 'a>(
    configs: impl IntoIterator<Item = (&'a K, &'a str)>,
    node_id: &str,
) -> Option<&'a K> {
    configs
        .into_iter()
        .filter(|(_, n)| *n == node_id)
        .map(|(key, _)| key)
        .fold(None, |owner, key| match owner {
            Some(owner) if !first_owner(key, owner) => Some(owner),
            _ => Some(key),
        })
}

/// Whether `candidate` comes before the current `owner` of a node id (the rule of
/// [`node_owners`] and [`node_owner`]: the first by `(namespace, name)`).
fn first_owner<K: Ord>(candidate: &K, owner: &K) -> bool {
    candidate < owner
}

/// What resolving read from a [`SecretSource`]: each Secret asked for and what it was
/// (`None`: missing). While every one of them is unchanged, resolving the same spec again
/// gives the same result, so an unrelated change never re-decodes an EnvoyConfig.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reads {
    secrets: Vec<(String, Option<SecretData>)>,
    /// EndpointSlices were listed: their changes are not tracked, so the reads never
    /// count as unchanged.
    endpoint_slices: bool,
}

impl Reads {
    /// Whether the reads are all the resolution depended on: no EndpointSlices, whose
    /// changes are not tracked. Complete reads of unchanged Secrets are unchanged.
    pub fn complete(&self) -> bool {
        !self.endpoint_slices
    }

    /// Whether `source` would answer every read the same way now.
    pub fn unchanged_in(&self, source: &dyn SecretSource) -> bool {
        self.complete()
            && self
                .secrets
                .iter()
                .all(|(name, data)| source.get(name) == *data)
    }
}

/// A [`SecretSource`] that records what is read through it ([`Reads`]).
pub struct Recording<'a> {
    inner: &'a dyn SecretSource,
    reads: RefCell<Reads>,
}

impl<'a> Recording<'a> {
    pub fn new(inner: &'a dyn SecretSource) -> Self {
        Self {
            inner,
            reads: RefCell::new(Reads::default()),
        }
    }

    pub fn into_reads(self) -> Reads {
        self.reads.into_inner()
    }
}

impl SecretSource for Recording<'_> {
    fn get(&self, name: &str) -> Option<SecretData> {
        let data = self.inner.get(name);
        let mut reads = self.reads.borrow_mut();
        if !reads.secrets.iter().any(|(n, _)| n == name) {
            reads.secrets.push((name.to_string(), data.clone()));
        }
        data
    }

    fn endpoint_slices(
        &self,
        selector: Option<&LabelSelector>,
    ) -> Option<Vec<std::sync::Arc<EndpointSlice>>> {
        self.reads.borrow_mut().endpoint_slices = true;
        self.inner.endpoint_slices(selector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_envoyconfig::envoyconfig::CacheState;
    use std::collections::BTreeSet;

    use crate::fixtures::{spec, t};

    fn snapshot() -> Snapshot {
        Snapshot::new(Vec::new()).unwrap()
    }

    /// Rejected (type, version)s, and the message of their NACKs.
    struct Nacks(BTreeSet<(ResourceType, String)>);
    impl NackView for Nacks {
        fn rejected_by_all_pods(&self, _: &str, t: ResourceType, v: &str, _: u64) -> bool {
            self.0.contains(&(t, v.to_string()))
        }
        fn nack_message(&self, _: &str, _: ResourceType, _: &str) -> Option<String> {
            Some("unknown cluster 'nope'".into())
        }
    }

    fn none() -> Nacks {
        Nacks(BTreeSet::new())
    }

    #[test]
    fn publishes_the_topmost_untainted_revision_with_fresh_nacks_once() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        let d = decide(
            &r,
            None,
            |_| Resolution::Ready(Box::new(snapshot())),
            &none(),
            5,
        );
        let p = d.publish.unwrap();
        assert_eq!((p.version.as_str(), p.reset_nacks), (v1.as_str(), true));
        assert!(d.taints.is_empty() && d.waiting.is_none());

        r.mark_published(&v1, BTreeMap::new(), t(2));
        let d = decide(
            &r,
            Some(&v1),
            |_| Resolution::Ready(Box::new(snapshot())),
            &none(),
            5,
        );
        assert!(
            !d.publish.unwrap().reset_nacks,
            "a re-publish keeps the counts"
        );
    }

    #[test]
    fn an_invalid_revision_is_tainted_and_the_next_one_published() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        r.mark_published(&v1, BTreeMap::new(), t(1));
        let v2 = r.apply(&spec(2), t(2));
        let d = decide(
            &r,
            Some(&v1),
            |rev| {
                if rev.version == v2 {
                    Resolution::Invalid("bad field".into())
                } else {
                    Resolution::Ready(Box::new(snapshot()))
                }
            },
            &none(),
            5,
        );
        assert_eq!(d.taints.len(), 1);
        assert_eq!(d.taints[0].version, v2);
        assert_eq!(d.taints[0].reason, "resources do not decode: bad field");
        let p = d.publish.unwrap();
        assert_eq!((p.version.as_str(), p.reset_nacks), (v1.as_str(), false));
    }

    #[test]
    fn a_missing_secret_waits_and_keeps_what_is_served() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        r.mark_published(&v1, BTreeMap::new(), t(1));
        let v2 = r.apply(&spec(2), t(2));
        let mut resolved = Vec::new();
        let d = decide(
            &r,
            Some(&v1),
            |rev| {
                resolved.push(rev.version.clone());
                Resolution::Waiting("secret \"cert\" not found".into())
            },
            &none(),
            5,
        );
        assert!(d.taints.is_empty(), "a wait is never a taint");
        assert!(d.publish.is_none(), "no rollback while waiting");
        assert_eq!(
            d.waiting,
            Some(Waiting {
                version: v2.clone(),
                reason: "secret \"cert\" not found".into()
            })
        );
        assert_eq!(resolved, [v2], "older revisions are not tried");
    }

    #[test]
    fn the_served_revision_rejected_by_every_envoy_is_tainted_with_envoys_message() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        r.mark_published(
            &v1,
            BTreeMap::from([(ResourceType::Cluster, "C1".to_string())]),
            t(1),
        );
        let v2 = r.apply(&spec(2), t(2));
        r.mark_published(
            &v2,
            BTreeMap::from([(ResourceType::Cluster, "C2".to_string())]),
            t(2),
        );
        let rejected = Nacks(BTreeSet::from([(ResourceType::Cluster, "C2".to_string())]));
        let d = decide(
            &r,
            Some(&v2),
            |_| Resolution::Ready(Box::new(snapshot())),
            &rejected,
            3,
        );
        assert_eq!(d.taints.len(), 1);
        assert_eq!(d.taints[0].version, v2);
        assert_eq!(
            d.taints[0].reason,
            "every Envoy of node kuard rejected cluster version C2 at least 3 times; Envoy: unknown cluster 'nope'"
        );
        let p = d.publish.unwrap();
        assert_eq!(
            (p.version.as_str(), p.reset_nacks),
            (v1.as_str(), true),
            "rollback"
        );

        // Not judged while it is not what the cache serves.
        let d = decide(
            &r,
            Some(&v1),
            |_| Resolution::Ready(Box::new(snapshot())),
            &rejected,
            3,
        );
        assert!(d.taints.is_empty());
    }

    #[test]
    fn nothing_untainted_publishes_nothing() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(1));
        r.taint(&v1, "bad");
        let d = decide(
            &r,
            Some(&v1),
            |_| Resolution::Ready(Box::new(snapshot())),
            &none(),
            5,
        );
        assert!(d.publish.is_none() && d.waiting.is_none() && d.taints.is_empty());
    }

    #[test]
    fn resolve_errors_are_classified_taint_or_wait() {
        let tls = serde_json::from_value::<EnvoyConfigSpec>(serde_json::json!({
            "nodeID": "kuard",
            "resources": [{"type": "secret", "generateFromTlsSecret": "cert", "blueprint": "tlsCertificate"}]
        }))
        .unwrap();
        let secrets = marin3r_envoyconfig::envoyconfig::NoSecrets;
        let Resolution::Waiting(reason) = resolution(&tls, &secrets, &DecodeMemo::new()) else {
            panic!("a missing Secret is a wait");
        };
        assert!(reason.contains("cert"), "{reason}");
        let broken = serde_json::from_value::<EnvoyConfigSpec>(serde_json::json!({
            "nodeID": "kuard",
            "resources": [{"type": "cluster", "value": {"name": "x", "bogus_field": 1}}]
        }))
        .unwrap();
        assert!(matches!(
            resolution(&broken, &secrets, &DecodeMemo::new()),
            Resolution::Invalid(_)
        ));
        let Resolution::Ready(s) = resolution(&spec(1), &secrets, &DecodeMemo::new()) else {
            panic!("valid");
        };
        assert!(
            s.versions().contains_key(&ResourceType::Runtime),
            "the default runtime layer is added"
        );
    }

    /// What a taint or wait reason says (in `/status`, the state file, a revision's
    /// status and the logs) never shows a private key, a password or htpasswd lines,
    /// however they were written.
    #[test]
    fn resolution_texts_never_show_sensitive_values() {
        let key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDx3aP5kGm0xKq7\n-----END PRIVATE KEY-----\n";
        let tls = |certificate: serde_json::Value| {
            serde_json::json!({"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "commonTlsContext": {"tlsCertificates": [certificate]}}})
        };
        let listener = |name: &str, socket: serde_json::Value| {
            serde_json::json!({"type": "listener", "value": {"name": name,
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
                "filter_chains": [{"transport_socket": socket, "filters": [{
                    "name": "envoy.filters.network.echo", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo"}}]}]}})
        };
        let spec = serde_json::from_value::<EnvoyConfigSpec>(serde_json::json!({
            "nodeID": "kuard",
            "resources": [
                listener("key", tls(serde_json::json!({"privateKey": key}))),
                listener("password", tls(serde_json::json!({
                    "private_key": {"inline_string": "k"}, "password": {"inlineString": "Passw0rd-Needle", "x": 1}}))),
            ]
        }))
        .unwrap();
        let Resolution::Invalid(text) = resolution(
            &spec,
            &marin3r_envoyconfig::envoyconfig::NoSecrets,
            &DecodeMemo::new(),
        ) else {
            panic!("resources that do not decode taint");
        };
        for needle in [
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDx3aP5kGm0xKq7",
            "PRIVATE KEY",
            "Passw0rd-Needle",
        ] {
            assert!(!text.contains(needle), "{needle:?} in {text:?}");
        }
        assert!(
            text.contains(
                "tlsCertificates[0].privateKey: expected a DataSource object, found a string"
            ),
            "{text}"
        );
        assert!(
            text.contains("tlsCertificates[0].password: unknown field"),
            "{text}"
        );
    }

    /// Both modes resolve through [`resolution`]: a spec resolved again (an EndpointSlice
    /// or Secret event) takes its unchanged resources from its source's memo.
    #[test]
    fn resolving_again_takes_unchanged_resources_from_the_memo() {
        let spec = spec_of(vec![
            cluster("memo-wiring-a"),
            cluster("memo-wiring-b"),
            cluster("memo-wiring-c"),
        ]);
        let secrets = marin3r_envoyconfig::envoyconfig::NoSecrets;
        let memo = DecodeMemo::new();
        let Resolution::Ready(first) = resolution(&spec, &secrets, &memo) else {
            panic!("the clusters decode");
        };
        let hits = memo.stats().hits;
        let Resolution::Ready(second) = resolution(&spec, &secrets, &memo) else {
            panic!("the clusters decode");
        };
        assert!(memo.stats().hits >= hits + 3);
        // Another source's memo is its own: nothing decoded there yet.
        let other = DecodeMemo::new();
        let Resolution::Ready(_) = resolution(&spec, &secrets, &other) else {
            panic!("the clusters decode");
        };
        assert_eq!(other.stats().hits, 0);
        assert_eq!(first.versions(), second.versions());
    }

    #[test]
    fn the_first_envoyconfig_by_namespace_and_name_owns_a_node_id() {
        let a = ("default".to_string(), "a".to_string());
        let b = ("default".to_string(), "b".to_string());
        let c = ("other".to_string(), "c".to_string());
        let owners = node_owners([(&b, "kuard"), (&a, "kuard"), (&c, "other")]);
        assert_eq!(owners["kuard"], a);
        assert_eq!(owners["other"], c);
    }

    #[test]
    fn one_node_s_owner_is_the_one_the_map_of_every_node_gives() {
        let keys: Vec<(String, String)> = ["b", "a", "c", "d", "e"]
            .iter()
            .flat_map(|n| [("ns2", *n), ("ns1", *n)])
            .map(|(ns, n)| (ns.to_string(), n.to_string()))
            .collect();
        // Every order of claims over three node ids.
        for shift in 0..keys.len() {
            let claims: Vec<(&(String, String), &str)> = keys
                .iter()
                .cycle()
                .skip(shift)
                .take(keys.len())
                .enumerate()
                .map(|(i, k)| (k, ["x", "y", "z"][i % 3]))
                .collect();
            let owners = node_owners(claims.iter().copied());
            for node in ["x", "y", "z", "unclaimed"] {
                assert_eq!(
                    node_owner(claims.iter().copied(), node),
                    owners.get(node),
                    "node {node}, shift {shift}"
                );
            }
        }
    }

    fn cluster(name: &str) -> serde_json::Value {
        serde_json::json!({"type": "cluster", "value": {"name": name, "connect_timeout": "1s"}})
    }

    fn spec_of(resources: Vec<serde_json::Value>) -> std::sync::Arc<EnvoyConfigSpec> {
        std::sync::Arc::new(
            serde_json::from_value(serde_json::json!({"nodeID": "kuard", "resources": resources}))
                .unwrap(),
        )
    }

    fn resolve_without_secrets(rev: &Revision) -> Resolution {
        resolution(
            &rev.spec,
            &marin3r_envoyconfig::envoyconfig::NoSecrets,
            &DecodeMemo::new(),
        )
    }

    /// Applies the taints of a decision, as both sources do.
    fn apply_taints(r: &mut Revisions, d: &Decision) {
        for taint in &d.taints {
            r.taint(&taint.version, taint.reason.clone());
        }
    }

    #[test]
    fn decide_publishes_the_topmost_untainted_revision_that_resolves() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec_of(vec![cluster("a")]), t(1));
        let v2 = r.apply(
            &spec_of(vec![
                serde_json::json!({"type": "cluster", "value": {"name": "x", "bogus_field": 1}}),
            ]),
            t(2),
        );
        let d = decide(&r, None, resolve_without_secrets, &none(), 5);
        assert_eq!(d.taints.len(), 1);
        assert_eq!(d.taints[0].version, v2);
        assert!(d.taints[0].reason.starts_with("resources do not decode: "));
        assert!(
            d.taints[0].reason.contains("bogus_field"),
            "{}",
            d.taints[0].reason
        );
        apply_taints(&mut r, &d);
        let p = d.publish.unwrap();
        assert_eq!(p.version, v1);
        assert!(p.reset_nacks);
        assert_eq!(r.cache_state(), Some(CacheState::Rollback));

        // Already served and published before: not newly published.
        r.mark_published(&v1, p.snapshot.versions(), t(3));
        let d = decide(&r, Some(&v1), resolve_without_secrets, &none(), 5);
        assert!(d.taints.is_empty());
        assert!(!d.publish.unwrap().reset_nacks);

        // Every revision tainted: nothing to publish.
        r.taint(&v1, "rejected");
        let d = decide(
            &r,
            Some(&v1),
            |_| unreachable!("tainted revisions are not resolved"),
            &none(),
            5,
        );
        assert!(d.publish.is_none());
        assert_eq!(r.cache_state(), Some(CacheState::RollbackFailed));
    }

    #[test]
    fn decide_treats_a_recreated_revision_as_newly_published() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec_of(vec![cluster("a")]), t(1));
        r.remove(&v1);
        r.apply(&spec_of(vec![cluster("a")]), t(2));
        let d = decide(&r, Some(&v1), resolve_without_secrets, &none(), 5);
        assert!(
            d.publish.unwrap().reset_nacks,
            "same version as the served one, but never published since it was re-created"
        );
    }

    #[test]
    fn config_errors_taint_missing_objects_wait() {
        let bad: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "n",
            "resources": [
                {"type": "listener", "value": {"name": "l", "bogus": 1}},
                {"type": "secret", "generateFromTlsSecret": "missing"},
                {"type": "endpoint", "generateFromEndpointSlices": {"clusterName": "c", "targetPort": "http", "selector": {}}}
            ]
        }))
        .unwrap();
        struct NoPorts;
        impl marin3r_envoyconfig::envoyconfig::SecretSource for NoPorts {
            fn get(&self, _: &str) -> Option<marin3r_envoyconfig::envoyconfig::SecretData> {
                None
            }
            fn endpoint_slices(
                &self,
                _: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
            ) -> Option<Vec<std::sync::Arc<k8s_openapi::api::discovery::v1::EndpointSlice>>>
            {
                Some(vec![std::sync::Arc::new(
                    k8s_openapi::api::discovery::v1::EndpointSlice {
                        address_type: "IPv4".into(),
                        ..Default::default()
                    },
                )])
            }
        }
        let errors = marin3r_envoyconfig::envoyconfig::resolve(&bad, &NoPorts).unwrap_err();
        let verdicts: Vec<bool> = errors.iter().map(is_config_error).collect();
        assert_eq!(verdicts, [true, false, false], "{errors:?}");
    }

    /// Certificate data Envoy would refuse: inline in the config, the config's fault
    /// (taint); in a Kubernetes TLS Secret, which may still be fixed (wait).
    #[test]
    fn tls_material_in_the_config_taints_in_a_secret_waits() {
        let spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "n",
            "resources": [
                {"type": "cluster", "value": {"name": "c", "connect_timeout": "1s",
                    "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                        "common_tls_context": {"validation_context": {
                            "trusted_ca": {"inline_string": "ca-data"}}}}}}},
                {"type": "secret", "generateFromTlsSecret": "placeholder"}
            ]
        }))
        .unwrap();
        struct Placeholder;
        impl marin3r_envoyconfig::envoyconfig::SecretSource for Placeholder {
            fn get(&self, _: &str) -> Option<marin3r_envoyconfig::envoyconfig::SecretData> {
                Some(marin3r_envoyconfig::envoyconfig::SecretData {
                    type_: "kubernetes.io/tls".into(),
                    data: BTreeMap::from([
                        ("tls.crt".to_string(), b"cert-data".to_vec()),
                        ("tls.key".to_string(), b"key-data".to_vec()),
                    ]),
                })
            }
        }
        let errors = marin3r_envoyconfig::envoyconfig::resolve(&spec, &Placeholder).unwrap_err();
        assert!(
            errors
                .iter()
                .all(|e| matches!(e, DecodeError::TlsMaterial { .. })),
            "{errors:?}"
        );
        let verdicts: Vec<bool> = errors.iter().map(is_config_error).collect();
        assert_eq!(verdicts, [true, false], "{errors:?}");
    }
}
