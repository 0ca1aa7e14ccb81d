//! Pod mutation: decides whether a Pod (or a pod template) gets a sidecar and returns the
//! mutated object.
//!
//! The Pod is handled as raw JSON, not as a typed `k8s_openapi` Pod: a round trip through
//! typed structs would drop fields this build does not know (newer Kubernetes versions),
//! and the JSON patch computed from the difference would then delete them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Error;
use crate::annotations::{
    self, AnnotationError, AnnotationErrors, Defaults, SIDECAR_STATUS, STATUS_ENABLED,
    STATUS_LABEL, SidecarConfig,
};
use crate::generate;

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
                    &format!("metadata.{key}[{k:?}]"),
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

/// Returns the array at `spec[key]`, creating it when absent.
fn array_mut<'a>(spec: &'a mut Map<String, Value>, key: &str) -> Result<&'a mut Vec<Value>, Error> {
    let entry = spec
        .entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    if entry.is_null() {
        *entry = Value::Array(Vec::new());
    }
    entry
        .as_array_mut()
        .ok_or_else(|| invalid(&format!("spec.{key}"), "must be a list"))
}

fn names(list: &[Value]) -> impl Iterator<Item = &str> {
    list.iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
}

fn to_value<T: Serialize>(t: &T) -> Result<Value, Error> {
    serde_json::to_value(t).map_err(Error::Serialize)
}

/// Decides and applies sidecar injection for a Pod or pod template (`{metadata, spec}`).
///
/// `namespace` is the namespace the Pod is created in (the admission request's
/// namespace); when `None`, `metadata.namespace` is used, then `default`.
pub fn mutate_pod(
    pod: &Value,
    namespace: Option<&str>,
    defaults: &Defaults,
) -> Result<Mutation, Error> {
    let root = pod
        .as_object()
        .ok_or_else(|| invalid("object", "must be a JSON object"))?;
    let meta = match root.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(invalid("metadata", "must be an object")),
    };
    let labels = string_map(meta, "labels")?;
    if labels.get(STATUS_LABEL).copied() != Some(STATUS_ENABLED) {
        return Ok(Mutation::Skipped(SkipReason::NotLabelled));
    }
    let annotations = string_map(meta, "annotations")?;
    let namespace = namespace
        .filter(|n| !n.is_empty())
        .or_else(|| {
            meta.and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
        })
        .unwrap_or("default")
        .to_string();

    // A malformed status is reported together with the annotation errors.
    let mut status_error = None;
    let previous: SidecarStatus = match annotations.get(SIDECAR_STATUS) {
        None => SidecarStatus::default(),
        Some(s) => serde_json::from_str(s).unwrap_or_else(|e| {
            status_error = Some(AnnotationError {
                annotation: "sidecar-status".into(),
                message: format!("is not the JSON the webhook writes ({e})"),
            });
            SidecarStatus::default()
        }),
    };

    let mut out = pod.clone();
    let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) else {
        return Err(invalid("spec", "is required and must be an object"));
    };
    if !matches!(spec.get("containers"), Some(Value::Array(_))) {
        return Err(invalid("spec.containers", "is required and must be a list"));
    }

    // Remove what an earlier injection added, so injecting twice gives the same Pod. The
    // status annotation is user-writable, so it is trusted only for objects that look
    // like what injection creates; anything else it lists is kept (and a name clash is
    // then denied by `check_conflicts`).
    strip_injected(spec, &previous)?;
    undo_pod_changes(spec, &previous)?;

    let app_containers: BTreeSet<String> = names(array_mut(spec, "containers")?)
        .map(str::to_string)
        .collect();
    let cfg = match (
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

    let init_names: BTreeSet<String> = names(array_mut(spec, "initContainers")?)
        .map(str::to_string)
        .collect();
    let volume_names: BTreeSet<String> = names(array_mut(spec, "volumes")?)
        .map(str::to_string)
        .collect();
    let ephemeral_names: BTreeSet<String> = spec
        .get("ephemeralContainers")
        .and_then(Value::as_array)
        .map(|l| names(l).map(str::to_string).collect())
        .unwrap_or_default();
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    check_conflicts(
        &cfg,
        &PodNames {
            containers: &app_containers,
            init_containers: &init_names,
            ephemeral_containers: &ephemeral_names,
            volumes: &volume_names,
        },
        host_network,
    )?;

    let envoy = to_value(&generate::envoy_container(&cfg))?;
    let init = to_value(&generate::init_manager_container(&cfg))?;
    let shtdn = cfg
        .shutdown_manager
        .as_ref()
        .map(|sm| to_value(&generate::shutdown_manager_container(&cfg, sm)))
        .transpose()?;

    let mut status = SidecarStatus {
        init_containers: vec![generate::INIT_MANAGER_NAME.to_string()],
        volumes: vec![cfg.tls_volume.clone(), cfg.config_volume.clone()],
        ..SidecarStatus::default()
    };
    let mut sidecars = vec![envoy];
    sidecars.extend(shtdn);
    let mut sidecar_names = vec![cfg.container_name.clone()];
    if cfg.shutdown_manager.is_some() {
        sidecar_names.push(generate::SHUTDOWN_MANAGER_NAME.to_string());
    }
    array_mut(spec, "initContainers")?.push(init);
    if cfg.native_sidecar {
        array_mut(spec, "initContainers")?.extend(sidecars);
        status.init_containers.extend(sidecar_names);
    } else {
        array_mut(spec, "containers")?.extend(sidecars);
        status.containers = sidecar_names;
    }
    for v in generate::volumes(&cfg) {
        array_mut(spec, "volumes")?.push(to_value(&v)?);
    }

    if let Some(sm) = &cfg.shutdown_manager {
        let own = match spec.get("terminationGracePeriodSeconds") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| {
                invalid("spec.terminationGracePeriodSeconds", "must be an integer")
            })?),
        };
        let raised = own
            .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD)
            .max(sm.drain_time_seconds);
        spec.insert("terminationGracePeriodSeconds".into(), Value::from(raised));
        if own != Some(raised) {
            status.termination_grace_period = Some(GracePeriodChange {
                previous: own,
                injected: raised,
            });
        }
        let hook = to_value(&generate::drain_pre_stop(sm.port))?;
        for c in array_mut(spec, "containers")?.iter_mut() {
            let Some(name) = c.get("name").and_then(Value::as_str).map(str::to_string) else {
                continue;
            };
            if sm.extra_lifecycle_hooks.contains(&name) {
                status.pre_stop_hooks.push(PreStopChange {
                    container: name,
                    lifecycle: c.get("lifecycle").filter(|l| !l.is_null()).cloned(),
                });
                set_pre_stop(c, hook.clone())?;
            }
        }
    }

    // Only the status is added: the Pod's other annotations stay as they are (the labels
    // check above made `metadata` an object, and `string_map` checked `annotations`).
    let status_json = serde_json::to_string(&status).map_err(Error::Serialize)?;
    let annotations = out
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| invalid("metadata", "must be an object"))?
        .entry("annotations")
        .or_insert(Value::Null);
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    annotations
        .as_object_mut()
        .ok_or_else(|| invalid("metadata.annotations", "must be a map of strings"))?
        .insert(SIDECAR_STATUS.to_string(), Value::String(status_json));
    Ok(Mutation::Injected(Box::new(out)))
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
        && args.starts_with(&["-c", generate::CONFIG_FILE]);
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

