//! EnvoyConfig normalisation: both spec forms, generated secrets and endpoints, every
//! error at once, secrets kept out of errors, `validate_file`, and the CRD.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResourceExt;
use marin3r_envoyconfig::decode::{DecodeError, to_json};
use marin3r_envoyconfig::envoyconfig::{
    EnvoyConfig, EnvoyConfigSpec, NoSecrets, SecretData, SecretSource, parse_envoy_config, resolve,
    validate_file,
};
use marin3r_envoyconfig::resource::{Resource, ResourceType};
use prost::Message;
use serde_json::{Value, json};

// Real (throwaway) PEM data: Envoy's TLS loader, and so the decoder, refuses placeholders.
const CERT: &[u8] = include_bytes!("tls_cases/ec.crt");
const KEY: &[u8] = include_bytes!("tls_cases/ec.key");
const CA: &[u8] = include_bytes!("tls_cases/rsa.crt");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/decode/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn config(name: &str) -> EnvoyConfig {
    let text = fixture(name);
    let doc: Value = if name.ends_with(".json") {
        serde_json::from_str(&text).unwrap()
    } else {
        serde_saphyr::from_str(&text).unwrap()
    };
    parse_envoy_config(&doc).unwrap()
}

fn spec(value: Value) -> EnvoyConfigSpec {
    serde_json::from_value(value).unwrap()
}

fn tls_secrets() -> BTreeMap<String, SecretData> {
    let mut data = BTreeMap::new();
    data.insert("tls.crt".to_string(), CERT.to_vec());
    data.insert("tls.key".to_string(), KEY.to_vec());
    let mut with_ca = data.clone();
    with_ca.insert("ca.crt".to_string(), CA.to_vec());
    let mut opaque = BTreeMap::new();
    opaque.insert("token".to_string(), b"TOPSECRETTOKEN".to_vec());
    BTreeMap::from([
        (
            "kuard-certificate".to_string(),
            SecretData {
                type_: "kubernetes.io/tls".into(),
                data,
            },
        ),
        (
            "with-ca".to_string(),
            SecretData {
                type_: "kubernetes.io/tls".into(),
                data: with_ca,
            },
        ),
        (
            "opaque".to_string(),
            SecretData {
                type_: "Opaque".into(),
                data: opaque,
            },
        ),
    ])
}

