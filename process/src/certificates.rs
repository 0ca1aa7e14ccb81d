//! `marin3r_certificate_expiration_timestamp_seconds{certificate}`: when each certificate
//! a process serves or issues expires (notAfter, Unix seconds; the name and meaning of
//! cert-manager's `certmanager_certificate_expiration_timestamp_seconds`), so one alert
//! covers every certificate, whoever issued it.
//!
//! - [`CertificateExpiry`]: the certificates a process serves from PEM files (the
//!   webhook's serving certificate, the discovery service's server certificate and the
//!   CA it trusts), read at each scrape: a rotated file shows at once; a file that does
//!   not parse keeps its last value (the server keeps serving what it loaded last).
//! - [`IssuedCertificates`]: certificates the operator issues (one series per
//!   DiscoveryServiceCertificate, removed with it).
//!
//! `certificate` names the role (`webhook-serving`, `discovery-service-server`,
//! `discovery-service-ca`) or, for issued ones, `<kind>/<namespace>/<name>`: bounded by
//! the processes and the objects.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// The metric's name.
pub const CERTIFICATE_EXPIRY_METRIC: &str = "marin3r_certificate_expiration_timestamp_seconds";
const HELP: &str = "When the certificate expires (notAfter), in seconds since the Unix epoch";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    certificate: String,
}

/// Unix seconds of `t` (0 before the epoch).
pub fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// notAfter (Unix seconds) of the first certificate of a PEM text.
pub fn not_after(pem: &str) -> Result<i64, String> {
    marin3r_certs::lifecycle::validity(pem).map(|(_, end)| unix_seconds(end))
}

/// Where a served certificate is read from.
#[derive(Debug)]
enum Source {
    File(PathBuf),
    /// The certificate of a serving directory's current layout.
    Serving(marin3r_certs::ServingFiles),
}

impl Source {
    fn path(&self) -> Result<PathBuf, String> {
        match self {
            Self::File(path) => Ok(path.clone()),
            Self::Serving(files) => files
                .current()
                .map(|(cert, _)| cert)
                .map_err(|e| marin3r_wire::error_chain(&e)),
        }
    }
}

#[derive(Debug)]
struct Served {
    certificate: &'static str,
    source: Source,
    /// The last notAfter read (kept while the file does not parse).
    last: Mutex<Option<i64>>,
}

impl Served {
    fn read(&self) -> Option<i64> {
        // The one bounded, non-blocking reader: a FIFO or `/dev/zero` in place of the
        // certificate never stalls or bloats a scrape.
        let now = self
            .source
            .path()
            .and_then(|path| {
                marin3r_certs::read_pem(path).map_err(|e| marin3r_wire::error_chain(&e))
            })
            .and_then(|pem| String::from_utf8(pem).map_err(|_| "not UTF-8 text".to_string()))
            .and_then(|pem| not_after(&pem));
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match now {
            Ok(t) => *last = Some(t),
            Err(error) => tracing::debug!(
                certificate = self.certificate,
                source = ?self.source,
                error,
                "cannot read the certificate's expiry; showing the last one read"
            ),
        }
        *last
    }
}

/// The expiry of certificates served from PEM files, read at each scrape (see the
/// module docs).
#[derive(Debug, Clone)]
pub struct CertificateExpiry {
    served: Arc<Vec<Served>>,
}

