//! Go `time.ParseDuration` syntax, as `metav1.Duration` fields use on the wire (`"48h"`,
//! `"2160h"`, `"1h30m"`, `"1.5h"`, `"300ms"`).
//!
//! Grammar (Go's): an optional sign, then one or more `<decimal><unit>` pairs with units
//! `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`; a lone `0` needs no unit. A decimal is
//! digits with an optional fraction (`1.5`, `.5`, `5.`). Negative durations are valid Go
//! but meaningless for certificate lifetimes, so [`parse_go_duration`] rejects them.

use std::time::Duration;

use crate::Error;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Parses a Go duration for the field `field` (a JSON path such as `spec.duration`, used
/// in the error). Rejects empty, malformed, negative and overflowing values.
pub fn parse_go_duration(field: &str, value: &str) -> Result<Duration, Error> {
    let invalid = |reason: &'static str| Error::Duration {
        field: field.to_string(),
        value: value.to_string(),
        reason,
    };
    let mut rest = value;
    let negative = match rest.chars().next() {
        Some('-') => {
            rest = &rest[1..];
            true
        }
        Some('+') => {
            rest = &rest[1..];
            false
        }
        Some(_) => false,
        None => return Err(invalid("empty duration")),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid("expected a number and a unit such as 48h"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid("expected a number before each unit"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after_unit) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "h" => 3_600 * NANOS_PER_SEC,
            "" => return Err(invalid("missing unit (ns, us, ms, s, m or h)")),
            _ => return Err(invalid("unknown unit (use ns, us, ms, s, m or h)")),
        };
        let part = scaled(number, unit_nanos).ok_or_else(|| invalid("duration too large"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| invalid("duration too large"))?;
        rest = after_unit;
    }
    // Go durations are int64 nanoseconds (about 292 years).
    if total > i64::MAX as u128 {
        return Err(invalid("duration too large"));
    }
    if negative && total > 0 {
        return Err(invalid("negative durations are not allowed"));
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| invalid("duration too large"))?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).map_err(|_| invalid("duration too large"))?;
    Ok(Duration::new(secs, nanos))
}

/// `number` (digits with at most one `.`) times `unit` nanoseconds, fraction truncated.
fn scaled(number: &str, unit: u128) -> Option<u128> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int.checked_mul(unit)?;
    let mut scale = unit;
    for digit in frac.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        total = total.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(total)
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

    proptest::proptest! {
        #[test]
        fn never_panics(input in "\\PC{0,24}") {
            let _ = parse_go_duration("spec.duration", &input);
        }

        #[test]
        fn never_panics_near_the_grammar(input in "[-+]?([0-9.]{0,22}(ns|us|µs|ms|s|m|h|d|)){0,4}") {
            let _ = parse_go_duration("spec.duration", &input);
        }

        #[test]
        fn sums_hours_minutes_seconds_and_millis(h in 0u64..100_000, m in 0u64..1000, s in 0u64..1000, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let want = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
            proptest::prop_assert_eq!(parse_go_duration("spec.duration", &text), Ok(want));
        }
    }
}
