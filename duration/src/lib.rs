//! Go-style durations, the one implementation behind marin3r's duration flags
//! (`--drain-time 5s`, `--validity 8760h`, plain seconds `30`), the operator API's
//! `metav1.Duration` fields (`duration: 48h`, `pkiConfg.*.duration: 2160h`) and the
//! shutdown manager's log messages (`1m30s`, as upstream MARIN3R writes them).
//!
//! Grammar (Go's `time.ParseDuration`): an optional sign, then one or more
//! `<decimal><unit>` pairs with units `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`; a lone
//! `0` needs no unit; a decimal is digits with an optional fraction (`1.5`, `.5`, `5.`),
//! truncated to nanoseconds. Negative durations are refused (`-0` is zero).
#![forbid(unsafe_code)]

use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Which inputs [`parse`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// Exactly Go's grammar, at most Go's range (`int64` nanoseconds, about 292 years):
    /// what a Kubernetes `metav1.Duration` field holds.
    Go,
    /// Go's grammar or plain (possibly fractional) seconds (`30`, `1.5`), surrounding
    /// whitespace ignored, up to [`Duration::MAX`]: command-line flags.
    Flag,
}

/// Parses `input`; the error is the reason (the caller names the field or flag).
pub fn parse(input: &str, syntax: Syntax) -> Result<Duration, &'static str> {
    let mut rest = match syntax {
        Syntax::Go => input,
        Syntax::Flag => input.trim(),
    };
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
        None => return Err("empty duration"),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err("expected a number and a unit such as 48h");
    }
    let total = if syntax == Syntax::Flag && rest.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // Plain seconds.
        if rest == "." || rest.matches('.').count() > 1 {
            return Err("expected a number before each unit");
        }
        scaled(rest, NANOS_PER_SEC).ok_or("duration too large")?
    } else {
        sum_of_pairs(rest)?
    };
    let max = match syntax {
        Syntax::Go => i64::MAX as u128,
        Syntax::Flag => Duration::MAX.as_nanos(),
    };
    if total > max {
        return Err("duration too large");
    }
    if negative && total > 0 {
        return Err("negative durations are not allowed");
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| "duration too large")?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).map_err(|_| "duration too large")?;
    Ok(Duration::new(secs, nanos))
}

/// Nanoseconds of one or more `<decimal><unit>` pairs.
fn sum_of_pairs(mut rest: &str) -> Result<u128, &'static str> {
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err("expected a number before each unit");
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
            "" => return Err("missing unit (ns, us, ms, s, m or h)"),
            _ => return Err("unknown unit (use ns, us, ms, s, m or h)"),
        };
        let part = scaled(number, unit_nanos).ok_or("duration too large")?;
        total = total.checked_add(part).ok_or("duration too large")?;
        rest = after_unit;
    }
    Ok(total)
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

/// Formats a duration like Go's `time.Duration.String()`: `0s`, `250ms`, `1s`, `1.5s`,
/// `1m30s`, `1h0m0s`.
pub fn format(d: Duration) -> String {
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
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn go(s: &str) -> Duration {
        parse(s, Syntax::Go).unwrap()
    }

    fn flag(s: &str) -> Duration {
        parse(s, Syntax::Flag).unwrap()
    }

    #[test]
    fn parses_what_go_parses() {
        assert_eq!(go("48h"), Duration::from_secs(48 * 3600));
        assert_eq!(go("1h30m"), Duration::from_secs(5400));
        assert_eq!(go("1.5h"), Duration::from_secs(5400));
        assert_eq!(go(".5s"), Duration::from_millis(500));
        assert_eq!(go("5.s"), Duration::from_secs(5));
        assert_eq!(go("1m0.5s"), Duration::from_millis(60_500));
        assert_eq!(go("10us"), Duration::from_micros(10));
        assert_eq!(go("10µs"), Duration::from_micros(10));
        assert_eq!(go("7ns"), Duration::from_nanos(7));
        assert_eq!(go("+10s"), Duration::from_secs(10));
        assert_eq!(go("0"), Duration::ZERO);
        assert_eq!(go("-0"), Duration::ZERO);
        assert_eq!(go("48h0m0s"), Duration::from_secs(48 * 3600));
    }

    #[test]
    fn flags_also_take_plain_seconds_and_surrounding_space() {
        assert_eq!(flag("30"), Duration::from_secs(30));
        assert_eq!(flag("1.5"), Duration::from_millis(1500));
        assert_eq!(flag(" 5s "), Duration::from_secs(5));
        assert_eq!(flag("1h2m3s4ms"), Duration::from_millis(3_723_004));
        assert_eq!(
            parse("30", Syntax::Go),
            Err("missing unit (ns, us, ms, s, m or h)")
        );
        assert_eq!(
            parse(" 5s", Syntax::Go),
            Err("expected a number before each unit")
        );
        // Flags reach Duration::MAX; Go stops at int64 nanoseconds.
        assert!(parse("18446744073709551615", Syntax::Flag).is_ok());
        assert!(parse("18446744073709551616", Syntax::Flag).is_err());
        assert_eq!(parse("3000000h", Syntax::Go), Err("duration too large"));
    }

    #[test]
    fn refuses_with_a_reason() {
        for (input, reason) in [
            ("", "empty duration"),
            ("48d", "unknown unit (use ns, us, ms, s, m or h)"),
            ("h", "expected a number before each unit"),
            ("1..5h", "expected a number before each unit"),
            ("-1h", "negative durations are not allowed"),
            ("+", "expected a number and a unit such as 48h"),
            (
                "99999999999999999999999999999999999999999h",
                "duration too large",
            ),
        ] {
            assert_eq!(parse(input, Syntax::Go), Err(reason), "{input}");
        }
        for bad in [
            "", " ", "-5s", "s", "5x", "5 s", "1.2.3s", "abc", "5sm", "1..", ".", "..s", "5S",
        ] {
            assert!(parse(bad, Syntax::Flag).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn formats_like_go_and_round_trips() {
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_millis(200)), "200ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format(Duration::from_micros(10)), "10µs");
        assert_eq!(format(Duration::from_nanos(7)), "7ns");
        for d in [
            Duration::from_millis(250),
            Duration::from_secs(3723),
            Duration::from_nanos(1_000_000_007),
        ] {
            assert_eq!(go(&format(d)), d);
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(input in "\\PC{0,24}") {
            let _ = parse(&input, Syntax::Go);
            let _ = parse(&input, Syntax::Flag);
        }

        #[test]
        fn never_panics_near_the_grammar(input in "[-+ ]?([0-9.]{0,22}(ns|us|µs|ms|s|m|h|d|)){0,4}") {
            let _ = parse(&input, Syntax::Go);
            let _ = parse(&input, Syntax::Flag);
        }

        #[test]
        fn sums_hours_minutes_seconds_and_millis(h in 0u64..100_000, m in 0u64..1000, s in 0u64..1000, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let want = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
            proptest::prop_assert_eq!(parse(&text, Syntax::Go), Ok(want));
            proptest::prop_assert_eq!(parse(&text, Syntax::Flag), Ok(want));
        }
    }
}
