//! Reading Kubernetes manifest files, one way for every mode: local mode's config folder,
//! `marin3r validate`, `marin3r inject` and `operator render` all read files with
//! [`documents`], and Secrets defined by manifests are looked up with [`ManifestSecrets`].

use serde_json::Value;

use crate::secret::{SecretData, SecretSource};

/// The documents of a manifest file: multi-document YAML (`---`) or JSON. A `kind: List`
/// (what `kubectl get -o yaml` prints) is replaced by its `items`. Empty YAML documents
/// are dropped (a JSON `null` document is kept; callers skip it). Errors carry the line and column but never quote the input (it may hold Secret
/// data).
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> =
        match serde_saphyr::from_multiple_with_options(text, crate::text::yaml_options()) {
            Ok(docs) => docs,
            // JSON that the YAML parser refuses (e.g. tab indentation).
            Err(yaml) => match serde_json::from_str::<Value>(text) {
                Ok(doc) => vec![doc],
                Err(_) => return Err(format!("invalid YAML/JSON: {yaml}")),
            },
        };
    Ok(docs
        .into_iter()
        .flat_map(|doc| match (doc["kind"].as_str(), doc.get("items")) {
            (Some("List"), Some(Value::Array(items))) => items.clone(),
            _ => vec![doc],
        })
        .collect())
}

/// `kind: Secret` manifests (local mode's folder, the file given to `marin3r validate`),
/// each as (namespace, name, data).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManifestSecrets(pub Vec<(Option<String>, String, SecretData)>);

impl ManifestSecrets {
    /// What an EnvoyConfig of `namespace` sees: a Secret of the same name in the same
    /// namespace, or in none when either side has no namespace (the first one wins). An
    /// empty namespace is no namespace ([`marin3r_wire::given_namespace`]), as everywhere.
    pub fn for_namespace<'a>(&'a self, namespace: Option<&'a str>) -> impl SecretSource + 'a {
        NamespaceView {
            namespace,
            secrets: self,
        }
    }
}

struct NamespaceView<'a> {
    namespace: Option<&'a str>,
    secrets: &'a ManifestSecrets,
}

impl SecretSource for NamespaceView<'_> {
    fn get(&self, name: &str) -> Option<SecretData> {
        self.secrets
            .0
            .iter()
            .find(|(ns, n, _)| {
                n == name
                    && match (
                        marin3r_wire::given_namespace(ns.as_deref()),
                        marin3r_wire::given_namespace(self.namespace),
                    ) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            })
            .map(|(_, _, d)| d.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn documents_of_yaml_json_and_lists() {
        let docs = documents("a: 1\n---\n---\nkind: List\nitems: [{b: 2}, {c: 3}]\n").unwrap();
        assert_eq!(
            docs,
            [
                serde_json::json!({"a": 1}),
                serde_json::json!({"b": 2}),
                serde_json::json!({"c": 3})
            ]
        );
        assert_eq!(
            documents("{\n\t\"a\": 1}").unwrap(),
            [serde_json::json!({"a": 1})]
        );
        let err = documents("a: [1,\n").unwrap_err();
        assert!(err.starts_with("invalid YAML/JSON"), "{err}");
    }

    #[test]
    fn many_comment_lines_before_a_list_item() {
        // A YAML file with more than 32 comment lines before a list item (what Envoy's
        // own example configs have) reads like any other.
        let comments = "# comment\n".repeat(40);
        let text = format!("items:\n{comments}- a\n");
        assert_eq!(
            documents(&text).unwrap(),
            [serde_json::json!({"items": ["a"]})]
        );
    }

    #[test]
    fn secrets_are_matched_by_namespace_when_both_sides_have_one() {
        let data = |t: &str| SecretData {
            type_: t.to_string(),
            data: BTreeMap::new(),
        };
        let secrets = ManifestSecrets(vec![
            (Some("a".into()), "tls".into(), data("in-a")),
            (None, "tls".into(), data("anywhere")),
            (Some("b".into()), "only-b".into(), data("in-b")),
            (Some(String::new()), "blank".into(), data("blank")),
        ]);
        assert_eq!(
            secrets.for_namespace(Some("a")).get("tls").unwrap().type_,
            "in-a"
        );
        assert_eq!(
            secrets.for_namespace(Some("c")).get("tls").unwrap().type_,
            "anywhere"
        );
        assert_eq!(
            secrets.for_namespace(None).get("tls").unwrap().type_,
            "in-a"
        );
        assert!(secrets.for_namespace(Some("a")).get("only-b").is_none());
        assert!(secrets.for_namespace(None).get("only-b").is_some());
        // An empty namespace is no namespace, on either side.
        assert!(secrets.for_namespace(Some("")).get("only-b").is_some());
        assert!(secrets.for_namespace(Some("c")).get("blank").is_some());
    }
}
