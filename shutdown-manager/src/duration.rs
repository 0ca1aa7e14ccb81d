//! Duration parsing for flags (`5s`, `1m`, `250ms`, `1m30s`, plain seconds `30`) and
//! Go-style formatting for log messages (`1s`, `200ms`, `1m30s`), so that messages read
//! exactly like upstream MARIN3R's.

use std::time::Duration;

use crate::ShutdownManagerError;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Parses a duration flag value.
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
    let invalid = |reason: &str| ShutdownManagerError::InvalidDuration {
        input: input.to_string(),
        reason: reason.to_string(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(invalid("empty duration"));
    }
    if s.starts_with('-') {
        return Err(invalid("negative durations are not allowed"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);

    // Plain number: seconds.
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let nanos = scaled(s, NANOS_PER_SEC).ok_or_else(|| invalid("invalid number"))?;
        return to_duration(nanos).ok_or_else(|| invalid("duration too large"));
    }

    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(invalid("expected a number before the unit"));
        }
        let (number, after) = rest.split_at(num_len);
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
            "" => return Err(invalid("missing unit (use ns, us, ms, s, m or h)")),
            _ => return Err(invalid("unknown unit (use ns, us, ms, s, m or h)")),
        };
        let part = scaled(number, unit_nanos).ok_or_else(|| invalid("invalid number"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| invalid("duration too large"))?;
        rest = after_unit;
    }
    to_duration(total).ok_or_else(|| invalid("duration too large"))
}

/// `number` (digits with at most one `.`) multiplied by `unit` nanoseconds, truncated.
fn scaled(number: &str, unit: u128) -> Option<u128> {
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let int_value: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut nanos = int_value.checked_mul(unit)?;
    // Fractional digits beyond nanosecond precision are ignored.
    let mut scale = unit;
    for digit in frac.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        nanos = nanos.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(nanos)
}

fn to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    let sub = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, sub))
}

/// Formats a duration like Go's `time.Duration.String()`: `0s`, `250ms`, `1s`, `1.5s`,
/// `1m30s`, `1h0m0s`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", decimal(nanos, 1_000));
    }
    if nanos < NANOS_PER_SEC {
        return format!("{}ms", decimal(nanos, 1_000_000));
    }
    let total_secs = nanos / NANOS_PER_SEC;
    let sub = nanos % NANOS_PER_SEC;
    let hours = total_secs / 3_600;
    let minutes = (total_secs % 3_600) / 60;
    let secs = decimal((total_secs % 60) * NANOS_PER_SEC + sub, NANOS_PER_SEC);
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// `value / unit` as a decimal with trailing zeros of the fraction removed.
fn decimal(value: u128, unit: u128) -> String {
    let int = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return int.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{int}.{}", digits.trim_end_matches('0'))
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
    fn parses_compound_and_fractional_forms() {
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1h2m3s4ms"), Duration::from_millis(3_723_004));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.5"), Duration::from_millis(1500));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("10µs"), Duration::from_micros(10));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok(" 5s "), Duration::from_secs(5));
        assert_eq!(ok("+5s"), Duration::from_secs(5));
    }

    #[test]
    fn rejects_invalid_input() {
        for bad in [
            "", " ", "-5s", "s", "5x", "5 s", "1.2.3s", "abc", "5sm", "1..", ".", "..s", "5S",
        ] {
            let err = parse_duration(bad);
            assert!(err.is_err(), "{bad:?} should be rejected, got {err:?}");
        }
    }

    #[test]
    fn rejects_overflow() {
        assert!(parse_duration("99999999999999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551616").is_err());
        assert!(parse_duration("18446744073709551615").is_ok());
    }

    #[test]
    fn error_names_the_input() {
        let err = parse_duration("5x").unwrap_err().to_string();
        assert!(err.contains("\"5x\""), "{err}");
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_secs(1)), "1s");
        assert_eq!(format_duration(Duration::from_millis(200)), "200ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(format_duration(Duration::from_micros(10)), "10µs");
        assert_eq!(format_duration(Duration::from_nanos(7)), "7ns");
    }

    #[test]
    fn format_then_parse_round_trips() {
        for d in [
            Duration::from_secs(1),
            Duration::from_millis(250),
            Duration::from_millis(1500),
            Duration::from_secs(3723),
            Duration::from_nanos(1_000_000_007),
        ] {
            assert_eq!(ok(&format_duration(d)), d, "{}", format_duration(d));
        }
    }
}
