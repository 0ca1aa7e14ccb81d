//! Undoing an earlier injection: which recorded containers and volumes still look
//! injected and are removed, and the recorded Pod changes put back.

use std::collections::BTreeSet;

use marin3r_wire::quote::quoted;
use serde_json::{Map, Value};

use super::edit::{Added, GraceEdit, ListEdit, VOLUMES};
use super::pod::invalid;
use super::status::SidecarStatus;
use crate::Error;
use crate::generate;

/// `c[key]` as a list of strings, if it is one.
pub(super) fn strings<'a>(c: &'a Value, key: &str) -> Option<Vec<&'a str>> {
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
pub(super) fn strip_injected<F: Added>(
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
pub(super) fn undo_pod_changes<F: Added>(
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
pub(super) fn with_pre_stop(
    lifecycle: Option<Value>,
    hook: Value,
    container: &str,
) -> Result<Value, Error> {
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
