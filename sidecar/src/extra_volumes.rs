//! Extra Secret and ConfigMap volumes mounted read-only into the Envoy container (files
//! Envoy reads itself: SDS file paths, `DataSource` filenames such as the OAuth2 filter's
//! token and HMAC secrets). One rule for both ways to ask for them: the sidecar
//! annotations `envoy-extra-secret-volumes` / `envoy-extra-configmap-volumes` and an
//! EnvoyDeployment's `spec.extraVolumes` ([`check`]).

use std::fmt;

use marin3r_wire::quote::quoted;

/// Most extra volumes one Envoy container may mount (both kinds together).
pub const MAX_EXTRA_VOLUMES: usize = 16;
/// Longest mount path accepted, in bytes.
pub const MAX_MOUNT_PATH_BYTES: usize = 1024;

/// Where injection (and the operator) already mounts something into the Envoy container,
/// with what: an extra mount may not be at, under or over any of them.
pub const RESERVED_MOUNT_PATHS: [(&str, &str); 5] = [
    (
        marin3r_wire::paths::ENVOY_BOOTSTRAP,
        "the Envoy bootstrap volume",
    ),
    (
        marin3r_wire::paths::ENVOY_TLS_CLIENT,
        "the client certificate volume",
    ),
    ("/dev", "the container runtime's /dev"),
    ("/proc", "the container runtime's /proc"),
    ("/sys", "the container runtime's /sys"),
];

/// The kind of object an extra volume mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Secret,
    ConfigMap,
}

impl Source {
    /// The object kind, as Kubernetes spells it.
    pub fn kind(self) -> &'static str {
        match self {
            Source::Secret => "Secret",
            Source::ConfigMap => "ConfigMap",
        }
    }

    /// The generated volume name of the `index`-th (from 0) extra volume of this kind:
    /// `envoy-extra-secret-<index>` or `envoy-extra-configmap-<index>` (a DNS-1123 label
    /// of at most 24 characters while `index` < [`MAX_EXTRA_VOLUMES`]).
    pub fn volume_name(self, index: usize) -> String {
        match self {
            Source::Secret => format!("envoy-extra-secret-{index}"),
            Source::ConfigMap => format!("envoy-extra-configmap-{index}"),
        }
    }
}

/// A validated extra volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraVolume {
    pub source: Source,
    /// The Secret's or ConfigMap's name (same namespace).
    pub object_name: String,
    /// Where it is mounted (read-only) in the Envoy container.
    pub mount_path: String,
    /// The pod volume's name ([`Source::volume_name`]).
    pub volume_name: String,
}

/// An extra volume as asked for, before validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub source: Source,
    pub object_name: &'a str,
    pub mount_path: &'a str,
}

/// Which part of a request a [`Problem`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The Secret's or ConfigMap's name.
    ObjectName,
    /// The mount path.
    MountPath,
    /// The list as a whole (too many entries).
    List,
}

/// Which rule a [`Problem`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// A malformed name or mount path, or one over a path injection mounts.
    Format,
    /// A mount path at, under or over another entry's.
    Unique,
    /// More than [`MAX_EXTRA_VOLUMES`] entries.
    Count,
}

/// One broken rule, on request `index` of the list given to [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub index: usize,
    pub field: Field,
    pub rule: Rule,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether `inner` is `outer` or a path under it (both normalised, absolute).
