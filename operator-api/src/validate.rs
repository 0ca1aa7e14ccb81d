//! Validation results: every problem of a spec with its JSON path and the rule it breaks.
//!
//! The rules that the CRD schemas also enforce (CEL and OpenAPI) are reported with the same
//! wording, so the EnvoyDeployment webhook (operator-design.md §5.8), `marin3r operator
//! render` and the API server agree. `validate()` adds checks a schema cannot express well
//! (Go durations, uniqueness with a readable message).

use std::fmt;

use crate::Error;

/// The kind of rule a field breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Two fields that must not be set together (`static` and `dynamic`).
    MutuallyExclusive,
    /// Exactly one of several fields must be set (`selfSigned` or `caSigned`).
    ExactlyOne,
    /// A number outside its allowed range.
    Range,
    /// A string outside its allowed values.
    Enum,
    /// A list key that appears twice.
    Unique,
    /// A Go duration that does not parse.
    Duration,
    /// A required value that is missing or empty.
    Required,
    /// Two values in the wrong order (`minReplicas` > `maxReplicas`).
    Order,
    /// A string that is not well-formed (e.g. a port name).
    Format,
}

impl Rule {
    /// Stable name of the rule (for logs, metrics and tests).
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::MutuallyExclusive => "mutually-exclusive",
            Rule::ExactlyOne => "exactly-one",
            Rule::Range => "range",
            Rule::Enum => "enum",
            Rule::Unique => "unique",
            Rule::Duration => "duration",
            Rule::Required => "required",
            Rule::Order => "order",
            Rule::Format => "format",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found by `validate()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the offending field, e.g. `spec.replicas` or `spec.ports[1].port`.
    pub path: String,
    /// The rule it breaks.
    pub rule: Rule,
    /// A human-readable explanation.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// `a; b; c`, the display of [`Error::Invalid`].
pub(crate) fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Collects [`FieldError`]s.
#[derive(Debug, Default)]
pub(crate) struct Errors(pub(crate) Vec<FieldError>);

impl Errors {
    pub(crate) fn push(&mut self, path: impl Into<String>, rule: Rule, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            rule,
            message: message.into(),
        });
    }

    /// A port must be in 1–65535 (the schema's `minimum`/`maximum`).
    pub(crate) fn port(&mut self, path: impl Into<String>, value: Option<i32>) {
        if let Some(v) = value
            && !(1..=65535).contains(&v)
        {
            self.push(path, Rule::Range, format!("port {v} is outside 1-65535"));
        }
    }

    /// A number must be at least `min`.
    pub(crate) fn at_least(&mut self, path: impl Into<String>, value: Option<i64>, min: i64) {
        if let Some(v) = value
            && v < min
        {
            self.push(path, Rule::Range, format!("{v} is less than {min}"));
        }
    }

    /// A Go duration must parse.
    pub(crate) fn duration(&mut self, path: &str, value: Option<&str>) {
        if let Some(v) = value
            && let Err(Error::Duration { reason, .. }) = crate::parse_go_duration(path, v)
        {
            self.push(
                path,
                Rule::Duration,
                format!("invalid duration {v:?}: {reason}"),
            );
        }
    }

    /// A required string must be non-empty.
    pub(crate) fn non_empty(&mut self, path: impl Into<String>, value: &str) {
        if value.trim().is_empty() {
            self.push(path, Rule::Required, "must not be empty");
        }
    }

    pub(crate) fn into_result(self) -> Result<(), Error> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(self.0))
        }
    }
}
