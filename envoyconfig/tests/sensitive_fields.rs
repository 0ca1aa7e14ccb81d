//! No value written at or under a field Envoy marks sensitive
//! (`(udpa.annotations.sensitive) = true`) appears in a decode error, whatever its
//! spelling, and the error still names the field. The table runs over **every**
//! sensitive field of the registry, each inside the `typed_config` of an
//! `extensionConfig` resource (an `Any` reaches every message type), × field name
//! spellings (proto name, lowerCamelCase) × values (a plain string, a PEM private key, a
//! number, a list, an object with an unknown key, a `DataSource`-like object with each
//! of its string fields and an unknown sibling, `inline_bytes` with bad or good base64,
//! an `Any` payload) × input (JSON value, and the JSON text read as YAML).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use marin3r_envoyconfig::decode::{Serialization, decode_resource, decode_str};
use marin3r_envoyconfig::envoyconfig::{NoSecrets, validate_envoy_config};
use marin3r_envoyconfig::pem::redact_pem;
use marin3r_envoyconfig::resource::ResourceType;
use marin3r_envoyconfig::sensitive::sensitive_fields;
use prost_reflect::{FieldDescriptor, Kind};
use serde_json::{Value, json};

/// A recognisable PEM private key (not a real key: its body lines are unique needles).
fn pem(tag: &str) -> String {
    let mut out = String::from("-----BEGIN PRIVATE KEY-----\n");
    for i in 0..4 {
        let line =
            format!("MIIEv{tag}Q{i}ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789");
        out.push_str(&line[..64]);
        out.push('\n');
    }
    out.push_str("-----END PRIVATE KEY-----\n");
    out
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// What must not appear in an error: the value, its base64, each PEM body line, and the
/// PEM markers.
fn forbidden(needle: &str) -> Vec<String> {
    let mut out = vec![needle.to_string(), b64(needle)];
    if needle.contains("-----BEGIN") {
        out.extend(
            needle
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .map(str::to_string),
        );
        out.push("PRIVATE KEY-----".to_string());
    }
    out
}

/// One value to write at a sensitive field: the JSON, the texts it must not leak, and
/// whether it is invalid for the field (so the error is about it and must name it).
struct Case {
    what: String,
    value: Value,
    needles: Vec<String>,
    invalid: bool,
}

fn is_string_like(kind: &Kind) -> bool {
    matches!(kind, Kind::String | Kind::Bytes)
}

fn cases(field: &FieldDescriptor, tag: &str) -> Vec<Case> {
    let needle = format!("n33dle{tag}S3cr3t");
    let key_needle = format!("k3yNeedle{tag}x");
    let number = 98_765_432_123_u64 + tag.len() as u64;
    let pem = pem(tag);
    let kind = field.kind();
    let map_of_strings = field.is_map()
        && matches!(&kind, Kind::Message(m) if is_string_like(&m.map_entry_value_field().kind()));
    let singular_string = !field.is_map() && is_string_like(&kind);
    let mut out = vec![
        Case {
            what: "a plain string".into(),
            value: json!(needle),
            needles: forbidden(&needle),
            invalid: !singular_string,
        },
        Case {
            what: "a PEM private key as a plain string".into(),
            value: json!(pem),
            needles: forbidden(&pem),
            invalid: !singular_string,
        },
        Case {
            what: "a number".into(),
            value: json!(number),
            needles: vec![number.to_string()],
            invalid: true,
        },
        Case {
            what: "a list".into(),
            value: json!([needle, pem]),
            needles: [forbidden(&needle), forbidden(&pem)].concat(),
            invalid: !(field.is_list() && is_string_like(&kind)),
        },
        Case {
            what: "an object with an unknown key".into(),
            value: json!({ key_needle.clone(): needle }),
            needles: [forbidden(&needle), vec![key_needle.clone()]].concat(),
            invalid: !map_of_strings,
        },
    ];
    if let Kind::Message(m) = &kind
        && !field.is_map()
    {
        if m.full_name() == "google.protobuf.Any" {
            out.push(Case {
                what: "an Any payload with a string for a DataSource".into(),
                value: json!({
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.GenericSecret",
                    "secret": pem,
                }),
                needles: forbidden(&pem),
                invalid: true,
            });
        }
        for sub in m
            .fields()
            .filter(|f| is_string_like(&f.kind()) && !f.is_list())
        {
            for name in spellings(&sub) {
                let (text, needles) = if sub.kind() == Kind::Bytes {
                    (b64(&pem), forbidden(&pem))
                } else {
                    (pem.clone(), forbidden(&pem))
                };
                out.push(Case {
                    what: format!("{{{name}: …}} next to an unknown key"),
                    value: json!({ name.clone(): text, key_needle.clone(): 1 }),
                    needles: [needles, vec![key_needle.clone()]].concat(),
                    invalid: true,
                });
                if sub.kind() == Kind::Bytes {
                    let bad = format!("{needle}!!{}", &b64(&pem)[..40]);
                    out.push(Case {
                        what: format!("{{{name}: …}} with invalid base64"),
                        value: json!({ name.clone(): bad }),
                        needles: vec![needle.clone(), b64(&pem)[..40].to_string()],
                        invalid: true,
                    });
                } else {
                    out.push(Case {
                        what: format!("{{{name}: …}} as a number"),
                        value: json!({ name.clone(): number }),
                        needles: vec![number.to_string()],
                        invalid: true,
                    });
                }
            }
        }
    }
    out
}

/// The field's proto name and, when it differs, its JSON (lowerCamelCase) name.
fn spellings(field: &FieldDescriptor) -> Vec<String> {
    let mut out = vec![field.name().to_string()];
    if field.json_name() != field.name() {
        out.push(field.json_name().to_string());
    }
    out
}

#[test]
fn every_sensitive_field_of_the_registry_keeps_its_value_out_of_errors() {
    let fields = sensitive_fields();
    assert!(
        fields.len() >= 28,
        "only {} sensitive fields in the registry",
        fields.len()
    );
    let mut checked = 0;
    let mut leaks = Vec::new();
    let mut unnamed = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        let message = field.parent_message();
        for name in spellings(field) {
            for (j, case) in cases(field, &format!("{i}x{}", name.len()))
                .into_iter()
                .enumerate()
            {
                let resource = json!({
                    "name": "ext",
                    "typed_config": {
                        "@type": format!("type.googleapis.com/{}", message.full_name()),
                        name.clone(): case.value,
                    },
                });
                let what = format!(
                    "{} as {name:?}: {} (case {j})",
                    field.full_name(),
                    case.what
                );
                let json_text = serde_json::to_string(&resource).unwrap();
                let results = [
                    (
                        "JSON",
                        decode_resource(ResourceType::ExtensionConfig, &resource),
                    ),
                    (
                        "YAML",
                        decode_str(
                            ResourceType::ExtensionConfig,
                            &json_text,
                            Serialization::Yaml,
                        ),
                    ),
                ];
                for (input, result) in results {
                    checked += 1;
                    let text = match result {
                        Ok(_) if case.invalid => {
                            unnamed.push(format!("{what} [{input}]: decoded without error"));
                            continue;
                        }
                        Ok(_) => continue,
                        Err(e) => e.to_string(),
                    };
                    for needle in &case.needles {
                        if text.contains(needle.as_str()) {
                            leaks.push(format!("{what} [{input}]: {needle:?} in {text:?}"));
                        }
                    }
                    if case.invalid && !spellings(field).iter().any(|n| text.contains(n.as_str())) {
                        unnamed.push(format!("{what} [{input}]: field not named in {text:?}"));
                    }
                }
            }
        }
    }
    eprintln!(
        "{} sensitive fields, {checked} decodes: {} leaks, {} errors not naming the field",
        fields.len(),
        leaks.len(),
        unnamed.len()
    );
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    assert!(unnamed.is_empty(), "{}", unnamed.join("\n"));
}

