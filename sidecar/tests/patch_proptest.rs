//! The admission patch is built from what injection adds and removes
//! ([`Injection::patch`]), not from a diff of two trees. These properties prove it is
//! exact: applying the patch to the input gives exactly [`Injection::into_pod`], for every
//! golden input of the webhook and for generated Pods (user containers with and without
//! lifecycles and unknown fields, absent or `null` lists, grace periods, the shutdown
//! manager on or off, native sidecars), and for re-injections of the injected Pods with
//! the same or changed annotations. Re-injecting with the same annotations is an empty
//! patch. The patch the webhook writes (added objects serialised once, `plan_pod_as` with
//! `Box<RawValue>`) is checked to be that same patch in every case.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use marin3r_sidecar::{Defaults, Plan, plan_pod, plan_pod_as};
use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// The patch of `pod` as the webhook writes it (added objects serialised once), read back;
/// `None` when there is none. It must be byte for byte what `json_patch` writes for
/// `Injection::patch` as a `json_patch::Patch`, and so must the `Value` form's own writer.
fn written_patch(pod: &Value) -> Option<json_patch::Patch> {
    let plan = || plan_pod(pod, Some("ns"), &Defaults::default());
    let (Ok(Plan::Inject(a)), Ok(Plan::Inject(b))) = (plan(), plan()) else {
        return None;
    };
    let want = String::from_utf8(serde_json::to_vec(&json_patch::Patch::from(b.patch())).unwrap())
        .unwrap();
    let text = |bytes| String::from_utf8(bytes).unwrap();
    assert_eq!(text(a.patch().to_json().unwrap()), want);
    match plan_pod_as::<Box<RawValue>>(pod, Some("ns"), &Defaults::default()) {
        Ok(Plan::Inject(raw)) => {
            let written = text(raw.patch().to_json().unwrap());
            assert_eq!(written, want, "written patch of {pod}");
            Some(serde_json::from_str(&written).unwrap())
        }
        other => panic!("the two forms planned {pod} differently: {other:?}"),
    }
}

/// Plans `pod`; for an injection, checks that its patch applied to `pod` gives its Pod
/// and returns that Pod.
fn check(pod: &Value) -> Option<Value> {
    let plan = || plan_pod(pod, Some("ns"), &Defaults::default());
    let Ok(Plan::Inject(injection)) = plan() else {
        return None;
    };
    let Ok(Plan::Inject(again)) = plan() else {
        panic!("planning {pod} twice gave two answers");
    };
    let injected = again.into_pod();
    let mut patched = pod.clone();
    let patch = json_patch::Patch::from(injection.patch());
    json_patch::patch(&mut patched, &patch)
        .unwrap_or_else(|e| panic!("patch {patch:?} does not apply to {pod}: {e}"));
    assert_eq!(patched, injected, "patch {patch:?} on {pod}");
    assert_eq!(written_patch(pod), Some(patch), "written patch of {pod}");
    Some(injected)
}

/// Checks `pod`, then re-injects the result: unchanged annotations give an empty patch,
/// and each of `variants` (annotation overrides) applied to the injected Pod is checked.
fn check_with_reinjection(pod: &Value, variants: &[Map<String, Value>]) {
    let Some(injected) = check(pod) else {
        return;
    };
    match plan_pod(&injected, Some("ns"), &Defaults::default()) {
        Ok(Plan::Inject(again)) => {
            assert_eq!(
                json_patch::Patch::from(again.patch()).0,
                vec![],
                "re-injecting {injected}"
            );
            assert_eq!(
                written_patch(&injected).map(|p| p.0),
                Some(vec![]),
                "re-injecting {injected}"
            );
        }
        other => panic!("re-injecting {injected}: {other:?}"),
    }
    for overrides in variants {
        let mut changed = injected.clone();
        let annotations = changed["metadata"]["annotations"].as_object_mut().unwrap();
        for (k, v) in overrides {
            match v {
                Value::Null => annotations.remove(k),
                v => annotations.insert(k.clone(), v.clone()),
            };
        }
        check(&changed);
    }
}

#[test]
fn golden_inputs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../webhook/tests/fixtures/injection");
    let (mut injected, mut expected) = (0, 0);
    for case in std::fs::read_dir(&dir).unwrap() {
        let case = case.unwrap().path();
        let text = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let pod: Value = serde_saphyr::from_str(&text).unwrap();
        if check(&pod).is_some() {
            injected += 1;
        }
        check_with_reinjection(&pod, &[]);
        // Cases with an `expected.yaml` inject (or allow unchanged); the rest are denials.
        if case.join("expected.yaml").exists() {
            expected += 1;
        }
    }
    assert!(injected > 0);
    assert!(
        injected <= expected,
        "{injected} injected, {expected} expected"
    );
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("app".to_string()),
        Just("web".to_string()),
        Just("envoy-sidecar".to_string()),
        Just("envoy-init-mgr".to_string()),
        "[a-z]{1,3}",
    ]
}

