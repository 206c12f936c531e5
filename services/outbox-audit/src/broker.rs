//! Reading the broker without changing it: every message of the audited topics from the
//! beginning up to the end offsets taken at the start (partitions assigned by hand, nothing
//! committed), and each consumer group's committed offsets (an OffsetFetch, without joining the
//! group).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// Errors reading the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The client failed (unreachable broker, refused request).
    #[error("broker: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Reading did not reach the end offsets in time.
    #[error(
        "reading the broker did not reach the end of {} partition(s) after {waited:?} \
         ({read} messages read): {}",
        .open.len(),
        describe(.open)
    )]
    Incomplete {
        /// Every partition not read to its end, by topic and partition.
        open: Vec<OpenPartition>,
        /// Messages read meanwhile (of all partitions).
        read: usize,
        /// How long it waited.
        waited: Duration,
    },
}

/// A partition that was not read to its end offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPartition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset to read.
    pub at: i64,
    /// End offset to reach.
    pub end: i64,
}

fn describe(open: &[OpenPartition]) -> String {
    open.iter()
        .map(|p| {
            format!(
                "{}[{}] at offset {} of {}",
                p.topic, p.partition, p.at, p.end
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Upper bound of one fetch answer (librdkafka's `fetch.max.bytes`; at least its
/// `message.max.bytes`, 1 000 000). A broker still answers with at least one whole batch when
/// that is larger (Kafka's rule since KIP-74), so this bounds the answers' size, not what can be
/// read.
pub const FETCH_MAX_BYTES: u32 = 1 << 20;

/// One message as the audit needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key as UTF-8 (lossy).
    pub key: Option<String>,
    /// The `event_id` header, when present.
    pub event_id: Option<String>,
    /// The `event_type` header, when present.
    pub event_type: Option<String>,
    /// The dead-letter headers (`dlq.consumer`, `dlq.source.*`), when present.
    pub dead_letter: Option<DeadLetterSource>,
    /// Broker timestamp in ms, when present.
    pub timestamp_ms: Option<i64>,
}

/// Where a dead letter came from and who sent it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterSource {
    /// The consumer (`dlq.consumer`).
    pub consumer: String,
    /// `dlq.source.topic`.
    pub topic: String,
    /// `dlq.source.partition`.
    pub partition: i32,
    /// `dlq.source.offset`.
    pub offset: i64,
}

/// Read-only access to one broker.
pub struct Broker {
    brokers: String,
    extra: Vec<(String, String)>,
    timeout: Duration,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("brokers", &self.brokers)
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// A reader of `brokers` with extra librdkafka settings.
    pub fn new(brokers: &str, extra: &[(String, String)], timeout: Duration) -> Self {
        Self {
            brokers: brokers.to_owned(),
            extra: extra.to_vec(),
            timeout,
        }
    }

    fn consumer(&self, group: &str) -> Result<BaseConsumer, BrokerError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("enable.metrics.push", "false")
            // What the services' consumers read: the relays' committed transactions only (an
            // aborted send of a fenced relay is no message of the topic).
            .set("isolation.level", "read_committed")
            // Bounded fetches: one answer must arrive within librdkafka's request timeout
            // (`socket.timeout.ms`, 60 s), or librdkafka drops it and asks for the same offsets
            // again, forever. With the default (50 MB) a slow broker or link never answered in
            // time and the read never moved (docs/src/testing.md, "Chaos").
            .set("fetch.max.bytes", FETCH_MAX_BYTES.to_string())
            .set("client.id", "outbox-audit");
        for (k, v) in outbox_consumer::config::connection_settings(&self.extra) {
            cfg.set(k, v);
        }
        Ok(cfg.create()?)
    }

    /// Partition counts of the topics that exist (a topic never created is left out).
    ///
    /// # Errors
    /// When the broker cannot be reached.
    pub fn partitions(&self, topics: &[String]) -> Result<BTreeMap<String, i32>, BrokerError> {
        let c = self.consumer("outbox-audit")?;
        let md = c.fetch_metadata(None, self.timeout)?;
        Ok(md
            .topics()
            .iter()
            .filter(|t| topics.iter().any(|x| x == t.name()) && t.error().is_none())
            .filter(|t| !t.partitions().is_empty())
            .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
            .collect())
    }

    /// The committed offsets of `group` on `partitions` (`(topic, partition) -> next offset`;
    /// a partition with no commit is left out). Joins nothing and commits nothing.
    ///
    /// # Errors
    /// When the broker cannot be reached.
    pub fn committed(
        &self,
        group: &str,
        partitions: &BTreeMap<String, i32>,
    ) -> Result<HashMap<(String, i32), i64>, BrokerError> {
        let c = self.consumer(group)?;
        let mut tpl = TopicPartitionList::new();
        for (t, n) in partitions {
            for p in 0..*n {
                tpl.add_partition(t, p);
            }
        }
        if tpl.count() == 0 {
            return Ok(HashMap::new());
        }
        let got = c.committed_offsets(tpl, self.timeout)?;
        Ok(got
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    /// Every message of `partitions` from the beginning to the end offsets (high watermarks) of
    /// this moment.
    ///
    /// # Errors
    /// When the broker cannot be reached, or a partition is not read to its end in time.
    pub fn read_all(&self, partitions: &BTreeMap<String, i32>) -> Result<Vec<Record>, BrokerError> {
        let c = self.consumer("outbox-audit")?;
        let mut ends: HashMap<(String, i32), (i64, i64)> = HashMap::new();
        let mut tpl = TopicPartitionList::new();
        for (t, n) in partitions {
            for p in 0..*n {
                let (low, high) = c.fetch_watermarks(t, p, self.timeout)?;
                if high > low {
                    ends.insert((t.clone(), p), (low, high));
                    tpl.add_partition_offset(t, p, Offset::Offset(low))?;
                }
            }
        }
        let mut out = Vec::new();
        if ends.is_empty() {
            return Ok(out);
        }
        c.assign(&tpl)?;
        let started = Instant::now();
        // Next offset to read per partition; done when each reached its end.
        let mut next: HashMap<(String, i32), i64> =
            ends.iter().map(|(k, (low, _))| (k.clone(), *low)).collect();
        let mut open = ends.len();
        while open > 0 {
            if started.elapsed() > self.timeout {
                let mut open: Vec<OpenPartition> = next
                    .iter()
                    .filter(|(k, at)| **at < ends[*k].1)
                    .map(|((topic, partition), at)| OpenPartition {
                        topic: topic.clone(),
                        partition: *partition,
                        at: *at,
                        end: ends[&(topic.clone(), *partition)].1,
                    })
                    .collect();
                open.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                return Err(BrokerError::Incomplete {
                    open,
                    read: out.len(),
                    waited: started.elapsed(),
                });
            }
            let Some(m) = c.poll(Duration::from_millis(500)) else {
                // No message: a partition whose last offsets hold no record for us (a
                // transaction marker, a compacted-away record) is done once the consumer's
                // position passed its end.
                for e in c.position()?.elements() {
                    let key = (e.topic().to_owned(), e.partition());
                    if let (Offset::Offset(pos), Some(&(_, end))) = (e.offset(), ends.get(&key)) {
                        let at = next.get_mut(&key).unwrap();
                        if *at < end && pos >= end {
                            *at = pos;
                            open -= 1;
                        }
                    }
                }
                continue;
            };
            let m = m?;
            let key = (m.topic().to_owned(), m.partition());
            let Some(&(_, end)) = ends.get(&key) else {
                continue;
            };
            let at = next.get_mut(&key).unwrap();
            if m.offset() < *at {
                continue;
            }
            let was_open = *at < end;
            *at = m.offset() + 1;
            if was_open && *at >= end {
                open -= 1;
            }
            out.push(record(&m));
        }
        Ok(out)
    }
}

fn record<M: Message>(m: &M) -> Record {
    let mut headers: HashMap<&str, String> = HashMap::new();
    if let Some(h) = m.headers() {
        for i in 0..h.count() {
            let hd = h.get(i);
            if let Some(v) = hd.value {
                headers.insert(hd.key, String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    use outbox_consumer::dlq::{
        DLQ_CONSUMER, DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC,
    };
    let dead_letter = (|| {
        Some(DeadLetterSource {
            consumer: headers.get(DLQ_CONSUMER)?.clone(),
            topic: headers.get(DLQ_SOURCE_TOPIC)?.clone(),
            partition: headers.get(DLQ_SOURCE_PARTITION)?.parse().ok()?,
            offset: headers.get(DLQ_SOURCE_OFFSET)?.parse().ok()?,
        })
    })();
    Record {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        event_id: headers.remove("event_id"),
        event_type: headers.remove("event_type"),
        dead_letter,
        timestamp_ms: m.timestamp().to_millis(),
    }
}
