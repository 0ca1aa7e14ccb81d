//! The self-healing status of local mode (SPEC §4): the JSON of `GET /status` on the
//! metrics listener, how it is computed from [`Revisions`], the `kubectl get ec`-like
//! table `marin3r status` prints, and the tiny blocking HTTP/1.1 client it uses.
//!
//! ```json
//! {"envoyConfigs": [{"name": "kuard", "namespace": "default", "nodeID": "kuard",
//!   "envoyAPI": "v3", "desiredVersion": "…", "publishedVersion": "…",
//!   "cacheState": "Rollback", "conditions": [{"type": "CacheOutOfSync", …}],
//!   "revisions": [{"version": "…", "published": true, "tainted": false,
//!                  "createdAt": "2025-01-01T10:00:00Z", "lastPublishedAt": "…",
//!                  "providesVersions": {"listener": "…"}}]}]}
//! ```
//!
//! Everything here but [`fetch`] and [`delete_revision`] is pure.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

use crate::revisions::Revisions;
use marin3r_envoyconfig::envoyconfig::CacheState;

/// Condition type: the desired version is not the one being served.
pub const CACHE_OUT_OF_SYNC: &str = "CacheOutOfSync";
/// Condition type: every revision is tainted; the last good snapshot keeps being served.
pub const ROLLBACK_FAILED: &str = "RollbackFailed";

/// The body of `GET /status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// Sorted by namespace, then name.
    pub envoy_configs: Vec<EnvoyConfigReport>,
    /// Local mode: the config folder's files that cannot be used now (their last good
    /// content keeps being served), with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileReport>,
}

/// A file of the config folder that cannot be used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileReport {
    pub path: String,
    pub error: String,
}

/// One EnvoyConfig: what `kubectl get ec -o yaml` shows as its status in Kubernetes mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigReport {
    pub name: String,
    pub namespace: String,
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// `spec.envoyAPI` (`v3` when unset, its default).
    #[serde(rename = "envoyAPI")]
    pub envoy_api: String,
    /// The version of the current spec.
    #[serde(default)]
    pub desired_version: Option<String>,
    /// The version whose snapshot is being served (in `RollbackFailed`: the last good
    /// one, which may be tainted or even deleted by then).
    #[serde(default)]
    pub published_version: Option<String>,
    #[serde(default)]
    pub cache_state: Option<CacheState>,
    /// `CacheOutOfSync` and `RollbackFailed`, as Kubernetes conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Oldest first; the last one is the desired revision.
    #[serde(default)]
    pub revisions: Vec<RevisionReport>,
    /// Why what is written for this EnvoyConfig is not used (an invalid document, a file
    /// that cannot be read): the last good state keeps being served meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// One revision (an EnvoyConfigRevision in Kubernetes mode).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionReport {
    pub version: String,
    /// Its snapshot is the one in the cache.
    pub published: bool,
    pub tainted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint_reason: Option<String>,
    /// RFC 3339, UTC, whole seconds.
    pub created_at: String,
    #[serde(default)]
    pub last_published_at: Option<String>,
    /// Per-type versions of the snapshot it published last.
    #[serde(default)]
    pub provides_versions: BTreeMap<String, String>,
}

/// A time as RFC 3339 in UTC with whole seconds (`2025-01-01T10:00:00Z`), like Kubernetes.
pub fn rfc3339(t: SystemTime) -> String {
    timestamp(t).to_string()
}

fn timestamp(t: SystemTime) -> k8s_openapi::jiff::Timestamp {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    };
    let bound = if secs < 0 {
        k8s_openapi::jiff::Timestamp::MIN
    } else {
        k8s_openapi::jiff::Timestamp::MAX
    };
    k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or(bound)
}

