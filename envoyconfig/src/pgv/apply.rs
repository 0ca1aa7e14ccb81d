//! One type rule applied to one value (a field's, a list item's, a map key's or value's):
//! PGV's C++ semantics and messages for numeric ranges and sets, string and bytes rules
//! (lengths, patterns, well-known formats), enums, list and map counts, `Any` type URLs
//! and `Duration` bounds.

use std::collections::HashSet;

use prost_reflect::{Kind, MapKey, Value};

use super::rules::{BytesRule, ItemRule, Range, Rule, StringRule, WellKnown};
use super::value::{Num, duration_nanos, key_text, scalar, sorted};
use crate::error::{DecodeError, join_path};

/// Applies a type rule to a field's value (or a list item / map key / map value).
pub(super) fn apply(rule: &Rule, value: &Value, kind: &Kind, at: &str) -> Result<(), DecodeError> {
    match rule {
        Rule::Num {
            range,
            ignore_empty,
        } => {
            let Some(v) = scalar(value).and_then(|v| Num::of(&v)) else {
                return Ok(());
            };
            if *ignore_empty && v.is_zero() {
                return Ok(());
            }
            check_range(range, v, at, &|n| n.to_string())
        }
        Rule::Bool(konst) => match (konst, scalar(value).and_then(|v| v.as_bool())) {
            (Some(k), Some(v)) if *k != v => {
                Err(DecodeError::invalid(at, format!("value must equal {k}")))
            }
            _ => Ok(()),
        },
        Rule::Str(s) => match scalar(value).as_deref() {
            Some(Value::String(v)) => check_string(s, v, at),
            _ => Ok(()),
        },
        Rule::Bytes(b) => match scalar(value).as_deref() {
            Some(Value::Bytes(v)) => check_bytes(b, v, at),
            _ => Ok(()),
        },
        Rule::Enum {
            range,
            defined_only,
        } => {
            let Value::EnumNumber(n) = value else {
                return Ok(());
            };
            let enum_desc = match kind {
                Kind::Enum(e) => Some(e.clone()),
                _ => None,
            };
            let name = |v: Num| match (&enum_desc, v) {
                (Some(e), Num::Int(n)) => i32::try_from(n)
                    .ok()
                    .and_then(|n| e.get_value(n))
                    .map_or_else(|| n.to_string(), |v| v.name().to_string()),
                _ => v.to_string(),
            };
            check_range(range, Num::Int(i128::from(*n)), at, &name)?;
            if *defined_only
                && enum_desc
                    .as_ref()
                    .is_some_and(|e| e.get_value(*n).is_none())
            {
                return Err(DecodeError::invalid(
                    at,
                    "value must be one of the defined enum values",
                ));
            }
            Ok(())
        }
        Rule::Repeated {
            min,
            max,
            unique,
            items,
            ignore_empty,
        } => {
            let Value::List(list) = value else {
                return Ok(());
            };
            if *ignore_empty && list.is_empty() {
                return Ok(());
            }
            check_count(list.len(), *min, *max, at, "item(s)")?;
            if *unique {
                check_unique(list, at)?;
            }
            if let Some(item) = items {
                for (i, v) in list.iter().enumerate() {
                    apply_item(item, v, kind, &format!("{at}[{i}]"))?;
                }
            }
            Ok(())
        }
        Rule::Map {
            min,
            max,
            keys,
            values,
            ignore_empty,
        } => {
            let Value::Map(map) = value else {
                return Ok(());
            };
            if *ignore_empty && map.is_empty() {
                return Ok(());
            }
            check_count(map.len(), *min, *max, at, "pair(s)")?;
            let Kind::Message(entry) = kind else {
                return Ok(());
            };
            let key_kind = entry.map_entry_key_field().kind();
            let value_kind = entry.map_entry_value_field().kind();
            for (key, v) in sorted(map) {
                let item_at = join_path(at, &key_text(key));
                if let Some(k) = keys {
                    let key_value = match key {
                        MapKey::String(s) => Value::String(s.clone()),
                        MapKey::Bool(b) => Value::Bool(*b),
                        MapKey::I32(n) => Value::I32(*n),
                        MapKey::I64(n) => Value::I64(*n),
                        MapKey::U32(n) => Value::U32(*n),
                        MapKey::U64(n) => Value::U64(*n),
                    };
                    apply_item(k, &key_value, &key_kind, &format!("{item_at} (key)"))?;
                }
                if let Some(values) = values {
                    apply_item(values, v, &value_kind, &item_at)?;
                }
            }
            Ok(())
        }
        Rule::Any { in_, not_in, .. } => {
            let Value::Message(any) = value else {
                return Ok(());
            };
            let url = any.get_field_by_name("type_url");
            let url = url.as_deref().and_then(Value::as_str).unwrap_or_default();
            if !in_.is_empty() && !in_.iter().any(|u| u == url) {
                return Err(DecodeError::invalid(
                    at,
                    format!("type URL must be in list {in_:?}"),
                ));
            }
            if not_in.iter().any(|u| u == url) {
                return Err(DecodeError::invalid(
                    at,
                    format!("type URL must not be in list {not_in:?}"),
                ));
            }
            Ok(())
        }
        Rule::Duration { range, .. } => match duration_nanos(value) {
            Some(v) => check_range(range, v, at, &duration_text),
            None => Ok(()),
        },
        Rule::Timestamp { .. } => Ok(()),
    }
}

