//! Kubernetes' rules on names (as `k8s.io/apimachinery/pkg/util/validation` states them)
//! and MARIN3R's namespace defaulting: one function per rule, used by the sidecar
//! annotations, the operator's API validation and the discovery service's object names.

use crate::quote::quoted;

/// The namespace of an object whose manifest names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The namespace of an object: `namespace`, or [`DEFAULT_NAMESPACE`] when it is absent
/// **or empty** (Kubernetes treats an empty `metadata.namespace` as unset: `kubectl apply`
/// puts such an object in the context's namespace, and an AdmissionRequest for a Pod
/// created by a controller carries an empty one).
pub fn namespace_or_default(namespace: Option<&str>) -> &str {
    namespace_or(namespace, DEFAULT_NAMESPACE)
}

/// `namespace`, or `fallback` when it is absent **or empty**: the same rule as
/// [`namespace_or_default`] for a reference whose namespace defaults to another object's
/// (a DiscoveryServiceCertificate's `caSecretRef.namespace`: its own namespace).
pub fn namespace_or<'a>(namespace: Option<&'a str>, fallback: &'a str) -> &'a str {
    match given_namespace(namespace) {
        Some(ns) => ns,
        None => fallback,
    }
}

/// `namespace` when one is given: `None` for an absent **or empty** one (where a rule
/// treats "no namespace" specially, e.g. a local-mode Secret without one is seen from
/// every namespace).
pub fn given_namespace(namespace: Option<&str>) -> Option<&str> {
    namespace.filter(|ns| !ns.is_empty())
}

/// DNS-1123 label (container, volume and Service names): 1–63 lowercase letters, digits
/// and `-`, starting and ending with a letter or digit.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 63 {
        return Err(format!("{} is longer than 63 characters", quoted(s)));
    }
    if is_label_chars(s) {
        Ok(())
    } else {
        Err(format!(
            "{} is not a valid DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit)",
            quoted(s)
        ))
    }
}

/// DNS-1035 label (Service names): 1–63 lowercase letters, digits and `-`, starting
/// with a letter and ending with a letter or digit.
pub fn dns1035_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 63 {
        return Err(format!("{} is longer than 63 characters", quoted(s)));
    }
    if is_label_chars(s) && s.as_bytes()[0].is_ascii_lowercase() {
        Ok(())
    } else {
        Err(format!(
            "{} is not a valid DNS-1035 label (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit)",
            quoted(s)
        ))
    }
}

/// Lowercase letters, digits and `-`, not at either end (and not empty).
fn is_label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain (what most object names must be, Secrets among
/// them): at most 253 characters of dot-separated parts, each of lowercase letters,
/// digits and `-` starting and ending with a letter or digit. Like Kubernetes'
/// `IsDNS1123Subdomain`, a part may be longer than 63 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label_chars)
}

/// [`is_dns1123_subdomain`] with the reason when it is not.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err(format!("{} is longer than 253 characters", quoted(s)));
    }
    if is_dns1123_subdomain(s) {
        Ok(())
    } else {
        Err(format!(
            "{} is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.')",
            quoted(s)
        ))
    }
}

/// A valid label value: empty, or at most 63 letters, digits, `-`, `_` and `.`, starting
/// and ending with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    let b = value.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

/// [`is_label_value`] with the reason when it is not.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        Err(format!("{} is longer than 63 characters", quoted(value)))
    } else if is_label_value(value) {
        Ok(())
    } else {
        Err(format!(
            "{} is not a valid label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit)",
            quoted(value)
        ))
    }
}

