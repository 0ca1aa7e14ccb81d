//! Pod mutation: decides whether a Pod (or a pod template) gets a sidecar, and what
//! injection adds and removes ([`Injection`]): the admission response's JSON patch and the
//! injected Pod are both built from those edits.
//!
//! The Pod is handled as raw JSON, not as a typed `k8s_openapi` Pod: a round trip through
//! typed structs would drop fields this build does not know (newer Kubernetes versions).
//! The patch names only the paths injection edits, so such fields are never touched.

use marin3r_wire::DOMAIN;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, jsonptr};
use serde::ser::{SerializeSeq as _, SerializeStruct as _};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::Error;
use crate::RunAs;
use crate::annotations::{self, AnnotationError, AnnotationErrors, Defaults, SidecarConfig};
use crate::generate;
use crate::host_ports::{self, HostPortUse};
use marin3r_wire::quote::{bounded, listed, quoted};

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD: i64 = 30;

/// Why a Pod was left unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The Pod lacks the `marin3r.3scale.net/status: enabled` label.
    NotLabelled,
}

impl SkipReason {
    /// Stable label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::NotLabelled => "not_labelled",
        }
    }
}

/// The result of [`mutate_pod`].
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// Nothing to do; the Pod is allowed unchanged.
    Skipped(SkipReason),
    /// The Pod with the sidecar injected.
    Injected(Box<Value>),
}

/// What the webhook injected, recorded in the `marin3r.3scale.net/sidecar-status`
/// annotation so a second injection first removes these objects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarStatus {
    #[serde(default)]
    pub containers: Vec<String>,
    #[serde(default)]
    pub init_containers: Vec<String>,
    #[serde(default)]
    pub volumes: Vec<String>,
    /// The `terminationGracePeriodSeconds` injection raised (shutdown manager on), so a
    /// re-injection without the shutdown manager can put it back. Absent in statuses
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<GracePeriodChange>,
    /// The containers whose preStop injection replaced with `GET /drain`
    /// (`shutdown-manager.extra-lifecycle-hooks`), with their lifecycle before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_stop_hooks: Vec<PreStopChange>,
    /// The extra Secret and ConfigMap volumes injection added and mounted into Envoy
    /// (`envoy-extra-secret-volumes`, `envoy-extra-configmap-volumes`). Absent when there
    /// are none, and in statuses written before they existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_volumes: Vec<ExtraVolumeMount>,
}

/// An extra volume injection added, and where it mounted it in the Envoy container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtraVolumeMount {
    pub name: String,
    pub mount_path: String,
}

/// `spec.terminationGracePeriodSeconds` before and after injection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GracePeriodChange {
    /// The Pod's own value; `None` when it had none.
    #[serde(default)]
    pub previous: Option<i64>,
    /// The value injection set.
    pub injected: i64,
}

/// A container's `lifecycle` before injection set its preStop to `GET /drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreStopChange {
    pub container: String,
    /// The container's `lifecycle`; `None` when it had none.
    #[serde(default)]
    pub lifecycle: Option<Value>,
}

fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::InvalidPod {
        field: field.to_string(),
        message: message.into(),
    }
}

/// `metadata[key]` as a map of strings, borrowed from the Pod.
fn string_map<'a>(
    meta: Option<&'a Map<String, Value>>,
    key: &str,
) -> Result<BTreeMap<&'a str, &'a str>, Error> {
    match meta.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.as_str(), s.as_str())),
                _ => Err(invalid(
                    &format!("metadata.{key}[{}]", quoted(k)),
                    "must be a string",
                )),
            })
            .collect(),
        Some(_) => Err(invalid(
            &format!("metadata.{key}"),
            "must be a map of strings",
        )),
    }
}

/// `spec[key]` as a list: `(entries, present)`; absent and `null` are an empty list that
/// is not present.
fn list<'a>(spec: &'a Map<String, Value>, key: &str) -> Result<(&'a [Value], bool), Error> {
    match spec.get(key) {
        None | Some(Value::Null) => Ok((&[], false)),
        Some(Value::Array(a)) => Ok((a, true)),
        Some(_) => Err(invalid(&format!("spec.{key}"), "must be a list")),
    }
}

fn names(list: &[Value]) -> impl Iterator<Item = &str> {
    list.iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
}

fn to_value<T: Serialize>(t: &T) -> Result<Value, Error> {
    serde_json::to_value(t).map_err(Error::Serialize)
}

/// How an [`Injection`] holds the objects it adds (the generated containers and volumes):
/// as `Value` trees, for [`Injection::into_pod`] and [`Injection::into_patch`], or
/// serialised once as JSON text (`Box<RawValue>`), for an admission response that only
/// writes the patch out ([`InjectionPatch::to_json`]). Both forms come from the same
/// generated objects and give the same patch.
pub trait Added: Serialize + fmt::Debug + Sized {
    /// A generated object in this form.
    fn from_generated<T: Serialize>(t: &T) -> Result<Self, Error>;
    /// Whether this object is exactly `original` (an entry of the Pod).
    fn is(&self, original: &Value) -> bool;
}

impl Added for Value {
    fn from_generated<T: Serialize>(t: &T) -> Result<Self, Error> {
        to_value(t)
    }

    fn is(&self, original: &Value) -> bool {
        self == original
    }
}

impl Added for Box<RawValue> {
    fn from_generated<T: Serialize>(t: &T) -> Result<Self, Error> {
        serde_json::value::to_raw_value(t).map_err(Error::Serialize)
    }

    fn is(&self, original: &Value) -> bool {
        serde_json::from_str::<Value>(self.get()).is_ok_and(|v| v == *original)
    }
}

/// The lists of `spec` injection edits, in the order it edits them.
const LISTS: [&str; 3] = ["containers", "initContainers", "volumes"];
const CONTAINERS: usize = 0;
const INIT_CONTAINERS: usize = 1;
const VOLUMES: usize = 2;

/// What injection does to one list of the Pod's spec.
#[derive(Debug)]
struct ListEdit<'a, F> {
    /// The list as it is in the Pod (empty when absent or `null`).
    original: &'a [Value],
    /// Whether `spec[key]` is a list in the Pod (absent and `null` are not).
    present: bool,
    /// Per original entry: whether injection removes it (an earlier injection's object).
    removed: Vec<bool>,
    /// The final `lifecycle` of kept entries whose lifecycle injection sets or restores
    /// (`None`: no `lifecycle`), by original index.
    lifecycle: BTreeMap<usize, Option<Value>>,
    /// The entries injection appends.
    appended: Vec<F>,
}

impl<'a, F: Added> ListEdit<'a, F> {
    fn new(spec: &'a Map<String, Value>, key: &str) -> Result<Self, Error> {
        let (original, present) = list(spec, key)?;
        Ok(Self {
            original,
            present,
            removed: vec![false; original.len()],
            lifecycle: BTreeMap::new(),
            appended: Vec::new(),
        })
    }

    /// The entries injection keeps, with their original index.
    fn kept(&self) -> impl Iterator<Item = (usize, &'a Value)> + '_ {
        self.original
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.removed[*i])
    }

    /// The entries injection removes.
    fn gone(&self) -> impl Iterator<Item = &'a Value> + '_ {
        self.original
            .iter()
            .enumerate()
            .filter(|(i, _)| self.removed[*i])
            .map(|(_, v)| v)
    }

