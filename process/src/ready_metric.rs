//! `marin3r_ready`: 1 while the process is ready (what `/readyz` answers: synced and not
//! stopping), 0 otherwise, read from its [`Readiness`] at each scrape. It lets an alert
//! on a process that stays not ready go without kube-state-metrics.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::Readiness;

/// The metric's name.
pub const READY_METRIC: &str = "marin3r_ready";

#[derive(Debug)]
struct ReadyCollector(Readiness);

impl Collector for ReadyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let metric = encoder.encode_descriptor(
            READY_METRIC,
            "1 while the process is ready (/readyz answers 200: synced and not stopping), else 0",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.0.is_ready())).encode(metric)
    }
}

/// Registers `marin3r_ready` for `readiness` with `registry`.
pub fn register_ready_metric(registry: &mut Registry, readiness: Readiness) {
    registry.register_collector(Box::new(ReadyCollector(readiness)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn ready_follows_readiness_at_each_scrape() {
        let readiness = Readiness::new();
        let mut registry = Registry::default();
        register_ready_metric(&mut registry, readiness.clone());
        assert!(text(&registry).lines().any(|l| l == "marin3r_ready 0"));
        readiness.set_synced();
        assert!(text(&registry).lines().any(|l| l == "marin3r_ready 1"));
        readiness.set_stopping();
        assert!(text(&registry).lines().any(|l| l == "marin3r_ready 0"));
    }
}
