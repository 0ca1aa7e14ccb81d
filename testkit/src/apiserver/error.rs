//! API errors as the API server sends them: a `metav1.Status` with `code`, `reason` and
//! `message`.

use std::fmt;

use serde_json::{Value, json};

use super::kinds::ResourceKind;

/// A failed request: the HTTP code and the `Status` body the client receives.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `BadRequest`, `Invalid`, …
    pub reason: String,
    pub message: String,
    /// `details` of the Status (name, group, kind, causes), `null` if none.
    pub details: Value,
}

impl ApiError {
    /// An error with `code`, its usual reason and `message`.
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason_of(code).to_string(),
            message: message.into(),
            details: Value::Null,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub(crate) fn invalid(kind: &ResourceKind, name: &str, message: &str) -> Self {
        Self::new(
            422,
            format!("{} \"{name}\" is invalid: {message}", kind.kind),
        )
        .with_details(kind, name)
    }

    pub(crate) fn not_found(kind: &ResourceKind, name: &str) -> Self {
        Self::new(
            404,
            format!("{} \"{name}\" not found", kind.qualified_plural()),
        )
        .with_details(kind, name)
    }

    pub(crate) fn already_exists(kind: &ResourceKind, name: &str) -> Self {
        Self::new(
            409,
            format!("{} \"{name}\" already exists", kind.qualified_plural()),
        )
        .with_reason("AlreadyExists")
        .with_details(kind, name)
    }

    /// A precondition (`resourceVersion` or `uid`) that does not hold.
    pub(crate) fn modified(kind: &ResourceKind, name: &str) -> Self {
        Self::new(
            409,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                kind.qualified_plural()
            ),
        )
        .with_details(kind, name)
    }

    pub(crate) fn with_reason(mut self, reason: &str) -> Self {
        self.reason = reason.to_string();
        self
    }

    pub(crate) fn with_details(mut self, kind: &ResourceKind, name: &str) -> Self {
        self.details = json!({"name": name, "group": kind.group, "kind": kind.plural});
        self
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason,
            "code": self.code,
        });
        if !self.details.is_null() {
            status["details"] = self.details.clone();
        }
        status
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The `reason` the API server gives with `code`.
pub(crate) fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}