fn errors(spec: &EnvoyConfigSpec, secrets: &dyn SecretSource) -> Vec<String> {
    resolve(spec, secrets)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn by_name<'a>(resources: &'a [Resource], kind: ResourceType, name: &str) -> &'a Resource {
    resources
        .iter()
        .find(|r| r.kind == kind && r.name == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn kuard_tls_walkthrough_resolves() {
    let ec = config("kuard_tls.yaml");
    assert_eq!(ec.spec.node_id, "kuard");
    let resources = resolve(&ec.spec, &tls_secrets()).unwrap();
    let names: Vec<(ResourceType, &str)> = resources
        .iter()
        .map(|r| (r.kind, r.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            (ResourceType::Secret, "kuard-certificate"),
            (ResourceType::Cluster, "kuard"),
            (ResourceType::Listener, "https"),
        ]
    );
    let listener = to_json(by_name(&resources, ResourceType::Listener, "https")).unwrap();
    let tls = &listener["filterChains"][0]["transportSocket"]["typedConfig"];
    assert_eq!(
        tls["commonTlsContext"]["tlsCertificateSdsSecretConfigs"][0],
        json!({"name": "kuard-certificate", "sdsConfig": {"ads": {}, "resourceApiVersion": "V3"}})
    );
}

#[test]
fn deprecated_form_and_camel_case_give_identical_resources() {
    let secrets = tls_secrets();
    let new = resolve(&config("kuard_tls.yaml").spec, &secrets).unwrap();
    let old = resolve(&config("kuard_tls_deprecated.yaml").spec, &secrets).unwrap();
    let camel = resolve(&config("kuard_tls_camel.json").spec, &secrets).unwrap();
    assert_eq!(old.len(), 3);
    for r in &new {
        assert_eq!(by_name(&old, r.kind, &r.name), r, "{} {}", r.kind, r.name);
        assert_eq!(by_name(&camel, r.kind, &r.name), r, "{} {}", r.kind, r.name);
    }
}

#[test]
fn deprecated_json_strings_and_runtime_alias() {
    let s = spec(json!({
        "nodeID": "n",
        "envoyResources": {
            "clusters": [{"name": "ignored", "value": r#"{"name": "c", "connect_timeout": "1s"}"#}],
            "runtime": [{"value": r#"{"name": "rt", "layer": {"a": 1}}"#}],
            "extensionConfigs": [{"value": r#"{"name": "x", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}"#}]
        }
    }));
    let resources = resolve(&s, &NoSecrets).unwrap();
    assert_eq!(resources.len(), 3);
    by_name(&resources, ResourceType::Runtime, "rt");
    by_name(&resources, ResourceType::ExtensionConfig, "x");

    // JSON serialization (the default) rejects YAML strings, with the path.
    let s = spec(json!({"nodeID": "n", "envoyResources": {"clusters": [{"value": "name: c"}]}}));
    let e = errors(&s, &NoSecrets);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("cluster: spec.envoyResources.clusters[0].value: invalid json: "),
        "{e:?}"
    );
}

#[test]
fn direct_response_walkthrough_resolves() {
    let ec = config("direct_response.yaml");
    let resources = resolve(&ec.spec, &NoSecrets).unwrap();
    assert_eq!(resources.len(), 1);
    let l = to_json(&resources[0]).unwrap();
    let hcm = &l["filterChains"][0]["filters"][0]["typedConfig"];
    assert_eq!(
        hcm["routeConfig"]["virtualHosts"][0]["routes"][0]["directResponse"],
        json!({"status": 200})
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let s = spec(json!({
        "nodeID": "n",
        "resources": [
            {"type": "listener", "value": {"name": "a", "bogus": 1}},
            {"type": "listener", "value": {"name": "b", "filter_chains": [{"filters": [{"name": "x",
                "typed_config": {"@type": "type.googleapis.com/foo.Bar"}}]}]}},
            {"type": "cluster", "value": {"name": "c", "connect_timeout": "soon"}},
            {"type": "cluster", "value": {"type": "STATIC"}},
            {"type": "bogus", "value": {}},
            {"type": "cluster", "value": {"name": "d"}},
            {"type": "cluster", "value": {"name": "d"}},
            {"type": "secret", "generateFromTlsSecret": "missing"},
            {"type": "cluster"},
            {"type": "secret", "value": {"name": "s"}},
            {"type": "listener", "blueprint": "tlsCertificate", "value": {"name": "e"}},
            {"type": "endpoint", "generateFromEndpointSlices": {"clusterName": "k", "targetPort": "http"}}
        ]
    }));
    let e = errors(&s, &NoSecrets);
    let expected_prefixes = [
        r#"listener "a": spec.resources[0].value: unknown field "bogus""#,
        r#"listener "b": spec.resources[1].value.filter_chains[0].filters[0].typed_config: unknown type URL type.googleapis.com/foo.Bar"#,
        r#"cluster "c": spec.resources[2].value.connect_timeout: "#,
        "cluster: spec.resources[3].value: missing resource name (field name)",
        r#"spec.resources[4].type: unknown resource type "bogus""#,
        r#"cluster "d": spec.resources[6].value: duplicate cluster name "d" (first at spec.resources[5].value)"#,
        r#"secret "missing": spec.resources[7].generateFromTlsSecret: secret "missing" not found"#,
        "spec.resources[8].value: type cluster needs value",
        "spec.resources[9].value: type secret takes generateFromTlsSecret or generateFromOpaqueSecret, not value",
        "spec.resources[10].blueprint: only with generateFromTlsSecret",
        r#"endpoint "k": spec.resources[11].generateFromEndpointSlices: generateFromEndpointSlices needs Kubernetes mode"#,
    ];
    assert_eq!(e.len(), expected_prefixes.len(), "{e:#?}");
    for (got, want) in e.iter().zip(expected_prefixes) {
        assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn forms_are_exclusive() {
    let both = spec(json!({"nodeID": "n", "resources": [], "envoyResources": {}}));
    assert_eq!(
        errors(&both, &NoSecrets),
        ["spec: set either resources or the deprecated envoyResources, not both"]
    );
    let neither = spec(json!({"nodeID": "n"}));
    assert_eq!(
        errors(&neither, &NoSecrets),
        ["spec: one of resources or envoyResources must be set"]
    );
    let empty = spec(json!({"nodeID": "n", "resources": []}));
    assert!(resolve(&empty, &NoSecrets).unwrap().is_empty());
}

#[test]
fn generate_from_tls_secret_blueprints() {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
    let s = spec(json!({"nodeID": "n", "resources": [
        {"type": "secret", "generateFromTlsSecret": "kuard-certificate"},
        {"type": "secret", "generateFromTlsSecret": "with-ca", "blueprint": "validationContext"},
        {"type": "secret", "generateFromTlsSecret": "with-ca"},
        {"type": "secret", "generateFromOpaqueSecret": {"name": "opaque", "key": "token", "alias": "api-token"}}
    ]}));
    // with-ca twice: once as validation context, once as certificate → duplicate name.
    let e = errors(&s, &tls_secrets());
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains(r#"duplicate secret name "with-ca""#), "{e:?}");

    let s = spec(json!({"nodeID": "n", "resources": [
        {"type": "secret", "generateFromTlsSecret": "kuard-certificate"},
        {"type": "secret", "generateFromTlsSecret": "with-ca", "blueprint": "validationContext"},
        {"type": "secret", "generateFromOpaqueSecret": {"name": "opaque", "key": "token", "alias": "api-token"}}
    ]}));
    let resources = resolve(&s, &tls_secrets()).unwrap();
    let inline = |ds: Option<envoy_types::pb::envoy::config::core::v3::DataSource>| match ds
        .unwrap()
        .specifier
        .unwrap()
    {
        Specifier::InlineBytes(b) => b,
        other => panic!("{other:?}"),
    };

    let tls = Secret::decode(resources[0].body.value.as_slice()).unwrap();
    assert_eq!(tls.name, "kuard-certificate");
    let Some(secret::Type::TlsCertificate(cert)) = tls.r#type else {
        panic!("not a tls_certificate")
    };
    assert_eq!(inline(cert.certificate_chain), CERT);
    assert_eq!(inline(cert.private_key), KEY);

    let vc = Secret::decode(resources[1].body.value.as_slice()).unwrap();
    assert_eq!(vc.name, "with-ca");
    let Some(secret::Type::ValidationContext(ctx)) = vc.r#type else {
        panic!("not a validation_context")
    };
    assert_eq!(inline(ctx.trusted_ca), CA);

    let generic = Secret::decode(resources[2].body.value.as_slice()).unwrap();
    assert_eq!(generic.name, "api-token");
    let Some(secret::Type::GenericSecret(g)) = generic.r#type else {
        panic!("not a generic_secret")
    };
    assert_eq!(inline(g.secret), b"TOPSECRETTOKEN");

    // Validation context without ca.crt falls back to tls.crt.
    let s = spec(json!({"nodeID": "n", "resources": [
        {"type": "secret", "generateFromTlsSecret": "kuard-certificate", "blueprint": "validationContext"}
    ]}));
    let resources = resolve(&s, &tls_secrets()).unwrap();
    let vc = Secret::decode(resources[0].body.value.as_slice()).unwrap();
    let Some(secret::Type::ValidationContext(ctx)) = vc.r#type else {
        panic!("not a validation_context")
    };
    assert_eq!(inline(ctx.trusted_ca), CERT);
}

#[test]
fn secret_material_never_appears_in_errors() {
    let mut secrets = tls_secrets();
    // A TLS secret without its key, and an Opaque one used as TLS.
    secrets
        .get_mut("kuard-certificate")
        .unwrap()
        .data
        .remove("tls.key");
    let s = spec(json!({"nodeID": "n", "resources": [
        {"type": "secret", "generateFromTlsSecret": "kuard-certificate"},
        {"type": "secret", "generateFromTlsSecret": "opaque"},
        {"type": "secret", "generateFromOpaqueSecret": {"name": "opaque", "key": "nope", "alias": "x"}},
        {"type": "secret", "generateFromOpaqueSecret": {"name": "absent", "key": "k", "alias": "y"}}
    ]}));
    let errs = resolve(&s, &secrets).unwrap_err();
    let text: Vec<String> = errs.iter().map(|e| format!("{e} {e:?}")).collect();
    assert_eq!(errs.len(), 4, "{text:#?}");
    assert!(matches!(errs[0], DecodeError::MissingSecretKey { ref key, .. } if key == "tls.key"));
    assert!(matches!(errs[1], DecodeError::SecretType { ref actual, .. } if actual == "Opaque"));
    assert!(matches!(errs[2], DecodeError::MissingSecretKey { ref key, .. } if key == "nope"));
    assert!(matches!(errs[3], DecodeError::MissingSecret { ref secret, .. } if secret == "absent"));
    assert_eq!(
        errs[3].to_string(),
        r#"secret "y": spec.resources[3].generateFromOpaqueSecret: secret "absent" not found"#
    );
    let debug = format!("{:?}", secrets);
    for t in text.iter().chain([&debug]) {
        assert!(!t.contains("TOPSECRET"), "{t}");
        assert!(!t.contains("VE9QU0VDUkVU"), "{t}"); // base64 of TOPSECRET
    }
    assert!(debug.contains("tls.crt"), "{debug}");
}

struct Slices(Vec<EndpointSlice>);

impl SecretSource for Slices {
    fn get(&self, _: &str) -> Option<SecretData> {
        None
    }
    fn endpoint_slices(&self, _: Option<&LabelSelector>) -> Option<Vec<Arc<EndpointSlice>>> {
        Some(self.0.iter().cloned().map(Arc::new).collect())
    }
}

#[test]
fn endpoint_slices_become_a_cluster_load_assignment() {
    let endpoint = |ip: &str, ready: Option<bool>, terminating: Option<bool>| Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready,
            serving: None,
            terminating,
        }),
        ..Default::default()
    };
    let slice = EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: vec![
            endpoint("10.0.0.1", Some(true), None),
            endpoint("10.0.0.2", Some(false), None),
            endpoint("10.0.0.3", Some(true), Some(true)),
            endpoint("not-an-ip", Some(true), None),
        ]
        .into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let s = spec(json!({"nodeID": "n", "resources": [
        {"type": "endpoint", "generateFromEndpointSlices": {
            "selector": {"matchLabels": {"app": "kuard"}}, "clusterName": "kuard", "targetPort": "http"}}
    ]}));
    let resources = resolve(&s, &Slices(vec![slice.clone()])).unwrap();
    assert_eq!(resources[0].name, "kuard");
    let cla = to_json(&resources[0]).unwrap();
    let eps = cla["endpoints"][0]["lbEndpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 3);
    assert_eq!(
        eps[0]["endpoint"]["address"]["socketAddress"],
        json!({"address": "10.0.0.1", "portValue": 8080})
    );
    let health: Vec<&str> = eps
        .iter()
        .map(|e| e["healthStatus"].as_str().unwrap())
        .collect();
    assert_eq!(health, ["HEALTHY", "UNHEALTHY", "DRAINING"]);

    let wrong_port = spec(json!({"nodeID": "n", "resources": [
        {"type": "endpoint", "generateFromEndpointSlices": {"clusterName": "kuard", "targetPort": "grpc"}}
    ]}));
    let e = errors(&wrong_port, &Slices(vec![slice]));
    assert!(e[0].contains(r#"has no port named "grpc""#), "{e:?}");
}

#[test]
fn validate_file_checks_every_config() {
    assert_eq!(validate_file(&fixture("kuard_tls.yaml")), Ok(1));
    assert_eq!(validate_file(&fixture("kuard_tls_deprecated.yaml")), Ok(1));
    assert_eq!(validate_file(&fixture("kuard_tls_camel.json")), Ok(1));
    assert_eq!(validate_file(&fixture("direct_response.yaml")), Ok(1));
    let all = [fixture("kuard_tls.yaml"), fixture("direct_response.yaml")].join("\n---\n");
    assert_eq!(validate_file(&all), Ok(2));

    let lines = validate_file(&fixture("broken.yaml")).unwrap_err();
    let expected = [
        r#"[2] EnvoyConfig default/broken: listener "https": spec.resources[0].value.filter_chains[0]: unknown field "bogus""#,
        r#"[2] EnvoyConfig default/broken: listener "other": spec.resources[1].value.filter_chains[0].filters[0].typed_config: unknown type URL type.googleapis.com/foo.Bar"#,
        r#"[2] EnvoyConfig default/broken: secret "kuard-certificate": spec.resources[3].generateFromTlsSecret: secret "kuard-certificate" has no key "tls.key""#,
        r#"[3] EnvoyConfig default/broken-spec: spec.resources[0].blueprint: unknown variant `certificate`"#,
        "[4] not a Kubernetes object (no kind)",
    ];
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (got, want) in lines.iter().zip(expected) {
        assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
    }
    assert!(lines.iter().all(|l| !l.contains("TOPSECRET")));

    assert!(validate_file("kind: [").unwrap_err()[0].starts_with("invalid YAML/JSON: "));
}

#[test]
fn crd_has_the_upstream_shape() {
    let crd = serde_json::to_value(EnvoyConfig::crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "envoyconfigs.marin3r.3scale.net");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["ec"]));
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns: Vec<(&str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Node ID", ".spec.nodeID"),
            ("Envoy API", ".spec.envoyAPI"),
            ("Desired Version", ".status.desiredVersion"),
            ("Published Version", ".status.publishedVersion"),
            ("Cache State", ".status.cacheState"),
        ]
    );
    let schema = &version["schema"]["openAPIV3Schema"]["properties"];
    let spec = &schema["spec"];
    assert_eq!(spec["required"], json!(["nodeID"]));
    let resource = &spec["properties"]["resources"]["items"];
    assert_eq!(
        resource["properties"]["value"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(
        resource["properties"]["type"]["enum"],
        json!([
            "cluster",
            "endpoint",
            "listener",
            "route",
            "scopedRoute",
            "secret",
            "runtime",
            "extensionConfig"
        ])
    );
    assert_eq!(
        resource["properties"]["blueprint"]["enum"],
        json!(["tlsCertificate", "validationContext"])
    );
    // A plain string, as upstream's: an enum there is an unsafe upgrade of upstream's CRD
    // (docs/olm.md); the discovery service writes it from `CacheState`.
    let cache_state = &schema["status"]["properties"]["cacheState"];
    assert_eq!(cache_state["type"], "string");
    assert!(cache_state.get("enum").is_none(), "{cache_state}");
}

#[test]
fn manifest_round_trips() {
    let ec = config("kuard_tls.yaml");
    let value = serde_json::to_value(&ec).unwrap();
    assert_eq!(value["apiVersion"], "marin3r.3scale.net/v1alpha1");
    assert_eq!(value["kind"], "EnvoyConfig");
    assert_eq!(value["spec"]["nodeID"], "kuard");
    assert_eq!(value["spec"]["envoyAPI"], "v3");
    assert_eq!(parse_envoy_config(&value).unwrap(), ec);
    let wrong = json!({"apiVersion": "marin3r.3scale.net/v1", "kind": "EnvoyConfig"});
    assert!(
        parse_envoy_config(&wrong)
            .unwrap_err()
            .to_string()
            .starts_with("apiVersion: ")
    );
}

#[test]
fn validate_file_accepts_lists_and_tab_indented_json() {
    let ec: Value = serde_saphyr::from_str(&fixture("direct_response.yaml")).unwrap();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [ec.clone(), ec]});
    // Two configs with the same content are fine: names are unique per config.
    assert_eq!(
        validate_file(&serde_saphyr::to_string(&list).unwrap()),
        Ok(2)
    );
    let tabbed = serde_json::to_string_pretty(&list)
        .unwrap()
        .replace("  ", "\t");
    assert_eq!(validate_file(&tabbed), Ok(2));
}

/// A Kubernetes TLS Secret whose data Envoy's TLS loader would refuse (a placeholder
/// key, a certificate that is not PEM) is refused with the generated field and the
/// rule, and without the data.
#[test]
fn tls_secret_data_envoy_would_refuse() {
    let mut secrets = tls_secrets();
    secrets
        .get_mut("kuard-certificate")
        .unwrap()
        .data
        .insert("tls.key".to_string(), b"TOPSECRET-key-data".to_vec());
    let s = spec(json!({"nodeID": "n", "resources": [
        {"type": "secret", "generateFromTlsSecret": "kuard-certificate"}
    ]}));
    let e = resolve(&s, &secrets).unwrap_err();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(matches!(e[0], DecodeError::TlsMaterial { .. }), "{e:?}");
    let text = format!("{} {:?}", e[0], e[0]);
    assert!(
        e[0].to_string().starts_with(
            "secret \"kuard-certificate\": spec.resources[0].generateFromTlsSecret: the Envoy \
             secret's tls_certificate.private_key: no PEM private key"
        ),
        "{text}"
    );
    assert!(!text.contains("TOPSECRET"), "{text}");
}
