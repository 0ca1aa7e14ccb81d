//! The opt-in monitoring component `manifests/observability/`: PodMonitors, the alert
//! rules (a PrometheusRule) and the Grafana dashboards (JSON files, also rendered as
//! ConfigMaps). This module (feature `observability`; test support, never in a shipped
//! binary) reads them for the tests: the dashboards' panel queries, the
//! alerts' expressions, the rules as a Prometheus rules file for `promtool`, and the
//! metric names and selectors an expression uses, so a test can ask a real Prometheus
//! (or the code's registries) whether each one exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// What went wrong reading the component (the file and why).
pub type Error = String;

/// The `job` label each PodMonitor sets (the rules and dashboards select on it), by
/// process: the webhook, the discovery services, the operator.
pub const JOBS: [&str; 3] = [
    "marin3r-webhook",
    "marin3r-discovery-service",
    "marin3r-operator",
];

/// Metrics the component uses that marin3r does not export, and who exports them.
pub const EXTERNAL_METRICS: [(&str, &str); 2] = [
    ("up", "Prometheus (one series per scrape target)"),
    (
        "certmanager_certificate_expiration_timestamp_seconds",
        "cert-manager",
    ),
];

/// Prefixes of the marin3r metrics only a discovery service in Kubernetes mode with
/// several replicas exports (`docs/ha.md`).
pub const HA_METRIC_PREFIXES: [&str; 2] = ["marin3r_ha_", "marin3r_fleet_"];

/// Metrics of the API client's liveness (`marin3r_kube::client`): a process has them
/// once it talks to an API server. The observability e2e runs the discovery service in
/// local mode (no API server), so its job has none; the operator's are checked.
pub const KUBERNETES_CLIENT_METRIC_PREFIX: &str = "marin3r_kube_";

/// What Grafana substitutes in a panel query, and what the tests substitute instead.
pub const GRAFANA_VARIABLES: [(&str, &str); 3] = [
    ("$__rate_interval", "1m"),
    ("$__interval", "1m"),
    ("$__range", "1h"),
];

/// `manifests/observability/`.
pub fn dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("manifests")
        .join("observability")
}

/// One PromQL expression of the component and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// `dashboard <file>: panel "<title>"` or `alert <name>`.
    pub source: String,
    /// As Prometheus evaluates it (Grafana's variables substituted).
    pub expr: String,
}

/// One alerting rule of the PrometheusRule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    pub name: String,
    pub expr: String,
    /// `annotations.runbook_url`.
    pub runbook_url: String,
    /// `labels.severity`.
    pub severity: String,
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn invalid(path: &Path, message: impl Into<String>) -> Error {
    format!("{}: {}", path.display(), message.into())
}