fn at_or_under(inner: &str, outer: &str) -> bool {
    outer == "/"
        || inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A mount path on its own: absolute, normalised (no empty, `.` or `..` segment, no
/// trailing `/`), no whitespace, control characters, `:` or `,` (the annotations'
/// separators), at most [`MAX_MOUNT_PATH_BYTES`], and neither at, under nor over a path
/// injection mounts ([`RESERVED_MOUNT_PATHS`]).
pub fn mount_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("mount path must not be empty".into());
    }
    if path.len() > MAX_MOUNT_PATH_BYTES {
        return Err(format!(
            "mount path is {} bytes long; at most {MAX_MOUNT_PATH_BYTES}",
            path.len()
        ));
    }
    if !path.starts_with('/') {
        return Err(format!("mount path {} is not absolute", quoted(path)));
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == ':' || c == ',')
    {
        return Err(format!(
            "mount path {} must not contain whitespace, control characters, ':' or ','",
            quoted(path)
        ));
    }
    if path == "/" {
        return Err("mount path \"/\" would hide the whole container filesystem".into());
    }
    if path[1..]
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err(format!(
            "mount path {} is not normalised (no '//', '.' or '..' segments, no trailing '/')",
            quoted(path)
        ));
    }
    for (reserved, what) in RESERVED_MOUNT_PATHS {
        if at_or_under(path, reserved) || at_or_under(reserved, path) {
            return Err(format!(
                "mount path {} overlaps {reserved}, where the Envoy container has {what}",
                quoted(path)
            ));
        }
    }
    Ok(())
}