/// Removes the containers and volumes `previous` lists, but only those that look like
/// what injection creates: a container must have an injected shape ([`looks_injected`]);
/// a volume must be mounted by a removed container where injection mounts it, be of the
/// kind injection creates there (the tls Secret volume, the config emptyDir) and be
/// mounted by no remaining container.
fn strip_injected(spec: &mut Map<String, Value>, previous: &SidecarStatus) -> Result<(), Error> {
    let listed = |c: &Value| {
        c.get("name").and_then(Value::as_str).is_some_and(|n| {
            previous
                .containers
                .iter()
                .chain(&previous.init_containers)
                .any(|x| x == n)
        })
    };
    let mut removed: Vec<Value> = Vec::new();
    for key in ["containers", "initContainers"] {
        let list = array_mut(spec, key)?;
        let (gone, kept): (Vec<Value>, Vec<Value>) = std::mem::take(list)
            .into_iter()
            .partition(|c| listed(c) && looks_injected(c));
        *list = kept;
        removed.extend(gone);
    }
    let kept_mounts: BTreeSet<String> = ["containers", "initContainers", "ephemeralContainers"]
        .into_iter()
        .filter_map(|key| spec.get(key).and_then(Value::as_array))
        .flatten()
        .flat_map(|c| mounts(c).map(|(n, _)| n.to_string()))
        .collect();
    let removable = |v: &Value| {
        let Some(name) = v.get("name").and_then(Value::as_str) else {
            return false;
        };
        let kind_at = |path: &str| match path {
            generate::TLS_MOUNT_PATH => v.get("secret").is_some_and(Value::is_object),
            generate::CONFIG_MOUNT_PATH => v.get("emptyDir").is_some_and(Value::is_object),
            _ => false,
        };
        previous.volumes.iter().any(|x| x == name)
            && !kept_mounts.contains(name)
            && removed
                .iter()
                .flat_map(mounts)
                .any(|(n, path)| n == name && kind_at(path))
    };
    array_mut(spec, "volumes")?.retain(|v| !removable(v));
    Ok(())
}

