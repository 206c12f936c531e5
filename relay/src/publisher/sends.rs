//! Sending a batch: every message handed to librdkafka at once (pipelined), in `id` order, and
//! each row's outcome from its own delivery report; with transactions, the batch's transaction
//! ended and the outcomes settled by how it ended.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_kafka::PolledProducer;
use outbox_trace::ProducerSpan;
use outbox_writer::{EventEnvelope, HeaderOptions};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;

use super::session::Publisher;
use super::span::producer_span;
use super::transaction::Ending;
use crate::decide::Outcome;
use crate::failure::{classify_delivery, classify_refusal, FailureClass, Scope};
use crate::kafka_context::{BatchReports, RelayContext, Report};

/// One row of a batch as handed to [`Publisher::publish`].
#[derive(Debug, Clone, Copy)]
pub enum Send<'a> {
    /// Send this message to this topic; to this partition when given (else the partitioner
    /// picks it from the key).
    Message(&'a EventEnvelope, &'a str, Option<i32>),
    /// Do not send; the outcome of the row of this aggregate (type, id) is already known.
    Known((&'a str, &'a str), &'a Outcome),
}

impl Publisher {
    /// Sends every [`Send::Message`] (in order, pipelined) and waits for all delivery reports.
    ///
    /// A message librdkafka refuses synchronously, or a [`Send::Known`] failure, stops the
    /// later rows of its aggregate in this call: they are not sent at all
    /// ([`Outcome::BlockedBehindFailure`]). `alone` says the caller sends a single message
    /// with nothing else in flight (see [`crate::decide`]). Outcomes are in the order of
    /// `rows`.
    pub async fn publish(&self, rows: &[Send<'_>], alone: bool) -> Vec<Outcome> {
        let Some(producer) = &self.producer else {
            // The caller starts a session before it sends (`ensure_session`).
            return not_sent(rows, "the Kafka producer has no session", alone);
        };
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let in_transaction = match &self.transactional {
            Some((_, t)) if rows.iter().any(|r| matches!(r, Send::Message(..))) => {
                if !t.initialised() {
                    // The batch initialises the session under the lease before it publishes;
                    // that failed, and this session must not initialise itself.
                    return not_sent(
                        rows,
                        "the Kafka producer's session is not initialised under the lease",
                        alone,
                    );
                }
                if let Err(e) = t.begin(producer) {
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
        // With transactions, the bucket record is the transaction's last message, its report
        // in the slot after the rows'.
        let record = in_transaction && self.records.is_some();
        let batch = Arc::new(BatchReports::new(
            generation,
            rows.len() + usize::from(record),
        ));
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
                Send::Message(row, topic, partition) => {
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
                        .enqueue(
                            producer,
                            row,
                            (topic, partition),
                            traceparent.as_deref(),
                            batch.opaque(i),
                        )
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
        let published: Vec<i64> = if record {
            rows.iter()
                .zip(&known)
                .filter_map(|(r, k)| match (r, k) {
                    (Send::Message(m, ..), None) => Some(m.id),
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        let record_refused = match &self.records {
            Some(r) if record => self
                .enqueue_record(producer, &r.sink, r.value(&published), &batch, rows.len())
                .await
                .err(),
            _ => None,
        };
        batch.sent_all();
        let withdrawn = self
            .await_reports(producer, &batch, rows, in_transaction)
            .await;
        let reports = batch.take();
        let record_offset = match reports.get(rows.len()) {
            Some(Some(Report::Acked(_, offset))) if record => Some(*offset),
            _ => None,
        };
        // A failed delivery makes the transaction abortable in librdkafka; a transaction
        // without its record must not commit.
        let abort = withdrawn.clone().or(record_refused).or_else(|| {
            reports.iter().flatten().find_map(|r| match r {
                Report::Failed(code) => Some(format!("a message of the batch failed: {code}")),
                Report::Acked(..) => None,
            })
        });
        let mut outcomes: Vec<Outcome> = known
            .into_iter()
            .zip(reports)
            .map(|(known, report)| match (known, report) {
                (Some(o), _) => o,
                (None, Some(Report::Acked(at, _))) => Outcome::Acked(at),
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
            self.end_transaction(
                producer,
                &mut outcomes,
                abort,
                withdrawn.is_some(),
                (&published, record_offset),
            )
            .await;
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
    /// failure of the producer). An abort after messages were `withdrawn` strands the id
    /// ([`Publisher::id_stranded`]).
    async fn end_transaction(
        &self,
        producer: &PolledProducer<RelayContext>,
        outcomes: &mut [Outcome],
        abort: Option<String>,
        withdrawn: bool,
        (published, record_offset): (&[i64], Option<i64>),
    ) {
        let Some((_, t)) = &self.transactional else {
            return;
        };
        let ending = t.end(producer, abort).await;
        if let Some(r) = &self.records {
            match &ending {
                Ending::Committed => r.committed(published, record_offset),
                Ending::Unknown(_) => r.uncertain(),
                Ending::Aborted(..) => {}
            }
        }
        let ending = match ending {
            Ending::Unknown(why) => Ending::Aborted(why, true),
            e => e,
        };
        match ending {
            Ending::Committed => {
                let at = chrono::Utc::now();
                for o in outcomes.iter_mut() {
                    if let Outcome::Acked(acked) = o {
                        *acked = at;
                    }
                }
            }
            Ending::Unknown(_) => unreachable!("settled above"),
            Ending::Aborted(why, replace) => {
                if withdrawn {
                    // Aborted (or, when the abort failed too, never committed: no commit was
                    // sent, and the coordinator aborts it at its timeout), but the abort cannot
                    // finish before the withdrawn messages' partitions are back.
                    t.strand();
                }
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
    ///
    /// In a transaction, once a message failed (a record batch the broker refused, say) the
    /// transaction can only abort, and librdkafka sends none of its queued messages any more:
    /// they would wait the whole send timeout and then fail as unacknowledged, for their own
    /// aggregates (parked at once with `--park-after 1`). They are purged from the queue at
    /// once instead: not their events' fault, they are sent again after the abort.
    async fn await_reports(
        &self,
        producer: &PolledProducer<RelayContext>,
        batch: &BatchReports,
        rows: &[Send<'_>],
        in_transaction: bool,
    ) -> Option<String> {
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
                    if in_transaction && batch.any_failed() {
                        // In-flight messages still get their reports.
                        purged = true;
                        self.purge_waiting();
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
                        Send::Message(_, t, _) => Some(*t),
                        Send::Known(..) => None,
                    });
                    let answers = match topic {
                        Some(t) => crate::topics::exists(producer, t).await.is_ok(),
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

    /// Publishes plain envelopes to their routed topics (the benchmark's raw produce phase).
    pub async fn publish_envelopes(&self, rows: &[EventEnvelope]) -> Vec<Outcome> {
        let topics: Vec<String> = rows.iter().map(|r| self.topic_of(r)).collect();
        let sends: Vec<Send<'_>> = rows
            .iter()
            .zip(&topics)
            .map(|(r, t)| Send::Message(r, t, None))
            .collect();
        self.publish(&sends, false).await
    }

    /// Hands the bucket record to librdkafka as the batch's slot `index`; a refusal is the
    /// reason the transaction must abort.
    async fn enqueue_record(
        &self,
        producer: &PolledProducer<RelayContext>,
        sink: &crate::records::RecordSink,
        value: Vec<u8>,
        batch: &BatchReports,
        index: usize,
    ) -> Result<(), String> {
        batch.expect_one();
        let record =
            BaseRecord::<[u8], [u8], usize>::with_opaque_to(&sink.topic, batch.opaque(index))
                .partition(sink.partition)
                .key(sink.key.as_bytes())
                .payload(&value);
        send_waiting(producer, record).await.map_err(|code| {
            batch.refused_one();
            format!("the bucket record was refused by the producer: {code}")
        })
    }

    async fn enqueue(
        &self,
        producer: &PolledProducer<RelayContext>,
        row: &EventEnvelope,
        (topic, partition): (&str, Option<i32>),
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
            .headers(headers.unwrap_or_default());
        // A row without a key (a Debezium copy of a NULL key) is a record without one.
        if let Some(key) = row.message_key() {
            record = record.key(key.as_bytes());
        }
        if let Some(value) = row.payload.bytes() {
            record = record.payload(value);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        send_waiting(producer, record).await
    }
}

/// Hands `record` to librdkafka, waiting while its local queue is full (delivery reports
/// drain it).
async fn send_waiting(
    producer: &PolledProducer<RelayContext>,
    mut record: BaseRecord<'_, [u8], [u8], usize>,
) -> Result<(), RDKafkaErrorCode> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                record = rec;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return Err(error_code(&e)),
        }
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

fn error_code(e: &KafkaError) -> RDKafkaErrorCode {
    e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)
}