/// Every dashboard under `dashboards/`: (file name, JSON), sorted by file name.
pub fn dashboards() -> Result<Vec<(String, Value)>, Error> {
    let folder = dir().join("dashboards");
    let entries =
        std::fs::read_dir(&folder).map_err(|e| format!("cannot read {}: {e}", folder.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot read {}: {e}", folder.display()))?
            .path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let json: Value = serde_json::from_str(&read(&path)?)
            .map_err(|e| invalid(&path, format!("not JSON: {e}")))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push((name, json));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Grafana's variables in `expr` replaced by [`GRAFANA_VARIABLES`].
pub fn grafana_to_promql(expr: &str) -> String {
    GRAFANA_VARIABLES
        .iter()
        .fold(expr.to_string(), |e, (var, value)| e.replace(var, value))
}

/// Every `targets[].expr` of every panel (rows' nested panels included) of `dashboard`.
pub fn panel_queries(file: &str, dashboard: &Value) -> Result<Vec<Query>, Error> {
    let mut panels: Vec<&Value> = Vec::new();
    let mut pending: Vec<&Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(p) = pending.pop() {
        pending.extend(p["panels"].as_array().into_iter().flatten());
        panels.push(p);
    }
    panels.reverse();
    let mut out = Vec::new();
    for panel in panels {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap_or("<untitled>");
        let targets = panel["targets"].as_array().into_iter().flatten();
        let mut found = false;
        for t in targets {
            let expr = t["expr"].as_str().ok_or_else(|| {
                invalid(
                    Path::new(file),
                    format!("panel {title:?}: a target without a string `expr`"),
                )
            })?;
            found = true;
            out.push(Query {
                source: format!("dashboard {file}: panel {title:?}"),
                expr: grafana_to_promql(expr),
            });
        }
        if !found {
            return Err(invalid(
                Path::new(file),
                format!("panel {title:?} has no query"),
            ));
        }
    }
    Ok(out)
}

/// The panel queries of every dashboard.
pub fn all_panel_queries() -> Result<Vec<Query>, Error> {
    let mut out = Vec::new();
    for (file, dashboard) in dashboards()? {
        out.extend(panel_queries(&file, &dashboard)?);
    }
    Ok(out)
}

/// The PrometheusRule `prometheusrule.yaml`.
pub fn prometheus_rule() -> Result<Value, Error> {
    let path = dir().join("prometheusrule.yaml");
    serde_saphyr::from_str(&read(&path)?).map_err(|e| invalid(&path, e.to_string()))
}

/// The PrometheusRule's `spec` as a Prometheus rules file (JSON, which is YAML), for
/// `promtool` and a Prometheus `rule_files` entry.
pub fn rules_file() -> Result<String, Error> {
    let rule = prometheus_rule()?;
    let spec = &rule["spec"];
    if !spec["groups"].is_array() {
        return Err(invalid(
            &dir().join("prometheusrule.yaml"),
            "spec.groups must be a list",
        ));
    }
    serde_json::to_string_pretty(spec).map_err(|e| invalid(&dir(), e.to_string()))
}

/// Every alerting rule, in file order.
pub fn alerts() -> Result<Vec<Alert>, Error> {
    let path = dir().join("prometheusrule.yaml");
    let rule = prometheus_rule()?;
    let mut out = Vec::new();
    let groups = rule["spec"]["groups"].as_array().into_iter().flatten();
    for (g, group) in groups.enumerate() {
        let rules = group["rules"].as_array().into_iter().flatten();
        for (r, rule) in rules.enumerate() {
            let at = format!("spec.groups[{g}].rules[{r}]");
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            let field = |v: &Value, what: &str| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    invalid(&path, format!("{at} ({name}): {what} must be a string"))
                })
            };
            out.push(Alert {
                name: name.to_string(),
                expr: field(&rule["expr"], "expr")?,
                runbook_url: field(
                    &rule["annotations"]["runbook_url"],
                    "annotations.runbook_url",
                )?,
                severity: field(&rule["labels"]["severity"], "labels.severity")?,
            });
        }
    }
    Ok(out)
}

/// The alerts' expressions as [`Query`]s.
pub fn alert_queries() -> Result<Vec<Query>, Error> {
    Ok(alerts()?
        .into_iter()
        .map(|a| Query {
            source: format!("alert {}", a.name),
            expr: a.expr,
        })
        .collect())
}

/// Keywords after which a parenthesised list holds label names, not expressions.
const LABEL_LIST_KEYWORDS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Keywords that are neither metrics nor functions.
const KEYWORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];

