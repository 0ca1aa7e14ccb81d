//! The `kubectl get ec`-like table of `marin3r status`, the same in local and Kubernetes
//! mode (both produce a [`StatusReport`]), and the column layout every table of the
//! command uses.

use marin3r_control_plane::status::StatusReport;

use crate::terminal::cell;

/// Left-aligned columns separated by three spaces, like `kubectl get`. Every cell is
/// written with its control characters as text ([`crate::terminal::cell`]).
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| cell(c).into_owned()).collect())
        .collect();
    let rows = rows.as_slice();
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
    let mut out = render_envoyconfigs(report, revisions);
    // What is written but not used (the last good content keeps being served).
    let problems: Vec<String> = report
        .envoy_configs
        .iter()
        .flat_map(|ec| {
            ec.errors
                .iter()
                .map(move |e| format!("EnvoyConfig {}/{}: {e}", ec.namespace, ec.name))
        })
        .chain(
            report
                .files
                .iter()
                .map(|f| format!("{}: {}", f.path, f.error)),
        )
        .collect();
    if !problems.is_empty() {
        out.push_str("\nNot applied (the last good content keeps being served):\n");
        for p in problems {
            out.push_str(&format!("  {}\n", cell(&p)));
        }
    }
    // Conditions that need attention.
    let raised: Vec<String> = report
        .envoy_configs
        .iter()
        .flat_map(|ec| {
            ec.conditions
                .iter()
                .filter(|c| needs_attention(&c.type_, &c.status))
                .map(move |c| {
                    format!(
                        "{}/{}: {}={} ({}): {}",
                        ec.namespace, ec.name, c.type_, c.status, c.reason, c.message
                    )
                })
        })
        .collect();
    if !raised.is_empty() {
        out.push_str("\nConditions:\n");
        for c in raised {
            out.push_str(&format!("  {}\n", cell(&c)));
        }
    }
    out
}

/// Whether an EnvoyConfig condition is bad news: `ReplicasInSync` when not `True`;
/// `CacheOutOfSync`, `RollbackFailed` (and any other) when `True`.
pub fn needs_attention(type_: &str, status: &str) -> bool {
    if type_ == marin3r_control_plane::status::REPLICAS_IN_SYNC {
        status != "True"
    } else {
        status == "True"
    }
}

fn render_envoyconfigs(report: &StatusReport, revisions: bool) -> String {
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
                cell(&ec.namespace),
                cell(&ec.name),
                cell(&ec.node_id)
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

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_control_plane::status::{EnvoyConfigReport, RevisionReport};
    use marin3r_envoyconfig::envoyconfig::CacheState;
    use std::collections::BTreeMap;

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

        // Files and documents that are not applied are listed below the table.
        let mut broken = report.clone();
        broken.envoy_configs[0].errors = vec!["invalid EnvoyConfig: spec.nodeID".into()];
        broken.files = vec![marin3r_control_plane::status::FileReport {
            path: "/config/kuard.yaml".into(),
            error: "the file has no documents".into(),
        }];
        let text = render_table(&broken, false);
        assert!(
            text.ends_with(
                "\nNot applied (the last good content keeps being served):\n  EnvoyConfig default/kuard: invalid EnvoyConfig: spec.nodeID\n  /config/kuard.yaml: the file has no documents\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn only_conditions_that_need_attention_are_listed() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Why".into(),
            message: format!("{type_} is {status}"),
            last_transition_time: marin3r_kube::time::time(std::time::UNIX_EPOCH),
            observed_generation: None,
        };
        let report = StatusReport {
            files: Vec::new(),
            envoy_configs: vec![EnvoyConfigReport {
                name: "kuard".into(),
                namespace: "default".into(),
                node_id: "kuard".into(),
                envoy_api: "v3".into(),
                desired_version: None,
                published_version: None,
                cache_state: Some(CacheState::InSync),
                conditions: vec![
                    condition("CacheOutOfSync", "False"),
                    condition("RollbackFailed", "True"),
                    condition("ReplicasInSync", "True"),
                    condition("ReplicasInSync", "False"),
                ],
                revisions: Vec::new(),
                errors: Vec::new(),
            }],
        };
        let text = render_table(&report, false);
        assert!(
            text.ends_with(
                "\nConditions:\n  default/kuard: RollbackFailed=True (Why): RollbackFailed is True\n  \
                 default/kuard: ReplicasInSync=False (Why): ReplicasInSync is False\n"
            ),
            "{text}"
        );
    }
}
