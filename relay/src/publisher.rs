//! Publishing a batch of outbox rows to Kafka with an idempotent producer.
//!
//! All messages of a batch are handed to librdkafka at once (pipelined), in `id` order, keyed
//! by the row's `message_key` or else its aggregate id; the idempotent producer keeps their
//! order per partition. Each row's outcome comes from its own delivery report: only a report
//! that says "persisted" counts.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_kit::kafka::PolledProducer;
use outbox_kit::trace::{Attribute, ProducerSpan, TraceContext};
use outbox_kit::{EventEnvelope, HeaderOptions};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::util::Timeout;

use crate::decide::Outcome;
use crate::failure::{classify_delivery, classify_refusal, Scope};
use crate::kafka_context::{BatchReports, BrokerGauge, RelayContext, Report};

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

/// Settings the relay's guarantees depend on (shared DESIGN.md, guarantee 6), with the reason
/// an override is refused at start-up.
pub const PROTECTED_SETTINGS: [(&str, &str); 15] = [
    ("enable.idempotence", "the idempotent producer keeps each partition in order across retries and writes no duplicates of its own"),
    ("acks", "an event counts as published only once every in-sync replica has it (acks=all)"),
    ("request.required.acks", "an event counts as published only once every in-sync replica has it (acks=all)"),
    ("message.timeout.ms", "a finite delivery timeout lets a later event of a key overtake an earlier one that timed out while queued"),
    ("delivery.timeout.ms", "a finite delivery timeout lets a later event of a key overtake an earlier one that timed out while queued"),
    ("partitioner", "events of one aggregate must land on one partition, placed like the Java client does (murmur2_random)"),
    ("max.in.flight.requests.per.connection", "the idempotent producer keeps order only with at most 5 requests in flight; librdkafka sets it"),
    ("max.in.flight", "the idempotent producer keeps order only with at most 5 requests in flight; librdkafka sets it"),
    ("enable.gapless.guarantee", "a batch the broker refuses must stop the producer instead of letting later events of its partition through"),
    ("retries", "librdkafka must retry until the broker takes the event"),
    ("message.send.max.retries", "librdkafka must retry until the broker takes the event"),
    ("transactional.id", "the relay does not use Kafka transactions; consumers dedupe on event_id"),
    ("bootstrap.servers", "set the brokers with --kafka-brokers / KAFKA_BROKERS"),
    ("metadata.broker.list", "set the brokers with --kafka-brokers / KAFKA_BROKERS"),
    ("queue.buffering.backpressure.threshold", "the relay bounds what is in flight by its batch size"),
];

/// Refuses `--kafka-config` settings the relay's guarantees depend on.
///
/// # Errors
/// A message naming the first refused setting and why it cannot be changed.
pub fn check_overrides(extra: &[(String, String)]) -> Result<(), String> {
    for (k, v) in extra {
        let key = k.trim();
        if let Some((_, why)) = PROTECTED_SETTINGS.iter().find(|(p, _)| *p == key) {
            return Err(format!(
                "--kafka-config {key}={v} is refused: {why}. The relay sets `{key}` itself."
            ));
        }
    }
    Ok(())
}

/// One row of a batch as handed to [`Publisher::publish`].
#[derive(Debug, Clone, Copy)]
pub enum Send<'a> {
    /// Send this message to this topic.
    Message(&'a EventEnvelope, &'a str),
    /// Do not send; the outcome of the row of this aggregate (type, id) is already known.
    Known((&'a str, &'a str), &'a Outcome),
}

/// What the relay adds to every message beyond the contract (shared DESIGN.md, "On the
/// broker").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireSettings {
    /// CloudEvents attributes (Kafka protocol binding, binary mode) with this `ce_source`; off
    /// when `None`.
    pub cloudevents_source: Option<String>,
}

/// The Kafka side of the relay.
pub struct Publisher {
    producer: PolledProducer<RelayContext>,
    context: RelayContext,
    generation: std::sync::atomic::AtomicU32,
    brokers: String,
    extra: Vec<(String, String)>,
    topic_prefix: String,
    broker_down: Option<BrokerGauge>,
    wire: WireSettings,
    /// Spans are exported: each message with a writer's `traceparent` gets a PRODUCER span.
    spans: bool,
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
    for (k, v) in FORCED_SETTINGS {
        cfg.set(k, v);
    }
    cfg
}

/// Set after the user's settings, whatever they say ([`check_overrides`] refuses them first).
/// `enable.gapless.guarantee`: when the broker refuses a record batch, librdkafka would
/// otherwise bump the idempotent epoch and resend the partition's later batches, so a later
/// event of an aggregate would land before the refused one is sent again. With it the
/// producer stops instead (a fatal error; the broker's sequence check refuses the later
/// batches already in flight), and the relay replaces the producer and resends from the table.
pub const FORCED_SETTINGS: [(&str, &str); 5] = [
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("enable.gapless.guarantee", "true"),
    ("message.timeout.ms", "0"),
    ("partitioner", "murmur2_random"),
];

