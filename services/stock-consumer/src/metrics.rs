//! The stock consumer process's Prometheus metrics, in their own registry: HTTP requests and the consumer
//! runtime's metrics (including inbox duplicates). Label values come from small fixed sets.

use outbox_kit::consumer::ConsumerMetrics;
use prometheus::{IntCounterVec, Opts, Registry};

use crate::handler::CONSUMER_NAME;

/// All metrics of the stock consumer process.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// HTTP requests by method, matched route and status.
    pub http_requests: IntCounterVec,
    /// The consumer runtime's metrics.
    pub consumer: ConsumerMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Panics
    /// Never in practice: the names are fixed and distinct.
    pub fn new() -> Self {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new(
                "stock_http_requests_total",
                "HTTP requests by method, route and status",
            ),
            &["method", "route", "status"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(http_requests.clone()))
            .expect("unique metric");
        let consumer =
            ConsumerMetrics::register(&registry, CONSUMER_NAME).expect("unique consumer metrics");
        Self {
            registry,
            http_requests,
            consumer,
        }
    }
}
