//! The webhook's serving directory ([`ServingFiles::dir`]), the OLM way: either layout
//! (OLM v0's `apiserver.crt`/`apiserver.key`, a `kubernetes.io/tls` Secret's
//! `tls.crt`/`tls.key`) with every key encoding met in practice: ECDSA `EC PRIVATE KEY`
//! (SEC1, what OLM v0 writes), PKCS#8 `PRIVATE KEY` (cert-manager, `marin3r certs`) and
//! RSA `RSA PRIVATE KEY` (PKCS#1, OpenShift's service-ca). And a Secret volume's `..data`
//! swap, also one that brings the other layout: the layout is chosen again at reload.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use marin3r_certs::{Bundle, IssueOptions, KeyType, ReloadingCertResolver, ServingFiles, issue};
use marin3r_wire::olm::{APISERVER_CRT, APISERVER_KEY, SERVING_LAYOUTS};
use marin3r_wire::secret_keys::{TLS_CRT, TLS_KEY};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn bundle(key_type: KeyType) -> Bundle {
    issue(&IssueOptions {
        hosts: vec!["localhost".into()],
        key_type,
        ..IssueOptions::default()
    })
    .unwrap()
}

// ------------------------------------------------------------- key encodings (DER)

/// `(tag, content, rest)` of the DER element at the start of `der`.
fn tlv(der: &[u8]) -> (u8, &[u8], &[u8]) {
    let tag = der[0];
    let (len, start) = match der[1] {
        n if n < 0x80 => (n as usize, 2),
        n => {
            let bytes = (n & 0x7f) as usize;
            let len = der[2..2 + bytes]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | *b as usize);
            (len, 2 + bytes)
        }
    };
    (tag, &der[start..start + len], &der[start + len..])
}

fn encode(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The SEC1 `ECPrivateKey` of a PKCS#8 EC key, with its curve as parameters (as Go's
/// `x509.MarshalECPrivateKey`, which OLM v0 uses, writes it).
fn sec1_of_pkcs8(pkcs8: &[u8]) -> Vec<u8> {
    let (_, info, _) = tlv(pkcs8);
    let (_, _version, rest) = tlv(info);
    let (_, algorithm, rest) = tlv(rest);
    let (_, _ec_public_key, curve) = tlv(algorithm);
    let (_, ec_private_key, _) = tlv(rest);
    let (_, items, _) = tlv(ec_private_key);
    let (_, _, after_version) = tlv(items);
    let (_, _, after_key) = tlv(after_version);
    let head = &items[..items.len() - after_key.len()];
    assert!(
        after_key.first() != Some(&0xa0),
        "already has its parameters"
    );
    let content = [head, &encode(0xa0, curve), after_key].concat();
    encode(0x30, &content)
}

fn pem(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|l| std::str::from_utf8(l).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// The key encodings: `(name, key type, PEM of the bundle's server key)`.
fn key_kinds() -> Vec<(&'static str, Bundle, String)> {
    let ec = bundle(KeyType::EcdsaP256);
    let rsa = bundle(KeyType::Rsa2048);
    let pkcs8 = |b: &Bundle| match PrivateKeyDer::from_pem_slice(b.server.key_pem.as_bytes()) {
        Ok(PrivateKeyDer::Pkcs8(der)) => der.secret_pkcs8_der().to_vec(),
        other => panic!("not PKCS#8: {other:?}"),
    };
    let sec1 = pem("EC PRIVATE KEY", &sec1_of_pkcs8(&pkcs8(&ec)));
    let pkcs1 = {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        use rsa::pkcs8::DecodePrivateKey as _;
        let key = rsa::RsaPrivateKey::from_pkcs8_der(&pkcs8(&rsa)).unwrap();
        pem("RSA PRIVATE KEY", key.to_pkcs1_der().unwrap().as_bytes())
    };
    let (ec_pkcs8, rsa_pkcs8) = (ec.server.key_pem.clone(), rsa.server.key_pem.clone());
    vec![
        ("ECDSA SEC1 (EC PRIVATE KEY, OLM v0)", ec.clone(), sec1),
        ("ECDSA PKCS#8 (PRIVATE KEY)", ec, ec_pkcs8),
        (
            "RSA PKCS#1 (RSA PRIVATE KEY, service-ca)",
            rsa.clone(),
            pkcs1,
        ),
        ("RSA PKCS#8 (PRIVATE KEY)", rsa, rsa_pkcs8),
    ]
}

fn served(resolver: &ReloadingCertResolver) -> CertificateDer<'static> {
    resolver.current().cert[0].clone()
}

fn leaf(b: &Bundle) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(b.server.cert_pem.as_bytes()).unwrap()
}

