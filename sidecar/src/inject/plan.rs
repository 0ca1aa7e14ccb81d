//! The decision: whether a Pod gets a sidecar ([`Plan`]) and what injection changes
//! ([`Injection`]), computed from the Pod without copying it.

use std::collections::BTreeSet;

use marin3r_wire::quote::bounded;
use serde_json::Value;

use super::conflicts::{PodNames, check_conflicts};
use super::edit::{
    Added, CONTAINERS, GraceEdit, INIT_CONTAINERS, Injection, LISTS, ListEdit, VOLUMES,
};
use super::pod::{invalid, names, string_map, to_value};
use super::status::{ExtraVolumeMount, GracePeriodChange, PreStopChange, SidecarStatus};
use super::undo::{strip_injected, undo_pod_changes, with_pre_stop};
use crate::Error;
use crate::RunAs;
use crate::annotations::{self, AnnotationError, AnnotationErrors, Defaults};
use crate::generate;
use crate::host_ports::HostPortUse;
use crate::host_ports::container_host_ports;

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

/// The result of [`plan_pod`].
#[derive(Debug)]
pub enum Plan<'a, F = Value> {
    /// Nothing to do; the Pod is allowed unchanged.
    Skipped(SkipReason),
    /// What injection changes in the Pod.
    Inject(Box<Injection<'a, F>>),
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
/// response, which only writes the patch ([`Injection::patch`], [`InjectionPatch::to_json`](super::InjectionPatch::to_json)).
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
