//! Small syntax validators shared by the annotation parser: ports, names, images,
//! Kubernetes quantities, booleans. Each returns a human message on failure; the caller
//! prefixes the annotation name.

use std::cmp::Ordering;
use std::net::IpAddr;

use marin3r_wire::quote::quoted;

/// Lowest port a sidecar may use: privileged ports need capabilities Envoy does not get.
pub const MIN_PORT: u32 = 1024;
/// Highest TCP/UDP port.
pub const MAX_PORT: u32 = 65535;

/// Parses an unprivileged port number (1024–65535).
pub fn port(s: &str) -> Result<u16, String> {
    let n: u64 = s
        .parse()
        .map_err(|_| format!("{} is not a number", quoted(s)))?;
    if n < u64::from(MIN_PORT) {
        return Err(format!("port {n} is privileged ({MIN_PORT}-{MAX_PORT})"));
    }
    if n > u64::from(MAX_PORT) {
        return Err(format!("port {n} is out of range ({MIN_PORT}-{MAX_PORT})"));
    }
    u16::try_from(n).map_err(|_| format!("port {n} is out of range ({MIN_PORT}-{MAX_PORT})"))
}

/// Parses a boolean the way upstream MARIN3R (Go's `strconv.ParseBool`) does.
pub fn boolean(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{} is not a boolean (true or false)", quoted(s))),
    }
}

/// A container image reference: `[host[:port]/]path[:tag][@algo:hex]`.
pub fn image(s: &str) -> Result<(), String> {
    let bad = || format!("{} is not a valid image reference", quoted(s));
    if s.is_empty() {
        return Err("image must not be empty".into());
    }
    if s.len() > 4096 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad());
    }
    let (name_tag, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let (algo, hex) = d.split_once(':').ok_or_else(bad)?;
        let algo_ok = !algo.is_empty()
            && algo
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-_".contains(&b));
        if !algo_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
    }
    // A tag is after the last ':' that follows the last '/' (a ':' before it is a registry port).
    let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[last_slash..].rfind(':') {
        Some(i) => (
            &name_tag[..last_slash + i],
            Some(&name_tag[last_slash + i + 1..]),
        ),
        None => (name_tag, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return Err(bad());
        }
    }
    let mut parts = name.split('/').peekable();
    let mut first = true;
    while let Some(part) = parts.next() {
        let is_registry = first
            && parts.peek().is_some()
            && (part.contains('.') || part.contains(':') || part == "localhost");
        first = false;
        let ok = if is_registry {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        } else {
            path_component(part)
        };
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}

fn path_component(p: &str) -> bool {
    let b = p.as_bytes();
    !b.is_empty()
        && b.first()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

/// `host:port` where host is a DNS name, an IPv4 address or a bracketed IPv6 address.
pub fn host_port(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("{} is not host:port", quoted(s));
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{} has an invalid port (1-65535)", quoted(s)))?;
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.parse::<std::net::Ipv4Addr>().is_ok() || dns_name(host)
    };
    if !host_ok {
        return Err(bad());
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), port))
}

/// A DNS host name (labels of letters, digits and '-', case-insensitive).
pub fn dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.trim_end_matches('.').split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// An IP address (v4 or v6).
pub fn ip(s: &str) -> Result<IpAddr, String> {
    s.parse()
        .map_err(|_| format!("{} is not an IP address", quoted(s)))
}

/// A Kubernetes resource quantity, kept as written and as an exact value in nano units
/// so request ≤ limit can be compared without floating point error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    /// The string as written (what goes into the Pod).
    pub text: String,
    /// The value × 10⁹, rounded up like Kubernetes does below nano precision.
    pub nanos: i128,
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.nanos.cmp(&other.nanos))
    }
}