/// The conditions of an EnvoyConfig (both modes: `GET /status` in local mode, the
/// EnvoyConfig status in Kubernetes mode), keeping each condition's `lastTransitionTime`
/// from `previous` when its status did not change (like `meta.SetStatusCondition`). Both
/// are present once there is a state:
///
/// - `CacheOutOfSync` is `True` when what is served is not the desired version:
///   `CantPublishDesiredVersion` in `Rollback` and `RollbackFailed`; `ResourcesOutOfSync`
///   while the elected revision waits for a Secret (`waiting`, the message names it);
///   `PublishPending` while the desired revision is not served yet; else `False`,
///   `DesiredVersionPublished`.
/// - `RollbackFailed` is `True` (`AllRevisionsTainted`) only in `RollbackFailed`, else
///   `False` (`UntaintedRevisionPublished`).
pub fn conditions(
    state: Option<CacheState>,
    desired: Option<&str>,
    published: Option<&str>,
    waiting: Option<&str>,
    previous: &[Condition],
    now: SystemTime,
) -> Vec<Condition> {
    let Some(state) = state else {
        return Vec::new();
    };
    let desired = desired.unwrap_or_default();
    let out_of_sync = match (state, waiting) {
        (CacheState::Rollback, _) => (
            true,
            "CantPublishDesiredVersion",
            format!(
                "version {desired} is tainted; rolled back to version {}",
                published.unwrap_or_default()
            ),
        ),
        (CacheState::RollbackFailed, _) => (
            true,
            "CantPublishDesiredVersion",
            format!("version {desired} is tainted and no untainted revision is left"),
        ),
        (CacheState::InSync, Some(reason)) => (
            true,
            "ResourcesOutOfSync",
            format!("version {desired} waits for its dependencies: {reason}"),
        ),
        (CacheState::InSync, None) if published != Some(desired) => (
            true,
            "PublishPending",
            format!("version {desired} is being published"),
        ),
        (CacheState::InSync, None) => (
            false,
            "DesiredVersionPublished",
            format!("version {desired} is published"),
        ),
    };
    let rollback_failed = match state {
        CacheState::RollbackFailed => (
            true,
            "AllRevisionsTainted",
            "every revision is tainted; the last good snapshot keeps being served".to_string(),
        ),
        _ => (
            false,
            "UntaintedRevisionPublished",
            "an untainted revision is published".to_string(),
        ),
    };
    [
        (CACHE_OUT_OF_SYNC, out_of_sync),
        (ROLLBACK_FAILED, rollback_failed),
    ]
    .into_iter()
    .map(|(type_, (on, reason, message))| {
        let status = if on { "True" } else { "False" };
        let since = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| Time(timestamp(now)));
        Condition {
            last_transition_time: since,
            message,
            observed_generation: None,
            reason: reason.to_string(),
            status: status.to_string(),
            type_: type_.to_string(),
        }
    })
    .collect()
}

/// The report of one EnvoyConfig. `served` is the revision whose snapshot is in the cache
/// (the published one, or the last good one in `RollbackFailed`).
pub fn envoy_config_report(
    namespace: &str,
    name: &str,
    envoy_api: &str,
    revisions: &Revisions,
    served: Option<&str>,
    conditions: Vec<Condition>,
) -> EnvoyConfigReport {
    EnvoyConfigReport {
        name: name.to_string(),
        namespace: namespace.to_string(),
        node_id: revisions.node_id.clone(),
        envoy_api: envoy_api.to_string(),
        desired_version: revisions.desired().map(|r| r.version.clone()),
        published_version: served.map(str::to_string),
        cache_state: revisions.cache_state(),
        conditions,
        revisions: revisions
            .revisions
            .iter()
            .map(|r| RevisionReport {
                version: r.version.clone(),
                published: served == Some(r.version.as_str()),
                tainted: r.tainted.is_some(),
                taint_reason: r.tainted.clone(),
                created_at: rfc3339(r.created_at),
                last_published_at: r.last_published_at.map(rfc3339),
                provides_versions: r
                    .provides_versions
                    .iter()
                    .map(|(t, v)| (t.as_str().to_string(), v.clone()))
                    .collect(),
            })
            .collect(),
        errors: Vec::new(),
    }
}

