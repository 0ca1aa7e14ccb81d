//! Where decoding a resource fails and why: [`DecodeError`], the [`Location`] it
//! carries (the resource and the field path), and the path helpers every decoding
//! layer (loader leniencies, strict protojson, constraint checks, TLS material) builds
//! field paths with.

use std::fmt;

use crate::pem::redact_pem;
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
            write!(f, "{}: ", redact_pem(&self.resource))?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", redact_pem(&self.path))?;
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
/// material: secret errors name the Secret and the key, never the data; an error at or
/// under a field Envoy marks sensitive names the field and the rule, never the value
/// ([`crate::sensitive`]); and `Display` replaces any PEM block or long base64 run in
/// the texts it shows ([`redact_pem`]), whatever produced them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The text is not valid JSON/YAML.
    #[error("{at}invalid {serialization}: {}", redact_pem(message))]
    Syntax {
        at: Location,
        serialization: Serialization,
        message: String,
    },
    /// A field that the message type does not have.
    #[error("{at}unknown field {:?}", redact_pem(field))]
    UnknownField { at: Location, field: String },
    /// An `Any` whose `@type` is not in the Envoy registry.
    #[error("{at}unknown type URL {}", redact_pem(type_url))]
    UnknownType { at: Location, type_url: String },
    /// A value that does not fit its field (wrong type, bad duration, bad enum name, …).
    #[error("{at}{}", redact_pem(message))]
    Invalid { at: Location, message: String },
    /// Certificate or key data that Envoy's TLS context loader refuses (placeholder PEM,
    /// unknown curve, …). The message names the field and the rule, never the data.
    #[error("{at}{}", redact_pem(message))]
    TlsMaterial { at: Location, message: String },
    /// The resource has no (or an empty) name field.
    #[error("{at}missing resource name (field {field})")]
    MissingName { at: Location, field: &'static str },
    /// Two resources of one type share a name.
    #[error(
        "{at}duplicate {kind} name {:?} (first at {})",
        redact_pem(name),
        redact_pem(first)
    )]
    DuplicateName {
        at: Location,
        kind: ResourceType,
        name: String,
        first: String,
    },
    /// A referenced Kubernetes Secret does not exist.
    #[error("{at}secret {:?} not found", redact_pem(secret))]
    MissingSecret { at: Location, secret: String },
    /// A referenced Kubernetes Secret lacks a key.
    #[error("{at}secret {:?} has no key {:?}", redact_pem(secret), redact_pem(key))]
    MissingSecretKey {
        at: Location,
        secret: String,
        key: String,
    },
    /// A referenced Kubernetes Secret has the wrong type.
    #[error(
        "{at}secret {:?} has type {:?}, expected {expected:?}",
        redact_pem(secret),
        redact_pem(actual)
    )]
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
    #[error("{at}{}", redact_pem(message))]
    Spec { at: Location, message: String },
    /// The embedded Envoy descriptor set is unusable (a broken build, not user input).
    #[error("Envoy type registry: {}", redact_pem(.0))]
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

    /// The same error with `f` applied to every text it carries (the location, messages,
    /// names), for [`crate::sensitive::redact`].
    pub(crate) fn map_texts(self, f: impl Fn(&str) -> String) -> Self {
        let at = |at: Location| Location {
            resource: f(&at.resource),
            path: f(&at.path),
        };
        match self {
            DecodeError::Syntax {
                at: a,
                serialization,
                message,
            } => DecodeError::Syntax {
                at: at(a),
                serialization,
                message: f(&message),
            },
            DecodeError::UnknownField { at: a, field } => DecodeError::UnknownField {
                at: at(a),
                field: f(&field),
            },
            DecodeError::UnknownType { at: a, type_url } => DecodeError::UnknownType {
                at: at(a),
                type_url: f(&type_url),
            },
            DecodeError::Invalid { at: a, message } => DecodeError::Invalid {
                at: at(a),
                message: f(&message),
            },
            DecodeError::TlsMaterial { at: a, message } => DecodeError::TlsMaterial {
                at: at(a),
                message: f(&message),
            },
            DecodeError::MissingName { at: a, field } => {
                DecodeError::MissingName { at: at(a), field }
            }
            DecodeError::DuplicateName {
                at: a,
                kind,
                name,
                first,
            } => DecodeError::DuplicateName {
                at: at(a),
                kind,
                name: f(&name),
                first: f(&first),
            },
            DecodeError::MissingSecret { at: a, secret } => DecodeError::MissingSecret {
                at: at(a),
                secret: f(&secret),
            },
            DecodeError::MissingSecretKey { at: a, secret, key } => DecodeError::MissingSecretKey {
                at: at(a),
                secret: f(&secret),
                key: f(&key),
            },
            DecodeError::SecretType {
                at: a,
                secret,
                expected,
                actual,
            } => DecodeError::SecretType {
                at: at(a),
                secret: f(&secret),
                expected,
                actual: f(&actual),
            },
            DecodeError::NeedsKubernetes { at: a } => DecodeError::NeedsKubernetes { at: at(a) },
            DecodeError::Spec { at: a, message } => DecodeError::Spec {
                at: at(a),
                message: f(&message),
            },
            DecodeError::Registry(message) => DecodeError::Registry(f(&message)),
        }
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
