//! `metav1.Condition` handling, as `meta.SetStatusCondition` does it: a condition's
//! `lastTransitionTime` changes only when its status does. Every status marin3r writes
//! (EnvoyConfig and EnvoyConfigRevision, local mode's `/status`, the operator's
//! DiscoveryService, EnvoyDeployment and DiscoveryServiceCertificate) builds its
//! conditions here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// `"True"` or `"False"`.
pub fn status_str(on: bool) -> &'static str {
    if on { "True" } else { "False" }
}

/// The condition `type_` with `status`, `reason`, `message` and `generation` (its
/// `observedGeneration`), keeping the transition time of the condition of that type in
/// `previous` when its status is the same; else `now`.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = status_str(status);
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// Sets [`condition`] `type_` in `conditions` (replacing the one of that type, or added
/// at the end).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let new = condition(conditions, type_, status, reason, message, generation, now);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => *c = new,
        None => conditions.push(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn the_transition_time_changes_only_with_the_status() {
        let mut cs = Vec::new();
        set_condition(&mut cs, "Ready", false, "Waiting", "a", Some(1), at(10));
        set_condition(&mut cs, "Degraded", false, "Fine", "", None, at(10));
        set_condition(&mut cs, "Ready", false, "Still", "b", Some(2), at(20));
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0].last_transition_time, Time(at(10)), "same status");
        assert_eq!(
            (cs[0].reason.as_str(), cs[0].message.as_str()),
            ("Still", "b")
        );
        assert_eq!(cs[0].observed_generation, Some(2));
        set_condition(&mut cs, "Ready", true, "Done", "c", Some(2), at(30));
        assert_eq!(cs[0].status, "True");
        assert_eq!(cs[0].last_transition_time, Time(at(30)), "status changed");
        let fresh = condition(&cs, "Other", true, "R", "m", None, at(40));
        assert_eq!(fresh.last_transition_time, Time(at(40)));
    }
}
