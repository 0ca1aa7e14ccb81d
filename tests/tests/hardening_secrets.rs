//! No secret material in any log line, at any level (design.md §4, docs/reliability.md).
//!
//! This test binary installs one global `tracing` subscriber at DEBUG (TRACE for the
//! marin3r crates), in text and JSON format, also receiving `log` records (rustls),
//! and captures everything in memory. It then runs the secret scenarios end to end with
//! a real Envoy: a `kubernetes.io/tls` Secret manifest behind `generateFromTlsSecret`
//! (tlsCertificate and validationContext), an Opaque Secret behind
//! `generateFromOpaqueSecret`, Secret rotation, malformed Secrets (bad base64, a YAML
//! syntax error on the line holding the value, a secret resource given inline with an
//! error), values at fields Envoy marks sensitive written in the wrong spelling (a
//! listener's `private_key` as a plain PEM string instead of `{inline_string: …}`, a TLS
//! `password` as a plain string, a camelCase `inlineString` password next to an unknown
//! key, a BasicAuth filter's htpasswd `users` as a plain string), and the discovery
//! service's own certificate reload (rotation, then a broken key file). Finally it
//! searches the captured output, the `/status` report and the state files
//! (`--state-dir`) for every private key (PEM body lines, base64 of the PEM as in a
//! Secret, DER bytes) and every secret value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use marin3r_sidecar::bootstrap::ApiType;
use marin3r_testkit::tls::cert_der;
use marin3r_testkit::{free_port, wait_ok};
use marin3r_tests::configs::{direct, envoy_config, http_listener, resource, sds_tls};
use marin3r_tests::xds::{CONVERGE, Envoy, Xds, get_tls, issue_bundle, localhost, write_atomic};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Everything every subscriber layer wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn capture_all_logs() -> Captured {
    let out = Captured::default();
    let text = out.clone();
    let json = out.clone();
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new(
            "debug,marin3r_xds=trace,marin3r_certs=trace,marin3r_sidecar=trace",
        ))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || text.clone()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(move || json.clone()),
        )
        .try_init()
        .expect("the only subscriber of this test binary");
    out
}

fn b64(s: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn tls_secret(name: &str, cert: &str, key: &str, ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n  ca.crt: {}\n",
        b64(cert),
        b64(key),
        b64(ca)
    )
}

/// A TLS listener on `port` whose certificate is the SDS secret `secret`, answering
/// `body`.
fn tls_listener(port: u16, secret: &str, body: &str) -> Value {
    resource(
        "listener",
        http_listener("https", port, direct(body), Some(sds_tls(secret))),
    )
}

/// `value` without its `spec` and `servedSpec` members, at any depth.
fn without_specs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("spec");
            map.remove("servedSpec");
            map.values_mut().for_each(without_specs);
        }
        Value::Array(items) => items.iter_mut().for_each(without_specs),
        _ => {}
    }
}

/// A listener that decodes up to its sensitive fields: a TLS transport socket with
/// `certificate` as its one `tls_certificates` entry, and/or an HTTP connection manager
/// whose BasicAuth filter has `users`.
fn leaky_listener(name: &str, certificate: Option<Value>, users: Option<Value>) -> Value {
    let hcm = json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": name,
            "route_config": {"name": name},
            "http_filters": [{
                "name": "envoy.filters.http.basic_auth",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth",
                    "users": users.unwrap_or_else(|| json!({"inline_string": "bob:{SHA}x"})),
                },
            }],
        },
    });
    let mut chain = json!({"filters": [hcm]});
    if let Some(certificate) = certificate {
        chain["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": {"tls_certificates": [certificate]},
            },
        });
    }
    resource(
        "listener",
        json!({
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}},
            "filter_chains": [chain],
        }),
    )
}

