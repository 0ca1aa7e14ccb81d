//! The install manifests (`manifests/{crds,default,discovery-service,examples}`, every
//! kustomization under `manifests/`) as `kubectl apply -k` would send them:
//!
//! - every object parses into its Kubernetes type with **no unknown field** (the typed
//!   object is serialized back and compared with the input, naming any field path that
//!   was dropped), cert-manager objects against a minimal schema, EnvoyConfigs with the
//!   decoder of `marin3r validate`;
//! - the MutatingWebhookConfiguration is design.md §1.1, field by field; both webhook
//!   configurations reach the webhook through a Service, a named port and the
//!   container's `--webhook-port`, with a cert-manager CA matching the Service name;
//! - the Deployments are hardened, their probes, ports and volumes agree with their
//!   flags; the discovery-service Role grants exactly `marin3r_kube::rbac::DISCOVERY_SERVICE`
//!   and `DISCOVERY_SERVICE_HA` (the Lease by `resourceNames`);
//! - the discovery service runs as docs/ha.md §6 says (replicas, rollout, spread,
//!   downward API, probe, grace, PriorityClass, PodDisruptionBudget, memory), checked by
//!   one function over `manifests/discovery-service` and over what the operator renders;
//! - the example Deployments get the expected sidecar from `inject_workload`, and their
//!   EnvoyConfigs match their annotations.
//!
//! The flags in container args are checked against the binary's `--help` by the CLI's
//! test `cli/tests/manifests.rs`. Needs `kubectl` (kustomize v5) on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use marin3r_kube::rbac::{NamedAccess, named_grants};
use marin3r_manifests::kustomize::{self, containers, describe};
use marin3r_wire::{INJECTION_ENABLED, INJECTION_LABEL, images, object_names, ports, secret_keys};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const SYSTEM_NAMESPACE: &str = "marin3r-system";
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "marin3r");

// ---------------------------------------------------------------------------------------
// Rendering

/// Every kustomization under `manifests/`, rendered once: relative dir → objects.
fn rendered() -> &'static BTreeMap<String, Vec<Value>> {
    static RENDERED: OnceLock<BTreeMap<String, Vec<Value>>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let root = kustomize::manifests_dir();
        let dirs = kustomize::kustomizations(&root).unwrap();
        dirs.iter()
            .map(|dir| {
                let rel = dir.strip_prefix(&root).unwrap().display().to_string();
                let objects = kustomize::render(dir).unwrap_or_else(|e| panic!("{e}"));
                (rel, objects)
            })
            .collect()
    })
}

fn objects(dir: &str) -> &'static [Value] {
    rendered()
        .get(dir)
        .unwrap_or_else(|| panic!("no kustomization manifests/{dir}"))
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn of_kind<'a>(objs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    objs.iter().filter(move |o| o["kind"] == kind)
}

fn str_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Strict typed parsing

/// Parses `obj` as `K`, failing on a missing or mistyped field (with its path) and on any
/// field `K` does not know: k8s-openapi ignores unknown fields, so the typed object is
/// serialized again and every input field missing from it is reported.
fn strict<K: DeserializeOwned + Serialize>(obj: &Value) -> Result<K, String> {
    let typed: K = serde_path_to_error::deserialize(obj.clone())
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    compare(obj, &back, "", &mut lost);
    if lost.is_empty() {
        Ok(typed)
    } else {
        Err(lost.join("; "))
    }
}

/// Nulls, `{}` and `[]`: values a serializer may drop without losing anything.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Reports every field of `input` that `back` lost or changed.
fn compare(input: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (input, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => compare(v, w, &p, out),
                    None if is_empty(v) => {}
                    None => out.push(format!("unknown field {p}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                compare(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} was read as {b}")),
    }
}

/// A minimal schema: the allowed keys of an object, and the schemas of some of them.
enum Schema {
    /// Any value.
    Any,
    /// An object with these keys (each with its schema) and these required ones.
    Object(&'static [(&'static str, Schema)], &'static [&'static str]),
    /// A list whose items follow the schema.
    List(&'static Schema),
    /// One of these strings.
    OneOf(&'static [&'static str]),
}

fn check_schema(v: &Value, schema: &Schema, path: &str, out: &mut Vec<String>) {
    match schema {
        Schema::Any => {}
        Schema::Object(fields, required) => {
            let Some(obj) = v.as_object() else {
                out.push(format!("{path}: expected an object, got {v}"));
                return;
            };
            for r in *required {
                if !obj.contains_key(*r) {
                    out.push(format!("{path}.{r}: required"));
                }
            }
            for (k, value) in obj {
                match fields.iter().find(|(name, _)| name == k) {
                    Some((_, s)) => check_schema(value, s, &format!("{path}.{k}"), out),
                    None => out.push(format!("unknown field {path}.{k}")),
                }
            }
        }
        Schema::List(item) => match v.as_array() {
            Some(items) => {
                for (i, value) in items.iter().enumerate() {
                    check_schema(value, item, &format!("{path}[{i}]"), out);
                }
            }
            None => out.push(format!("{path}: expected a list, got {v}")),
        },
        Schema::OneOf(allowed) => {
            if !v.as_str().is_some_and(|s| allowed.contains(&s)) {
                out.push(format!("{path}: {v} is not one of {allowed:?}"));
            }
        }
    }
}

const METADATA: Schema = Schema::Object(
    &[
        ("name", Schema::Any),
        ("namespace", Schema::Any),
        ("labels", Schema::Any),
        ("annotations", Schema::Any),
    ],
    &["name"],
);

const ISSUER_REF: Schema = Schema::Object(
    &[
        ("name", Schema::Any),
        ("kind", Schema::OneOf(&["Issuer", "ClusterIssuer"])),
        ("group", Schema::OneOf(&["cert-manager.io"])),
    ],
    &["name"],
);

const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// cert-manager.io/v1 Certificate (the fields these manifests may use).
const CERTIFICATE: Schema = Schema::Object(
    &[
        ("apiVersion", Schema::Any),
        ("kind", Schema::Any),
        ("metadata", METADATA),
        (
            "spec",
            Schema::Object(
                &[
                    ("secretName", Schema::Any),
                    ("commonName", Schema::Any),
                    ("dnsNames", Schema::List(&Schema::Any)),
                    ("ipAddresses", Schema::List(&Schema::Any)),
                    ("duration", Schema::Any),
                    ("renewBefore", Schema::Any),
                    ("isCA", Schema::Any),
                    (
                        "privateKey",
                        Schema::Object(
                            &[
                                ("algorithm", Schema::OneOf(&["RSA", "ECDSA", "Ed25519"])),
                                ("size", Schema::Any),
                                ("encoding", Schema::OneOf(&["PKCS1", "PKCS8"])),
                                ("rotationPolicy", Schema::OneOf(&["Never", "Always"])),
                            ],
                            &[],
                        ),
                    ),
                    ("usages", Schema::List(&Schema::OneOf(USAGES))),
                    ("issuerRef", ISSUER_REF),
                    ("secretTemplate", Schema::Any),
                    ("subject", Schema::Any),
                ],
                &["secretName", "issuerRef"],
            ),
        ),
    ],
    &["apiVersion", "kind", "metadata", "spec"],
);

/// cert-manager.io/v1 Issuer: self-signed or CA (what these manifests use).
const ISSUER: Schema = Schema::Object(
    &[
        ("apiVersion", Schema::Any),
        ("kind", Schema::Any),
        ("metadata", METADATA),
        (
            "spec",
            Schema::Object(
                &[
                    (
                        "selfSigned",
                        Schema::Object(&[("crlDistributionPoints", Schema::Any)], &[]),
                    ),
                    (
                        "ca",
                        Schema::Object(
                            &[
                                ("secretName", Schema::Any),
                                ("crlDistributionPoints", Schema::Any),
                                ("ocspServers", Schema::Any),
                                ("issuingCertificateURLs", Schema::Any),
                            ],
                            &["secretName"],
                        ),
                    ),
                ],
                &[],
            ),
        ),
    ],
    &["apiVersion", "kind", "metadata", "spec"],
);

