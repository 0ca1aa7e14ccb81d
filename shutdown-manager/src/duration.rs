//! Duration parsing for flags (`5s`, `1m`, `250ms`, `1m30s`, plain seconds `30`) and
//! Go-style formatting for log messages (`1s`, `200ms`, `1m30s`), so that messages read
//! exactly like upstream MARIN3R's.

use std::time::Duration;

use crate::ShutdownManagerError;

/// Parses a duration flag value ([`marin3r_duration::Syntax::Flag`]).
///
/// Accepted forms:
/// - plain (possibly fractional) seconds: `30`, `1.5`;
/// - one or more `<number><unit>` pairs, Go style: `5s`, `1m`, `1h`, `250ms`, `1m30s`,
///   `1.5s`, with units `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`.
///
/// Negative values, empty input and values that overflow [`Duration`] are rejected.
///
/// ```
/// use std::time::Duration;
/// use marin3r_shutdown_manager::parse_duration;
/// assert_eq!(parse_duration("1m30s").ok(), Some(Duration::from_secs(90)));
/// assert_eq!(parse_duration("30").ok(), Some(Duration::from_secs(30)));
/// assert_eq!(parse_duration("250ms").ok(), Some(Duration::from_millis(250)));
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, ShutdownManagerError> {
    marin3r_duration::parse(input, marin3r_duration::Syntax::Flag).map_err(|reason| {
        ShutdownManagerError::InvalidDuration {
            input: input.to_string(),
            reason: reason.to_string(),
        }
    })
}

/// Formats a duration like Go's `time.Duration.String()`: `0s`, `250ms`, `1s`, `1.5s`,
/// `1m30s`, `1h0m0s`.
pub fn format_duration(d: Duration) -> String {
    marin3r_duration::format(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_duration(s).unwrap()
    }

    #[test]
    fn parses_documented_forms() {
        assert_eq!(ok("5s"), Duration::from_secs(5));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("30"), Duration::from_secs(30));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
    }

    #[test]
    fn error_names_the_input() {
        let err = parse_duration("5x").unwrap_err().to_string();
        assert!(err.contains("\"5x\""), "{err}");
    }
}
