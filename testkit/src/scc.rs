//! A model of OpenShift's SecurityContextConstraints admission, over Pods as JSON: what
//! the API server of an OpenShift 4.11+ cluster does to a Pod (mutation) and what it
//! refuses (validation), for the default SCCs a Pod of a user namespace meets.
//!
//! Written from the behaviour of `openshift/apiserver-library-go`
//! `pkg/securitycontextconstraints` (`sccmatching/provider.go`, `user/`, `group/`,
//! `selinux/`, `capabilities/`, `seccomp/`, `sccadmission/admission.go`) and the SCC
//! manifests of `openshift/cluster-kube-apiserver-operator`; the error texts are
//! OpenShift's (`spec.containers[0].securityContext.runAsUser: Invalid value: 101: must
//! be in the ranges: [1000680000, 1000689999]`).
//!
//! The admission order on a Pod CREATE ([`admit_with_webhook`]):
//! 1. SCC mutates and validates the Pod (it fills `runAsUser` with the namespace's
//!    uid-range start, `fsGroup`, `seLinuxOptions`, the pod seccomp profile, drops
//!    capabilities) and annotates it `openshift.io/scc: <name>`;
//! 2. mutating webhooks patch it (marin3r's injection);
//! 3. SCC runs again (reinvocation) when a webhook changed the Pod, and fills the new
//!    containers;
//! 4. the validating phase applies the SCC once more and refuses any change it would
//!    make ("failures final validation after mutating admission").
//!
//! One SCC is modelled at a time: the one the Pod's service account may use (a real
//! cluster tries every usable SCC by priority and keeps the first that admits).
//! Not modelled: sysctls, flexVolume drivers, `readOnlyRootFilesystem`-requiring SCCs.

use serde_json::{Map, Value, json};

/// The namespace annotation with the UIDs of the namespace (`<start>/<size>`).
pub const UID_RANGE_ANNOTATION: &str = "openshift.io/sa.scc.uid-range";
/// The namespace annotation with its supplemental groups (`<start>/<size>[,…]`);
/// `fsGroup` must be its first GID. Falls back to the uid-range when absent.
pub const SUPPLEMENTAL_GROUPS_ANNOTATION: &str = "openshift.io/sa.scc.supplemental-groups";
/// The namespace annotation with its SELinux MCS level (`s0:c26,c15`).
pub const MCS_ANNOTATION: &str = "openshift.io/sa.scc.mcs";
/// The Pod annotation naming the SCC that admitted it.
pub const SCC_ANNOTATION: &str = "openshift.io/scc";
/// The Pod annotation SCC admission writes with the pod's seccomp profile.
pub const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// The prefix of a container's seccomp annotation (then the container name).
pub const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str =
    "container.seccomp.security.alpha.kubernetes.io/";

/// The uid-range of [`example_namespace`] (a namespace OpenShift annotated).
pub const EXAMPLE_UID_RANGE: &str = "1000680000/10000";
/// The MCS level of [`example_namespace`].
pub const EXAMPLE_MCS: &str = "s0:c26,c15";

/// The annotations OpenShift gives a new namespace (the ones SCC admission reads).
pub fn example_namespace() -> Value {
    json!({
        UID_RANGE_ANNOTATION: EXAMPLE_UID_RANGE,
        SUPPLEMENTAL_GROUPS_ANNOTATION: EXAMPLE_UID_RANGE,
        MCS_ANNOTATION: EXAMPLE_MCS,
    })
}

/// The SecurityContextConstraints modelled (as shipped with OpenShift 4.11+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scc {
    /// The default for every authenticated user since 4.11: a UID in the namespace's
    /// range, `fsGroup` its first GID, seccomp `runtime/default`, drop ALL (may add
    /// NET_BIND_SERVICE), no privilege escalation, no host namespaces or ports.
    RestrictedV2,
    /// The pre-4.11 default (still granted on upgraded clusters): a UID in the range,
    /// drops KILL, MKNOD, SETUID, SETGID, allows privilege escalation, and no seccomp
    /// field at all ("seccomp may not be set").
    Restricted,
    /// Any non-root UID (the image's numeric USER counts), otherwise like restricted-v2
    /// without the `fsGroup` rule.
    NonrootV2,
    /// Any UID, drops MKNOD only, no seccomp field at all ("seccomp may not be set").
    Anyuid,
    /// restricted-v2 plus host network and host ports (what `hostPort` needs).
    HostnetworkV2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UserRule {
    MustRunAsRange,
    MustRunAsNonRoot,
    RunAsAny,
}

/// The fields of one SCC that the model uses.
struct Constraints {
    name: &'static str,
    host_network: bool,
    host_ports: bool,
    /// `Some(false)`: escalation forbidden (and defaulted to false); `None`: allowed.
    allow_privilege_escalation: Option<bool>,
    required_drop: &'static [&'static str],
    allowed_add: &'static [&'static str],
    run_as_user: UserRule,
    fs_group_must_run_as: bool,
    supplemental_groups_must_run_as: bool,
    seccomp_profiles: &'static [&'static str],
}

/// The volume types every modelled SCC allows.
const VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

impl Scc {
    /// Every modelled SCC.
    pub const ALL: [Scc; 5] = [
        Scc::RestrictedV2,
        Scc::Restricted,
        Scc::NonrootV2,
        Scc::Anyuid,
        Scc::HostnetworkV2,
    ];

