//! One batch of the active relay, as its steps:
//!
//! 1. **claim** the head of the outbox in `id` order (fenced by the lease), leaving out
//!    aggregates that wait behind a failed or parked event;
//! 2. **prepare**: rows that cannot become a message (undecodable, a topic that is invalid,
//!    missing or refused) fail here, without being sent;
//! 3. **publish**: the events of aggregates retried after a failure go first, each alone, so a
//!    broker refusal of a whole record batch is pinned on the right event; then everything
//!    else, pipelined;
//! 4. **decide** per row ([`crate::decide`]): mark, record a failure (retry or park), or wait;
//! 5. **mark** the published rows (fenced), **record** the failures (fenced);
//! 6. **react**: metrics, logs, replacing a fatal producer, backing off on outages.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::decide::{decide, MarkPlan, Outcome};
use crate::failure::{FailureClass, Scope};
use crate::metrics::Metrics;
use crate::outage::Outage;
use crate::parking::{ParkPolicy, Recorded};
use crate::publisher::{Publisher, Send};
use crate::store::{ClaimLimits, ClaimedBatch, ClaimedRow, LeaseToken, Marked, Store};
use crate::topics::TopicCatalog;

/// How a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// The outbox had nothing to send.
    Empty,
    /// Rows were handled; `clean` when nothing failed.
    Done {
        /// Nothing failed.
        clean: bool,
    },
    /// A dependency is down (database, broker): wait before the next batch.
    Backoff,
    /// The lease is gone: stop leading.
    LeaseLost,
    /// Shutdown interrupted the batch.
    Shutdown,
}

/// What the batches of one leadership term share.
pub struct Batcher<'a> {
    /// The outbox database.
    pub store: &'a Store,
    /// Metrics.
    pub metrics: &'a Metrics,
    /// The lease this term holds.
    pub token: &'a LeaseToken,
    /// The producer (replaced after fatal errors).
    pub publisher: &'a mut Publisher,
    /// Topic checks.
    pub topics: &'a mut TopicCatalog,
    /// Claim bounds.
    pub limits: ClaimLimits,
    /// Rows asked for in the next claim (lower than `limits.rows` after a byte-bounded batch).
    pub row_limit: i64,
    /// Retry and parking policy.
    pub policy: ParkPolicy,
    /// Grace period for in-flight acknowledgements after shutdown.
    pub shutdown_timeout: Duration,
    /// Database outage tracker (kept across leadership terms, so an outage that cost the
    /// lease still ends with one "Recovered" line).
    pub db: &'a mut Outage,
    /// Broker outage tracker (likewise).
    pub kafka: &'a mut Outage,
    /// False once the failure table was seen empty (and nothing failed since): skips the
    /// failure query and the claim's exclusion. Only this leader writes failures, so the table
    /// stays empty until it records one.
    pub failures_known: bool,
}