/// A Go duration as cert-manager reads it (`8760h`, `90m`, `1h30m`).
fn is_go_duration(s: &str) -> bool {
    let mut rest = s;
    let mut units = 0;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ms", "h", "m", "s"].iter().find(|u| rest.starts_with(**u)) else {
            return false;
        };
        rest = &rest[unit.len()..];
        units += 1;
    }
    units > 0
}

fn check_cert_manager(obj: &Value) -> Result<(), String> {
    let mut errors = Vec::new();
    match obj["kind"].as_str() {
        Some("Certificate") => {
            check_schema(obj, &CERTIFICATE, "", &mut errors);
            for key in ["duration", "renewBefore"] {
                if let Some(d) = obj["spec"].get(key)
                    && !d.as_str().is_some_and(is_go_duration)
                {
                    errors.push(format!(".spec.{key}: {d} is not a duration"));
                }
            }
            if obj["spec"]["dnsNames"].is_null() && obj["spec"]["commonName"].is_null() {
                errors.push(".spec: needs dnsNames or commonName".into());
            }
        }
        Some("Issuer") => {
            check_schema(obj, &ISSUER, "", &mut errors);
            let kinds = obj["spec"].as_object().map_or(0, |m| m.len());
            if kinds != 1 {
                errors.push(format!(".spec: exactly one issuer type, got {kinds}"));
            }
        }
        other => errors.push(format!("unexpected cert-manager kind {other:?}")),
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn checked<K: DeserializeOwned + Serialize>(obj: &Value) -> Result<(), String> {
    strict::<K>(obj).map(drop)
}

/// Parses one rendered object by its apiVersion and kind.
fn check_object(obj: &Value) -> Result<(), String> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => checked::<Namespace>(obj),
        ("v1", "Service") => checked::<Service>(obj),
        ("v1", "ServiceAccount") => checked::<ServiceAccount>(obj),
        ("v1", "Secret") => checked::<Secret>(obj),
        ("apps/v1", "Deployment") => checked::<Deployment>(obj),
        ("policy/v1", "PodDisruptionBudget") => checked::<PodDisruptionBudget>(obj),
        ("rbac.authorization.k8s.io/v1", "Role") => checked::<Role>(obj),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => checked::<RoleBinding>(obj),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => checked::<ClusterRole>(obj),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            checked::<ClusterRoleBinding>(obj)
        }
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            checked::<MutatingWebhookConfiguration>(obj)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            checked::<ValidatingWebhookConfiguration>(obj)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            checked::<CustomResourceDefinition>(obj)
        }
        ("scheduling.k8s.io/v1", "PriorityClass") => checked::<PriorityClass>(obj),
        // The dashboards of manifests/observability.
        ("v1", "ConfigMap") => checked::<ConfigMap>(obj),
        // Prometheus Operator objects of manifests/observability: no Rust types; their
        // fields are checked by manifests/tests/observability.rs (and `promtool check rules`).
        ("monitoring.coreos.com/v1", "PodMonitor" | "PrometheusRule") => Ok(()),
        ("cert-manager.io/v1", _) => check_cert_manager(obj),
        ("marin3r.3scale.net/v1alpha1", "EnvoyConfig") => {
            strict::<marin3r_envoyconfig::envoyconfig::EnvoyConfig>(obj)?;
            validate_envoyconfig(obj)
        }
        _ => Err(format!("unexpected object kind {api_version} {kind}")),
    }
}

/// What `marin3r validate -f` says about one EnvoyConfig.
fn validate_envoyconfig(obj: &Value) -> Result<(), String> {
    let text = serde_json::to_string(obj).unwrap();
    match marin3r_envoyconfig::envoyconfig::validate_file(&text) {
        Ok(1) => Ok(()),
        Ok(n) => Err(format!("validate saw {n} EnvoyConfigs")),
        Err(errors) => Err(errors.join("; ")),
    }
}

#[test]
fn the_strict_parser_reports_unknown_and_mistyped_fields_with_their_path() {
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [
            {"name": "c", "image": "i", "imagePullPolicyy": "Always"}]}}}
    });
    let err = strict::<Deployment>(&d).unwrap_err();
    assert_eq!(
        err,
        "unknown field .spec.template.spec.containers[0].imagePullPolicyy"
    );
    d["spec"]["template"]["spec"]["containers"][0] = json!({"name": "c", "ports": "80"});
    let err = strict::<Deployment>(&d).unwrap_err();
    assert!(
        err.starts_with("spec.template.spec.containers[0].ports"),
        "{err}"
    );
    // Empty values a serializer drops are not unknown fields.
    d["spec"]["template"]["spec"]["containers"][0] = json!({"name": "c", "env": []});
    strict::<Deployment>(&d).unwrap();

    let mut cert = json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "c"},
        "spec": {"secretName": "s", "dnsNames": ["a"], "issuerRef": {"name": "i"},
                 "usages": ["server auth"], "duration": "8760h"}});
    check_cert_manager(&cert).unwrap();
    cert["spec"]["dnsName"] = json!(["b"]);
    cert["spec"]["usages"] = json!(["server"]);
    cert["spec"]["duration"] = json!("1y");
    assert_eq!(
        check_cert_manager(&cert).unwrap_err(),
        "unknown field .spec.dnsName; .spec.usages[0]: \"server\" is not one of \
         [\"signing\", \"digital signature\", \"content commitment\", \"key encipherment\", \
         \"key agreement\", \"data encipherment\", \"cert sign\", \"crl sign\", \
         \"encipher only\", \"decipher only\", \"any\", \"server auth\", \"client auth\", \
         \"code signing\", \"email protection\", \"s/mime\", \"ipsec end system\", \
         \"ipsec tunnel\", \"ipsec user\", \"timestamping\", \"ocsp signing\", \
         \"microsoft sgc\", \"netscape sgc\"]; .spec.duration: \"1y\" is not a duration"
    );
}

#[test]
fn every_kustomization_renders_and_every_object_parses_strictly() {
    let dirs: BTreeSet<&str> = rendered().keys().map(String::as_str).collect();
    for expected in ["crds", "default", "discovery-service", "examples"] {
        assert!(dirs.contains(expected), "missing manifests/{expected}");
    }
    let mut errors = Vec::new();
    for (dir, objs) in rendered() {
        assert!(!objs.is_empty(), "manifests/{dir} renders nothing");
        for obj in objs {
            if let Err(e) = check_object(obj) {
                errors.push(format!("manifests/{dir}: {}: {e}", describe(obj)));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn default_installs_the_crds_and_the_webhook_in_marin3r_system() {
    let objs = objects("default");
    let crds: BTreeSet<String> = of_kind(objs, "CustomResourceDefinition")
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let generated: BTreeSet<String> = marin3r_manifests::crds()
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(crds, generated);
    find(objs, "Namespace", SYSTEM_NAMESPACE);
    find(
        objs,
        "PriorityClass",
        object_names::DISCOVERY_SERVICE_PRIORITY_CLASS,
    );
    let cluster_scoped = [
        "Namespace",
        "CustomResourceDefinition",
        "PriorityClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ];
    for obj in objs {
        let kind = obj["kind"].as_str().unwrap();
        if cluster_scoped.contains(&kind) {
            assert!(obj["metadata"]["namespace"].is_null(), "{}", describe(obj));
        } else {
            assert_eq!(
                obj["metadata"]["namespace"],
                SYSTEM_NAMESPACE,
                "{}",
                describe(obj)
            );
        }
        assert_eq!(
            obj["metadata"]["labels"][PART_OF.0],
            PART_OF.1,
            "{}",
            describe(obj)
        );
    }
    // The webhook needs no API access (design.md §1.1).
    for kind in ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"] {
        assert_eq!(of_kind(objs, kind).count(), 0, "no {kind} for the webhook");
    }
    let sa = find(objs, "ServiceAccount", "marin3r-webhook");
    assert_eq!(sa["automountServiceAccountToken"], false);
}

// ---------------------------------------------------------------------------------------
// Workload helpers

/// The value of `--flag=value` or `--flag value` in `args`.
fn flag<'a>(args: &'a [&'a str], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&eq) {
            Some(v)
        } else if *a == name {
            args.get(i + 1).copied()
        } else {
            None
        }
    })
}

/// The port of a listen address like `:8081` or `0.0.0.0:8081`.
fn port_of(addr: &str) -> i64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    containers(deployment)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{}: no container {name}", describe(deployment)))
}