/// Checks a whole list of extra volumes (every problem, not only the first) and gives
/// them their volume names, numbered per kind in list order. Besides each entry's own
/// rules (a DNS-1123 subdomain name, [`mount_path`]): no two mounts at, under or over one
/// another (Kubernetes refuses two at one path; one inside another would have to be
/// created in a read-only volume) and at most [`MAX_EXTRA_VOLUMES`].
pub fn check(requests: &[Request<'_>]) -> Result<Vec<ExtraVolume>, Vec<Problem>> {
    let mut problems = Vec::new();
    if requests.len() > MAX_EXTRA_VOLUMES {
        problems.push(Problem {
            index: MAX_EXTRA_VOLUMES,
            field: Field::List,
            rule: Rule::Count,
            message: format!(
                "{} extra volumes; at most {MAX_EXTRA_VOLUMES}",
                requests.len()
            ),
        });
    }
    let mut valid_paths: Vec<&str> = Vec::new();
    // Only the entries within the bound are checked one by one: the clash check compares
    // every pair, and an annotation can hold tens of thousands of entries.
    for (index, r) in requests.iter().enumerate().take(MAX_EXTRA_VOLUMES) {
        if let Err(why) = marin3r_wire::dns1123_subdomain(r.object_name) {
            problems.push(Problem {
                index,
                field: Field::ObjectName,
                rule: Rule::Format,
                message: format!("{} name: {why}", r.source.kind()),
            });
        }
        if let Err(message) = mount_path(r.mount_path) {
            problems.push(Problem {
                index,
                field: Field::MountPath,
                rule: Rule::Format,
                message,
            });
            continue;
        }
        if let Some(other) = valid_paths
            .iter()
            .find(|other| at_or_under(r.mount_path, other) || at_or_under(other, r.mount_path))
        {
            let how = if *other == r.mount_path {
                "is listed twice".to_string()
            } else {
                format!("overlaps the mount path {}", quoted(other))
            };
            problems.push(Problem {
                index,
                field: Field::MountPath,
                rule: Rule::Unique,
                message: format!("mount path {} {how}", quoted(r.mount_path)),
            });
        }
        valid_paths.push(r.mount_path);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut counts = [0usize; 2];
    Ok(requests
        .iter()
        .map(|r| {
            let n = &mut counts[r.source as usize];
            let volume_name = r.source.volume_name(*n);
            *n += 1;
            ExtraVolume {
                source: r.source,
                object_name: r.object_name.to_string(),
                mount_path: r.mount_path.to_string(),
                volume_name,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret<'a>(name: &'a str, path: &'a str) -> Request<'a> {
        Request {
            source: Source::Secret,
            object_name: name,
            mount_path: path,
        }
    }

    fn config_map<'a>(name: &'a str, path: &'a str) -> Request<'a> {
        Request {
            source: Source::ConfigMap,
            ..secret(name, path)
        }
    }

    #[test]
    fn volumes_are_named_per_kind_in_order() {
        let v = check(&[
            secret("oauth-token", "/etc/envoy/oauth/token"),
            config_map("lua", "/etc/envoy/lua"),
            secret("hmac", "/etc/envoy/oauth/hmac"),
        ])
        .unwrap();
        let names: Vec<&str> = v.iter().map(|v| v.volume_name.as_str()).collect();
        assert_eq!(
            names,
            [
                "envoy-extra-secret-0",
                "envoy-extra-configmap-0",
                "envoy-extra-secret-1"
            ]
        );
        for i in 0..MAX_EXTRA_VOLUMES {
            for s in [Source::Secret, Source::ConfigMap] {
                marin3r_wire::dns1123_label(&s.volume_name(i)).unwrap();
            }
        }
    }

    #[test]
    fn mount_paths_must_be_absolute_normalised_and_clear_of_injected_mounts() {
        for (path, expected) in [
            ("", "must not be empty"),
            ("etc/x", "is not absolute"),
            ("/", "whole container filesystem"),
            ("/etc//x", "is not normalised"),
            ("/etc/x/", "is not normalised"),
            ("/etc/./x", "is not normalised"),
            ("/etc/../x", "is not normalised"),
            ("/etc/x y", "must not contain whitespace"),
            ("/etc/x:y", "must not contain whitespace"),
            ("/etc/envoy/bootstrap", "overlaps /etc/envoy/bootstrap"),
            ("/etc/envoy/bootstrap/x", "overlaps /etc/envoy/bootstrap"),
            ("/etc/envoy", "overlaps /etc/envoy/bootstrap"),
            ("/etc/envoy/tls", "overlaps /etc/envoy/tls/client"),
            ("/etc/envoy/tls/client/ca", "overlaps /etc/envoy/tls/client"),
            ("/etc", "overlaps /etc/envoy/bootstrap"),
            ("/dev/shm", "overlaps /dev"),
            ("/proc", "overlaps /proc"),
        ] {
            let e = mount_path(path).unwrap_err();
            assert!(e.contains(expected), "{path:?}: {e}");
        }
        let long = format!("/{}", "a".repeat(MAX_MOUNT_PATH_BYTES));
        assert!(mount_path(&long).unwrap_err().contains("bytes long"));
        for ok in [
            "/etc/envoy/oauth",
            "/etc/envoy/tls/server",
            "/etc/envoy/bootstrapx",
            "/devices",
            "/etc/envoy/tls/clientx",
        ] {
            mount_path(ok).unwrap();
        }
    }

    #[test]
    fn clashes_names_and_count_are_all_reported_and_bounded() {
        let e = check(&[
            secret("a", "/etc/envoy/a"),
            config_map("b", "/etc/envoy/a"),
            secret("Bad_Name", "/etc/envoy/a/b"),
            secret("c", "/etc/envoy"),
        ])
        .unwrap_err();
        let got: Vec<(usize, Field, &str)> = e
            .iter()
            .map(|p| (p.index, p.field, p.message.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    1,
                    Field::MountPath,
                    "mount path \"/etc/envoy/a\" is listed twice"
                ),
                (
                    2,
                    Field::ObjectName,
                    "Secret name: \"Bad_Name\" is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"
                ),
                (
                    2,
                    Field::MountPath,
                    "mount path \"/etc/envoy/a/b\" overlaps the mount path \"/etc/envoy/a\""
                ),
                (
                    3,
                    Field::MountPath,
                    "mount path \"/etc/envoy\" overlaps /etc/envoy/bootstrap, where the Envoy container has the Envoy bootstrap volume"
                ),
            ]
        );
        let paths: Vec<String> = (0..=MAX_EXTRA_VOLUMES).map(|i| format!("/x/{i}")).collect();
        let many: Vec<Request<'_>> = paths.iter().map(|p| secret("s", p)).collect();
        let e = check(&many).unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, Field::List);
        assert_eq!(e[0].message, "17 extra volumes; at most 16");
        assert!(check(&many[..MAX_EXTRA_VOLUMES]).is_ok());
        // Entries past the bound are not checked one by one (nor against each other).
        let same: Vec<Request<'_>> = (0..100_000).map(|_| secret("BAD", "/x")).collect();
        let e = check(&same).unwrap_err();
        assert_eq!(e.len(), 1 + MAX_EXTRA_VOLUMES * 2 - 1, "{e:?}");
        assert_eq!(e[0].message, "100000 extra volumes; at most 16");
    }
}
