//! The table of what Envoy's TLS context loader accepts and refuses (`cases.json`), read
//! by two tests: `envoyconfig/tests/envoy_tls_loader.rs` checks our decoder's verdict
//! (`ours`), `tests/tests/tls_loader.rs` checks the real Envoy's (`envoy`, with `envoy
//! --mode init_only` on a static bootstrap holding the resource).
//!
//! A case is a `common_tls_context` on a listener (`side: downstream`) or a cluster
//! (`upstream`); the expected verdicts are `"accept"` or a fragment of the error. In
//! strings, `@name.crt`/`@name.key` is the text of that file of this folder,
//! `@label(L)name.key` the same with its PEM label replaced by `L`, and a whole string
//! `@b64:name` is the file base64-encoded (for `inline_bytes`). The keys are throwaway
//! test keys (the encrypted ones' password is `secret`; `README.md` says how each was
//! made).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{Value, json};

pub struct Case {
    pub name: String,
    /// `"downstream"` (a listener) or `"upstream"` (a cluster).
    pub side: String,
    /// `"accept"` or a fragment of Envoy's error.
    pub envoy: String,
    /// `"accept"` or a fragment of our decoder's error.
    pub ours: String,
    /// The `common_tls_context`, expanded.
    pub context: Value,
}

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../envoyconfig/tests/tls_cases")
        .canonicalize()
        .expect("tls_cases folder")
}

pub fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(dir().join("cases.json")).expect("cases.json");
    let table: Vec<Value> = serde_json::from_str(&text).expect("cases.json is JSON");
    table
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().expect("name").to_string(),
            side: c["side"].as_str().expect("side").to_string(),
            envoy: c["envoy"].as_str().expect("envoy").to_string(),
            ours: c["ours"].as_str().expect("ours").to_string(),
            context: expand(&c["common_tls_context"]),
        })
        .collect()
}

fn file(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn expand(value: &Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), expand(v))).collect()),
        Value::Array(items) => Value::Array(items.iter().map(expand).collect()),
        Value::String(s) => Value::String(expand_str(s)),
        other => other.clone(),
    }
}

fn expand_str(s: &str) -> String {
    if let Some(name) = s.strip_prefix("@b64:") {
        return base64::engine::general_purpose::STANDARD.encode(file(name));
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let mut label = None;
        if let Some(r) = rest.strip_prefix("label(") {
            let end = r.find(')').expect("label(...)");
            label = Some(&r[..end]);
            rest = &r[end + 1..];
        }
        // A file name ends with `.crt` or `.key`; any other `@` (`@STRENGTH`) is text.
        let run = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_.-".contains(c)))
            .unwrap_or(rest.len());
        let Some(end) = [".crt", ".key"]
            .iter()
            .filter_map(|ext| rest[..run].find(ext))
            .min()
            .map(|at| at + 4)
        else {
            out.push('@');
            continue;
        };
        let mut text = file(&rest[..end]);
        if let Some(label) = label {
            text = relabel(&text, label);
        }
        out.push_str(&text);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn relabel(pem: &str, label: &str) -> String {
    pem.lines()
        .map(|line| {
            if line.starts_with("-----BEGIN ") {
                format!("-----BEGIN {label}-----")
            } else if line.starts_with("-----END ") {
                format!("-----END {label}-----")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The listener (downstream) or cluster (upstream) holding the case's context; `true`
/// for a listener.
pub fn resource(case: &Case) -> (bool, Value) {
    let socket = |kind: &str| {
        json!({"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": format!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{kind}"),
            "common_tls_context": case.context}})
    };
    if case.side == "downstream" {
        let listener = json!({"name": "l",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [{"name": "tcp", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "t", "cluster": "c"}}],
                "transport_socket": socket("DownstreamTlsContext")}]});
        (true, listener)
    } else {
        let cluster = json!({"name": "c", "connect_timeout": "1s",
            "transport_socket": socket("UpstreamTlsContext")});
        (false, cluster)
    }
}
