//! How the text of a resource or a manifest is written and read: JSON or YAML
//! ([`Serialization`]), and the options the YAML parser reads it with
//! ([`yaml_options`]), so that parse errors never quote the input and scalars are typed
//! as Envoy's loader types them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How the text of a resource (or of the deprecated `envoyResources` values) is written.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Serialization {
    /// JSON (the default, as upstream).
    #[default]
    Json,
    /// YAML (a superset of JSON).
    Yaml,
}

impl fmt::Display for Serialization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Serialization::Json => "json",
            Serialization::Yaml => "yaml",
        })
    }
}

/// YAML parser options for text whose errors end up in logs and statuses: an error names
/// the line and column but does not quote the input. (serde-saphyr's default source
/// snippet prints the offending lines, which may hold a Secret's data or an inline
/// private key; see docs/reliability.md.)
///
/// Comments: serde-saphyr (with its `comments` feature, which kube-client turns on for the
/// whole build anyway) buffers the comments it meets while looking ahead for the next
/// list item, 32 by default, and refuses the file beyond that ("too many buffered
/// comments"); Envoy's own example configs have more. The cap is raised to
/// [`MAX_BUFFERED_COMMENTS`]; their total size stays bounded by the parser's 64 MiB
/// comment budget.
///
/// Scalars are typed closer to Envoy's YAML loader (yaml-cpp, then protobuf's JSON parser;
/// `envoyconfig/tests/envoy_leniencies.rs` §5): an integer with a leading `0` is octal
/// (`010` is 8, as Envoy and YAML 1.1 read it; YAML 1.2 would read 10), and a number
/// written with underscores (`1_000`) is text (yaml-cpp knows no underscores: Envoy refuses
/// it in a numeric field and keeps the text in a string field). Still typed as numbers
/// where Envoy keeps the text: floats (`1.50`), `0o`/`0b` integers, and integers outside
/// the `int32` range, so such a scalar in a string field is refused (quote it).
pub fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        with_snippet: false,
        legacy_octal_numbers: true,
        underscored_numbers_as_strings: true,
        budget: serde_saphyr::budget! { max_buffered_comment_events: MAX_BUFFERED_COMMENTS },
    }
}

/// Comment lines allowed in a row where the YAML parser looks ahead (see [`yaml_options`]).
pub const MAX_BUFFERED_COMMENTS: usize = 100_000;
