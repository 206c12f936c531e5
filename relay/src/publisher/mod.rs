//! Publishing a batch of outbox rows to Kafka with an idempotent producer.
//!
//! All messages of a batch are handed to librdkafka at once (pipelined), in `id` order, keyed
//! by the row's `message_key` or else its aggregate id; the idempotent producer keeps their
//! order per partition. Each row's outcome comes from its own delivery report: only a report
//! that says "persisted" counts.
//!
//! The producer's configuration, and which of its settings a user may not change, live in
//! `settings`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_kafka::PolledProducer;
use outbox_trace::{Attribute, ProducerSpan, TraceContext};
use outbox_writer::{EventEnvelope, HeaderOptions};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::util::Timeout;

use crate::decide::Outcome;
use crate::failure::{classify_delivery, classify_refusal, FailureClass, Scope};
use crate::kafka_context::{BatchReports, BrokerGauge, RelayContext, Report};

mod settings;
mod transaction;

pub use settings::{
    check_overrides, producer_config, transactional_producer_config, FORCED_SETTINGS,
    PRODUCER_DEFAULTS, PROTECTED_SETTINGS, TRANSACTION_TIMEOUT_MS,
};

use transaction::{Ending, Transactions};

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
    /// How long a batch may go without an acknowledgement while the cluster answers (see
    /// [`Publisher::with_send_timeout`]); unbounded when `None`.
    send_timeout: Option<Duration>,
    /// A send outlived `send_timeout` and its messages were withdrawn: the producer's session
    /// must be replaced (withdrawn messages leave gaps in its sequence numbers).
    spent: std::sync::atomic::AtomicBool,
    /// With `--transactions`: the id, and the session's transactional state.
    transactional: Option<(String, Transactions)>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic_prefix", &self.topic_prefix)
            .finish()
    }
}

/// A producer of [`transactional_producer_config`] whose delivery reports go to `context`.
fn new_producer(
    brokers: &str,
    extra: &[(String, String)],
    transactional_id: Option<&str>,
    context: &RelayContext,
) -> Result<PolledProducer<RelayContext>, KafkaError> {
    PolledProducer::create(
        &transactional_producer_config(brokers, extra, transactional_id),
        context.clone(),
        "relay-producer",
    )
}