fn args(c: &Value) -> Vec<&str> {
    strs(&c["args"])
}

/// The number of a container port given by number or name.
fn container_port(c: &Value, port: &Value) -> i64 {
    if let Some(n) = port.as_i64() {
        return n;
    }
    let name = port.as_str().unwrap();
    c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("container {} has no port {name}", c["name"]))
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
}

fn pod_labels(deployment: &Value) -> BTreeMap<String, String> {
    str_map(&deployment["spec"]["template"]["metadata"]["labels"])
}

fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    assert!(
        selector["matchExpressions"].is_null(),
        "only matchLabels here"
    );
    let wanted = str_map(&selector["matchLabels"]);
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The Deployments whose Pods a Service (plain label map) selects.
fn backends<'a>(objs: &'a [Value], service: &Value) -> Vec<&'a Value> {
    let selector = str_map(&service["spec"]["selector"]);
    assert!(
        !selector.is_empty(),
        "{} selects nothing",
        describe(service)
    );
    of_kind(objs, "Deployment")
        .filter(|d| {
            let labels = pod_labels(d);
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .collect()
}

/// The container port a Service port reaches, in its only backend Deployment.
fn service_target(objs: &[Value], service: &Value, port_name: &str) -> (String, i64) {
    let port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port_name)
        .unwrap_or_else(|| panic!("{}: no port {port_name}", describe(service)));
    let deployments = backends(objs, service);
    assert_eq!(deployments.len(), 1, "{}", describe(service));
    let target = if port["targetPort"].is_null() {
        &port["port"]
    } else {
        &port["targetPort"]
    };
    let owner = containers(deployments[0])
        .into_iter()
        .find(|c| {
            target.is_i64()
                || c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == *target)
        })
        .unwrap_or_else(|| panic!("{}: port {target} not in a container", describe(service)));
    (
        owner["name"].as_str().unwrap().to_string(),
        container_port(owner, target),
    )
}

/// The Secret volume mounted at `path` in container `c` of `deployment`.
fn secret_at<'a>(deployment: &'a Value, c: &Value, path: &str) -> &'a Value {
    let mount = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == path)
        .unwrap_or_else(|| panic!("container {} mounts nothing at {path}", c["name"]));
    assert_eq!(mount["readOnly"], true, "{path} read-only");
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    &volume["secret"]
}

fn check_hardened(deployment: &Value) {
    let what = describe(deployment);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{what}"
    );
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[key].is_null() || pod[key] == false, "{what}: {key}");
    }
    for c in containers(deployment) {
        let sc = &c["securityContext"];
        let what = format!("{what} container {}", c["name"]);
        assert_eq!(sc["runAsNonRoot"], true, "{what}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
        assert!(
            sc["privileged"].is_null() || sc["privileged"] == false,
            "{what}"
        );
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
        assert!(sc["capabilities"]["add"].is_null(), "{what}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{what}");
        for key in ["cpu", "memory"] {
            assert!(
                c["resources"]["requests"][key].is_string(),
                "{what}: requests.{key}"
            );
        }
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{what}: limits.memory"
        );
        assert_eq!(c["image"], images::MARIN3R, "{what}");
    }
}

/// Liveness `/healthz` and readiness `/readyz` on the port of `--health-probe-bind-address`.
fn check_probes(c: &Value) {
    let a = args(c);
    let probe_port = port_of(flag(&a, "--health-probe-bind-address").unwrap());
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} of {}", c["name"]);
        assert_eq!(container_port(c, &get["port"]), probe_port, "{probe}");
    }
}

// ---------------------------------------------------------------------------------------
// The webhook

/// The Service a webhook configuration calls, checked down to the container port.
fn check_webhook_service(objs: &[Value], service: &Value) -> String {
    let name = service["name"].as_str().unwrap();
    let namespace = service["namespace"].as_str().unwrap();
    let port = service["port"].as_i64().unwrap_or(443);
    let svc = find(objs, "Service", name);
    assert_eq!(svc["metadata"]["namespace"], namespace);
    let port_name = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == port)
        .and_then(|p| p["name"].as_str())
        .unwrap_or_else(|| panic!("Service {name} has no port {port}"));
    let (container_name, target) = service_target(objs, svc, port_name);
    let deployment = backends(objs, svc)[0];
    let c = container(deployment, &container_name);
    let a = args(c);
    assert_eq!(a[0], "webhook");
    let webhook_port: i64 = flag(&a, "--webhook-port").map_or(9443, |p| p.parse().unwrap());
    assert_eq!((port, target, webhook_port), (443, 9443, 9443));
    format!("{name}.{namespace}.svc")
}

/// `cert-manager.io/inject-ca-from` names a Certificate whose DNS names cover the
/// Service, mounted as the webhook's `--tls-dir`.
fn check_webhook_ca(objs: &[Value], config: &Value, host: &str) {
    let from = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no inject-ca-from", describe(config)));
    let (ns, name) = from.split_once('/').unwrap();
    let cert = find(objs, "Certificate", name);
    assert_eq!(cert["metadata"]["namespace"], ns);
    assert!(
        strs(&cert["spec"]["dnsNames"]).contains(&host),
        "Certificate {name} lacks {host}"
    );
    let issuer = &cert["spec"]["issuerRef"];
    assert_eq!(issuer["kind"], "Issuer");
    find(objs, "Issuer", issuer["name"].as_str().unwrap());
    let deployment = find(objs, "Deployment", "marin3r-webhook");
    let c = container(deployment, "webhook");
    let a = args(c);
    let secret = secret_at(deployment, c, flag(&a, "--tls-dir").unwrap());
    assert_eq!(secret["secretName"], cert["spec"]["secretName"]);
    // cert-manager writes a kubernetes.io/tls Secret.
    let cert_name = flag(&a, "--tls-cert-name").unwrap_or(secret_keys::TLS_CRT);
    let key_name = flag(&a, "--tls-key-name").unwrap_or(secret_keys::TLS_KEY);
    assert_eq!((cert_name, key_name), ("tls.crt", "tls.key"));
}