/// A new mTLS connection to the discovery service (makes it look at its certificate
/// files, which is when it reloads them).
async fn touch_xds(xds: &Xds) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(xds.bundle.ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![CertificateDer::from_pem_slice(xds.bundle.client.cert_pem.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(xds.bundle.client.key_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(xds.xdss).await.unwrap();
    // The handshake may fail (a rotated certificate from another CA): only the reload
    // it triggers matters here.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await;
}

/// Needles that must never appear in a log: for each private key, its PEM body lines,
/// the base64 of the whole PEM (a Secret's `data`), the start of that base64 shared by
/// every PEM private key, and its DER bytes as Rust would print them.
fn key_needles(key_pem: &str) -> Vec<String> {
    let mut out: Vec<String> = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_string)
        .collect();
    let encoded = b64(key_pem);
    out.push(encoded[..encoded.len().min(64)].to_string());
    out.push(encoded[encoded.len().saturating_sub(64)..].to_string());
    let der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let bytes = der.secret_der();
    let mid = &bytes[bytes.len() / 2..bytes.len() / 2 + 12];
    out.push(mid.iter().map(u8::to_string).collect::<Vec<_>>().join(", "));
    out.push(mid.iter().map(|b| format!("{b:02x}")).collect());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_material_in_any_log_line() {
    let logs = capture_all_logs();
    let node = "hard-secrets";
    let port = free_port().unwrap();
    let first = issue_bundle().unwrap();
    let second = issue_bundle().unwrap();
    const OPAQUE: &str = "opaque-Secret-Value-7f3a9c";
    const BROKEN_B64: &str = "BROKEN!KEY!MATERIAL!q8z";
    const YAML_SECRET: &str = "yaml-Syntax-Secret-55e1";
    const INLINE_SECRET: &str = "inline-Secret-Bytes-0d4b";
    const PASSWORD: &str = "tls-Key-Passw0rd-91c2";
    const CAMEL_PASSWORD: &str = "camel-Passw0rd-4e7d";
    const HTPASSWD: &str = "alice:{SHA}htpasswd-Needle-b3f1=";

    let config = envoy_config(
        node,
        vec![
            json!({"type": "secret", "generateFromTlsSecret": "hard-tls", "blueprint": "tlsCertificate"}),
            json!({"type": "secret", "generateFromTlsSecret": "hard-ca", "blueprint": "validationContext"}),
            json!({"type": "secret", "generateFromOpaqueSecret": {"name": "hard-opaque", "key": "password", "alias": "opaque"}}),
            tls_listener(port, "hard-tls", "tls ok\n"),
        ],
    );
    let opaque = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: hard-opaque\n  namespace: default\ntype: Opaque\ndata:\n  password: {}\nstringData:\n  other: {OPAQUE}-plain\n",
        b64(OPAQUE)
    );
    let state_dir = tempfile::tempdir().unwrap();
    let state_path = state_dir.path().to_path_buf();
    let files = [
        ("envoyconfig.json", config),
        (
            "secret-tls.yaml",
            tls_secret(
                "hard-tls",
                &first.server.cert_pem,
                &first.server.key_pem,
                &first.ca.cert_pem,
            ),
        ),
        (
            "secret-ca.yaml",
            tls_secret(
                "hard-ca",
                &first.ca.cert_pem,
                &first.ca.key_pem,
                &first.ca.cert_pem,
            ),
        ),
        ("secret-opaque.yaml", opaque),
    ];
    let xds = Xds::start_with(&files, |dir: &std::path::Path| {
        marin3r_control_plane::local::LocalBackend::new(dir).with_state_dir(&state_path)
    })
    .await
    .unwrap();
    let mut envoy = Envoy::start(&xds, node, ApiType::Sotw).unwrap();
    let addr: SocketAddr = localhost(port);
    let (leaf, _) = envoy
        .eventually(
            "TLS listener with the Secret's certificate",
            CONVERGE,
            || get_tls(addr, &first.ca.cert_pem),
        )
        .await
        .unwrap();
    assert_eq!(leaf, cert_der(&first.server.cert_pem).unwrap());

    // Rotate the Secret.
    write_atomic(
        &xds.file("secret-tls.yaml"),
        &tls_secret(
            "hard-tls",
            &second.server.cert_pem,
            &second.server.key_pem,
            &second.ca.cert_pem,
        ),
    )
    .unwrap();
    envoy
        .eventually(
            "TLS listener with the rotated certificate",
            CONVERGE,
            || get_tls(addr, &second.ca.cert_pem),
        )
        .await
        .unwrap();

    // Malformed secrets, each next to a config that uses it.
    let broken_node = "hard-secrets-broken";
    let broken = [
        (
            "broken-b64.yaml",
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: broken-b64, namespace: default}}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {BROKEN_B64}\n",
                b64(&first.server.cert_pem)
            ),
        ),
        (
            "broken-yaml.yaml",
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: broken-yaml, namespace: default}}\nstringData:\n  password: \"{YAML_SECRET}\n  tls.key: [{}\n",
                first.client.key_pem.replace('\n', " ")
            ),
        ),
        (
            "broken-config.json",
            envoy_config(
                broken_node,
                vec![
                    json!({"type": "secret", "generateFromTlsSecret": "broken-b64"}),
                    json!({"type": "secret", "generateFromOpaqueSecret": {"name": "broken-yaml", "key": "password", "alias": "p"}}),
                    json!({"type": "secret", "value": {"name": "inline-bad-b64", "generic_secret": {"secret": {"inline_bytes": format!("{INLINE_SECRET}!!")}}}}),
                    json!({"type": "secret", "value": {"name": "inline-typo", "tls_certificate": {
                        "private_key": {"inline_string": first.client.key_pem}, "certificate_chian": {}}}}),
                    json!({"type": "secret", "value": {"name": "inline-type", "generic_secret": {"secret": {"inline_string": 42, "inline_bytes": b64(INLINE_SECRET)}}}}),
                    // Sensitive fields in the wrong spelling, in resources that are decoded
                    // (a `secret` with a `value` is refused before decoding).
                    leaky_listener(
                        "leak-key",
                        Some(json!({
                            "certificate_chain": {"inline_string": first.server.cert_pem},
                            "private_key": second.client.key_pem,
                        })),
                        None,
                    ),
                    leaky_listener(
                        "leak-password",
                        Some(json!({
                            "private_key": {"inline_string": second.client.key_pem},
                            "password": PASSWORD,
                        })),
                        None,
                    ),
                    leaky_listener(
                        "leak-camel",
                        Some(json!({
                            "privateKey": {"inlineString": second.client.key_pem},
                            "password": {"inlineString": CAMEL_PASSWORD, "inlineStrin": CAMEL_PASSWORD},
                        })),
                        None,
                    ),
                    leaky_listener("leak-users", None, Some(json!(HTPASSWD))),
                ],
            ),
        ),
    ];
    for (name, text) in &broken {
        write_atomic(&xds.file(name), text).unwrap();
    }
    // Once the folder was scanned with them (the EnvoyConfig written last has a revision
    // in `/status`, so that scan read the Secrets written before it), the discovery
    // service's own certificate: rotated (reloaded on the next handshake), then replaced
    // by a broken key file.
    wait_ok("the broken files scanned", CONVERGE, || async {
        let report = xds.status_of(broken_node).await?;
        match report.desired_version {
            Some(_) => Ok(()),
            None => Err(format!("{report:?}")),
        }
    })
    .await;
    // What `/status` and the state files say about the broken config (its taint reason
    // quotes the decode errors).
    let stored = wait_ok(
        "the taint stored in /status and the state file",
        CONVERGE,
        || async {
            let status = marin3r_testkit::http::get(xds.metrics, "/status")
                .await?
                .body;
            let mut state = String::new();
            for entry in std::fs::read_dir(state_dir.path()).map_err(|e| e.to_string())? {
                let path = entry.map_err(|e| e.to_string())?.path();
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                // The revisions' specs are the config itself (as an EnvoyConfigRevision holds
                // it): what the service wrote about them is searched.
                let mut json: Value = serde_json::from_str(&text).unwrap_or_default();
                without_specs(&mut json);
                state.push_str(&json.to_string());
            }
            let expected = "private_key: expected a DataSource object, found a string";
            if status.contains("leak-key")
                && state.contains("leak-key")
                && status.contains(expected)
            {
                Ok(format!("{status}\n{state}"))
            } else {
                Err(format!("not yet: /status {status}\nstate {state}"))
            }
        },
    )
    .await;
    second.write_to(&xds.certs_dir).unwrap();
    touch_xds(&xds).await;
    let bad_key = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        b64(format!("{BROKEN_B64}{BROKEN_B64}"))
    );
    std::fs::write(xds.certs_dir.join("server/tls.key"), &bad_key).unwrap();
    touch_xds(&xds).await;
    // Envoy still serves the rotated certificate (nothing broke).
    envoy
        .eventually("TLS listener still up", CONVERGE, || {
            get_tls(addr, &second.ca.cert_pem)
        })
        .await
        .unwrap();
    drop(envoy);
    let ds_key = xds.bundle.server.key_pem.clone();
    xds.stop().await.unwrap();
    std::io::stdout().flush().ok();

    // The search: every log line, the `/status` report and the state files.
    let text = format!("{}\n{stored}", logs.text());
    let mut needles: Vec<(String, String)> = Vec::new();
    for (what, key) in [
        ("first server key", &first.server.key_pem),
        ("second server key", &second.server.key_pem),
        ("first CA key", &first.ca.key_pem),
        ("first client key", &first.client.key_pem),
        ("plain-string private key", &second.client.key_pem),
        ("discovery service key", &ds_key),
    ] {
        needles.extend(key_needles(key).into_iter().map(|n| (what.to_string(), n)));
    }
    for (what, value) in [
        ("opaque value", OPAQUE.to_string()),
        ("opaque value, base64", b64(OPAQUE)),
        ("broken base64 key", BROKEN_B64.to_string()),
        (
            "broken key file",
            b64(format!("{BROKEN_B64}{BROKEN_B64}"))[..24].to_string(),
        ),
        ("value on a YAML error line", YAML_SECRET.to_string()),
        ("inline secret bytes", INLINE_SECRET.to_string()),
        ("inline secret bytes, base64", b64(INLINE_SECRET)),
        ("TLS password as a plain string", PASSWORD.to_string()),
        ("camelCase TLS password", CAMEL_PASSWORD.to_string()),
        ("BasicAuth htpasswd line", HTPASSWD.to_string()),
        ("htpasswd hash", "htpasswd-Needle-b3f1".to_string()),
        (
            "any PEM private key, base64",
            "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t".to_string(),
        ),
        ("a PEM private key", "PRIVATE KEY-----".to_string()),
    ] {
        needles.push((what.to_string(), value));
    }
    let lines = text.lines().count();
    let leaks: Vec<String> = needles
        .iter()
        .filter_map(|(what, needle)| {
            text.lines()
                .find(|l| l.contains(needle.as_str()))
                .map(|l| format!("{what} ({needle:?}) in: {}", &l[..l.len().min(400)]))
        })
        .collect();
    // The scenarios did run and log: the malformed inputs and the reloads are reported.
    for expected in [
        "invalid base64",
        "cannot use manifest file",
        "reloaded TLS credentials",
        "reloading TLS credentials failed",
        "hard-secrets-broken",
        "expected a DataSource object, found a string (value not shown: sensitive)",
        "password: unknown field",
        "typed_config.users: expected a DataSource object",
    ] {
        let line = text.lines().find(|l| l.contains(expected));
        assert!(
            line.is_some(),
            "no {expected:?} in the {lines} captured log lines"
        );
        eprintln!("logged: {}", line.map_or("", |l| &l[..l.len().min(300)]));
    }
    eprintln!(
        "captured {lines} log lines ({} bytes, text and JSON, DEBUG and up), searched for {} needles: {} leaks",
        text.len(),
        needles.len(),
        leaks.len()
    );
    assert!(
        leaks.is_empty(),
        "secret material logged:\n{}",
        leaks.join("\n")
    );
}
