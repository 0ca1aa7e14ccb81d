//! Who the generated containers run as, and whether they carry a seccomp profile
//! (design.md §1.3): one decision, [`RunAs::of_pod`], made from the incoming Pod alone
//! (the webhook has no API access) and used by every injection path (the webhook and
//! `marin3r inject`); the operator gives its EnvoyDeployment pods a [`RunAs`] from the
//! Namespace's uid-range ([`RunAs::of_uid_range`]).
//!
//! Two kinds of cluster must admit the result:
//! - vanilla Kubernetes with Pod Security `restricted`: a numeric non-root user and
//!   `seccompProfile: RuntimeDefault` (the kubelet cannot read a named image user);
//! - OpenShift's SCC admission, which runs before mutating webhooks and again after
//!   them: `restricted-v2` admits only a `runAsUser` in the namespace's uid-range and has
//!   already filled one in on the app containers; `anyuid` and the legacy `restricted`
//!   allow no seccomp field at all ("seccomp may not be set").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile, SecurityContext};
use marin3r_wire::openshift;
use serde_json::Value;

/// Who the generated containers run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// The Pod's user: every generated container runs as it, with no `runAsGroup` (the
    /// group is the Pod's, or the runtime's default: GID 0 on OpenShift). `None`: each
    /// container runs as its image's user, numerically (Envoy 101, the managers 65532),
    /// with the same group.
    pub uid: Option<i64>,
    /// Whether the containers set `seccompProfile: RuntimeDefault`. False only for a Pod
    /// an OpenShift SCC admitted with no seccomp profile anywhere (`anyuid`, the legacy
    /// `restricted`): such an SCC refuses any seccomp field.
    pub seccomp: bool,
}

impl Default for RunAs {
    fn default() -> Self {
        Self::IMAGE_USERS
    }
}

/// `v` as a non-zero UID.
fn user(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64).filter(|uid| *uid > 0)
}

impl RunAs {
    /// A Pod that names no user: each container as its image's numeric user, seccomp
    /// `RuntimeDefault`.
    pub const IMAGE_USERS: RunAs = RunAs {
        uid: None,
        seccomp: true,
    };

    /// The decision for a Pod (or pod template): `spec` is its spec, `annotations` its
    /// annotations, `app_containers` its own containers and init containers (without the
    /// ones an earlier injection added, so that re-injection decides the same).
    ///
    /// - The user: the Pod's non-zero `spec.securityContext.runAsUser`, else the first
    ///   non-zero `runAsUser` of its containers (where OpenShift's SCC admission writes
    ///   the namespace's uid-range start), else none ([`RunAs::IMAGE_USERS`]).
    /// - Seccomp: set, unless the Pod carries `openshift.io/scc` (an SCC admitted it)
    ///   and has no seccomp profile anywhere (pod or container field, or annotation):
    ///   that SCC allows none.
    pub fn of_pod(
        spec: &Value,
        annotations: &BTreeMap<&str, &str>,
        app_containers: &[&Value],
    ) -> RunAs {
        let pod_sc = spec.get("securityContext");
        let uid = user(pod_sc.and_then(|sc| sc.get("runAsUser"))).or_else(|| {
            app_containers
                .iter()
                .find_map(|c| user(c.get("securityContext").and_then(|sc| sc.get("runAsUser"))))
        });
        let has_profile = |sc: Option<&Value>| {
            sc.and_then(|sc| sc.get("seccompProfile"))
                .is_some_and(|p| !p.is_null())
        };
        let any_seccomp = has_profile(pod_sc)
            || app_containers
                .iter()
                .any(|c| has_profile(c.get("securityContext")))
            || annotations.keys().any(|k| {
                *k == openshift::SECCOMP_POD_ANNOTATION
                    || k.starts_with(openshift::SECCOMP_CONTAINER_ANNOTATION_PREFIX)
            });
        let scc_admitted = annotations.contains_key(openshift::SCC_ANNOTATION);
        RunAs {
            uid,
            seccomp: any_seccomp || !scc_admitted,
        }
    }

    /// The decision for a pod the operator creates in a namespace whose
    /// `openshift.io/sa.scc.uid-range` annotation is `uid_range` (`None`: no such
    /// annotation): its first UID, else the images' users. Seccomp is always set.
    pub fn of_uid_range(uid_range: Option<&str>) -> RunAs {
        RunAs {
            uid: uid_range.and_then(openshift::uid_range_start),
            seccomp: true,
        }
    }

