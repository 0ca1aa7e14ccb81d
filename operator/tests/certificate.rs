//! The DiscoveryServiceCertificate controller against kube-rs' mock API server: every
//! request of a reconcile is asserted (method, path and query, server-side apply body,
//! status body) and answered as the API server would. Plus a TLS check: the Secrets it
//! issues really make a rustls mTLS handshake, also across a CA rotation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use marin3r_kube::Lenient;
use marin3r_operator::certificate::{self, Context, certificate_hash, reconcile_at, signed_by};
use marin3r_operator_api::discoveryservicecertificate::DiscoveryServiceCertificate;
use marin3r_testkit::kube::*;
use serde_json::{Value, json};

const SECRETS: &str = "/api/v1/namespaces/default/secrets";
const DSCS: &str =
    "/apis/operator.marin3r.3scale.net/v1alpha1/namespaces/default/discoveryservicecertificates";
const APPLY: &str = "?&force=true&fieldManager=marin3r-operator";
const HOUR: Duration = Duration::from_secs(3600);

type Dsc = Lenient<DiscoveryServiceCertificate>;

fn dsc_json(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "generation": 1, "resourceVersion": "100",
                     "labels": {"app.kubernetes.io/instance": "instance",
                                "app.kubernetes.io/managed-by": "marin3r-operator"}},
        "spec": spec,
    })
}

fn ca_json() -> Value {
    dsc_json(
        "marin3r-ca-cert-instance",
        json!({"commonName": "marin3r-ca-instance", "isCA": true, "server": false, "validFor": 94608000,
               "hosts": ["marin3r-ca-instance"], "signer": {"selfSigned": {}},
               "secretRef": {"name": "marin3r-ca-cert-instance", "namespace": "default"},
               "certificateRenewal": {"enabled": true}}),
    )
}

fn leaf_json(name: &str, server: bool, valid_for: i64, hosts: &[&str]) -> Value {
    dsc_json(
        name,
        json!({"commonName": name, "isCA": false, "server": server, "validFor": valid_for,
               "hosts": hosts,
               "signer": {"caSigned": {"caSecretRef": {"name": "marin3r-ca-cert-instance", "namespace": "default"}}},
               "secretRef": {"name": name}, "certificateRenewal": {"enabled": true}}),
    )
}

fn server_json() -> Value {
    leaf_json(
        "marin3r-server-cert-instance",
        true,
        7776000,
        &[
            "marin3r-instance",
            "marin3r-instance.default",
            "marin3r-instance.default.svc",
            "marin3r-instance.default.svc.cluster.local",
            "127.0.0.1",
        ],
    )
}

fn client_json() -> Value {
    leaf_json(
        "envoy-sidecar-client-cert",
        false,
        172800,
        &["envoy-sidecar-client-cert"],
    )
}

fn typed(doc: &Value) -> Arc<Dsc> {
    Arc::new(serde_json::from_value(doc.clone()).unwrap())
}

/// A context whose DSC store holds `docs`.
fn context(client: kube::Client, docs: &[&Value]) -> (Arc<Context>, Store<Dsc>) {
    let (store, mut writer) = reflector::store::<Dsc>();
    for doc in docs {
        writer.apply_watcher_event(&watcher::Event::Apply((*typed(doc)).clone()));
    }
    (
        Arc::new(Context {
            client,
            certificates: store.clone(),
            issued: marin3r_process::IssuedCertificates::default(),
        }),
        store,
    )
}

fn not_found(name: &str) -> Value {
    status_failure(404, "NotFound", &format!("secrets \"{name}\" not found"))
}

/// The API server's copy of an applied Secret.
fn stored(body: &Value) -> Value {
    let mut s = body.clone();
    s["metadata"]["resourceVersion"] = json!("200");
    s["metadata"]["uid"] = json!(format!(
        "uid-secret-{}",
        s["metadata"]["name"].as_str().unwrap()
    ));
    s
}

fn decoded(secret: &Value, key: &str) -> String {
    let b64 = secret["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {secret}"));
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap()
}

fn certs_in(pem: &str) -> usize {
    pem.matches("BEGIN CERTIFICATE").count()
}

