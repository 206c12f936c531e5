//! Bucket records: what each Kafka transaction published, written in the transaction itself,
//! so that a relay taking a bucket over (or one that does not know whether its own commit went
//! through) marks those rows instead of sending them again.
//!
//! With transactions on, every transaction of a bucket's producer ends with one record in the
//! relay's compacted records topic (`<topic prefix>outbox-relay.records` unless
//! `--records-topic` names another), keyed by the producer's `transactional.id`, whose value
//! lists exactly the outbox ids the producer committed since the bucket's rows were last
//! marked ([`Ids`]: runs of consecutive ids). It commits or aborts with the events. A bucket's
//! owner begins a transaction only after the rows of its previous one are marked, so at most
//! the last committed record of each key has unmarked rows; the mark also stores the record's
//! offset in the bucket's lease row.
//!
//! **Settling** ([`read_last`]): after initialising the bucket's producers under its lease
//! (which completes or aborts every transaction of their ids), the relay reads the bucket's
//! record partition `read_committed` from the stored offset to the end, and marks the ids of
//! the last record of each of its keys: rows already gone delete nothing.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

/// The records topic's default name, after the topic prefix.
pub const DEFAULT_TOPIC: &str = "outbox-relay.records";

/// Fewest partitions the relay creates the records topic with (one per bucket when there are
/// more buckets): buckets sharing a partition wait for each other's open transactions when
/// they settle.
pub const MIN_PARTITIONS: i32 = 8;

/// Where a producer writes its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSink {
    /// The records topic.
    pub topic: String,
    /// The bucket's partition of it.
    pub partition: i32,
    /// The producer's `transactional.id`.
    pub key: String,
}

/// The partition of the records topic (with `partitions` partitions) that `bucket` uses.
pub fn partition_of(bucket: i16, partitions: i32) -> i32 {
    i32::from(bucket).rem_euclid(partitions.max(1))
}

/// A record's value: the outbox ids a producer committed since the bucket was last marked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ids {
    /// Inclusive runs `[first, last]` of consecutive ids, ascending.
    pub runs: Vec<(i64, i64)>,
}

impl Ids {
    /// The runs of `ids` (any order, duplicates allowed).
    pub fn of(ids: &[i64]) -> Self {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut runs: Vec<(i64, i64)> = Vec::new();
        for id in sorted {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == id => *last = id,
                _ => runs.push((id, id)),
            }
        }
        Self { runs }
    }

    /// Every id, ascending.
    pub fn ids(&self) -> Vec<i64> {
        self.runs.iter().flat_map(|&(a, b)| a..=b).collect()
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A record's bytes; `None` for a value that is not one (written by something else).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The record reader's client context: librdkafka's lines as the relay logs them, and the end
/// of the partition (which the reader asks to be told about) not an error.
struct ReaderContext;

impl ClientContext for ReaderContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        outbox_kafka::log_librdkafka!(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_))
            && error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF)
        {
            tracing::warn!(error = %error, reason, "Kafka client error reading the bucket records");
        }
    }
}

impl ConsumerContext for ReaderContext {}

/// What [`read_last`] found.
#[derive(Debug, Default)]
pub struct LastRecords {
    /// The ids of the last committed record of each key.
    pub ids: Vec<i64>,
    /// The partition's end (the offset after its last decided record) when read.
    pub end: i64,
}

/// Reads `partition` of `topic` `read_committed`, from `after + 1` (from its start when
/// `None`), to the offset its end had when called, and returns the ids of the last record of
/// each of `keys`. Waits until every transaction below that end is decided (another bucket's
/// open transaction on the same partition holds the reader back), at most `deadline`.
///
/// Blocking: call it from a blocking task.
///
/// # Errors
/// The broker did not answer, or the partition's transactions stayed open past `deadline`.
pub fn read_last(
    brokers: &str,
    extra: &[(String, String)],
    (topic, partition): (&str, i32),
    after: Option<i64>,
    keys: &[String],
    deadline: Duration,
) -> Result<LastRecords, KafkaError> {
    let started = std::time::Instant::now();
    let left = || deadline.saturating_sub(started.elapsed());
    let client = |isolation: &str| -> Result<BaseConsumer<ReaderContext>, KafkaError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", brokers);
        cfg.set("enable.metrics.push", "false");
        for (k, v) in outbox_kafka::connection_settings(extra) {
            cfg.set(k, v);
        }
        cfg.set("group.id", "outbox-relay-settle")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", isolation);
        cfg.create_with_context(ReaderContext)
    };
    // The end of the log, transactions open or not; then wait until the committed reader's
    // end (the last stable offset) reaches it.
    let (_, end) = client("read_uncommitted")?.fetch_watermarks(topic, partition, left())?;
    let reader = client("read_committed")?;
    let start = after.map_or(0, |a| a + 1);
    if start >= end {
        return Ok(LastRecords {
            ids: Vec::new(),
            end,
        });
    }
    loop {
        let (_, stable) = reader.fetch_watermarks(topic, partition, left())?;
        if stable >= end {
            break;
        }
        if left().is_zero() {
            return Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::OperationTimedOut,
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(start))?;
    reader.assign(&tpl)?;
    let mut last: HashMap<&str, Vec<i64>> = HashMap::new();
    loop {
        if left().is_zero() {
            return Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::OperationTimedOut,
            ));
        }
        match reader.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => return Err(e),
            Some(Ok(m)) => {
                let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
                if let Some(key) = keys.iter().find(|k| Some(k.as_str()) == key) {
                    let ids = m.payload().and_then(Ids::decode).unwrap_or_default();
                    last.insert(key.as_str(), ids.ids());
                }
                if m.offset() + 1 >= end {
                    break;
                }
            }
        }
    }
    let mut ids: Vec<i64> = last.into_values().flatten().collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(LastRecords { ids, end })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_kept_exactly_as_runs() {
        let ids = Ids::of(&[7, 3, 4, 5, 9, 10, 4]);
        assert_eq!(ids.runs, vec![(3, 5), (7, 7), (9, 10)]);
        assert_eq!(ids.ids(), vec![3, 4, 5, 7, 9, 10]);
        assert_eq!(Ids::decode(&ids.encode()), Some(ids));
        assert_eq!(Ids::decode(b"not a record"), None);
        assert_eq!(Ids::of(&[]).ids(), Vec::<i64>::new());
    }

    #[test]
    fn buckets_beyond_the_partitions_share_them() {
        assert_eq!(partition_of(3, 8), 3);
        assert_eq!(partition_of(9, 8), 1);
        assert_eq!(partition_of(0, 0), 0);
    }
}