    /// The securityContext of a generated container whose image runs as `image_uid`
    /// ([`crate::generate::ENVOY_UID`], [`crate::generate::MARIN3R_UID`]).
    pub fn security_context(self, image_uid: i64) -> SecurityContext {
        let mut sc = restricted_security_context(self.seccomp);
        match self.uid {
            Some(uid) => sc.run_as_user = Some(uid),
            None => {
                sc.run_as_user = Some(image_uid);
                sc.run_as_group = Some(image_uid);
            }
        }
        sc
    }
}

/// The securityContext every marin3r container shares, without a user: Pod Security
/// Standards `restricted` (non-root, no privilege escalation, every capability dropped,
/// the runtime's default seccomp profile when `seccomp`) and a read-only root
/// filesystem (Envoy and the managers write only to the mounted bootstrap emptyDir and
/// to `/dev/shm`). With no `runAsUser`, the image's numeric `USER` is the user (the
/// kubelet checks it is not root); an SCC fills in its own.
pub fn restricted_security_context(seccomp: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Default::default()
        }),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        seccomp_profile: seccomp.then(|| SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decide(pod: &Value) -> RunAs {
        let annotations: BTreeMap<&str, &str> = pod["metadata"]["annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .collect();
        let spec = &pod["spec"];
        let containers: Vec<&Value> = ["containers", "initContainers"]
            .into_iter()
            .flat_map(|k| spec[k].as_array().into_iter().flatten())
            .collect();
        RunAs::of_pod(spec, &annotations, &containers)
    }

    #[test]
    fn a_vanilla_pod_keeps_the_image_users_and_seccomp() {
        let pod = json!({"spec": {"containers": [{"name": "app"}]}});
        assert_eq!(decide(&pod), RunAs::IMAGE_USERS);
        // Root at pod level is no user to copy.
        let pod =
            json!({"spec": {"securityContext": {"runAsUser": 0}, "containers": [{"name": "app"}]}});
        assert_eq!(decide(&pod), RunAs::IMAGE_USERS);
    }

    #[test]
    fn the_pod_level_user_comes_first_then_the_first_container_user() {
        let pod = json!({"spec": {
            "securityContext": {"runAsUser": 1000},
            "containers": [{"name": "app", "securityContext": {"runAsUser": 2000}}],
        }});
        assert_eq!(decide(&pod).uid, Some(1000));
        let pod = json!({"spec": {"containers": [
            {"name": "a", "securityContext": {"runAsUser": 0}},
            {"name": "b", "securityContext": {"runAsUser": 1000680000}},
        ]}});
        assert_eq!(decide(&pod).uid, Some(1000680000));
    }

    #[test]
    fn an_scc_admitted_pod_without_seccomp_gets_none() {
        let anyuid = json!({
            "metadata": {"annotations": {"openshift.io/scc": "anyuid"}},
            "spec": {"securityContext": {"seLinuxOptions": {"level": "s0:c26,c15"}}, "containers": [{"name": "app"}]},
        });
        assert_eq!(
            decide(&anyuid),
            RunAs {
                uid: None,
                seccomp: false
            }
        );
        // restricted-v2 sets the pod profile: seccomp stays.
        let mut v2 = anyuid.clone();
        v2["metadata"]["annotations"]["openshift.io/scc"] = json!("restricted-v2");
        v2["spec"]["securityContext"]["seccompProfile"] = json!({"type": "RuntimeDefault"});
        assert!(decide(&v2).seccomp);
        // A profile on a container, or an annotation, counts as well.
        let mut c = anyuid.clone();
        c["spec"]["containers"][0]["securityContext"] =
            json!({"seccompProfile": {"type": "RuntimeDefault"}});
        assert!(decide(&c).seccomp);
        let mut a = anyuid.clone();
        a["metadata"]["annotations"]["seccomp.security.alpha.kubernetes.io/pod"] =
            json!("runtime/default");
        assert!(decide(&a).seccomp);
    }

    #[test]
    fn the_security_context_follows_the_decision() {
        let sc = RunAs::IMAGE_USERS.security_context(101);
        assert_eq!((sc.run_as_user, sc.run_as_group), (Some(101), Some(101)));
        assert!(sc.seccomp_profile.is_some());
        let sc = RunAs {
            uid: Some(1000680000),
            seccomp: false,
        }
        .security_context(101);
        assert_eq!((sc.run_as_user, sc.run_as_group), (Some(1000680000), None));
        assert!(sc.seccomp_profile.is_none());
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(
            RunAs::of_uid_range(Some("1000680000/10000")).uid,
            Some(1000680000)
        );
        assert_eq!(RunAs::of_uid_range(None), RunAs::IMAGE_USERS);
        assert_eq!(RunAs::of_uid_range(Some("garbage")), RunAs::IMAGE_USERS);
    }
}