/// Lets a replaced (and purged) producer report what was purged, then tears it down (its
/// threads joined, librdkafka's destroy): on the blocking pool when there is a runtime, whose
/// one thread would otherwise stand still meanwhile, lease renewals included.
fn retire_producer(old: PolledProducer<RelayContext>) {
    let teardown = move || {
        let _ = old.flush(Timeout::After(Duration::from_millis(100)));
        drop(old);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(teardown);
        }
        Err(_) => teardown(),
    }
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
        let producer = new_producer(brokers, extra, None, &context)?;
        Ok(Self {
            producer,
            context,
            generation: Default::default(),
            brokers: brokers.to_owned(),
            extra: extra.to_vec(),
            topic_prefix: topic_prefix.to_owned(),
            broker_down,
            wire: WireSettings::default(),
            spans: outbox_trace::exporting(),
            send_timeout: None,
            spent: Default::default(),
            transactional: None,
        })
    }

    /// The publisher with a transactional producer of id `transactional_id`: each batch is
    /// one Kafka transaction, its rows published once it committed; a relay that initialises
    /// the same id fences this one at the broker (see `transaction`).
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn with_transactions(mut self, transactional_id: &str) -> Result<Self, KafkaError> {
        let timeout = self.send_timeout.unwrap_or(Duration::from_secs(30));
        self.transactional = Some((transactional_id.to_owned(), Transactions::new(timeout)));
        self.replace()?;
        Ok(self)
    }

    /// With transactions: initialises the producer session now, fencing every earlier producer
    /// of the id (a deposed leader's open transaction is aborted at once, so `read_committed`
    /// readers do not wait for its timeout). Called when the lease is acquired; the first
    /// batch does it otherwise.
    ///
    /// # Errors
    /// The broker did not answer in time, or refused.
    pub async fn fence(&self) -> Result<(), KafkaError> {
        match &self.transactional {
            Some((_, t)) => t.fence(&self.producer).await,
            None => Ok(()),
        }
    }

    /// Bounds each send: when no acknowledgement of a batch arrived for `timeout` and the
    /// cluster still answers a metadata request, the messages not acknowledged are withdrawn
    /// (purged) and fail as [`FailureClass::Unacknowledged`] of their own aggregates: a
    /// partition without a leader, or without enough in-sync replicas, which librdkafka would
    /// retry for as long as the relay waits (it never times a message out itself, see
    /// `settings`). While the cluster does not answer (an outage), the batch waits on. The
    /// producer is then replaced ([`Publisher::must_replace`]).
    #[must_use]
    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = Some(timeout);
        self
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
        // Nothing queued in the old session is sent after this: the new one resends from the
        // outbox, in order.
        self.purge_queued();
        let context =
            RelayContext::reporting_on(self.broker_down.clone(), self.context.broker_down());
        let id = self.transactional.as_ref().map(|(id, _)| id.as_str());
        let producer = new_producer(&self.brokers, &self.extra, id, &context)?;
        if let Some((_, t)) = &self.transactional {
            t.reset();
        }
        // The old producer's errors are not the new one's.
        self.context.retire();
        let old = std::mem::replace(&mut self.producer, producer);
        self.context = context;
        self.spent
            .store(false, std::sync::atomic::Ordering::Relaxed);
        retire_producer(old);
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

    /// True once the producer must be replaced: a fatal error, or messages withdrawn after
    /// the send timeout.
    pub fn must_replace(&self) -> bool {
        self.is_fatal() || self.spent.load(std::sync::atomic::Ordering::Relaxed)
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
        let in_transaction = match &self.transactional {
            Some((_, t)) if rows.iter().any(|r| matches!(r, Send::Message(..))) => {
                if let Err(e) = t.begin(&self.producer).await {
                    tracing::warn!(error = %e, "Could not begin a Kafka transaction; the batch is sent again");
                    self.spent.store(true, std::sync::atomic::Ordering::Relaxed);
                    return not_sent(
                        rows,
                        &format!("could not begin a Kafka transaction: {e}"),
                        alone,
                    );
                }
                true
            }
            _ => false,
        };
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
        let withdrawn = self.await_reports(&batch, rows).await;
        let reports = batch.take();
        // A failed delivery makes the transaction abortable in librdkafka.
        let abort = withdrawn.clone().or_else(|| {
            reports.iter().flatten().find_map(|r| match r {
                Report::Failed(code) => Some(format!("a message of the batch failed: {code}")),
                Report::Acked(_) => None,
            })
        });
        let mut outcomes: Vec<Outcome> = known
            .into_iter()
            .zip(reports)
            .map(|(known, report)| match (known, report) {
                (Some(o), _) => o,
                (None, Some(Report::Acked(at))) => Outcome::Acked(at),
                (
                    None,
                    Some(Report::Failed(
                        RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight,
                    ))
                    | None,
                ) if withdrawn.is_some() => Outcome::Failed {
                    scope: Scope::Event(FailureClass::Unacknowledged),
                    detail: withdrawn.clone().unwrap_or_default(),
                    alone,
                },
                // Inside a transaction librdkafka times messages out (the transaction's
                // timeout): the broker did not answer for that long, an outage, not the event's
                // fault (the relay's own send timeout, shorter, judges partitions).
                (None, Some(Report::Failed(RDKafkaErrorCode::MessageTimedOut)))
                    if in_transaction =>
                {
                    Outcome::Failed {
                        scope: Scope::Relay,
                        detail: "not acknowledged within the Kafka transaction's timeout".into(),
                        alone,
                    }
                }
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
        if in_transaction {
            self.end_transaction(&mut outcomes, abort).await;
        }
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

    /// Commits the batch's transaction (or aborts it when `abort` says why) and settles the
    /// outcomes: committed, the acknowledged rows count as published at the commit's time;
    /// aborted, none does (behind the failed rows of the batch when there are some, else a
    /// failure of the producer).
    async fn end_transaction(&self, outcomes: &mut [Outcome], abort: Option<String>) {
        let Some((_, t)) = &self.transactional else {
            return;
        };
        match t.end(&self.producer, abort).await {
            Ending::Committed => {
                let at = chrono::Utc::now();
                for o in outcomes.iter_mut() {
                    if let Outcome::Acked(acked) = o {
                        *acked = at;
                    }
                }
            }
            Ending::Aborted(why, replace) => {
                if replace {
                    self.spent.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                let failed_event = outcomes.iter().any(|o| {
                    matches!(
                        o,
                        Outcome::Failed {
                            scope: Scope::Event(_),
                            ..
                        }
                    )
                });
                for o in outcomes.iter_mut() {
                    if let Outcome::Acked(_) = o {
                        *o = if failed_event {
                            Outcome::BlockedBehindFailure
                        } else {
                            Outcome::Failed {
                                scope: Scope::Relay,
                                detail: why.clone(),
                                alone: false,
                            }
                        };
                    }
                }
            }
        }
    }

    /// Waits for every delivery report of `batch`. A producer that hit a fatal error does not
    /// always report the messages still queued (with no delivery timeout they would wait
    /// forever): they are purged, so every report arrives and the caller replaces the
    /// producer. With a send timeout, a batch that went that long without an acknowledgement
    /// while the cluster answers has its unacknowledged messages withdrawn the same way:
    /// `Some(why)` then.
    async fn await_reports(&self, batch: &BatchReports, rows: &[Send<'_>]) -> Option<String> {
        let mut watch = tokio::time::interval(Duration::from_millis(50));
        let mut purged = false;
        let mut withdrawn = None;
        let mut outstanding = batch.outstanding();
        let mut quiet_since = tokio::time::Instant::now();
        let all_reported = batch.wait();
        tokio::pin!(all_reported);
        loop {
            tokio::select! {
                () = &mut all_reported => break,
                _ = watch.tick(), if !purged => {
                    if self.is_fatal() {
                        purged = true;
                        self.purge_queued();
                        continue;
                    }
                    let Some(timeout) = self.send_timeout else { continue };
                    let now_outstanding = batch.outstanding();
                    if now_outstanding != outstanding {
                        (outstanding, quiet_since) = (now_outstanding, tokio::time::Instant::now());
                        continue;
                    }
                    if quiet_since.elapsed() < timeout {
                        continue;
                    }
                    // Nothing moved for `timeout`: an outage (wait on, librdkafka delivers
                    // once the broker is back), or partitions the cluster cannot write.
                    let topic = rows.iter().find_map(|r| match r {
                        Send::Message(_, t) => Some(*t),
                        Send::Known(..) => None,
                    });
                    let answers = match topic {
                        Some(t) => crate::topics::exists(&self.producer, t).await.is_ok(),
                        None => false,
                    };
                    if answers {
                        purged = true;
                        withdrawn = Some(format!(
                            "not acknowledged by the broker within {}s while the cluster answered (a partition without a leader, or with too few in-sync replicas); withdrawn, sent again later",
                            timeout.as_secs_f64()
                        ));
                        self.spent.store(true, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(
                            events = outstanding,
                            timeout_s = timeout.as_secs_f64(),
                            "Events not acknowledged within the send timeout while the cluster answers; withdrawn and failed for their own aggregates"
                        );
                        self.purge_queued();
                    } else {
                        quiet_since = tokio::time::Instant::now();
                    }
                }
            }
        }
        withdrawn
    }

    fn purge_queued(&self) {
        self.producer
            .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
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
            headers = headers.take().map(|h| h.insert(Header { key, value }));
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
        self.purge_queued();
        let _ = self
            .producer
            .flush(Timeout::After(Duration::from_millis(100)));
    }
}

/// The outcomes of a batch none of whose messages was handed over: `why` for each.
fn not_sent(rows: &[Send<'_>], why: &str, alone: bool) -> Vec<Outcome> {
    rows.iter()
        .map(|r| match r {
            Send::Known(_, o) => (*o).clone(),
            Send::Message(..) => Outcome::Failed {
                scope: Scope::Relay,
                detail: why.to_owned(),
                alone,
            },
        })
        .collect()
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
