//! The service's Prometheus metrics, in their own registry. Label values come from small
//! fixed sets (routes, outcomes, reasons), never from ids.

use std::time::Duration;

use outbox_http::service::ObserveHttp;

use outbox_consumer_service::ConsumerServiceMetrics;
use outbox_process::metrics::Registrar;
use prometheus::{HistogramVec, IntCounter, IntCounterVec, Registry};

/// All order-service metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// HTTP requests by method, matched route and status.
    pub http_requests: IntCounterVec,
    /// HTTP request latency by matched route.
    pub http_duration: HistogramVec,
    /// Orders created (replays not counted).
    pub orders_created: IntCounter,
    /// `POST /orders` answered from a stored response.
    pub idempotent_replays: IntCounter,
    /// Orders cancelled.
    pub orders_cancelled: IntCounter,
    /// Payment notifications by outcome (`applied`, `duplicate`, `flagged_for_refund`).
    pub payment_callbacks: IntCounterVec,
    /// Payments recorded for orders that could not take them, by reason (`order_cancelled`,
    /// `already_paid`): money an operator must send back.
    pub payments_flagged_for_refund: IntCounterVec,
    /// Refunds requested (replays not counted).
    pub refunds_requested: IntCounter,
    /// Refund notifications by outcome (`applied`, `duplicate`, `stale`, `conflicting`).
    pub refund_callbacks: IntCounterVec,
    /// Marketplace messages by source (`push`, `query`) and outcome (`applied`,
    /// `duplicate_message` = layer 1, `duplicate_change` = layer 2, `stale`).
    pub channel_messages: IntCounterVec,
    /// Changes the compensation poller applied whose push never arrived.
    pub channel_recovered: IntCounter,
    /// Ship-backs the platform refused for good (dead-lettered).
    pub shipback_failures: IntCounter,
    /// When the compensation poller last finished a pass with every change applied (set and
    /// registered only where the poller runs: [`Metrics::enable_compensation`]).
    pub channel_compensation_last_success: prometheus::Gauge,
    /// Changes the compensation poller fetched and could not apply (retried next pass; the
    /// watermark stays below them).
    pub channel_compensation_failed: IntCounter,
    /// The fulfilment consumer's metrics (messages, inbox duplicates, retries, dead letters).
    pub consumer: outbox_consumer::ConsumerMetrics,
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
    /// Never: the names are constants, valid and unique.
    pub fn new() -> Self {
        Self::register(crate::subscription::IDENTITY.metrics()).expect("valid, unique metric names")
    }

    /// The service's own metrics, beside the ones every consuming service has (the HTTP
    /// request counter, the fulfilment consumer's metrics) in `shared`'s registry.
    fn register(shared: ConsumerServiceMetrics) -> prometheus::Result<Self> {
        let r = Registrar::new(&shared.registry);
        let metrics = Self {
            http_duration: r.histogram_vec(
                "order_http_request_duration_seconds",
                "HTTP request latency by route",
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
                &["route"],
            )?,
            orders_created: r.metric("order_orders_created_total", "Orders created")?,
            idempotent_replays: r.metric(
                "order_idempotent_replays_total",
                "Order creations answered from the stored response of an earlier request with the same Idempotency-Key",
            )?,
            orders_cancelled: r.metric("order_orders_cancelled_total", "Orders cancelled")?,
            payment_callbacks: r.metric_vec(
                "order_payment_callbacks_total",
                "Accepted payment notifications by outcome",
                &["outcome"],
            )?,
            payments_flagged_for_refund: r.metric_vec(
                "order_payments_flagged_for_refund_total",
                "Payments recorded for orders that could not take them (cancelled, already paid); the money must be refunded",
                &["reason"],
            )?,
            refunds_requested: r
                .metric("order_refunds_requested_total", "Refunds requested")?,
            refund_callbacks: r.metric_vec(
                "order_refund_callbacks_total",
                "Accepted refund notifications by outcome",
                &["outcome"],
            )?,
            channel_messages: r.metric_vec(
                "order_channel_messages_total",
                "Marketplace messages by source (push, query) and outcome (applied, duplicate_message = layer 1, duplicate_change = layer 2, stale)",
                &["source", "outcome"],
            )?,
            channel_recovered: r.metric(
                "order_channel_compensation_recovered_total",
                "Marketplace changes applied by the compensation poller (their push was lost)",
            )?,
            shipback_failures: r.metric(
                "order_shipback_failures_total",
                "Ship-backs the platform refused for good (dead-lettered)",
            )?,
            channel_compensation_failed: r.metric(
                "order_channel_compensation_failed_changes_total",
                "Changes fetched by the compensation poller that could not be applied (retried at the next pass)",
            )?,
            // Registered only where the poller runs: [`Metrics::enable_compensation`].
            channel_compensation_last_success: prometheus::Gauge::new(
                "order_channel_compensation_last_success_timestamp_seconds",
                "When the compensation poller last finished a pass with every fetched change applied (unix seconds; the process start before the first)",
            )?,
            http_requests: shared.http_requests,
            consumer: shared.consumer,
            registry: shared.registry,
        };
        // Show the refund flags at 0 from the start, so alerts can use `increase()`.
        for reason in ["order_cancelled", "already_paid", "stock_rejected"] {
            metrics
                .payments_flagged_for_refund
                .with_label_values(&[reason]);
        }
        Ok(metrics)
    }

    /// Exports `order_channel_compensation_last_success_timestamp_seconds`, starting at now: a
    /// poller that never finishes a clean pass alerts as one that stopped.
    pub fn enable_compensation(&self) {
        self.channel_compensation_last_success
            .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
        let _ = self
            .registry
            .register(Box::new(self.channel_compensation_last_success.clone()));
    }

    /// The gauges of the order database's business state ([`outbox_http::service::StateGauges`]),
    /// registered here; the caller runs them.
    pub fn state_gauges(&self) -> outbox_http::service::StateGauges {
        let r = &self.registry;
        outbox_http::service::StateGauges::new()
            .gauge(
                r,
                "order_payments_refund_required",
                "Payments flagged for refund whose money is still owed to the buyer (REFUND_REQUIRED)",
                "SELECT count(*)::float8 FROM payments WHERE disposition = 'REFUND_REQUIRED'",
            )
            .gauge(
                r,
                "order_payments_refund_due_cents",
                "The money still owed to buyers by payments flagged for refund, in cents",
                "SELECT sum(refund_due_cents)::float8 FROM payments WHERE disposition = 'REFUND_REQUIRED'",
            )
            .gauge(
                r,
                "order_refunds_open",
                "Refunds requested and not yet decided (each holds its order's fulfilment unless refund-only)",
                "SELECT count(*)::float8 FROM refunds WHERE status = 'REQUESTED'",
            )
            .gauge(
                r,
                "order_refund_oldest_open_age_seconds",
                "Age of the oldest refund requested and not yet decided (0 without one)",
                "SELECT extract(epoch FROM now() - min(created_at))::float8 FROM refunds WHERE status = 'REQUESTED'",
            )
            .gauge(
                r,
                "order_shipbacks_unreported",
                "Ship-backs requested and not reported to the platform (unanswered or refused)",
                "SELECT count(*)::float8 FROM channel_shipbacks WHERE result IS NULL",
            )
            .gauge(
                r,
                "order_shipback_oldest_unreported_age_seconds",
                "Age of the oldest ship-back not reported to the platform (0 without one)",
                "SELECT extract(epoch FROM now() - min(requested_at))::float8 FROM channel_shipbacks WHERE result IS NULL",
            )
            .gauge(
                r,
                "order_channel_refund_amount_mismatches",
                "Refunds changed in the last 7 days booked at another amount than the platform's newest snapshot (the audit lists them all)",
                "SELECT count(*)::float8 FROM refunds r JOIN channel_refunds c USING (refund_no) \
                 WHERE r.updated_at > now() - interval '7 days' AND r.status IN ('REQUESTED', 'SUCCEEDED') \
                   AND c.last_refund_cents IS NOT NULL AND c.last_refund_cents <> r.amount_cents",
            )
    }

    /// The registry `/metrics` renders.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        outbox_process::metrics::render(&self.registry)
    }
}

/// Counts every HTTP request and records its latency by route.
impl ObserveHttp for Metrics {
    fn observe_http(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.http_requests
            .with_label_values(&[method, route, &status.to_string()])
            .inc();
        self.http_duration
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_metric_names_with_units() {
        let m = Metrics::new();
        m.observe_http("POST", "/orders", 201, Duration::from_millis(3));
        m.payments_flagged_for_refund
            .with_label_values(&["order_cancelled"])
            .inc();
        let text = m.render();
        for name in [
            "order_http_requests_total{method=\"POST\",route=\"/orders\",status=\"201\"} 1",
            "order_http_request_duration_seconds_bucket",
            "order_payments_flagged_for_refund_total{reason=\"order_cancelled\"} 1",
            "order_payments_flagged_for_refund_total{reason=\"already_paid\"} 0",
            "order_orders_created_total 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