    /// The `lifecycle` of original entry `i` as injection leaves it so far.
    fn lifecycle_of(&self, i: usize) -> Option<&Value> {
        match self.lifecycle.get(&i) {
            Some(l) => l.as_ref(),
            None => self.original[i].get("lifecycle"),
        }
    }

    /// How many removed entries at the end of the list are given back unchanged by the
    /// first appended ones (re-injecting an injected Pod): those are left in place.
    fn reused_tail(&self) -> (usize, usize) {
        let start = self.removed.iter().rposition(|r| !r).map_or(0, |i| i + 1);
        let reused = self.original[start..]
            .iter()
            .zip(&self.appended)
            .take_while(|(a, b)| b.is(a))
            .count();
        (start, reused)
    }
}

/// `spec.terminationGracePeriodSeconds` after injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GraceEdit {
    Keep,
    Set(i64),
    Remove,
}

/// The result of [`plan_pod`].
#[derive(Debug)]
pub enum Plan<'a, F = Value> {
    /// Nothing to do; the Pod is allowed unchanged.
    Skipped(SkipReason),
    /// What injection changes in the Pod.
    Inject(Box<Injection<'a, F>>),
}

/// What injecting the sidecar changes in a Pod, decided without copying the Pod: the
/// objects an earlier injection added are removed ([`SidecarStatus`]), the recorded Pod
/// changes undone, the new objects appended, the grace period and preStop hooks set, and
/// the status annotation written. [`Injection::patch`] is the JSON patch for an admission
/// response; [`Injection::into_pod`] the injected Pod. Both come from the same edits.
/// `F` is how the added objects are held ([`Added`]).
#[derive(Debug)]
pub struct Injection<'a, F = Value> {
    pod: &'a Value,
    lists: [ListEdit<'a, F>; 3],
    grace: GraceEdit,
    status: String,
}

/// Decides and applies sidecar injection for a Pod or pod template (`{metadata, spec}`):
/// [`plan_pod`], then the injected copy ([`Injection::into_pod`]).
pub fn mutate_pod(
    pod: &Value,
    namespace: Option<&str>,
    defaults: &Defaults,
) -> Result<Mutation, Error> {
    Ok(match plan_pod(pod, namespace, defaults)? {
        Plan::Skipped(reason) => Mutation::Skipped(reason),
        Plan::Inject(injection) => Mutation::Injected(Box::new(injection.into_pod())),
    })
}

/// Decides sidecar injection for a Pod or pod template (`{metadata, spec}`), borrowing it.
///
/// `namespace` is the namespace the Pod is created in (the admission request's
/// namespace); when `None`, `metadata.namespace` is used, then `default`.
pub fn plan_pod<'a>(
    pod: &'a Value,
    namespace: Option<&str>,
    defaults: &Defaults,
) -> Result<Plan<'a>, Error> {
    plan_pod_as(pod, namespace, defaults)
}

/// [`plan_pod`] with the added objects held as `F`: `Box<RawValue>` for an admission
/// response, which only writes the patch ([`Injection::patch`], [`InjectionPatch::to_json`]).
pub fn plan_pod_as<'a, F: Added>(
    pod: &'a Value,
    namespace: Option<&str>,
    defaults: &Defaults,
) -> Result<Plan<'a, F>, Error> {
    let root = pod
        .as_object()
        .ok_or_else(|| invalid("object", "must be a JSON object"))?;
    let meta = match root.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(invalid("metadata", "must be an object")),
    };
    let labels = string_map(meta, "labels")?;
    if labels.get(marin3r_wire::INJECTION_LABEL).copied() != Some(marin3r_wire::INJECTION_ENABLED) {
        return Ok(Plan::Skipped(SkipReason::NotLabelled));
    }
    let annotations = string_map(meta, "annotations")?;
    // The request's namespace, else the Pod's, else `default`: an empty one is none.
    let namespace = marin3r_wire::namespace_or_default(
        marin3r_wire::given_namespace(namespace).or_else(|| {
            meta.and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
        }),
    )
    .to_string();

    // A malformed status is reported together with the annotation errors.
    let mut status_error = None;
    let previous: SidecarStatus = match annotations.get(marin3r_wire::SIDECAR_STATUS_ANNOTATION) {
        None => SidecarStatus::default(),
        Some(s) => serde_json::from_str(s).unwrap_or_else(|e| {
            status_error = Some(AnnotationError {
                annotation: "sidecar-status".into(),
                message: format!(
                    "is not the JSON the webhook writes ({})",
                    bounded(&e.to_string())
                ),
            });
            SidecarStatus::default()
        }),
    };

    let Some(spec) = root.get("spec").and_then(Value::as_object) else {
        return Err(invalid("spec", "is required and must be an object"));
    };
    if !matches!(spec.get("containers"), Some(Value::Array(_))) {
        return Err(invalid("spec.containers", "is required and must be a list"));
    }
    let mut lists = [
        ListEdit::new(spec, LISTS[CONTAINERS])?,
        ListEdit::new(spec, LISTS[INIT_CONTAINERS])?,
        ListEdit::new(spec, LISTS[VOLUMES])?,
    ];
    let ephemeral: &[Value] = spec
        .get("ephemeralContainers")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);

    // Remove what an earlier injection added, so injecting twice gives the same Pod. The
    // status annotation is user-writable, so it is trusted only for objects that look
    // like what injection creates; anything else it lists is kept (and a name clash is
    // then denied by `check_conflicts`).
    strip_injected(&mut lists, ephemeral, &previous);
    let original_grace = spec.get("terminationGracePeriodSeconds");
    let mut grace = undo_pod_changes(&mut lists[CONTAINERS], original_grace, &previous);

    let kept_names = |edit: &ListEdit<'_, F>| -> BTreeSet<String> {
        edit.kept()
            .filter_map(|(_, c)| c.get("name").and_then(Value::as_str))
            .map(str::to_string)
            .collect()
    };
    let app_containers = kept_names(&lists[CONTAINERS]);
    let mut cfg = match (
        annotations::parse(&annotations, &namespace, &app_containers, defaults),
        status_error,
    ) {
        (Ok(cfg), None) => cfg,
        (Ok(_), Some(e)) => return Err(Error::Annotations(AnnotationErrors(vec![e]))),
        (Err(mut errors), status_error) => {
            errors.0.extend(status_error);
            return Err(Error::Annotations(errors));
        }
    };

    // Who the sidecars run as: decided from the Pod's own containers, not from the ones
    // an earlier injection added (re-injection decides the same).
    let own_containers: Vec<&Value> = [CONTAINERS, INIT_CONTAINERS]
        .into_iter()
        .flat_map(|list| lists[list].kept().map(|(_, c)| c))
        .collect();
    cfg.run_as = RunAs::of_pod(
        root.get("spec").unwrap_or(&Value::Null),
        &annotations,
        &own_containers,
    );

    let ephemeral_names: BTreeSet<String> = names(ephemeral).map(str::to_string).collect();
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    // Ephemeral containers cannot declare ports; the injected containers an earlier
    // injection added are replaced, so only the kept ones count.
    let app_host_ports: Vec<HostPortUse> = [CONTAINERS, INIT_CONTAINERS]
        .into_iter()
        .flat_map(|list| {
            lists[list]
                .kept()
                .flat_map(move |(i, c)| container_host_ports(LISTS[list], i, c, host_network))
        })
        .collect();
    check_conflicts(
        &cfg,
        &PodNames {
            containers: &app_containers,
            init_containers: &kept_names(&lists[INIT_CONTAINERS]),
            ephemeral_containers: &ephemeral_names,
            volumes: &kept_names(&lists[VOLUMES]),
            host_ports: &app_host_ports,
        },
        host_network,
    )?;

    let envoy = F::from_generated(&generate::envoy_container(&cfg))?;
    let init = F::from_generated(&generate::init_manager_container(&cfg))?;
    let shtdn = cfg
        .shutdown_manager
        .as_ref()
        .map(|sm| F::from_generated(&generate::shutdown_manager_container(&cfg, sm)))
        .transpose()?;

    let mut status = SidecarStatus {
        init_containers: vec![generate::INIT_MANAGER_NAME.to_string()],
        volumes: vec![cfg.tls_volume.clone(), cfg.config_volume.clone()],
        extra_volumes: cfg
            .extra_volumes
            .iter()
            .map(|v| ExtraVolumeMount {
                name: v.volume_name.clone(),
                mount_path: v.mount_path.clone(),
            })
            .collect(),
        ..SidecarStatus::default()
    };
    let mut sidecars = vec![envoy];
    sidecars.extend(shtdn);
    let mut sidecar_names = vec![cfg.container_name.clone()];
    if cfg.shutdown_manager.is_some() {
        sidecar_names.push(generate::SHUTDOWN_MANAGER_NAME.to_string());
    }
    lists[INIT_CONTAINERS].appended.push(init);
    if cfg.native_sidecar {
        lists[INIT_CONTAINERS].appended.extend(sidecars);
        status.init_containers.extend(sidecar_names);
    } else {
        lists[CONTAINERS].appended.extend(sidecars);
        status.containers = sidecar_names;
    }
    for v in generate::volumes(&cfg) {
        lists[VOLUMES].appended.push(F::from_generated(&v)?);
    }

    if let Some(sm) = &cfg.shutdown_manager {
        let own = match grace {
            GraceEdit::Set(v) => Some(v),
            GraceEdit::Remove => None,
            GraceEdit::Keep => match original_grace {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_i64().ok_or_else(|| {
                    invalid("spec.terminationGracePeriodSeconds", "must be an integer")
                })?),
            },
        };
        let raised = own
            .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD)
            .max(sm.drain_time_seconds);
        grace = GraceEdit::Set(raised);
        if own != Some(raised) {
            status.termination_grace_period = Some(GracePeriodChange {
                previous: own,
                injected: raised,
            });
        }
        let hook = to_value(&generate::drain_pre_stop(sm.port))?;
        let containers = &mut lists[CONTAINERS];
        let hooked: Vec<(usize, String)> = containers
            .kept()
            .filter_map(|(i, c)| Some((i, c.get("name")?.as_str()?.to_string())))
            .filter(|(_, name)| sm.extra_lifecycle_hooks.contains(name))
            .collect();
        for (i, name) in hooked {
            let before = containers.lifecycle_of(i).cloned();
            let after = with_pre_stop(before.clone(), hook.clone(), &name)?;
            status.pre_stop_hooks.push(PreStopChange {
                container: name,
                lifecycle: before.filter(|l| !l.is_null()),
            });
            containers.lifecycle.insert(i, Some(after));
        }
    }

    Ok(Plan::Inject(Box::new(Injection {
        pod,
        lists,
        grace,
        status: serde_json::to_string(&status).map_err(Error::Serialize)?,
    })))
}