impl Batcher<'_> {
    /// Runs one batch.
    pub async fn run(&mut self, shutdown: &CancellationToken) -> BatchEnd {
        let retrying = match self.retrying().await {
            Ok(r) => r,
            Err(end) => return end,
        };
        let rows = match self.claim().await {
            Ok(rows) if rows.is_empty() => return BatchEnd::Empty,
            Ok(rows) => rows,
            Err(end) => return end,
        };
        self.metrics.batch_size.observe(rows.len() as f64);
        let prepared = match self.prepare(&rows).await {
            Ok(p) => p,
            Err(end) => return end,
        };
        let Some(outcomes) = self.publish(&rows, &prepared, &retrying, shutdown).await else {
            return BatchEnd::Shutdown;
        };
        let plan = decide(&rows, &outcomes, &retrying);
        if let Err(end) = self.mark(&rows, &outcomes, &plan, shutdown).await {
            return end;
        }
        if let Err(end) = self.record(&rows, &plan).await {
            return end;
        }
        self.react(&rows, &plan)
    }

    /// Attempts so far of the events retried after a failure.
    async fn retrying(&mut self) -> Result<HashMap<i64, i32>, BatchEnd> {
        if !self.failures_known {
            return Ok(HashMap::new());
        }
        match self.store.retrying_failures().await {
            Ok((retrying, parked)) => {
                self.failures_known = parked || !retrying.is_empty();
                Ok(retrying)
            }
            Err(e) => Err(self.db_failed(&e)),
        }
    }

    async fn claim(&mut self) -> Result<Vec<ClaimedRow>, BatchEnd> {
        let limits = ClaimLimits {
            exclude_failed: self.failures_known,
            rows: self.row_limit,
            ..self.limits
        };
        match self.store.claim(self.token, limits).await {
            Ok(ClaimedBatch::Rows(rows, cut)) => {
                // Large events: ask for about twice what fit next time, so PostgreSQL renders
                // few rows the byte bound drops; back to the full batch once it fits.
                self.row_limit = if cut {
                    (rows.len() as i64 * 2).clamp(1, self.limits.rows)
                } else {
                    self.limits.rows
                };
                self.db.recovered();
                self.metrics.set_healthy(!self.kafka.is_failing());
                Ok(rows)
            }
            Ok(ClaimedBatch::LeaseLost) => Err(BatchEnd::LeaseLost),
            Err(e) => Err(self.db_failed(&e)),
        }
    }

    fn db_failed(&mut self, e: &sqlx::Error) -> BatchEnd {
        self.metrics.db_errors.inc();
        self.metrics.set_healthy(false);
        self.db.failed(e);
        BatchEnd::Backoff
    }

    /// Each row's topic, or the outcome of a row that cannot be sent.
    async fn prepare(&mut self, rows: &[ClaimedRow]) -> Result<Vec<Prepared>, BatchEnd> {
        // Routed topics are the same for every row of an aggregate type: build each once.
        let mut routed: HashMap<&str, Arc<str>> = HashMap::new();
        let mut prepared: Vec<Prepared> = rows
            .iter()
            .map(|r| match &r.message {
                Ok(m) if m.topic.as_deref().is_some_and(|t| !t.is_empty()) => {
                    Prepared::Topic(Arc::from(self.publisher.topic_of(m)))
                }
                Ok(m) => Prepared::Topic(
                    routed
                        .entry(m.aggregate_type.as_str())
                        .or_insert_with(|| Arc::from(self.publisher.topic_of(m)))
                        .clone(),
                ),
                Err(u) => Prepared::Failed(Outcome::Failed {
                    scope: Scope::Event(FailureClass::Undecodable),
                    detail: u.error.clone(),
                    alone: false,
                }),
            })
            .collect();
        let names = prepared.iter().filter_map(|p| match p {
            Prepared::Topic(t) => Some(&**t),
            Prepared::Failed(_) => None,
        });
        let problems = match self.topics.check(self.publisher.producer(), names).await {
            Ok(p) => p,
            Err(e) => {
                self.metrics.set_healthy(false);
                self.kafka.failed(&format_args!("checking topics: {e}"));
                return Err(BatchEnd::Backoff);
            }
        };
        if !problems.is_empty() {
            for p in &mut prepared {
                if let Prepared::Topic(t) = p {
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

    /// Sends the batch: retried events first, each alone, then the rest pipelined. `None` when
    /// shutdown's grace period ran out (nothing is marked; the rows are sent again later).
    async fn publish(
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
                Prepared::Topic(_) => None,
            })
            .collect();
        // Alone: nothing else is in flight, so the broker's verdict on the record batch is the
        // verdict on this event. Every row of an aggregate that failed before goes this way,
        // in `id` order, up to its first failure: a refused record batch reports its error on
        // several events, and the culprit may be any of them.
        let suspects: HashSet<(&str, &str)> = rows
            .iter()
            .filter(|r| retrying.contains_key(&r.id()))
            .map(ClaimedRow::aggregate)
            .collect();
        let mut stopped: HashSet<(&str, &str)> = HashSet::new();
        for (i, row) in rows.iter().enumerate() {
            let aggregate = row.aggregate();
            if !suspects.contains(&aggregate) {
                continue;
            }
            if stopped.contains(&aggregate) {
                known[i] = Some(Outcome::BlockedBehindFailure);
                continue;
            }
            let (Prepared::Topic(topic), Ok(message), None) =
                (&prepared[i], &row.message, &known[i])
            else {
                stopped.insert(aggregate);
                continue;
            };
            let outcome = self
                .publisher
                .publish(&[Send::Message(message, topic)], true)
                .await
                .pop()
                .unwrap_or(Outcome::BlockedBehindFailure);
            self.replace_if_fatal(&outcome);
            if !matches!(outcome, Outcome::Acked(_)) {
                stopped.insert(aggregate);
            }
            known[i] = Some(outcome);
        }
        let sends: Vec<Send<'_>> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| match (&known[i], &prepared[i], &row.message) {
                (Some(o), _, _) => Send::Known(row.aggregate(), o),
                (None, Prepared::Topic(t), Ok(m)) => Send::Message(m, t),
                (None, _, _) => unreachable!("rows without a topic or message have an outcome"),
            })
            .collect();
        let grace = async {
            shutdown.cancelled().await;
            tokio::time::sleep(self.shutdown_timeout).await;
        };
        tokio::select! {
            o = self.publisher.publish(&sends, false) => Some(o),
            _ = grace => {
                tracing::warn!(events = rows.len(), "Shutdown grace period over; abandoning in-flight events unmarked");
                None
            }
        }
    }

    fn replace_if_fatal(&mut self, outcome: &Outcome) {
        let relay_wide = matches!(
            outcome,
            Outcome::Failed {
                scope: Scope::Relay,
                ..
            }
        );
        if relay_wide || self.publisher.is_fatal() {
            self.replace_producer();
        }
    }

    fn replace_producer(&mut self) {
        tracing::info!(
            "Kafka producer stopped after a refused or failed batch; starting a new producer session and resending from the outbox"
        );
        if let Err(e) = self.publisher.replace() {
            tracing::error!(error = %e, "Could not recreate the Kafka producer");
        }
    }

    /// Marks the published rows, retrying database errors until shutdown.
    async fn mark(
        &mut self,
        rows: &[ClaimedRow],
        outcomes: &[Outcome],
        plan: &MarkPlan,
        shutdown: &CancellationToken,
    ) -> Result<(), BatchEnd> {
        if plan.mark.is_empty() {
            return Ok(());
        }
        let mut backoff = crate::relay::new_backoff();
        loop {
            match self
                .store
                .mark_published_clearing(self.token, &plan.mark, &plan.clear_failures)
                .await
            {
                Ok(Marked::Deleted(n)) => {
                    self.db.recovered();
                    self.metrics.published.inc_by(n);
                    self.observe_latency(rows, outcomes);
                    return Ok(());
                }
                Ok(Marked::LeaseLost) => {
                    tracing::warn!(events = plan.mark.len(), "Lease lost before marking; acknowledged events will be published again by the new holder");
                    return Err(BatchEnd::LeaseLost);
                }
                Err(e) => {
                    self.metrics.db_errors.inc();
                    self.db.failed(&e);
                    let wait = backoff::backoff::Backoff::next_backoff(&mut backoff)
                        .unwrap_or(Duration::from_secs(1));
                    if !crate::relay::sleep_unless(wait, shutdown).await {
                        tracing::warn!(events = plan.mark.len(), "Shutdown while the database is down; acknowledged events stay unmarked and will be sent again");
                        return Err(BatchEnd::Shutdown);
                    }
                }
            }
        }
    }

    fn observe_latency(&self, rows: &[ClaimedRow], outcomes: &[Outcome]) {
        for (row, outcome) in rows.iter().zip(outcomes) {
            if let (Outcome::Acked(at), Ok(m)) = (outcome, &row.message) {
                let secs = (*at - m.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                self.metrics.latency.observe(secs.max(0.0));
            }
        }
    }

    /// Records the failures (fenced); logs each parked event once.
    async fn record(&mut self, rows: &[ClaimedRow], plan: &MarkPlan) -> Result<(), BatchEnd> {
        if plan.record.is_empty() {
            return Ok(());
        }
        self.failures_known = true;
        let states = match self
            .store
            .record_failures(self.token, &plan.record, self.policy)
            .await
        {
            Ok(Recorded::Written(s)) => s,
            Ok(Recorded::LeaseLost) => return Err(BatchEnd::LeaseLost),
            Err(e) => {
                // Not recorded: the events are sent again next batch, which is safe; the
                // attempt simply does not count.
                return Err(self.db_failed(&e));
            }
        };
        let by_id: HashMap<i64, &ClaimedRow> = rows.iter().map(|r| (r.id(), r)).collect();
        for (failure, state) in plan.record.iter().zip(&states) {
            debug_assert_eq!(failure.id, state.id);
            let Some(row) = by_id.get(&failure.id) else {
                continue;
            };
            if state.parked {
                self.metrics
                    .parked_total
                    .with_label_values(&[failure.class.as_str()])
                    .inc();
                tracing::warn!(
                    outbox.id = row.id(),
                    event.id = %row.event_id(),
                    aggregate.type = %row.aggregate().0,
                    aggregate.id = %row.aggregate().1,
                    error.class = failure.class.as_str(),
                    error = %failure.message,
                    attempts = state.attempts,
                    "Parked an event that cannot be published; its aggregate's later events wait, every other aggregate continues (see `outbox-relay blocked`)"
                );
            } else if state.attempts == 1 {
                tracing::info!(
                    outbox.id = row.id(),
                    event.id = %row.event_id(),
                    aggregate.id = %row.aggregate().1,
                    error.class = failure.class.as_str(),
                    error = %failure.message,
                    "Event not published; retrying it with backoff while other aggregates continue"
                );
            } else {
                tracing::debug!(
                    outbox.id = row.id(),
                    attempts = state.attempts,
                    error = %failure.message,
                    "Event still not published"
                );
            }
        }
        Ok(())
    }

    fn react(&mut self, rows: &[ClaimedRow], plan: &MarkPlan) -> BatchEnd {
        for (reason, n) in &plan.failure_counts {
            self.metrics
                .publish_failures
                .with_label_values(&[reason])
                .inc_by(*n);
        }
        if plan.relay_failures > 0 || self.publisher.is_fatal() {
            self.replace_producer();
        }
        if plan.relay_failures == 0 {
            self.kafka.recovered();
            self.publisher.context().mark_broker_up();
            self.metrics.set_healthy(!self.db.is_failing());
        }
        if plan.relay_failures > 0 && plan.mark.is_empty() {
            // Nothing got through and the producer itself failed: not a per-event problem.
            self.kafka.failed(&format_args!(
                "{} of {} events not published (producer failure)",
                plan.relay_failures,
                rows.len()
            ));
            self.metrics.set_healthy(false);
            return BatchEnd::Backoff;
        }
        BatchEnd::Done {
            clean: plan.is_clean(),
        }
    }
}

/// A claimed row before publishing.
enum Prepared {
    /// Goes to this topic.
    Topic(Arc<str>),
    /// Not sent.
    Failed(Outcome),
}
