//! An HTTP request as the API server reads it: the resource URL (group, version,
//! namespace, plural, name, subresource), the query, the verb, the headers that matter.

use bytes::Bytes;
use http::Method;

use super::error::ApiError;
use super::log::{RequestRecord, Verb};

/// The parts of a resource URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResourcePath {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) plural: String,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

/// Parses `/api/v1/…` and `/apis/<group>/<version>/…` (None for anything else).
pub(crate) fn parse_path(path: &str) -> Option<ResourcePath> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    type Parts<'a> = (&'a str, Option<&'a str>, Option<String>, Option<String>);
    fn resource<'a>(
        plural: &'a str,
        namespace: Option<&'a str>,
        tail: &[&str],
    ) -> Option<Parts<'a>> {
        match tail {
            [] => Some((plural, namespace, None, None)),
            [name] => Some((plural, namespace, Some(name.to_string()), None)),
            [name, sub] => Some((
                plural,
                namespace,
                Some(name.to_string()),
                Some(sub.to_string()),
            )),
            _ => None,
        }
    }
    let parsed = match rest {
        // The namespace object itself and its subresources.
        ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => Some((
            "namespaces",
            None,
            Some(name.to_string()),
            Some(sub.to_string()),
        )),
        ["namespaces", namespace, plural, tail @ ..] => resource(plural, Some(namespace), tail),
        [plural, tail @ ..] => resource(plural, None, tail),
        [] => None,
    }?;
    let (plural, namespace, name, subresource) = parsed;
    let nonempty = |s: &String| !s.is_empty();
    if plural.is_empty() || !name.as_ref().is_none_or(nonempty) || namespace == Some("") {
        return None;
    }
    Some(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        plural: plural.to_string(),
        namespace: namespace.map(str::to_string),
        name,
        subresource,
    })
}

/// Decodes an `application/x-www-form-urlencoded` query.
pub(crate) fn parse_query(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(key)?, decode(value)?))
        })
        .collect()
}

fn decode(text: &str) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request(format!("invalid URL encoding in query: {text:?}"));
    let mut bytes = Vec::with_capacity(text.len());
    let mut input = text.bytes();
    while let Some(b) = input.next() {
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = [input.next().ok_or_else(bad)?, input.next().ok_or_else(bad)?];
                let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
                bytes.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).map_err(|_| bad())
}

/// A received request, parsed as far as it parses.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// What the request log keeps (its `code` is set once answered).
    pub(crate) record: RequestRecord,
    pub(crate) path: Option<ResourcePath>,
    pub(crate) params: Result<Vec<(String, String)>, ApiError>,
    pub(crate) body: Bytes,
    /// The media type of the body, without parameters.
    pub(crate) content_type: String,
    pub(crate) accept: String,
    pub(crate) user_agent: String,
}

impl Call {
    pub(crate) fn parse(parts: &http::request::Parts, body: Bytes) -> Self {
        let header = |name: http::header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let content_type = header(http::header::CONTENT_TYPE);
        let content_type = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let path_text = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let params = parse_query(&query);
        let path = parse_path(&path_text);
        let param = |name: &str| {
            params
                .as_ref()
                .ok()
                .and_then(|ps| ps.iter().find(|(k, _)| k == name))
                .map(|(_, v)| v.clone())
        };
        let watch = param("watch").is_some_and(|w| w == "true" || w == "1");
        let named = path.as_ref().is_some_and(|p| p.name.is_some());
        let record = RequestRecord {
            method: parts.method.to_string(),
            path: path_text,
            query,
            verb: path.as_ref().and(verb_of(&parts.method, named, watch)),
            group: path.as_ref().map(|p| p.group.clone()).unwrap_or_default(),
            resource: path.as_ref().map(|p| p.plural.clone()).unwrap_or_default(),
            namespace: path.as_ref().and_then(|p| p.namespace.clone()),
            name: path.as_ref().and_then(|p| p.name.clone()),
            subresource: path.as_ref().and_then(|p| p.subresource.clone()),
            field_manager: param("fieldManager"),
            content_type: content_type.clone(),
            code: 0,
        };
        Call {
            record,
            path,
            params,
            body,
            content_type,
            accept: header(http::header::ACCEPT),
            user_agent: header(http::header::USER_AGENT),
        }
    }

    /// The query parameter `name`, if given.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.params
            .as_ref()
            .ok()?
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The field manager of a write: `fieldManager`, else the User-Agent's product.
    pub(crate) fn manager(&self) -> String {
        match self.param("fieldManager") {
            Some(manager) => manager.to_string(),
            None => match self.user_agent.split('/').next() {
                Some(product) if !product.is_empty() => product.to_string(),
                _ => "unknown".to_string(),
            },
        }
    }
}

fn verb_of(method: &Method, named: bool, watch: bool) -> Option<Verb> {
    Some(match *method {
        Method::GET if named => Verb::Get,
        Method::GET if watch => Verb::Watch,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE if named => Verb::Delete,
        Method::DELETE => Verb::DeleteCollection,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn path(
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Option<ResourcePath> {
        Some(ResourcePath {
            group: group.into(),
            version: "v1".into(),
            plural: plural.into(),
            namespace: namespace.map(Into::into),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        })
    }

    #[test]
    fn resource_urls_parse() {
        let cases = [
            ("/api/v1/secrets", path("", "secrets", None, None, None)),
            (
                "/api/v1/namespaces",
                path("", "namespaces", None, None, None),
            ),
            (
                "/api/v1/namespaces/ns",
                path("", "namespaces", None, Some("ns"), None),
            ),
            (
                "/api/v1/namespaces/ns/status",
                path("", "namespaces", None, Some("ns"), Some("status")),
            ),
            (
                "/api/v1/namespaces/ns/pods",
                path("", "pods", Some("ns"), None, None),
            ),
            (
                "/api/v1/namespaces/ns/pods/p/status",
                path("", "pods", Some("ns"), Some("p"), Some("status")),
            ),
            (
                "/apis/g.io/v1/namespaces/ns/things/t",
                path("g.io", "things", Some("ns"), Some("t"), None),
            ),
            (
                "/apis/g.io/v1/things/t/status",
                path("g.io", "things", None, Some("t"), Some("status")),
            ),
            ("/apis/g.io/v1/namespaces/ns/things/t/status/x", None),
            ("/apis/g.io/v1", None),
            ("/version", None),
            ("/api/v1/namespaces//pods", None),
        ];
        for (url, expected) in cases {
            assert_eq!(parse_path(url), expected, "{url}");
        }
    }

    #[test]
    fn queries_decode() {
        let query = "&labelSelector=app%3Denvoy%2Ctier+in+%28a%29&watch=true";
        assert_eq!(
            parse_query(query).unwrap(),
            vec![
                (
                    "labelSelector".to_string(),
                    "app=envoy,tier in (a)".to_string()
                ),
                ("watch".to_string(), "true".to_string()),
            ]
        );
        assert!(parse_query("a=%zz").is_err());
        assert!(parse_query("a=%f").is_err());
    }
}