/// A list item or map key/value rule; message items are recursed into by the walk.
fn apply_item(item: &ItemRule, value: &Value, kind: &Kind, at: &str) -> Result<(), DecodeError> {
    let Some(rule) = &item.rule else {
        return Ok(());
    };
    // A list's kind is its item kind already; a wrapper item is checked by its value.
    apply(rule, value, kind, at)
}

fn check_count(
    n: usize,
    min: Option<u64>,
    max: Option<u64>,
    at: &str,
    unit: &str,
) -> Result<(), DecodeError> {
    let n = n as u64;
    if let Some(min) = min
        && n < min
    {
        return Err(DecodeError::invalid(
            at,
            format!("value must contain at least {min} {unit}"),
        ));
    }
    if let Some(max) = max
        && n > max
    {
        return Err(DecodeError::invalid(
            at,
            format!("value must contain no more than {max} {unit}"),
        ));
    }
    Ok(())
}

fn check_unique(list: &[Value], at: &str) -> Result<(), DecodeError> {
    let mut seen_strings = HashSet::new();
    for (i, v) in list.iter().enumerate() {
        let duplicate = match v {
            Value::String(s) => !seen_strings.insert(s.as_str()),
            other => list[..i].contains(other),
        };
        if duplicate {
            return Err(DecodeError::invalid(
                format!("{at}[{i}]"),
                "repeated value must contain unique items",
            ));
        }
    }
    Ok(())
}

