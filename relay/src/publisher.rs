//! Publishing a batch of outbox rows to Kafka with an idempotent producer.
//!
//! All messages of a batch are handed to librdkafka at once (pipelined), in `id` order, keyed
//! by aggregate id; the idempotent producer keeps their order per partition. Each row's
//! outcome comes from its own delivery report: only a report that says "persisted" counts.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use outbox_kit::EventEnvelope;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::kafka_context::RelayContext;

/// Settings the relay always uses; `enable.idempotence` and `acks` cannot be overridden.
///
/// `message.timeout.ms=0` (no local timeout) keeps per-partition order through broker
/// outages: a message that times out while queued leaves a gap that later messages of the
/// same key would jump over. librdkafka retries until the broker is back; the relay reports
/// the outage and SIGTERM abandons what is in flight (it is sent again after restart).
/// `partitioner=murmur2_random` places keys like the Java client (and Debezium, Kafka
/// Connect, kafka-python) do, so a key lands on the same partition whoever produced it.
pub const PRODUCER_DEFAULTS: [(&str, &str); 10] = [
    ("partitioner", "murmur2_random"),
    // The relay hands over whole batches at once; lingering only idles at a batch's end.
    ("linger.ms", "1"),
    ("batch.num.messages", "10000"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
    ("message.timeout.ms", "0"),
    ("queue.buffering.max.messages", "500000"),
    ("queue.buffering.max.kbytes", "1048576"),
    ("enable.metrics.push", "false"),
    ("client.id", "outbox-relay"),
];

/// Why a row was not published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// librdkafka refused the message before sending (e.g. too large); later rows of the same
    /// aggregate in the batch are held back.
    #[error("message rejected by the producer: {0}")]
    Rejected(RDKafkaErrorCode),
    /// The delivery report carried an error. The message may still have been written
    /// (possibly persisted): it is sent again, never counted as delivered.
    #[error("delivery failed: {0}")]
    Delivery(RDKafkaErrorCode),
    /// The producer dropped the message before reporting (shutdown, producer replaced).
    #[error("delivery report lost")]
    Cancelled,
    /// Not sent because an earlier row of the same aggregate failed in this batch.
    #[error("held back behind a failed event of the same aggregate")]
    HeldBack,
}

impl PublishError {
    /// True for errors caused by the message itself (too large, invalid), not by the broker
    /// or the connection: only its aggregate has to wait.
    pub fn is_message_specific(&self) -> bool {
        use RDKafkaErrorCode as C;
        match self {
            Self::Rejected(code) => *code != C::Fatal,
            Self::Delivery(code) => matches!(
                code,
                C::MessageSizeTooLarge
                    | C::InvalidRecord
                    | C::InvalidMessage
                    | C::InvalidMessageSize
            ),
            Self::Cancelled | Self::HeldBack => false,
        }
    }

    /// True for errors that leave the producer unusable (fatal idempotence errors): the relay
    /// builds a new producer.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Delivery(RDKafkaErrorCode::Fatal) | Self::Rejected(RDKafkaErrorCode::Fatal)
        )
    }
}

/// Outcome of one row.
#[derive(Debug, Clone)]
pub struct RowOutcome {
    /// The row's id.
    pub id: i64,
    /// Acknowledged at this time, or the reason it was not.
    pub result: Result<DateTime<Utc>, PublishError>,
}

/// The Kafka side of the relay.
pub struct Publisher {
    producer: FutureProducer<RelayContext>,
    context: RelayContext,
    topic_prefix: String,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic_prefix", &self.topic_prefix)
            .finish()
    }
}

/// Builds the producer configuration: defaults, then the user's settings, then the settings
/// the relay's guarantees depend on.
pub fn producer_config(brokers: &str, extra: &[(String, String)]) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers);
    for (k, v) in PRODUCER_DEFAULTS {
        cfg.set(k, v);
    }
    for (k, v) in extra {
        cfg.set(k, v);
    }
    cfg.set("enable.idempotence", "true");
    cfg.set("acks", "all");
    cfg
}