    /// The SCC's name (the value of the Pod's `openshift.io/scc` annotation).
    pub fn name(self) -> &'static str {
        self.constraints().name
    }

    /// The modelled SCC of that name.
    pub fn from_name(name: &str) -> Option<Scc> {
        Scc::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether the SCC allows a seccomp profile (restricted-v2, nonroot-v2,
    /// hostnetwork-v2: `runtime/default`) or refuses any ("seccomp may not be set").
    pub fn allows_seccomp(self) -> bool {
        !self.constraints().seccomp_profiles.is_empty()
    }

    fn constraints(self) -> Constraints {
        match self {
            Scc::RestrictedV2 => Constraints {
                name: "restricted-v2",
                host_network: false,
                host_ports: false,
                allow_privilege_escalation: Some(false),
                required_drop: &["ALL"],
                allowed_add: &["NET_BIND_SERVICE"],
                run_as_user: UserRule::MustRunAsRange,
                fs_group_must_run_as: true,
                supplemental_groups_must_run_as: false,
                seccomp_profiles: &["runtime/default"],
            },
            Scc::Restricted => Constraints {
                name: "restricted",
                host_network: false,
                host_ports: false,
                allow_privilege_escalation: None,
                required_drop: &["KILL", "MKNOD", "SETUID", "SETGID"],
                allowed_add: &[],
                run_as_user: UserRule::MustRunAsRange,
                fs_group_must_run_as: true,
                supplemental_groups_must_run_as: false,
                seccomp_profiles: &[],
            },
            Scc::NonrootV2 => Constraints {
                name: "nonroot-v2",
                host_network: false,
                host_ports: false,
                allow_privilege_escalation: Some(false),
                required_drop: &["ALL"],
                allowed_add: &["NET_BIND_SERVICE"],
                run_as_user: UserRule::MustRunAsNonRoot,
                fs_group_must_run_as: false,
                supplemental_groups_must_run_as: false,
                seccomp_profiles: &["runtime/default"],
            },
            Scc::Anyuid => Constraints {
                name: "anyuid",
                host_network: false,
                host_ports: false,
                allow_privilege_escalation: None,
                required_drop: &["MKNOD"],
                allowed_add: &[],
                run_as_user: UserRule::RunAsAny,
                fs_group_must_run_as: false,
                supplemental_groups_must_run_as: false,
                seccomp_profiles: &[],
            },
            Scc::HostnetworkV2 => Constraints {
                name: "hostnetwork-v2",
                host_network: true,
                host_ports: true,
                allow_privilege_escalation: Some(false),
                required_drop: &["ALL"],
                allowed_add: &["NET_BIND_SERVICE"],
                run_as_user: UserRule::MustRunAsRange,
                fs_group_must_run_as: true,
                supplemental_groups_must_run_as: true,
                seccomp_profiles: &["runtime/default"],
            },
        }
    }
}

/// What SCC admission reads from the namespace: the UID range, the groups, the MCS level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// First and last UID of `openshift.io/sa.scc.uid-range`.
    pub uid_min: i64,
    /// Last UID of the range (inclusive).
    pub uid_max: i64,
    /// The blocks of `openshift.io/sa.scc.supplemental-groups` (first, last).
    pub groups: Vec<(i64, i64)>,
    /// `openshift.io/sa.scc.mcs`.
    pub mcs: String,
}

/// A block of IDs: `<start>/<size>` or `<start>-<end>` (library-go `uid.ParseBlock`).
fn parse_block(s: &str) -> Result<(i64, i64), String> {
    let s = s.trim();
    let bad = || format!("invalid block {s:?}: want <start>/<size> or <start>-<end>");
    if let Some((start, size)) = s.split_once('/') {
        let start: i64 = start.parse().map_err(|_| bad())?;
        let size: i64 = size.parse().map_err(|_| bad())?;
        if start < 0 || size < 1 {
            return Err(bad());
        }
        return Ok((start, start + size - 1));
    }
    if let Some((start, end)) = s.split_once('-') {
        let start: i64 = start.parse().map_err(|_| bad())?;
        let end: i64 = end.parse().map_err(|_| bad())?;
        if start < 0 || end < start {
            return Err(bad());
        }
        return Ok((start, end));
    }
    Err(bad())
}

impl Allocation {
    /// Reads the namespace's annotations (a JSON object of strings). Errors as
    /// OpenShift's when an annotation is missing or empty.
    pub fn from_annotations(annotations: &Value) -> Result<Self, String> {
        let get = |key: &str| -> Result<&str, String> {
            match annotations[key].as_str() {
                None => Err(format!("unable to find annotation {key}")),
                Some("") => Err(format!("found annotation {key} but it was empty")),
                Some(v) => Ok(v),
            }
        };
        let (uid_min, uid_max) = parse_block(get(UID_RANGE_ANNOTATION)?)?;
        let groups_text = match annotations[SUPPLEMENTAL_GROUPS_ANNOTATION].as_str() {
            Some(g) => g,
            None => get(UID_RANGE_ANNOTATION)?,
        };
        let groups = groups_text
            .split(',')
            .map(parse_block)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            uid_min,
            uid_max,
            groups,
            mcs: get(MCS_ANNOTATION)?.to_string(),
        })
    }
}

/// `field: Invalid value: <value>: <detail>` (apimachinery's `field.Invalid`).
fn invalid(path: &str, value: impl std::fmt::Display, detail: &str) -> String {
    format!("{path}: Invalid value: {value}: {detail}")
}

/// `field: Required value[: detail]`.
fn required(path: &str, detail: &str) -> String {
    if detail.is_empty() {
        format!("{path}: Required value")
    } else {
        format!("{path}: Required value: {detail}")
    }
}

/// `field: Forbidden: detail`.
fn forbidden(path: &str, detail: &str) -> String {
    format!("{path}: Forbidden: {detail}")
}

