//! The webhook as the API server sees it: bad input answered with 400 + JSON through the
//! router, and a real HTTPS socket whose certificate is rotated on disk while it runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

mod common;

use common::{bundle, cert_der, labelled_pod, pod_review, read_response, start, state};
use marin3r_certs::Bundle;
use marin3r_webhook::{MAX_BODY_BYTES, MUTATE_PATH, Timeouts};

async fn post(body: Vec<u8>) -> (StatusCode, Value) {
    common::post(state(), MUTATE_PATH, body).await
}

#[tokio::test]
async fn bad_input_gets_400_with_a_json_error() {
    let huge = {
        let mut r = pod_review("abc", labelled_pod());
        r["request"]["object"]["metadata"]["annotations"]["x"] = json!("a".repeat(MAX_BODY_BYTES));
        serde_json::to_vec(&r).unwrap()
    };
    let mut wrong_version = pod_review("abc", labelled_pod());
    wrong_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_uid = pod_review("abc", labelled_pod());
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let mut wrong_kind = pod_review("abc", labelled_pod());
    wrong_kind["kind"] = json!("ConfigMap");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage",
            b"\x00\xffnot json at all".to_vec(),
            "not an AdmissionReview",
        ),
        ("empty", Vec::new(), "not an AdmissionReview"),
        (
            "json but not an object",
            b"\"hello\"".to_vec(),
            "not an AdmissionReview",
        ),
        (
            "wrong apiVersion",
            serde_json::to_vec(&wrong_version).unwrap(),
            "expected apiVersion",
        ),
        (
            "wrong kind",
            serde_json::to_vec(&wrong_kind).unwrap(),
            "expected apiVersion",
        ),
        (
            "missing uid",
            serde_json::to_vec(&no_uid).unwrap(),
            "request.uid is missing",
        ),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "has no request",
        ),
        ("huge body", huge, "exceeds"),
        (
            "deeply nested",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
            "not an AdmissionReview",
        ),
    ];
    for (name, body, msg) in cases {
        let (status, v) = post(body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}");
        let err = v["error"].as_str().unwrap_or_default();
        assert!(err.contains(msg), "{name}: {err:?} should contain {msg:?}");
    }
}

#[tokio::test]
async fn valid_reviews_are_answered_with_200() {
    // Not a Pod: allowed unchanged.
    let mut cm = pod_review("abc", json!({"metadata": {"name": "c"}, "data": {}}));
    cm["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let (status, v) = post(serde_json::to_vec(&cm).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"], json!({"uid": "abc", "allowed": true}));

    // Pod without the label: allowed unchanged.
    let mut pod = labelled_pod();
    pod["metadata"]["labels"] = json!({});
    let (_, v) = post(serde_json::to_vec(&pod_review("abc", pod)).unwrap()).await;
    assert_eq!(v["response"], json!({"uid": "abc", "allowed": true}));

    // UPDATE of a labelled Pod: allowed unchanged (the webhook only mutates CREATE).
    let mut upd = pod_review("abc", labelled_pod());
    upd["request"]["operation"] = json!("UPDATE");
    let (_, v) = post(serde_json::to_vec(&upd).unwrap()).await;
    assert_eq!(v["response"], json!({"uid": "abc", "allowed": true}));

    // Labelled Pod with an invalid annotation: denied with the aggregated message.
    let mut bad = labelled_pod();
    bad["metadata"]["annotations"]["marin3r.3scale.net/ports"] = json!("http:80");
    bad["metadata"]["annotations"]["marin3r.3scale.net/admin.port"] = json!("abc");
    let (status, v) = post(serde_json::to_vec(&pod_review("abc", bad)).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 400);
    assert_eq!(
        v["response"]["status"]["message"],
        "invalid marin3r annotations: ports: port 80 is privileged (1024-65535); admin.port: \"abc\" is not a number"
    );

    // Annotation values that are not strings: denied, naming the field.
    let mut weird = labelled_pod();
    weird["metadata"]["annotations"]["marin3r.3scale.net/admin.port"] = json!(9901);
    let (_, v) = post(serde_json::to_vec(&pod_review("abc", weird)).unwrap()).await;
    assert_eq!(v["response"]["allowed"], false);
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("admin.port")
    );

    // A Pod without spec.containers: denied, not a 500.
    let mut nospec = labelled_pod();
    nospec.as_object_mut().unwrap().remove("spec");
    let (status, v) = post(serde_json::to_vec(&pod_review("abc", nospec)).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"]["allowed"], false);
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec")
    );
}