impl Publisher {
    /// Creates the producer (no connection is made until the first message).
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn new(
        brokers: &str,
        extra: &[(String, String)],
        topic_prefix: &str,
    ) -> Result<Self, KafkaError> {
        let context = RelayContext::default();
        let producer = producer_config(brokers, extra).create_with_context(context.clone())?;
        Ok(Self {
            producer,
            context,
            topic_prefix: topic_prefix.to_owned(),
        })
    }

    /// The topic of a row.
    pub fn topic_of(&self, row: &EventEnvelope) -> String {
        row.topic(&self.topic_prefix)
    }

    /// The producer's client context (broker state).
    pub fn context(&self) -> &RelayContext {
        &self.context
    }

    /// The underlying producer, for metadata queries.
    pub fn producer(&self) -> &FutureProducer<RelayContext> {
        &self.producer
    }

    /// True once librdkafka raised a fatal error; the producer must be replaced.
    pub fn is_fatal(&self) -> bool {
        self.producer.client().fatal_error().is_some()
    }

    /// Sends every row (in order) and waits for all delivery reports.
    ///
    /// A row whose message librdkafka refuses synchronously holds back the later rows of its
    /// aggregate in this batch, which are then not sent at all. The returned outcomes are in
    /// the order of `rows`.
    pub async fn publish(&self, rows: &[EventEnvelope]) -> Vec<RowOutcome> {
        let mut blocked: HashSet<&str> = HashSet::new();
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            if blocked.contains(row.aggregate_id.as_str()) {
                pending.push(Pending::Done(RowOutcome {
                    id: row.id,
                    result: Err(PublishError::HeldBack),
                }));
                continue;
            }
            match self.enqueue(row).await {
                Ok(fut) => pending.push(Pending::InFlight(row.id, fut)),
                Err(code) => {
                    blocked.insert(row.aggregate_id.as_str());
                    pending.push(Pending::Done(RowOutcome {
                        id: row.id,
                        result: Err(PublishError::Rejected(code)),
                    }));
                }
            }
        }
        join_all(pending.into_iter().map(|p| async move {
            match p {
                Pending::Done(o) => o,
                Pending::InFlight(id, fut) => {
                    let result = match fut.await {
                        Ok(Ok(_)) => Ok(Utc::now()),
                        Ok(Err((e, _))) => Err(PublishError::Delivery(error_code(&e))),
                        Err(_) => Err(PublishError::Cancelled),
                    };
                    RowOutcome { id, result }
                }
            }
        }))
        .await
    }

    async fn enqueue(
        &self,
        row: &EventEnvelope,
    ) -> Result<rdkafka::producer::DeliveryFuture, RDKafkaErrorCode> {
        let topic = self.topic_of(row);
        let headers = row.kafka_headers();
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in &headers {
            owned = owned.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut record = FutureRecord::to(&topic)
            .key(row.aggregate_id.as_bytes())
            .payload(row.payload.as_bytes())
            .headers(owned);
        loop {
            match self.producer.send_result(record) {
                Ok(fut) => return Ok(fut),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                    // The local queue is full: let delivery reports drain it, then retry.
                    record = rec;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(error_code(&e)),
            }
        }
    }

    /// Drops everything queued or in flight (shutdown, producer replacement). Their rows stay
    /// unmarked and are published again.
    pub fn purge(&self) {
        self.producer
            .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        let _ = self
            .producer
            .flush(Timeout::After(Duration::from_millis(100)));
    }
}

enum Pending {
    Done(RowOutcome),
    InFlight(i64, rdkafka::producer::DeliveryFuture),
}

fn error_code(e: &KafkaError) -> RDKafkaErrorCode {
    e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarantees_cannot_be_configured_away() {
        let cfg = producer_config(
            "b:9092",
            &[
                ("enable.idempotence".into(), "false".into()),
                ("acks".into(), "1".into()),
                ("linger.ms".into(), "20".into()),
            ],
        );
        assert_eq!(cfg.get("enable.idempotence"), Some("true"));
        assert_eq!(cfg.get("acks"), Some("all"));
        assert_eq!(
            cfg.get("linger.ms"),
            Some("20"),
            "user settings override defaults"
        );
        assert_eq!(cfg.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(cfg.get("message.timeout.ms"), Some("0"));
    }
}
