//! Fixed points in time for tests of code that takes the time as an input.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `secs` seconds after the Unix epoch.
pub fn unix_time(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_after_the_epoch() {
        assert_eq!(
            unix_time(90).duration_since(UNIX_EPOCH).ok(),
            Some(Duration::from_secs(90))
        );
    }
}