/// A JSON pointer from its unescaped tokens (RFC 6901).
fn pointer<'t>(tokens: impl IntoIterator<Item = &'t str>) -> jsonptr::PointerBuf {
    jsonptr::PointerBuf::from_tokens(tokens)
}

fn add<F>(tokens: &[&str], value: OpValue<F>) -> Op<F> {
    Op::Add(pointer(tokens.iter().copied()), value)
}

fn remove<F>(tokens: &[&str]) -> Op<F> {
    Op::Remove(pointer(tokens.iter().copied()))
}

/// The value of an `add` operation of an [`InjectionPatch`].
#[derive(Debug)]
enum OpValue<F> {
    /// A value taken or derived from the Pod (a lifecycle, the grace period, the status).
    Value(Value),
    /// One added object.
    Added(F),
    /// A list of added objects (for a list the Pod does not have).
    List(Vec<F>),
}

impl OpValue<Value> {
    fn into_value(self) -> Value {
        match self {
            OpValue::Value(v) | OpValue::Added(v) => v,
            OpValue::List(l) => Value::Array(l),
        }
    }
}

impl<F: Serialize> Serialize for OpValue<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            OpValue::Value(v) => v.serialize(serializer),
            OpValue::Added(a) => a.serialize(serializer),
            OpValue::List(l) => {
                let mut seq = serializer.serialize_seq(Some(l.len()))?;
                for a in l {
                    seq.serialize_element(a)?;
                }
                seq.end()
            }
        }
    }
}

/// One operation of an [`InjectionPatch`]: injection only adds and removes.
#[derive(Debug)]
enum Op<F> {
    Add(jsonptr::PointerBuf, OpValue<F>),
    Remove(jsonptr::PointerBuf),
}

/// Written as `json_patch` writes a `PatchOperation`: `op`, `path`, then `value`.
impl<F: Serialize> Serialize for Op<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Op::Add(path, value) => {
                let mut op = serializer.serialize_struct("AddOperation", 3)?;
                op.serialize_field("op", "add")?;
                op.serialize_field("path", path.as_str())?;
                op.serialize_field("value", value)?;
                op.end()
            }
            Op::Remove(path) => {
                let mut op = serializer.serialize_struct("RemoveOperation", 2)?;
                op.serialize_field("op", "remove")?;
                op.serialize_field("path", path.as_str())?;
                op.end()
            }
        }
    }
}

/// The JSON patch (RFC 6902) of an [`Injection`] ([`Injection::patch`]), with the added
/// objects held as `F`. It serialises as the `json_patch::Patch` it converts into.
#[derive(Debug)]
pub struct InjectionPatch<F = Value>(Vec<Op<F>>);

impl<F: Added> InjectionPatch<F> {
    /// True when injection changes nothing (an injected Pod with the same annotations).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many operations the patch has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The patch as JSON (an array of operations).
    pub fn to_json(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(8 * 1024);
        serde_json::to_writer(&mut out, self).map_err(Error::Serialize)?;
        Ok(out)
    }
}

impl<F: Serialize> Serialize for InjectionPatch<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for op in &self.0 {
            seq.serialize_element(op)?;
        }
        seq.end()
    }
}

impl From<InjectionPatch> for Patch {
    fn from(patch: InjectionPatch) -> Self {
        Patch(
            patch
                .0
                .into_iter()
                .map(|op| match op {
                    Op::Add(path, value) => PatchOperation::Add(AddOperation {
                        path,
                        value: value.into_value(),
                    }),
                    Op::Remove(path) => PatchOperation::Remove(RemoveOperation { path }),
                })
                .collect(),
        )
    }
}

