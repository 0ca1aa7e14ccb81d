//! API writes of the fleet: per edit of one EnvoyConfig (until its status says every
//! replica serves it) and per second in the steady state, at `configs` EnvoyConfigs ×
//! `pods` streams (spread over the nodes) × three replicas. The fake API server logs
//! every request; the bench's own writes go around it (`FakeApiServer::put`), so the log
//! holds exactly what the replicas sent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use kube::api::{Api, ApiResource, DynamicObject, WatchEvent, WatchParams};
use marin3r_testkit::apiserver::{Mark, RequestRecord};
use marin3r_tests::ha::Fleet;
use serde_json::Value;
use tokio_stream::StreamExt as _;

use super::{CONVERGE, desired_version, edit_spec, node_ids, settled, spec};
use crate::ads::{FanOut, Swarm};

/// Quiet time after the swarm connected, and before the steady-state window.
pub const SETTLE: Duration = Duration::from_secs(5);
/// How long after an edit settled its trailing writes are still counted.
pub const TRAIL: Duration = Duration::from_secs(2);

/// One API write the replicas sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// `verb resource[/subresource]`, `apply` for a server-side apply.
    pub what: String,
    /// The object, as the report names it (`the EnvoyConfig`, `the new revision`, …).
    pub object: String,
    /// The HTTP status of the answer.
    pub code: u16,
}

/// What a write is, for the steady-state breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// DiscoveryServiceReplica writes (changes and heartbeats).
    Report,
    /// Lease renewals (and takeovers).
    Lease,
    Other,
}

impl Write {
    pub fn kind(&self) -> Kind {
        if self.what.contains("discoveryservicereplicas") {
            Kind::Report
        } else if self.what.contains("leases") {
            Kind::Lease
        } else {
            Kind::Other
        }
    }
}

/// One edit of one EnvoyConfig.
#[derive(Debug, Clone)]
pub struct EditWrites {
    pub config: String,
    /// The edit → every stream of its node has the new versions.
    pub served: FanOut,
    /// The edit → its status says `InSync` with `ReplicasInSync` True for the new
    /// revision.
    pub settled: Duration,
    /// The writes from the edit until then.
    pub writes: Vec<Write>,
    /// The writes in the [`TRAIL`] after that.
    pub trailing: Vec<Write>,
    /// Each change of the EnvoyConfig's status until it settled, from a watch of it:
    /// the fields that changed. Fewer changes than status writes: writes that changed
    /// nothing.
    pub status_changes: Vec<Vec<String>>,
}

/// What [`measure`] found.
#[derive(Debug, Clone, Default)]
pub struct Writes {
    pub configs: usize,
    pub streams: usize,
    /// Swarm start → every stream configured.
    pub connect: Duration,
    pub edits: Vec<EditWrites>,
    pub steady_seconds: f64,
    pub steady: Vec<Write>,
    /// Connections that ended meanwhile (should be none).
    pub disconnects: usize,
}

/// A fresh fleet with `configs` EnvoyConfigs and `streams` streams; `edits` edits, then
/// `steady` without any.
pub async fn measure(
    servers: &tokio::runtime::Handle,
    configs: usize,
    streams: usize,
    edits: usize,
    steady: Duration,
) -> Result<Writes> {
    let names = node_ids(configs.max(1));
    super::with_fleet_and_swarm(servers, &names, streams, async |fleet, swarm, started| {
        measure_on(fleet, swarm, &names, started, edits, steady).await
    })
    .await
}

async fn measure_on(
    fleet: &Fleet,
    swarm: &mut Swarm,
    names: &[String],
    connecting: Instant,
    edits: usize,
    steady: Duration,
) -> Result<Writes> {
    let connect = swarm.wait_configured(connecting, CONVERGE).await?;
    eprintln!(
        "   writes: {} EnvoyConfigs, {} streams configured in {:.1} s",
        names.len(),
        swarm.len(),
        connect.as_secs_f64()
    );
    tokio::time::sleep(SETTLE).await;
    let mut out = Writes {
        configs: names.len(),
        streams: swarm.len(),
        connect,
        ..Writes::default()
    };
    for k in 0..edits {
        let Some(name) = names.get(k % names.len()) else {
            break;
        };
        let revision = 1 + (k / names.len()) as u32;
        super::stagger(k, edits).await;
        let e = edit(fleet, swarm, name, revision).await?;
        eprintln!(
            "   edit of {name}: {} writes until settled ({:.2} s; its streams in {:.0} ms), {} in the {} s after",
            e.writes.len(),
            e.settled.as_secs_f64(),
            crate::stats::ms(e.served.all),
            e.trailing.len(),
            TRAIL.as_secs()
        );
        let listed: Vec<String> = e
            .writes
            .iter()
            .map(|w| format!("{} {} ({})", w.what, w.object, w.code))
            .collect();
        eprintln!("     {}", listed.join("; "));
        out.edits.push(e);
    }
    tokio::time::sleep(SETTLE).await;
    let mark = fleet.api.mark();
    let started = Instant::now();
    tokio::time::sleep(steady).await;
    out.steady_seconds = started.elapsed().as_secs_f64();
    out.steady = writes_since(fleet, mark, &Names::default());
    eprintln!(
        "   steady state: {} writes in {:.0} s ({:.2}/s)",
        out.steady.len(),
        out.steady_seconds,
        out.steady.len() as f64 / out.steady_seconds
    );
    swarm.drain()?;
    out.disconnects = swarm.disconnects();
    Ok(out)
}