fn resolver(dir: &Path) -> ReloadingCertResolver {
    ReloadingCertResolver::serving(
        ServingFiles::dir(dir),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .unwrap()
}

#[test]
fn either_layout_serves_with_every_key_encoding() {
    let mut checked = Vec::new();
    for (kind, b, key_pem) in key_kinds() {
        let label = key_pem.lines().next().unwrap().to_string();
        for (cert_name, key_name) in SERVING_LAYOUTS {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(cert_name), &b.server.cert_pem).unwrap();
            std::fs::write(dir.path().join(key_name), &key_pem).unwrap();
            assert_eq!(
                served(&resolver(dir.path())),
                leaf(&b),
                "{kind} as {cert_name}/{key_name}"
            );
            checked.push(format!("{label} {cert_name}"));
        }
    }
    for label in ["EC PRIVATE KEY", "RSA PRIVATE KEY", "BEGIN PRIVATE KEY"] {
        assert!(
            checked.iter().filter(|c| c.contains(label)).count() >= 2,
            "{label} in both layouts: {checked:?}"
        );
    }
}

#[test]
fn olm_layout_comes_first_and_a_half_layout_is_skipped() {
    let (olm, tls) = (bundle(KeyType::EcdsaP256), bundle(KeyType::EcdsaP256));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join(TLS_CRT), &tls.server.cert_pem).unwrap();
    std::fs::write(d.join(TLS_KEY), &tls.server.key_pem).unwrap();
    // A certificate without its key is not a layout.
    std::fs::write(d.join(APISERVER_CRT), &olm.server.cert_pem).unwrap();
    assert_eq!(served(&resolver(d)), leaf(&tls));
    std::fs::write(d.join(APISERVER_KEY), &olm.server.key_pem).unwrap();
    assert_eq!(served(&resolver(d)), leaf(&olm));
    // Neither: the error names the directory and both layouts.
    let empty = tempfile::tempdir().unwrap();
    let e = ReloadingCertResolver::serving(
        ServingFiles::dir(empty.path()),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(&*empty.path().to_string_lossy()), "{e}");
    assert!(e.contains("apiserver.crt and apiserver.key"), "{e}");
    assert!(e.contains("tls.crt and tls.key"), "{e}");
}

/// Writes `files` like the kubelet updates a Secret volume: a new timestamped folder,
/// an atomic swap of `..data`, and a `name -> ..data/name` link per file.
fn kubelet_update(dir: &Path, generation: usize, files: &[(&str, &str)]) {
    let data = dir.join(format!("..gen_{generation}"));
    std::fs::create_dir_all(&data).unwrap();
    for (name, content) in files {
        std::fs::write(data.join(name), content).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(data.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

#[test]
fn a_data_swap_is_followed_also_to_the_other_layout() {
    let kinds = key_kinds();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = |b: &Bundle, key: &str, layout: (&'static str, &'static str)| {
        vec![
            (layout.0, b.server.cert_pem.clone()),
            (layout.1, key.to_string()),
        ]
    };
    let write = |generation, f: Vec<(&str, String)>| {
        let f: Vec<(&str, &str)> = f.iter().map(|(n, c)| (*n, c.as_str())).collect();
        kubelet_update(d, generation, &f);
    };
    let (_, first, first_key) = &kinds[2]; // RSA PKCS#1, tls.*
    write(1, files(first, first_key, (TLS_CRT, TLS_KEY)));
    let r = resolver(d);
    assert_eq!(served(&r), leaf(first));
    // Same layout, new certificate (an ECDSA SEC1 key now).
    let (_, second, second_key) = &kinds[0];
    write(2, files(second, second_key, (TLS_CRT, TLS_KEY)));
    assert_eq!(served(&r), leaf(second));
    // The other layout: tls.* now dangle, apiserver.* appear.
    let (_, third, third_key) = &kinds[1];
    write(3, files(third, third_key, (APISERVER_CRT, APISERVER_KEY)));
    assert_eq!(served(&r), leaf(third));
    // A swap to a broken key keeps the last good pair.
    write(4, files(second, first_key, (APISERVER_CRT, APISERVER_KEY)));
    assert_eq!(served(&r), leaf(third));
}