/// Parses a Kubernetes quantity (`100m`, `1.5Gi`, `2e3`, `128974848`); negative values
/// are rejected because they make no sense for container resources.
pub fn quantity(s: &str) -> Result<Quantity, String> {
    let bad = || format!("{} is not a valid Kubernetes quantity", quoted(s));
    let too_big = || format!("{} is too large", quoted(s));
    if s.is_empty() || s.len() > 64 {
        return Err(bad());
    }
    let body = s.strip_prefix('+').unwrap_or(s);
    if let Some(magnitude) = body.strip_prefix('-') {
        // `-0` (in any spelling) is zero, as Kubernetes reads it; anything else is negative.
        return match quantity(magnitude) {
            Ok(q) if q.nanos == 0 => Ok(Quantity {
                text: s.to_string(),
                nanos: 0,
            }),
            Ok(_) => Err(format!("{} is negative", quoted(s))),
            Err(e) => Err(e.replace(&quoted(magnitude), &quoted(s))),
        };
    }
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(bad());
    }
    // value = digits × 10^exp10 × 2^exp2
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(bad)?;
            let e: i32 = exp.parse().map_err(|_| bad())?;
            if e > 40 {
                return Err(too_big());
            }
            // A very negative exponent is a tiny value, not a large one: below one nano
            // unit it rounds up like any other (-60 is as small as it needs to be).
            (e.max(-60), 0)
        }
    };
    // Trailing zeros of the fraction carry no value (`2.000…0e-11` is a small number):
    // drop them before the digits are accumulated, so they cannot overflow the mantissa.
    let frac_part = frac_part.trim_end_matches('0');
    let digits = format!("{int_part}{frac_part}");
    if digits.trim_start_matches('0').len() > 38 {
        return Err(format!("{} has more than 38 significant digits", quoted(s)));
    }
    let mut mantissa: i128 = 0;
    for d in digits.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
            .ok_or_else(too_big)?;
    }
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| bad())?;
    // nanos = mantissa × 10^(exp10 - frac_len + 9) × 2^exp2
    let mut scaled = mantissa.checked_mul(1i128 << exp2).ok_or_else(too_big)?;
    let shift = exp10 - frac_len + 9;
    if shift >= 0 {
        let factor = 10i128
            .checked_pow(shift.unsigned_abs())
            .ok_or_else(too_big)?;
        scaled = scaled.checked_mul(factor).ok_or_else(too_big)?;
    } else {
        scaled = match 10i128.checked_pow(shift.unsigned_abs()) {
            Some(divisor) => scaled / divisor + i128::from(scaled % divisor != 0),
            // A divisor beyond i128 exceeds any mantissa: the value is below one nano
            // unit, so it rounds up to 1 (or stays 0), never "too large".
            None => i128::from(scaled != 0),
        };
    }
    Ok(Quantity {
        text: s.to_string(),
        nanos: scaled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        assert_eq!(port("1024"), Ok(1024));
        assert_eq!(port("65535"), Ok(65535));
        assert_eq!(port("80"), Err("port 80 is privileged (1024-65535)".into()));
        assert_eq!(
            port("65536"),
            Err("port 65536 is out of range (1024-65535)".into())
        );
        assert_eq!(port("abc"), Err("\"abc\" is not a number".into()));
        assert_eq!(port("-1"), Err("\"-1\" is not a number".into()));
        assert!(port("99999999999999999999999").is_err());
    }

    #[test]
    fn quantities() {
        let q = |s: &str| quantity(s).map(|q| q.nanos);
        assert_eq!(q("1"), Ok(1_000_000_000));
        assert_eq!(q("100m"), Ok(100_000_000));
        assert_eq!(q("0.1"), Ok(100_000_000));
        assert_eq!(q(".5"), Ok(500_000_000));
        assert_eq!(q("1Ki"), Ok(1024 * 1_000_000_000));
        assert_eq!(q("1Gi"), q("1073741824"));
        assert_eq!(q("1.5Gi"), q("1610612736"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("1n"), Ok(1));
        assert_eq!(q("0.1n"), Ok(1), "rounds up below nano precision");
        assert_eq!(
            q("0.0000000000000000e-32"),
            Ok(0),
            "tiny zero is not too large"
        );
        assert_eq!(q("1.0000000000000000e-40"), Ok(1), "tiny value rounds up");
        assert_eq!(
            q("2.00000000000000000000000000000000000000e-11"),
            Ok(1),
            "trailing zeros do not overflow"
        );
        assert_eq!(q("+2"), Ok(2_000_000_000));
        // Zero written with a minus sign is zero, not negative.
        for zero in ["-0", "-0.0", "-0Mi", "-0e3"] {
            assert_eq!(q(zero), Ok(0), "{zero}");
        }
        assert_eq!(quantity("-1m"), Err("\"-1m\" is negative".into()));
        assert_eq!(
            quantity("-x"),
            Err("\"-x\" is not a valid Kubernetes quantity".into())
        );
        // A tiny value is tiny, not "too large".
        assert_eq!(q("1e-100000"), Ok(1), "rounds up below nano precision");
        assert_eq!(q("0e-100000"), Ok(0));
        assert_eq!(quantity("1e41"), Err("\"1e41\" is too large".into()));
        assert!(q("100m") < q("1"));
        for bad in [
            "", "abc", "1x", "1.2.3", "Gi", ".", "1 Gi", "1e", "1e999", "-1",
        ] {
            assert!(quantity(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(quantity("99999999999999999999999999999999Ei").is_err());
    }

    #[test]
    fn images() {
        for ok in [
            "envoyproxy/envoy:v1.40.0",
            "envoy",
            "quay.io/3scale/marin3r:v0.13.1",
            "localhost:5000/envoy",
            "registry.example.com:5000/team/envoy:1.0_rc-1",
            "envoy@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "envoy:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(image(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Envoy",
            "envoy:",
            "envoy proxy",
            "envoy:-bad",
            "/envoy",
            "envoy/",
            "envoy@sha256:xyz",
            "envoy\n",
        ] {
            assert!(image(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_ports() {
        assert_eq!(
            host_port("xds.local:18000"),
            Ok(("xds.local".into(), 18000))
        );
        assert_eq!(host_port("10.0.0.1:80"), Ok(("10.0.0.1".into(), 80)));
        assert_eq!(host_port("[::1]:18000"), Ok(("::1".into(), 18000)));
        assert!(host_port("xds").is_err());
        assert!(host_port("xds:0").is_err());
        assert!(host_port("bad host:1").is_err());
        assert!(host_port("::1:18000").is_err());
    }

    #[test]
    fn booleans() {
        assert_eq!(boolean("true"), Ok(true));
        assert_eq!(boolean("False"), Ok(false));
        assert!(boolean("yes").is_err());
    }
}
