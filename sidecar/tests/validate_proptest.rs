//! Property tests of the annotation value parsers (`marin3r_sidecar::validate`): they
//! never panic on any input, accept exactly their documented ranges, round-trip the
//! values they accept, and order quantities like the numbers they denote.
//! docs/reliability.md lists what each property covers.
#![allow(clippy::unwrap_used)] // strategy constructors outside #[test] fns

use marin3r_sidecar::validate::{MAX_PORT, MIN_PORT, host_port, port, quantity};
use proptest::prelude::*;

/// Quantity suffixes and their exact value in nano units (× 10⁹).
const SUFFIXES: [(&str, i128); 16] = [
    ("n", 1),
    ("u", 1_000),
    ("m", 1_000_000),
    ("", 1_000_000_000),
    ("k", 1_000_000_000_000),
    ("M", 1_000_000_000_000_000),
    ("G", 1_000_000_000_000_000_000),
    ("T", 1_000_000_000_000_000_000_000),
    ("P", 1_000_000_000_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000_000_000_000),
    ("Ki", 1_000_000_000 << 10),
    ("Mi", 1_000_000_000 << 20),
    ("Gi", 1_000_000_000 << 30),
    ("Ti", 1_000_000_000 << 40),
    ("Pi", 1_000_000_000 << 50),
    ("Ei", 1_000_000_000 << 60),
];

/// Strings near the parsers' grammar: digits, signs, dots, suffix letters, colons,
/// brackets, exponents, whitespace and some non-ASCII.
fn near_grammar() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r"[-+0-9.eEkKMGTPinu:\[\]a-z \t\u{e9}\u{b5}]{0,24}").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn parsers_never_panic(s in any::<String>(), g in near_grammar()) {
        for input in [&s, &g] {
            let _ = port(input);
            let _ = host_port(input);
            let _ = quantity(input);
        }
    }

    #[test]
    fn port_accepts_exactly_the_unprivileged_range(n in 0u64..200_000) {
        let parsed = port(&n.to_string());
        if (u64::from(MIN_PORT)..=u64::from(MAX_PORT)).contains(&n) {
            prop_assert_eq!(parsed, Ok(u16::try_from(n).unwrap_or_default()));
        } else {
            prop_assert!(parsed.is_err());
        }
    }

    #[test]
    fn port_round_trips(p in 1024u16..=65535) {
        prop_assert_eq!(port(&p.to_string()), Ok(p));
        // Leading zeros denote the same number.
        prop_assert_eq!(port(&format!("00{p}")), Ok(p));
    }

    #[test]
    fn host_port_round_trips_names_and_addresses(
        labels in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", 1..4),
        v4 in any::<[u8; 4]>(),
        v6 in any::<[u16; 8]>(),
        p in 1u16..=65535,
    ) {
        let host = labels.join(".");
        prop_assert_eq!(host_port(&format!("{host}:{p}")), Ok((host.clone(), p)));

        let ip4 = std::net::Ipv4Addr::from(v4).to_string();
        prop_assert_eq!(host_port(&format!("{ip4}:{p}")), Ok((ip4.clone(), p)));

        let ip6 = std::net::Ipv6Addr::from(v6);
        let (h, q) = host_port(&format!("[{ip6}]:{p}")).map_err(TestCaseError::fail)?;
        prop_assert_eq!(h.parse::<std::net::Ipv6Addr>().ok(), Some(ip6));
        prop_assert_eq!(q, p);
        // Port 0 and unbracketed IPv6 are refused.
        let zero = host_port(&format!("{host}:0"));
        prop_assert!(zero.is_err());
        let unbracketed = host_port(&format!("{ip6}:{p}"));
        prop_assert!(unbracketed.is_err(), "{:?}", unbracketed);
    }

    #[test]
    fn quantity_integer_with_suffix_is_exact(n in 0i128..1_000_000, s in 0usize..SUFFIXES.len()) {
        let (suffix, scale) = SUFFIXES[s];
        let q = quantity(&format!("{n}{suffix}")).map_err(TestCaseError::fail)?;
        prop_assert_eq!(q.nanos, n * scale);
        prop_assert_eq!(q.text, format!("{n}{suffix}"));
    }

    #[test]
    fn quantity_decimal_and_exponent_forms_agree(
        int in 0i128..100_000,
        frac in proptest::collection::vec(0u8..10, 0..6),
        exp in -9i32..=9,
    ) {
        let frac_text: String = frac.iter().map(|d| char::from(b'0' + d)).collect();
        let text = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac_text}") };
        // mantissa × 10^(9 − digits after the point) is the exact nano value.
        let mantissa: i128 = format!("{int}{frac_text}").parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let digits = i32::try_from(frac.len()).unwrap_or(0);
        let plain = quantity(&text).map_err(TestCaseError::fail)?;
        prop_assert_eq!(plain.nanos, mantissa * 10i128.pow((9 - digits).unsigned_abs()));

        // With an exponent: the exact value rounded up to a whole nano unit.
        let shift = 9 - digits + exp;
        let exact_up = if shift >= 0 {
            mantissa * 10i128.pow(shift.unsigned_abs())
        } else {
            let d = 10i128.pow(shift.unsigned_abs());
            mantissa / d + i128::from(mantissa % d != 0)
        };
        let with_exp = quantity(&format!("{text}e{exp}")).map_err(TestCaseError::fail)?;
        prop_assert_eq!(with_exp.nanos, exact_up);
    }

    /// Up to 38 significant digits (the limit), leading and trailing zeros, ≤ 64 characters.
    #[test]
    fn tiny_values_round_up_instead_of_failing(
        int in 0i128..10,
        zeros in 0usize..=20,
        frac in proptest::collection::vec(0u8..10, 0..=17),
        trailing in 0usize..=10,
        exp in -40i32..=-10,
    ) {
        let frac: Vec<u8> = std::iter::repeat_n(0, zeros).chain(frac).chain(std::iter::repeat_n(0, trailing)).collect();
        let frac_text: String = frac.iter().map(|d| char::from(b'0' + d)).collect();
        let text = format!("{int}.{frac_text}e{exp}");
        let nonzero = int != 0 || frac.iter().any(|d| *d != 0);
        // Below one nano unit, Kubernetes rounds up: 1n for any positive value, 0 for 0.
        let q = quantity(&text).map_err(TestCaseError::fail)?;
        prop_assert_eq!(q.nanos, i128::from(nonzero));
    }

    #[test]
    fn quantity_order_matches_numeric_order(
        a in 0i128..1_000_000, sa in 0usize..SUFFIXES.len(),
        b in 0i128..1_000_000, sb in 0usize..SUFFIXES.len(),
    ) {
        let qa = quantity(&format!("{a}{}", SUFFIXES[sa].0)).map_err(TestCaseError::fail)?;
        let qb = quantity(&format!("{b}{}", SUFFIXES[sb].0)).map_err(TestCaseError::fail)?;
        let (va, vb) = (a * SUFFIXES[sa].1, b * SUFFIXES[sb].1);
        prop_assert_eq!(qa.partial_cmp(&qb), Some(va.cmp(&vb)));
        // Round trip through the canonical nano form keeps the value and the order.
        let na = quantity(&format!("{}n", qa.nanos)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(na.nanos, qa.nanos);
    }

    #[test]
    fn accepted_quantities_are_never_negative(s in any::<String>(), g in near_grammar()) {
        for input in [&s, &g] {
            if let Ok(q) = quantity(input) {
                prop_assert!(q.nanos >= 0, "{input:?} → {}", q.nanos);
            }
        }
    }
}