impl CertificateExpiry {
    /// `(certificate label, PEM file)` pairs; each file's first certificate counts.
    pub fn served(files: impl IntoIterator<Item = (&'static str, PathBuf)>) -> Self {
        Self::from_sources(
            files
                .into_iter()
                .map(|(certificate, path)| (certificate, Source::File(path))),
        )
    }

    /// The certificate of `files` (for a serving directory, the layout it serves now).
    pub fn serving(certificate: &'static str, files: marin3r_certs::ServingFiles) -> Self {
        Self::from_sources([(certificate, Source::Serving(files))])
    }

    fn from_sources(sources: impl IntoIterator<Item = (&'static str, Source)>) -> Self {
        let served = sources
            .into_iter()
            .map(|(certificate, source)| Served {
                certificate,
                source,
                last: Mutex::new(None),
            })
            .collect();
        Self {
            served: Arc::new(served),
        }
    }

    /// Registers the collector with `registry` (read at each scrape).
    pub fn register(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
    }
}

impl Collector for CertificateExpiry {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let values: Vec<(CertificateLabels, i64)> = self
            .served
            .iter()
            .filter_map(|s| {
                s.read().map(|t| {
                    let labels = CertificateLabels {
                        certificate: s.certificate.to_string(),
                    };
                    (labels, t)
                })
            })
            .collect();
        if values.is_empty() {
            return Ok(());
        }
        let mut family =
            encoder.encode_descriptor(CERTIFICATE_EXPIRY_METRIC, HELP, None, MetricType::Gauge)?;
        for (labels, t) in &values {
            ConstGauge::new(*t).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// The expiry of certificates a process issues, one series per issuing object. Cloning
/// shares the series.
#[derive(Debug, Clone, Default)]
pub struct IssuedCertificates {
    family: Family<CertificateLabels, Gauge>,
    /// (kind, namespace, name) of every series shown.
    shown: Arc<Mutex<BTreeSet<(String, String, String)>>>,
}

impl IssuedCertificates {
    /// Registers the series with `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(CERTIFICATE_EXPIRY_METRIC, HELP, self.family.clone());
    }

    fn labels(kind: &str, namespace: &str, name: &str) -> CertificateLabels {
        CertificateLabels {
            certificate: format!("{}/{namespace}/{name}", kind.to_ascii_lowercase()),
        }
    }

    fn key(kind: &str, namespace: &str, name: &str) -> (String, String, String) {
        (kind.to_string(), namespace.to_string(), name.to_string())
    }

    /// The certificate of object `kind` `namespace/name` expires at `not_after` (Unix
    /// seconds).
    pub fn set(&self, kind: &str, namespace: &str, name: &str, not_after: i64) {
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        self.family
            .get_or_create(&Self::labels(kind, namespace, name))
            .set(not_after);
        shown.insert(Self::key(kind, namespace, name));
    }

    /// The object is gone (or holds no certificate): its series goes.
    pub fn remove(&self, kind: &str, namespace: &str, name: &str) {
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        shown.remove(&Self::key(kind, namespace, name));
        self.family.remove(&Self::labels(kind, namespace, name));
    }

    /// [`remove`](Self::remove)s every object of `kind` for which `live(namespace, name)`
    /// is false (objects deleted without a reconcile seeing them go).
    pub fn retain(&self, kind: &str, live: impl Fn(&str, &str) -> bool) {
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        shown.retain(|(k, namespace, name)| {
            let keep = k != kind || live(namespace, name);
            if !keep {
                self.family.remove(&Self::labels(k, namespace, name));
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    fn pem(days: u64) -> (String, SystemTime) {
        let issued = marin3r_certs::issue(&marin3r_certs::IssueOptions {
            hosts: vec!["localhost".to_string()],
            validity: std::time::Duration::from_secs(days * 86_400),
            ..marin3r_certs::IssueOptions::default()
        })
        .unwrap();
        let pem = issued.server.cert_pem.clone();
        let (_, end) = marin3r_certs::lifecycle::validity(&pem).unwrap();
        (pem, end)
    }

    #[test]
    fn served_certificates_show_the_file_as_it_is_and_keep_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tls.crt");
        let (first, first_end) = pem(10);
        std::fs::write(&path, &first).unwrap();
        let mut registry = Registry::default();
        CertificateExpiry::served([("webhook-serving", path.clone())]).register(&mut registry);
        let line = |t: SystemTime| {
            format!(
                "marin3r_certificate_expiration_timestamp_seconds{{certificate=\"webhook-serving\"}} {}",
                unix_seconds(t)
            )
        };
        let out = text(&registry);
        assert!(out.lines().any(|l| l == line(first_end)), "{out}");

        // Rotated: the next scrape shows the new one.
        let (second, second_end) = pem(20);
        assert_ne!(unix_seconds(first_end), unix_seconds(second_end));
        std::fs::write(&path, &second).unwrap();
        let out = text(&registry);
        assert!(out.lines().any(|l| l == line(second_end)), "{out}");

        // Broken: the last one read stays.
        std::fs::write(&path, "not a certificate").unwrap();
        let out = text(&registry);
        assert!(out.lines().any(|l| l == line(second_end)), "{out}");
    }

    #[test]
    fn an_issued_certificate_has_a_series_until_its_object_goes() {
        let mut registry = Registry::default();
        let m = IssuedCertificates::default();
        m.register(&mut registry);
        m.set("DiscoveryServiceCertificate", "ns", "ds-server", 1_000);
        m.set("DiscoveryServiceCertificate", "ns", "ds-client", 2_000);
        let out = text(&registry);
        assert!(
            out.contains("marin3r_certificate_expiration_timestamp_seconds{certificate=\"discoveryservicecertificate/ns/ds-server\"} 1000"),
            "{out}"
        );
        m.remove("DiscoveryServiceCertificate", "ns", "ds-server");
        let out = text(&registry);
        assert!(
            !out.contains("ds-server") && out.contains("ds-client"),
            "{out}"
        );
        // Deleted while no reconcile ran: gone at the next look at the live objects.
        m.retain("DiscoveryServiceCertificate", |_, name| name != "ds-client");
        assert!(!text(&registry).contains("ds-client"));
    }
}
