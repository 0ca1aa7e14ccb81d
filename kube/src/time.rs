//! Kubernetes times: `metav1.Time` holds whole seconds, written as RFC 3339 in UTC.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// `t` as a timestamp (saturating at the ends of jiff's range).
pub fn timestamp(t: SystemTime) -> Timestamp {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    };
    let bound = if secs < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    };
    Timestamp::from_second(secs).unwrap_or(bound)
}

/// `t` as a `metav1.Time`.
pub fn time(t: SystemTime) -> Time {
    Time(timestamp(t))
}

/// A time as RFC 3339 in UTC with whole seconds (`2025-01-01T10:00:00Z`), like Kubernetes.
pub fn rfc3339(t: SystemTime) -> String {
    timestamp(t).to_string()
}

/// `now` rounded down to whole seconds, the precision Kubernetes stores `Time` with, so
/// a status written and read back compares equal.
pub fn truncate_to_seconds(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn whole_seconds_in_utc() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_735_725_600_700);
        assert_eq!(rfc3339(t), "2025-01-01T10:00:00Z");
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339(before), "1969-12-31T23:59:59Z");
        let now = Timestamp::from_millisecond(1_735_725_600_700).unwrap();
        assert_eq!(truncate_to_seconds(now).to_string(), "2025-01-01T10:00:00Z");
    }
}