// ---------------------------------------------------------------- HTTPS socket tests

/// Writes the server cert/key the way cert-manager and the kubelet do: replace, not edit.
fn install_server_cert(dir: &Path, b: &Bundle) {
    let server = dir.join("server");
    std::fs::create_dir_all(&server).unwrap();
    for (name, content) in [
        ("tls.crt", &b.server.cert_pem),
        ("tls.key", &b.server.key_pem),
    ] {
        let tmp = server.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, server.join(name)).unwrap();
    }
}

/// One HTTPS request; returns (peer certificate, negotiated version, status code, body).
async fn https_request(
    addr: SocketAddr,
    roots: &[&Bundle],
    request: &str,
) -> (
    CertificateDer<'static>,
    rustls::ProtocolVersion,
    u16,
    String,
) {
    let mut store = rustls::RootCertStore::empty();
    for b in roots {
        store.add(cert_der(&b.ca.cert_pem)).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (peer, version) = {
        let (_, conn) = tls.get_ref();
        (
            conn.peer_certificates().unwrap()[0].clone().into_owned(),
            conn.protocol_version().unwrap(),
        )
    };
    tls.write_all(request.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut tls).await.unwrap();
    (peer, version, status, body)
}

fn mutate_request() -> String {
    let body = pod_review("abc", labelled_pod()).to_string();
    format!(
        "POST {MUTATE_PATH} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn plain_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_response(&mut s).await.unwrap()
}

#[tokio::test]
async fn https_injection_and_certificate_rotation_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = bundle();
    let second = bundle();
    install_server_cert(dir.path(), &first);
    let mut server = start(&dir.path().join("server"), Timeouts::default()).await;

    // Readiness flips once the TLS listener is up.
    marin3r_testkit::wait_until_async("/readyz 200", Duration::from_secs(5), || async {
        plain_get(server.probes, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(plain_get(server.probes, "/healthz").await.0, 200);

    let (peer, version, status, body) =
        https_request(server.https, &[&first, &second], &mutate_request()).await;
    assert_eq!(peer, cert_der(&first.server.cert_pem));
    assert_eq!(
        version,
        rustls::ProtocolVersion::TLSv1_2,
        "TLS 1.2 clients are served"
    );
    assert_eq!(status, 200);
    let review: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(review["response"]["patchType"], "JSONPatch");
    assert!(review["response"]["patch"].is_string());

    // Rotate on disk; the next connection gets the new certificate, same process.
    install_server_cert(dir.path(), &second);
    let (peer, ..) = https_request(server.https, &[&first, &second], &mutate_request()).await;
    assert_eq!(peer, cert_der(&second.server.cert_pem));

    // Broken files: the server keeps the last good certificate.
    std::fs::write(dir.path().join("server/tls.crt.tmp"), "garbage").unwrap();
    std::fs::rename(
        dir.path().join("server/tls.crt.tmp"),
        dir.path().join("server/tls.crt"),
    )
    .unwrap();
    let (peer, _, status, _) =
        https_request(server.https, &[&first, &second], &mutate_request()).await;
    assert_eq!(peer, cert_der(&second.server.cert_pem));
    assert_eq!(status, 200);

    let (status, text) = plain_get(server.metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        text.contains("marin3r_webhook_requests_total{result=\"injected\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("marin3r_webhook_injections_total 3"),
        "{text}"
    );
    assert!(
        text.contains("marin3r_webhook_request_duration_seconds_bucket{le=\"5e-5\"}")
            || text.contains("marin3r_webhook_request_duration_seconds_bucket{le=\"0.00005\"}"),
        "{text}"
    );

    // Graceful shutdown: the server future completes.
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