/// Expects the server-side apply of Secret `name` and asserts what every certificate
/// Secret carries; answers with the stored Secret, returned.
async fn expect_secret_apply(api: &mut ApiServer, owner: &Value) -> Value {
    let name = owner["spec"]["secretRef"]["name"].as_str().unwrap();
    let got = api
        .expect("PATCH", &format!("{SECRETS}/{name}{APPLY}"), 200, stored)
        .await;
    assert_eq!(got.content_type, "application/apply-patch+yaml");
    let b = &got.body;
    assert_eq!(
        (b["apiVersion"].as_str(), b["kind"].as_str()),
        (Some("v1"), Some("Secret"))
    );
    assert_eq!(b["type"], "kubernetes.io/tls");
    assert_eq!(b["metadata"]["name"], name);
    assert_eq!(b["metadata"]["namespace"], "default");
    assert_eq!(
        b["metadata"]["labels"],
        json!({"app.kubernetes.io/instance": "instance", "app.kubernetes.io/managed-by": "marin3r-operator"})
    );
    assert_eq!(
        b["metadata"]["ownerReferences"],
        json!([{"apiVersion": "operator.marin3r.3scale.net/v1alpha1", "kind": "DiscoveryServiceCertificate",
                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                "controller": true, "blockOwnerDeletion": true}])
    );
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(!decoded(b, key).is_empty());
    }
    stored(b)
}

/// One issuing pass of `owner`: the Secrets `reads` are read in order (`None`: not
/// found), then its Secret is applied and its status written; returns both.
async fn expect_pass(
    api: &mut ApiServer,
    owner: &Value,
    reads: Vec<(&str, Option<Value>)>,
) -> (Value, Value) {
    for (name, secret) in reads {
        let uri = format!("{SECRETS}/{name}");
        match secret {
            None => api.expect("GET", &uri, 404, |_| not_found(name)).await,
            Some(secret) => api.expect("GET", &uri, 200, move |_| secret).await,
        };
    }
    let secret = expect_secret_apply(api, owner).await;
    let status = expect_status(api, owner).await;
    (secret, status)
}

/// Expects the status apply of `owner` and returns its `status`.
async fn expect_status(api: &mut ApiServer, owner: &Value) -> Value {
    let name = owner["metadata"]["name"].as_str().unwrap();
    let got = api
        .expect("PATCH", &format!("{DSCS}/{name}/status{APPLY}"), 200, |b| {
            with_status(owner, b)
        })
        .await;
    assert_eq!(got.content_type, "application/apply-patch+yaml");
    assert_eq!(
        got.body["apiVersion"],
        "operator.marin3r.3scale.net/v1alpha1"
    );
    assert_eq!(got.body["kind"], "DiscoveryServiceCertificate");
    assert_eq!(
        got.body.as_object().unwrap().len(),
        3,
        "apiVersion, kind and status only"
    );
    assert!(!got.body.to_string().contains("PRIVATE KEY"));
    got.body["status"].clone()
}

fn assert_ready(status: &Value, secret: &Value) {
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(
        status["certificateHash"],
        certificate_hash(&decoded(secret, "tls.crt"))
    );
    let c = condition(status, "Ready");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("CertificateValid"))
    );
    assert_eq!(c["observedGeneration"], 1);
    assert!(status["notBefore"].as_str().unwrap().ends_with('Z'));
    assert!(status["notAfter"].as_str().unwrap().ends_with('Z'));
}

/// Now, in whole seconds (what the annotations and statuses hold).
fn now() -> SystemTime {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

#[tokio::test]
async fn a_new_pki_is_issued_and_a_second_pass_writes_nothing() {
    let (client, mut api) = mock_client();
    let (ca, server) = (ca_json(), server_json());
    let (ctx, _) = context(client, &[&ca, &server]);

    // The CA: no Secret → the Secrets it signs are read (nothing to recover yet), issued,
    // status written.
    let (action, (ca_secret, ca_status)) = run(
        reconcile_at(typed(&ca), ctx.clone(), now()),
        expect_pass(
            &mut api,
            &ca,
            vec![
                ("marin3r-ca-cert-instance", None),
                ("marin3r-server-cert-instance", None),
            ],
        ),
    )
    .await;
    assert_eq!(
        action.unwrap(),
        Action::requeue(HOUR),
        "a 3-year CA is looked at hourly"
    );
    assert_ready(&ca_status, &ca_secret);
    assert_eq!(
        decoded(&ca_secret, "ca.crt"),
        decoded(&ca_secret, "tls.crt")
    );
    assert!(ca_secret["metadata"].get("annotations").is_none());

    // The server certificate: its CA Secret read, issued with the CA's ca.crt.
    let (action, (secret, status)) = run(
        reconcile_at(typed(&server), ctx.clone(), now()),
        expect_pass(
            &mut api,
            &server,
            vec![
                ("marin3r-server-cert-instance", None),
                ("marin3r-ca-cert-instance", Some(ca_secret.clone())),
            ],
        ),
    )
    .await;
    assert_eq!(action.unwrap(), Action::requeue(HOUR));
    assert_ready(&status, &secret);
    assert_eq!(decoded(&secret, "ca.crt"), decoded(&ca_secret, "ca.crt"));

    // Next pass with that status: two reads, no write.
    let mut current = server.clone();
    current["status"] = status;
    let (action, ()) = run(reconcile_at(typed(&current), ctx.clone(), now()), async {
        let s = secret.clone();
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-server-cert-instance"),
            200,
            move |_| s,
        )
        .await;
        let c = ca_secret.clone();
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-ca-cert-instance"),
            200,
            move |_| c,
        )
        .await;
    })
    .await;
    assert_eq!(action.unwrap(), Action::requeue(HOUR));
    // Nothing else was asked.
    drop(ctx);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), api.0.next_request())
            .await
            .map_or(true, |r| r.is_none())
    );
}