/// The end (exclusive) of the string literal starting at `start`.
fn skip_string(s: &[char], start: usize) -> usize {
    let quote = s[start];
    let mut i = start + 1;
    while i < s.len() {
        match s[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    s.len()
}

/// The end (exclusive) of the bracket opened at `start` (`{`, `[` or `(`), skipping
/// string literals and nested brackets of the same kind.
fn skip_bracket(s: &[char], start: usize) -> usize {
    let open = s[start];
    let close = match open {
        '{' => '}',
        '[' => ']',
        _ => ')',
    };
    let mut depth = 0;
    let mut i = start;
    while i < s.len() {
        match s[i] {
            '"' | '\'' | '`' => {
                i = skip_string(s, i);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    s.len()
}

fn next_non_space(s: &[char], mut i: usize) -> usize {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The vector selectors of a PromQL expression, as written (`name{matchers}` or
/// `name`), in order: every identifier that is not a function, an aggregation, a
/// keyword, or a label of a `by (…)`/`on (…)`-style list. Selectors without a metric
/// name (`{__name__=…}`) are not supported (the component has none).
pub fn selectors(expr: &str) -> Vec<String> {
    let s: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&s, i);
        } else if matches!(c, '{' | '[') {
            i = skip_bracket(&s, i);
        } else if c.is_ascii_digit() || c == '.' {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '_' || s[i] == ':') {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let lower = word.to_ascii_lowercase();
            let next = next_non_space(&s, i);
            let followed_by = |ch: char| s.get(next) == Some(&ch);
            // `sum by (…) (…)`: an aggregation whose grouping comes first.
            let next_word: String = s[next.min(s.len())..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                .collect::<String>()
                .to_ascii_lowercase();
            let grouped_aggregation = next_word == "by" || next_word == "without";
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                if followed_by('(') {
                    i = skip_bracket(&s, next);
                }
            } else if KEYWORDS.contains(&lower.as_str()) || followed_by('(') || grouped_aggregation
            {
                // A keyword, or a function or aggregation call.
            } else if followed_by('{') {
                let end = skip_bracket(&s, next);
                out.push(format!("{word}{}", s[next..end].iter().collect::<String>()));
                i = end;
            } else {
                out.push(word);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The metric names an expression selects (see [`selectors`]).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    selectors(expr)
        .into_iter()
        .map(|sel| match sel.split_once('{') {
            Some((name, _)) => name.to_string(),
            None => sel,
        })
        .collect()
}

/// The sample names a Prometheus text exposition declares, from its `# TYPE` lines
/// (also for families without samples yet): a counter `x` as `x_total`, a histogram
/// `x` as `x_bucket`, `x_sum` and `x_count`, anything else as `x`.
pub fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#") || words.next() != Some("TYPE") {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{}_total", name.trim_end_matches("_total")));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// A program the observability tests run: `$env_var` when set, else `name` on `PATH`.
/// `Err` names the script that installs it (the tests fail without it, never skip).
pub fn find_tool(env_var: &str, name: &str) -> Result<PathBuf, String> {
    let hint =
        "run scripts/ensure-prometheus (Debian's `prometheus` package: apt-get install prometheus)";
    if let Some(p) = std::env::var_os(env_var) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{env_var}={} is not a file; {hint}", p.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no `{name}`: {env_var} is unset and PATH has none; {hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_skip_functions_keywords_label_lists_strings_and_durations() {
        let expr = r#"histogram_quantile(0.99, sum by (le, resource_type) (rate(a_bucket{job="x",le=~"1|2"}[5m])))
            / on (job) group_left(pod) b offset 5m > bool 2e3 and (c:rule or vector(0))
            - sum(d{msg="}by(e)"}) without (f) unless time()"#;
        assert_eq!(
            selectors(expr),
            [
                r#"a_bucket{job="x",le=~"1|2"}"#,
                "b",
                "c:rule",
                r#"d{msg="}by(e)"}"#
            ]
        );
        assert_eq!(
            metric_names(expr),
            BTreeSet::from(["a_bucket", "b", "c:rule", "d"].map(String::from))
        );
        assert!(selectors("(sum(up{job=\"w\"}) or vector(0)) == 0") == [r#"up{job="w"}"#]);
    }

    #[test]
    fn exported_names_follow_the_type_lines() {
        let text = "# HELP a_requests x\n# TYPE a_requests counter\n\
            # TYPE a_latency_seconds histogram\n# TYPE a_streams gauge\n\
            a_streams{node_id=\"n\"} 1\n# EOF\n";
        assert_eq!(
            exported_names(text),
            BTreeSet::from(
                [
                    "a_requests_total",
                    "a_latency_seconds_bucket",
                    "a_latency_seconds_sum",
                    "a_latency_seconds_count",
                    "a_streams"
                ]
                .map(String::from)
            )
        );
    }

    #[test]
    fn grafana_variables_are_substituted() {
        assert_eq!(
            grafana_to_promql("rate(x[$__rate_interval]) + increase(y[$__range])"),
            "rate(x[1m]) + increase(y[1h])"
        );
    }
}
