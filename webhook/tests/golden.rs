//! Golden injection tests (Istio style): every
//! `webhook/tests/fixtures/injection/<case>/input.yaml` Pod goes through the real HTTP
//! handler as an AdmissionReview. The returned base64 JSONPatch is applied to the input and
//! must give `expected.yaml`; or the review must be denied exactly as `denied.yaml` says.
//! Every injected result then goes through the handler again and must come back unchanged
//! (idempotency).
//!
//! A case with an `scc.yaml` (`scc: <name>`, `namespaceAnnotations: {…}`) is a Pod as
//! OpenShift's SCC admission hands it to the webhook: its input must be what that SCC
//! makes of a Pod, and the injected Pod must pass the SCC's second pass and final
//! validation (`marin3r_testkit::scc`). Besides, every allowed case goes through the
//! whole OpenShift admission (SCC, webhook, SCC again) under each modelled SCC that
//! admits its input ([`every_case_passes_openshift_admission`]).
//!
//! `UPDATE_GOLDEN=1 cargo test -p marin3r-webhook --test golden` rewrites the expected
//! files; review every diff before committing it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use base64::Engine as _;
use serde_json::{Value, json};

mod common;

use marin3r_sidecar::Defaults;
use marin3r_testkit::admission::{Review, UID};
use marin3r_testkit::golden;
use marin3r_testkit::pod_security::{container_violations, volume_violations};
use marin3r_testkit::scc::{self, Scc};
use marin3r_webhook::MUTATE_PATH;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/injection")
}

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn defaults() -> Defaults {
    Defaults {
        envoy_image: "envoyproxy/envoy:v1.40.0".into(),
        discovery_service: "discoveryservice".into(),
        marin3r_image: "quay.io/marin3r-rs/marin3r:v0.1.0".into(),
    }
}

/// Sends one review through the router and returns the AdmissionResponse.
async fn admit(pod: &Value, namespace: &str) -> Value {
    let body = Review::pod(pod.clone()).namespace(namespace).bytes();
    let (status, out) = common::post(common::state_with(defaults()), MUTATE_PATH, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(out["response"]["uid"], UID);
    assert_eq!(UID, "705ab4f5-6393-11e8-b7cc-42010a800002");
    out["response"].clone()
}

/// Applies the response's patch (if any) to `pod`.
fn apply(pod: &Value, response: &Value) -> Value {
    let mut out = pod.clone();
    match response.get("patch") {
        None => assert!(
            response.get("patchType").is_none(),
            "patchType without patch"
        ),
        Some(p) => {
            assert_eq!(response["patchType"], "JSONPatch");
            let b64 = p.as_str().expect("patch must be a base64 string");
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&raw).unwrap();
            json_patch::patch(&mut out, &patch).unwrap();
        }
    }
    out
}

/// `got` against the golden YAML file `path`: equal once both are parsed
/// ([`golden::check_by`]; `UPDATE_GOLDEN=1` rewrites the file).
fn check_yaml(path: &Path, got: &Value) -> Result<(), String> {
    let text = serde_saphyr::to_string(got).unwrap();
    golden::check_by(path, &text, |_, want| {
        serde_saphyr::from_str::<Value>(want).is_ok_and(|want| want == *got)
    })
}