#[test]
fn the_mutating_webhook_is_spec_1_1_field_by_field() {
    let objs = objects("default");
    let mut configs = of_kind(objs, "MutatingWebhookConfiguration");
    let raw = configs.next().expect("a MutatingWebhookConfiguration");
    assert!(configs.next().is_none(), "one MutatingWebhookConfiguration");
    let config: MutatingWebhookConfiguration = strict(raw).unwrap();
    let webhooks = config.webhooks.unwrap();
    assert_eq!(webhooks.len(), 1);
    let w = &webhooks[0];
    // Upstream MARIN3R's name (the API server quotes it in errors users match).
    assert_eq!(w.name, marin3r_wire::webhook_names::SIDECAR_INJECTOR);
    assert_eq!(w.name, "sidecar-injector.marin3r.3scale.net");
    // Trigger: Pod CREATE.
    let rules = w.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(
        rule.operations.as_deref(),
        Some(&["CREATE".to_string()][..])
    );
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(rule.api_versions.as_deref(), Some(&["v1".to_string()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_string()][..]));
    assert!(matches!(
        rule.scope.as_deref(),
        None | Some("*" | "Namespaced")
    ));
    // objectSelector: the label marin3r.3scale.net/status=enabled, nothing else.
    let selector = w.object_selector.as_ref().unwrap();
    assert_eq!(
        selector.match_labels,
        Some(BTreeMap::from([(
            INJECTION_LABEL.to_string(),
            INJECTION_ENABLED.to_string()
        )]))
    );
    assert!(selector.match_expressions.is_none());
    assert!(w.namespace_selector.is_none(), "every namespace");
    assert!(w.match_conditions.is_none());
    assert_eq!(
        w.match_policy.as_deref().unwrap_or("Equivalent"),
        "Equivalent"
    );
    // Policies.
    assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(w.side_effects, "None");
    assert_eq!(w.admission_review_versions, ["v1"]);
    assert_eq!(w.reinvocation_policy.as_deref(), Some("Never"));
    assert_eq!(
        w.timeout_seconds,
        Some(marin3r_wire::webhook_names::SIDECAR_INJECTOR_TIMEOUT_SECONDS)
    );
    assert_eq!(w.timeout_seconds, Some(5));
    // Path /pod-v1-mutate on the webhook's HTTPS port 9443, behind Service port 443.
    assert!(w.client_config.url.is_none());
    assert!(
        w.client_config.ca_bundle.is_none(),
        "injected by cert-manager"
    );
    let service = w.client_config.service.as_ref().unwrap();
    assert_eq!(
        service.path.as_deref(),
        Some(marin3r_webhook::server::MUTATE_PATH)
    );
    assert_eq!(service.namespace, SYSTEM_NAMESPACE);
    let host = check_webhook_service(objs, &serde_json::to_value(service).unwrap());
    check_webhook_ca(objs, raw, &host);
}

#[test]
fn the_validating_webhooks_check_envoyconfig_and_envoydeployment_creates_and_updates() {
    let objs = objects("default");
    let expected = [
        (
            "marin3r-envoyconfig-validator",
            marin3r_wire::webhook_names::ENVOYCONFIG,
            "marin3r.3scale.net",
            "envoyconfigs",
            marin3r_webhook::server::VALIDATE_ENVOYCONFIG_PATH,
            "envoyconfigs.marin3r.3scale.net",
        ),
        (
            "marin3r-envoydeployment-validator",
            marin3r_wire::webhook_names::ENVOYDEPLOYMENT,
            "operator.marin3r.3scale.net",
            "envoydeployments",
            marin3r_webhook::server::VALIDATE_ENVOYDEPLOYMENT_PATH,
            "envoydeployments.operator.marin3r.3scale.net",
        ),
    ];
    assert_eq!(
        of_kind(objs, "ValidatingWebhookConfiguration").count(),
        expected.len()
    );
    // Upstream MARIN3R's names, spelled out: a change to the constants fails here too.
    assert_eq!(
        expected.map(|e| e.1),
        [
            "envoyconfig.marin3r.3scale.net-v1alpha1",
            "envoydeployment.operator.marin3r.3scale.net"
        ]
    );
    for (name, webhook_name, group, resource, path, crd_name) in expected {
        let raw = find(objs, "ValidatingWebhookConfiguration", name);
        let config: ValidatingWebhookConfiguration = strict(raw).unwrap();
        let webhooks = config.webhooks.unwrap();
        assert_eq!(webhooks.len(), 1);
        let w = &webhooks[0];
        assert_eq!(w.name, webhook_name);
        let rules = w.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        let rule = serde_json::to_value(&rules[0]).unwrap();
        assert_eq!(rule["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(rule["apiGroups"], json!([group]));
        assert_eq!(rule["apiVersions"], json!(["v1alpha1"]));
        assert_eq!(rule["resources"], json!([resource]));
        assert_eq!(w.side_effects, "None");
        assert_eq!(w.admission_review_versions, ["v1"]);
        assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
        assert!(w.timeout_seconds.is_some_and(|t| t <= 10));
        assert!(w.object_selector.is_none() && w.namespace_selector.is_none());
        let service = w.client_config.service.as_ref().unwrap();
        assert_eq!(service.path.as_deref(), Some(path));
        let host = check_webhook_service(objs, &serde_json::to_value(service).unwrap());
        check_webhook_ca(objs, raw, &host);
        // The webhook answers for the group the CRD defines.
        let crds = if group == "marin3r.3scale.net" {
            objs
        } else {
            objects("operator")
        };
        let crd = find(crds, "CustomResourceDefinition", crd_name);
        assert_eq!(crd["spec"]["group"], group);
    }
}

#[test]
fn the_webhook_deployment_is_highly_available_hardened_and_probed() {
    let objs = objects("default");
    let d = find(objs, "Deployment", "marin3r-webhook");
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(selects(&d["spec"]["selector"], &pod_labels(d)));
    let pod = &d["spec"]["template"]["spec"];
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| {
            t["topologyKey"] == "kubernetes.io/hostname"
                && selects(&t["labelSelector"], &pod_labels(d))
        });
    let anti = !pod["affinity"]["podAntiAffinity"].is_null();
    assert!(spread || anti, "replicas spread over nodes");
    assert_eq!(pod["serviceAccountName"], "marin3r-webhook");
    assert_eq!(pod["automountServiceAccountToken"], false);
    check_hardened(d);
    let c = container(d, "webhook");
    let a = args(c);
    check_probes(c);
    // The init and shutdown managers it injects run its own image.
    let marin3r_image = env(c, "MARIN3R_MARIN3R_IMAGE")
        .and_then(|e| e["value"].as_str())
        .or_else(|| flag(&a, "--marin3r-image"))
        .unwrap_or(images::MARIN3R);
    assert_eq!(marin3r_image, c["image"].as_str().unwrap());

    let pdb: PodDisruptionBudget =
        strict(find(objs, "PodDisruptionBudget", "marin3r-webhook")).unwrap();
    let spec = pdb.spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    assert!(spec.max_unavailable.is_none());
    let selector = serde_json::to_value(spec.selector.unwrap()).unwrap();
    assert!(selects(&selector, &pod_labels(d)));

    // Metrics: a Service port reaching --metrics-bind-address.
    let metrics = of_kind(objs, "Service")
        .find(|s| s["metadata"]["name"] != "marin3r-webhook")
        .expect("a metrics Service");
    let (_, port) = service_target(objs, metrics, "metrics");
    assert_eq!(port, port_of(flag(&a, "--metrics-bind-address").unwrap()));
}

// ---------------------------------------------------------------------------------------
// The discovery service

/// (API group, resource, verb, object name) of every rule: one per `resourceNames`
/// entry, or `None` for a rule on every object.
fn role_access(role: &Value) -> BTreeSet<NamedAccess> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(rule["nonResourceURLs"].is_null());
        let names: Vec<Option<String>> = match rule["resourceNames"].as_array() {
            None => vec![None],
            Some(names) => {
                assert!(
                    !names.is_empty(),
                    "empty resourceNames: every object: {rule}"
                );
                names
                    .iter()
                    .map(|n| Some(n.as_str().unwrap().to_string()))
                    .collect()
            }
        };
        for g in strs(&rule["apiGroups"]) {
            for r in strs(&rule["resources"]) {
                for v in strs(&rule["verbs"]) {
                    assert!(![g, r, v].contains(&"*"), "no wildcards: {rule}");
                    for n in &names {
                        out.insert((g.to_string(), r.to_string(), v.to_string(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

/// (API group, resource, verb) of every rule of a role without `resourceNames` (a
/// ClusterRole that must hold grants whatever their names).
fn cluster_role_access(role: &Value) -> BTreeSet<(String, String, String)> {
    role_access(role)
        .into_iter()
        .map(|(g, r, v, name)| {
            assert!(name.is_none(), "{}: resourceNames", describe(role));
            (g, r, v)
        })
        .collect()
}

#[test]
fn the_discovery_service_role_grants_exactly_what_the_controllers_use() {
    let objs = objects("discovery-service");
    let granted = role_access(find(objs, "Role", "marin3r-discoveryservice"));
    // Several replicas (the base runs 3): the Lease rule names its leader Lease.
    let needed = named_grants(
        marin3r_kube::rbac::discovery_service(true),
        marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE,
    );
    let missing: Vec<_> = needed.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&needed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "Role vs marin3r_kube::rbac::DISCOVERY_SERVICE{{,_HA}}\nmissing: {missing:?}\nextra: {extra:?}"
    );
    for kind in ["ClusterRole", "ClusterRoleBinding"] {
        assert_eq!(of_kind(objs, kind).count(), 0, "namespace-scoped only");
    }
    // Bound to the Deployment's ServiceAccount.
    let binding = find(objs, "RoleBinding", "marin3r-discoveryservice");
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "marin3r-discoveryservice"})
    );
    let d = find(objs, "Deployment", "marin3r-discoveryservice");
    let sa = d["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    find(objs, "ServiceAccount", sa);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": sa}]),
        "no namespace: it defaults to the binding's, so `kubectl apply -n` works"
    );
}

#[test]
fn the_discovery_service_runs_in_kubernetes_mode_behind_the_sidecars_default_address() {
    let objs = objects("discovery-service");
    for obj in objs {
        assert!(
            obj["metadata"]["namespace"].is_null(),
            "{}: the namespace comes from `kubectl apply -n` or an overlay",
            describe(obj)
        );
        assert_eq!(obj["metadata"]["labels"][PART_OF.0], PART_OF.1);
    }
    let d = find(objs, "Deployment", "marin3r-discoveryservice");
    check_hardened(d);
    let c = container(d, "discovery-service");
    let a = args(c);
    assert_eq!(a[0], "discovery-service");
    assert!(flag(&a, "--config-dir").is_none(), "Kubernetes mode");
    assert_eq!(
        env(c, "WATCH_NAMESPACE").unwrap()["valueFrom"],
        json!({"fieldRef": {"fieldPath": "metadata.namespace"}})
    );
    check_probes(c);
    assert_eq!(
        port_of(flag(&a, "--health-probe-bind-address").unwrap()),
        i64::from(ports::PROBES)
    );

    // The Service the sidecars dial: marin3r-<default name>:18000, port "discovery".
    let name =
        object_names::discovery_service(marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE);
    let svc = find(objs, "Service", &name);
    let discovery = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "discovery")
        .unwrap();
    assert_eq!(discovery["port"], ports::XDSS);
    let (_, xdss) = service_target(objs, svc, "discovery");
    let flag_port: i64 =
        flag(&a, "--xdss-port").map_or(i64::from(ports::XDSS), |p| p.parse().unwrap());
    assert_eq!(xdss, flag_port);
    assert_eq!(xdss, i64::from(ports::XDSS));
    let (_, metrics) = service_target(objs, svc, "metrics");
    assert_eq!(
        metrics,
        port_of(flag(&a, "--metrics-bind-address").unwrap())
    );
    assert_eq!(metrics, i64::from(ports::METRICS));
}

