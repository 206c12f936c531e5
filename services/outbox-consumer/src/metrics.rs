//! The consumer runtime's Prometheus metrics, registered into the service's own registry.
//! Label values come from small fixed sets: the consumer name, outcomes, reasons.

use std::time::Duration;

use outbox_process::metrics::Registrar;
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::event::Rejection;

/// Metrics of one consumer (one consumer name) in a process.
#[derive(Debug, Clone)]
pub struct ConsumerMetrics {
    /// Messages finished, by outcome: `applied`, `unchanged` (business key already held),
    /// `duplicate` (inbox hit), `ignored` (event type not handled), `dead_lettered`.
    pub messages: IntCounterVec,
    /// Deliveries recognised by the inbox as already applied.
    pub inbox_duplicates: IntCounter,
    /// Failed attempts that will be retried (the offset stays).
    pub retries: IntCounter,
    /// Messages sent to a dead-letter topic, by reason.
    pub dead_letters: IntCounterVec,
    /// Time to apply one event (inbox + effect + commit), successful attempts only.
    pub apply_duration: Histogram,
    /// Partitions currently assigned to this process.
    pub assigned_partitions: IntGauge,
    /// Rebalance callbacks, by kind (`assign`, `revoke`, `error`).
    pub rebalances: IntCounterVec,
    /// 1 while the consumer loop runs (subscribed), 0 before and after.
    pub up: IntGauge,
    /// Offset commits that failed (they are retried by the next commit; at worst a restart
    /// redelivers what the inbox then skips).
    pub commit_failures: IntCounter,
    /// Attempts whose handler panicked (contained: rolled back, retried, then dead-lettered).
    pub handler_panics: IntCounter,
    /// Partition workers found dead (a panic outside the contained handler) and restarted from
    /// their first unapplied offset.
    pub worker_restarts: IntCounter,
    /// Partitions whose fetching is paused because their worker is retrying or its queue is
    /// full; the other partitions keep flowing.
    pub paused_partitions: IntGauge,
    /// Messages not applied yet per assigned partition: high watermark minus committed
    /// offset (labels `topic`, `partition`; see [`super::lag`]).
    pub lag: IntGaugeVec,
    /// Rows the retention purge removed and has still to remove (the inbox; services add their
    /// own tables).
    pub retention: outbox_process::retention::RetentionMetrics,
}

impl ConsumerMetrics {
    /// Creates the metrics for `consumer_name` and registers them in `registry`.
    ///
    /// # Errors
    /// When a metric of the same name is registered already.
    pub fn register(registry: &Registry, consumer_name: &str) -> prometheus::Result<Self> {
        let r = Registrar::new(registry).const_label("consumer", consumer_name);
        let metrics = Self {
            messages: r.metric_vec(
                "consumer_messages_total",
                "Consumed messages finished, by outcome",
                &["outcome"],
            )?,
            inbox_duplicates: r.metric(
                "consumer_inbox_duplicates_total",
                "Deliveries of events the inbox shows as already applied; their effect was skipped",
            )?,
            retries: r.metric(
                "consumer_retries_total",
                "Failed attempts to apply an event that are retried with backoff; the offset stays",
            )?,
            dead_letters: r.metric_vec(
                "consumer_dead_letters_total",
                "Messages sent to the dead-letter topic, by reason",
                &["reason"],
            )?,
            apply_duration: r.histogram(
                "consumer_apply_duration_seconds",
                "Time to apply one event: inbox row, business effect and commit",
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ],
            )?,
            assigned_partitions: r.metric(
                "consumer_assigned_partitions",
                "Partitions currently assigned to this consumer",
            )?,
            rebalances: r.metric_vec(
                "consumer_rebalances_total",
                "Rebalance callbacks by kind",
                &["kind"],
            )?,
            up: r.metric("consumer_up", "1 while the consumer loop runs")?,
            commit_failures: r.metric(
                "consumer_offset_commit_failures_total",
                "Offset commits the broker did not accept",
            )?,
            handler_panics: r.metric(
                "consumer_handler_panics_total",
                "Attempts to apply an event whose handler panicked; rolled back and retried, then dead-lettered",
            )?,
            worker_restarts: r.metric(
                "consumer_worker_restarts_total",
                "Partition workers that died of a panic outside the handler and were restarted from their first unapplied offset",
            )?,
            paused_partitions: r.metric(
                "consumer_paused_partitions",
                "Partitions not being fetched because their worker is retrying or its queue is full",
            )?,
            lag: r.metric_vec(
                "consumer_lag_messages",
                "Messages not applied yet per assigned partition: high watermark minus committed offset",
                &["topic", "partition"],
            )?,
            retention: outbox_process::retention::RetentionMetrics::register(registry)?,
        };
        // Show every series at 0 from the start, so alerts can use `increase()`.
        for outcome in [
            "applied",
            "unchanged",
            "duplicate",
            "ignored",
            "dead_lettered",
        ] {
            metrics.messages.with_label_values(&[outcome]);
        }
        for reason in Rejection::REASONS {
            metrics.dead_letters.with_label_values(&[reason]);
        }
        Ok(metrics)
    }

    /// Counts a finished message.
    pub fn finished(&self, outcome: &str) {
        self.messages.with_label_values(&[outcome]).inc();
    }

    /// Records a successful apply's duration.
    pub fn observe_apply(&self, elapsed: Duration) {
        self.apply_duration.observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_exist_from_the_start_with_the_consumer_label() {
        let registry = Registry::new();
        let m = ConsumerMetrics::register(&registry, "wms").unwrap();
        m.inbox_duplicates.inc();
        let text = outbox_process::metrics::render(&registry);
        for line in [
            "consumer_inbox_duplicates_total{consumer=\"wms\"} 1",
            "consumer_messages_total{consumer=\"wms\",outcome=\"dead_lettered\"} 0",
            "consumer_dead_letters_total{consumer=\"wms\",reason=\"unknown_version\"} 0",
            "consumer_assigned_partitions{consumer=\"wms\"} 0",
            "consumer_handler_panics_total{consumer=\"wms\"} 0",
            "consumer_worker_restarts_total{consumer=\"wms\"} 0",
            "consumer_paused_partitions{consumer=\"wms\"} 0",
            "consumer_dead_letters_total{consumer=\"wms\",reason=\"handler_panic\"} 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(ConsumerMetrics::register(&registry, "wms").is_err());
    }
}