/// A Go-like rendering of a JSON scalar in an error (strings quoted, null as `null`).
fn go_value(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// The container lists SCC visits, in its order, with their field names.
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// The seccomp annotation value of a `seccompProfile` field ("" when it has none).
fn seccomp_annotation_for(profile: &Value) -> String {
    match profile["type"].as_str() {
        Some("Unconfined") => "unconfined".into(),
        Some("RuntimeDefault") => "runtime/default".into(),
        Some("Localhost") => match profile["localhostProfile"].as_str() {
            Some(p) => format!("localhost/{p}"),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// The `seccompProfile` field of a seccomp annotation value.
fn seccomp_field_for(annotation: &str) -> Value {
    match annotation {
        "unconfined" => json!({"type": "Unconfined"}),
        "runtime/default" | "docker/default" => json!({"type": "RuntimeDefault"}),
        other => match other.strip_prefix("localhost/") {
            Some(p) if !p.is_empty() => json!({"type": "Localhost", "localhostProfile": p}),
            _ => Value::Null,
        },
    }
}

/// Sets `v.<key>`, making `v` an object when it is not one (null or absent).
fn set(v: &mut Value, key: &str, value: Value) {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    if let Some(m) = v.as_object_mut() {
        m.insert(key.into(), value);
    }
}

/// A container's effective value of `securityContext.<key>`: its own, else the Pod's.
fn effective<'a>(container: &'a Value, pod_sc: &'a Value, key: &str) -> &'a Value {
    let own = &container["securityContext"][key];
    if own.is_null() { &pod_sc[key] } else { own }
}

impl Constraints {
    /// SCC's pod-level mutation (selinux, fsGroup, supplementalGroups, seccomp).
    fn mutate_pod(&self, pod: &mut Value, ns: &Allocation) {
        let sc = pod["spec"]["securityContext"].clone();
        let at = &mut pod["spec"]["securityContext"];
        if sc["seLinuxOptions"].is_null() {
            set(at, "seLinuxOptions", json!({"level": ns.mcs}));
        }
        let first_gid = ns.groups.first().map(|g| g.0);
        if let Some(gid) = first_gid {
            if self.fs_group_must_run_as && sc["fsGroup"].is_null() {
                set(at, "fsGroup", json!(gid));
            }
            let no_groups = sc["supplementalGroups"]
                .as_array()
                .is_none_or(Vec::is_empty);
            if self.supplemental_groups_must_run_as && no_groups {
                set(at, "supplementalGroups", json!([gid]));
            }
        }
        // The seccomp profile: the field, else the pod annotation, else the SCC's first.
        let from_annotation = pod["metadata"]["annotations"][SECCOMP_POD_ANNOTATION]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let profile = if !sc["seccompProfile"].is_null() {
            seccomp_annotation_for(&sc["seccompProfile"])
        } else if !from_annotation.is_empty() {
            from_annotation
        } else {
            self.seccomp_profiles
                .first()
                .map(|p| p.to_string())
                .unwrap_or_default()
        };
        if !profile.is_empty() {
            set(
                &mut pod["spec"]["securityContext"],
                "seccompProfile",
                seccomp_field_for(&profile),
            );
            set(
                &mut pod["metadata"]["annotations"],
                SECCOMP_POD_ANNOTATION,
                json!(profile),
            );
        }
    }

    /// SCC's container mutation: runAsUser, seLinuxOptions, capabilities, runAsNonRoot,
    /// the container seccomp annotation, allowPrivilegeEscalation.
    fn mutate_container(
        &self,
        container: &mut Value,
        pod_sc: &Value,
        annotations: &Value,
        ns: &Allocation,
    ) {
        let name = container["name"].as_str().unwrap_or_default().to_string();
        if effective(container, pod_sc, "runAsUser").is_null()
            && self.run_as_user == UserRule::MustRunAsRange
        {
            set(
                &mut container["securityContext"],
                "runAsUser",
                json!(ns.uid_min),
            );
        }
        if effective(container, pod_sc, "seLinuxOptions").is_null() {
            set(
                &mut container["securityContext"],
                "seLinuxOptions",
                json!({"level": ns.mcs}),
            );
        }
        // Capabilities: required drops and default adds joined to the container's own.
        let caps = &container["securityContext"]["capabilities"];
        let names = |list: &Value| -> std::collections::BTreeSet<String> {
            list.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        };
        let own_add = names(&caps["add"]);
        let own_drop = names(&caps["drop"]);
        let mut drop = own_drop.clone();
        drop.extend(self.required_drop.iter().map(|c| c.to_string()));
        if drop.len() != own_drop.len() {
            let mut new_caps = Map::new();
            if !own_add.is_empty() {
                new_caps.insert("add".into(), json!(own_add));
            }
            new_caps.insert("drop".into(), json!(drop));
            set(
                &mut container["securityContext"],
                "capabilities",
                Value::Object(new_caps),
            );
        }
        if effective(container, pod_sc, "runAsNonRoot").is_null() {
            let non_root = match effective(container, pod_sc, "runAsUser").as_i64() {
                None => self.run_as_user == UserRule::MustRunAsNonRoot,
                Some(uid) => uid > 0,
            };
            if non_root {
                set(
                    &mut container["securityContext"],
                    "runAsNonRoot",
                    json!(true),
                );
            }
        }
        let key = format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{name}");
        if let Some(p) = annotations[key.as_str()].as_str() {
            set(
                &mut container["securityContext"],
                "seccompProfile",
                seccomp_field_for(p),
            );
        }
        if self.allow_privilege_escalation == Some(false)
            && container["securityContext"]["allowPrivilegeEscalation"].is_null()
        {
            set(
                &mut container["securityContext"],
                "allowPrivilegeEscalation",
                json!(false),
            );
        }
    }

    fn validate_seccomp(&self, path: &str, profile: &str) -> Option<String> {
        if self.seccomp_profiles.is_empty() {
            return (!profile.is_empty()).then(|| forbidden(path, "seccomp may not be set"));
        }
        let runtime_default = |p: &str| p == "runtime/default" || p == "docker/default";
        let ok = self
            .seccomp_profiles
            .iter()
            .any(|p| *p == profile || (runtime_default(p) && runtime_default(profile)));
        (!ok).then(|| {
            forbidden(
                path,
                &format!(
                    "{profile} is not an allowed seccomp profile. Valid values are [{}]",
                    self.seccomp_profiles.join(" ")
                ),
            )
        })
    }

    fn validate_selinux(&self, path: &str, options: &Value, ns: &Allocation) -> Vec<String> {
        let path = format!("{path}.seLinuxOptions");
        if options.is_null() {
            return vec![required(&path, "")];
        }
        let mut out = Vec::new();
        let level = options["level"].as_str().unwrap_or_default();
        if !equal_levels(&ns.mcs, level) {
            out.push(invalid(
                &format!("{path}.level"),
                format!("{level:?}"),
                &format!("must be {}", ns.mcs),
            ));
        }
        for key in ["role", "type", "user"] {
            let v = options[key].as_str().unwrap_or_default();
            if !v.is_empty() {
                out.push(invalid(
                    &format!("{path}.{key}"),
                    format!("{v:?}"),
                    "must be ",
                ));
            }
        }
        out
    }

    fn validate_groups(&self, path: &str, groups: &[i64], ranges: &[(i64, i64)]) -> Vec<String> {
        let shown = if groups.is_empty() {
            "[]int64(nil)".to_string()
        } else {
            format!(
                "[]int64{{{}}}",
                groups
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        if groups.is_empty() {
            return vec![invalid(
                path,
                &shown,
                "unable to validate empty groups against required ranges",
            )];
        }
        groups
            .iter()
            .filter(|g| !ranges.iter().any(|(lo, hi)| lo <= *g && *g <= hi))
            .map(|g| invalid(path, &shown, &format!("{g} is not an allowed group")))
            .collect()
    }

    /// Pod-level validation: host namespaces, selinux, fsGroup, supplementalGroups,
    /// seccomp, volumes.
    fn validate_pod(&self, pod: &Value, ns: &Allocation) -> Vec<String> {
        let spec = &pod["spec"];
        let sc = &spec["securityContext"];
        let mut out = Vec::new();
        for (key, allowed, text) in [
            ("hostPID", false, "Host PID is not allowed to be used"),
            (
                "hostNetwork",
                self.host_network,
                "Host network is not allowed to be used",
            ),
            ("hostIPC", false, "Host IPC is not allowed to be used"),
        ] {
            if !allowed && spec[key] == true {
                out.push(invalid(&format!("spec.securityContext.{key}"), true, text));
            }
        }
        out.extend(self.validate_selinux("spec.securityContext", &sc["seLinuxOptions"], ns));
        let ints = |v: &Value| -> Vec<i64> {
            match v {
                Value::Array(a) => a.iter().filter_map(Value::as_i64).collect(),
                other => other.as_i64().into_iter().collect(),
            }
        };
        if self.fs_group_must_run_as {
            // fsGroup must be the first GID of the first block.
            let ranges: Vec<(i64, i64)> =
                ns.groups.first().map(|g| (g.0, g.0)).into_iter().collect();
            out.extend(self.validate_groups(
                "spec.securityContext.fsGroup",
                &ints(&sc["fsGroup"]),
                &ranges,
            ));
        }
        if self.supplemental_groups_must_run_as {
            out.extend(self.validate_groups(
                "spec.securityContext.supplementalGroups",
                &ints(&sc["supplementalGroups"]),
                &ns.groups,
            ));
        }
        let pod_profile = match pod["metadata"]["annotations"][SECCOMP_POD_ANNOTATION].as_str() {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => seccomp_annotation_for(&sc["seccompProfile"]),
        };
        out.extend(self.validate_seccomp(
            &format!("pod.metadata.annotations[{SECCOMP_POD_ANNOTATION}]"),
            &pod_profile,
        ));
        for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
            for key in v.as_object().into_iter().flat_map(|o| o.keys()) {
                if key == "name" || VOLUMES.contains(&key.as_str()) {
                    continue;
                }
                out.push(invalid(
                    &format!("spec.volumes[{i}]"),
                    format!("{key:?}"),
                    &format!("{key} volumes are not allowed to be used"),
                ));
            }
        }
        out
    }

    /// Container-level validation at `path` (`spec.containers[0]`).
    fn validate_container(
        &self,
        path: &str,
        c: &Value,
        pod: &Value,
        ns: &Allocation,
    ) -> Vec<String> {
        let pod_sc = &pod["spec"]["securityContext"];
        let sc_path = format!("{path}.securityContext");
        let sc = &c["securityContext"];
        let mut out = Vec::new();
        if sc["privileged"] == true {
            out.push(invalid(
                &format!("{sc_path}.privileged"),
                true,
                "Privileged containers are not allowed",
            ));
        }
        if self.allow_privilege_escalation == Some(false) && sc["allowPrivilegeEscalation"] != false
        {
            out.push(invalid(
                &format!("{sc_path}.allowPrivilegeEscalation"),
                go_value(&sc["allowPrivilegeEscalation"]),
                "Allowing privilege escalation for containers is not allowed",
            ));
        }
        let run_as_user = effective(c, pod_sc, "runAsUser");
        let run_as_non_root = effective(c, pod_sc, "runAsNonRoot");
        match self.run_as_user {
            UserRule::MustRunAsRange => match run_as_user.as_i64() {
                None => out.push(required(&format!("{sc_path}.runAsUser"), "")),
                Some(uid) if uid < ns.uid_min || uid > ns.uid_max => out.push(invalid(
                    &format!("{sc_path}.runAsUser"),
                    uid,
                    &format!("must be in the ranges: [{}, {}]", ns.uid_min, ns.uid_max),
                )),
                Some(_) => {}
            },
            UserRule::MustRunAsNonRoot => {
                if run_as_non_root.is_null() && run_as_user.is_null() {
                    out.push(required(&format!("{sc_path}.runAsNonRoot"), "must be true"));
                } else if run_as_non_root == false {
                    out.push(invalid(
                        &format!("{sc_path}.runAsNonRoot"),
                        false,
                        "must be true",
                    ));
                } else if run_as_user == 0 {
                    out.push(invalid(
                        &format!("{sc_path}.runAsUser"),
                        0,
                        "running with the root UID is forbidden",
                    ));
                }
            }
            UserRule::RunAsAny => {}
        }
        out.extend(self.validate_selinux(&sc_path, effective(c, pod_sc, "seLinuxOptions"), ns));
        let caps = &sc["capabilities"];
        if caps.is_null() {
            if !self.required_drop.is_empty() {
                out.push(invalid(
                    &format!("{sc_path}.capabilities"),
                    "null",
                    "required capabilities are not set on the securityContext",
                ));
            }
        } else {
            for add in caps["add"].as_array().into_iter().flatten() {
                let name = add.as_str().unwrap_or_default();
                if !self.allowed_add.contains(&name) {
                    out.push(invalid(
                        &format!("{sc_path}.capabilities.add"),
                        format!("{name:?}"),
                        "capability may not be added",
                    ));
                }
            }
            let drops: Vec<&str> = caps["drop"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            for need in self.required_drop {
                if !drops.contains(need) {
                    out.push(invalid(
                        &format!("{sc_path}.capabilities.drop"),
                        format!("{drops:?}"),
                        &format!("{need} is required to be dropped but was not found"),
                    ));
                }
            }
        }
        // Seccomp: the container field, its annotation, the pod field, the pod annotation.
        let name = c["name"].as_str().unwrap_or_default();
        let key = format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{name}");
        let annotations = &pod["metadata"]["annotations"];
        let profile = if !sc["seccompProfile"].is_null() {
            seccomp_annotation_for(&sc["seccompProfile"])
        } else if let Some(p) = annotations[key.as_str()].as_str() {
            p.to_string()
        } else if !pod_sc["seccompProfile"].is_null() {
            seccomp_annotation_for(&pod_sc["seccompProfile"])
        } else {
            annotations[SECCOMP_POD_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        out.extend(self.validate_seccomp(&format!("pod.metadata.annotations[{key}]"), &profile));
        if !self.host_ports {
            for p in c["ports"].as_array().into_iter().flatten() {
                if let Some(hp) = p["hostPort"].as_i64().filter(|hp| *hp > 0) {
                    out.push(invalid(
                        &format!("{path}.ports.hostPort"),
                        hp,
                        "Host ports are not allowed to be used",
                    ));
                }
            }
        }
        out
    }

    /// SCC's `ApplyToPod`: mutate the pod, validate it, then mutate and validate each
    /// container (init, regular, ephemeral). Returns the mutated copy or every error.
    fn apply(&self, pod: &Value, ns: &Allocation) -> Result<Value, Vec<String>> {
        let mut pod = pod.clone();
        self.mutate_pod(&mut pod, ns);
        let mut errors = self.validate_pod(&pod, ns);
        let pod_sc = pod["spec"]["securityContext"].clone();
        let annotations = pod["metadata"]["annotations"].clone();
        for list in CONTAINER_LISTS {
            let len = pod["spec"][list].as_array().map_or(0, Vec::len);
            for i in 0..len {
                self.mutate_container(&mut pod["spec"][list][i], &pod_sc, &annotations, ns);
                let path = format!("spec.{list}[{i}]");
                errors.extend(self.validate_container(&path, &pod["spec"][list][i], &pod, ns));
            }
        }
        if errors.is_empty() {
            Ok(pod)
        } else {
            Err(errors)
        }
    }
}

/// SELinux levels are equal when their sensitivity and their set of categories are.
fn equal_levels(expected: &str, actual: &str) -> bool {
    if expected == actual {
        return true;
    }
    match (expected.split_once(':'), actual.split_once(':')) {
        (Some((es, ec)), Some((as_, ac))) => {
            fn categories(c: &str) -> Vec<&str> {
                let mut v: Vec<&str> = c.split(',').collect();
                v.sort_unstable();
                v
            }
            es == as_ && categories(ec) == categories(ac)
        }
        _ => false,
    }
}

fn prefixed(scc: Scc, errors: Vec<String>) -> Vec<String> {
    errors
        .into_iter()
        .map(|e| format!("provider {:?}: {e}", scc.name()))
        .collect()
}

/// SCC admission of a Pod CREATE (the mutating phase): `pod` mutated by `scc` and
/// annotated `openshift.io/scc`, or every error (each prefixed `provider "<name>": `).
/// `namespace_annotations` is the namespace's `metadata.annotations`.
pub fn admit(pod: &Value, namespace_annotations: &Value, scc: Scc) -> Result<Value, Vec<String>> {
    admit_any(pod, namespace_annotations, &[scc])
}

/// The SCCs in the order admission tries them: the one the Pod's `openshift.io/scc`
/// names first (OpenShift's hint), then the others as given (by priority, most
/// restrictive first, as the cluster sorts them).
fn in_hint_order(pod: &Value, sccs: &[Scc]) -> Vec<Scc> {
    let hint = pod["metadata"]["annotations"][SCC_ANNOTATION].as_str();
    let mut out: Vec<Scc> = sccs
        .iter()
        .copied()
        .filter(|s| Some(s.name()) == hint)
        .collect();
    out.extend(sccs.iter().copied().filter(|s| Some(s.name()) != hint));
    out
}

/// [`admit`] when the Pod's service account may use each of `sccs` (most restrictive
/// first): the first that admits the Pod mutates and names it; every error otherwise.
pub fn admit_any(
    pod: &Value,
    namespace_annotations: &Value,
    sccs: &[Scc],
) -> Result<Value, Vec<String>> {
    let ns = Allocation::from_annotations(namespace_annotations).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    for scc in in_hint_order(pod, sccs) {
        match scc.constraints().apply(pod, &ns) {
            Ok(mut out) => {
                set(
                    &mut out["metadata"]["annotations"],
                    SCC_ANNOTATION,
                    json!(scc.name()),
                );
                return Ok(out);
            }
            Err(e) => errors.extend(prefixed(scc, e)),
        }
    }
    Err(errors)
}

/// SCC's validating phase: `pod` must pass `scc` and the SCC must change nothing.
pub fn validate(pod: &Value, namespace_annotations: &Value, scc: Scc) -> Result<(), Vec<String>> {
    validate_any(pod, namespace_annotations, &[scc])
}

/// [`validate`] with several usable SCCs: one of them must admit the Pod unchanged.
pub fn validate_any(
    pod: &Value,
    namespace_annotations: &Value,
    sccs: &[Scc],
) -> Result<(), Vec<String>> {
    let ns = Allocation::from_annotations(namespace_annotations).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    for scc in in_hint_order(pod, sccs) {
        match scc.constraints().apply(pod, &ns) {
            Ok(applied) if &applied == pod => return Ok(()),
            Ok(applied) => {
                let mut changed = Vec::new();
                diff_paths("", pod, &applied, &mut changed);
                errors.extend(prefixed(
                    scc,
                    vec![format!(
                        "failures final validation after mutating admission (SCC would change {})",
                        changed.join(", ")
                    )],
                ));
            }
            Err(e) => errors.extend(prefixed(scc, e)),
        }
    }
    Err(errors)
}

/// The JSON paths where `a` and `b` differ.
fn diff_paths(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = Value::Null;
                diff_paths(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff_paths(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(path.trim_start_matches('.').to_string()),
        _ => {}
    }
}

/// The whole admission of a Pod CREATE on OpenShift with one mutating webhook: SCC
/// mutates, `webhook` patches (it gets the SCC-mutated Pod and returns the patched
/// Pod), SCC runs again when the webhook changed the Pod (reinvocation), then the
/// validating phase allows no change. The Pod as stored, or every error.
pub fn admit_with_webhook(
    pod: &Value,
    namespace_annotations: &Value,
    scc: Scc,
    webhook: impl FnOnce(&Value) -> Value,
) -> Result<Value, Vec<String>> {
    admit_with_webhook_any(pod, namespace_annotations, &[scc], webhook)
}

/// [`admit_with_webhook`] when the Pod's service account may use each of `sccs` (most
/// restrictive first): the second pass may pick another SCC than the first (a webhook
/// that adds a host port moves the Pod from restricted-v2 to hostnetwork-v2), tried
/// after the one the Pod names.
pub fn admit_with_webhook_any(
    pod: &Value,
    namespace_annotations: &Value,
    sccs: &[Scc],
    webhook: impl FnOnce(&Value) -> Value,
) -> Result<Value, Vec<String>> {
    let first = admit_any(pod, namespace_annotations, sccs)?;
    let patched = webhook(&first);
    let stored = if patched == first {
        first
    } else {
        admit_any(&patched, namespace_annotations, sccs)?
    };
    validate_any(&stored, namespace_annotations, sccs)?;
    Ok(stored)
}

/// A Pod built from a workload's `spec.template` (PodTemplateSpec) admitted as the
/// ReplicaSet controller's CREATE would be: [`admit_with_webhook`] with no webhook.
pub fn admit_template(
    template: &Value,
    namespace_annotations: &Value,
    scc: Scc,
) -> Result<Value, Vec<String>> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": if template["metadata"].is_object() { template["metadata"].clone() } else { json!({}) },
        "spec": template["spec"],
    });
    admit_with_webhook(&pod, namespace_annotations, scc, Value::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first UID of [`EXAMPLE_UID_RANGE`].
    const EXAMPLE_UID: i64 = 1_000_680_000;

    /// A Pod as a user writes it for Pod Security `restricted`, without a UID.
    fn app_pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "app", "namespace": "team"},
            "spec": {
                "containers": [{
                    "name": "app",
                    "image": "app:1",
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }],
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            },
        })
    }

    fn ns() -> Value {
        example_namespace()
    }

    #[test]
    fn each_scc_is_found_by_its_name() {
        for scc in Scc::ALL {
            assert_eq!(Scc::from_name(scc.name()), Some(scc));
        }
        assert_eq!(Scc::from_name("privileged"), None);
        assert!(Scc::RestrictedV2.allows_seccomp() && !Scc::Anyuid.allows_seccomp());
    }

    #[test]
    fn namespace_annotations_parse_and_fail_as_openshift_says() {
        let a = Allocation::from_annotations(&ns()).unwrap();
        assert_eq!((a.uid_min, a.uid_max), (1_000_680_000, 1_000_689_999));
        assert_eq!(a.groups, [(1_000_680_000, 1_000_689_999)]);
        assert_eq!(a.mcs, EXAMPLE_MCS);
        let ranged = json!({UID_RANGE_ANNOTATION: "2000-2999", MCS_ANNOTATION: "s0:c1,c2"});
        let a = Allocation::from_annotations(&ranged).unwrap();
        assert_eq!((a.uid_min, a.uid_max), (2000, 2999));
        assert_eq!(
            a.groups,
            [(2000, 2999)],
            "groups fall back to the uid range"
        );
        assert_eq!(
            Allocation::from_annotations(&json!({MCS_ANNOTATION: "s0"})).unwrap_err(),
            "unable to find annotation openshift.io/sa.scc.uid-range"
        );
        let empty = json!({UID_RANGE_ANNOTATION: "", MCS_ANNOTATION: "s0"});
        assert!(
            Allocation::from_annotations(&empty)
                .unwrap_err()
                .contains("was empty")
        );
        let bad = json!({UID_RANGE_ANNOTATION: "1000/0", MCS_ANNOTATION: "s0"});
        assert!(Allocation::from_annotations(&bad).is_err());
    }

    #[test]
    fn restricted_v2_fills_the_range_start_fsgroup_selinux_and_seccomp() {
        let out = admit(&app_pod(), &ns(), Scc::RestrictedV2).unwrap();
        let sc = &out["spec"]["containers"][0]["securityContext"];
        assert_eq!(sc["runAsUser"], EXAMPLE_UID);
        assert_eq!(sc["runAsNonRoot"], true);
        assert!(sc["runAsGroup"].is_null(), "runAsGroup is never set");
        let psc = &out["spec"]["securityContext"];
        assert_eq!(psc["fsGroup"], EXAMPLE_UID);
        assert_eq!(psc["seLinuxOptions"]["level"], EXAMPLE_MCS);
        assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
        assert!(psc["supplementalGroups"].is_null());
        let annotations = &out["metadata"]["annotations"];
        assert_eq!(annotations[SCC_ANNOTATION], "restricted-v2");
        assert_eq!(annotations[SECCOMP_POD_ANNOTATION], "runtime/default");
        // Admitted once, the Pod passes the final validation unchanged.
        validate(&out, &ns(), Scc::RestrictedV2).unwrap();
    }

    #[test]
    fn restricted_v2_rejects_uid_101_and_accepts_the_range_start() {
        let mut pod = app_pod();
        pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(101);
        let errors = admit(&pod, &ns(), Scc::RestrictedV2).unwrap_err();
        assert_eq!(
            errors,
            [
                "provider \"restricted-v2\": spec.containers[0].securityContext.runAsUser: \
                 Invalid value: 101: must be in the ranges: [1000680000, 1000689999]"
            ]
        );
        for uid in [1_000_680_000, 1_000_689_999] {
            pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(uid);
            admit(&pod, &ns(), Scc::RestrictedV2).unwrap();
        }
        pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(1_000_690_000);
        assert!(admit(&pod, &ns(), Scc::RestrictedV2).is_err());
        // A pod-level runAsUser counts for every container that sets none.
        let mut pod = app_pod();
        pod["spec"]["securityContext"] = json!({"runAsUser": 101});
        let errors = admit(&pod, &ns(), Scc::RestrictedV2).unwrap_err();
        assert!(errors[0].contains("Invalid value: 101"), "{errors:?}");
    }

    #[test]
    fn restricted_v2_rejects_another_fsgroup_hostport_capability_escalation_and_volume() {
        let cases: [(&str, Value, &str); 6] = [
            (
                "/spec/securityContext",
                json!({"fsGroup": 65532}),
                "spec.securityContext.fsGroup: Invalid value: []int64{65532}: 65532 is not an allowed group",
            ),
            (
                "/spec/containers/0/ports",
                json!([{"containerPort": 8080, "hostPort": 8080}]),
                "spec.containers[0].ports.hostPort: Invalid value: 8080: Host ports are not allowed to be used",
            ),
            (
                "/spec/containers/0/securityContext/capabilities/add",
                json!(["NET_ADMIN"]),
                "spec.containers[0].securityContext.capabilities.add: Invalid value: \"NET_ADMIN\": capability may not be added",
            ),
            (
                "/spec/containers/0/securityContext/allowPrivilegeEscalation",
                json!(true),
                "spec.containers[0].securityContext.allowPrivilegeEscalation: Invalid value: true: Allowing privilege escalation for containers is not allowed",
            ),
            (
                "/spec/volumes/0",
                json!({"name": "h", "hostPath": {"path": "/"}}),
                "spec.volumes[0]: Invalid value: \"hostPath\": hostPath volumes are not allowed to be used",
            ),
            (
                "/spec/hostNetwork",
                json!(true),
                "spec.securityContext.hostNetwork: Invalid value: true: Host network is not allowed to be used",
            ),
        ];
        for (pointer, value, want) in cases {
            let mut pod = app_pod();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let at = pod.pointer_mut(parent).unwrap();
            match at {
                Value::Array(a) => a[key.parse::<usize>().unwrap()] = value,
                other => other[key] = value,
            }
            let errors = admit(&pod, &ns(), Scc::RestrictedV2).unwrap_err();
            assert!(
                errors.iter().any(|e| e.ends_with(want)),
                "{pointer}: {errors:?}"
            );
        }
        // NET_BIND_SERVICE may be added; hostnetwork-v2 allows the host port.
        let mut pod = app_pod();
        pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
            json!(["NET_BIND_SERVICE"]);
        pod["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}]);
        assert!(admit(&pod, &ns(), Scc::RestrictedV2).is_err());
        admit(&pod, &ns(), Scc::HostnetworkV2).unwrap();
    }

    #[test]
    fn capabilities_are_dropped_and_escalation_defaulted_for_a_bare_container() {
        let pod = json!({"metadata": {}, "spec": {"containers": [{"name": "bare"}]}});
        let out = admit(&pod, &ns(), Scc::RestrictedV2).unwrap();
        let sc = &out["spec"]["containers"][0]["securityContext"];
        assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}));
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        // The legacy SCC drops its four, sorted, and keeps the container's own adds.
        let pod = json!({"metadata": {}, "spec": {"containers": [{"name": "c",
            "securityContext": {"capabilities": {"add": ["CHOWN"], "drop": ["NET_RAW"]}}}]}});
        let errors = admit(&pod, &ns(), Scc::Restricted).unwrap_err();
        assert!(errors[0].contains("capabilities.add"), "{errors:?}");
        let pod = json!({"metadata": {}, "spec": {"containers": [{"name": "c",
            "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}]}});
        let out = admit(&pod, &ns(), Scc::Restricted).unwrap();
        assert_eq!(
            out["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"],
            json!(["KILL", "MKNOD", "NET_RAW", "SETGID", "SETUID"])
        );
    }

    #[test]
    fn anyuid_and_legacy_restricted_refuse_any_seccomp_field() {
        for scc in [Scc::Anyuid, Scc::Restricted] {
            let errors = admit(&app_pod(), &ns(), scc).unwrap_err();
            assert_eq!(
                errors,
                [format!(
                    "provider \"{}\": pod.metadata.annotations[container.seccomp.security.alpha.kubernetes.io/app]: \
                     Forbidden: seccomp may not be set",
                    scc.name()
                )]
            );
            let mut pod = app_pod();
            pod["spec"]["containers"][0]["securityContext"]
                .as_object_mut()
                .unwrap()
                .remove("seccompProfile");
            let out = admit(&pod, &ns(), scc).unwrap();
            assert!(out["spec"]["securityContext"]["seccompProfile"].is_null());
            assert!(out["metadata"]["annotations"][SECCOMP_POD_ANNOTATION].is_null());
        }
        // anyuid assigns no UID; legacy restricted assigns the range start.
        let mut pod = app_pod();
        pod["spec"]["containers"][0]["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("seccompProfile");
        let out = admit(&pod, &ns(), Scc::Anyuid).unwrap();
        assert!(out["spec"]["containers"][0]["securityContext"]["runAsUser"].is_null());
        let out = admit(&pod, &ns(), Scc::Restricted).unwrap();
        assert_eq!(
            out["spec"]["containers"][0]["securityContext"]["runAsUser"],
            EXAMPLE_UID
        );
    }

    #[test]
    fn nonroot_v2_takes_any_non_root_uid_and_refuses_root() {
        let mut pod = app_pod();
        pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(101);
        let out = admit(&pod, &ns(), Scc::NonrootV2).unwrap();
        assert!(out["spec"]["securityContext"]["fsGroup"].is_null());
        pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(0);
        pod["spec"]["containers"][0]["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("runAsNonRoot");
        let errors = admit(&pod, &ns(), Scc::NonrootV2).unwrap_err();
        assert!(
            errors[0].ends_with("running with the root UID is forbidden"),
            "{errors:?}"
        );
        // No UID anywhere: runAsNonRoot is set so the kubelet checks the image's USER.
        let pod = json!({"metadata": {}, "spec": {"containers": [{"name": "c"}]}});
        let out = admit(&pod, &ns(), Scc::NonrootV2).unwrap();
        assert_eq!(
            out["spec"]["containers"][0]["securityContext"]["runAsNonRoot"],
            true
        );
    }

    #[test]
    fn the_webhook_runs_between_two_scc_passes_and_the_last_allows_no_change() {
        let sidecar = |uid: Value| {
            move |pod: &Value| {
                let mut out = pod.clone();
                let mut sc = json!({
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsNonRoot": true,
                    "seccompProfile": {"type": "RuntimeDefault"},
                });
                if !uid.is_null() {
                    sc["runAsUser"] = uid.clone();
                }
                out["spec"]["containers"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "envoy", "securityContext": sc}));
                out
            }
        };
        // A hard-coded UID is refused with OpenShift's words.
        let errors = admit_with_webhook(&app_pod(), &ns(), Scc::RestrictedV2, sidecar(json!(101)))
            .unwrap_err();
        assert_eq!(
            errors,
            [
                "provider \"restricted-v2\": spec.containers[1].securityContext.runAsUser: \
              Invalid value: 101: must be in the ranges: [1000680000, 1000689999]"
            ]
        );
        // The webhook sees the SCC-mutated Pod; the second pass fills the new container.
        let mut seen = Value::Null;
        let stored = admit_with_webhook(&app_pod(), &ns(), Scc::RestrictedV2, |pod| {
            seen = pod.clone();
            sidecar(Value::Null)(pod)
        })
        .unwrap();
        assert_eq!(
            seen["spec"]["containers"][0]["securityContext"]["runAsUser"],
            EXAMPLE_UID
        );
        let envoy = &stored["spec"]["containers"][1]["securityContext"];
        assert_eq!(envoy["runAsUser"], EXAMPLE_UID);
        assert!(
            envoy["seLinuxOptions"].is_null(),
            "the pod-level level applies"
        );
        assert!(envoy["runAsGroup"].is_null());
        // The final validation refuses a Pod the SCC would still change.
        let mut unfinished = stored.clone();
        unfinished["spec"]["containers"][1]["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("allowPrivilegeEscalation");
        let errors = validate(&unfinished, &ns(), Scc::RestrictedV2).unwrap_err();
        assert!(
            errors[0].contains("failures final validation after mutating admission")
                && errors[0]
                    .contains("spec.containers[1].securityContext.allowPrivilegeEscalation"),
            "{errors:?}"
        );
    }

    #[test]
    fn with_several_sccs_the_second_pass_may_pick_a_less_restrictive_one() {
        let host_port = |pod: &Value| {
            let mut out = pod.clone();
            out["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}]);
            out
        };
        let both = [Scc::RestrictedV2, Scc::HostnetworkV2];
        // The hint comes first: an unchanged Pod keeps the SCC it names.
        let plain = admit_with_webhook_any(&app_pod(), &ns(), &both, Value::clone).unwrap();
        assert_eq!(
            plain["metadata"]["annotations"][SCC_ANNOTATION],
            "restricted-v2"
        );
        let moved = admit_with_webhook_any(&app_pod(), &ns(), &both, host_port).unwrap();
        assert_eq!(
            moved["metadata"]["annotations"][SCC_ANNOTATION],
            "hostnetwork-v2"
        );
        let errors =
            admit_with_webhook_any(&app_pod(), &ns(), &[Scc::RestrictedV2], host_port).unwrap_err();
        assert!(
            errors[0].ends_with("Host ports are not allowed to be used"),
            "{errors:?}"
        );
        // Every refusing SCC's errors are reported.
        let mut root = app_pod();
        root["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
        let errors = admit_any(&root, &ns(), &both).unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn a_pod_template_is_admitted_as_the_replicaset_would_create_it() {
        let template = json!({"metadata": {"labels": {"app": "x"}}, "spec": app_pod()["spec"]});
        let pod = admit_template(&template, &ns(), Scc::RestrictedV2).unwrap();
        assert_eq!(pod["metadata"]["labels"]["app"], "x");
        let mut bad = template.clone();
        bad["spec"]["securityContext"] = json!({"runAsUser": 65532, "fsGroup": 65532});
        let errors = admit_template(&bad, &ns(), Scc::RestrictedV2).unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
    }
}