#[test]
fn the_discovery_service_certificates_form_one_ca_per_namespace() {
    let objs = objects("discovery-service");
    let issuer = |name: &str| find(objs, "Issuer", name);
    let issuer_of = |cert: &Value| {
        assert_eq!(cert["spec"]["issuerRef"]["kind"], "Issuer");
        issuer(cert["spec"]["issuerRef"]["name"].as_str().unwrap())
    };
    let ca = find(objs, "Certificate", "marin3r-ca");
    assert_eq!(ca["spec"]["isCA"], true);
    assert!(!issuer_of(ca)["spec"]["selfSigned"].is_null());
    let ca_issuers: Vec<&Value> = of_kind(objs, "Issuer")
        .filter(|i| i["spec"]["ca"]["secretName"] == ca["spec"]["secretName"])
        .collect();
    assert_eq!(ca_issuers.len(), 1);
    let ca_issuer = ca_issuers[0]["metadata"]["name"].as_str().unwrap();

    let d = find(objs, "Deployment", "marin3r-discoveryservice");
    let c = container(d, "discovery-service");
    let a = args(c);
    // Server certificate: issued by the CA, mounted as --server-certificate-path.
    let server = find(objs, "Certificate", "marin3r-discoveryservice");
    assert_eq!(server["spec"]["issuerRef"]["name"], ca_issuer);
    assert!(strs(&server["spec"]["usages"]).contains(&"server auth"));
    assert!(strs(&server["spec"]["dnsNames"]).contains(&"marin3r-discoveryservice"));
    let mounted = secret_at(d, c, flag(&a, "--server-certificate-path").unwrap());
    assert_eq!(mounted["secretName"], server["spec"]["secretName"]);
    // Client CA: ca.crt only (not the CA key), mounted as --ca-certificate-path.
    let mounted = secret_at(d, c, flag(&a, "--ca-certificate-path").unwrap());
    assert_eq!(mounted["secretName"], ca["spec"]["secretName"]);
    assert_eq!(
        mounted["items"],
        json!([{"key": "ca.crt", "path": "ca.crt"}])
    );
    // Client certificate of the sidecars.
    let client = find(objs, "Certificate", "envoy-sidecar-client-cert");
    assert_eq!(client["spec"]["secretName"], "envoy-sidecar-client-cert");
    assert_eq!(client["spec"]["issuerRef"]["name"], ca_issuer);
    assert!(strs(&client["spec"]["usages"]).contains(&"client auth"));
}

// ---------------------------------------------------------------------------------------
// Several replicas (docs/ha.md §6): the manifests and what the operator renders

/// RSS of one idle ADS stream (BENCHMARKS.md "xDS scaling": 39.9 KiB from 1,000 to
/// 10,000 streams).
const KIB_PER_STREAM: u64 = 40;
/// The Envoys a namespace's discovery service is sized for (docs/install.md "Sizing").
const SIZED_FOR_ENVOYS: u64 = 10_000;
/// The process before any stream, with room for the namespace's EnvoyConfigs
/// (BENCHMARKS.md: 35 MiB idle, 64 MiB with 100 EnvoyConfigs).
const BASE_MIB: u64 = 64;
/// How uneven the Service may spread the streams over the replicas left.
const UNEVEN: u64 = 2;