fn check_range(
    r: &Range,
    v: Num,
    at: &str,
    show: &dyn Fn(Num) -> String,
) -> Result<(), DecodeError> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let is = |bound: Option<Num>, ok: &[std::cmp::Ordering]| {
        bound.is_none_or(|b| v.cmp(b).is_some_and(|o| ok.contains(&o)))
    };
    if let Some(k) = r.konst
        && v.cmp(k) != Some(Equal)
    {
        return Err(DecodeError::invalid(
            at,
            format!("value must equal {}", show(k)),
        ));
    }
    let lower = (r.gt, r.gte);
    let upper = (r.lt, r.lte);
    let above = is(lower.0, &[Greater]) && is(lower.1, &[Greater, Equal]);
    let below = is(upper.0, &[Less]) && is(upper.1, &[Less, Equal]);
    // PGV: with both bounds and upper < lower, the value must lie outside the range.
    let lo = lower.0.or(lower.1);
    let hi = upper.0.or(upper.1);
    let exclusive = matches!((lo, hi), (Some(l), Some(h)) if h.cmp(l) != Some(Greater));
    let ok = if exclusive {
        above || below
    } else {
        above && below
    };
    if !ok {
        let describe = |b: Option<Num>, word: &str| b.map(|b| format!("{word} {}", show(b)));
        let parts: Vec<String> = [
            describe(r.gt, "greater than"),
            describe(r.gte, "greater than or equal to"),
            describe(r.lt, "less than"),
            describe(r.lte, "less than or equal to"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let joiner = if exclusive { " or " } else { " and " };
        return Err(DecodeError::invalid(
            at,
            format!("value must be {}", parts.join(joiner)),
        ));
    }
    if !r.in_.is_empty() && !r.in_.iter().any(|k| v.cmp(*k) == Some(Equal)) {
        let list: Vec<String> = r.in_.iter().map(|k| show(*k)).collect();
        return Err(DecodeError::invalid(
            at,
            format!("value must be in list [{}]", list.join(", ")),
        ));
    }
    if r.not_in.iter().any(|k| v.cmp(*k) == Some(Equal)) {
        let list: Vec<String> = r.not_in.iter().map(|k| show(*k)).collect();
        return Err(DecodeError::invalid(
            at,
            format!("value must not be in list [{}]", list.join(", ")),
        ));
    }
    Ok(())
}

fn duration_text(n: Num) -> String {
    let Num::Int(nanos) = n else {
        return n.to_string();
    };
    let (seconds, rest) = (nanos / 1_000_000_000, (nanos % 1_000_000_000).abs());
    if rest == 0 {
        format!("{seconds}s")
    } else {
        let sign = if nanos < 0 && seconds == 0 { "-" } else { "" };
        let frac = format!("{rest:09}");
        format!("{sign}{seconds}.{}s", frac.trim_end_matches('0'))
    }
}

fn check_string(s: &StringRule, v: &str, at: &str) -> Result<(), DecodeError> {
    if s.ignore_empty && v.is_empty() {
        return Ok(());
    }
    let err = |m: String| Err(DecodeError::invalid(at, m));
    if let Some(k) = &s.konst
        && v != k
    {
        return err(format!("value must equal {k:?}"));
    }
    if !s.in_.is_empty() && !s.in_.iter().any(|k| k == v) {
        return err(format!("value must be in list {:?}", s.in_));
    }
    if s.not_in.iter().any(|k| k == v) {
        return err(format!("value must not be in list {:?}", s.not_in));
    }
    let chars = v.chars().count() as u64;
    if let Some(len) = s.len
        && chars != len
    {
        return err(format!("value must be {len} characters"));
    }
    if let Some(min) = s.min_len
        && chars < min
    {
        return err(format!("value length must be at least {min} characters"));
    }
    if let Some(max) = s.max_len
        && chars > max
    {
        return err(format!("value length must be at most {max} characters"));
    }
    let bytes = v.len() as u64;
    if let Some(len) = s.len_bytes
        && bytes != len
    {
        return err(format!("value length must be {len} bytes"));
    }
    if let Some(min) = s.min_bytes
        && bytes < min
    {
        return err(format!("value length must be at least {min} bytes"));
    }
    if let Some(max) = s.max_bytes
        && bytes > max
    {
        return err(format!("value length must be at most {max} bytes"));
    }
    if let Some(p) = &s.prefix
        && !v.starts_with(p.as_str())
    {
        return err(format!("value does not have prefix {p:?}"));
    }
    if let Some(p) = &s.suffix
        && !v.ends_with(p.as_str())
    {
        return err(format!("value does not have suffix {p:?}"));
    }
    if let Some(p) = &s.contains
        && !v.contains(p.as_str())
    {
        return err(format!("value does not contain substring {p:?}"));
    }
    if let Some(p) = &s.not_contains
        && v.contains(p.as_str())
    {
        return err(format!("value contains substring {p:?}"));
    }
    if let Some((p, re)) = &s.pattern
        && !re.is_match(v)
    {
        return err(format!("value does not match regex pattern {p:?}"));
    }
    if let Some(wk) = s.well_known {
        let ok = match wk {
            WellKnown::Ip => v.parse::<std::net::IpAddr>().is_ok(),
            WellKnown::Ipv4 => v.parse::<std::net::Ipv4Addr>().is_ok(),
            WellKnown::Ipv6 => v.parse::<std::net::Ipv6Addr>().is_ok(),
            WellKnown::Hostname => is_hostname(v),
            WellKnown::Address => is_hostname(v) || v.parse::<std::net::IpAddr>().is_ok(),
            WellKnown::Uuid => is_uuid(v),
        };
        if !ok {
            return err(match wk {
                WellKnown::Ip => "value must be a valid IP Address",
                WellKnown::Ipv4 => "value must be a valid IPv4 Address",
                WellKnown::Ipv6 => "value must be a valid IPv6 Address",
                WellKnown::Hostname => "value must be a valid hostname",
                WellKnown::Address => "value must be an ip address, or a hostname.",
                WellKnown::Uuid => "value must be a valid UUID",
            }
            .to_string());
        }
    }
    Ok(())
}

/// PGV's `IsHostname`: at most 253 bytes, dot-separated labels of 1-63 letters, digits
/// or hyphens, not starting or ending with a hyphen.
fn is_hostname(v: &str) -> bool {
    v.len() <= 253
        && v.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-')
        })
}