/// Left-aligned columns separated by three spaces, like `kubectl get`.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            line.push_str(cell);
            if i < last {
                let pad = w.saturating_sub(cell.chars().count()) + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The table `marin3r status` prints: `NAME NODE ID ENVOY API DESIRED VERSION PUBLISHED
/// VERSION CACHE STATE`, with a leading `NAMESPACE` column when the EnvoyConfigs span
/// several namespaces (like `kubectl get ec -A`). With `revisions`, each EnvoyConfig's
/// revisions follow (oldest first): `VERSION PUBLISHED TAINTED CREATED AT LAST
/// PUBLISHED AT`. Missing values are empty cells.
pub fn render_table(report: &StatusReport, revisions: bool) -> String {
    if report.envoy_configs.is_empty() {
        return "No EnvoyConfigs found.\n".to_string();
    }
    let namespaced = report
        .envoy_configs
        .iter()
        .any(|ec| ec.namespace != report.envoy_configs[0].namespace);
    let mut header = vec![
        "NAME",
        "NODE ID",
        "ENVOY API",
        "DESIRED VERSION",
        "PUBLISHED VERSION",
        "CACHE STATE",
    ];
    if namespaced {
        header.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = report
        .envoy_configs
        .iter()
        .map(|ec| {
            let mut row = vec![
                ec.name.clone(),
                ec.node_id.clone(),
                ec.envoy_api.clone(),
                ec.desired_version.clone().unwrap_or_default(),
                ec.published_version.clone().unwrap_or_default(),
                ec.cache_state.map(|s| s.to_string()).unwrap_or_default(),
            ];
            if namespaced {
                row.insert(0, ec.namespace.clone());
            }
            row
        })
        .collect();
    let mut out = table(&header, &rows);
    if revisions {
        for ec in &report.envoy_configs {
            out.push_str(&format!(
                "\nRevisions of {}/{} (node ID {}):\n",
                ec.namespace, ec.name, ec.node_id
            ));
            let rows: Vec<Vec<String>> = ec
                .revisions
                .iter()
                .map(|r| {
                    vec![
                        r.version.clone(),
                        r.published.to_string(),
                        r.tainted.to_string(),
                        r.created_at.clone(),
                        r.last_published_at.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            out.push_str(&table(
                &[
                    "VERSION",
                    "PUBLISHED",
                    "TAINTED",
                    "CREATED AT",
                    "LAST PUBLISHED AT",
                ],
                &rows,
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Client.

/// Errors of [`fetch`] and [`delete_revision`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{url:?} is not a URL like http://127.0.0.1:8383 ({reason})")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("cannot resolve {authority}")]
    Resolve {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot talk to {addr}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{method} {path}: malformed HTTP response")]
    Malformed { method: &'static str, path: String },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Status {
        method: &'static str,
        path: String,
        status: u16,
        body: String,
    },
    #[error("{path}: the answer is not the status JSON")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// An `http://host[:port][/prefix]` URL split into authority and path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    authority: String,
    prefix: String,
}

fn parse_url(url: &str) -> Result<Url, ClientError> {
    let invalid = |reason| ClientError::InvalidUrl {
        url: url.to_string(),
        reason,
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| invalid("only http:// is supported"))?;
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(invalid("no host"));
    }
    // A port is present unless the authority ends with a host (`host`, `[::1]`).
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    let authority = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok(Url {
        authority,
        prefix: prefix.to_string(),
    })
}

/// Decodes a `Transfer-Encoding: chunked` body.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

/// One request on a fresh connection (`Connection: close`): status and body.
fn request(
    url: &str,
    method: &'static str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), ClientError> {
    let url = parse_url(url)?;
    let path = format!("{}{path}", url.prefix);
    let addrs: Vec<SocketAddr> = url
        .authority
        .to_socket_addrs()
        .map_err(|source| ClientError::Resolve {
            authority: url.authority.clone(),
            source,
        })?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some((addr, s));
                break;
            }
            Err(source) => last = Some(ClientError::Io { addr, source }),
        }
    }
    let Some((addr, mut stream)) = stream else {
        return Err(last.unwrap_or_else(|| ClientError::Resolve {
            authority: url.authority.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
        }));
    };
    let io = |source| ClientError::Io { addr, source };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        url.authority
    );
    stream.write_all(head.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    let malformed = || ClientError::Malformed {
        method,
        path: path.clone(),
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(malformed)?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(malformed)?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if chunked {
        body = dechunk(&body).ok_or_else(malformed)?;
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    if (200..300).contains(&status) {
        Ok((status, body))
    } else {
        Err(ClientError::Status {
            method,
            path,
            status,
            body: body.trim().to_string(),
        })
    }
}

/// `GET {url}/status` of a local-mode discovery service.
pub fn fetch(url: &str, timeout: Duration) -> Result<StatusReport, ClientError> {
    let (_, body) = request(url, "GET", "/status", timeout)?;
    serde_json::from_str(&body).map_err(|source| ClientError::Json {
        path: "/status".to_string(),
        source,
    })
}

/// `DELETE {url}/status/revisions/{namespace}/{name}/{version}`: the EnvoyConfig after
/// the deletion.
pub fn delete_revision(
    url: &str,
    namespace: &str,
    name: &str,
    version: &str,
    timeout: Duration,
) -> Result<EnvoyConfigReport, ClientError> {
    let path = format!("/status/revisions/{namespace}/{name}/{version}");
    let (_, body) = request(url, "DELETE", &path, timeout)?;
    serde_json::from_str(&body).map_err(|source| ClientError::Json { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_envoyconfig::envoyconfig::EnvoyConfigSpec;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn spec(port: u64) -> EnvoyConfigSpec {
        serde_json::from_value(serde_json::json!({
            "nodeID": "kuard",
            "resources": [{"type": "listener", "value": {"name": "http", "port": port}}]
        }))
        .unwrap()
    }

    #[test]
    fn times_are_rfc3339_utc_whole_seconds() {
        assert_eq!(rfc3339(t(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(t(1_700_000_000) + Duration::from_millis(999)),
            "2023-11-14T22:13:20Z"
        );
    }

    #[test]
    fn conditions_follow_the_cache_state_and_keep_transition_times() {
        assert!(conditions(None, None, None, None, &[], t(1)).is_empty());
        let in_sync = conditions(
            Some(CacheState::InSync),
            Some("a"),
            Some("a"),
            None,
            &[],
            t(1),
        );
        let types: Vec<(&str, &str)> = in_sync
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [(CACHE_OUT_OF_SYNC, "False"), (ROLLBACK_FAILED, "False")]
        );

        let rollback = conditions(
            Some(CacheState::Rollback),
            Some("b"),
            Some("a"),
            None,
            &in_sync,
            t(5),
        );
        assert_eq!(rollback[0].status, "True");
        assert_eq!(rollback[0].reason, "CantPublishDesiredVersion");
        assert!(rollback[0].message.contains("rolled back to version a"));
        assert_eq!(rollback[0].last_transition_time, Time(timestamp(t(5))));
        assert_eq!(
            rollback[1].last_transition_time,
            Time(timestamp(t(1))),
            "unchanged status keeps its transition time"
        );

        let failed = conditions(
            Some(CacheState::RollbackFailed),
            Some("b"),
            Some("a"),
            None,
            &rollback,
            t(9),
        );
        assert_eq!(failed[0].last_transition_time, Time(timestamp(t(5))));
        assert_eq!(
            (failed[1].status.as_str(), failed[1].reason.as_str()),
            ("True", "AllRevisionsTainted")
        );
        assert_eq!(failed[1].last_transition_time, Time(timestamp(t(9))));

        // In sync by the revisions, but the desired one waits for a Secret, or is not
        // served yet.
        let waiting = conditions(
            Some(CacheState::InSync),
            Some("b"),
            Some("a"),
            Some("secret \"cert\" not found"),
            &[],
            t(10),
        );
        assert_eq!(
            (waiting[0].status.as_str(), waiting[0].reason.as_str()),
            ("True", "ResourcesOutOfSync")
        );
        assert!(waiting[0].message.contains("secret \"cert\" not found"));
        let pending = conditions(
            Some(CacheState::InSync),
            Some("b"),
            Some("a"),
            None,
            &[],
            t(10),
        );
        assert_eq!(
            (pending[0].status.as_str(), pending[0].reason.as_str()),
            ("True", "PublishPending")
        );
    }

    #[test]
    fn report_json_has_the_documented_shape() {
        let mut r = Revisions::new("kuard");
        let v1 = r.apply(&spec(1), t(10));
        r.mark_published(
            &v1,
            BTreeMap::from([(
                marin3r_envoyconfig::ResourceType::Listener,
                "L1".to_string(),
            )]),
            t(11),
        );
        let v2 = r.apply(&spec(2), t(20));
        r.taint(&v2, "rejected");
        let conds = conditions(r.cache_state(), Some(&v2), Some(&v1), None, &[], t(21));
        let report = StatusReport {
            files: Vec::new(),
            envoy_configs: vec![envoy_config_report(
                "default",
                "kuard",
                "v3",
                &r,
                Some(&v1),
                conds,
            )],
        };
        let json = serde_json::to_value(&report).unwrap();
        let ec = &json["envoyConfigs"][0];
        assert_eq!(ec["nodeID"], "kuard");
        assert_eq!(ec["envoyAPI"], "v3");
        assert_eq!(ec["desiredVersion"], v2.as_str());
        assert_eq!(ec["publishedVersion"], v1.as_str());
        assert_eq!(ec["cacheState"], "Rollback");
        assert_eq!(ec["conditions"][0]["type"], "CacheOutOfSync");
        assert_eq!(
            ec["conditions"][0]["lastTransitionTime"],
            "1970-01-01T00:00:21Z"
        );
        let revs = ec["revisions"].as_array().unwrap();
        assert_eq!(revs[0]["version"], v1.as_str());
        assert_eq!(revs[0]["published"], true);
        assert_eq!(revs[0]["tainted"], false);
        assert_eq!(revs[0]["createdAt"], "1970-01-01T00:00:10Z");
        assert_eq!(revs[0]["lastPublishedAt"], "1970-01-01T00:00:11Z");
        assert_eq!(revs[0]["providesVersions"]["listener"], "L1");
        assert_eq!(revs[1]["tainted"], true);
        assert_eq!(revs[1]["taintReason"], "rejected");
        assert_eq!(revs[1]["lastPublishedAt"], serde_json::Value::Null);
        // And back.
        let back: StatusReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn table_is_aligned_like_kubectl() {
        let ec = |ns: &str, name: &str, state| EnvoyConfigReport {
            name: name.into(),
            namespace: ns.into(),
            node_id: format!("{name}-node"),
            envoy_api: "v3".into(),
            desired_version: Some("aaaa".into()),
            published_version: Some("bb".into()),
            cache_state: Some(state),
            conditions: Vec::new(),
            revisions: vec![RevisionReport {
                version: "bb".into(),
                published: true,
                tainted: false,
                taint_reason: None,
                created_at: "1970-01-01T00:00:10Z".into(),
                last_published_at: None,
                provides_versions: BTreeMap::new(),
            }],
            errors: Vec::new(),
        };
        let report = StatusReport {
            files: Vec::new(),
            envoy_configs: vec![
                ec("default", "kuard", CacheState::Rollback),
                ec("default", "a-much-longer-name", CacheState::InSync),
            ],
        };
        let text = render_table(&report, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NAME                 NODE ID                   ENVOY API   DESIRED VERSION   PUBLISHED VERSION   CACHE STATE"
        );
        assert_eq!(
            lines[1],
            "kuard                kuard-node                v3          aaaa              bb                  Rollback"
        );
        assert_eq!(lines.len(), 3);

        let text = render_table(&report, true);
        assert!(text.contains("\nRevisions of default/kuard (node ID kuard-node):\n"));
        assert!(text.contains(
            "VERSION   PUBLISHED   TAINTED   CREATED AT             LAST PUBLISHED AT\nbb        true        false     1970-01-01T00:00:10Z\n"
        ));

        let mut several = report.clone();
        several.envoy_configs[1].namespace = "other".into();
        assert!(render_table(&several, false).starts_with("NAMESPACE   NAME"));
        assert_eq!(
            render_table(&StatusReport::default(), false),
            "No EnvoyConfigs found.\n"
        );
    }

    #[test]
    fn urls() {
        let u = parse_url("http://127.0.0.1:8383").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.prefix.as_str()),
            ("127.0.0.1:8383", "")
        );
        let u = parse_url("http://localhost/x/").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.prefix.as_str()),
            ("localhost:80", "/x")
        );
        let u = parse_url("http://[::1]").unwrap();
        assert_eq!(u.authority, "[::1]:80");
        let u = parse_url("http://[::1]:9/").unwrap();
        assert_eq!(u.authority, "[::1]:9");
        assert!(parse_url("https://x").is_err());
        assert!(parse_url("http://").is_err());
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"5\r\nab").is_none());
    }
}
