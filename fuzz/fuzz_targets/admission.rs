//! The AdmissionReview HTTP handler body: arbitrary bytes into both admission cores
//! (`/pod-v1-mutate` and the EnvoyConfig validating webhook). When the bytes are JSON,
//! they are also wrapped as the `request.object` of a well-formed Pod CREATE review, so
//! the fuzzer reaches the mutation behind the envelope checks. Property: never a panic;
//! an answer is either a 400 (`BadRequest`) or an AdmissionReview echoing the uid, and
//! an injected answer carries a base64 JSON patch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use marin3r_sidecar::Defaults;
use marin3r_webhook::admission::{self, Outcome};
use marin3r_webhook::validation;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let defaults = Defaults::default();
    let _ = admission::parse(data);
    let _ = admission::mutate(data, &defaults);
    let _ = validation::validate(data);

    let Ok(object) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for kind in [
        json!({"group": "", "version": "v1", "kind": "Pod"}),
        json!({"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"}),
    ] {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "fuzz", "kind": kind, "namespace": "ns",
                        "operation": "CREATE", "object": object}
        });
        let Ok(body) = serde_json::to_vec(&review) else {
            return;
        };
        match admission::mutate(&body, &defaults) {
            Ok((out, outcome)) => {
                assert_eq!(out.response.uid, "fuzz");
                if outcome == Outcome::Injected {
                    assert!(out.response.allowed);
                    assert_eq!(out.response.patch_type.as_deref(), Some("JSONPatch"));
                    assert!(out.response.patch.is_some());
                }
            }
            // Only possible when the wrapped object is nested beyond serde_json's limit.
            Err(e) => assert!(e.0.contains("recursion limit"), "{e}"),
        }
        if let Ok((out, _)) = validation::validate(&body) {
            assert_eq!(out.response.uid, "fuzz");
        }
    }
});