/// Issues the CA and a leaf through the pure plan (what earlier passes left behind).
fn issued(leaf: &Value) -> (Value, Value, Value) {
    let ca = typed(&ca_json());
    let ca = ca.valid().unwrap();
    let p = certificate::plan(ca, "default", None, None, &[], now());
    let ca_secret = serde_json::to_value(p.secret.unwrap()).unwrap();
    let ca_k8s = serde_json::from_value(ca_secret.clone()).unwrap();
    let leaf_typed = typed(leaf);
    let p = certificate::plan(
        leaf_typed.valid().unwrap(),
        "default",
        None,
        Some(&ca_k8s),
        &[],
        now(),
    );
    let leaf_secret = serde_json::to_value(p.secret.unwrap()).unwrap();
    let mut leaf = leaf.clone();
    leaf["status"] = serde_json::to_value(&p.status).unwrap();
    (ca_secret, leaf_secret, leaf)
}

#[tokio::test]
async fn a_garbage_tls_crt_is_healed() {
    let (client, mut api) = mock_client();
    let (ca_secret, leaf_secret, client_dsc) = issued(&client_json());
    let (ctx, _) = context(client, &[&ca_json(), &client_dsc]);
    let mut garbage = leaf_secret.clone();
    garbage["data"]["tls.crt"] = json!(base64::engine::general_purpose::STANDARD.encode("garbage"));
    let (action, (secret, status)) = run(
        reconcile_at(typed(&client_dsc), ctx, now()),
        expect_pass(
            &mut api,
            &client_dsc,
            vec![
                ("envoy-sidecar-client-cert", Some(garbage)),
                ("marin3r-ca-cert-instance", Some(ca_secret.clone())),
            ],
        ),
    )
    .await;
    // 48 h, renewed at 80 %: looked at again within the hour.
    assert_eq!(action.unwrap(), Action::requeue(HOUR));
    assert!(decoded(&secret, "tls.crt").starts_with("-----BEGIN CERTIFICATE-----"));
    assert_ne!(
        decoded(&secret, "tls.key"),
        decoded(&leaf_secret, "tls.key"),
        "a new key"
    );
    assert_ready(&status, &secret);
    assert_ne!(
        status["certificateHash"],
        client_dsc["status"]["certificateHash"]
    );
}

