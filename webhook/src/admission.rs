//! The sans-I/O admission core: AdmissionReview v1 bytes in, AdmissionReview v1 out.
//!
//! Shared by both admission paths: [`parse`] (a body that is not an AdmissionReview v1
//! with a request uid is a [`BadRequest`], HTTP 400) and the response envelope
//! [`ReviewOut`]. This module also holds the Pod mutation ([`mutate`]); the EnvoyConfig
//! validation is in [`crate::validation`].
//!
//! A parsed Pod review gets a well-formed answer: allowed unchanged (not a Pod, not a
//! CREATE, not labelled), allowed with a JSON patch, or denied with the aggregated
//! validation message. The response type is our own: kube 5.0's `AdmissionResponse`
//! serialises the patch as an array of numbers (kube-rs #1781), while the API server
//! expects a base64 string.

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use marin3r_sidecar::{Defaults, Plan, SkipReason, plan_pod_as};
use marin3r_wire::quote::{MAX_MESSAGE_BYTES, bounded_to, quoted};

/// The only AdmissionReview version the webhook speaks.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// AdmissionReview kind.
pub const KIND: &str = "AdmissionReview";

/// A request the webhook cannot answer with an AdmissionReview: HTTP 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Why a review was allowed without changes (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    NotAPod,
    NotCreate,
    Subresource,
    Sidecar(SkipReason),
    /// Injection produced no change (the Pod already had exactly this sidecar).
    Unchanged,
}

impl Skip {
    /// Stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotAPod => "not_a_pod",
            Skip::NotCreate => "not_create",
            Skip::Subresource => "subresource",
            Skip::Sidecar(r) => r.as_str(),
            Skip::Unchanged => "unchanged",
        }
    }
}

/// Why a Pod was denied (the `reason` label of `marin3r_webhook_denials_total`): a
/// fixed set of codes, never the message (which quotes the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// `request.object` is not a JSON object.
    NotAPodObject,
    /// One or more `marin3r.3scale.net/*` annotations are invalid.
    InvalidAnnotations,
    /// The Pod itself is malformed (a field injection needs).
    InvalidPod,
    /// Anything else injection refused.
    Other,
}

impl DenyReason {
    /// Every reason, for metrics that show each one from the start.
    pub const ALL: [DenyReason; 4] = [
        DenyReason::NotAPodObject,
        DenyReason::InvalidAnnotations,
        DenyReason::InvalidPod,
        DenyReason::Other,
    ];

    /// Why injection refused the Pod with `error`.
    pub fn of(error: &marin3r_sidecar::Error) -> Self {
        match error {
            marin3r_sidecar::Error::Annotations(_) => DenyReason::InvalidAnnotations,
            marin3r_sidecar::Error::InvalidPod { .. } => DenyReason::InvalidPod,
            _ => DenyReason::Other,
        }
    }

    /// Stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::NotAPodObject => "not_a_pod_object",
            DenyReason::InvalidAnnotations => "invalid_annotations",
            DenyReason::InvalidPod => "invalid_pod",
            DenyReason::Other => "other",
        }
    }
}

/// What happened to one review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Injected,
    Skipped(Skip),
    Denied(DenyReason),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<RequestIn>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn {
    uid: Option<String>,
    kind: Option<Gvk>,
    sub_resource: Option<String>,
    namespace: Option<String>,
    operation: Option<String>,
    object: Option<Value>,
    old_object: Option<Value>,
}

/// The group/version/kind of the object under review (`request.kind`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Gvk {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

impl Gvk {
    /// True when this is exactly `group`/`version`, `kind`.
    pub fn is(&self, group: &str, version: &str, kind: &str) -> bool {
        self.group == group && self.version == version && self.kind == kind
    }
}

/// The parts of an AdmissionReview v1 request the webhooks read (see [`parse`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionRequest {
    /// Non-empty; echoed in the response.
    pub uid: String,
    pub kind: Option<Gvk>,
    pub sub_resource: Option<String>,
    pub namespace: Option<String>,
    pub operation: Option<String>,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
}

impl AdmissionRequest {
    /// True when `request.kind` is exactly `group`/`version`, `kind`.
    pub fn is_kind(&self, group: &str, version: &str, kind: &str) -> bool {
        self.kind
            .as_ref()
            .is_some_and(|k| k.is(group, version, kind))
    }