impl<F: Added> Injection<'_, F> {
    /// The JSON patch (RFC 6902) that turns the Pod into [`Injection::into_pod`], built from
    /// the edits, never from a diff of two trees: removals (from the end), lifecycle
    /// changes of kept containers, appends, the grace period and the status annotation.
    /// Nothing else of the Pod is touched, fields this build does not know included.
    /// Objects an earlier injection added that come back unchanged stay in place, so
    /// re-injecting an injected Pod gives an empty patch.
    pub fn patch(self) -> InjectionPatch<F> {
        let mut ops = Vec::new();
        for (key, mut edit) in LISTS.iter().zip(self.lists) {
            if !edit.present {
                if !edit.appended.is_empty() {
                    ops.push(add(&["spec", key], OpValue::List(edit.appended)));
                }
                continue;
            }
            let (tail, reused) = edit.reused_tail();
            for i in (0..edit.original.len()).rev() {
                if edit.removed[i] && !(tail..tail + reused).contains(&i) {
                    ops.push(remove(&["spec", key, &i.to_string()]));
                }
            }
            let kept: Vec<(usize, &Value)> = edit.kept().collect();
            for (at, (i, entry)) in kept.into_iter().enumerate() {
                let Some(after) = edit.lifecycle.remove(&i) else {
                    continue;
                };
                let index = at.to_string();
                let path = ["spec", key, index.as_str(), "lifecycle"];
                match (entry.get("lifecycle"), after) {
                    (before, Some(after)) if before != Some(&after) => {
                        ops.push(add(&path, OpValue::Value(after)));
                    }
                    (Some(_), None) => ops.push(remove(&path)),
                    _ => {}
                }
            }
            for entry in edit.appended.into_iter().skip(reused) {
                ops.push(add(&["spec", key, "-"], OpValue::Added(entry)));
            }
        }
        let at = |parent: &str, key: &str| self.pod.get(parent).and_then(|p| p.get(key));
        let original_grace = at("spec", "terminationGracePeriodSeconds");
        match self.grace {
            GraceEdit::Set(v) if original_grace != Some(&Value::from(v)) => {
                ops.push(add(
                    &["spec", "terminationGracePeriodSeconds"],
                    OpValue::Value(v.into()),
                ));
            }
            GraceEdit::Remove if original_grace.is_some() => {
                ops.push(remove(&["spec", "terminationGracePeriodSeconds"]));
            }
            _ => {}
        }
        match at("metadata", "annotations") {
            Some(Value::Object(a)) => {
                if a.get(marin3r_wire::SIDECAR_STATUS_ANNOTATION)
                    .and_then(Value::as_str)
                    != Some(self.status.as_str())
                {
                    ops.push(add(
                        &[
                            "metadata",
                            "annotations",
                            marin3r_wire::SIDECAR_STATUS_ANNOTATION,
                        ],
                        OpValue::Value(Value::String(self.status)),
                    ));
                }
            }
            _ => {
                let mut a = Map::new();
                a.insert(
                    marin3r_wire::SIDECAR_STATUS_ANNOTATION.into(),
                    Value::String(self.status),
                );
                ops.push(add(
                    &["metadata", "annotations"],
                    OpValue::Value(Value::Object(a)),
                ));
            }
        }
        InjectionPatch(ops)
    }
}

impl Injection<'_> {
    /// [`Injection::patch`] as a `json_patch::Patch`.
    pub fn into_patch(self) -> Patch {
        self.patch().into()
    }

    /// The injected Pod: a copy of the Pod with the edits applied.
    pub fn into_pod(self) -> Value {
        let mut out = self.pod.clone();
        if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
            for (key, mut edit) in LISTS.iter().zip(self.lists) {
                let slot = spec
                    .entry(key.to_string())
                    .or_insert_with(|| Value::Array(Vec::new()));
                let mut entries = match std::mem::take(slot) {
                    Value::Array(a) => a,
                    _ => Vec::new(),
                };
                let mut i = 0;
                entries.retain(|_| {
                    i += 1;
                    !edit.removed[i - 1]
                });
                let kept: Vec<usize> = edit.kept().map(|(i, _)| i).collect();
                for (i, entry) in kept.into_iter().zip(entries.iter_mut()) {
                    let (Some(after), Some(obj)) =
                        (edit.lifecycle.remove(&i), entry.as_object_mut())
                    else {
                        continue;
                    };
                    match after {
                        Some(l) => obj.insert("lifecycle".into(), l),
                        None => obj.remove("lifecycle"),
                    };
                }
                entries.append(&mut edit.appended);
                *slot = Value::Array(entries);
            }
            match self.grace {
                GraceEdit::Keep => None,
                GraceEdit::Set(v) => spec.insert("terminationGracePeriodSeconds".into(), v.into()),
                GraceEdit::Remove => spec.remove("terminationGracePeriodSeconds"),
            };
        }
        if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !annotations.is_object() {
                *annotations = Value::Object(Map::new());
            }
            if let Some(a) = annotations.as_object_mut() {
                a.insert(
                    marin3r_wire::SIDECAR_STATUS_ANNOTATION.into(),
                    Value::String(self.status),
                );
            }
        }
        out
    }
}

/// `c[key]` as a list of strings, if it is one.
fn strings<'a>(c: &'a Value, key: &str) -> Option<Vec<&'a str>> {
    c.get(key)?.as_array()?.iter().map(Value::as_str).collect()
}

/// Whether a container has the shape of one injection creates: the Envoy sidecar
/// (`command: [envoy]`, `args: [-c, <bootstrap>, …]`), the init manager or the shutdown
/// manager (fixed names, first argument the subcommand).
fn looks_injected(c: &Value) -> bool {
    let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
    let command = strings(c, "command");
    let args = strings(c, "args").unwrap_or_default();
    let envoy = command.as_deref() == Some(&["envoy"][..])
        && args.starts_with(&["-c", marin3r_wire::paths::ENVOY_BOOTSTRAP_FILE]);
    let subcommand = |expected_name: &str, sub: &str| {
        name == expected_name && command.is_none() && args.first() == Some(&sub)
    };
    envoy
        || subcommand(generate::INIT_MANAGER_NAME, "init-manager")
        || subcommand(generate::SHUTDOWN_MANAGER_NAME, "shutdown-manager")
}

/// `(volume name, mount path)` of each volume mount of a container.
fn mounts(c: &Value) -> impl Iterator<Item = (&str, &str)> {
    c.get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m.get("name")?.as_str()?, m.get("mountPath")?.as_str()?)))
}