#[tokio::test]
async fn a_ca_rotation_reaches_a_leaf_with_the_overlap_bundle() {
    let (client, mut api) = mock_client();
    let (old_ca_secret, old_leaf_secret, server) = issued(&server_json());
    let old_ca = decoded(&old_ca_secret, "tls.crt");
    // The CA's spec changed (its validity): re-issued.
    let mut ca = ca_json();
    ca["spec"]["validFor"] = json!(2 * 94608000);
    let client_dsc = client_json();
    let (ctx, store) = context(client, &[&ca, &server, &client_dsc]);
    let t = now();

    let (action, (new_ca_secret, ca_status)) = run(
        reconcile_at(typed(&ca), ctx.clone(), t),
        expect_pass(
            &mut api,
            &ca,
            vec![("marin3r-ca-cert-instance", Some(old_ca_secret.clone()))],
        ),
    )
    .await;
    assert_eq!(action.unwrap(), Action::requeue(HOUR));
    assert_ready(&ca_status, &new_ca_secret);
    let new_ca = decoded(&new_ca_secret, "tls.crt");
    assert_ne!(new_ca, old_ca);
    assert_eq!(
        decoded(&new_ca_secret, "retired-ca.crt").trim(),
        old_ca.trim()
    );
    let bundle = decoded(&new_ca_secret, "ca.crt");
    assert_eq!(certs_in(&bundle), 2);
    assert!(bundle.starts_with(new_ca.trim_end()) && bundle.contains(old_ca.trim_end()));
    // Kept for the propagation phase, then the longest validity it signs (the 90-day
    // server certificate).
    let rfc3339 = marin3r_kube::time::rfc3339;
    let until = rfc3339(t + certificate::PROPAGATION + Duration::from_secs(7776000));
    assert_eq!(
        new_ca_secret["metadata"]["annotations"],
        json!({"operator.marin3r.3scale.net/retired-ca-until": until,
               "operator.marin3r.3scale.net/retired-ca-since": rfc3339(t)})
    );

    // The CA's status change maps to the certificates it signs (same namespace).
    let mut ca_after = ca.clone();
    ca_after["status"] = ca_status;
    let mut targets: Vec<String> = signed_by(typed(&ca_after).valid().unwrap(), &store.state())
        .iter()
        .map(|r| format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name))
        .collect();
    targets.sort();
    assert_eq!(
        targets,
        [
            "default/envoy-sidecar-client-cert",
            "default/marin3r-server-cert-instance"
        ]
    );

    // The server certificate, phase 1: same certificate, ca.crt = bundle, status
    // unchanged; looked at again when the propagation phase ends.
    let (action, held) = run(reconcile_at(typed(&server), ctx.clone(), t), async {
        let old = old_leaf_secret.clone();
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-server-cert-instance"),
            200,
            move |_| old,
        )
        .await;
        let ca = new_ca_secret.clone();
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-ca-cert-instance"),
            200,
            move |_| ca,
        )
        .await;
        expect_secret_apply(&mut api, &server).await
    })
    .await;
    assert_eq!(action.unwrap(), Action::requeue(certificate::PROPAGATION));
    assert_eq!(decoded(&held, "ca.crt"), bundle);
    assert_eq!(
        decoded(&held, "tls.crt"),
        decoded(&old_leaf_secret, "tls.crt")
    );
    assert_eq!(
        decoded(&held, "tls.key"),
        decoded(&old_leaf_secret, "tls.key")
    );

    // Phase 2: not signed by the current CA → re-issued, ca.crt = bundle.
    let t = t + certificate::PROPAGATION;
    let (action, (secret, status)) = run(
        reconcile_at(typed(&server), ctx.clone(), t),
        expect_pass(
            &mut api,
            &server,
            vec![
                ("marin3r-server-cert-instance", Some(held.clone())),
                ("marin3r-ca-cert-instance", Some(new_ca_secret.clone())),
            ],
        ),
    )
    .await;
    assert_eq!(action.unwrap(), Action::requeue(HOUR));
    assert_ready(&status, &secret);
    assert_eq!(decoded(&secret, "ca.crt"), bundle);
    assert_ne!(
        decoded(&secret, "tls.crt"),
        decoded(&old_leaf_secret, "tls.crt")
    );
}

#[tokio::test]
async fn a_deleted_ca_secret_is_recovered_from_the_leaves() {
    let (client, mut api) = mock_client();
    let (old_ca_secret, leaf_secret, server) = issued(&server_json());
    let old_ca = decoded(&old_ca_secret, "tls.crt");
    let (ca, client_dsc) = (ca_json(), client_json());
    let (ctx, _) = context(client, &[&ca, &server, &client_dsc]);
    let t = now();
    let (action, secret) = run(reconcile_at(typed(&ca), ctx, t), async {
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-ca-cert-instance"),
            404,
            |_| not_found("marin3r-ca-cert-instance"),
        )
        .await;
        // Its leaves, by name: the client's Secret is gone too, the server's is there.
        api.expect(
            "GET",
            &format!("{SECRETS}/envoy-sidecar-client-cert"),
            404,
            |_| not_found("envoy-sidecar-client-cert"),
        )
        .await;
        let leaf = leaf_secret.clone();
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-server-cert-instance"),
            200,
            move |_| leaf,
        )
        .await;
        let secret = expect_secret_apply(&mut api, &ca).await;
        expect_status(&mut api, &ca).await;
        secret
    })
    .await;
    assert_eq!(action.unwrap(), Action::requeue(HOUR));
    assert_eq!(decoded(&secret, "retired-ca.crt").trim(), old_ca.trim());
    let bundle = decoded(&secret, "ca.crt");
    assert_eq!(certs_in(&bundle), 2);
    assert!(bundle.contains(old_ca.trim_end()));
    assert_eq!(
        secret["metadata"]["annotations"]["operator.marin3r.3scale.net/retired-ca-since"],
        marin3r_kube::time::rfc3339(t)
    );
}

