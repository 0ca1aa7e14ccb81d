//! Label and field selectors of LIST and WATCH requests, parsed and matched as the API
//! server does (`labelSelector`: `=`, `==`, `!=`, `in`, `notin`, exists, `!`exists;
//! `fieldSelector`: `=`, `==`, `!=` on `metadata.name`, `metadata.namespace` and the
//! kind's own field labels).

use serde_json::Value;

use super::kinds::ResourceKind;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub(crate) fn parse(selector: &str) -> Result<Self, String> {
        split_top_level(selector)
            .into_iter()
            .filter(|term| !term.trim().is_empty())
            .map(|term| parse_requirement(term.trim()))
            .collect::<Result<_, _>>()
            .map(LabelSelector)
    }

    /// Whether the labels of `object` (`metadata.labels`) satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let label = |key: &str| object["metadata"]["labels"][key].as_str();
        self.0.iter().all(|req| match req {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

/// Splits at the commas outside parentheses.
fn split_top_level(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(label_key(key.trim(), term)?));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(
            label_key(key.trim(), term)?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(
            label_key(key.trim(), term)?,
            value.trim().to_string(),
        ));
    }
    let key_end = term.find(char::is_whitespace).unwrap_or(term.len());
    let (key, rest) = (label_key(&term[..key_end], term)?, term[key_end..].trim());
    if rest.is_empty() {
        return Ok(Requirement::Exists(key));
    }
    let (set_op, values) = if let Some(values) = rest.strip_prefix("notin") {
        (false, values)
    } else if let Some(values) = rest.strip_prefix("in") {
        (true, values)
    } else {
        return Err(format!("unable to parse requirement: {term:?}"));
    };
    let values = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse requirement: {term:?}: expected a (set)"))?;
    let values: Vec<String> = values
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    Ok(if set_op {
        Requirement::In(key, values)
    } else {
        Requirement::NotIn(key, values)
    })
}

fn label_key(key: &str, term: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
    if valid {
        Ok(key.to_string())
    } else {
        Err(format!("invalid label key {key:?} in requirement {term:?}"))
    }
}

/// A parsed `fieldSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `selector` for objects of `kind`; a field label the kind does not serve is
    /// an error, as on the API server.
    pub(crate) fn parse(selector: &str, kind: &ResourceKind) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: {term:?}; can't understand it"));
            };
            let field = field.trim();
            let served = matches!(field, "metadata.name" | "metadata.namespace")
                || kind.field_labels.iter().any(|l| l == field);
            if !served {
                return Err(format!(
                    "field label not supported: {field} (for {})",
                    kind.qualified_plural()
                ));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = field
                .split('.')
                .try_fold(object, |v, key| v.get(key))
                .and_then(Value::as_str)
                .unwrap_or_default();
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selectors_match_like_the_api_server() {
        let obj = labelled(json!({"app": "envoy", "tier": "edge"}));
        let cases = [
            ("", true),
            ("app=envoy", true),
            ("app==envoy", true),
            ("app=other", false),
            ("app!=other", true),
            ("missing!=x", true),
            ("app in (envoy, kuard)", true),
            ("app in (kuard)", false),
            ("app notin (kuard)", true),
            ("missing notin (kuard)", true),
            ("app notin (envoy,kuard)", false),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=envoy,tier in (edge),!missing", true),
            ("app=envoy,tier=core", false),
        ];
        for (selector, expected) in cases {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&obj), expected, "{selector}");
        }
        assert!(LabelSelector::parse("app in envoy").is_err());
        assert!(LabelSelector::parse("a pp").is_err());
    }

    #[test]
    fn field_selectors_serve_only_known_labels() {
        let secrets = ResourceKind::new("", "v1", "secrets", "Secret").with_field_label("type");
        let obj = json!({"metadata": {"name": "a", "namespace": "ns"}, "type": "Opaque"});
        let matches = |s: &str| FieldSelector::parse(s, &secrets).unwrap().matches(&obj);
        assert!(matches("metadata.name=a"));
        assert!(matches("metadata.name==a,metadata.namespace=ns"));
        assert!(!matches("metadata.namespace!=ns"));
        assert!(matches("type=Opaque"));
        assert!(FieldSelector::parse("spec.foo=bar", &secrets).is_err());
    }
}