/// The SRE's reproduction: a Secret resource with `private_key` written as a plain PEM
/// string, in each spelling and serialisation, and through a whole EnvoyConfig as the
/// validating webhook and `marin3r validate` check it.
#[test]
fn a_private_key_written_as_a_plain_string_is_not_quoted() {
    let key = pem("repro");
    let block: String = key.lines().map(|l| format!("      {l}\n")).collect();
    let yaml = format!("name: s\ntls_certificate:\n  private_key: |\n{block}");
    let camel_yaml = format!("name: s\ntlsCertificate:\n  privateKey: |\n{block}");
    let texts = [
        decode_resource(
            ResourceType::Secret,
            &json!({"name": "s", "tls_certificate": {"private_key": key}}),
        )
        .unwrap_err()
        .to_string(),
        decode_resource(
            ResourceType::Secret,
            &json!({"name": "s", "tlsCertificate": {"privateKey": key}}),
        )
        .unwrap_err()
        .to_string(),
        decode_str(ResourceType::Secret, &yaml, Serialization::Yaml)
            .unwrap_err()
            .to_string(),
        decode_str(ResourceType::Secret, &camel_yaml, Serialization::Yaml)
            .unwrap_err()
            .to_string(),
    ];
    assert_eq!(
        texts[0],
        "secret \"s\": tls_certificate.private_key: expected a DataSource object, found a \
         string (value not shown: sensitive)"
    );
    assert_eq!(
        texts[1],
        "secret \"s\": tlsCertificate.privateKey: expected a DataSource object, found a \
         string (value not shown: sensitive)"
    );
    let tls = json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"tls_certificates": [{
                "certificate_chain": {"inline_string": "x"},
                "private_key": key,
            }]},
        },
    });
    let password = json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"tls_certificates": [{
                "certificate_chain": {"inline_string": "x"},
                "private_key": {"inline_string": "y"},
                "password": "pkcs-Passw0rd-99",
            }]},
        },
    });
    let ticket_keys = json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "sessionTicketKeys": {"keys": [{"inlineBytes": "!!tick3t-Key-Needle"}]},
        },
    });
    let hcm = json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "l",
            "route_config": {"name": "r"},
            "http_filters": [{
                "name": "envoy.filters.http.basic_auth",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth",
                    "users": "alice:{SHA}htpasswd-Needle-42=",
                },
            }],
        },
    });
    let listener = |name: &str, socket: &Value, filter: &Value| {
        json!({"type": "listener", "value": {
            "name": name,
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
            "filter_chains": [{"transport_socket": socket, "filters": [filter]}],
        }})
    };
    let plain = json!({"name": "envoy.filters.network.echo", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo"}});
    let config = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"nodeID": "n", "resources": [
            listener("key", &tls, &plain),
            listener("tickets", &ticket_keys, &plain),
            listener("users", &json!(null), &hcm),
            listener("password", &password, &plain),
        ]},
    });
    let errors = validate_envoy_config(&config, &NoSecrets).unwrap_err();
    let denial = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    assert_eq!(errors.len(), 4, "{denial}");
    for text in texts.iter().chain([&denial]) {
        for needle in forbidden(&key).into_iter().chain(
            [
                "pkcs-Passw0rd-99",
                "tick3t-Key-Needle",
                "htpasswd-Needle-42",
            ]
            .map(String::from),
        ) {
            assert!(!text.contains(&needle), "{needle:?} in {text:?}");
        }
    }
    for field in [
        "tls_certificates[0].private_key",
        "sessionTicketKeys.keys[0].inlineBytes: invalid base64",
        "tls_certificates[0].password: expected a DataSource object, found a string",
        "http_filters[0].typed_config.users",
    ] {
        assert!(denial.contains(field), "{field} not named in {denial:?}");
    }
}

