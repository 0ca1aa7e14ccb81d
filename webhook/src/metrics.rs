//! Prometheus metrics of the webhook (text format on `--metrics-bind-address`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::admission::Outcome;
use crate::validation::Verdict;

/// Label set of the skip counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
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
    denials: Counter,
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
        let mut registry = Registry::with_prefix("marin3r_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        let injections = Counter::default();
        let denials = Counter::default();
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
            "Pods denied for invalid annotations",
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
        for result in ["allowed", "denied", "skipped", "bad_request"] {
            let _ = validations.get_or_create(&ValidationLabels {
                result: result.to_string(),
            });
        }
        Self {
            registry: Arc::new(registry),
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
            Some(Outcome::Denied) => {
                self.denials.inc();
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