/// Whether a lifecycle handler is the `GET <port>/drain` preStop injection sets.
fn is_drain_hook(pre_stop: Option<&Value>) -> bool {
    let get = pre_stop.and_then(|h| h.get("httpGet"));
    get.and_then(|g| g.get("path")).and_then(Value::as_str) == Some(generate::DRAIN_PATH)
        && get.and_then(|g| g.get("port")).is_some_and(Value::is_u64)
}

/// Undoes the Pod changes an earlier injection recorded in its status: the raised
/// `terminationGracePeriodSeconds` (only if it still has the injected value) and the
/// `GET /drain` preStop hooks (only on containers whose preStop is still such a hook).
fn undo_pod_changes(spec: &mut Map<String, Value>, previous: &SidecarStatus) -> Result<(), Error> {
    if let Some(grace) = &previous.termination_grace_period
        && spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(grace.injected)
    {
        match grace.previous {
            Some(v) => spec.insert("terminationGracePeriodSeconds".into(), Value::from(v)),
            None => spec.remove("terminationGracePeriodSeconds"),
        };
    }
    for change in &previous.pre_stop_hooks {
        for c in array_mut(spec, "containers")?.iter_mut() {
            let named = c.get("name").and_then(Value::as_str) == Some(change.container.as_str());
            let hooked = is_drain_hook(c.get("lifecycle").and_then(|l| l.get("preStop")));
            let Some(obj) = c.as_object_mut().filter(|_| named && hooked) else {
                continue;
            };
            match &change.lifecycle {
                Some(l) => obj.insert("lifecycle".into(), l.clone()),
                None => obj.remove("lifecycle"),
            };
        }
    }
    Ok(())
}

/// Replaces only `lifecycle.preStop` of a container, keeping `postStart`.
fn set_pre_stop(container: &mut Value, hook: Value) -> Result<(), Error> {
    let name = container
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let obj = container
        .as_object_mut()
        .ok_or_else(|| invalid("spec.containers", "entries must be objects"))?;
    let lifecycle = obj
        .entry("lifecycle")
        .or_insert_with(|| Value::Object(Map::new()));
    if lifecycle.is_null() {
        *lifecycle = Value::Object(Map::new());
    }
    lifecycle
        .as_object_mut()
        .ok_or_else(|| {
            invalid(
                &format!("spec.containers[{name:?}].lifecycle"),
                "must be an object",
            )
        })?
        .insert("preStop".into(), hook);
    Ok(())
}

/// The names already in the Pod (after removing an earlier injection).
struct PodNames<'a> {
    containers: &'a BTreeSet<String>,
    init_containers: &'a BTreeSet<String>,
    ephemeral_containers: &'a BTreeSet<String>,
    volumes: &'a BTreeSet<String>,
}

/// Denies up front what the API server would reject after injection: names the injected
/// objects share with the Pod's (containers, init and ephemeral containers, volumes), and
/// with `hostNetwork: true` a hostPort different from its containerPort.
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
    for (key, vol) in [
        (annotations::keys::TLS_VOLUME, &cfg.tls_volume),
        (annotations::keys::CONFIG_VOLUME, &cfg.config_volume),
    ] {
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
            json!({STATUS_LABEL: STATUS_ENABLED}),
            json!({"marin3r.3scale.net/node-id": "n", "team": "a", "z-last": ""}),
        );
        let after = injected(&before);
        let mut annotations = after["metadata"]["annotations"].clone();
        let status = annotations
            .as_object_mut()
            .and_then(|m| m.remove(SIDECAR_STATUS))
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
                pod(json!({STATUS_LABEL: STATUS_ENABLED, "n": 1}), json!({})),
                "metadata.labels[\"n\"]",
            ),
            (pod(json!(["x"]), json!({})), "metadata.labels"),
            (
                pod(
                    json!({STATUS_LABEL: STATUS_ENABLED}),
                    json!({"marin3r.3scale.net/node-id": true}),
                ),
                "metadata.annotations[\"marin3r.3scale.net/node-id\"]",
            ),
            (
                pod(json!({STATUS_LABEL: STATUS_ENABLED}), json!("x")),
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
            "metadata": {"name": "p", "labels": {STATUS_LABEL: STATUS_ENABLED}, "annotations": annotations},
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
            SIDECAR_STATUS: r#"{"containers":["app"],"initContainers":["setup"],"volumes":["data","certs"]}"#,
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
                SIDECAR_STATUS: r#"{"containers":["envoy-sidecar"],"volumes":["envoy-sidecar-tls"]}"#,
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
            annotations[SIDECAR_STATUS] = json!(s);
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
            again["metadata"]["annotations"][SIDECAR_STATUS],
            plain["metadata"]["annotations"][SIDECAR_STATUS]
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