/// Defence in depth: whatever produced an error's text, its `Display` shows no PEM block.
#[test]
fn error_display_never_shows_a_pem_block() {
    let key = pem("display");
    let text = redact_pem(&format!("spec.resources[0]: bad value {key:?} here")).into_owned();
    for needle in forbidden(&key) {
        assert!(!text.contains(&needle), "{needle:?} in {text:?}");
    }
    assert!(text.starts_with("spec.resources[0]: bad value"), "{text}");
    assert!(text.ends_with(" here"), "{text}");
}

/// A sensitive field inside a `TypedStruct`'s `value` (checked against the type its
/// `type_url` names, as Envoy does) is kept out of the error too.
#[test]
fn a_typed_struct_value_is_covered() {
    for type_url_field in ["type_url", "typeUrl"] {
        let resource = json!({
            "name": "ext",
            "typed_config": {
                "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
                type_url_field: "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth",
                "value": {"users": ["alice:{SHA}typedStruct-Needle="]},
            },
        });
        let text = decode_resource(ResourceType::ExtensionConfig, &resource)
            .unwrap_err()
            .to_string();
        assert!(!text.contains("typedStruct-Needle"), "{text}");
        assert!(
            text.contains("typed_config.value.users: expected a DataSource object, found a list"),
            "{text}"
        );
    }
}
