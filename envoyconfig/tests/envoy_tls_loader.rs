//! What Envoy 1.40's TLS context loader refuses although `envoy --mode validate` accepts
//! it (validate mode never builds TLS contexts): placeholder or broken inline PEM
//! certificates, keys and CAs, certificate and key algorithms Envoy does not load, a key
//! (decrypted with its password) that does not belong to its certificate, unknown ECDH
//! curves, cipher rules and signature algorithms. Each rule is a row of `tls_cases/cases.json` with its
//! twin that Envoy accepts; `tests/tests/tls_loader.rs` checks the same rows against the
//! real Envoy (`envoy --mode init_only`, which builds every listener's and cluster's TLS
//! context).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "tls_cases/mod.rs"]
mod tls_cases;

use marin3r_envoyconfig::decode::decode_resource;
use marin3r_envoyconfig::resource::ResourceType;
use serde_json::json;

fn verdict(case: &tls_cases::Case) -> Result<(), String> {
    let (is_listener, value) = tls_cases::resource(case);
    let kind = if is_listener {
        ResourceType::Listener
    } else {
        ResourceType::Cluster
    };
    decode_resource(kind, &value)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Every row: we refuse what Envoy refuses (with the field and the rule) and accept its
/// twin.
#[test]
fn every_case_of_the_table() {
    let cases = tls_cases::cases();
    assert!(cases.len() > 80, "{} cases", cases.len());
    let mut wrong = Vec::new();
    for case in &cases {
        let got = verdict(case);
        let good = match (&got, case.ours.as_str()) {
            (Ok(()), "accept") => true,
            (Err(e), want) => want != "accept" && e.contains(want),
            _ => false,
        };
        if !good {
            wrong.push(format!("{}: want {:?}, got {got:?}", case.name, case.ours));
        }
        // Both columns agree on the verdict.
        assert_eq!(
            case.ours == "accept",
            case.envoy == "accept",
            "{}",
            case.name
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn case(name: &str) -> tls_cases::Case {
    tls_cases::cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

/// The error names the resource and the full field path, and never echoes the content.
#[test]
fn errors_name_the_field_path_and_not_the_content() {
    let e = verdict(&case("placeholder private_key")).unwrap_err();
    assert_eq!(
        e,
        "listener \"l\": filter_chains[0].transport_socket.typed_config.common_tls_context.\
         tls_certificates[0].private_key: no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or \
         EC PRIVATE KEY block) (Envoy: Failed to load private key, NO_START_LINE)"
    );
    let e = verdict(&case("key of another EC certificate")).unwrap_err();
    assert!(!e.contains("BEGIN") && !e.contains("MIG"), "{e}");
    let e = verdict(&case("placeholder trusted_ca, upstream")).unwrap_err();
    assert_eq!(
        e,
        "cluster \"c\": transport_socket.typed_config.common_tls_context.validation_context.\
         trusted_ca: no PEM certificate (CERTIFICATE block) (Envoy: Failed to load trusted CA \
         certificates)"
    );
}

/// SDS: a Secret resource is loaded by Envoy the same way (its `tls_certificate` and
/// `validation_context`), so the same rules apply.
#[test]
fn secrets_too() {
    let good = case("EC P-256 certificate and PKCS#8 key");
    let bad = case("placeholder certificate_chain");
    let secret = |c: &tls_cases::Case| json!({"name": "s", "tls_certificate": c.context["tls_certificates"][0].clone()});
    decode_resource(ResourceType::Secret, &secret(&good)).unwrap();
    let e = decode_resource(ResourceType::Secret, &secret(&bad))
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("tls_certificate.certificate_chain: no PEM certificate (CERTIFICATE block) (Envoy: Failed to load certificate chain)"),
        "{e}"
    );
    let ca = case("placeholder trusted_ca");
    let secret =
        json!({"name": "s", "validation_context": ca.context["validation_context"].clone()});
    let e = decode_resource(ResourceType::Secret, &secret)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("validation_context.trusted_ca: no PEM certificate"),
        "{e}"
    );
    let ok = json!({"name": "s", "validation_context": case("trusted_ca").context["validation_context"].clone()});
    decode_resource(ResourceType::Secret, &ok).unwrap();
    // An encrypted key is decrypted with the Secret's password, which no error shows.
    let secret = |c: &tls_cases::Case| json!({"name": "s", "tls_certificate": c.context["tls_certificates"][0].clone()});
    let wrong = case("encrypted key with a wrong password");
    let e = decode_resource(ResourceType::Secret, &secret(&wrong))
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("tls_certificate.private_key: the encrypted private key does not decrypt with the given password (Envoy: Failed to load private key, BAD_DECRYPT)"),
        "{e}"
    );
    assert!(!e.contains("not-the-password"), "{e}");
    decode_resource(
        ResourceType::Secret,
        &secret(&case("encrypted key with its password")),
    )
    .unwrap();
}

/// A file, environment variable or SDS reference is not read here: only inline data is
/// checked.
#[test]
fn only_inline_data_is_checked() {
    let mut c = case("EC P-256 certificate and PKCS#8 key");
    c.context["tls_certificates"][0] = json!({
        "certificate_chain": {"filename": "/etc/certs/cert-data"},
        "private_key": {"environment_variable": "KEY"}});
    verdict(&c).unwrap();
}
