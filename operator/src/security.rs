//! The securityContext of the pods the operator creates (docs/operator.md, "Security
//! context"): what is generated, and the user's `podSecurityContext` /
//! `securityContext` fields set over it.
//!
//! Generated, so that the pods pass both Pod Security `restricted` and OpenShift's
//! default SCC `restricted-v2`: the pod sets `runAsNonRoot: true` and
//! `seccompProfile: RuntimeDefault` and no user, group or `fsGroup` (restricted-v2
//! admits only the namespace's UIDs and first GID; the images' numeric users satisfy
//! the kubelet elsewhere). The containers' own securityContext is the injection's
//! ([`marin3r_sidecar::run_as`]).

use k8s_openapi::api::core::v1::{PodSecurityContext, SeccompProfile};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `base` with every field `over` sets replaced by `over`'s (the top-level fields of a
/// securityContext; a field `over` leaves out keeps `base`'s).
pub fn overlay<T: Serialize + DeserializeOwned>(base: T, over: Option<&T>) -> T {
    let Some(over) = over else {
        return base;
    };
    let (Ok(serde_json::Value::Object(mut merged)), Ok(serde_json::Value::Object(fields))) =
        (serde_json::to_value(&base), serde_json::to_value(over))
    else {
        return base;
    };
    merged.extend(fields);
    serde_json::from_value(serde_json::Value::Object(merged)).unwrap_or(base)
}

/// The pod securityContext of a generated pod, with the user's fields over it.
pub fn pod_security_context(over: Option<&PodSecurityContext>) -> PodSecurityContext {
    overlay(
        PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        },
        over,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::SecurityContext;

    #[test]
    fn the_fields_given_replace_the_generated_ones_and_the_others_stay() {
        let generated = marin3r_sidecar::run_as::restricted_security_context(true);
        assert_eq!(overlay(generated.clone(), None), generated);
        let over = SecurityContext {
            run_as_user: Some(1000),
            read_only_root_filesystem: Some(false),
            ..SecurityContext::default()
        };
        let merged = overlay(generated.clone(), Some(&over));
        assert_eq!(merged.run_as_user, Some(1000));
        assert_eq!(merged.read_only_root_filesystem, Some(false));
        assert_eq!(merged.capabilities, generated.capabilities);
        assert_eq!(merged.seccomp_profile, generated.seccomp_profile);

        let pod = pod_security_context(None);
        assert_eq!(pod.run_as_non_root, Some(true));
        assert!(pod.run_as_user.is_none() && pod.run_as_group.is_none() && pod.fs_group.is_none());
        let pod = pod_security_context(Some(&PodSecurityContext {
            fs_group: Some(2000),
            ..PodSecurityContext::default()
        }));
        assert_eq!(
            (pod.fs_group, pod.run_as_non_root),
            (Some(2000), Some(true))
        );
    }
}