async fn run_case(dir: &Path) -> Result<(), String> {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let input = read_yaml(&dir.join("input.yaml"));
    let namespace = std::fs::read_to_string(dir.join("namespace"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "default".into());
    let response = admit(&input, &namespace).await;
    let expected_path = dir.join("expected.yaml");
    let denied_path = dir.join("denied.yaml");

    if response["allowed"] == false {
        let got =
            json!({"code": response["status"]["code"], "message": response["status"]["message"]});
        if expected_path.exists() {
            return Err(format!("{name}: denied unexpectedly: {got}"));
        }
        check_yaml(&denied_path, &got).map_err(|e| format!("{name}: denial: {e}"))?;
        assert!(
            response.get("patch").is_none(),
            "{name}: a denial carries no patch"
        );
        return Ok(());
    }

    let injected = apply(&input, &response);
    if denied_path.exists() {
        return Err(format!("{name}: allowed, but the case expects a denial"));
    }
    check_yaml(&expected_path, &injected).map_err(|e| format!("{name}: injected pod: {e}"))?;

    let scc_file = dir.join("scc.yaml");
    let admitted_by = if scc_file.exists() {
        let file = read_yaml(&scc_file);
        let scc = Scc::from_name(file["scc"].as_str().unwrap()).unwrap();
        let ns = &file["namespaceAnnotations"];
        // The input is what the SCC makes of a Pod: a second pass changes nothing.
        let again = scc::admit(&input, ns, scc).map_err(|e| format!("{name}: {e:?}"))?;
        if again != input {
            return Err(format!(
                "{name}: input.yaml is not what {} makes of it",
                scc.name()
            ));
        }
        let stored = scc::admit_with_webhook(&input, ns, scc, |seen| {
            assert_eq!(seen, &input);
            injected.clone()
        })
        .map_err(|e| format!("{name}: refused by SCC after injection: {e:?}"))?;
        CHECKED_SCC.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((scc, stored))
    } else {
        None
    };
    let breaches = restricted_breaches(&injected, admitted_by.as_ref().map(|(scc, _)| *scc));
    if !breaches.is_empty() {
        return Err(format!("{name}: not Pod Security restricted: {breaches:?}"));
    }

    // Idempotency: the injected Pod goes through again and comes back unchanged.
    let again = admit(&injected, &namespace).await;
    if again["allowed"] != true || again.get("patch").is_some() {
        return Err(format!("{name}: second pass is not a no-op: {again}"));
    }
    Ok(())
}

/// [`generated_container_breaches`], but for a Pod an SCC without seccomp (anyuid, the
/// legacy restricted) admitted: there the Pod as a whole cannot carry a seccomp profile
/// (the SCC refuses any), so Pod Security `restricted` cannot hold for it (OpenShift
/// labels such namespaces for a lower level); every other rule still must.
fn restricted_breaches(pod: &Value, admitted_by: Option<Scc>) -> Vec<String> {
    let no_seccomp = admitted_by.is_some_and(|scc| !scc.allows_seccomp());
    generated_container_breaches(pod)
        .into_iter()
        .filter(|b| !(no_seccomp && b.contains("seccompProfile")))
        .collect()
}

/// Cases run through the SCC model by their `scc.yaml`.
static CHECKED_SCC: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Generated containers checked by [`generated_container_breaches`] (so that the check
/// cannot pass by finding none).
static CHECKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What breaks Pod Security `restricted` (or our read-only root filesystem rule) in the
/// containers injection generates (Envoy, the init manager, the shutdown manager).
fn generated_container_breaches(pod: &Value) -> Vec<String> {
    let spec = &pod["spec"];
    let generated = |c: &&Value| {
        let name = c["name"].as_str().unwrap_or_default();
        name == marin3r_sidecar::generate::INIT_MANAGER_NAME
            || name == marin3r_sidecar::generate::SHUTDOWN_MANAGER_NAME
            || (c["command"] == json!(["envoy"])
                && c["args"][1] == marin3r_wire::paths::ENVOY_BOOTSTRAP_FILE)
    };
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .filter(generated)
        .collect();
    CHECKED.fetch_add(containers.len(), std::sync::atomic::Ordering::Relaxed);
    let mut out = Vec::new();
    for c in containers {
        out.extend(container_violations(c, &spec["securityContext"]));
        if c["securityContext"]["readOnlyRootFilesystem"] != true {
            out.push(format!("{}: readOnlyRootFilesystem is not true", c["name"]));
        }
    }
    // The volumes injection added (named in its status): types `restricted` allows.
    let status: Value = pod["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let injected: Vec<&str> = status["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .chain(
            status["extraVolumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["name"].as_str()),
        )
        .collect();
    let volumes: Vec<&Value> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"].as_str().is_some_and(|n| injected.contains(&n)))
        .collect();
    CHECKED_VOLUMES.fetch_add(volumes.len(), std::sync::atomic::Ordering::Relaxed);
    out.extend(volume_violations(&json!({ "volumes": volumes })));
    out
}

/// Injected volumes checked by [`generated_container_breaches`].
static CHECKED_VOLUMES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[tokio::test]
async fn golden_injection_cases() {
    let dirs = case_dirs();
    assert!(
        dirs.len() >= 25,
        "expected at least 25 golden cases, found {}",
        dirs.len()
    );
    let mut failures = Vec::new();
    for dir in &dirs {
        if let Err(e) = run_case(dir).await {
            failures.push(e);
        }
    }
    assert!(
        CHECKED.load(std::sync::atomic::Ordering::Relaxed) >= 2 * 25,
        "the restricted check saw too few generated containers"
    );
    assert!(
        CHECKED_VOLUMES.load(std::sync::atomic::Ordering::Relaxed) >= 2 * 25,
        "the restricted check saw too few injected volumes"
    );
    assert!(
        CHECKED_SCC.load(std::sync::atomic::Ordering::Relaxed) >= 3,
        "too few cases went through the SCC model"
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n\n")
    );
}

fn case_dirs() -> Vec<PathBuf> {
    golden::cases(&fixtures())
}

/// Whether a Pod uses the host's ports or network (which restricted-v2 refuses).
fn uses_host(pod: &Value) -> bool {
    let spec = &pod["spec"];
    spec["hostNetwork"] == true
        || ["containers", "initContainers"].iter().any(|k| {
            spec[*k].as_array().into_iter().flatten().any(|c| {
                c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["hostPort"].as_i64().is_some_and(|h| h > 0))
            })
        })
}

/// Every case the webhook allows, as it would go on OpenShift under each modelled SCC
/// that admits its input: SCC admission, the webhook (the real handler) on the Pod SCC
/// mutated, SCC again and its final validation; then Pod Security `restricted` on the
/// generated containers (but seccomp under an SCC that refuses one), and idempotency
/// where SCC leaves the generated containers as they are. A Pod with a host port needs a
/// hostPort-capable SCC (hostnetwork-v2): restricted-v2 must refuse it, in OpenShift's
/// words.
#[tokio::test]
async fn every_case_passes_openshift_admission() {
    let ns = scc::example_namespace();
    let mut failures = Vec::new();
    let mut admitted: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut host_port_refusals = 0;
    for dir in case_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        if !dir.join("expected.yaml").exists() || dir.join("scc.yaml").exists() {
            continue; // denied cases; cases already admitted by their own SCC
        }
        let input = read_yaml(&dir.join("input.yaml"));
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "default".into());
        let vanilla = read_yaml(&dir.join("expected.yaml"));
        let host = uses_host(&vanilla);
        let sccs: &[Scc] = if host {
            &[Scc::HostnetworkV2]
        } else {
            &[
                Scc::RestrictedV2,
                Scc::Restricted,
                Scc::NonrootV2,
                Scc::Anyuid,
            ]
        };
        for &scc in sccs {
            let Ok(seen) = scc::admit(&input, &ns, scc) else {
                continue; // the app itself is not admissible under this SCC
            };
            let response = admit(&seen, &namespace).await;
            if response["allowed"] != true {
                failures.push(format!("{name} under {}: denied: {response}", scc.name()));
                continue;
            }
            let injected = apply(&seen, &response);
            let stored = match scc::admit_with_webhook(&input, &ns, scc, |_| injected.clone()) {
                Ok(stored) => stored,
                Err(e) => {
                    failures.push(format!("{name} under {}: {e:?}", scc.name()));
                    continue;
                }
            };
            let breaches = restricted_breaches(&stored, Some(scc));
            if !breaches.is_empty() {
                failures.push(format!("{name} under {}: {breaches:?}", scc.name()));
            }
            if matches!(scc, Scc::RestrictedV2 | Scc::HostnetworkV2 | Scc::NonrootV2) {
                let again = admit(&stored, &namespace).await;
                if again["allowed"] != true || again.get("patch").is_some() {
                    failures.push(format!("{name} under {}: second pass: {again}", scc.name()));
                }
            }
            *admitted.entry(scc.name()).or_default() += 1;
        }
        if host {
            // Refused before the webhook (an app's own host port) or after it.
            let errors = match scc::admit(&input, &ns, Scc::RestrictedV2) {
                Err(errors) => errors,
                Ok(seen) => {
                    let injected = apply(&seen, &admit(&seen, &namespace).await);
                    scc::admit_with_webhook(&input, &ns, Scc::RestrictedV2, |_| injected)
                        .unwrap_err()
                }
            };
            assert!(
                errors
                    .iter()
                    .any(|e| e.ends_with("Host ports are not allowed to be used")),
                "{name}: {errors:?}"
            );
            // With hostnetwork-v2 usable too, SCC admission moves the Pod there (on its
            // second pass when only the sidecar's ports need it).
            let both = [Scc::RestrictedV2, Scc::HostnetworkV2];
            let seen = scc::admit_any(&input, &ns, &both).unwrap();
            let injected = apply(&seen, &admit(&seen, &namespace).await);
            let stored = scc::admit_with_webhook_any(&input, &ns, &both, |_| injected).unwrap();
            assert_eq!(
                stored["metadata"]["annotations"]["openshift.io/scc"], "hostnetwork-v2",
                "{name}"
            );
            host_port_refusals += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    for scc in [
        Scc::RestrictedV2,
        Scc::Restricted,
        Scc::NonrootV2,
        Scc::Anyuid,
    ] {
        let n = admitted.get(scc.name()).copied().unwrap_or_default();
        assert!(n >= 20, "only {n} cases were admitted under {}", scc.name());
    }
    assert!(admitted.get("hostnetwork-v2").copied().unwrap_or_default() >= 2);
    assert!(host_port_refusals >= 2);
}
