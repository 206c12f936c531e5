//! Dead letters read back ([`read_dead_letters`]): the dead-letter partitions of a consumer's
//! topics are assigned directly and read from their low to their high watermark in a throw-away
//! group that never commits, keeping the letters whose `dlq.consumer` header names the
//! consumer.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use uuid::Uuid;

use super::error::DlqError;
use crate::config::{
    connection_settings, consumed_topic, dead_letter_topic, redrive_topic, RuntimeConfig,
};
use crate::dlq::{
    DLQ_CONSUMER, DLQ_ERROR, DLQ_REASON, DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC,
};

/// Header a redriven message carries naming the topic its event was first consumed from (the
/// dead letter's `dlq.source.topic`, or the origin a letter dead-lettered again carries on):
/// letters are redriven in the order of their origin ([`DeadLetter::origin`]).
pub const REDRIVE_ORIGIN_TOPIC: &str = "redrive.origin.topic";
/// Partition of [`REDRIVE_ORIGIN_TOPIC`].
pub const REDRIVE_ORIGIN_PARTITION: &str = "redrive.origin.partition";
/// Offset of [`REDRIVE_ORIGIN_TOPIC`].
pub const REDRIVE_ORIGIN_OFFSET: &str = "redrive.origin.offset";

/// How long metadata and watermark requests may take.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long reading the dead-letter topics up to their high watermarks may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// One dead letter as read back from its dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The `event_id` header, when present and a UUID.
    pub event_id: Option<Uuid>,
    /// The `event_type` header.
    pub event_type: Option<String>,
    /// `dlq.consumer`: the consumer that gave up on it.
    pub consumer: String,
    /// `dlq.reason`.
    pub reason: String,
    /// `dlq.error`.
    pub error: String,
    /// `dlq.source.topic`.
    pub source_topic: Option<String>,
    /// `dlq.source.partition`.
    pub source_partition: Option<i32>,
    /// `dlq.source.offset`.
    pub source_offset: Option<i64>,
    /// When it was dead-lettered (the dead letter's timestamp).
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// Where it is: dead-letter topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The original key.
    pub key: Option<Vec<u8>>,
    /// The original value.
    pub payload: Option<Vec<u8>>,
    /// Every header, the `dlq.*` ones included, in message order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl DeadLetter {
    fn from_message(m: &BorrowedMessage<'_>) -> Self {
        let headers: Vec<(String, Option<Vec<u8>>)> = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        // The last occurrence wins: a letter dead-lettered again carries the newest `dlq.*`.
        let text = |name: &str| {
            headers
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        Self {
            event_id: text("event_id").and_then(|s| Uuid::parse_str(s.trim()).ok()),
            event_type: text("event_type"),
            consumer: text(DLQ_CONSUMER).unwrap_or_default(),
            reason: text(DLQ_REASON).unwrap_or_default(),
            error: text(DLQ_ERROR).unwrap_or_default(),
            source_topic: text(DLQ_SOURCE_TOPIC),
            source_partition: text(DLQ_SOURCE_PARTITION).and_then(|s| s.parse().ok()),
            source_offset: text(DLQ_SOURCE_OFFSET).and_then(|s| s.parse().ok()),
            dead_lettered_at: m
                .timestamp()
                .to_millis()
                .and_then(DateTime::from_timestamp_millis),
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The headers to send it back with: the original ones, without `dlq.*` and
    /// `redrive.origin.*` (the redrive adds [`DeadLetter::origin`] again).
    pub fn original_headers(&self) -> impl Iterator<Item = &(String, Option<Vec<u8>>)> {
        self.headers
            .iter()
            .filter(|(k, _)| !k.starts_with("dlq.") && !k.starts_with("redrive.origin."))
    }

    /// Where its event was first consumed from: topic, partition, offset. A letter of a
    /// redriven message (dead-lettered again from a redrive topic) carries the origin of the
    /// letter that was redriven (`redrive.origin.*`); any other letter's origin is its
    /// `dlq.source.*`. The letters of one aggregate (one key, one partition) are ordered by it.
    pub fn origin(&self) -> Option<(String, i32, i64)> {
        let text = |name: &str| {
            self.headers
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        match (
            text(REDRIVE_ORIGIN_TOPIC),
            text(REDRIVE_ORIGIN_PARTITION).and_then(|p| p.parse().ok()),
            text(REDRIVE_ORIGIN_OFFSET).and_then(|o| o.parse().ok()),
        ) {
            (Some(topic), Some(partition), Some(offset)) => Some((topic, partition, offset)),
            _ => Some((
                self.source_topic.clone()?,
                self.source_partition?,
                self.source_offset?,
            )),
        }
    }

    /// Where `dlq redrive` sends it: the redrive topic of `config`'s consumer for the topic it
    /// was consumed from (`None` without a `dlq.source.topic` header).
    pub fn redrive_topic(&self, config: &RuntimeConfig) -> Option<String> {
        self.source_topic.as_deref().map(|source| {
            redrive_topic(
                consumed_topic(source, &config.topics, &config.consumer_name),
                &config.consumer_name,
            )
        })
    }

    /// The letter for `dlq list --json` (no payload), with where `dlq redrive` sends it.
    pub fn to_json(&self, config: &RuntimeConfig) -> serde_json::Value {
        serde_json::json!({
            "event_id": self.event_id,
            "event_type": self.event_type,
            "key": self.key.as_deref().map(String::from_utf8_lossy),
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "reason": self.reason,
            "error": self.error,
            "dead_lettered_at": self.dead_lettered_at.map(|t| t.to_rfc3339()),
            "dlq_topic": self.topic,
            "dlq_partition": self.partition,
            "dlq_offset": self.offset,
            "redrive_topic": self.redrive_topic(config),
        })
    }
}

/// Reads every dead letter of `config.consumer_name` from the dead-letter topics of
/// `config.topics`, up to their high watermarks at the time of the call, in a throw-away group
/// that never commits. A dead-letter topic that does not exist has no letters. Blocking: call it
/// from `spawn_blocking` in async code.
///
/// # Errors
/// [`DlqError::Kafka`] when the broker cannot be reached, [`DlqError::ReadTimeout`] when a
/// partition is not read to its end in time.
pub fn read_dead_letters(config: &RuntimeConfig) -> Result<Vec<DeadLetter>, DlqError> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &config.brokers);
    // Assigned partitions need a group id, never used to commit: the group is not joined.
    cfg.set(
        "group.id",
        format!(
            "{}-dlq-reader-{:08x}",
            config.group_id,
            rand::random::<u32>()
        ),
    );
    cfg.set("client.id", format!("{}-dlq-reader", config.consumer_name));
    cfg.set("enable.auto.commit", "false");
    cfg.set("enable.auto.offset.store", "false");
    cfg.set("enable.partition.eof", "false");
    cfg.set("enable.metrics.push", "false");
    for (k, v) in connection_settings(&config.client_config) {
        cfg.set(k, v);
    }
    let consumer: BaseConsumer = cfg.create()?;
    let mut assignment = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for topic in config.topics.iter().map(|t| dead_letter_topic(t)) {
        let metadata = consumer.fetch_metadata(Some(&topic), REQUEST_TIMEOUT)?;
        for t in metadata.topics().iter().filter(|t| t.error().is_none()) {
            for p in t.partitions() {
                let (low, high) = consumer.fetch_watermarks(&topic, p.id(), REQUEST_TIMEOUT)?;
                if high > low {
                    assignment.add_partition_offset(&topic, p.id(), Offset::Offset(low))?;
                    ends.insert((topic.clone(), p.id()), high);
                }
            }
        }
    }
    let mut letters = vec![];
    if ends.is_empty() {
        return Ok(letters);
    }
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + READ_TIMEOUT;
    while !ends.is_empty() {
        if Instant::now() >= deadline {
            let ((topic, partition), high_watermark) = ends.into_iter().next().unwrap_or_default();
            return Err(DlqError::ReadTimeout {
                topic,
                partition,
                high_watermark,
            });
        }
        let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = polled?;
        let key = (m.topic().to_owned(), m.partition());
        let Some(&high) = ends.get(&key) else {
            continue;
        };
        if m.offset() < high {
            let letter = DeadLetter::from_message(&m);
            if letter.consumer == config.consumer_name {
                letters.push(letter);
            }
        }
        if m.offset() >= high - 1 {
            ends.remove(&key);
        }
    }
    Ok(letters)
}
