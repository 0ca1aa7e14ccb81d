//! Node matchers (`node_matchers` of a query): compiled once per query, bounded
//! ([`check_bounds`]), OR-ed over the streams.

use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::path_segment::Segment;
use envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern as ValuePattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher};

use marin3r_wire::{POD_NAME_METADATA_KEY, POD_NAMESPACE_METADATA_KEY};

use super::bounds::{CsdsError, MAX_PATTERN_BYTES, MAX_STRING_MATCHERS};
use super::registry::ClientNode;

#[derive(Debug, Clone, PartialEq, Eq)]
enum StrKind {
    Exact,
    Prefix,
    Suffix,
    Contains,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct StrMatch {
    kind: StrKind,
    /// Lowercased (ASCII) when `ignore_case`.
    pattern: String,
    ignore_case: bool,
}

impl StrMatch {
    fn compile(m: &StringMatcher, field: &str) -> Result<Self, CsdsError> {
        let invalid = |rule| CsdsError::InvalidMatcher {
            field: field.to_string(),
            rule,
        };
        let (kind, pattern) = match &m.match_pattern {
            Some(MatchPattern::Exact(p)) => (StrKind::Exact, p),
            Some(MatchPattern::Prefix(p)) => (StrKind::Prefix, p),
            Some(MatchPattern::Suffix(p)) => (StrKind::Suffix, p),
            Some(MatchPattern::Contains(p)) => (StrKind::Contains, p),
            Some(MatchPattern::SafeRegex(_)) => {
                return Err(CsdsError::InvalidMatcher {
                    field: format!("{field}.safe_regex"),
                    rule: "not supported: use exact, prefix, suffix or contains",
                });
            }
            Some(MatchPattern::Custom(_)) => {
                return Err(CsdsError::InvalidMatcher {
                    field: format!("{field}.custom"),
                    rule: "not supported: use exact, prefix, suffix or contains",
                });
            }
            None => {
                return Err(invalid(
                    "no match pattern: set exact, prefix, suffix or contains",
                ));
            }
        };
        Ok(Self {
            kind,
            pattern: if m.ignore_case {
                pattern.to_ascii_lowercase()
            } else {
                pattern.clone()
            },
            ignore_case: m.ignore_case,
        })
    }

