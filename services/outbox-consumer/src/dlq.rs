//! The dead-letter topic: where a message goes that can never be applied, so that the
//! messages behind it are. `<topic>.dlq` gets the message unchanged (key, value, headers) plus
//! headers saying why and where it came from; operators can fix and re-produce it from there.
//! A message read from the consumer's redrive topic (`<topic>.<consumer>.redrive`) that fails
//! again goes to `<topic>.dlq` too, its `dlq.source.*` naming the redrive topic it was read from.

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use tokio::sync::oneshot;

use outbox_kafka::PolledProducer;

use super::config::{
    consumed_topic, dead_letter_producer_config, dead_letter_topic, RuntimeConfig,
};
use super::event::{RawMessage, Rejection};

/// Header with the human-readable error.
pub const DLQ_ERROR: &str = "dlq.error";
/// Header with the machine-readable reason ([`Rejection::reason`]).
pub const DLQ_REASON: &str = "dlq.reason";
/// Header naming the consumer that gave up on the message.
pub const DLQ_CONSUMER: &str = "dlq.consumer";
/// Header with the source topic.
pub const DLQ_SOURCE_TOPIC: &str = "dlq.source.topic";
/// Header with the source partition.
pub const DLQ_SOURCE_PARTITION: &str = "dlq.source.partition";
/// Header with the source offset.
pub const DLQ_SOURCE_OFFSET: &str = "dlq.source.offset";

/// librdkafka callbacks of the dead-letter producer: its chatter (connection attempts, the
/// idempotent producer's id requests) goes to debug level; failures reach the caller through
/// [`DeadLetters::send`], each message's outcome through the channel it was sent with.
struct ProducerContext;

/// Where a dead letter's delivery report goes.
type Delivered = oneshot::Sender<Result<(), KafkaError>>;

impl rdkafka::producer::ProducerContext for ProducerContext {
    type DeliveryOpaque = Box<Delivered>;

    fn delivery(&self, result: &DeliveryResult<'_>, delivered: Box<Delivered>) {
        // The sender gave up waiting only if its task was dropped: nobody to tell.
        let _ = delivered.send(result.as_ref().map(|_| ()).map_err(|(e, _)| e.clone()));
    }
}

impl ClientContext for ProducerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        outbox_kafka::log_librdkafka!(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, reason, "Dead-letter producer error");
    }
}

/// Sends rejected messages to their dead-letter topics.
pub struct DeadLetters {
    /// Not rdkafka's `FutureProducer`: its polling thread busy-loops ~1 % of a core, idle or
    /// not ([`PolledProducer`] sleeps until an event arrives).
    producer: PolledProducer<ProducerContext>,
    consumer_name: String,
    /// The consumed topics (a redrive topic's letters go to its consumed topic's `.dlq`).
    topics: Vec<String>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters")
            .field("consumer_name", &self.consumer_name)
            .finish()
    }
}

/// The headers of a dead letter: the original ones, then the `dlq.*` ones.
pub fn dead_letter_headers(
    msg: &RawMessage,
    rejection: &Rejection,
    consumer_name: &str,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut headers = msg.headers.clone();
    let mut add = |k: &str, v: String| headers.push((k.to_owned(), Some(v.into_bytes())));
    add(DLQ_ERROR, rejection.to_string());
    add(DLQ_REASON, rejection.reason().to_owned());
    add(DLQ_CONSUMER, consumer_name.to_owned());
    add(DLQ_SOURCE_TOPIC, msg.topic.clone());
    add(DLQ_SOURCE_PARTITION, msg.partition.to_string());
    add(DLQ_SOURCE_OFFSET, msg.offset.to_string());
    headers
}

impl DeadLetters {
    /// Creates the producer (it connects on first use).
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn new(config: &RuntimeConfig) -> Result<Self, KafkaError> {
        Ok(Self {
            producer: PolledProducer::create(
                &dead_letter_producer_config(config),
                ProducerContext,
                "dead-letters",
            )?,
            consumer_name: config.consumer_name.clone(),
            topics: config.topics.clone(),
        })
    }

    /// Produces `msg` to the dead-letter topic of its consumed topic and waits for the broker's acknowledgement.
    ///
    /// # Errors
    /// When the producer refused it (e.g. its queue is full) or the broker did not acknowledge
    /// it (the caller retries; the offset stays).
    pub async fn send(&self, msg: &RawMessage, rejection: &Rejection) -> Result<(), KafkaError> {
        let topic = dead_letter_topic(consumed_topic(
            &msg.topic,
            &self.topics,
            &self.consumer_name,
        ));
        let mut headers = OwnedHeaders::new();
        for (k, v) in dead_letter_headers(msg, rejection, &self.consumer_name) {
            headers = headers.insert(Header {
                key: &k,
                value: v.as_deref(),
            });
        }
        let (delivered, report) = oneshot::channel();
        let mut record: BaseRecord<'_, [u8], [u8], Box<Delivered>> =
            BaseRecord::with_opaque_to(&topic, Box::new(delivered)).headers(headers);
        if let Some(k) = msg.key.as_deref() {
            record = record.key(k);
        }
        if let Some(p) = msg.payload.as_deref() {
            record = record.payload(p);
        }
        self.producer.send(record).map_err(|(e, _)| e)?;
        // librdkafka reports every message it took, within `message.timeout.ms`.
        report.await.map_err(|_| KafkaError::Canceled)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letters_keep_the_message_and_say_why() {
        let msg = RawMessage {
            topic: "outbox.event.order".into(),
            partition: 1,
            offset: 17,
            key: Some(b"k".to_vec()),
            payload: Some(b"garbage".to_vec()),
            headers: vec![("event_type".into(), Some(b"OrderPaid".to_vec()))],
        };
        let h = dead_letter_headers(&msg, &Rejection::MissingHeader("event_id"), "stock");
        let get = |k: &str| {
            h.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.clone())
                .map(|v| String::from_utf8(v).unwrap())
        };
        assert_eq!(get("event_type").as_deref(), Some("OrderPaid"));
        assert_eq!(get(DLQ_ERROR).as_deref(), Some("missing header `event_id`"));
        assert_eq!(get(DLQ_REASON).as_deref(), Some("missing_header"));
        assert_eq!(get(DLQ_CONSUMER).as_deref(), Some("stock"));
        assert_eq!(get(DLQ_SOURCE_TOPIC).as_deref(), Some("outbox.event.order"));
        assert_eq!(get(DLQ_SOURCE_PARTITION).as_deref(), Some("1"));
        assert_eq!(get(DLQ_SOURCE_OFFSET).as_deref(), Some("17"));
    }
}