    /// True for a request on a subresource (`status`, `eviction`, …).
    pub fn is_subresource(&self) -> bool {
        self.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// Parses an AdmissionReview v1 body: a [`BadRequest`] unless it is a JSON object with
/// `apiVersion: admission.k8s.io/v1`, `kind: AdmissionReview` and a request with a uid.
/// Shared by every admission path.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, BadRequest> {
    // Checking UTF-8 once for the whole body is cheaper than for every string in it; a
    // body that is not UTF-8 is read as bytes for serde_json's own error.
    let input: Result<ReviewIn, _> = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    };
    let input = input
        .map_err(|e| BadRequest(format!("body is not an AdmissionReview JSON object: {e}")))?;
    if input.api_version.as_deref() != Some(API_VERSION) || input.kind.as_deref() != Some(KIND) {
        return Err(BadRequest(format!(
            "expected apiVersion {API_VERSION:?} and kind {KIND:?}, got apiVersion {} and kind {}",
            quoted(&input.api_version.unwrap_or_default()),
            quoted(&input.kind.unwrap_or_default())
        )));
    }
    let request = input
        .request
        .ok_or_else(|| BadRequest("AdmissionReview has no request".into()))?;
    let uid = request
        .uid
        .filter(|u| !u.is_empty())
        .ok_or_else(|| BadRequest("request.uid is missing".into()))?;
    Ok(AdmissionRequest {
        uid,
        kind: request.kind,
        sub_resource: request.sub_resource,
        namespace: request.namespace,
        operation: request.operation,
        object: request.object,
        old_object: request.old_object,
    })
}

/// `AdmissionReview` v1 response envelope.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    pub api_version: String,
    pub kind: String,
    pub response: Response,
}

/// `AdmissionResponse` with the patch as a base64 string.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Base64Patch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// The `metav1.Status` of a denial.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub status: String,
    pub code: u16,
    pub reason: String,
    pub message: String,
}

/// The base64 `patch` of a [`Response`]. It only ever holds base64 text, which never
/// needs escaping in JSON: [`ReviewOut::to_json`] writes it as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Base64Patch(String);

impl Base64Patch {
    /// The base64 encoding of `patch` (the JSON patch bytes).
    pub fn encode(patch: &[u8]) -> Self {
        // Into a String of the right size: `Engine::encode` zero-fills its buffer first.
        let len = base64::encoded_len(patch.len(), true).unwrap_or_default();
        let mut text = String::with_capacity(len);
        base64::engine::general_purpose::STANDARD.encode_string(patch, &mut text);
        Self(text)
    }

    /// The base64 text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Base64Patch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        {
            return Err(serde::de::Error::custom("patch is not base64"));
        }
        Ok(Self(text))
    }
}

impl ReviewOut {
    fn new(response: Response) -> Self {
        Self {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            response,
        }
    }

    /// The review as JSON: exactly what `serde_json::to_vec` writes, but the base64 patch
    /// is copied in as it is instead of being scanned for characters to escape. Every
    /// field of [`ReviewOut`] and [`Response`] is written here, in declaration order.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let r = &self.response;
        let patch = r.patch.as_ref().map_or(0, |p| p.0.len());
        let mut out = Vec::with_capacity(patch + 256);
        out.extend_from_slice(b"{\"apiVersion\":");
        serde_json::to_writer(&mut out, &self.api_version)?;
        out.extend_from_slice(b",\"kind\":");
        serde_json::to_writer(&mut out, &self.kind)?;
        out.extend_from_slice(b",\"response\":{\"uid\":");
        serde_json::to_writer(&mut out, &r.uid)?;
        out.extend_from_slice(if r.allowed {
            b",\"allowed\":true"
        } else {
            b",\"allowed\":false"
        });
        if let Some(patch_type) = &r.patch_type {
            out.extend_from_slice(b",\"patchType\":");
            serde_json::to_writer(&mut out, patch_type)?;
        }
        if let Some(patch) = &r.patch {
            out.extend_from_slice(b",\"patch\":\"");
            out.extend_from_slice(patch.0.as_bytes());
            out.push(b'"');
        }
        if let Some(status) = &r.status {
            out.extend_from_slice(b",\"status\":");
            serde_json::to_writer(&mut out, status)?;
        }
        out.extend_from_slice(b"}}");
        Ok(out)
    }

    /// Allowed, unchanged.
    pub fn allow(uid: String) -> Self {
        Self::new(Response {
            uid,
            allowed: true,
            patch_type: None,
            patch: None,
            status: None,
        })
    }

    /// Denied with `code` (403 → `Forbidden`, else `BadRequest`) and `message`, bounded
    /// to [`MAX_MESSAGE_BYTES`]: whatever request values it quotes, a denial stays small.
    pub fn deny(uid: String, code: u16, message: String) -> Self {
        let message = match bounded_to(&message, MAX_MESSAGE_BYTES) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(cut) => cut,
        };
        let reason = if code == 403 {
            "Forbidden"
        } else {
            "BadRequest"
        };
        Self::new(Response {
            uid,
            allowed: false,
            patch_type: None,
            patch: None,
            status: Some(Status {
                status: "Failure".into(),
                code,
                reason: reason.into(),
                message,
            }),
        })
    }
}