/// The discovery service `name` among `objs`, with `replicas` replicas, as docs/ha.md
/// §6 wants it: one function for `manifests/discovery-service` and for what the
/// operator renders for a DiscoveryService. Returns its Deployment.
fn check_replicas<'a>(objs: &'a [Value], name: &str, replicas: i64) -> &'a Value {
    let resource = object_names::discovery_service(name);
    let d = find(objs, "Deployment", &resource);
    strict::<Deployment>(d).unwrap();
    let what = describe(d);
    assert_eq!(d["spec"]["replicas"], replicas, "{what}");
    let labels = pod_labels(d);
    let pod = &d["spec"]["template"]["spec"];
    let c = container(d, "discovery-service");
    let a = args(c);

    // Whatever the replica count: who the replica is (downward API), a fast readiness
    // probe, a grace that covers the drain, the spread, the priority.
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        assert_eq!(
            env(c, var).map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
            Some(&json!(field)),
            "{what}: {var} from the downward API"
        );
    }
    assert_eq!(c["readinessProbe"]["periodSeconds"], 2, "{what}");
    for drain in ["--drain-delay", "--drain-time", "--shutdown-grace"] {
        assert!(
            flag(&a, drain).is_none(),
            "{what}: {drain}: the grace below assumes the defaults"
        );
    }
    let process = marin3r_control_plane::shutdown_grace(&marin3r_xds::AdsConfig::default());
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    assert_eq!(grace, 30, "{what}");
    assert!(
        grace >= process.as_secs() + 5,
        "{what}: a termination grace of {grace} s must cover the discovery service's own {process:?} with a margin"
    );
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no topologySpreadConstraints"));
    let over = |key: &str| {
        spread
            .iter()
            .find(|t| t["topologyKey"] == key)
            .unwrap_or_else(|| panic!("{what}: not spread over {key}"))
    };
    for (key, when) in [
        ("kubernetes.io/hostname", "DoNotSchedule"),
        ("topology.kubernetes.io/zone", "ScheduleAnyway"),
    ] {
        let t = over(key);
        assert_eq!(
            (&t["maxSkew"], &t["whenUnsatisfiable"]),
            (&json!(1), &json!(when)),
            "{what}: {key}"
        );
        assert!(
            selects(&t["labelSelector"], &labels),
            "{what}: {key} selects the pods"
        );
    }
    assert_eq!(
        over("kubernetes.io/hostname")["nodeTaintsPolicy"],
        "Honor",
        "{what}: tainted nodes (a control plane) must not count as empty domains"
    );
    assert_eq!(
        pod["priorityClassName"],
        object_names::DISCOVERY_SERVICE_PRIORITY_CLASS,
        "{what}"
    );

    // What depends on the replica count: rollout, Lease, budget, Role.
    let ha = replicas > 1;
    let budget =
        of_kind(objs, "PodDisruptionBudget").find(|p| p["metadata"]["name"] == resource.as_str());
    let role = role_access(find(objs, "Role", &resource));
    let lease = object_names::discovery_service_lease(name);
    assert_eq!(
        role,
        named_grants(marin3r_kube::rbac::discovery_service(ha), name),
        "{what}: the Role"
    );
    if ha {
        assert_eq!(d["spec"]["minReadySeconds"], 10, "{what}");
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
            "{what}"
        );
        assert!(a.contains(&"--leader-elect"), "{what}: {a:?}");
        assert_eq!(flag(&a, "--discovery-service-name"), Some(name), "{what}");
        assert!(
            role.contains(&(
                "coordination.k8s.io".to_string(),
                "leases".to_string(),
                "patch".to_string(),
                Some(lease)
            )),
            "{what}: the Lease rule is restricted to marin3r-{name}-leader"
        );
        let budget = budget.unwrap_or_else(|| panic!("{what}: no PodDisruptionBudget {resource}"));
        let spec = strict::<PodDisruptionBudget>(budget).unwrap().spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)), "{what}");
        assert!(spec.min_available.is_none(), "{what}");
        assert_eq!(
            spec.unhealthy_pod_eviction_policy.as_deref(),
            Some("AlwaysAllow"),
            "{what}"
        );
        let selector = serde_json::to_value(spec.selector.unwrap()).unwrap();
        assert!(
            selects(&selector, &labels),
            "{what}: the budget selects the pods"
        );
    } else {
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}), "{what}");
        assert!(d["spec"]["minReadySeconds"].is_null(), "{what}");
        assert!(
            !a.contains(&"--leader-elect"),
            "{what}: one replica, no Lease"
        );
        assert!(flag(&a, "--discovery-service-name").is_none(), "{what}");
        assert!(
            budget.is_none(),
            "{what}: no PodDisruptionBudget for one replica"
        );
    }
    d
}

/// Mebibytes of a Kubernetes memory quantity (`512Mi`, `1Gi`).
fn mebibytes(quantity: &str) -> u64 {
    let (n, unit) = quantity.split_at(
        quantity
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(quantity.len()),
    );
    let n: u64 = n.parse().unwrap();
    match unit {
        "Mi" => n,
        "Gi" => n * 1024,
        other => panic!("memory in Mi or Gi, not {other:?}"),
    }
}

#[test]
fn the_discovery_service_base_runs_three_replicas_as_ha_md_6_says() {
    let objs = objects("discovery-service");
    let d = check_replicas(
        objs,
        marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE,
        3,
    );
    // Its PriorityClass comes with the CRDs (manifests/default).
    find(
        objects("default"),
        "PriorityClass",
        object_names::DISCOVERY_SERVICE_PRIORITY_CLASS,
    );
    // Memory for N − 1 replicas taking every stream, unevenly.
    let replicas = d["spec"]["replicas"].as_u64().unwrap();
    let limit = container(d, "discovery-service")["resources"]["limits"]["memory"]
        .as_str()
        .map(mebibytes)
        .unwrap();
    let per_replica = SIZED_FOR_ENVOYS.div_ceil(replicas - 1) * UNEVEN;
    let needed = BASE_MIB + (per_replica * KIB_PER_STREAM).div_ceil(1024);
    assert!(
        limit >= needed,
        "memory limit {limit} MiB: {SIZED_FOR_ENVOYS} Envoys on {} replicas ({per_replica} streams each with an uneven spread) need {needed} MiB",
        replicas - 1
    );
}

/// What the operator renders for the DiscoveryService `name` in `apps` with `spec`.
fn operator_render(name: &str, spec: Value) -> Vec<Value> {
    let doc = json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "DiscoveryService",
        "metadata": {"name": name, "namespace": "apps"}, "spec": spec,
    });
    let rendered = marin3r_operator::render::render(&[doc], &marin3r_operator::Images::default());
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    rendered.objects
}

#[test]
fn the_operator_renders_ha_md_6_for_a_discoveryservice() {
    // Default: 3, like the base.
    check_replicas(&operator_render("instance", json!({})), "instance", 3);
    check_replicas(&operator_render("edge", json!({"replicas": 5})), "edge", 5);
    // One replica: the single process it always was.
    check_replicas(&operator_render("solo", json!({"replicas": 1})), "solo", 1);
    // The PriorityClass it defaults to comes with the operator.
    find(
        objects("operator"),
        "PriorityClass",
        object_names::DISCOVERY_SERVICE_PRIORITY_CLASS,
    );
}

#[test]
fn an_injected_sidecar_finds_the_discovery_service_and_its_client_certificate() {
    let ds = objects("discovery-service");
    let kuard = find(objects("examples/kuard"), "Deployment", "kuard");
    let injected = marin3r_sidecar::workload::inject_workload(kuard, &Default::default()).unwrap();
    let init = container(&injected, "envoy-init-mgr");
    let a = args(init);
    // The example has no namespace: `marin3r inject` uses "default".
    let svc = find(ds, "Service", "marin3r-discoveryservice");
    assert_eq!(
        flag(&a, "--xdss-host"),
        Some("marin3r-discoveryservice.default.svc")
    );
    let port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "discovery")
        .unwrap();
    assert_eq!(
        flag(&a, "--xdss-port"),
        Some(port["port"].to_string().as_str())
    );
    let tls = injected["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "envoy-sidecar-tls")
        .unwrap();
    let client = find(ds, "Certificate", "envoy-sidecar-client-cert");
    assert_eq!(tls["secret"]["secretName"], client["spec"]["secretName"]);
}

// ---------------------------------------------------------------------------------------
// Examples

fn annotations(deployment: &Value) -> BTreeMap<String, String> {
    str_map(&deployment["spec"]["template"]["metadata"]["annotations"])
}

/// Every `port_value` of the listeners of an EnvoyConfig.
fn listener_ports(ec: &Value) -> BTreeSet<i64> {
    ec["spec"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["type"] == "listener")
        .filter_map(|r| r["value"]["address"]["socket_address"]["port_value"].as_i64())
        .collect()
}

