//! Go `time.ParseDuration` syntax, as `metav1.Duration` fields use on the wire (`"48h"`,
//! `"2160h"`, `"1h30m"`, `"1.5h"`, `"300ms"`).
//!
//! Grammar (Go's): an optional sign, then one or more `<decimal><unit>` pairs with units
//! `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`; a lone `0` needs no unit. A decimal is
//! digits with an optional fraction (`1.5`, `.5`, `5.`). Negative durations are valid Go
//! but meaningless for certificate lifetimes, so [`parse_go_duration`] rejects them.

use std::time::Duration;

use crate::Error;

/// Parses a Go duration for the field `field` (a JSON path such as `spec.duration`, used
/// in the error). Rejects empty, malformed, negative and overflowing values.
pub fn parse_go_duration(field: &str, value: &str) -> Result<Duration, Error> {
    marin3r_duration::parse(value, marin3r_duration::Syntax::Go).map_err(|reason| Error::Duration {
        field: field.to_string(),
        value: value.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn ok(s: &str) -> Duration {
        parse_go_duration("spec.duration", s).unwrap()
    }

    #[test]
    fn parses_what_go_parses() {
        assert_eq!(ok("48h"), Duration::from_secs(48 * 3600));
        assert_eq!(ok("2160h"), Duration::from_secs(7_776_000));
        assert_eq!(ok("26280h"), Duration::from_secs(94_608_000));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("5.s"), Duration::from_secs(5));
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("1m0.5s"), Duration::from_millis(60_500));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("10µs"), Duration::from_micros(10));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("+10s"), Duration::from_secs(10));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("-0"), Duration::ZERO);
        // Go prints durations as "48h0m0s"; that form parses too.
        assert_eq!(ok("48h0m0s"), Duration::from_secs(48 * 3600));
    }

    #[test]
    fn errors_name_the_field_value_and_reason() {
        for (input, reason) in [
            ("", "empty duration"),
            ("48", "missing unit (ns, us, ms, s, m or h)"),
            ("48d", "unknown unit (use ns, us, ms, s, m or h)"),
            ("h", "expected a number before each unit"),
            ("1..5h", "expected a number before each unit"),
            ("-1h", "negative durations are not allowed"),
            ("+", "expected a number and a unit such as 48h"),
            ("3000000h", "duration too large"),
            (
                "99999999999999999999999999999999999999999h",
                "duration too large",
            ),
        ] {
            let err = parse_go_duration("spec.pkiConfg.serverCertificate.duration", input)
                .expect_err(input);
            assert_eq!(
                err.to_string(),
                format!(
                    "spec.pkiConfg.serverCertificate.duration: invalid duration {input:?}: {reason}"
                ),
                "{input}"
            );
        }
    }
}
