//! Prometheus metrics created and registered in one call ([`Registrar`]), and the text
//! exposition of a registry ([`render`]): what every binary's metrics module (the relay's, each
//! service's, the consumer runtime's) would otherwise spell out metric by metric.

use std::collections::HashMap;

use prometheus::core::{
    Atomic, Collector, GenericCounter, GenericCounterVec, GenericGauge, GenericGaugeVec,
};
use prometheus::{Encoder, Histogram, HistogramOpts, HistogramVec, Opts, Registry, TextEncoder};

/// A metric made from a name and a help text: a counter or a gauge ([`Registrar::metric`]).
pub trait Plain: Collector + Clone + Sized + 'static {
    /// The metric described by `opts`.
    ///
    /// # Errors
    /// An invalid name or label.
    fn create(opts: Opts) -> prometheus::Result<Self>;
}

/// A metric with variable labels: a counter or gauge vector ([`Registrar::metric_vec`]).
pub trait Labelled: Collector + Clone + Sized + 'static {
    /// The metric described by `opts`, by `labels`.
    ///
    /// # Errors
    /// An invalid name or label.
    fn create(opts: Opts, labels: &[&str]) -> prometheus::Result<Self>;
}

macro_rules! plain_and_labelled {
    ($($plain:ident, $labelled:ident);*) => {$(
        impl<P: Atomic + 'static> Plain for $plain<P> {
            fn create(opts: Opts) -> prometheus::Result<Self> {
                Self::with_opts(opts)
            }
        }

        impl<P: Atomic + 'static> Labelled for $labelled<P> {
            fn create(opts: Opts, labels: &[&str]) -> prometheus::Result<Self> {
                Self::new(opts, labels)
            }
        }
    )*};
}

plain_and_labelled!(GenericCounter, GenericCounterVec; GenericGauge, GenericGaugeVec);

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

    /// A counter or gauge `name` with help text `help` (its type says which:
    /// `IntCounter`, `IntGauge`, `Gauge`, ...).
    ///
    /// # Errors
    /// An invalid name, or a metric of the same name registered already.
    pub fn metric<M: Plain>(&self, name: &str, help: &str) -> prometheus::Result<M> {
        self.register(M::create(self.opts(name, help))?)
    }

    /// A counter or gauge vector `name` with help text `help`, by `labels` (its type says
    /// which: `IntCounterVec`, `IntGaugeVec`, `GaugeVec`, ...).
    ///
    /// # Errors
    /// An invalid name or label, or a metric of the same name registered already.
    pub fn metric_vec<M: Labelled>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<M> {
        self.register(M::create(self.opts(name, help), labels)?)
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
        let opts = self.histogram_opts(name, help, buckets);
        self.register(HistogramVec::new(opts, labels)?)
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
    use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

    use super::*;

    #[test]
    fn registered_metrics_render_with_their_constant_labels() {
        let registry = Registry::new();
        let r = Registrar::new(&registry).const_label("consumer", "wms");
        r.metric::<IntCounter>("a_total", "A").unwrap().inc();
        r.metric_vec::<IntCounterVec>("b_total", "B", &["outcome"])
            .unwrap()
            .with_label_values(&["applied"])
            .inc_by(2);
        r.metric::<IntGauge>("c", "C").unwrap().set(3);
        r.metric_vec::<IntGaugeVec>("d", "D", &["topic"])
            .unwrap()
            .with_label_values(&["t"])
            .set(4);
        r.metric::<Gauge>("e_seconds", "E").unwrap().set(0.5);
        r.metric_vec::<GaugeVec>("f_seconds", "F", &["topic"])
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
    fn an_invalid_or_taken_name_is_refused() {
        let registry = Registry::new();
        let r = Registrar::new(&registry);
        r.metric::<IntCounter>("a_total", "A").unwrap();
        assert!(r.metric::<IntGauge>("a_total", "A again").is_err());
        assert!(r.metric::<IntCounter>("not a name", "A").is_err());
    }
}