#[tokio::test]
async fn a_missing_ca_is_a_condition_and_a_retry_not_an_error() {
    let (client, mut api) = mock_client();
    let server = server_json();
    let (ctx, _) = context(client, &[&server]);
    let (action, status) = run(reconcile_at(typed(&server), ctx, now()), async {
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-server-cert-instance"),
            404,
            |_| not_found("marin3r-server-cert-instance"),
        )
        .await;
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-ca-cert-instance"),
            404,
            |_| not_found("marin3r-ca-cert-instance"),
        )
        .await;
        expect_status(&mut api, &server).await
    })
    .await;
    assert_eq!(action.unwrap(), Action::requeue(Duration::from_secs(10)));
    assert_eq!(status["ready"], false);
    let c = condition(&status, "Ready");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("SignerNotReady"))
    );
    assert_eq!(
        c["message"],
        "waiting for the CA Secret default/marin3r-ca-cert-instance"
    );
}

// ---- TLS: the issued Secrets make a real rustls mTLS handshake ----

mod tls {
    use super::*;
    use marin3r_certs::mtls_server_config;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A Secret's files in `dir` (as the kubelet mounts them).
    pub fn mount(dir: &std::path::Path, secret: &k8s_openapi::api::core::v1::Secret) {
        std::fs::create_dir_all(dir).unwrap();
        for (k, v) in secret.data.as_ref().unwrap() {
            std::fs::write(dir.join(k), &v.0).unwrap();
        }
    }

    fn file(dir: &std::path::Path, name: &str) -> String {
        std::fs::read_to_string(dir.join(name)).unwrap()
    }

    /// A client that trusts every certificate of `dir/ca.crt` and presents `dir/tls.crt`.
    fn client_config(dir: &std::path::Path) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(file(dir, "ca.crt").as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let chain = CertificateDer::pem_slice_iter(file(dir, "tls.crt").as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(file(dir, "tls.key").as_bytes()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap(),
        )
    }

    /// One mTLS exchange between a server on `server_dir` (its `ca.crt` verifies
    /// clients) and a client on `client_dir`, asking for `host`.
    pub async fn handshake(
        server_dir: &std::path::Path,
        client_dir: &std::path::Path,
        host: &str,
    ) -> Result<(), String> {
        let server = mtls_server_config(
            server_dir.join("tls.crt"),
            server_dir.join("tls.key"),
            server_dir.join("ca.crt"),
            &[],
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
            tls.write_all(b"ok").await.map_err(|e| e.to_string())?;
            tls.shutdown().await.map_err(|e| e.to_string())
        });
        let connector = tokio_rustls::TlsConnector::from(client_config(client_dir));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let client = async {
            let mut tls = connector
                .connect(ServerName::try_from(host.to_string()).unwrap(), tcp)
                .await
                .map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            tls.read_to_end(&mut got).await.map_err(|e| e.to_string())?;
            (got == b"ok")
                .then_some(())
                .ok_or_else(|| format!("read {got:?}"))
        };
        let client = tokio::time::timeout(TIMEOUT, client).await.unwrap();
        let server = tokio::time::timeout(TIMEOUT, served)
            .await
            .unwrap()
            .unwrap();
        client.and(server)
    }
}

fn k8s(v: &Value) -> k8s_openapi::api::core::v1::Secret {
    serde_json::from_value(v.clone()).unwrap()
}