fn strip_managed_fields(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
}

/// Handles one AdmissionReview body of the Pod mutating webhook (`/pod-v1-mutate`).
pub fn mutate(body: &[u8], defaults: &Defaults) -> Result<(ReviewOut, Outcome), BadRequest> {
    let request = parse(body)?;
    let uid = request.uid.clone();
    if !request.is_kind("", "v1", "Pod") {
        return Ok((ReviewOut::allow(uid), Outcome::Skipped(Skip::NotAPod)));
    }
    if request.is_subresource() {
        return Ok((ReviewOut::allow(uid), Outcome::Skipped(Skip::Subresource)));
    }
    if request.operation.as_deref() != Some("CREATE") {
        return Ok((ReviewOut::allow(uid), Outcome::Skipped(Skip::NotCreate)));
    }
    let mut pod = match request.object {
        Some(obj @ Value::Object(_)) => obj,
        _ => {
            return Ok((
                ReviewOut::deny(uid, 400, "request.object must be a Pod object".into()),
                Outcome::Denied(DenyReason::NotAPodObject),
            ));
        }
    };
    strip_managed_fields(&mut pod);

    // The added objects are serialised once, straight into the patch's JSON text.
    match plan_pod_as::<Box<RawValue>>(&pod, request.namespace.as_deref(), defaults) {
        Ok(Plan::Skipped(reason)) => Ok((
            ReviewOut::allow(uid),
            Outcome::Skipped(Skip::Sidecar(reason)),
        )),
        Ok(Plan::Inject(injection)) => {
            let patch = injection.patch();
            if patch.is_empty() {
                return Ok((ReviewOut::allow(uid), Outcome::Skipped(Skip::Unchanged)));
            }
            let bytes = patch
                .to_json()
                .map_err(|e| BadRequest(format!("cannot serialise patch: {e}")))?;
            let patch = Base64Patch::encode(&bytes);
            let mut out = ReviewOut::allow(uid);
            out.response.patch_type = Some("JSONPatch".into());
            out.response.patch = Some(patch);
            Ok((out, Outcome::Injected))
        }
        Err(e) => Ok((
            ReviewOut::deny(uid, 400, e.to_string()),
            Outcome::Denied(DenyReason::of(&e)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    fn pod_review(pod: Value) -> Value {
        json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "request": {
                "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ns", "operation": "CREATE", "object": pod
            }
        })
    }

    #[test]
    fn bad_requests() {
        let d = Defaults::default();
        for (b, msg) in [
            (b"not json".to_vec(), "not an AdmissionReview JSON"),
            (body(json!([1, 2])), "not an AdmissionReview JSON"),
            (
                body(
                    json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": KIND, "request": {"uid": "x"}}),
                ),
                "expected apiVersion",
            ),
            (
                body(json!({"apiVersion": API_VERSION, "kind": KIND})),
                "has no request",
            ),
            (
                body(
                    json!({"apiVersion": API_VERSION, "kind": KIND, "request": {"kind": {"kind": "Pod"}}}),
                ),
                "request.uid is missing",
            ),
        ] {
            let err = mutate(&b, &d).unwrap_err();
            assert!(err.0.contains(msg), "{err} should contain {msg}");
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_gets_serde_jsons_error() {
        let mut b = body(pod_review(json!({"metadata": {"name": "p"}})));
        let at = b.windows(3).position(|w| w == b"\"p\"").unwrap() + 1;
        b[at] = 0xff;
        let err = mutate(&b, &Defaults::default()).unwrap_err();
        let want = serde_json::from_slice::<Value>(&b).unwrap_err().to_string();
        assert!(err.0.contains("not an AdmissionReview JSON"), "{err}");
        assert!(err.0.ends_with(&want), "{err} should end with {want}");
        assert!(want.contains("invalid unicode"), "{want}");
    }

    #[test]
    fn non_pod_is_allowed_unchanged() {
        let mut r = pod_review(json!({}));
        r["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
        let (out, outcome) = mutate(&body(r), &Defaults::default()).unwrap();
        assert_eq!(outcome, Outcome::Skipped(Skip::NotAPod));
        assert!(out.response.allowed);
        assert_eq!(out.response.uid, "u-1");
        assert!(out.response.patch.is_none() && out.response.patch_type.is_none());
    }

    #[test]
    fn labelled_pod_without_node_id_is_denied() {
        let pod = json!({"metadata": {"labels": {"marin3r.3scale.net/status": "enabled"}},
                         "spec": {"containers": [{"name": "app"}]}});
        let (out, outcome) = mutate(&body(pod_review(pod)), &Defaults::default()).unwrap();
        assert_eq!(outcome, Outcome::Denied(DenyReason::InvalidAnnotations));
        assert!(!out.response.allowed);
        let status = out.response.status.unwrap();
        assert_eq!(status.code, 400);
        assert!(status.message.contains("marin3r.3scale.net/node-id"));
    }

    #[test]
    fn a_denial_names_its_reason_code() {
        let d = Defaults::default();
        let review = |object: Value| body(pod_review(object));
        let (_, outcome) = mutate(&review(json!("not an object")), &d).unwrap();
        assert_eq!(outcome, Outcome::Denied(DenyReason::NotAPodObject));
        let invalid = marin3r_sidecar::Error::InvalidPod {
            field: "spec".into(),
            message: "missing".into(),
        };
        assert_eq!(DenyReason::of(&invalid), DenyReason::InvalidPod);
        let kind = marin3r_sidecar::Error::UnsupportedKind { kind: "X".into() };
        assert_eq!(DenyReason::of(&kind), DenyReason::Other);
    }

    #[test]
    fn patch_is_base64_and_ignores_managed_fields() {
        let pod = json!({"metadata": {"labels": {"marin3r.3scale.net/status": "enabled"},
                                      "annotations": {"marin3r.3scale.net/node-id": "n"},
                                      "managedFields": [{"manager": "kubectl"}]},
                         "spec": {"containers": [{"name": "app"}]}});
        let (out, outcome) = mutate(&body(pod_review(pod)), &Defaults::default()).unwrap();
        assert_eq!(outcome, Outcome::Injected);
        assert_eq!(out.response.patch_type.as_deref(), Some("JSONPatch"));
        let raw = base64::engine::general_purpose::STANDARD
            .decode(out.response.patch.unwrap().as_str())
            .unwrap();
        let ops: Vec<Value> = serde_json::from_slice(&raw).unwrap();
        assert!(!ops.is_empty());
        assert!(
            ops.iter()
                .all(|op| !op["path"].as_str().unwrap().contains("managedFields"))
        );
        let text = serde_json::to_value(ReviewOut::allow("x".into())).unwrap();
        assert_eq!(
            text,
            json!({"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": "x", "allowed": true}})
        );
    }

    #[test]
    fn base64_patch_is_a_json_string_both_ways() {
        let raw = br#"[{"op":"remove","path":"/spec/a~1b"}]"#;
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        let patch = Base64Patch::encode(raw);
        assert_eq!(patch.as_str(), b64);
        let mut out = ReviewOut::allow("x".into());
        out.response.patch_type = Some("JSONPatch".into());
        out.response.patch = Some(patch);
        let bytes = out.to_json().unwrap();
        assert_eq!(bytes, serde_json::to_vec(&out).unwrap());
        let want = json!({"apiVersion": API_VERSION, "kind": KIND, "response": {
            "uid": "x", "allowed": true, "patchType": "JSONPatch", "patch": b64}});
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), want);
        assert_eq!(serde_json::to_value(&out).unwrap(), want);
        let back: ReviewOut = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, out);
        // Every shape of answer is written as serde writes it.
        for out in [
            ReviewOut::allow("a\"\u{1}é".into()),
            ReviewOut::deny("u".into(), 403, "no \"way\"\n".into()),
            ReviewOut::deny("u".into(), 400, String::new()),
        ] {
            assert_eq!(out.to_json().unwrap(), serde_json::to_vec(&out).unwrap());
        }
        // Only base64 text is read back as a patch.
        assert!(serde_json::from_value::<Base64Patch>(json!("a\"b")).is_err());
        assert!(serde_json::from_value::<Base64Patch>(json!("a\u{0}")).is_err());
    }
}
