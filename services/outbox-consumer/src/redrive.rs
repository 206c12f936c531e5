//! Dead letters read back, and sent again: [`read_dead_letters`] reads a consumer's letters from
//! the `<topic>.dlq` topics of the topics it consumes, [`redrive`] produces them to that
//! consumer's redrive topic (`<topic>.<consumer>.redrive`).
//!
//! Reading assigns the dead-letter partitions directly and reads each from its low to its high
//! watermark, in a throw-away group that never commits: no consumer group that matters moves.
//! A dead-letter topic is shared by every consumer of its source topic; only the letters whose
//! `dlq.consumer` header names this consumer are its own.
//!
//! A redriven message is the original one: key, value and headers (the `event_id` header
//! included) without the `dlq.*` headers, through an idempotent producer that waits for every
//! replica's ack. It goes to the redrive topic of the consumer that dead-lettered it, not to the
//! shared source topic: only that consumer subscribes to it, so the other consumer groups of the
//! source topic never see the event again (the alternatives: a header naming the target
//! consumer on the source topic still makes every group read, and skip, it, and consumers that
//! do not know the header apply it again; applying straight from the `.dlq` topic cannot tell a
//! letter an operator redrove from one still waiting for a fix). It is partitioned by its key,
//! so the redriven events of one aggregate stay in order among themselves; with respect to the
//! source topic it is applied whenever it arrives, like any redrive: after the aggregate's
//! events that were applied meanwhile. The inbox turns it into a duplicate if the consumer
//! applied it already, so a redrive is safe to repeat. Kafka topics are append-only: a redriven
//! letter stays listed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use uuid::Uuid;

use super::config::{
    connection_settings, consumed_topic, dead_letter_producer_config, dead_letter_topic,
    redrive_topic,
};
use super::dlq::{
    DLQ_CONSUMER, DLQ_ERROR, DLQ_REASON, DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC,
};
use super::RuntimeConfig;

/// How long metadata and watermark requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long reading the dead-letter topics up to their high watermarks may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a redriven message may wait for the broker's acknowledgement.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a dead-letter command failed.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// The broker could not be reached or refused a request.
    #[error("Kafka error")]
    Kafka(#[from] KafkaError),
    /// A dead-letter partition was not read up to its high watermark in time.
    #[error("timed out reading {topic} partition {partition} up to offset {high_watermark}")]
    ReadTimeout {
        /// Dead-letter topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset the read had to reach.
        high_watermark: i64,
    },
    /// No dead letter of this consumer carries the event id asked for.
    #[error("no dead letter of consumer `{consumer}` has event id {event_id}")]
    UnknownEventId {
        /// The consumer.
        consumer: String,
        /// The event id asked for.
        event_id: Uuid,
    },
    /// Writing the command's output failed.
    #[error("could not write the output")]
    Output(#[source] std::io::Error),
    /// The consumer's redrive topic does not exist; nothing was sent.
    #[error(
        "redrive topic {topic} does not exist: create it (the consumer does at start-up with \
         --create-missing-topics) and restart the consumer, so that it subscribes to it"
    )]
    NoRedriveTopic {
        /// The missing topic.
        topic: String,
    },
    /// A dead letter without the header naming where to send it back.
    #[error("dead letter {topic}/{partition}@{offset} has no `dlq.source.topic` header")]
    NoSourceTopic {
        /// Dead-letter topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
    },
}

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

    /// The headers to send it back with: the original ones, without `dlq.*`.
    pub fn original_headers(&self) -> impl Iterator<Item = &(String, Option<Vec<u8>>)> {
        self.headers.iter().filter(|(k, _)| !k.starts_with("dlq."))
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

/// Which dead letters `redrive` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The newest letter of one event.
    EventId(Uuid),
    /// The newest letter of every event; letters without an event id are skipped (no consumer
    /// can apply them).
    All,
}

/// The letters to redrive out of `letters` (in reading order): the newest one per event id.
///
/// # Errors
/// [`DlqError::UnknownEventId`] when an event id is asked for that no letter has.
pub fn select(
    letters: Vec<DeadLetter>,
    selection: Selection,
    consumer: &str,
) -> Result<Vec<DeadLetter>, DlqError> {
    let mut newest: Vec<DeadLetter> = vec![];
    for letter in letters.into_iter().filter(|l| l.event_id.is_some()) {
        match newest.iter_mut().find(|l| l.event_id == letter.event_id) {
            Some(older) => *older = letter,
            None => newest.push(letter),
        }
    }
    match selection {
        Selection::All => Ok(newest),
        Selection::EventId(id) => {
            newest.retain(|l| l.event_id == Some(id));
            if newest.is_empty() {
                Err(DlqError::UnknownEventId {
                    consumer: consumer.to_owned(),
                    event_id: id,
                })
            } else {
                Ok(newest)
            }
        }
    }
}

/// Where a redriven message landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// The event.
    pub event_id: Option<Uuid>,
    /// The consumer's redrive topic it was sent to.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// Sends each of `letters` to `config`'s consumer's redrive topic of the topic it was consumed
