//! Counting Envoy's open downstream connections from its admin `/stats` text output.
//!
//! Envoy keeps one gauge per listener, `listener.<name>.downstream_cx_active`, where
//! `<name>` is the listener's `stat_prefix` or, by default, its address
//! (`127.0.0.1_8080`, `0.0.0.0_8080`, `[__]_8080`). The gauge covers every network filter
//! chain (HTTP connection manager, TCP proxy, …). Envoy 1.40 additionally emits per-worker
//! copies (`listener.<name>.worker_<n>.downstream_cx_active`) and, for the admin
//! listener, `listener.admin.main_thread.downstream_cx_active`; those are skipped to
//! avoid counting a connection twice. The admin listener (`listener.admin.…`) is
//! excluded: the shutdown manager's own polls are admin connections.
//!
//! Example (real Envoy 1.40 output, two listeners, one open client connection on
//! the HTTP listener):
//!
//! ```text
//! listener.127.0.0.1_18080.downstream_cx_active: 1
//! listener.127.0.0.1_18080.worker_0.downstream_cx_active: 1
//! listener.127.0.0.1_18080.worker_1.downstream_cx_active: 0
//! listener.admin.downstream_cx_active: 1
//! listener.admin.main_thread.downstream_cx_active: 1
//! listener.my.tcp.downstream_cx_active: 0
//! ```

use crate::ShutdownManagerError;

/// Admin path and query that select exactly the gauges [`open_connections`] needs
/// (RE2 regex `^listener\..*\.downstream_cx_active$`, URL encoded).
pub const STATS_PATH: &str = "/stats?filter=%5Elistener%5C..*%5C.downstream_cx_active%24";

const PREFIX: &str = "listener.";
const SUFFIX: &str = ".downstream_cx_active";

/// Sums the active downstream connections of all non-admin listeners in the text output
/// of Envoy's `/stats` admin endpoint.
///
/// Lines that are not listener `downstream_cx_active` gauges are ignored, so unfiltered
/// `/stats` output works too. A line that is not `name: value`, or a listener gauge whose
/// value is not an unsigned integer, is an error: the body is then not Envoy stats, and
/// guessing would end the drain early.
///
/// A listener whose `stat_prefix` is `admin` is indistinguishable from Envoy's admin
/// listener and is therefore not counted.
pub fn open_connections(stats_text: &str) -> Result<u64, ShutdownManagerError> {
    let mut total: u64 = 0;
    for (index, raw) in stats_text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let invalid = |reason: &str| ShutdownManagerError::InvalidStats {
            line: index + 1,
            content: truncate(line),
            reason: reason.to_string(),
        };
        let Some((name, value)) = line.split_once(": ") else {
            return Err(invalid("expected `name: value`"));
        };
        if !is_listener_total(name) {
            continue;
        }
        let value: u64 = value
            .trim()
            .parse()
            .map_err(|_| invalid("gauge value is not an unsigned integer"))?;
        total = total.saturating_add(value);
    }
    Ok(total)
}

/// True for `listener.<name>.downstream_cx_active` where `<name>` is not the admin
/// listener and the gauge is not a per-worker (`worker_<n>`) or `main_thread` copy.
fn is_listener_total(name: &str) -> bool {
    let Some(listener) = name
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(SUFFIX))
    else {
        return false;
    };
    if listener.is_empty() || listener == "admin" || listener.starts_with("admin.") {
        return false;
    }
    let last = listener.rsplit('.').next().unwrap_or(listener);
    let per_thread = last == "main_thread"
        || last
            .strip_prefix("worker_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    // A per-thread copy always has the listener name in front of it.
    !(per_thread && listener.contains('.'))
}

fn truncate(line: &str) -> String {
    const MAX: usize = 120;
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from Envoy 1.40.0 (`/stats?filter=downstream_cx_active`) with an HTTP
    /// listener on 127.0.0.1:18080 and a TCP proxy listener on 127.0.0.1:18081, idle.
    const REAL_IDLE: &str = "\
http.admin.downstream_cx_active: 1
http.ingress_http.downstream_cx_active: 0
listener.127.0.0.1_18080.downstream_cx_active: 0
listener.127.0.0.1_18080.worker_0.downstream_cx_active: 0
listener.127.0.0.1_18080.worker_1.downstream_cx_active: 0
listener.127.0.0.1_18081.downstream_cx_active: 0
listener.127.0.0.1_18081.worker_0.downstream_cx_active: 0
listener.127.0.0.1_18081.worker_1.downstream_cx_active: 0
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
";

    #[test]
    fn idle_envoy_has_no_open_connections_admin_excluded() {
        assert_eq!(open_connections(REAL_IDLE).unwrap(), 0);
    }

    #[test]
    fn counts_http_and_tcp_listeners_once() {
        let text = "\
listener.127.0.0.1_18080.downstream_cx_active: 2
listener.127.0.0.1_18080.worker_0.downstream_cx_active: 1
listener.127.0.0.1_18080.worker_1.downstream_cx_active: 1
listener.127.0.0.1_18081.downstream_cx_active: 1
listener.127.0.0.1_18081.worker_1.downstream_cx_active: 1
listener.admin.downstream_cx_active: 3
listener.admin.main_thread.downstream_cx_active: 3
";
        assert_eq!(open_connections(text).unwrap(), 3);
    }

    #[test]
    fn stat_prefix_listeners_with_dots_and_ipv6_addresses() {
        let text = "\
listener.my.tcp.downstream_cx_active: 4
listener.my.tcp.worker_0.downstream_cx_active: 4
listener.[__]_8443.downstream_cx_active: 5
listener.0.0.0.0_8080.downstream_cx_active: 6
listener.http.downstream_cx_active: 7
";
        assert_eq!(open_connections(text).unwrap(), 22);
    }

    #[test]
    fn a_listener_named_like_a_thread_is_still_counted() {
        // `stat_prefix: worker_0` gives `listener.worker_0.downstream_cx_active`.
        let text = "listener.worker_0.downstream_cx_active: 2\nlistener.worker_0.worker_1.downstream_cx_active: 2\n";
        assert_eq!(open_connections(text).unwrap(), 2);
    }

    #[test]
    fn ignores_unrelated_stats_and_blank_lines() {
        let text = "\n\
cluster.echo.upstream_cx_active: 9
listener.127.0.0.1_18080.downstream_cx_total: 100
listener.127.0.0.1_18080.downstream_cx_active_extra: 100
http.ingress_http.downstream_cx_active: 9
listener_manager.total_listeners_active: 2
listener.127.0.0.1_18080.downstream_cx_length_ms: P0(nan,1) P25(nan,2)

listener.127.0.0.1_18080.downstream_cx_active: 1
";
        assert_eq!(open_connections(text).unwrap(), 1);
    }

    #[test]
    fn empty_output_means_no_listeners() {
        assert_eq!(open_connections("").unwrap(), 0);
    }

    #[test]
    fn rejects_bodies_that_are_not_stats() {
        let err = open_connections("<html>\n<body>oops</body>").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let err = open_connections("listener.x.downstream_cx_active: lots").unwrap_err();
        assert!(err.to_string().contains("unsigned integer"), "{err}");
        assert!(open_connections("listener.x.downstream_cx_active: -1").is_err());
    }

    #[test]
    fn long_garbage_is_truncated_in_errors() {
        let garbage = "x".repeat(10_000);
        let err = open_connections(&garbage).unwrap_err().to_string();
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn filter_selects_the_gauges() {
        assert!(STATS_PATH.starts_with("/stats?filter="));
        assert!(!STATS_PATH.contains('\\'));
    }
}
