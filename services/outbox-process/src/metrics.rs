//! Prometheus metrics created and registered in one call ([`Registrar`]), and the text
//! exposition of a registry ([`render`]): what every binary's metrics module (the relay's, each
//! service's, the consumer runtime's) would otherwise spell out metric by metric.

use std::collections::HashMap;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Creates metrics and registers them in one registry, each with the same constant labels
/// (none unless [`Registrar::const_label`]).
#[derive(Debug)]
pub struct Registrar<'a> {
    registry: &'a Registry,
    const_labels: HashMap<String, String>,
}

impl<'a> Registrar<'a> {
    /// Registers into `registry`.
    pub fn new(registry: &'a Registry) -> Self {
        Self {
            registry,
            const_labels: HashMap::new(),
        }
    }

    /// Gives every metric registered from now on the label `name` = `value` (the consumer
    /// runtime's `consumer`).
    #[must_use]
    pub fn const_label(mut self, name: &str, value: &str) -> Self {
        self.const_labels.insert(name.to_owned(), value.to_owned());
        self
    }

    /// A counter `name` with help text `help`.
    ///
    /// # Errors
    /// An invalid name, or a metric of the same name registered already.
    pub fn int_counter(&self, name: &str, help: &str) -> prometheus::Result<IntCounter> {
        self.register(IntCounter::with_opts(self.opts(name, help))?)
    }

    /// A counter `name` with help text `help`, by `labels`.
    ///
    /// # Errors
    /// An invalid name or label, or a metric of the same name registered already.
    pub fn int_counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        self.register(IntCounterVec::new(self.opts(name, help), labels)?)
    }

    /// An integer gauge `name` with help text `help`.
    ///
    /// # Errors
    /// An invalid name, or a metric of the same name registered already.
    pub fn int_gauge(&self, name: &str, help: &str) -> prometheus::Result<IntGauge> {
        self.register(IntGauge::with_opts(self.opts(name, help))?)
    }

    /// An integer gauge `name` with help text `help`, by `labels`.
    ///
    /// # Errors
    /// An invalid name or label, or a metric of the same name registered already.
    pub fn int_gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntGaugeVec> {
        self.register(IntGaugeVec::new(self.opts(name, help), labels)?)
    }

    /// A gauge `name` with help text `help`.
    ///
    /// # Errors
    /// An invalid name, or a metric of the same name registered already.
    pub fn gauge(&self, name: &str, help: &str) -> prometheus::Result<Gauge> {
        self.register(Gauge::with_opts(self.opts(name, help))?)
    }

    /// A gauge `name` with help text `help`, by `labels`.
    ///
    /// # Errors
    /// An invalid name or label, or a metric of the same name registered already.
    pub fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<GaugeVec> {
        self.register(GaugeVec::new(self.opts(name, help), labels)?)
    }

    /// A histogram `name` with help text `help` and the upper bounds `buckets`.
    ///
    /// # Errors
    /// An invalid name or buckets, or a metric of the same name registered already.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
    ) -> prometheus::Result<Histogram> {
        self.register(Histogram::with_opts(
            self.histogram_opts(name, help, buckets),
        )?)
    }

    /// A histogram `name` with help text `help` and the upper bounds `buckets`, by `labels`.
    ///
    /// # Errors
    /// An invalid name, label or buckets, or a metric of the same name registered already.
    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> prometheus::Result<HistogramVec> {
        self.register(HistogramVec::new(
            self.histogram_opts(name, help, buckets),
            labels,
        )?)
    }

    fn opts(&self, name: &str, help: &str) -> Opts {
        Opts::new(name, help).const_labels(self.const_labels.clone())
    }

    fn histogram_opts(&self, name: &str, help: &str, buckets: Vec<f64>) -> HistogramOpts {
        HistogramOpts::new(name, help)
            .const_labels(self.const_labels.clone())
            .buckets(buckets)
    }

    fn register<M: Collector + Clone + 'static>(&self, metric: M) -> prometheus::Result<M> {
        self.registry.register(Box::new(metric.clone()))?;
        Ok(metric)
    }
}

/// The Prometheus text exposition of everything in `registry` (what `/metrics` answers).
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding fails only on a family without a name or without series; `gather` hands out
    // neither (names are checked at registration, empty families are left out).
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_render_with_their_constant_labels() {
        let registry = Registry::new();
        let r = Registrar::new(&registry).const_label("consumer", "wms");
        r.int_counter("a_total", "A").unwrap().inc();
        r.int_counter_vec("b_total", "B", &["outcome"])
            .unwrap()
            .with_label_values(&["applied"])
            .inc_by(2);
        r.int_gauge("c", "C").unwrap().set(3);
        r.int_gauge_vec("d", "D", &["topic"])
            .unwrap()
            .with_label_values(&["t"])
            .set(4);
        r.gauge("e_seconds", "E").unwrap().set(0.5);
        r.gauge_vec("f_seconds", "F", &["topic"])
            .unwrap()
            .with_label_values(&["t"])
            .set(1.5);
        r.histogram("g_seconds", "G", vec![1.0])
            .unwrap()
            .observe(0.1);
        r.histogram_vec("h_seconds", "H", vec![1.0], &["stage"])
            .unwrap()
            .with_label_values(&["claim"])
            .observe(2.0);
        let text = render(&registry);
        for line in [
            "# HELP a_total A",
            "a_total{consumer=\"wms\"} 1",
            "b_total{consumer=\"wms\",outcome=\"applied\"} 2",
            "c{consumer=\"wms\"} 3",
            "d{consumer=\"wms\",topic=\"t\"} 4",
            "e_seconds{consumer=\"wms\"} 0.5",
            "f_seconds{consumer=\"wms\",topic=\"t\"} 1.5",
            "g_seconds_bucket{consumer=\"wms\",le=\"1\"} 1",
            "h_seconds_bucket{consumer=\"wms\",stage=\"claim\",le=\"+Inf\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_name_registered_twice_is_refused() {
        let registry = Registry::new();
        let r = Registrar::new(&registry);
        r.int_counter("a_total", "A").unwrap();
        assert!(r.int_gauge("a_total", "A again").is_err());
        assert!(r.int_counter("not a name", "A").is_err());
    }
}
