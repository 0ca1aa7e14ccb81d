//! Property tests of the shutdown manager's parsers: duration flags (`parse_duration`,
//! `format_duration`) and Envoy's `/stats` text (`open_connections`). They never panic,
//! round-trip, add up and keep order. docs/reliability.md lists what each covers.
#![allow(clippy::unwrap_used)] // strategy constructors outside #[test] fns

use std::time::Duration;

use marin3r_shutdown_manager::{format_duration, open_connections, parse_duration};
use proptest::prelude::*;

/// Units and their length in nanoseconds.
const UNITS: [(&str, u64); 7] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

fn near_grammar() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r"[-+0-9. nsuµmh\u{3bc}x]{0,24}").unwrap()
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..1_000_000_000_000).prop_map(Duration::from_nanos),
        (0u64..u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..100_000).prop_map(Duration::from_secs),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn parse_never_panics(s in any::<String>(), g in near_grammar()) {
        let _ = parse_duration(&s);
        let _ = parse_duration(&g);
    }

    #[test]
    fn format_then_parse_round_trips(d in any_duration()) {
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text).ok(), Some(d), "{}", text);
    }

    #[test]
    fn one_unit_is_exact(n in 0u64..1_000_000, u in 0usize..UNITS.len()) {
        let (unit, nanos) = UNITS[u];
        let d = parse_duration(&format!("{n}{unit}")).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(d.as_nanos(), u128::from(n) * u128::from(nanos));
        // A plain number is seconds.
        prop_assert_eq!(parse_duration(&n.to_string()).ok(), Some(Duration::from_secs(n)));
    }

    #[test]
    fn compound_forms_add_up(
        parts in proptest::collection::vec((0u64..10_000, 0usize..UNITS.len()), 1..6)
    ) {
        let text: String = parts.iter().map(|(n, u)| format!("{n}{}", UNITS[*u].0)).collect();
        let sum: u128 = parts.iter().map(|(n, u)| u128::from(*n) * u128::from(UNITS[*u].1)).sum();
        let d = parse_duration(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(d.as_nanos(), sum, "{}", text);
    }

    #[test]
    fn order_matches_numeric_order(
        a in 0u64..1_000_000, ua in 0usize..UNITS.len(),
        b in 0u64..1_000_000, ub in 0usize..UNITS.len(),
    ) {
        let da = parse_duration(&format!("{a}{}", UNITS[ua].0)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let db = parse_duration(&format!("{b}{}", UNITS[ub].0)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (va, vb) = (u128::from(a) * u128::from(UNITS[ua].1), u128::from(b) * u128::from(UNITS[ub].1));
        prop_assert_eq!(da.cmp(&db), va.cmp(&vb));
        // Formatting keeps the order too (it is exact, so it round-trips).
        let (fa, fb) = (parse_duration(&format_duration(da)).ok(), parse_duration(&format_duration(db)).ok());
        prop_assert_eq!(fa.cmp(&fb), va.cmp(&vb));
    }

    #[test]
    fn negative_and_empty_are_refused(n in 0u64..1_000_000, u in 0usize..UNITS.len(), ws in "[ \t]{0,3}") {
        let negative = parse_duration(&format!("-{n}{}", UNITS[u].0));
        prop_assert!(negative.is_err());
        let empty = parse_duration(&ws);
        prop_assert!(empty.is_err());
    }

    #[test]
    fn stats_never_panic_and_sum_the_listener_gauges(
        noise in any::<String>(),
        gauges in proptest::collection::vec(("[a-z0-9_.]{1,12}", 0u64..1_000_000), 0..8),
        admin in 0u64..100,
        workers in 0u64..100,
    ) {
        let _ = open_connections(&noise);
        let mut text = format!("listener.admin.downstream_cx_active: {admin}\n");
        let mut expected = 0u64;
        for (i, (name, value)) in gauges.iter().enumerate() {
            // Unique names that are not admin and do not end like a per-thread copy.
            let listener = format!("l{i}.{name}x");
            text.push_str(&format!("listener.{listener}.downstream_cx_active: {value}\n"));
            text.push_str(&format!("listener.{listener}.worker_0.downstream_cx_active: {workers}\n"));
            text.push_str(&format!("http.{listener}.downstream_cx_active: {workers}\n"));
            expected += value;
        }
        prop_assert_eq!(open_connections(&text).ok(), Some(expected), "{}", text);
    }
}
