//! The prepare and publish steps: each row's topic (or why it cannot be sent), then the send,
//! pipelined on the relay's producer, with the events retried after a failure each sent alone
//! on a second producer beside it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{BatchEnd, Batcher};
use crate::decide::Outcome;
use crate::failure::{FailureClass, Scope};
use crate::publisher::Send;
use crate::store::ClaimedRow;

/// Most events a batch sends alone (see `Batcher::publish`).
pub const LONE_SENDS_PER_BATCH: usize = 16;

/// A claimed row before publishing.
pub(super) enum Prepared {
    /// Goes to this topic; to this partition when given (a keyless event kept off the
    /// topic's partitions without a leader), else to its key's.
    Topic(Arc<str>, Option<i32>),
    /// Not sent.
    Failed(Outcome),
}

impl Batcher<'_> {
    /// Each row's topic, or the outcome of a row that cannot be sent.
    pub(super) async fn prepare(&mut self, rows: &[ClaimedRow]) -> Result<Vec<Prepared>, BatchEnd> {
        // Routed topics are the same for every row of an aggregate type: build each once.
        let mut routed: HashMap<&str, Arc<str>> = HashMap::new();
        let mut prepared: Vec<Prepared> = rows
            .iter()
            .map(|r| match &r.message {
                Ok(m) if m.topic.as_deref().is_some_and(|t| !t.is_empty()) => {
                    Prepared::Topic(Arc::from(self.publisher.topic_of(m)), None)
                }
                Ok(m) => Prepared::Topic(
                    routed
                        .entry(m.aggregate_type.as_str())
                        .or_insert_with(|| Arc::from(self.publisher.topic_of(m)))
                        .clone(),
                    None,
                ),
                Err(u) => Prepared::Failed(Outcome::Failed {
                    scope: Scope::Event(FailureClass::Undecodable),
                    detail: u.error.clone(),
                    alone: false,
                }),
            })
            .collect();
        let names = prepared.iter().filter_map(|p| match p {
            Prepared::Topic(t, _) => Some(&**t),
            Prepared::Failed(_) => None,
        });
        let Some(producer) = self.publisher.producer() else {
            // The batches' producer is only ever replaced by a new session, never retired.
            self.kafka.failed(&"the Kafka producer has no session");
            return Err(BatchEnd::Backoff);
        };
        let problems = match self.topics.check(producer, names).await {
            Ok(p) => p,
            Err(e) => {
                self.metrics.set_healthy(false);
                self.kafka.failed(&format_args!("checking topics: {e}"));
                return Err(BatchEnd::Backoff);
            }
        };
        // Events bound for a partition without a leader are not sent: they could only wait
        // (inside a transaction, holding every other event of it back) until the partition
        // is back. They fail for their own aggregates, are retried alone, then parked.
        let topics: Vec<Arc<str>> = prepared
            .iter()
            .filter_map(|p| match p {
                Prepared::Topic(t, _) => Some(t.clone()),
                Prepared::Failed(_) => None,
            })
            .collect();
        let dead = self
            .topics
            .dead_partitions(producer, topics.iter().map(|t| &**t))
            .await;
        // Every event of the batch bound for a topic with no partition leader at all, none of
        // them a retry: the cluster cannot write (a broker holding every replica is down), an
        // outage to wait out, not the events' fault. Nothing is recorded against them.
        let sendable = topics.len();
        let cluster_down = sendable > 0
            && topics.iter().all(|t| {
                dead.get(&**t)
                    .is_some_and(|d| d.leaderless.len() as i32 >= d.count)
            })
            && rows.iter().all(|r| r.attempts.is_none());
        if cluster_down {
            self.metrics.set_healthy(false);
            self.kafka.failed(&format_args!(
                "no partition of the topics of the batch ({}) has a leader: the cluster cannot take writes; waiting, nothing is recorded against the events",
                topics
                    .iter()
                    .map(|t| &**t)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            return Err(BatchEnd::Backoff);
        }
        if !dead.is_empty() {
            for (p, row) in prepared.iter_mut().zip(rows) {
                let (Prepared::Topic(t, _), Ok(m)) = (&*p, &row.message) else {
                    continue;
                };
                let Some(d) = dead.get(&**t) else {
                    continue;
                };
                let Some(key) = m.message_key() else {
                    // A keyless event has no partition of its own (librdkafka would pick one
                    // at random, a dead one too): it goes to one that has a leader.
                    if let Some(live) = d.live_partition(m.id) {
                        *p = Prepared::Topic(t.clone(), Some(live));
                    }
                    continue;
                };
                let partition = crate::partitions::partition_for(key.as_bytes(), d.count);
                if d.leaderless.contains(&partition) {
                    *p = Prepared::Failed(Outcome::Failed {
                        scope: Scope::Event(FailureClass::Unacknowledged),
                        detail: format!(
                            "not acknowledged: partition {partition} of {t} has no leader in the cluster's metadata; not sent"
                        ),
                        alone: false,
                    });
                }
            }
        }
        if !problems.is_empty() {
            for p in &mut prepared {
                if let Prepared::Topic(t, _) = p {
                    if let Some(problem) = problems.get(&**t) {
                        *p = Prepared::Failed(Outcome::Failed {
                            scope: Scope::Event(problem.class),
                            detail: problem.detail.clone(),
                            alone: false,
                        });
                    }
                }
            }
        }
        Ok(prepared)
    }

    /// Why the batch's outcomes are an outage of the cluster rather than failures of its
    /// events: every event sent was withdrawn unacknowledged, none was acknowledged, none is
    /// a retry, and they were bound for two partitions or more. A cluster that answers but
    /// acknowledges nothing (every partition below `min.insync.replicas` after a broker
    /// restart, disks full) is not the events' fault: recording failures would park every
    /// aggregate in turn. One partition that refuses writes, beside others that take them,
    /// still fails only its own events.
    pub(super) fn unwritable_cluster(
        &self,
        rows: &[ClaimedRow],
        prepared: &[Prepared],
        outcomes: &[Outcome],
    ) -> Option<String> {
        refused_everywhere(rows, prepared, outcomes, |t| self.topics.partition_count(t))
    }

    /// Sends the batch. `None` when shutdown's grace period ran out (nothing is marked; the
    /// rows are sent again later): the grace period bounds every send of the batch, the
    /// pipelined ones and the lone ones alike.
    ///
    /// Aggregates with a row that failed before (suspects) send only their first claimed row,
    /// alone: one message at a time on the relay's second producer, so the broker's verdict on
    /// its record batch is the verdict on this event (a refused record batch reports its
    /// error on every event in it, and the culprit may be any of them), and a suspect's
    /// failure never touches the producer of the healthy events. The suspects' later rows wait
    /// for the next batch (they follow once the first is published). Lone sends run beside the
    /// pipelined send of everything else, at most [`LONE_SENDS_PER_BATCH`] per batch, and no
    /// new one starts once the pipelined send is done (when it sent anything): the healthy
    /// aggregates never wait for them beyond one lone round trip.
    pub(super) async fn publish(
        &mut self,
        rows: &[ClaimedRow],
        prepared: &[Prepared],
        retrying: &HashMap<i64, i32>,
        shutdown: &CancellationToken,
    ) -> Option<Vec<Outcome>> {
        let mut known: Vec<Option<Outcome>> = prepared
            .iter()
            .map(|p| match p {
                Prepared::Failed(o) => Some(o.clone()),
                Prepared::Topic(..) => None,
            })
            .collect();
        let lone = lone_candidates(rows, retrying, &mut known);
        let mut sent_alone = vec![false; rows.len()];
        for &i in &lone {
            sent_alone[i] = true;
        }
        let sends: Vec<Send<'_>> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| match (&known[i], &prepared[i], &row.message) {
                (Some(o), _, _) => Send::Known(row.aggregate(), o),
                _ if sent_alone[i] => Send::Known(row.aggregate(), &Outcome::BlockedBehindFailure),
                (None, Prepared::Topic(t, partition), Ok(m)) => Send::Message(m, t, *partition),
                (None, _, _) => unreachable!("rows without a topic or message have an outcome"),
            })
            .collect();
        let main = &*self.publisher;
        let lone_publisher = &mut *self.lone;
        let pipelined_done = std::sync::atomic::AtomicBool::new(false);
        // With nothing else to send, the lone sends may use the whole bound.
        let pipelining = sends.iter().any(|s| matches!(s, Send::Message(..)));
        let pipelined = async {
            let outcomes = main.publish(&sends, false).await;
            pipelined_done.store(pipelining, std::sync::atomic::Ordering::Release);
            outcomes
        };
        let alone = async {
            let mut outcomes: Vec<(usize, Outcome)> = Vec::new();
            for &i in &lone {
                let over = outcomes.len() >= LONE_SENDS_PER_BATCH
                    || (!outcomes.is_empty()
                        && pipelined_done.load(std::sync::atomic::Ordering::Acquire));
                if over {
                    break;
                }
                let (Prepared::Topic(topic, partition), Ok(message)) =
                    (&prepared[i], &rows[i].message)
                else {
                    continue;
                };
                tracing::debug!(outbox.id = message.id, event.id = %message.event_id, "Sending an event alone (retried after a failure)");
                let outcome = lone_publisher
                    .publish(&[Send::Message(message, topic, *partition)], true)
                    .await
                    .pop()
                    .unwrap_or(Outcome::BlockedBehindFailure);
                if lone_publisher.must_replace() {
                    // A refused record batch stops the producer (gapless guarantee), a
                    // withdrawn send ends its session: only the lone one, the healthy events'
                    // producer goes on.
                    if let Err(e) = lone_publisher.replace() {
                        tracing::error!(error = %e, "Could not recreate the lone Kafka producer");
                    }
                }
                outcomes.push((i, outcome));
            }
            outcomes
        };
        let grace = async {
            shutdown.cancelled().await;
            tokio::time::sleep(self.shutdown_timeout).await;
        };
        let (mut outcomes, lone_outcomes) = tokio::select! {
            both = async { tokio::join!(pipelined, alone) } => both,
            _ = grace => {
                tracing::warn!(events = rows.len(), "Shutdown grace period over; abandoning in-flight events unmarked");
                return None;
            }
        };
        if !lone.is_empty() {
            // Used until now (a lone send may last as long as the send timeout).
            self.lone_used = std::time::Instant::now();
            self.metrics.lone_sends.observe(lone_outcomes.len() as f64);
        }
        for (i, outcome) in lone_outcomes {
            outcomes[i] = match outcome {
                // The lone producer failed as a whole: not this event's fault, and not the
                // healthy producer's; sent again next batch.
                Outcome::Failed {
                    scope: Scope::Relay,
                    ..
                } => Outcome::BlockedBehindFailure,
                o => o,
            };
        }
        if self.publisher.must_replace() {
            self.replace_producer();
        }
        Some(outcomes)
    }

    /// Starts a new producer session after the producer stopped (a refused or failed batch).
    pub(super) fn replace_producer(&mut self) {
        self.replaced = true;
        tracing::info!(
            batch = self.batches,
            "Kafka producer stopped (a refused or failed batch, or events withdrawn after the send timeout); starting a new producer session and resending from the outbox"
        );
        if let Err(e) = self.publisher.replace() {
            tracing::error!(error = %e, "Could not recreate the Kafka producer");
        }
    }
}