    /// `value` as is, `lowered` its ASCII lowercase (for `ignore_case`).
    fn matches(&self, value: &str, lowered: &str) -> bool {
        let value = if self.ignore_case { lowered } else { value };
        let p = self.pattern.as_str();
        match self.kind {
            StrKind::Exact => value == p,
            StrKind::Prefix => value.starts_with(p),
            StrKind::Suffix => value.ends_with(p),
            StrKind::Contains => value.contains(p),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetaKey {
    PodName,
    PodNamespace,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct CompiledMatcher {
    node_id: Option<StrMatch>,
    metadata: Vec<(MetaKey, StrMatch)>,
}

/// A node's matched fields, each with its ASCII lowercase (made once per node, only
/// when a matcher ignores case).
struct Fields<'a> {
    id: (&'a str, std::borrow::Cow<'a, str>),
    pod_name: (&'a str, std::borrow::Cow<'a, str>),
    pod_namespace: (&'a str, std::borrow::Cow<'a, str>),
}

impl<'a> Fields<'a> {
    fn of(node: &'a ClientNode, lower: bool) -> Self {
        let pair = |s: &'a str| {
            let lowered = if lower {
                std::borrow::Cow::Owned(s.to_ascii_lowercase())
            } else {
                std::borrow::Cow::Borrowed(s)
            };
            (s, lowered)
        };
        Self {
            id: pair(&node.id),
            pod_name: pair(&node.pod_name),
            pod_namespace: pair(&node.pod_namespace),
        }
    }
}

impl CompiledMatcher {
    fn matches(&self, node: &Fields<'_>) -> bool {
        let test = |m: &StrMatch, (value, lowered): &(&str, std::borrow::Cow<'_, str>)| {
            m.matches(value, lowered)
        };
        self.node_id.as_ref().is_none_or(|m| test(m, &node.id))
            && self.metadata.iter().all(|(key, m)| match key {
                MetaKey::PodName => test(m, &node.pod_name),
                MetaKey::PodNamespace => test(m, &node.pod_namespace),
            })
    }

    fn is_exact_node_id(&self) -> bool {
        self.node_id
            .as_ref()
            .is_some_and(|m| m.kind == StrKind::Exact)
    }
}

/// A query's `node_matchers`, checked: OR of the matchers (none: every stream); within
/// one, `node_id` and every `node_metadatas` entry must match. `node_id` takes an
/// exact, prefix, suffix or contains `StringMatcher` (`ignore_case` honoured, ASCII);
/// `node_metadatas` takes a single-key path, `pod_name` or `pod_namespace`, and a
/// string value matcher. Anything else (`safe_regex`, other paths or value matchers)
/// is refused naming the field; so is a query over [`MAX_STRING_MATCHERS`] or
/// [`MAX_PATTERN_BYTES`] (checked before anything is compiled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFilter {
    matchers: Vec<CompiledMatcher>,
    /// Some matcher ignores case.
    lower: bool,
}

/// The bounds of [`NodeFilter::compile`], on the request as received.
fn check_bounds(matchers: &[NodeMatcher]) -> Result<(), CsdsError> {
    let over = |what, count, limit| {
        (count > limit).then_some(CsdsError::TooManyMatchers { what, count, limit })
    };
    // Counted first: the walk below is then bounded.
    let count = matchers.iter().fold(0usize, |n, m| {
        n.saturating_add(usize::from(m.node_id.is_some()))
            .saturating_add(m.node_metadatas.len())
    });
    if let Some(e) = over("string matchers", count, MAX_STRING_MATCHERS) {
        return Err(e);
    }
    let pattern_len = |m: &StringMatcher| match &m.match_pattern {
        Some(
            MatchPattern::Exact(p)
            | MatchPattern::Prefix(p)
            | MatchPattern::Suffix(p)
            | MatchPattern::Contains(p),
        ) => p.len(),
        _ => 0,
    };
    let bytes = matchers.iter().fold(0usize, |n, m| {
        let id = m.node_id.as_ref().map_or(0, pattern_len);
        let meta = m.node_metadatas.iter().fold(0usize, |k, sm| {
            let v = match sm.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
                Some(ValuePattern::StringMatch(s)) => pattern_len(s),
                _ => 0,
            };
            let path = sm
                .path
                .iter()
                .map(|seg| match &seg.segment {
                    Some(Segment::Key(k)) => k.len(),
                    None => 0,
                })
                .fold(0usize, usize::saturating_add);
            k.saturating_add(v).saturating_add(path)
        });
        n.saturating_add(id).saturating_add(meta)
    });
    match over("bytes of patterns", bytes, MAX_PATTERN_BYTES) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl NodeFilter {
    pub fn compile(matchers: &[NodeMatcher]) -> Result<Self, CsdsError> {
        check_bounds(matchers)?;
        let mut out = Vec::with_capacity(matchers.len());
        for (i, m) in matchers.iter().enumerate() {
            let base = format!("node_matchers[{i}]");
            let node_id = m
                .node_id
                .as_ref()
                .map(|s| StrMatch::compile(s, &format!("{base}.node_id")))
                .transpose()?;
            let mut metadata = Vec::with_capacity(m.node_metadatas.len());
            for (j, sm) in m.node_metadatas.iter().enumerate() {
                let field = format!("{base}.node_metadatas[{j}]");
                let invalid_path = || CsdsError::InvalidMatcher {
                    field: format!("{field}.path"),
                    rule: "must be a single key, pod_name or pod_namespace",
                };
                let key = match sm.path.as_slice() {
                    [seg] => match &seg.segment {
                        Some(Segment::Key(k)) if k == POD_NAME_METADATA_KEY => MetaKey::PodName,
                        Some(Segment::Key(k)) if k == POD_NAMESPACE_METADATA_KEY => {
                            MetaKey::PodNamespace
                        }
                        _ => return Err(invalid_path()),
                    },
                    _ => return Err(invalid_path()),
                };
                let value = match sm.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
                    Some(ValuePattern::StringMatch(s)) => {
                        StrMatch::compile(s, &format!("{field}.value.string_match"))?
                    }
                    _ => {
                        return Err(CsdsError::InvalidMatcher {
                            field: format!("{field}.value"),
                            rule: "must be a string_match",
                        });
                    }
                };
                metadata.push((key, value));
            }
            out.push(CompiledMatcher { node_id, metadata });
        }
        let lower = out.iter().any(|m| {
            m.node_id.as_ref().is_some_and(|s| s.ignore_case)
                || m.metadata.iter().any(|(_, s)| s.ignore_case)
        });
        Ok(Self {
            matchers: out,
            lower,
        })
    }

    pub fn matches(&self, node: &ClientNode) -> bool {
        if self.matchers.is_empty() {
            return true;
        }
        let fields = Fields::of(node, self.lower);
        self.matchers.iter().any(|m| m.matches(&fields))
    }

    /// A targeted query: at least one matcher, each an exact node id.
    pub fn is_targeted(&self) -> bool {
        !self.matchers.is_empty() && self.matchers.iter().all(CompiledMatcher::is_exact_node_id)
    }
}