/// A container port name (Kubernetes' IANA_SVC_NAME): 1–15 lowercase letters, digits
/// and `-`, at least one letter, no leading, trailing or doubled `-`.
pub fn port_name(name: &str) -> Result<(), String> {
    let problem = if name.is_empty() {
        return Err("port name must not be empty".into());
    } else if name.len() > 15 {
        "is longer than 15 characters"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        "must contain only lowercase letters, digits and '-'"
    } else if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        "must contain at least one letter"
    } else if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        "must not start or end with '-' or contain '--'"
    } else {
        return Ok(());
    };
    Err(format!("port name {} {problem}", quoted(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_absent_namespace_is_the_default_one() {
        assert_eq!(namespace_or_default(None), "default");
        assert_eq!(namespace_or_default(Some("")), "default");
        assert_eq!(namespace_or_default(Some("apps")), "apps");
        assert_eq!(namespace_or(Some(""), "own"), "own");
        assert_eq!(namespace_or(None, "own"), "own");
        assert_eq!(namespace_or(Some("apps"), "own"), "apps");
        assert_eq!(given_namespace(Some("")), None);
        assert_eq!(given_namespace(Some("apps")), Some("apps"));
    }

    #[test]
    fn kubernetes_names() {
        assert!(dns1123_label("envoy-sidecar").is_ok());
        assert!(dns1123_label("Envoy").is_err());
        assert!(dns1123_label("-x").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1123_subdomain("my.secret-1").is_ok());
        assert!(dns1123_subdomain("my..secret").is_err());
        assert!(port_name("envoy-https").is_ok());
        assert!(port_name("123").is_err());
        assert!(port_name("a--b").is_err());
        assert!(port_name("abcdefghijklmnop").is_err());
    }

    #[test]
    fn dns1123_labels() {
        assert!(dns1123_label("envoy-sidecar").is_ok());
        assert!(dns1123_label("a").is_ok());
        for bad in ["", "Envoy", "-x", "x-", "a_b", "a.b"] {
            assert!(dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1123_label(&"a".repeat(63)).is_ok());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
    }

    #[test]
    fn dns1035_labels() {
        for good in ["marin3r-instance", "a", "a-1", &"a".repeat(63)] {
            assert!(dns1035_label(good).is_ok(), "{good:?}");
        }
        for bad in ["", "1a", "-a", "a-", "a.b", "A", "a_b", &"a".repeat(64)] {
            assert!(dns1035_label(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            dns1035_label(&"a".repeat(64)).unwrap_err(),
            format!("{:?} is longer than 63 characters", "a".repeat(64))
        );
    }

    #[test]
    fn dns1123_subdomains() {
        for good in ["my.secret-1", "a", "kuard-v3-abc"] {
            assert!(dns1123_subdomain(good).is_ok(), "{good:?}");
        }
        for bad in ["", "my..secret", ".a", "a.", "A", "a_b", "-a.b"] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?}");
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(
            is_dns1123_subdomain(&format!("{}.b", "a".repeat(100))),
            "a part may be longer than 63 characters, as in Kubernetes"
        );
    }

    #[test]
    fn label_values() {
        for good in ["", "a", "My_Node.v3", &"a".repeat(63)] {
            assert!(is_label_value(good), "{good:?}");
        }
        for bad in ["-a", "a-", "a/b", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn port_names() {
        for good in ["envoy-https", "http", "a1", "h-2-c"] {
            assert!(port_name(good).is_ok(), "{good:?}");
        }
        let err = |s: &str| port_name(s).unwrap_err();
        assert_eq!(err(""), "port name must not be empty");
        assert_eq!(
            err("abcdefghijklmnop"),
            "port name \"abcdefghijklmnop\" is longer than 15 characters"
        );
        assert_eq!(
            err("Bad_Name"),
            "port name \"Bad_Name\" must contain only lowercase letters, digits and '-'"
        );
        assert_eq!(
            err("123"),
            "port name \"123\" must contain at least one letter"
        );
        for bad in ["a--b", "-ab", "ab-"] {
            assert_eq!(
                err(bad),
                format!("port name {bad:?} must not start or end with '-' or contain '--'")
            );
        }
    }

    #[test]
    fn a_huge_name_is_quoted_bounded_in_every_rule() {
        let huge = "A".repeat(1 << 20);
        let messages = [
            dns1123_label(&huge),
            dns1035_label(&huge),
            dns1123_subdomain(&huge),
            label_value(&huge),
            port_name(&huge),
        ];
        for m in messages {
            let m = m.unwrap_err();
            assert!(
                m.len() < 2 * crate::quote::MAX_QUOTED_BYTES,
                "{} bytes",
                m.len()
            );
            assert!(m.contains("(1048576 bytes)"), "{}", &m[m.len() - 80..]);
        }
    }
}