#[test]
fn walkthrough_1_kuard_is_upstreams() {
    let objs = objects("examples/kuard");
    let d = find(objs, "Deployment", "kuard");
    assert_eq!(
        pod_labels(d).get(INJECTION_LABEL).map(String::as_str),
        Some(INJECTION_ENABLED)
    );
    let a = annotations(d);
    assert_eq!(a["marin3r.3scale.net/node-id"], "kuard");
    assert_eq!(a["marin3r.3scale.net/ports"], "envoy-https:8443");
    let app = container(d, "kuard");
    assert_eq!(app["image"], "gcr.io/kuar-demo/kuard-amd64:blue");
    assert_eq!(
        app["ports"],
        json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
    );
    let ec = find(objs, "EnvoyConfig", "kuard");
    assert_eq!(ec["spec"]["nodeID"], "kuard");
    assert_eq!(ec["spec"]["envoyAPI"], "v3");
    assert_eq!(
        ec["spec"]["resources"][0],
        json!({"type": "secret", "generateFromTlsSecret": "kuard-certificate", "blueprint": "tlsCertificate"})
    );
    // The TLS Secret comes from cert-manager, not from a committed key.
    assert_eq!(of_kind(objs, "Secret").count(), 0);
    let cert = find(objs, "Certificate", "kuard-certificate");
    assert_eq!(cert["spec"]["secretName"], "kuard-certificate");

    let variant = objects("examples/kuard-http");
    let a = annotations(find(variant, "Deployment", "kuard"));
    assert_eq!(a["marin3r.3scale.net/ports"], "envoy-http:8081");
    assert_eq!(a["marin3r.3scale.net/envoy-api-version"], "v3");
}

#[test]
fn example_envoyconfigs_decode_and_match_their_deployments() {
    let root = kustomize::manifests_dir().join("examples");
    // The files applied by hand in the walkthroughs: walkthrough 2's bad edit decodes
    // (only Envoy rejects it); walkthrough 1 in the deprecated `envoyResources` form.
    for file in [
        "kuard-http/broken-update.yaml",
        "kuard/envoyconfig-envoyresources.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert_eq!(
            marin3r_envoyconfig::envoyconfig::validate_file(&text),
            Ok(1),
            "manifests/examples/{file}"
        );
    }

    for (dir, objs) in rendered().iter().filter(|(d, _)| d.starts_with("examples")) {
        for obj in objs {
            assert!(
                obj["metadata"]["namespace"].is_null(),
                "manifests/{dir}: {} has a namespace",
                describe(obj)
            );
        }
        for d in of_kind(objs, "Deployment") {
            let a = annotations(d);
            let node = &a["marin3r.3scale.net/node-id"];
            let ec = of_kind(objs, "EnvoyConfig")
                .find(|ec| ec["spec"]["nodeID"] == node.as_str())
                .unwrap_or_else(|| panic!("manifests/{dir}: no EnvoyConfig for node {node}"));
            validate_envoyconfig(ec).unwrap();
            // Every listener port is declared on the Envoy container.
            let declared: BTreeSet<i64> = a["marin3r.3scale.net/ports"]
                .split(',')
                .map(|p| p.split(':').nth(1).unwrap().parse().unwrap())
                .collect();
            assert!(
                listener_ports(ec).is_subset(&declared),
                "manifests/{dir}: listeners {:?} not all in ports {declared:?}",
                listener_ports(ec)
            );
            // Every TLS Secret it reads is issued in the same kustomization.
            for r in ec["spec"]["resources"].as_array().unwrap() {
                if let Some(secret) = r["generateFromTlsSecret"].as_str() {
                    assert!(
                        of_kind(objs, "Certificate").any(|c| c["spec"]["secretName"] == secret),
                        "manifests/{dir}: no Certificate for Secret {secret}"
                    );
                }
            }
        }
    }
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

#[test]
fn example_deployments_get_the_expected_sidecar() {
    let defaults = marin3r_sidecar::Defaults::default();
    let mut seen = 0;
    for (dir, objs) in rendered()
        .iter()
        .filter(|(d, _)| d.starts_with("examples/"))
    {
        for d in of_kind(objs, "Deployment") {
            seen += 1;
            let what = format!("manifests/{dir}: {}", describe(d));
            let injected = marin3r_sidecar::workload::inject_workload(d, &defaults)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let pod = &injected["spec"]["template"]["spec"];
            let a = annotations(d);
            let shutdown_manager = a
                .get("marin3r.3scale.net/shutdown-manager.enabled")
                .is_some_and(|v| v == "true");
            let app: Vec<&str> = names(&d["spec"]["template"]["spec"]["containers"]);
            let mut expected: Vec<&str> = app.clone();
            expected.push("envoy-sidecar");
            if shutdown_manager {
                expected.push("envoy-shtdn-mgr");
            }
            assert_eq!(names(&pod["containers"]), expected, "{what}");
            assert_eq!(names(&pod["initContainers"]), ["envoy-init-mgr"], "{what}");

            let envoy = container(&injected, "envoy-sidecar");
            assert_eq!(envoy["image"], images::ENVOY, "{what}");
            let mut ports: Vec<(String, i64)> = a["marin3r.3scale.net/ports"]
                .split(',')
                .map(|p| {
                    let mut parts = p.split(':');
                    let name = parts.next().unwrap().to_string();
                    (name, parts.next().unwrap().parse().unwrap())
                })
                .collect();
            ports.push(("admin".into(), i64::from(marin3r_wire::ports::ENVOY_ADMIN)));
            let got: Vec<(String, i64)> = envoy["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap().to_string(),
                        p["containerPort"].as_i64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(got, ports, "{what}");
            let init = container(&injected, "envoy-init-mgr");
            assert_eq!(init["image"], images::MARIN3R, "{what}");
            assert_eq!(
                flag(&args(init), "--node-id"),
                Some(a["marin3r.3scale.net/node-id"].as_str())
            );
            let volumes = &pod["volumes"];
            assert_eq!(
                names(volumes),
                ["envoy-sidecar-tls", "envoy-sidecar-bootstrap"],
                "{what}"
            );
            assert_eq!(
                volumes[0]["secret"]["secretName"], "envoy-sidecar-client-cert",
                "{what}"
            );
            assert!(volumes[1]["emptyDir"].is_object(), "{what}");
            if shutdown_manager {
                assert_eq!(
                    envoy["lifecycle"]["preStop"]["httpGet"]["path"], "/shutdown",
                    "{what}"
                );
                let shtdn = container(&injected, "envoy-shtdn-mgr");
                assert_eq!(shtdn["image"], images::MARIN3R);
                assert_eq!(shtdn["lifecycle"]["preStop"]["httpGet"]["path"], "/drain");
                assert!(shtdn["livenessProbe"].is_null());
                assert_eq!(pod["terminationGracePeriodSeconds"], 300, "{what}");
            }
        }
    }
    assert_eq!(seen, 3, "kuard, kuard-http, shutdown-manager");
}

// ---------------------------------------------------------------------------------------
// Overlays of docs/install.md

/// `to` relative to `from` (both absolute), for a kustomization's `resources`.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let up = from.components().count() - 1;
    let mut out = PathBuf::new();
    for _ in 0..up {
        out.push("..");
    }
    out.join(to.strip_prefix("/").unwrap())
}