fn is_uuid(v: &str) -> bool {
    v.len() == 36
        && v.bytes().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn check_bytes(b: &BytesRule, v: &[u8], at: &str) -> Result<(), DecodeError> {
    if b.ignore_empty && v.is_empty() {
        return Ok(());
    }
    let err = |m: String| Err(DecodeError::invalid(at, m));
    if let Some(k) = &b.konst
        && v != k.as_slice()
    {
        return err("value must equal the constant bytes".to_string());
    }
    if !b.in_.is_empty() && !b.in_.iter().any(|k| k.as_slice() == v) {
        return err("value must be in the list of allowed bytes".to_string());
    }
    if b.not_in.iter().any(|k| k.as_slice() == v) {
        return err("value must not be in the list of refused bytes".to_string());
    }
    let n = v.len() as u64;
    if let Some(len) = b.len
        && n != len
    {
        return err(format!("value length must be {len} bytes"));
    }
    if let Some(min) = b.min_len
        && n < min
    {
        return err(format!("value length must be at least {min} bytes"));
    }
    if let Some(max) = b.max_len
        && n > max
    {
        return err(format!("value length must be at most {max} bytes"));
    }
    if let Some(p) = &b.prefix
        && !v.starts_with(p)
    {
        return err("value does not have the required prefix".to_string());
    }
    if let Some(p) = &b.suffix
        && !v.ends_with(p)
    {
        return err("value does not have the required suffix".to_string());
    }
    if let Some(p) = &b.contains
        && !v.windows(p.len().max(1)).any(|w| w == p.as_slice())
    {
        return err("value does not contain the required bytes".to_string());
    }
    if let Some((p, re)) = &b.pattern
        && !re.is_match(v)
    {
        return err(format!("value does not match regex pattern {p:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let r = Range {
            gt: Some(Num::Int(0)),
            lte: Some(Num::Int(100)),
            ..Range::default()
        };
        let show = |n: Num| n.to_string();
        assert!(check_range(&r, Num::Int(1), "x", &show).is_ok());
        assert!(check_range(&r, Num::Int(100), "x", &show).is_ok());
        let e = check_range(&r, Num::Int(0), "x", &show).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x: value must be greater than 0 and less than or equal to 100"
        );
        assert!(check_range(&r, Num::Int(101), "x", &show).is_err());
        // Upper below lower: outside the range.
        let outside = Range {
            lt: Some(Num::Int(0)),
            gt: Some(Num::Int(10)),
            ..Range::default()
        };
        assert!(check_range(&outside, Num::Int(-1), "x", &show).is_ok());
        assert!(check_range(&outside, Num::Int(11), "x", &show).is_ok());
        assert!(check_range(&outside, Num::Int(5), "x", &show).is_err());
        let float = Range {
            gte: Some(Num::Float(0.0)),
            lte: Some(Num::Float(1.0)),
            ..Range::default()
        };
        assert!(check_range(&float, Num::Float(0.5), "x", &show).is_ok());
        assert!(check_range(&float, Num::Float(1.5), "x", &show).is_err());
        let set = Range {
            in_: vec![Num::Int(1), Num::Int(2)],
            not_in: vec![Num::Int(2)],
            ..Range::default()
        };
        assert!(check_range(&set, Num::Int(1), "x", &show).is_ok());
        assert!(check_range(&set, Num::Int(2), "x", &show).is_err());
        assert!(check_range(&set, Num::Int(3), "x", &show).is_err());
    }

    #[test]
    fn durations_print_like_envoy_writes_them() {
        assert_eq!(duration_text(Num::Int(0)), "0s");
        assert_eq!(duration_text(Num::Int(1_500_000_000)), "1.5s");
        assert_eq!(duration_text(Num::Int(1_000_000)), "0.001s");
        assert_eq!(duration_text(Num::Int(-1_000_000)), "-0.001s");
    }

    #[test]
    fn well_known_strings() {
        assert!(is_hostname("example.com"));
        assert!(!is_hostname("-a.com"));
        assert!(!is_hostname("a..com"));
        assert!(is_uuid("123e4567-e89b-12d3-a456-426614174000"));
        assert!(!is_uuid("123e4567e89b12d3a456426614174000"));
    }
}