/// Marks for removal the containers and volumes `previous` lists, but only those that
/// look like what injection creates: a container must have an injected shape
/// ([`looks_injected`]); a volume must be mounted by a removed container where injection
/// mounts it, be of the kind injection creates there (the tls Secret volume, the config
/// emptyDir; an extra volume a Secret or ConfigMap at the mount path the status records
/// for it) and be mounted by no remaining container.
fn strip_injected<F: Added>(
    lists: &mut [ListEdit<'_, F>; 3],
    ephemeral: &[Value],
    previous: &SidecarStatus,
) {
    let listed = |c: &Value| {
        c.get("name").and_then(Value::as_str).is_some_and(|n| {
            previous
                .containers
                .iter()
                .chain(&previous.init_containers)
                .any(|x| x == n)
        })
    };
    for edit in &mut lists[..VOLUMES] {
        for (i, c) in edit.original.iter().enumerate() {
            edit.removed[i] = listed(c) && looks_injected(c);
        }
    }
    let kept_mounts: BTreeSet<&str> = lists[..VOLUMES]
        .iter()
        .flat_map(|edit| edit.kept().map(|(_, c)| c))
        .chain(ephemeral)
        .flat_map(|c| mounts(c).map(|(n, _)| n))
        .collect();
    let removed_mounts: Vec<(&str, &str)> = lists[..VOLUMES]
        .iter()
        .flat_map(ListEdit::gone)
        .flat_map(mounts)
        .collect();
    let removable = |v: &Value| {
        let Some(name) = v.get("name").and_then(Value::as_str) else {
            return false;
        };
        let is = |kind: &str| v.get(kind).is_some_and(Value::is_object);
        let kind_at = |path: &str| match path {
            marin3r_wire::paths::ENVOY_TLS_CLIENT => is("secret"),
            marin3r_wire::paths::ENVOY_BOOTSTRAP => is("emptyDir"),
            _ => false,
        };
        let mounted_at = |path: &str| removed_mounts.iter().any(|(n, p)| *n == name && *p == path);
        let fixed = previous.volumes.iter().any(|x| x == name)
            && removed_mounts
                .iter()
                .any(|(n, path)| *n == name && kind_at(path));
        // An extra volume: a Secret or ConfigMap mounted where the status says.
        let extra = (is("secret") || is("configMap"))
            && previous
                .extra_volumes
                .iter()
                .any(|x| x.name == name && mounted_at(&x.mount_path));
        (fixed || extra) && !kept_mounts.contains(name)
    };
    let volumes = &mut lists[VOLUMES];
    for (i, v) in volumes.original.iter().enumerate() {
        volumes.removed[i] = removable(v);
    }
}

/// Whether a lifecycle handler is the `GET <port>/drain` preStop injection sets.
fn is_drain_hook(pre_stop: Option<&Value>) -> bool {
    let get = pre_stop.and_then(|h| h.get("httpGet"));
    get.and_then(|g| g.get("path")).and_then(Value::as_str) == Some(marin3r_wire::http_paths::DRAIN)
        && get.and_then(|g| g.get("port")).is_some_and(Value::is_u64)
}

/// Undoes the Pod changes an earlier injection recorded in its status: the raised
/// `terminationGracePeriodSeconds` (only if it still has the injected value; returned)
/// and the `GET /drain` preStop hooks (only on containers whose preStop is still such a
/// hook).
fn undo_pod_changes<F: Added>(
    containers: &mut ListEdit<'_, F>,
    grace: Option<&Value>,
    previous: &SidecarStatus,
) -> GraceEdit {
    for change in &previous.pre_stop_hooks {
        let restored: Vec<usize> = containers
            .kept()
            .filter(|(i, c)| {
                c.is_object()
                    && c.get("name").and_then(Value::as_str) == Some(change.container.as_str())
                    && is_drain_hook(containers.lifecycle_of(*i).and_then(|l| l.get("preStop")))
            })
            .map(|(i, _)| i)
            .collect();
        for i in restored {
            containers.lifecycle.insert(i, change.lifecycle.clone());
        }
    }
    match &previous.termination_grace_period {
        Some(g) if grace.and_then(Value::as_i64) == Some(g.injected) => {
            g.previous.map_or(GraceEdit::Remove, GraceEdit::Set)
        }
        _ => GraceEdit::Keep,
    }
}

/// `lifecycle` with its preStop replaced by `hook`, keeping `postStart`.
fn with_pre_stop(lifecycle: Option<Value>, hook: Value, container: &str) -> Result<Value, Error> {
    let mut l = match lifecycle {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(invalid(
                &format!("spec.containers[{}].lifecycle", quoted(container)),
                "must be an object",
            ));
        }
    };
    l.insert("preStop".into(), hook);
    Ok(Value::Object(l))
}

/// The host ports a container of `spec[list]` (at `index`) declares: each port's
/// `hostPort`, or with `hostNetwork` its `containerPort` when it has none (Kubernetes
/// defaults the one to the other there). A port the API server would reject by itself
/// (a number out of range) is left to it.
fn container_host_ports(
    list: &str,
    index: usize,
    container: &Value,
    host_network: bool,
) -> Vec<HostPortUse> {
    let name = container
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let number = |port: &Value, key: &str| {
        port.get(key)
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
    };
    container
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(j, port)| {
            let host_port = number(port, "hostPort")
                .or_else(|| number(port, "containerPort").filter(|_| host_network))?;
            Some(HostPortUse {
                host_port,
                protocol: port
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_string(),
                declarer: format!(
                    "container {} (spec.{list}[{index}].ports[{j}])",
                    quoted(name)
                ),
            })
        })
        .collect()
}

/// The host ports the injected Envoy takes, each with the annotation that gives it: the
/// mapped ports (`host-port-mappings`); with `hostNetwork` every port it declares
/// (`ports`, `admin.port`), as its containerPort is then a host port.
fn envoy_host_ports(cfg: &SidecarConfig, host_network: bool) -> Vec<(&'static str, HostPortUse)> {
    let mut uses: Vec<(&'static str, HostPortUse)> = cfg
        .ports
        .iter()
        .filter_map(|p| {
            let (key, host_port) = match p.host_port {
                Some(h) => (annotations::keys::HOST_PORT_MAPPINGS, h),
                None if host_network => (annotations::keys::PORTS, p.port),
                None => return None,
            };
            Some((
                key,
                HostPortUse {
                    host_port,
                    protocol: p.protocol.as_str().into(),
                    declarer: format!("the sidecar's port {} ({DOMAIN}/{key})", quoted(&p.name)),
                },
            ))
        })
        .collect();
    if host_network {
        let key = annotations::keys::ADMIN_PORT;
        uses.push((
            key,
            HostPortUse {
                host_port: cfg.admin_port,
                protocol: annotations::Protocol::Tcp.as_str().into(),
                declarer: format!("the sidecar's admin port ({DOMAIN}/{key})"),
            },
        ));
    }
    uses
}

/// The names and host ports already in the Pod (after removing an earlier injection).
struct PodNames<'a> {
    containers: &'a BTreeSet<String>,
    init_containers: &'a BTreeSet<String>,
    ephemeral_containers: &'a BTreeSet<String>,
    volumes: &'a BTreeSet<String>,
    host_ports: &'a [HostPortUse],
}

