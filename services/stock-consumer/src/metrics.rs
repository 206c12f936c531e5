//! The stock consumer process's Prometheus metrics: HTTP requests (`stock_http_requests_total`) and the
//! consumer runtime's metrics (including inbox duplicates), built by the shared
//! [`ConsumerServiceMetrics`].

use outbox_kit::service::ConsumerServiceMetrics;

use crate::handler::CONSUMER_NAME;

/// All metrics of this process.
pub type Metrics = ConsumerServiceMetrics;

/// Creates and registers every metric of this process.
pub fn new_metrics() -> Metrics {
    ConsumerServiceMetrics::new("stock", CONSUMER_NAME)
}