/// The rows to send alone, in `id` order: the first claimed row of each aggregate with a row
/// that failed before. The later rows of those aggregates get
/// [`Outcome::BlockedBehindFailure`] in `known` (not sent in this batch). A first row that
/// already has an outcome (it failed before sending) is not sent.
fn lone_candidates(
    rows: &[ClaimedRow],
    retrying: &HashMap<i64, i32>,
    known: &mut [Option<Outcome>],
) -> Vec<usize> {
    if retrying.is_empty() {
        return Vec::new();
    }
    let suspects: HashSet<(&str, &str)> = rows
        .iter()
        .filter(|r| retrying.contains_key(&r.id()))
        .map(ClaimedRow::aggregate)
        .collect();
    let mut first_seen: HashSet<(&str, &str)> = HashSet::new();
    let mut lone = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let aggregate = row.aggregate();
        if !suspects.contains(&aggregate) {
            continue;
        }
        if !first_seen.insert(aggregate) {
            known[i].get_or_insert(Outcome::BlockedBehindFailure);
            continue;
        }
        if known[i].is_none() {
            lone.push(i);
        }
    }
    lone
}

/// [`Batcher::unwritable_cluster`] with the topics' partition counts from `partition_count`.
fn refused_everywhere(
    rows: &[ClaimedRow],
    prepared: &[Prepared],
    outcomes: &[Outcome],
    partition_count: impl Fn(&str) -> Option<i32>,
) -> Option<String> {
    let mut partitions: std::collections::BTreeSet<(&str, i32)> = Default::default();
    let mut sent = 0usize;
    for ((row, p), o) in rows.iter().zip(prepared).zip(outcomes) {
        let (Prepared::Topic(t, chosen), Ok(m)) = (p, &row.message) else {
            continue;
        };
        if row.attempts.is_some() {
            return None;
        }
        match o {
            Outcome::Acked(_) => return None,
            Outcome::Failed {
                scope: Scope::Event(FailureClass::Unacknowledged),
                ..
            } => {}
            _ => continue,
        }
        sent += 1;
        let partition = match (chosen, m.message_key(), partition_count(t)) {
            // A keyless event sent to a partition the relay chose.
            (Some(p), _, _) => *p,
            (None, Some(key), Some(count)) => {
                crate::partitions::partition_for(key.as_bytes(), count)
            }
            // Keyless and left to the producer, or the count unknown: counted apart, so two
            // such events do not pass for two partitions.
            _ => -1,
        };
        partitions.insert((t, partition));
    }
    (sent > 0 && partitions.iter().filter(|(_, p)| *p >= 0).count() >= 2).then(|| {
        format!(
            "the cluster answers but acknowledged none of the batch's {sent} events, bound for {} partitions: it cannot take writes (too few in-sync replicas?); waiting, nothing is recorded against the events",
            partitions.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use outbox_writer::envelope::{EventEnvelope, Payload};

    /// A first attempt of an event with `key` (`Some("")`: keyless).
    fn row(id: i64, key: Option<&str>) -> ClaimedRow {
        ClaimedRow {
            attempts: None,
            bytes: 0,
            message: Ok(EventEnvelope {
                id,
                event_id: uuid::Uuid::new_v4(),
                aggregate_type: "order".into(),
                aggregate_id: format!("a{id}"),
                event_type: "OrderPaid".into(),
                payload: Payload::Json("{}".into()),
                key: key.map(str::to_owned),
                headers: serde_json::json!({}),
                topic: None,
                created_at: Utc::now(),
                relay_headers: true,
            }),
        }
    }

    fn unacknowledged() -> Outcome {
        Outcome::Failed {
            scope: Scope::Event(FailureClass::Unacknowledged),
            detail: "Local: Message timed out".into(),
            alone: false,
        }
    }

    fn topic(partition: Option<i32>) -> Prepared {
        Prepared::Topic("orders".into(), partition)
    }

    fn verdict(rows: &[ClaimedRow], prepared: &[Prepared]) -> Option<String> {
        let outcomes: Vec<Outcome> = rows.iter().map(|_| unacknowledged()).collect();
        refused_everywhere(rows, prepared, &outcomes, |_| Some(6))
    }

    #[test]
    fn keyless_events_the_relay_sent_to_two_partitions_unacknowledged_are_an_outage() {
        let rows = [row(1, Some("")), row(2, Some(""))];
        let why = verdict(&rows, &[topic(Some(0)), topic(Some(3))]);
        assert!(why.is_some_and(|w| w.contains("2 partitions")));
    }

    #[test]
    fn keyless_events_left_to_the_producer_do_not_pass_for_two_partitions() {
        let rows = [row(1, Some("")), row(2, Some(""))];
        assert_eq!(verdict(&rows, &[topic(None), topic(None)]), None);
    }

    #[test]
    fn one_acknowledged_event_makes_the_others_failures_their_own() {
        let rows = [row(1, Some("")), row(2, Some(""))];
        let outcomes = [unacknowledged(), Outcome::Acked(Utc::now())];
        let prepared = [topic(Some(0)), topic(Some(3))];
        assert_eq!(
            refused_everywhere(&rows, &prepared, &outcomes, |_| Some(6)),
            None
        );
    }
}
