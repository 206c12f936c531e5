//! The consumer runtime's Prometheus metrics, registered into the service's own registry.
//! Label values come from small fixed sets: the consumer name, outcomes, reasons.

use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

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
        let labels = || {
            let mut m = std::collections::HashMap::new();
            m.insert("consumer".to_owned(), consumer_name.to_owned());
            m
        };
        let messages = IntCounterVec::new(
            Opts::new(
                "consumer_messages_total",
                "Consumed messages finished, by outcome",
            )
            .const_labels(labels()),
            &["outcome"],
        )?;
        let inbox_duplicates = IntCounter::with_opts(
            Opts::new(
                "consumer_inbox_duplicates_total",
                "Deliveries of events the inbox shows as already applied; their effect was skipped",
            )
            .const_labels(labels()),
        )?;
        let retries = IntCounter::with_opts(
            Opts::new(
                "consumer_retries_total",
                "Failed attempts to apply an event that are retried with backoff; the offset stays",
            )
            .const_labels(labels()),
        )?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "consumer_dead_letters_total",
                "Messages sent to the dead-letter topic, by reason",
            )
            .const_labels(labels()),
            &["reason"],
        )?;
        let apply_duration = Histogram::with_opts(
            HistogramOpts::new(
                "consumer_apply_duration_seconds",
                "Time to apply one event: inbox row, business effect and commit",
            )
            .const_labels(labels())
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )?;
        let assigned_partitions = IntGauge::with_opts(
            Opts::new(
                "consumer_assigned_partitions",
                "Partitions currently assigned to this consumer",
            )
            .const_labels(labels()),
        )?;
        let rebalances = IntCounterVec::new(
            Opts::new("consumer_rebalances_total", "Rebalance callbacks by kind")
                .const_labels(labels()),
            &["kind"],
        )?;
        let commit_failures = IntCounter::with_opts(
            Opts::new(
                "consumer_offset_commit_failures_total",
                "Offset commits the broker did not accept",
            )
            .const_labels(labels()),
        )?;
        let handler_panics = IntCounter::with_opts(
            Opts::new(
                "consumer_handler_panics_total",
                "Attempts to apply an event whose handler panicked; rolled back and retried, then dead-lettered",
            )
            .const_labels(labels()),
        )?;
        let worker_restarts = IntCounter::with_opts(
            Opts::new(
                "consumer_worker_restarts_total",
                "Partition workers that died of a panic outside the handler and were restarted from their first unapplied offset",
            )
            .const_labels(labels()),
        )?;
        let paused_partitions = IntGauge::with_opts(
            Opts::new(
                "consumer_paused_partitions",
                "Partitions not being fetched because their worker is retrying or its queue is full",
            )
            .const_labels(labels()),
        )?;
        let up = IntGauge::with_opts(
            Opts::new("consumer_up", "1 while the consumer loop runs").const_labels(labels()),
        )?;
        registry.register(Box::new(up.clone()))?;
        registry.register(Box::new(messages.clone()))?;
        registry.register(Box::new(inbox_duplicates.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(dead_letters.clone()))?;
        registry.register(Box::new(apply_duration.clone()))?;
        registry.register(Box::new(assigned_partitions.clone()))?;
        registry.register(Box::new(rebalances.clone()))?;
        registry.register(Box::new(commit_failures.clone()))?;
        registry.register(Box::new(handler_panics.clone()))?;
        registry.register(Box::new(worker_restarts.clone()))?;
        registry.register(Box::new(paused_partitions.clone()))?;
        let lag = IntGaugeVec::new(
            Opts::new(
                "consumer_lag_messages",
                "Messages not applied yet per assigned partition: high watermark minus committed offset",
            )
            .const_labels(labels()),
            &["topic", "partition"],
        )?;
        registry.register(Box::new(lag.clone()))?;
        let retention = outbox_process::retention::RetentionMetrics::register(registry)?;
        // Show every series at 0 from the start, so alerts can use `increase()`.
        for outcome in [
            "applied",
            "unchanged",
            "duplicate",
            "ignored",
            "dead_lettered",
        ] {
            messages.with_label_values(&[outcome]);
        }
        for reason in Rejection::REASONS {
            dead_letters.with_label_values(&[reason]);
        }
        Ok(Self {
            messages,
            inbox_duplicates,
            retries,
            dead_letters,
            apply_duration,
            assigned_partitions,
            rebalances,
            up,
            commit_failures,
            handler_panics,
            worker_restarts,
            paused_partitions,
            lag,
            retention,
        })
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
    use prometheus::{Encoder, TextEncoder};

    #[test]
    fn series_exist_from_the_start_with_the_consumer_label() {
        let registry = Registry::new();
        let m = ConsumerMetrics::register(&registry, "wms").unwrap();
        m.inbox_duplicates.inc();
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut buf)
            .unwrap();
        let text = String::from_utf8(buf).unwrap();
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