/// A producer of [`producer_config`] whose delivery reports go to `context`.
fn new_producer(
    brokers: &str,
    extra: &[(String, String)],
    context: &RelayContext,
) -> Result<PolledProducer<RelayContext>, KafkaError> {
    PolledProducer::create(
        &producer_config(brokers, extra),
        context.clone(),
        "relay-producer",
    )
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
        Self::reporting(brokers, extra, topic_prefix, None)
    }

    /// [`Publisher::new`] that keeps `broker_down` at 1 while librdkafka reports every broker
    /// unreachable, and at 0 otherwise (also across [`Publisher::replace`]); only between
    /// [`Publisher::set_leading`] `true` and `false`.
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn reporting(
        brokers: &str,
        extra: &[(String, String)],
        topic_prefix: &str,
        broker_down: Option<prometheus::IntGauge>,
    ) -> Result<Self, KafkaError> {
        let broker_down = broker_down.map(BrokerGauge::new);
        let context = RelayContext::reporting_on(broker_down.clone(), false);
        let producer = new_producer(brokers, extra, &context)?;
        Ok(Self {
            producer,
            context,
            generation: Default::default(),
            brokers: brokers.to_owned(),
            extra: extra.to_vec(),
            topic_prefix: topic_prefix.to_owned(),
            broker_down,
            wire: WireSettings::default(),
            spans: outbox_kit::trace::exporting(),
        })
    }

    /// The publisher with these additions to every message.
    #[must_use]
    pub fn with_wire(mut self, wire: WireSettings) -> Self {
        self.wire = wire;
        self
    }

    /// Drops everything queued or in flight and starts a new producer session (after a fatal
    /// error, or when the lease changed hands). The dropped rows stay unmarked and are sent
    /// again.
    ///
    /// # Errors
    /// Invalid librdkafka settings (they were valid when the first producer was made).
    pub fn replace(&mut self) -> Result<(), KafkaError> {
        self.purge();
        let context =
            RelayContext::reporting_on(self.broker_down.clone(), self.context.broker_down());
        let producer = new_producer(&self.brokers, &self.extra, &context)?;
        // The old producer is torn down as it is dropped; its errors are not the new one's.
        self.context.retire();
        self.producer = producer;
        self.context = context;
        Ok(())
    }

    /// The topic of a row.
    pub fn topic_of(&self, row: &EventEnvelope) -> String {
        row.topic(&self.topic_prefix)
    }

    /// Whether this relay leads (reports the broker state on its gauge) or stands by.
    pub fn set_leading(&self, leading: bool) {
        self.context.set_leading(leading);
    }

    /// The producer's client context (broker state).
    pub fn context(&self) -> &RelayContext {
        &self.context
    }

    /// The underlying producer, for metadata queries.
    pub fn producer(&self) -> &PolledProducer<RelayContext> {
        &self.producer
    }

    /// True once librdkafka raised a fatal error; the producer must be replaced.
    pub fn is_fatal(&self) -> bool {
        self.producer.client().fatal_error().is_some()
    }

    /// Sends every [`Send::Message`] (in order, pipelined) and waits for all delivery reports.
    ///
    /// A message librdkafka refuses synchronously, or a [`Send::Known`] failure, stops the
    /// later rows of its aggregate in this call: they are not sent at all
    /// ([`Outcome::BlockedBehindFailure`]). `alone` says the caller sends a single message
    /// with nothing else in flight (see [`crate::decide`]). Outcomes are in the order of
    /// `rows`.
    pub async fn publish(&self, rows: &[Send<'_>], alone: bool) -> Vec<Outcome> {
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let batch = Arc::new(BatchReports::new(generation, rows.len()));
        self.context.start_batch(batch.clone());
        let mut stopped: HashSet<(&str, &str)> = HashSet::new();
        let mut known: Vec<Option<Outcome>> = Vec::with_capacity(rows.len());
        // With spans exported: each message's PRODUCER span, by row (none without a writer's
        // trace); without, nothing is allocated.
        let mut spans: Vec<Option<ProducerSpan>> = Vec::new();
        for (i, send) in rows.iter().enumerate() {
            match *send {
                Send::Known(aggregate, outcome) => {
                    if !matches!(outcome, Outcome::Acked(_)) {
                        stopped.insert(aggregate);
                    }
                    known.push(Some(outcome.clone()));
                }
                Send::Message(row, topic) => {
                    let aggregate = (row.aggregate_type.as_str(), row.aggregate_id.as_str());
                    if !stopped.is_empty() && stopped.contains(&aggregate) {
                        known.push(Some(Outcome::BlockedBehindFailure));
                        continue;
                    }
                    batch.expect_one();
                    let span = self.spans.then(|| producer_span(row, topic)).flatten();
                    let traceparent = span.as_ref().map(|s| s.context().traceparent());
                    if self.spans {
                        spans.resize_with(i, || None);
                        spans.push(span);
                    }
                    match self
                        .enqueue(row, topic, traceparent.as_deref(), batch.opaque(i))
                        .await
                    {
                        Ok(()) => known.push(None),
                        Err(code) => {
                            batch.refused_one();
                            stopped.insert(aggregate);
                            known.push(Some(Outcome::Failed {
                                scope: classify_refusal(code),
                                detail: format!("refused by the producer: {code}"),
                                alone,
                            }));
                        }
                    }
                }
            }
        }
        batch.sent_all();
        // A producer that hit a fatal error does not always report the messages still queued
        // (with no delivery timeout they would wait forever): purge them, so every report
        // arrives and the caller replaces the producer.
        let mut watch = tokio::time::interval(Duration::from_millis(50));
        let mut purged = false;
        let all_reported = batch.wait();
        tokio::pin!(all_reported);
        loop {
            tokio::select! {
                () = &mut all_reported => break,
                _ = watch.tick(), if !purged => {
                    if self.is_fatal() {
                        purged = true;
                        self.producer
                            .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
                    }
                }
            }
        }
        let reports = batch.take();
        let outcomes: Vec<Outcome> = known
            .into_iter()
            .zip(reports)
            .map(|(known, report)| match (known, report) {
                (Some(o), _) => o,
                (None, Some(Report::Acked(at))) => Outcome::Acked(at),
                (None, Some(Report::Failed(code))) => Outcome::Failed {
                    scope: classify_delivery(code),
                    detail: format!("delivery failed: {code}"),
                    alone,
                },
                (None, None) => Outcome::Failed {
                    scope: Scope::Relay,
                    detail: "delivery report lost (producer replaced)".into(),
                    alone,
                },
            })
            .collect();
        for (span, outcome) in spans.into_iter().zip(&outcomes) {
            let Some(span) = span else { continue };
            match outcome {
                Outcome::Acked(at) => span.end((*at).into(), None),
                Outcome::Failed { detail, .. } => {
                    span.end(std::time::SystemTime::now(), Some(detail.clone()));
                }
                other => span.end(std::time::SystemTime::now(), Some(format!("{other:?}"))),
            }
        }
        outcomes
    }

    /// Publishes plain envelopes to their routed topics (the benchmark's raw produce phase).
    pub async fn publish_envelopes(&self, rows: &[EventEnvelope]) -> Vec<Outcome> {
        let topics: Vec<String> = rows.iter().map(|r| self.topic_of(r)).collect();
        let sends: Vec<Send<'_>> = rows
            .iter()
            .zip(&topics)
            .map(|(r, t)| Send::Message(r, t))
            .collect();
        self.publish(&sends, false).await
    }

    async fn enqueue(
        &self,
        row: &EventEnvelope,
        topic: &str,
        traceparent: Option<&str>,
        opaque: usize,
    ) -> Result<(), RDKafkaErrorCode> {
        let mut headers = Some(OwnedHeaders::new_with_capacity(6));
        let options = HeaderOptions {
            cloudevents_source: self.wire.cloudevents_source.as_deref(),
            traceparent,
        };
        row.for_each_header(options, |key, value| {
            headers = headers.take().map(|h| {
                h.insert(Header {
                    key,
                    value: Some(value),
                })
            });
        });
        // A tombstone is a record without a value (not an empty one).
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, opaque)
            .key(row.message_key().as_bytes())
            .headers(headers.unwrap_or_default());
        if let Some(value) = row.payload.bytes() {
            record = record.payload(value);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
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

/// The PRODUCER span of `row` below its writer's `traceparent`, from the row's `created_at` (the
/// time it waited in the outbox is part of the span); `None` without a valid `traceparent`.
fn producer_span(row: &EventEnvelope, topic: &str) -> Option<ProducerSpan> {
    let parent = TraceContext::from_headers(row.traceparent(), row.tracestate())?;
    ProducerSpan::start(parent, row.created_at.into(), || {
        (
            format!("send {topic}"),
            // The messaging conventions' identifying attributes only: every attribute is
            // encoded and exported per event (the aggregate and event type are in the
            // writer's span and the message's headers).
            vec![
                Attribute::Static("messaging.system", "kafka"),
                Attribute::Static("messaging.operation.type", "send"),
                Attribute::Str("messaging.destination.name", topic.to_owned()),
                Attribute::Str("messaging.message.id", row.event_id.to_string()),
                Attribute::Int("outbox.id", row.id),
            ],
        )
    })
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
        assert_eq!(cfg.get("enable.gapless.guarantee"), Some("true"));
        assert_eq!(
            cfg.get("linger.ms"),
            Some("20"),
            "user settings override defaults"
        );
        assert_eq!(cfg.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(cfg.get("message.timeout.ms"), Some("0"));
    }

    #[test]
    fn overrides_of_guarantees_are_refused_by_name() {
        let kv = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        for (k, v) in [
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "30000"),
            ("partitioner", "random"),
            ("enable.idempotence", "false"),
            ("max.in.flight.requests.per.connection", "20"),
            ("max.in.flight", "20"),
            ("acks", "1"),
            ("enable.gapless.guarantee", "false"),
        ] {
            let err = check_overrides(&kv(k, v)).unwrap_err();
            assert!(err.contains(k), "{err}");
        }
        for (k, v) in [
            ("compression.type", "zstd"),
            ("linger.ms", "5"),
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "PLAIN"),
            ("client.id", "x"),
        ] {
            assert!(check_overrides(&kv(k, v)).is_ok(), "{k} refused");
        }
    }
}