/// How the report names the objects of one edit.
#[derive(Debug, Clone, Default)]
struct Names {
    config: String,
    new_version: String,
    old_version: String,
}

impl Names {
    fn object(&self, record: &RequestRecord) -> String {
        let Some(name) = record.name.clone() else {
            // A create names its object in the body only.
            return match record.resource.as_str() {
                "envoyconfigrevisions" if !self.config.is_empty() => "the new revision".into(),
                _ => "(a new object)".into(),
            };
        };
        if self.config.is_empty() {
            return name;
        }
        if record.resource == "envoyconfigs" && name == self.config {
            "the EnvoyConfig".into()
        } else if !self.new_version.is_empty() && name.ends_with(&self.new_version) {
            "the new revision".into()
        } else if !self.old_version.is_empty() && name.ends_with(&self.old_version) {
            "the previous revision".into()
        } else {
            name
        }
    }
}

fn write_of(record: &RequestRecord, names: &Names) -> Write {
    let verb = match record.verb {
        Some(_) if record.content_type.contains("apply-patch") => "apply".to_string(),
        Some(v) => format!("{v:?}").to_lowercase(),
        None => record.method.to_lowercase(),
    };
    let sub = record
        .subresource
        .as_ref()
        .map(|s| format!("/{s}"))
        .unwrap_or_default();
    Write {
        what: format!("{verb} {}{sub}", record.resource),
        object: names.object(record),
        code: record.code,
    }
}

fn writes_since(fleet: &Fleet, mark: Mark, names: &Names) -> Vec<Write> {
    fleet
        .api
        .requests_since(mark)
        .iter()
        .filter(|r| r.is_write())
        .map(|r| write_of(r, names))
        .collect()
}