fn render_overlay(kustomization: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let base = relative(dir.path(), &kustomize::manifests_dir());
    let text = kustomization.replace("MANIFESTS", &base.display().to_string());
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    kustomize::render(dir.path()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_namespaced_discovery_service_overlay_adds_the_service_dns_names() {
    let objs = render_overlay(
        r#"
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: my-app
resources:
  - MANIFESTS/discovery-service
patches:
  - target:
      kind: Certificate
      name: marin3r-discoveryservice
    patch: |-
      - op: add
        path: /spec/dnsNames/-
        value: marin3r-discoveryservice.my-app.svc
      - op: add
        path: /spec/dnsNames/-
        value: marin3r-discoveryservice.my-app.svc.cluster.local
"#,
    );
    for obj in &objs {
        assert_eq!(obj["metadata"]["namespace"], "my-app", "{}", describe(obj));
        check_object(obj).unwrap();
    }
    let cert = find(&objs, "Certificate", "marin3r-discoveryservice");
    assert_eq!(
        strs(&cert["spec"]["dnsNames"]),
        [
            "marin3r-discoveryservice",
            "marin3r-discoveryservice.my-app.svc",
            "marin3r-discoveryservice.my-app.svc.cluster.local"
        ]
    );
    let binding = find(&objs, "RoleBinding", "marin3r-discoveryservice");
    assert!(matches!(
        binding["subjects"][0]["namespace"].as_str(),
        None | Some("my-app")
    ));
}

/// The first YAML block after `heading` in `docs/install.md`, its path to
/// `manifests/` replaced by `MANIFESTS`.
fn install_md_overlay(heading: &str) -> String {
    let doc =
        std::fs::read_to_string(kustomize::manifests_dir().join("../docs/install.md")).unwrap();
    let section = doc
        .split_once(heading)
        .unwrap_or_else(|| panic!("docs/install.md has no {heading}"))
        .1;
    let block = section.split("```yaml\n").nth(1).unwrap();
    block
        .split("```")
        .next()
        .unwrap()
        .replace("../marin3r-rs/manifests", "MANIFESTS")
}

#[test]
fn the_single_replica_overlay_of_install_md_is_the_single_process() {
    let objs = render_overlay(&install_md_overlay("### Replicas"));
    for obj in &objs {
        assert_eq!(obj["metadata"]["namespace"], "my-app", "{}", describe(obj));
        check_object(obj).unwrap();
    }
    check_replicas(
        &objs,
        marin3r_wire::object_names::DEFAULT_DISCOVERY_SERVICE,
        1,
    );
}

#[test]
fn a_mirrored_image_overlay_keeps_the_injected_image_in_step() {
    let objs = render_overlay(
        r#"
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - MANIFESTS/default
images:
  - name: quay.io/marin3r-rs/marin3r
    newName: registry.example.com/mirror/marin3r
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: marin3r-webhook
        namespace: marin3r-system
      spec:
        template:
          spec:
            containers:
              - name: webhook
                env:
                  - name: MARIN3R_MARIN3R_IMAGE
                    value: registry.example.com/mirror/marin3r:v0.1.0
"#,
    );
    let d = find(&objs, "Deployment", "marin3r-webhook");
    check_object(d).unwrap();
    let c = container(d, "webhook");
    assert_eq!(c["image"], "registry.example.com/mirror/marin3r:v0.1.0");
    assert_eq!(
        env(c, "MARIN3R_MARIN3R_IMAGE").unwrap()["value"],
        c["image"]
    );
}

// ---------------------------------------------------------------------------------------
// The operator

#[test]
fn the_operator_base_grants_exactly_what_its_controllers_use_and_is_hardened() {
    let objs = objects("operator");
    let granted = cluster_role_access(find(objs, "ClusterRole", "marin3r-operator"));
    let needed = marin3r_operator::rbac::cluster_role_access();
    let missing: Vec<_> = needed.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&needed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "ClusterRole vs operator::rbac\nmissing: {missing:?}\nextra: {extra:?}"
    );
    let lease = cluster_role_access(find(objs, "Role", "marin3r-operator-leader-election"));
    let lease_needed = marin3r_kube::grants(marin3r_operator::rbac::LEASE_RBAC);
    assert_eq!(lease, lease_needed);

    // Both bound to the Deployment's ServiceAccount, in marin3r-system.
    let d = find(objs, "Deployment", "marin3r-operator");
    assert_eq!(d["metadata"]["namespace"], SYSTEM_NAMESPACE);
    let sa = d["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    find(objs, "ServiceAccount", sa);
    let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": SYSTEM_NAMESPACE}]);
    assert_eq!(
        find(objs, "ClusterRoleBinding", "marin3r-operator")["subjects"],
        subject
    );
    assert_eq!(
        find(objs, "RoleBinding", "marin3r-operator-leader-election")["subjects"],
        subject
    );

    check_hardened(d);
    let c = container(d, "operator");
    check_probes(c);
    let a = args(c);
    assert_eq!(a[0], "operator");
    assert!(a.contains(&"--leader-elect"));
    for name in ["POD_NAME", "POD_NAMESPACE"] {
        assert!(
            env(c, name).is_some(),
            "{name}: the Lease's namespace and holder"
        );
    }
    let pod = &d["spec"]["template"]["spec"];
    assert!(
        marin3r_testkit::pod_security::container_violations(c, &pod["securityContext"]).is_empty()
    );
    // The operator's CRDs come with it.
    let crds: BTreeSet<&str> = of_kind(objs, "CustomResourceDefinition")
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    for crd in [
        "discoveryservices.operator.marin3r.3scale.net",
        "discoveryservicecertificates.operator.marin3r.3scale.net",
        "envoydeployments.operator.marin3r.3scale.net",
        "envoyconfigs.marin3r.3scale.net",
        "envoyconfigrevisions.marin3r.3scale.net",
        "discoveryservicereplicas.marin3r.3scale.net",
    ] {
        assert!(crds.contains(crd), "{crd}");
    }
}

/// Every pod template of every kustomization passes OpenShift's default SCC
/// (`marin3r_testkit::scc`, restricted-v2 in a namespace OpenShift annotated: SCC
/// mutation, then the final validation that allows no change), and marin3r's own pods
/// (the marin3r image) also Pod Security `restricted`. marin3r's pods name no user,
/// group or fsGroup (the image's numeric USER is the user on Kubernetes; restricted-v2
/// assigns one of the namespace's UIDs and refuses any other) and mount their Secrets
/// readable by any user.
#[test]
fn every_pod_template_passes_openshift_restricted_v2_and_ours_pod_security_restricted() {
    use marin3r_testkit::scc::{Scc, admit_template, example_namespace};
    let mut ours = 0;
    let mut templates = 0;
    for (dir, objs) in rendered() {
        for o in objs
            .iter()
            .filter(|o| o["spec"]["template"]["spec"].is_object())
        {
            let what = format!("manifests/{dir}: {}", describe(o));
            let template = &o["spec"]["template"];
            let admitted = admit_template(template, &example_namespace(), Scc::RestrictedV2);
            assert!(admitted.is_ok(), "{what}: {admitted:?}");
            templates += 1;
            let spec = &template["spec"];
            let marin3r = containers(o)
                .into_iter()
                .any(|c| c["image"] == images::MARIN3R);
            if !marin3r {
                continue;
            }
            ours += 1;
            let violations = marin3r_testkit::pod_security::pod_violations(spec);
            assert!(violations.is_empty(), "{what}: {violations:?}");
            let contexts = std::iter::once(&spec["securityContext"])
                .chain(containers(o).into_iter().map(|c| &c["securityContext"]));
            for sc in contexts {
                for field in ["runAsUser", "runAsGroup", "fsGroup"] {
                    assert!(sc[field].is_null(), "{what}: {field} is set");
                }
            }
            for v in spec["volumes"].as_array().into_iter().flatten() {
                if let Some(mode) = v["secret"]["defaultMode"].as_i64() {
                    assert!(mode == 0o444 || mode == 0o644, "{what}: mode {mode:o}");
                }
            }
        }
    }
    assert!(ours >= 3, "only {ours} marin3r pod templates");
    assert!(templates >= 5, "only {templates} pod templates");
}
