//! Where decoding a resource fails and why: [`DecodeError`], the [`Location`] it
//! carries (the resource and the field path), and the path helpers every decoding
//! layer (loader leniencies, strict protojson, constraint checks, TLS material) builds
//! field paths with.

use std::fmt;

use crate::registry;
use crate::resource::ResourceType;
use crate::text::Serialization;

/// Where a decoding problem is: which resource (`listener "https"`, may be empty) and
/// the field path (`spec.resources[3].value.filter_chains[0]`, may be empty).
///
/// Displays as the non-empty parts joined by `": "`, followed by `": "`, so errors read
/// `listener "https": filter_chains[0]: unknown field "bogus"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// The resource the problem belongs to, like `listener "https"`.
    pub resource: String,
    /// The field path, like `filter_chains[0].filters[0].typed_config`.
    pub path: String,
}

impl Location {
    pub(crate) fn new(resource: impl Into<String>, path: impl Into<String>) -> Self {
        Location {
            resource: resource.into(),
            path: path.into(),
        }
    }

    /// Prefixes the path (`spec.resources[3].value` + `filter_chains[0]`).
    pub fn prefix(&mut self, prefix: &str) {
        self.path = join_path(prefix, &self.path);
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.resource.is_empty() {
            write!(f, "{}: ", self.resource)?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        Ok(())
    }
}

/// Joins two field paths: `a` + `b` → `a.b`, `a` + `[0]` → `a[0]`.
pub(crate) fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) if path.starts_with('[') => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

/// Every way decoding or resolving a resource can fail. None of them carries secret
/// material: secret errors name the Secret and the key, never the data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The text is not valid JSON/YAML.
    #[error("{at}invalid {serialization}: {message}")]
    Syntax {
        at: Location,
        serialization: Serialization,
        message: String,
    },
    /// A field that the message type does not have.
    #[error("{at}unknown field {field:?}")]
    UnknownField { at: Location, field: String },
    /// An `Any` whose `@type` is not in the Envoy registry.
    #[error("{at}unknown type URL {type_url}")]
    UnknownType { at: Location, type_url: String },
    /// A value that does not fit its field (wrong type, bad duration, bad enum name, …).
    #[error("{at}{message}")]
    Invalid { at: Location, message: String },
    /// Certificate or key data that Envoy's TLS context loader refuses (placeholder PEM,
    /// unknown curve, …). The message names the field and the rule, never the data.
    #[error("{at}{message}")]
    TlsMaterial { at: Location, message: String },
    /// The resource has no (or an empty) name field.
    #[error("{at}missing resource name (field {field})")]
    MissingName { at: Location, field: &'static str },
    /// Two resources of one type share a name.
    #[error("{at}duplicate {kind} name {name:?} (first at {first})")]
    DuplicateName {
        at: Location,
        kind: ResourceType,
        name: String,
        first: String,
    },
    /// A referenced Kubernetes Secret does not exist.
    #[error("{at}secret {secret:?} not found")]
    MissingSecret { at: Location, secret: String },
    /// A referenced Kubernetes Secret lacks a key.
    #[error("{at}secret {secret:?} has no key {key:?}")]
    MissingSecretKey {
        at: Location,
        secret: String,
        key: String,
    },
    /// A referenced Kubernetes Secret has the wrong type.
    #[error("{at}secret {secret:?} has type {actual:?}, expected {expected:?}")]
    SecretType {
        at: Location,
        secret: String,
        expected: &'static str,
        actual: String,
    },
    /// `generateFromEndpointSlices` was used where no EndpointSlices can be listed.
    #[error("{at}generateFromEndpointSlices needs Kubernetes mode")]
    NeedsKubernetes { at: Location },
    /// An EnvoyConfig that is not well-formed (both forms, no value, wrong combination).
    #[error("{at}{message}")]
    Spec { at: Location, message: String },
    /// The embedded Envoy descriptor set is unusable (a broken build, not user input).
    #[error("Envoy type registry: {0}")]
    Registry(String),
}

/// The [`Location`] of a `DecodeError` (`&` or `&mut`, as the error is borrowed).
macro_rules! location_of {
    ($error:expr) => {
        match $error {
            DecodeError::Syntax { at, .. }
            | DecodeError::UnknownField { at, .. }
            | DecodeError::UnknownType { at, .. }
            | DecodeError::Invalid { at, .. }
            | DecodeError::TlsMaterial { at, .. }
            | DecodeError::MissingName { at, .. }
            | DecodeError::DuplicateName { at, .. }
            | DecodeError::MissingSecret { at, .. }
            | DecodeError::MissingSecretKey { at, .. }
            | DecodeError::SecretType { at, .. }
            | DecodeError::NeedsKubernetes { at }
            | DecodeError::Spec { at, .. } => Some(at),
            DecodeError::Registry(_) => None,
        }
    };
}

impl From<registry::RegistryError> for DecodeError {
    fn from(e: registry::RegistryError) -> Self {
        DecodeError::Registry(e.0)
    }
}

impl DecodeError {
    /// Where the problem is (`None` for registry errors).
    pub fn location(&self) -> Option<&Location> {
        location_of!(self)
    }

    pub(crate) fn location_mut(&mut self) -> Option<&mut Location> {
        location_of!(self)
    }

    /// The same error with its path prefixed (`spec.resources[3].value` + `…`).
    pub fn prefixed(mut self, prefix: &str) -> Self {
        if let Some(at) = self.location_mut() {
            at.prefix(prefix);
        }
        self
    }

    pub(crate) fn spec(path: impl Into<String>, message: impl Into<String>) -> Self {
        DecodeError::Spec {
            at: Location::new("", path),
            message: message.into(),
        }
    }

    /// A value at `path` that does not fit its field, or breaks one of Envoy's
    /// constraints.
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        DecodeError::Invalid {
            at: Location::new("", path),
            message: message.into(),
        }
    }
}

/// A path segment for a map key or field name: plain identifiers as they are, anything
/// else quoted in brackets (`["envoy.filters.http.cors"]`).
pub(crate) fn key_segment(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@')
    {
        key.to_string()
    } else {
        format!("[{}]", serde_json::to_string(key).unwrap_or_default())
    }
}