/// Edits EnvoyConfig `name` to `revision` and counts the writes.
async fn edit(fleet: &Fleet, swarm: &mut Swarm, name: &str, revision: u32) -> Result<EditWrites> {
    let before = desired_version(fleet, name);
    let (rv, status) = fleet
        .envoyconfig(name)
        .map(|ec| {
            let rv = ec["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string);
            (rv, ec["status"].clone())
        })
        .unwrap_or_default();
    let streams = swarm.streams_of(name);
    let mark = fleet.api.mark();
    let edited = Instant::now();
    let apply = || edit_spec(fleet, name, spec(name, revision, false));
    // The streams and the status are watched side by side (the first poll of the
    // first future applies the edit).
    let (served, watched) = tokio::join!(
        swarm.measure_change_of(&streams, apply, CONVERGE),
        watch_status(
            fleet,
            name,
            rv.unwrap_or_default(),
            status,
            before.as_deref()
        )
    );
    let (served, (settled_at, status_changes)) = (served?, watched?);
    let after = fleet.api.mark();
    tokio::time::sleep(TRAIL).await;
    let names = Names {
        config: name.to_string(),
        new_version: desired_version(fleet, name).unwrap_or_default(),
        old_version: before.unwrap_or_default(),
    };
    let mut writes = writes_since(fleet, mark, &names);
    let trailing = writes.split_off(writes.len().min(count_writes(fleet, mark, after)));
    Ok(EditWrites {
        config: name.to_string(),
        served,
        settled: settled_at.saturating_duration_since(edited),
        writes,
        trailing,
        status_changes,
    })
}

/// Watches EnvoyConfig `name` from resourceVersion `rv` (its `status` then) until its
/// status is [`settled`] on a desired version other than `before`; returns when, and
/// what changed in each status on the way.
async fn watch_status(
    fleet: &Fleet,
    name: &str,
    rv: String,
    mut status: Value,
    before: Option<&str>,
) -> Result<(Instant, Vec<Vec<String>>)> {
    let resource = ApiResource {
        group: "marin3r.3scale.net".into(),
        version: "v1alpha1".into(),
        api_version: "marin3r.3scale.net/v1alpha1".into(),
        kind: "EnvoyConfig".into(),
        plural: "envoyconfigs".into(),
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(fleet.api.client(), marin3r_tests::ha::NS, &resource);
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let events = api.watch(&params, &rv).await?;
    let mut events = std::pin::pin!(events);
    let deadline = tokio::time::Instant::now() + CONVERGE;
    let mut changes = Vec::new();
    loop {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .map_err(|_| {
                anyhow!("{name}: the edit on every replica: timed out; status {status}")
            })?;
        let object = match event {
            Some(Ok(WatchEvent::Modified(o) | WatchEvent::Added(o))) => o,
            Some(Ok(WatchEvent::Bookmark(_))) => continue,
            Some(Ok(e)) => bail!("{name}: unexpected watch event {e:?}"),
            Some(Err(e)) => bail!("{name}: watch: {e}"),
            None => bail!("{name}: the watch ended"),
        };
        let now = object.data["status"].clone();
        let changed = changed_fields(&status, &now);
        if !changed.is_empty() {
            changes.push(changed);
        }
        status = now;
        if settled(&status, before) {
            return Ok((Instant::now(), changes));
        }
    }
}

/// The fields of an EnvoyConfig status that differ: top-level ones by name, conditions
/// as `<type>.<field>`.
pub fn changed_fields(before: &Value, after: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (b, a) = (
        before.as_object().unwrap_or(&empty),
        after.as_object().unwrap_or(&empty),
    );
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    for key in keys {
        if key == "conditions" {
            let by_type = |v: Option<&Value>| -> BTreeMap<String, Value> {
                v.and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        (
                            c["type"].as_str().unwrap_or_default().to_string(),
                            c.clone(),
                        )
                    })
                    .collect()
            };
            let (cb, ca) = (by_type(b.get(key)), by_type(a.get(key)));
            let types: std::collections::BTreeSet<&String> = cb.keys().chain(ca.keys()).collect();
            for t in types {
                let (x, y) = (cb.get(t), ca.get(t));
                if x == y {
                    continue;
                }
                let fields: std::collections::BTreeSet<String> = [x, y]
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object)
                    .flat_map(|m| m.keys().cloned())
                    .filter(|f| x.map(|x| &x[f]) != y.map(|y| &y[f]))
                    .collect();
                if x.is_none() || y.is_none() {
                    out.push(format!(
                        "{t} (condition {})",
                        if x.is_none() { "added" } else { "removed" }
                    ));
                } else {
                    out.extend(fields.into_iter().map(|f| format!("{t}.{f}")));
                }
            }
        } else if b.get(key) != a.get(key) {
            out.push(key.clone());
        }
    }
    out
}

/// Writes between two marks.
fn count_writes(fleet: &Fleet, from: Mark, to: Mark) -> usize {
    fleet.api.writes_since(from) - fleet.api.writes_since(to)
}

/// Counts per `what`, most first (then by name).
pub fn tally<'a>(writes: impl IntoIterator<Item = &'a Write>) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for w in writes {
        *counts.entry(w.what.clone()).or_default() += 1;
    }
    let mut out: Vec<(String, usize)> = counts.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(what: &str) -> Write {
        Write {
            what: what.into(),
            object: String::new(),
            code: 200,
        }
    }

    #[test]
    fn kinds_and_tally() {
        assert_eq!(
            w("apply discoveryservicereplicas/status").kind(),
            Kind::Report
        );
        assert_eq!(w("update leases").kind(), Kind::Lease);
        assert_eq!(w("apply envoyconfigs/status").kind(), Kind::Other);
        let all = [w("b"), w("a"), w("b")];
        assert_eq!(tally(&all), vec![("b".into(), 2), ("a".into(), 1)]);
    }

    #[test]
    fn status_changes_name_fields_and_conditions() {
        let before = serde_json::json!({"desiredVersion": "a", "publishedVersion": "a",
            "conditions": [{"type": "ReplicasInSync", "status": "True", "message": "serve a"},
                           {"type": "CacheOutOfSync", "status": "False"}]});
        let after = serde_json::json!({"desiredVersion": "b", "publishedVersion": "a",
            "conditions": [{"type": "ReplicasInSync", "status": "True", "message": "serve b"}]});
        assert_eq!(
            changed_fields(&before, &after),
            vec![
                "CacheOutOfSync (condition removed)".to_string(),
                "ReplicasInSync.message".into(),
                "desiredVersion".into()
            ]
        );
        assert!(changed_fields(&after, &after).is_empty());
    }
}