fn lifecycle() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        Just(Some(json!({"postStart": {"exec": {"command": ["true"]}}}))),
        Just(Some(
            json!({"preStop": {"httpGet": {"path": "/drain", "port": 8090}}})
        )),
        Just(Some(
            json!({"preStop": {"exec": {"command": ["sleep", "5"]}},
                         "postStart": {"exec": {"command": ["true"]}}})
        )),
    ]
}

fn container() -> impl Strategy<Value = Value> {
    (name(), lifecycle(), any::<bool>(), any::<bool>()).prop_map(
        |(name, lifecycle, unknown, mounts)| {
            let mut c = json!({"name": name, "image": "img:1"});
            if let Some(l) = lifecycle {
                c["lifecycle"] = l;
            }
            if unknown {
                c["futureField"] = json!({"x": [1, 2]});
            }
            if mounts {
                c["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
            }
            c
        },
    )
}

/// An optional list: absent, `null`, or entries.
fn list(entries: impl Strategy<Value = Value>) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        prop::collection::vec(entries, 0..3).prop_map(|v| Some(Value::Array(v))),
    ]
}

fn annotations() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::option::of(prop_oneof![Just("true"), Just("false")]),
        prop::option::of(prop_oneof![Just("app"), Just("web"), Just("app,web")]),
        prop::option::of(prop_oneof![Just("true"), Just("false")]),
        prop::option::of(prop_oneof![Just("10"), Just("600")]),
    )
        .prop_map(|(shtdn, hooks, native, drain)| {
            let mut a = Map::new();
            a.insert("marin3r.3scale.net/node-id".into(), json!("node"));
            let mut put = |k: &str, v: Option<&str>| {
                if let Some(v) = v {
                    a.insert(format!("marin3r.3scale.net/{k}"), json!(v));
                }
            };
            put("shutdown-manager.enabled", shtdn);
            put("shutdown-manager.extra-lifecycle-hooks", hooks);
            put("native-sidecar", native);
            put("shutdown-manager.drain-time", drain);
            a
        })
}

fn pod() -> impl Strategy<Value = Value> {
    (
        // Container names are unique in a Pod (the API server refuses duplicates).
        prop::collection::vec(container(), 1..4).prop_map(|mut cs| {
            let mut seen = std::collections::BTreeSet::new();
            cs.retain(|c| seen.insert(c["name"].to_string()));
            cs
        }),
        list(container()),
        list(prop_oneof![
            Just(json!({"name": "data", "emptyDir": {}})),
            Just(json!({"name": "cfg", "configMap": {"name": "c"}})),
        ]),
        prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            (0i64..700).prop_map(|v| Some(json!(v))),
        ],
        annotations(),
    )
        .prop_map(|(containers, init, volumes, grace, annotations)| {
            let mut spec = json!({"containers": containers, "futureSpecField": true});
            if let Some(init) = init {
                spec["initContainers"] = init;
            }
            if let Some(volumes) = volumes {
                spec["volumes"] = volumes;
            }
            if let Some(grace) = grace {
                spec["terminationGracePeriodSeconds"] = grace;
            }
            json!({
                "metadata": {"name": "p", "labels": {marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED},
                             "annotations": annotations},
                "spec": spec
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_patch_gives_exactly_the_injected_pod(pod in pod(), changes in annotations()) {
        let mut overrides = changes;
        // Keys the new annotations do not set are removed on re-injection.
        for k in [
            "shutdown-manager.enabled",
            "shutdown-manager.extra-lifecycle-hooks",
            "native-sidecar",
            "shutdown-manager.drain-time",
        ] {
            overrides
                .entry(format!("marin3r.3scale.net/{k}"))
                .or_insert(Value::Null);
        }
        check_with_reinjection(&pod, &[overrides]);
    }

    #[test]
    fn a_forged_status_is_patched_exactly(pod in pod(), status in prop_oneof![
        Just(r#"{"containers":["app"],"initContainers":["web"],"volumes":["data"]}"#),
        Just(r#"{"containers":["app"],"preStopHooks":[{"container":"app"}],"terminationGracePeriod":{"injected":5}}"#),
        Just("not json"),
    ]) {
        let mut pod = pod;
        pod["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION] = json!(status);
        check(&pod);
    }
}