/// from ([`DeadLetter::redrive_topic`]), with its original key, value and headers, partitioned
/// by key, through an idempotent producer, waiting for each acknowledgement in turn. Checks
/// first that every redrive topic needed exists.
///
/// # Errors
/// [`DlqError::NoSourceTopic`] for a letter that does not say where it came from and
/// [`DlqError::NoRedriveTopic`] for a redrive topic the broker does not have (nothing is sent
/// then), [`DlqError::Kafka`] when the broker did not acknowledge a message.
pub async fn redrive(
    config: &RuntimeConfig,
    letters: &[DeadLetter],
) -> Result<Vec<Redriven>, DlqError> {
    let mut targets = Vec::with_capacity(letters.len());
    for letter in letters {
        let Some(topic) = letter.redrive_topic(config) else {
            return Err(DlqError::NoSourceTopic {
                topic: letter.topic.clone(),
                partition: letter.partition,
                offset: letter.offset,
            });
        };
        targets.push(topic);
    }
    let mut cfg = dead_letter_producer_config(config);
    cfg.set("client.id", format!("{}-redrive", config.consumer_name));
    let producer: FutureProducer = cfg.create()?;
    let mut distinct = targets.clone();
    distinct.sort();
    distinct.dedup();
    let checker = producer.clone();
    match tokio::task::spawn_blocking(move || missing_topic(&checker, &distinct)).await {
        Ok(Ok(None)) => {}
        Ok(Ok(Some(topic))) => return Err(DlqError::NoRedriveTopic { topic }),
        Ok(Err(e)) => return Err(e.into()),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
    let mut sent = vec![];
    for (letter, topic) in letters.iter().zip(&targets) {
        let mut headers = OwnedHeaders::new();
        for (k, v) in letter.original_headers() {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(k) = letter.key.as_deref() {
            record = record.key(k);
        }
        if let Some(v) = letter.payload.as_deref() {
            record = record.payload(v);
        }
        let delivery = producer
            .send(record, Timeout::After(SEND_TIMEOUT))
            .await
            .map_err(|(e, _)| e)?;
        let (partition, offset) = (delivery.partition, delivery.offset);
        tracing::info!(
            event.id = ?letter.event_id,
            kafka.topic = %topic,
            kafka.partition = partition,
            kafka.offset = offset,
            "Redrove a dead letter to its consumer's redrive topic"
        );
        sent.push(Redriven {
            event_id: letter.event_id,
            topic: topic.clone(),
            partition,
            offset,
        });
    }
    Ok(sent)
}

/// The first of `topics` the broker does not list (with partitions), if any. Blocking.
fn missing_topic(
    producer: &FutureProducer,
    topics: &[String],
) -> Result<Option<String>, KafkaError> {
    for topic in topics {
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Ok(Some(topic.clone()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetryPolicy;

    fn letter(event_id: Option<Uuid>, offset: i64) -> DeadLetter {
        DeadLetter {
            event_id,
            event_type: Some("OrderPaid".into()),
            consumer: "stock".into(),
            reason: "unapplicable".into(),
            error: "e".into(),
            source_topic: Some("t".into()),
            source_partition: Some(0),
            source_offset: Some(offset),
            dead_lettered_at: None,
            topic: "t.dlq".into(),
            partition: 0,
            offset,
            key: Some(b"k".to_vec()),
            payload: None,
            headers: vec![
                (
                    "event_id".into(),
                    event_id.map(|i| i.to_string().into_bytes()),
                ),
                (DLQ_REASON.into(), Some(b"unapplicable".to_vec())),
                ("traceparent".into(), Some(b"00-1".to_vec())),
            ],
        }
    }

    #[test]
    fn redrive_picks_the_newest_letter_per_event_and_refuses_unknown_ids() {
        let a = Uuid::new_v4();
        let b = Uuid::new_v4();
        let letters = vec![
            letter(Some(a), 1),
            letter(None, 2),
            letter(Some(b), 3),
            letter(Some(a), 4),
        ];
        let all = select(letters.clone(), Selection::All, "stock").unwrap();
        let picked: Vec<(Option<Uuid>, i64)> = all.iter().map(|l| (l.event_id, l.offset)).collect();
        assert_eq!(
            picked,
            [(Some(a), 4), (Some(b), 3)],
            "newest per event, none without id"
        );
        let one = select(letters.clone(), Selection::EventId(b), "stock").unwrap();
        assert_eq!(one.len(), 1);
        let unknown = Uuid::new_v4();
        let err = select(letters, Selection::EventId(unknown), "stock").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("no dead letter of consumer `stock` has event id {unknown}")
        );
    }

    #[test]
    fn letters_go_back_to_the_redrive_topic_of_their_consumer_only() {
        let config = RuntimeConfig {
            consumer_name: "stock".into(),
            brokers: "b:9092".into(),
            group_id: "g".into(),
            topics: vec!["t".into()],
            client_config: vec![].into(),
            create_topics: None,
            retry: RetryPolicy::default(),
            max_attempts_deterministic: 1,
            shutdown_timeout: Duration::from_secs(1),
            queue_capacity: 1,
            inbox_retention: None,
            purge: Default::default(),
        };
        let mut l = letter(Some(Uuid::new_v4()), 1);
        assert_eq!(l.redrive_topic(&config).as_deref(), Some("t.stock.redrive"));
        // Read from the redrive topic and dead-lettered again: back to the same redrive topic.
        l.source_topic = Some("t.stock.redrive".into());
        assert_eq!(l.redrive_topic(&config).as_deref(), Some("t.stock.redrive"));
        assert_eq!(l.to_json(&config)["redrive_topic"], "t.stock.redrive");
        l.source_topic = None;
        assert_eq!(l.redrive_topic(&config), None);
    }

    #[test]
    fn redriven_messages_keep_their_headers_but_not_the_dead_letter_ones() {
        let l = letter(Some(Uuid::new_v4()), 1);
        let names: Vec<&str> = l.original_headers().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["event_id", "traceparent"]);
    }
}