#[tokio::test]
async fn issued_server_and_client_secrets_handshake_with_mtls_across_a_ca_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let t = now();
    let plan = |doc: &Value, current: Option<&Value>, signer: Option<&Value>, at: SystemTime| {
        let d = typed(doc);
        let (current, signer) = (current.map(k8s), signer.map(k8s));
        certificate::plan(
            d.valid().unwrap(),
            "default",
            current.as_ref(),
            signer.as_ref(),
            &[172800, 7776000],
            at,
        )
        .secret
        .map(|s| serde_json::to_value(s).unwrap())
    };
    let ca = ca_json();
    let ca1 = plan(&ca, None, None, t).unwrap();
    let server1 = plan(&server_json(), None, Some(&ca1), t).unwrap();
    let client1 = plan(&client_json(), None, Some(&ca1), t).unwrap();
    let (srv1, cli1) = (dir.path().join("server1"), dir.path().join("client1"));
    tls::mount(&srv1, &k8s(&server1));
    tls::mount(&cli1, &k8s(&client1));
    for host in ["marin3r-instance.default.svc", "127.0.0.1"] {
        tls::handshake(&srv1, &cli1, host).await.unwrap();
    }
    assert!(
        tls::handshake(&srv1, &cli1, "elsewhere.example")
            .await
            .is_err(),
        "SANs are checked"
    );
    // A server certificate cannot be used as a client one (clientAuth EKU).
    assert!(
        tls::handshake(&srv1, &srv1, "marin3r-instance")
            .await
            .is_err()
    );

    // The CA rotates; the server is re-issued first, the client's Secret volume is not
    // refreshed yet: the overlap bundle keeps both directions working.
    let mut ca_changed = ca.clone();
    ca_changed["spec"]["validFor"] = json!(2 * 94608000);
    let ca2 = plan(&ca_changed, Some(&ca1), None, t).unwrap();
    // Phase 1: same certificates, the bundle as ca.crt; any mix of old and new files works.
    let server_held = plan(&server_json(), Some(&server1), Some(&ca2), t).unwrap();
    let client_held = plan(&client_json(), Some(&client1), Some(&ca2), t).unwrap();
    let (srv_held, cli_held) = (
        dir.path().join("server-held"),
        dir.path().join("client-held"),
    );
    tls::mount(&srv_held, &k8s(&server_held));
    tls::mount(&cli_held, &k8s(&client_held));
    tls::handshake(&srv_held, &cli1, "marin3r-instance")
        .await
        .unwrap();
    tls::handshake(&srv1, &cli_held, "marin3r-instance")
        .await
        .unwrap();
    // Phase 2 (every volume has the bundle): re-issued by the new CA; peers that still
    // present old-CA certificates are accepted, and they accept the new ones.
    let t = t + certificate::PROPAGATION;
    let server2 = plan(&server_json(), Some(&server_held), Some(&ca2), t).unwrap();
    let client2 = plan(&client_json(), Some(&client_held), Some(&ca2), t).unwrap();
    let (srv2, cli2) = (dir.path().join("server2"), dir.path().join("client2"));
    tls::mount(&srv2, &k8s(&server2));
    tls::mount(&cli2, &k8s(&client2));
    assert_ne!(decoded(&server2, "tls.crt"), decoded(&server1, "tls.crt"));
    tls::handshake(&srv2, &cli_held, "marin3r-instance")
        .await
        .unwrap();
    tls::handshake(&srv_held, &cli2, "marin3r-instance")
        .await
        .unwrap();
    tls::handshake(&srv2, &cli2, "marin3r-instance")
        .await
        .unwrap();
    // Why phase 1 exists: a client whose volume still has the pre-rotation files does not
    // trust a server certificate of the new CA.
    let err = tls::handshake(&srv2, &cli1, "marin3r-instance")
        .await
        .unwrap_err();
    assert!(
        err.contains("BadSignature") || err.contains("UnknownIssuer"),
        "{err}"
    );
    // Without the overlap (the new CA alone) an old client would be cut off.
    let strict = dir.path().join("strict");
    let mut only_new = k8s(&server2);
    let data = only_new.data.as_mut().unwrap();
    data.insert("ca.crt".into(), k8s(&ca2).data.unwrap()["tls.crt"].clone());
    tls::mount(&strict, &only_new);
    assert!(
        tls::handshake(&strict, &cli_held, "marin3r-instance")
            .await
            .is_err()
    );
}

// ---- The whole controller (`run`): watches, selectors, reconcile, shutdown ----

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "500"}, "items": items})
}

