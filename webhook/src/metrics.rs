//! Prometheus metrics of the webhook (text format on `--metrics-bind-address`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::admission::{DenyReason, Outcome};
use crate::validation::Verdict;

/// Label set of the skip counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    pub reason: String,
}

/// Label set of the denial counter (a [`DenyReason`]).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenialLabels {
    pub reason: String,
}

/// Label set of the request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub result: String,
}

/// Latency buckets from 50 µs to 1 s: injection takes tens of microseconds, so the
/// default Prometheus buckets (starting at 5 ms) would put every request in one bucket.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Label set of the EnvoyConfig validation counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ValidationLabels {
    pub result: String,
}

/// All webhook metrics and the registry that exposes them. `requests`, `injections`,
/// `denials`, `skips` and `request_duration_seconds` describe the Pod mutating path;
/// `validations` and `validation_duration_seconds` the EnvoyConfig validating path.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    requests: Family<RequestLabels, Counter>,
    injections: Counter,
    denials: Family<DenialLabels, Counter>,
    skips: Family<SkipLabels, Counter>,
    latency: Histogram,
    validations: Family<ValidationLabels, Counter>,
    validation_latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::build(None)
    }

    /// [`new`](Self::new), and the process's series: `marin3r_ready` (of `readiness`)
    /// and `marin3r_certificate_expiration_timestamp_seconds
    /// {certificate="webhook-serving"}`, the expiry of the serving certificate in
    /// `tls` (the layout served now), read at each scrape.
    pub fn serving(
        tls: marin3r_certs::ServingFiles,
        readiness: marin3r_process::Readiness,
    ) -> Self {
        Self::build(Some((tls, readiness)))
    }

    fn build(serving: Option<(marin3r_certs::ServingFiles, marin3r_process::Readiness)>) -> Self {
        let mut root = Registry::default();
        if let Some((tls, readiness)) = serving {
            marin3r_process::CertificateExpiry::serving("webhook-serving", tls).register(&mut root);
            marin3r_process::register_ready_metric(&mut root, readiness);
        }
        let registry = root.sub_registry_with_prefix("marin3r_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        let injections = Counter::default();
        let denials = Family::<DenialLabels, Counter>::default();
        let skips = Family::<SkipLabels, Counter>::default();
        let latency = Histogram::new(LATENCY_BUCKETS);
        let validations = Family::<ValidationLabels, Counter>::default();
        let validation_latency = Histogram::new(LATENCY_BUCKETS);
        registry.register(
            "requests",
            "Pod admission requests by result (injected, skipped, denied, bad_request)",
            requests.clone(),
        );
        registry.register("injections", "Pods that got a sidecar", injections.clone());
        registry.register(
            "denials",
            "Pods denied, by reason (not_a_pod_object, invalid_annotations, invalid_pod, other)",
            denials.clone(),
        );
        registry.register(
            "skips",
            "Requests allowed unchanged, by reason",
            skips.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer a Pod admission request",
            latency.clone(),
        );
        registry.register(
            "validations",
            "EnvoyConfig admission requests by result (allowed, denied, skipped, bad_request)",
            validations.clone(),
        );
        registry.register(
            "validation_duration_seconds",
            "Time to answer an EnvoyConfig admission request",
            validation_latency.clone(),
        );
        // Pre-create the result series so dashboards see zeros instead of gaps.
        for result in ["injected", "skipped", "denied", "bad_request"] {
            let _ = requests.get_or_create(&RequestLabels {
                result: result.to_string(),
            });
        }
        for reason in DenyReason::ALL {
            let _ = denials.get_or_create(&DenialLabels {
                reason: reason.as_str().to_string(),
            });
        }
        for result in ["allowed", "denied", "skipped", "bad_request"] {
            let _ = validations.get_or_create(&ValidationLabels {
                result: result.to_string(),
            });
        }
        Self {
            registry: Arc::new(root),
            requests,
            injections,
            denials,
            skips,
            latency,
            validations,
            validation_latency,
        }
    }

    /// Records one answered Pod review (`None`: a bad request).
    pub fn observe(&self, outcome: Option<&Outcome>, seconds: f64) {
        let result = match outcome {
            None => "bad_request",
            Some(Outcome::Injected) => {
                self.injections.inc();
                "injected"
            }
            Some(Outcome::Denied(reason)) => {
                self.denials
                    .get_or_create(&DenialLabels {
                        reason: reason.as_str().to_string(),
                    })
                    .inc();
                "denied"
            }
            Some(Outcome::Skipped(skip)) => {
                self.skips
                    .get_or_create(&SkipLabels {
                        reason: skip.as_str().to_string(),
                    })
                    .inc();
                "skipped"
            }
        };
        self.requests
            .get_or_create(&RequestLabels {
                result: result.to_string(),
            })
            .inc();
        self.latency.observe(seconds);
    }

    /// Records one answered EnvoyConfig review (`None`: a bad request).
    pub fn observe_validation(&self, verdict: Option<&Verdict>, seconds: f64) {
        let result = match verdict {
            None => "bad_request",
            Some(Verdict::Allowed) => "allowed",
            Some(Verdict::Denied) => "denied",
            Some(Verdict::Skipped(_)) => "skipped",
        };
        self.validations
            .get_or_create(&ValidationLabels {
                result: result.to_string(),
            })
            .inc();
        self.validation_latency.observe(seconds);
    }

    /// The registry, for `marin3r_process::metrics_router`.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        marin3r_process::encode_metrics(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_counted_by_reason_and_every_reason_shows_from_the_start() {
        let m = Metrics::new();
        let line = |reason: &str, n: u64| {
            format!("marin3r_webhook_denials_total{{reason=\"{reason}\"}} {n}")
        };
        let text = m.encode().unwrap();
        for reason in DenyReason::ALL {
            assert!(
                text.lines().any(|l| l == line(reason.as_str(), 0)),
                "{text}"
            );
        }
        m.observe(Some(&Outcome::Denied(DenyReason::InvalidAnnotations)), 0.0);
        m.observe(Some(&Outcome::Denied(DenyReason::InvalidAnnotations)), 0.0);
        m.observe(Some(&Outcome::Denied(DenyReason::NotAPodObject)), 0.0);
        let text = m.encode().unwrap();
        for expected in [
            line("invalid_annotations", 2),
            line("not_a_pod_object", 1),
            line("invalid_pod", 0),
            "marin3r_webhook_requests_total{result=\"denied\"} 3".to_string(),
        ] {
            assert!(text.lines().any(|l| l == expected), "{expected} in\n{text}");
        }
    }

    #[test]
    fn the_serving_certificate_expiry_is_exported_without_the_webhook_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = marin3r_certs::issue(&marin3r_certs::IssueOptions {
            hosts: vec!["localhost".into()],
            ..marin3r_certs::IssueOptions::default()
        })
        .unwrap();
        let path = dir.path().join("tls.crt");
        std::fs::write(&path, &bundle.server.cert_pem).unwrap();
        let files = marin3r_certs::ServingFiles::pair(&path, dir.path().join("tls.key"));
        let text = Metrics::serving(files, marin3r_process::Readiness::new())
            .encode()
            .unwrap();
        assert!(
            text.lines().any(|l| l.starts_with(
                "marin3r_certificate_expiration_timestamp_seconds{certificate=\"webhook-serving\"} "
            )),
            "{text}"
        );
        assert!(text.contains("marin3r_webhook_requests_total"), "{text}");
        assert!(text.lines().any(|l| l == "marin3r_ready 0"), "{text}");
    }
}
