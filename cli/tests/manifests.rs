//! The install manifests run `marin3r` with flags it has: every container of every
//! kustomization under `manifests/` that runs the marin3r image (and the init and
//! shutdown managers `marin3r inject` adds to the examples) passes a subcommand, flags
//! (`--flag`, `--flag=value`, `--flag value`) and `MARIN3R_*` environment variables that
//! `marin3r <subcommand> --help` lists; so does every container of the OLM bundle's
//! ClusterServiceVersion. The rest of the manifests' checks are in
//! `manifests/tests/install.rs` and `manifests/tests/olm.rs`. Needs `kubectl` (kustomize
//! v5) on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use marin3r_manifests::kustomize::{self, containers, describe};
use serde_json::Value;

/// Environment variables read outside clap (`std::env`), per subcommand.
const OTHER_ENV: &[(&str, &str)] = &[
    ("discovery-service", "WATCH_NAMESPACE"),
    ("operator", "WATCH_NAMESPACE"),
    ("init-manager", "POD_NAME"),
    ("init-manager", "POD_NAMESPACE"),
    ("init-manager", "HOST_NAME"),
];

fn marin3r() -> Command {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
}

fn help(args: &[&str]) -> String {
    let out = marin3r().args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "marin3r {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands listed by `marin3r --help`.
fn subcommands() -> BTreeSet<String> {
    help(&[])
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// What `marin3r <subcommand> --help` accepts.
#[derive(Debug, Default)]
struct Accepted {
    /// `--long` and `-s` spellings.
    flags: BTreeSet<String>,
    /// `[env: NAME=]` of every flag.
    env: BTreeSet<String>,
}

fn accepted(subcommand: &str) -> Accepted {
    let text = help(&[subcommand]);
    let mut out = Accepted::default();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('-') {
            for token in trimmed.split([' ', ',']) {
                if token.starts_with('-') && token.len() > 1 {
                    out.flags.insert(token.to_string());
                }
            }
        }
        let mut rest = line;
        while let Some(i) = rest.find("[env: ") {
            rest = &rest[i + 6..];
            if let Some(end) = rest.find('=') {
                out.env.insert(rest[..end].to_string());
            }
        }
    }
    for (sub, var) in OTHER_ENV {
        if *sub == subcommand {
            out.env.insert(var.to_string());
        }
    }
    assert!(out.flags.contains("--help"), "{text}");
    out
}

/// Problems with one container that runs marin3r.
fn check_container(
    what: &str,
    c: &Value,
    subcommands: &BTreeSet<String>,
    help: &mut BTreeMap<String, Accepted>,
) -> Vec<String> {
    let args: Vec<&str> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let what = format!("{what} container {}", c["name"]);
    let mut errors = Vec::new();
    if !c["command"].is_null() {
        errors.push(format!(
            "{what}: sets command (the image's entrypoint is /marin3r)"
        ));
    }
    let Some(sub) = args.first().filter(|s| subcommands.contains(**s)) else {
        errors.push(format!(
            "{what}: args {args:?} do not start with a subcommand"
        ));
        return errors;
    };
    let known = help.entry(sub.to_string()).or_insert_with(|| accepted(sub));
    for arg in &args[1..] {
        if !arg.starts_with('-') {
            continue; // a value
        }
        let name = arg.split('=').next().unwrap_or_default();
        if !known.flags.contains(name) {
            errors.push(format!("{what}: `marin3r {sub}` has no flag {name}"));
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or_default();
        if (name.starts_with("MARIN3R_") || name == "WATCH_NAMESPACE") && !known.env.contains(name)
        {
            errors.push(format!("{what}: `marin3r {sub}` reads no {name}"));
        }
    }
    errors
}

fn runs_marin3r(c: &Value, subcommands: &BTreeSet<String>) -> bool {
    let image = c["image"].as_str().unwrap_or_default();
    image == marin3r_wire::images::MARIN3R
        || c["args"][0]
            .as_str()
            .is_some_and(|a| subcommands.contains(a))
}

/// `marin3r inject -f -` applied to `objects`.
fn inject(objects: &[Value]) -> Vec<Value> {
    let yaml: String = objects
        .iter()
        .map(|o| format!("---\n{}", serde_json::to_string(o).unwrap()))
        .collect::<Vec<_>>()
        .join("\n");
    let mut child = marin3r()
        .args(["inject", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "marin3r inject: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple::<Value>(std::str::from_utf8(&out.stdout).unwrap())
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn manifest_containers_use_existing_subcommands_flags_and_env() {
    let subcommands = subcommands();
    assert!(subcommands.contains("webhook") && subcommands.contains("discovery-service"));
    let mut help = BTreeMap::new();
    let mut errors = Vec::new();
    let mut checked = BTreeSet::new();
    let root = kustomize::manifests_dir();
    for dir in kustomize::kustomizations(&root).unwrap() {
        let rel = dir.strip_prefix(&root).unwrap().display().to_string();
        let mut objects = kustomize::render(&dir).unwrap_or_else(|e| panic!("{e}"));
        if rel.starts_with("examples") {
            objects = inject(&objects);
        }
        for obj in &objects {
            for c in containers(obj) {
                if !runs_marin3r(c, &subcommands) {
                    continue;
                }
                let what = format!("manifests/{rel}: {}", describe(obj));
                errors.extend(check_container(&what, c, &subcommands, &mut help));
                if let Some(sub) = c["args"][0].as_str() {
                    checked.insert(sub.to_string());
                }
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert_eq!(
        checked,
        BTreeSet::from(
            [
                "discovery-service",
                "init-manager",
                "operator",
                "shutdown-manager",
                "webhook"
            ]
            .map(String::from)
        ),
        "the manifests run these subcommands"
    );
}

/// The OLM bundle's Deployments (`manifests/olm/bundle/`, from `marin3r_manifests::olm`)
/// run the operator and the webhook with flags and environment they have, among them
/// OLM's certificate directory and `WATCH_NAMESPACE` from `olm.targetNamespaces`.
#[test]
fn csv_containers_use_existing_subcommands_flags_and_env() {
    let subcommands = subcommands();
    let mut help = BTreeMap::new();
    let csv = marin3r_manifests::olm::csv().unwrap();
    let mut errors = Vec::new();
    let mut checked = BTreeSet::new();
    for d in csv["spec"]["install"]["spec"]["deployments"]
        .as_array()
        .unwrap()
    {
        let obj = serde_json::json!({"kind": "Deployment", "spec": d["spec"]});
        for c in containers(&obj) {
            assert!(
                runs_marin3r(c, &subcommands),
                "{}: {}",
                d["name"],
                c["name"]
            );
            let what = format!("the CSV's Deployment {}", d["name"]);
            errors.extend(check_container(&what, c, &subcommands, &mut help));
            checked.insert(c["args"][0].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert_eq!(
        checked,
        BTreeSet::from(["operator", "webhook"].map(String::from))
    );
}

#[test]
fn the_checker_catches_unknown_flags_and_env() {
    let subcommands = subcommands();
    let mut help = BTreeMap::new();
    let c: Value = serde_json::json!({
        "name": "webhook", "image": marin3r_wire::images::MARIN3R,
        "args": ["webhook", "--webhook-port=9443", "--tls-dir", "/tls", "--no-such-flag=1", "-q"],
        "env": [{"name": "MARIN3R_TLS_DIR", "value": "/x"}, {"name": "MARIN3R_NOPE", "value": "1"}]
    });
    assert_eq!(
        check_container("test", &c, &subcommands, &mut help),
        [
            "test container \"webhook\": `marin3r webhook` has no flag --no-such-flag",
            "test container \"webhook\": `marin3r webhook` has no flag -q",
            "test container \"webhook\": `marin3r webhook` reads no MARIN3R_NOPE",
        ]
    );
    let c: Value =
        serde_json::json!({"name": "x", "image": marin3r_wire::images::MARIN3R, "args": ["serve"]});
    assert_eq!(
        check_container("test", &c, &subcommands, &mut help),
        ["test container \"x\": args [\"serve\"] do not start with a subcommand"]
    );
}