/// Answers the lists and watches of the controller; the CA DSC has no Secret yet. Every
/// write is forwarded to `writes`; any other request fails the test.
async fn router(mut api: ApiServer, writes: tokio::sync::mpsc::UnboundedSender<Received>) {
    let mut open_watches = Vec::new();
    let mut secret: Option<Value> = None;
    while let Some((request, send)) = api.0.next_request().await {
        let got = read(request).await;
        let (path, query) = got.uri.split_once('?').unwrap_or((&got.uri, ""));
        let watch = query.contains("watch=true");
        let reply = match (got.method.as_str(), path, watch) {
            ("GET", p, false) if p == DSCS => {
                list("DiscoveryServiceCertificateList", vec![ca_json()])
            }
            ("GET", SECRETS, false) => {
                assert!(
                    query.contains(
                        "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmarin3r-operator"
                    ),
                    "the Secret watch is label-selected: {query}"
                );
                list("SecretList", vec![])
            }
            ("GET", _, true) => {
                open_watches.push(send);
                continue;
            }
            ("GET", p, false) if p == format!("{SECRETS}/marin3r-ca-cert-instance") => {
                match &secret {
                    Some(s) => {
                        send.send_response(json_response(200, s));
                        continue;
                    }
                    None => {
                        send.send_response(json_response(
                            404,
                            &not_found("marin3r-ca-cert-instance"),
                        ));
                        continue;
                    }
                }
            }
            ("PATCH", p, false) if p == format!("{SECRETS}/marin3r-ca-cert-instance") => {
                assert_eq!(query, &APPLY[1..]);
                let s = stored(&got.body);
                secret = Some(s.clone());
                let _ = writes.send(got);
                s
            }
            ("PATCH", p, false) if p == format!("{DSCS}/marin3r-ca-cert-instance/status") => {
                assert_eq!(query, &APPLY[1..]);
                let answer = with_status(&ca_json(), &got.body);
                let _ = writes.send(got);
                answer
            }
            _ => panic!("unexpected request {} {}", got.method, got.uri),
        };
        send.send_response(json_response(200, &reply));
    }
}

#[tokio::test]
async fn the_controller_issues_a_new_certificate_and_stops_on_shutdown() {
    let (client, api) = mock_client();
    let (tx, mut writes) = tokio::sync::mpsc::unbounded_channel();
    let router = tokio::spawn(router(api, tx));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let namespaces = vec!["default".to_string()];
    let controller = tokio::spawn(async move {
        certificate::run(client, &namespaces, Default::default(), async move {
            let _ = stop_rx.await;
        })
        .await
    });
    let secret = tokio::time::timeout(TIMEOUT, writes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        secret.uri,
        format!("{SECRETS}/marin3r-ca-cert-instance{APPLY}")
    );
    assert_eq!(secret.body["type"], "kubernetes.io/tls");
    let status = tokio::time::timeout(TIMEOUT, writes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.uri,
        format!("{DSCS}/marin3r-ca-cert-instance/status{APPLY}")
    );
    assert_eq!(status.body["status"]["ready"], true);
    assert_eq!(
        status.body["status"]["certificateHash"],
        certificate_hash(&decoded(&secret.body, "tls.crt"))
    );
    stop_tx.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, controller)
        .await
        .unwrap()
        .unwrap();
    router.abort();
}

#[tokio::test]
async fn malformed_deleted_and_cross_namespace_certificates() {
    let (client, mut api) = mock_client();
    let (ctx, _) = context(client, &[]);
    // Malformed (validFor is not a number) or being deleted: nothing is read or written.
    let mut malformed = server_json();
    malformed["spec"]["validFor"] = json!("ninety days");
    let obj = typed(&malformed);
    assert!(obj.valid().is_err());
    let action = reconcile_at(obj, ctx.clone(), now()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let mut deleting = server_json();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let action = reconcile_at(typed(&deleting), ctx.clone(), now())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    // A CA Secret in another namespace is never read: refused in the status.
    let mut cross = server_json();
    cross["spec"]["signer"]["caSigned"]["caSecretRef"]["namespace"] = json!("kube-system");
    let (action, status) = run(reconcile_at(typed(&cross), ctx, now()), async {
        api.expect(
            "GET",
            &format!("{SECRETS}/marin3r-server-cert-instance"),
            404,
            |_| not_found("marin3r-server-cert-instance"),
        )
        .await;
        expect_status(&mut api, &cross).await
    })
    .await;
    assert_eq!(action.unwrap(), Action::await_change());
    let c = condition(&status, "Ready");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("CrossNamespaceSigner"))
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), api.0.next_request())
            .await
            .map_or(true, |r| r.is_none()),
        "nothing else was asked"
    );
}
