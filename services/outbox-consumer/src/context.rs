//! The consumer's client context: the librdkafka callbacks of the runtime's consumer (log
//! levels, broker outages reported once, rebalances, commit results), and the consumer type the
//! fetch loop ([`super::runtime`]), the partition workers ([`super::worker`]) and the
//! supervisor ([`super::supervisor`]) share.
//!
//! A revoke retires the partitions' workers in the registry ([`super::registry`]) before
//! librdkafka takes the partitions away, and resumes the ones this process paused
//! ([`super::flow::set_paused`]), so a partition that comes back is not left paused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::TopicPartitionList;

use super::flow;
use super::metrics::ConsumerMetrics;
use super::registry::WorkerRegistry;

/// The runtime's Kafka consumer: what the fetch loop reads from, and what the workers store
/// offsets in and the supervisor seeks with.
pub(crate) type RuntimeConsumer = StreamConsumer<RuntimeContext>;

/// librdkafka callbacks of the runtime's consumer.
pub(crate) struct RuntimeContext {
    registry: Arc<Mutex<WorkerRegistry>>,
    metrics: ConsumerMetrics,
    broker_down: AtomicBool,
}

impl RuntimeContext {
    /// The context of a consumer whose workers are in `registry`; no broker outage reported yet.
    pub(crate) fn new(registry: Arc<Mutex<WorkerRegistry>>, metrics: ConsumerMetrics) -> Self {
        Self {
            registry,
            metrics,
            broker_down: AtomicBool::new(false),
        }
    }

    /// Whether an outage was reported since the last call (a message has just arrived, so the
    /// broker is reachable again); clears the report.
    pub(crate) fn take_broker_down(&self) -> bool {
        self.broker_down.swap(false, Ordering::Relaxed)
    }
}

impl ClientContext for RuntimeContext {
    /// librdkafka logs every reconnect attempt; those go to debug level. Outages are reported
    /// once through [`ClientContext::error`].
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        outbox_kafka::log_librdkafka!(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        use outbox_kafka::Connectivity;
        match outbox_kafka::connectivity(error.rdkafka_error_code()) {
            Connectivity::ClusterDown => {
                if !self.broker_down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %error, reason, "Kafka broker unreachable; librdkafka keeps retrying");
                }
            }
            // One broker of several: the others serve on.
            Connectivity::BrokerLost => {
                tracing::info!(error = %error, reason, "Kafka broker connection failed; librdkafka reconnects");
            }
            Connectivity::Other
                if error.rdkafka_error_code()
                    == Some(RDKafkaErrorCode::UnknownTopicOrPartition) =>
            {
                tracing::warn!(
                    reason,
                    "A subscribed topic does not exist (yet); create it, or start with --create-missing-topics"
                )
            }
            Connectivity::Other => tracing::error!(error = %error, reason, "Kafka client error"),
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl ConsumerContext for RuntimeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let partitions = partitions_of(tpl);
                self.metrics.rebalances.with_label_values(&["revoke"]).inc();
                if let Ok(mut r) = self.registry.lock() {
                    // A partition we paused must not stay paused if it comes back to us.
                    for (topic, partition) in r.retire(&partitions) {
                        let _ = flow::set_paused(consumer, &topic, partition, false);
                    }
                    self.metrics
                        .paused_partitions
                        .set(i64::try_from(r.paused_count()).unwrap_or(i64::MAX));
                }
                tracing::info!(
                    partitions = ?partitions,
                    "Partitions revoked; their workers stop after the event in hand"
                );
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => {
                self.metrics.rebalances.with_label_values(&["error"]).inc();
                tracing::warn!(error = %e, "Rebalance failed");
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.metrics.rebalances.with_label_values(&["assign"]).inc();
            tracing::info!(partitions = ?partitions_of(tpl), "Partitions assigned");
        }
        let assigned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
        self.metrics
            .assigned_partitions
            .set(i64::try_from(assigned).unwrap_or(i64::MAX));
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::trace!(partitions = offsets.count(), "Committed offsets"),
            // Nothing was stored since the last commit.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                self.metrics.commit_failures.inc();
                tracing::warn!(error = %e, "Offset commit failed; the next commit carries the same offsets");
            }
        }
    }
}
