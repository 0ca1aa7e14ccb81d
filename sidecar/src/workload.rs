//! Offline injection into workloads (`marin3r inject`, design.md §1.4): the pod template of
//! a Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob gets exactly what the
//! webhook would inject into the Pods it creates.

use serde_json::Value;

use crate::Error;
use crate::annotations::Defaults;
use crate::inject::{Mutation, mutate_pod};

/// JSON pointer of the pod template inside a workload of `kind`, `""` for a Pod.
pub fn pod_template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Injects the sidecar into a workload's pod template (or a Pod) and returns the object;
/// an object whose template is not labelled for injection comes back unchanged.
pub fn inject_workload(object: &Value, defaults: &Defaults) -> Result<Value, Error> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let pointer = pod_template_pointer(kind).ok_or_else(|| Error::UnsupportedKind {
        kind: kind.to_string(),
    })?;
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    let template = object.pointer(pointer).ok_or_else(|| Error::InvalidPod {
        field: pointer.trim_start_matches('/').replace('/', "."),
        message: format!("a {kind} needs a pod template"),
    })?;
    match mutate_pod(template, namespace, defaults)? {
        Mutation::Skipped(_) => Ok(object.clone()),
        Mutation::Injected(pod) => {
            let mut out = object.clone();
            if let Some(slot) = out.pointer_mut(pointer) {
                *slot = *pod;
            }
            Ok(out)
        }
    }
}
/// `marin3r inject` over the documents of a file: workloads (and Pods) get the sidecar,
/// every other object (Services, ConfigMaps, …) passes through unchanged, in order.
/// Every workload that cannot be injected is reported, as `<kind>/<name>: <error>`.
pub fn inject_documents(docs: Vec<Value>, defaults: &Defaults) -> Result<Vec<Value>, Vec<String>> {
    let mut out = Vec::with_capacity(docs.len());
    let mut errors = Vec::new();
    for obj in docs.into_iter().filter(|d| !d.is_null()) {
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        if pod_template_pointer(kind).is_none() {
            out.push(obj);
            continue;
        }
        match inject_workload(&obj, defaults) {
            Ok(v) => out.push(v),
            Err(e) => {
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("<unnamed>");
                errors.push(format!(
                    "{kind}/{}: {e}",
                    marin3r_wire::quote::bounded(name)
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}