/// Denies up front what the API server would reject after injection: names the injected
/// objects share with the Pod's (containers, init and ephemeral containers, volumes), a
/// host port the Pod's containers already take ([`host_ports`]), and with
/// `hostNetwork: true` a hostPort different from its containerPort.
fn check_conflicts(
    cfg: &SidecarConfig,
    pod: &PodNames<'_>,
    host_network: bool,
) -> Result<(), Error> {
    let mut errors = Vec::new();
    let taken = |n: &str| {
        pod.containers.contains(n)
            || pod.init_containers.contains(n)
            || pod.ephemeral_containers.contains(n)
    };
    let kind = |n: &str| {
        if pod.ephemeral_containers.contains(n) {
            "an ephemeral container (spec.ephemeralContainers)"
        } else {
            "a container"
        }
    };
    if taken(&cfg.container_name) {
        errors.push(AnnotationError {
            annotation: annotations::keys::CONTAINER_NAME.into(),
            message: format!(
                "the pod already has {} named {:?}",
                kind(&cfg.container_name),
                cfg.container_name
            ),
        });
    }
    let mut reserved = vec![generate::INIT_MANAGER_NAME];
    if cfg.shutdown_manager.is_some() {
        reserved.push(generate::SHUTDOWN_MANAGER_NAME);
    }
    for name in reserved {
        if taken(name) || cfg.container_name == name {
            errors.push(AnnotationError {
                annotation: "spec.containers".into(),
                message: format!(
                    "the pod already has {} named {name:?}, which the sidecar injection adds",
                    kind(name)
                ),
            });
        }
    }
    let extra = cfg
        .extra_volumes
        .iter()
        .map(|v| (annotations::extra_volumes_key(v.source), &v.volume_name));
    for (key, vol) in [
        (annotations::keys::TLS_VOLUME, &cfg.tls_volume),
        (annotations::keys::CONFIG_VOLUME, &cfg.config_volume),
    ]
    .into_iter()
    .chain(extra)
    {
        if pod.volumes.contains(vol) {
            errors.push(AnnotationError {
                annotation: key.into(),
                message: format!("the pod already has a volume named {vol:?}"),
            });
        }
    }
    if host_network {
        let mismatched: Vec<String> = cfg
            .ports
            .iter()
            .filter_map(|p| {
                p.host_port.filter(|h| *h != p.port).map(|h| {
                    format!(
                        "port {:?}: hostPort {h} must equal containerPort {} because spec.hostNetwork is true",
                        p.name, p.port
                    )
                })
            })
            .collect();
        if !mismatched.is_empty() {
            errors.push(AnnotationError {
                annotation: annotations::keys::HOST_PORT_MAPPINGS.into(),
                message: mismatched.join(", "),
            });
        }
    }
    // The Pod's ports first: a clash is reported on the sidecar port that repeats one.
    let envoy = envoy_host_ports(cfg, host_network);
    let uses: Vec<HostPortUse> = pod
        .host_ports
        .iter()
        .cloned()
        .chain(envoy.iter().map(|(_, u)| u.clone()))
        .collect();
    let mut clashes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (first, again) in host_ports::clashes(&uses) {
        // A clash between two app ports is the Pod's own, left to the API server.
        let Some((key, _)) = again
            .checked_sub(pod.host_ports.len())
            .and_then(|i| envoy.get(i))
        else {
            continue;
        };
        clashes
            .entry(key)
            .or_default()
            .push(host_ports::clash_message(&uses[first], &uses[again]));
    }
    for (key, messages) in clashes {
        errors.push(AnnotationError {
            annotation: key.into(),
            message: listed(messages, ", "),
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Annotations(AnnotationErrors(errors)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(labels: Value, annotations: Value) -> Value {
        json!({
            "metadata": {"name": "p", "labels": labels, "annotations": annotations},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]}
        })
    }

    fn injected(pod: &Value) -> Value {
        match mutate_pod(pod, Some("ns"), &Defaults::default()) {
            Ok(Mutation::Injected(v)) => *v,
            other => panic!("expected an injection, got {other:?}"),
        }
    }

    #[test]
    fn only_the_status_annotation_is_added() {
        let before = pod(
            json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}),
            json!({"marin3r.3scale.net/node-id": "n", "team": "a", "z-last": ""}),
        );
        let after = injected(&before);
        let mut annotations = after["metadata"]["annotations"].clone();
        let status = annotations
            .as_object_mut()
            .and_then(|m| m.remove(marin3r_wire::SIDECAR_STATUS_ANNOTATION))
            .and_then(|s| s.as_str().map(str::to_string));
        assert_eq!(annotations, before["metadata"]["annotations"]);
        let status: SidecarStatus = serde_json::from_str(&status.unwrap_or_default()).unwrap();
        assert_eq!(status.init_containers, ["envoy-init-mgr"]);
        assert_eq!(after["metadata"]["labels"], before["metadata"]["labels"]);
        // Injecting the injected Pod again gives the same Pod.
        assert_eq!(injected(&after), after);
    }

    #[test]
    fn non_string_metadata_maps_name_the_entry() {
        let cases = [
            (
                pod(
                    json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED, "n": 1}),
                    json!({}),
                ),
                "metadata.labels[\"n\"]",
            ),
            (pod(json!(["x"]), json!({})), "metadata.labels"),
            (
                pod(
                    json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}),
                    json!({"marin3r.3scale.net/node-id": true}),
                ),
                "metadata.annotations[\"marin3r.3scale.net/node-id\"]",
            ),
            (
                pod(
                    json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}),
                    json!("x"),
                ),
                "metadata.annotations",
            ),
        ];
        for (pod, field) in cases {
            match mutate_pod(&pod, None, &Defaults::default()) {
                Err(Error::InvalidPod { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidPod, got {other:?}"),
            }
        }
    }

    #[test]
    fn unlabelled_pods_are_skipped_whatever_their_annotations() {
        let p = pod(
            json!({"app": "x"}),
            json!({"marin3r.3scale.net/node-id": "n"}),
        );
        assert_eq!(
            mutate_pod(&p, None, &Defaults::default()).ok(),
            Some(Mutation::Skipped(SkipReason::NotLabelled))
        );
    }

    fn labelled(annotations: Value, spec: Value) -> Value {
        json!({
            "metadata": {"name": "p", "labels": {marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}, "annotations": annotations},
            "spec": spec
        })
    }

    fn container_names(pod: &Value, key: &str) -> Vec<String> {
        names(
            pod["spec"][key]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
        .map(str::to_string)
        .collect()
    }

    #[test]
    fn forged_status_does_not_remove_user_containers_or_volumes() {
        let forged = json!({
            "marin3r.3scale.net/node-id": "n",
            marin3r_wire::SIDECAR_STATUS_ANNOTATION: r#"{"containers":["app"],"initContainers":["setup"],"volumes":["data","certs"]}"#,
        });
        let before = labelled(
            forged,
            json!({
                "containers": [{"name": "app", "image": "app:1",
                    "volumeMounts": [{"name": "data", "mountPath": "/etc/envoy/bootstrap"}]}],
                "initContainers": [{"name": "setup", "image": "setup:1"}],
                "volumes": [{"name": "data", "emptyDir": {}},
                            {"name": "certs", "secret": {"secretName": "c"}}]
            }),
        );
        let after = injected(&before);
        assert_eq!(
            container_names(&after, "containers"),
            ["app", "envoy-sidecar"]
        );
        assert_eq!(
            container_names(&after, "initContainers"),
            ["setup", "envoy-init-mgr"]
        );
        assert_eq!(
            container_names(&after, "volumes"),
            [
                "data",
                "certs",
                "envoy-sidecar-tls",
                "envoy-sidecar-bootstrap"
            ]
        );
        assert_eq!(
            after["spec"]["containers"][0],
            before["spec"]["containers"][0]
        );
        assert_eq!(injected(&after), after);
    }

    #[test]
    fn forged_status_listing_a_user_container_named_like_the_sidecar_is_denied() {
        let before = labelled(
            json!({
                "marin3r.3scale.net/node-id": "n",
                marin3r_wire::SIDECAR_STATUS_ANNOTATION: r#"{"containers":["envoy-sidecar"],"volumes":["envoy-sidecar-tls"]}"#,
            }),
            json!({
                "containers": [{"name": "app", "image": "app:1"},
                               {"name": "envoy-sidecar", "image": "envoy:mine"}],
                "volumes": [{"name": "envoy-sidecar-tls", "secret": {"secretName": "mine"}}]
            }),
        );
        match mutate_pod(&before, Some("ns"), &Defaults::default()) {
            Err(Error::Annotations(e)) => {
                let fields: Vec<&str> = e.0.iter().map(|e| e.annotation.as_str()).collect();
                assert_eq!(fields, ["container-name", "tls-volume"], "{e}");
            }
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    fn denied_fields(pod: &Value) -> Vec<(String, String)> {
        match mutate_pod(pod, Some("ns"), &Defaults::default()) {
            Err(Error::Annotations(e)) => {
                e.0.into_iter().map(|e| (e.annotation, e.message)).collect()
            }
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    fn with_extra_volumes(secrets: Option<&str>) -> Value {
        let mut annotations = json!({"marin3r.3scale.net/node-id": "n"});
        if let Some(s) = secrets {
            annotations["marin3r.3scale.net/envoy-extra-secret-volumes"] = json!(s);
        }
        labelled(
            annotations,
            json!({
                "containers": [{"name": "app", "image": "app:1",
                    "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}],
                "volumes": [{"name": "creds", "secret": {"secretName": "creds"}},
                            {"name": "settings", "configMap": {"name": "settings"}}]
            }),
        )
    }

    #[test]
    fn reinjection_replaces_the_extra_volumes_exactly() {
        let plain = injected(&with_extra_volumes(None));
        let two = injected(&with_extra_volumes(Some("a:/etc/envoy/a,b:/etc/envoy/b")));
        assert_eq!(
            container_names(&two, "volumes"),
            [
                "creds",
                "settings",
                "envoy-sidecar-tls",
                "envoy-sidecar-bootstrap",
                "envoy-extra-secret-0",
                "envoy-extra-secret-1"
            ]
        );
        assert_eq!(injected(&two), two);
        // One entry dropped: the other is renumbered, nothing is left behind.
        let mut one = two.clone();
        one["metadata"]["annotations"]["marin3r.3scale.net/envoy-extra-secret-volumes"] =
            json!("b:/etc/envoy/b");
        let one = injected(&one);
        assert_eq!(one, injected(&with_extra_volumes(Some("b:/etc/envoy/b"))),);
        // The annotation removed: back to the Pod injected without it.
        let mut none = one.clone();
        if let Some(a) = none["metadata"]["annotations"].as_object_mut() {
            a.remove("marin3r.3scale.net/envoy-extra-secret-volumes");
        }
        assert_eq!(injected(&none), plain);
    }

    #[test]
    fn forged_extra_volume_status_does_not_remove_user_volumes() {
        // The status names the user's Secret and ConfigMap volumes as extra volumes: one
        // is mounted by the app at the recorded path, the other by no container.
        let mut before = with_extra_volumes(Some("a:/etc/envoy/a"));
        before["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION] = json!(
            r#"{"containers":["app"],"extraVolumes":[{"name":"creds","mountPath":"/creds"},{"name":"settings","mountPath":"/settings"}]}"#
        );
        let after = injected(&before);
        assert_eq!(
            container_names(&after, "volumes"),
            [
                "creds",
                "settings",
                "envoy-sidecar-tls",
                "envoy-sidecar-bootstrap",
                "envoy-extra-secret-0"
            ]
        );
        assert_eq!(
            after["spec"]["containers"][0],
            before["spec"]["containers"][0]
        );
        assert_eq!(injected(&after), after);
        // A user volume named like a generated one is denied, naming the annotation.
        let mut clash = with_extra_volumes(Some("a:/etc/envoy/a"));
        clash["spec"]["volumes"][1]["name"] = json!("envoy-extra-secret-0");
        assert_eq!(
            denied_fields(&clash),
            [(
                "envoy-extra-secret-volumes".to_string(),
                "the pod already has a volume named \"envoy-extra-secret-0\"".to_string()
            )]
        );
    }

    #[test]
    fn an_empty_namespace_is_no_namespace() {
        // The request's namespace, else the Pod's, else `default`; an empty one (a Pod of
        // a controller, a manifest with `namespace: ""`) counts as none, as everywhere.
        let xdss_host = |namespace: Option<&str>, pod_namespace: &str| {
            let mut p = labelled(
                json!({"marin3r.3scale.net/node-id": "n"}),
                json!({"containers": [{"name": "app", "image": "a"}]}),
            );
            p["metadata"]["namespace"] = json!(pod_namespace);
            let Ok(Mutation::Injected(pod)) = mutate_pod(&p, namespace, &Defaults::default())
            else {
                panic!("not injected");
            };
            let args: Vec<String> =
                serde_json::from_value(pod["spec"]["initContainers"][0]["args"].clone()).unwrap();
            let at = args.iter().position(|a| a == "--xdss-host").unwrap();
            args[at + 1].clone()
        };
        let host = |ns: &str| format!("marin3r-discoveryservice.{ns}.svc");
        assert_eq!(xdss_host(Some("req"), "pod"), host("req"));
        assert_eq!(xdss_host(Some(""), "pod"), host("pod"));
        assert_eq!(xdss_host(None, "pod"), host("pod"));
        assert_eq!(xdss_host(Some(""), ""), host("default"));
        assert_eq!(xdss_host(None, ""), host("default"));
    }

    #[test]
    fn ephemeral_container_named_like_an_injected_container_is_denied() {
        for (annotations, name) in [
            (json!({"marin3r.3scale.net/node-id": "n"}), "envoy-sidecar"),
            (
                json!({"marin3r.3scale.net/node-id": "n", "marin3r.3scale.net/container-name": "proxy"}),
                "proxy",
            ),
        ] {
            let p = labelled(
                annotations,
                json!({"containers": [{"name": "app", "image": "a"}],
                       "ephemeralContainers": [{"name": name, "image": "debug"}]}),
            );
            let denied = denied_fields(&p);
            assert_eq!(denied.len(), 1, "{denied:?}");
            assert_eq!(denied[0].0, "container-name");
            assert!(
                denied[0].1.contains("spec.ephemeralContainers"),
                "{denied:?}"
            );
        }
    }

    fn mapped(mappings: &str) -> Value {
        json!({"marin3r.3scale.net/node-id": "n",
               "marin3r.3scale.net/ports": "http:8080,dns:8053:UDP",
               "marin3r.3scale.net/host-port-mappings": mappings})
    }

    #[test]
    fn a_host_port_an_app_container_already_uses_is_denied_naming_both() {
        // An app container, an init container and a native-sidecar-style init container
        // (restartPolicy: Always) each already take a host port; protocol TCP by default.
        let spec = json!({
            "containers": [{"name": "app", "image": "a",
                            "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 30000}]}],
            "initContainers": [
                {"name": "setup", "image": "s",
                 "ports": [{"containerPort": 53, "hostPort": 30001, "protocol": "UDP"}]},
                {"name": "agent", "image": "g", "restartPolicy": "Always",
                 "ports": [{"containerPort": 90, "hostPort": 30002, "hostIP": "10.0.0.1"}]}
            ]
        });
        let denied = denied_fields(&labelled(mapped("http:30000"), spec.clone()));
        assert_eq!(
            denied,
            [(
                "host-port-mappings".to_string(),
                "hostPort 30000/TCP is used by both container \"app\" (spec.containers[0].ports[1]) \
                 and the sidecar's port \"http\" (marin3r.3scale.net/host-port-mappings)"
                    .to_string()
            )]
        );
        let denied = denied_fields(&labelled(mapped("dns:30001"), spec.clone()));
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert!(
            denied[0].1.starts_with(
                "hostPort 30001/UDP is used by both container \"setup\" (spec.initContainers[0].ports[0])"
            ),
            "{denied:?}"
        );
        // The sidecar binds every host address: an app port on one hostIP clashes too.
        let denied = denied_fields(&labelled(mapped("http:30002"), spec.clone()));
        assert!(
            denied[0]
                .1
                .contains("container \"agent\" (spec.initContainers[1].ports[0])"),
            "{denied:?}"
        );
        // Every clash is listed, in one error.
        let denied = denied_fields(&labelled(mapped("http:30000,dns:30001"), spec.clone()));
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(
            denied[0].1.matches("is used by both").count(),
            2,
            "{denied:?}"
        );
        // The same number with another protocol, or a free port, is fine.
        injected(&labelled(mapped("dns:30000"), spec.clone()));
        injected(&labelled(mapped("http:30001,dns:30003"), spec));
    }

    #[test]
    fn with_host_network_every_sidecar_port_is_a_host_port() {
        // With hostNetwork a containerPort is a host port: the sidecar's unmapped ports and
        // its admin port clash with the app's.
        let spec = |app_port: u16, protocol: &str| {
            json!({"hostNetwork": true, "containers": [{"name": "app", "image": "a",
                "ports": [{"containerPort": app_port, "protocol": protocol}]}]})
        };
        let annotations = json!({"marin3r.3scale.net/node-id": "n",
                                 "marin3r.3scale.net/ports": "http:8080"});
        let denied = denied_fields(&labelled(annotations.clone(), spec(8080, "TCP")));
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(denied[0].0, "ports");
        assert!(denied[0].1.contains("hostPort 8080/TCP"), "{denied:?}");
        let denied = denied_fields(&labelled(annotations.clone(), spec(9901, "TCP")));
        assert_eq!(denied[0].0, "admin.port", "{denied:?}");
        // Another protocol does not clash, and without hostNetwork a containerPort is not
        // a host port at all.
        injected(&labelled(annotations.clone(), spec(8080, "UDP")));
        let mut own = spec(8080, "TCP");
        own["hostNetwork"] = json!(false);
        injected(&labelled(annotations, own));
    }

    #[test]
    fn reinjection_does_not_clash_with_the_host_ports_of_the_sidecar_it_replaces() {
        let spec = json!({"containers": [{"name": "app", "image": "a",
                          "ports": [{"containerPort": 80, "hostPort": 30001}]}]});
        let once = injected(&labelled(mapped("http:30000"), spec));
        assert_eq!(injected(&once), once);
        // Re-injected with the app now taking the sidecar's old host port: denied.
        let mut taken = once.clone();
        taken["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(30000);
        assert_eq!(denied_fields(&taken)[0].0, "host-port-mappings");
    }

    #[test]
    fn host_network_requires_host_port_equal_to_container_port() {
        let annotations = |mappings: &str| {
            json!({"marin3r.3scale.net/node-id": "n",
                   "marin3r.3scale.net/ports": "http:8080",
                   "marin3r.3scale.net/host-port-mappings": mappings})
        };
        let spec = json!({"hostNetwork": true, "containers": [{"name": "app", "image": "a"}]});
        let denied = denied_fields(&labelled(annotations("http:30000"), spec.clone()));
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(denied[0].0, "host-port-mappings");
        assert!(denied[0].1.contains("spec.hostNetwork"), "{denied:?}");
        // Equal ports are what Kubernetes requires, and are accepted.
        injected(&labelled(annotations("http:8080"), spec));
    }

    fn shutdown_manager_pod(enabled: &str, status: Option<&str>) -> Value {
        let mut annotations = json!({
            "marin3r.3scale.net/node-id": "n",
            "marin3r.3scale.net/shutdown-manager.enabled": enabled,
            "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app,worker",
        });
        if let Some(s) = status {
            annotations[marin3r_wire::SIDECAR_STATUS_ANNOTATION] = json!(s);
        }
        labelled(
            annotations,
            json!({"containers": [
                {"name": "app", "image": "a",
                 "lifecycle": {"postStart": {"exec": {"command": ["warm"]}},
                               "preStop": {"exec": {"command": ["sleep", "5"]}}}},
                {"name": "worker", "image": "w"}
            ]}),
        )
    }

    #[test]
    fn reinjection_without_shutdown_manager_undoes_hooks_and_grace_period() {
        let original = shutdown_manager_pod("false", None);
        let plain = injected(&original);
        let mut with_sm = shutdown_manager_pod("true", None);
        with_sm = injected(&with_sm);
        assert_eq!(with_sm["spec"]["terminationGracePeriodSeconds"], 300);
        assert_eq!(
            with_sm["spec"]["containers"][1]["lifecycle"]["preStop"]["httpGet"]["path"],
            "/drain"
        );
        // The user turns the shutdown manager off and the Pod goes through again.
        let mut turned_off = with_sm.clone();
        turned_off["metadata"]["annotations"]["marin3r.3scale.net/shutdown-manager.enabled"] =
            json!("false");
        let again = injected(&turned_off);
        assert_eq!(again["spec"], plain["spec"]);
        assert_eq!(
            again["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION],
            plain["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION]
        );
        assert_eq!(injected(&again), again);
    }

    #[test]
    fn old_status_annotations_without_recorded_changes_are_still_read() {
        let old = r#"{"containers":["envoy-sidecar"],"initContainers":["envoy-init-mgr"],"volumes":["envoy-sidecar-tls","envoy-sidecar-bootstrap"]}"#;
        let status: SidecarStatus = serde_json::from_str(old).unwrap();
        assert_eq!(status.termination_grace_period, None);
        assert!(status.pre_stop_hooks.is_empty());
        assert_eq!(serde_json::to_string(&status).unwrap(), old);
    }

    #[test]
    fn recorded_changes_are_not_undone_when_the_user_changed_them_since() {
        let mut with_sm = injected(&shutdown_manager_pod("true", None));
        with_sm["spec"]["terminationGracePeriodSeconds"] = json!(600);
        with_sm["spec"]["containers"][1]["lifecycle"] =
            json!({"preStop": {"exec": {"command": ["mine"]}}});
        with_sm["metadata"]["annotations"]["marin3r.3scale.net/shutdown-manager.enabled"] =
            json!("false");
        let again = injected(&with_sm);
        assert_eq!(again["spec"]["terminationGracePeriodSeconds"], 600);
        assert_eq!(
            again["spec"]["containers"][1]["lifecycle"],
            json!({"preStop": {"exec": {"command": ["mine"]}}})
        );
    }
}
