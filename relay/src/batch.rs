//! One batch of the active relay, as its steps:
//!
//! 1. **claim** the head of the outbox in `id` order (fenced by the lease), leaving out the
//!    events that wait behind a failed or parked event of their aggregate;
//! 2. **prepare**: rows that cannot become a message (undecodable, a topic that is invalid,
//!    missing or refused) fail here, without being sent;
//! 3. **publish**: everything pipelined on the relay's producer; beside it, the failed events
//!    due for a retry, each alone on a second producer, so a broker refusal of a whole record
//!    batch is pinned on the right event and never stops the healthy events' producer;
//! 4. **decide** per row ([`crate::decide`]): mark, record a failure (retry or park), or wait;
//! 5. **mark** the published rows (fenced), **record** the failures (fenced);
//! 6. **react**: metrics, logs, replacing a fatal producer, backing off on outages.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::decide::{decide, MarkPlan, Outcome};
use crate::failure::{FailureClass, Scope};
use crate::metrics::{BatchStage, Metrics};
use crate::outage::Outage;
use crate::parking::{ParkPolicy, Recorded};
use crate::publisher::{Publisher, Send};
use crate::store::{
    ClaimLimits, ClaimedBatch, ClaimedRow, FailureFilter, IdRange, LeaseToken, Marked, Store,
};
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
    /// The producer of lone sends (see [`Batcher::publish`]); replaced on its own.
    pub lone: &'a mut Publisher,
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
    /// The next batch, claimed while the last one was in flight (see [`Prefetched`]).
    pub prefetched: Option<Prefetched>,
}

/// Rows claimed past the batch in flight (`id` above its last), while its acknowledgements
/// were awaited: the claim's time in PostgreSQL and in the relay overlaps the broker's.
///
/// Used only after that batch ended clean (every row marked) with the failure table empty.
/// Before it is sent, the rows below its first `id` are claimed again (`below`): a row that
/// committed after the prefetch with a lower `id` than some of its rows (another writer's
/// transaction that took its `id` earlier and committed later). Those rows go first, in `id`
/// order; when they fill a batch by themselves the prefetched rows are dropped (claimed again
/// later), so no row is ever sent before a lower row that was left out. A row committed late
/// inside the prefetched range is of an aggregate with no row in it (the per-aggregate insert
/// lock orders one aggregate's `id`s as its commits), and comes with the next batch.
#[derive(Debug)]
pub struct Prefetched {
    rows: Vec<ClaimedRow>,
    cut: bool,
}

impl Batcher<'_> {
    /// Runs one batch.
    pub async fn run(&mut self, shutdown: &CancellationToken) -> BatchEnd {
        let started = Instant::now();
        let prefetched = self.prefetched.take();
        let asked = self.row_limit;
        let filter = match self.failure_filter().await {
            Ok(r) => r,
            Err(end) => return end,
        };
        let claimed = match prefetched {
            Some(p) if filter == FailureFilter::Off => self.below(p).await,
            Some(_) => {
                self.ahead("dropped");
                self.claim(filter, IdRange::ALL).await
            }
            None => self.claim(filter, IdRange::ALL).await,
        };
        let Claimed {
            rows,
            retrying,
            cut,
        } = match claimed {
            Ok(c) if c.rows.is_empty() => return BatchEnd::Empty,
            Ok(c) => c,
            Err(end) => return end,
        };
        self.metrics.batch_size.observe(rows.len() as f64);
        self.metrics
            .observe_stage(BatchStage::Claim, started.elapsed());
        let publishing = Instant::now();
        let prepared = match self.prepare(&rows).await {
            Ok(p) => p,
            Err(end) => return end,
        };
        // A full batch (or one the byte bound cut) means more is waiting: claim it while this
        // one is in flight.
        let full = cut || rows.len() as i64 >= asked;
        let prefetch = (filter == FailureFilter::Off && full)
            .then(|| rows.last().map(ClaimedRow::id))
            .flatten();
        let (store, token) = (self.store, self.token);
        let next_limits = ClaimLimits {
            failures: FailureFilter::Off,
            rows: self.row_limit,
            ids: IdRange {
                after: prefetch,
                before: None,
            },
            ..self.limits
        };
        let metrics = self.metrics;
        let next = async {
            let claiming = Instant::now();
            let next = match prefetch {
                Some(_) => Some(store.claim(token, next_limits).await),
                None => None,
            };
            if next.is_some() {
                // A claim too: it can outlast the publish, which then waits for it.
                metrics.observe_stage(BatchStage::Claim, claiming.elapsed());
            }
            next
        };
        let publish = async {
            let outcomes = self.publish(&rows, &prepared, &retrying, shutdown).await;
            if outcomes.is_some() {
                metrics.observe_stage(BatchStage::Publish, publishing.elapsed());
            }
            outcomes
        };
        let (outcomes, next) = tokio::join!(publish, next);
        let Some(outcomes) = outcomes else {
            return BatchEnd::Shutdown;
        };
        let marking = Instant::now();
        let plan = decide(&rows, &outcomes, &retrying);
        if let Err(end) = self.mark(&rows, &outcomes, &plan, shutdown).await {
            return end;
        }
        if let Err(end) = self.record(&rows, &plan).await {
            return end;
        }
        if !(plan.mark.is_empty() && plan.record.is_empty()) {
            // Nothing to write (a broker outage's batch) is no time of PostgreSQL's.
            self.metrics
                .observe_stage(BatchStage::Mark, marking.elapsed());
        }
        let end = self.react(&rows, &plan);
        // A failed prefetch is simply not used: the next batch claims from the head.
        if let Some(Ok(ClaimedBatch::Rows(rows, cut))) = next {
            if rows.is_empty() {
                return end;
            }
            if end == (BatchEnd::Done { clean: true }) {
                self.prefetched = Some(Prefetched { rows, cut });
            } else {
                self.ahead("dropped");
            }
        }
        end
    }

    /// The rows below a prefetched batch, then the batch (see [`Prefetched`]).
    async fn below(&mut self, prefetched: Prefetched) -> Result<Claimed, BatchEnd> {
        let first = prefetched.rows.first().map(ClaimedRow::id);
        let limit = self.row_limit;
        let mut head = self
            .claim(
                FailureFilter::Off,
                IdRange {
                    after: None,
                    before: first,
                },
            )
            .await?;
        self.metrics.late_rows.inc_by(head.rows.len() as u64);
        if head.cut || head.rows.len() as i64 >= limit {
            // A batch by itself.
            self.ahead("dropped");
            return Ok(head);
        }
        self.ahead("sent");
        let taken = fitting(&head.rows, &prefetched.rows, limit, self.limits.bytes);
        let mut more = prefetched.rows;
        head.cut = prefetched.cut || taken < more.len();
        more.truncate(taken);
        head.rows.extend(more);
        self.set_row_limit(head.rows.len(), head.cut);
        Ok(head)
    }

    fn ahead(&self, outcome: &str) {
        self.metrics
            .claimed_ahead
            .with_label_values(&[outcome])
            .inc();
    }

    /// How the claim leaves out the events held back by a failure.
    async fn failure_filter(&mut self) -> Result<FailureFilter, BatchEnd> {
        if !self.failures_known {
            return Ok(FailureFilter::Off);
        }
        match self.store.failure_view().await {
            Ok(view) => {
                self.failures_known = view.any;
                Ok(match (view.any, view.large) {
                    (false, _) => FailureFilter::Off,
                    (true, false) => FailureFilter::Hashed,
                    (true, true) => FailureFilter::Probed,
                })
            }
            Err(e) => Err(self.db_failed(&e)),
        }
    }

    /// Claims the next rows; with them, the attempts so far of those that failed before.
    async fn claim(&mut self, filter: FailureFilter, ids: IdRange) -> Result<Claimed, BatchEnd> {
        let limits = ClaimLimits {
            failures: filter,
            rows: self.row_limit,
            ids,
            ..self.limits
        };
        match self.store.claim(self.token, limits).await {
            Ok(ClaimedBatch::Rows(rows, cut)) => {
                self.set_row_limit(rows.len(), cut);
                self.db.recovered();
                self.metrics.set_healthy(!self.kafka.is_failing());
                let retrying = rows
                    .iter()
                    .filter_map(|r| Some((r.id(), r.attempts?)))
                    .collect();
                Ok(Claimed {
                    rows,
                    retrying,
                    cut,
                })
            }
            Ok(ClaimedBatch::LeaseLost) => Err(BatchEnd::LeaseLost),
            Err(e) => Err(self.db_failed(&e)),
        }
    }

    /// Large events: ask for about twice what fit next time, so PostgreSQL renders few rows
    /// the byte bound drops; back to the full batch once it fits.
    fn set_row_limit(&mut self, claimed: usize, cut: bool) {
        self.row_limit = if cut {
            (claimed as i64 * 2).clamp(1, self.limits.rows)
        } else {
            self.limits.rows
        };
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
                (None, Prepared::Topic(t), Ok(m)) => Send::Message(m, t),
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
                let (Prepared::Topic(topic), Ok(message)) = (&prepared[i], &rows[i].message) else {
                    continue;
                };
                tracing::debug!(outbox.id = message.id, event.id = %message.event_id, "Sending an event alone (retried after a failure)");
                let outcome = lone_publisher
                    .publish(&[Send::Message(message, topic)], true)
                    .await
                    .pop()
                    .unwrap_or(Outcome::BlockedBehindFailure);
                if lone_publisher.is_fatal() {
                    // A refused record batch stops the producer (gapless guarantee): only the
                    // lone one, the healthy events' producer goes on.
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
        if self.publisher.is_fatal() {
            self.replace_producer();
        }
        Some(outcomes)
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
        let mut backoff = crate::retry::new_backoff();
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
                    if !crate::retry::sleep_unless(wait, shutdown).await {
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
        // Paired by id: the statement returns its rows in no promised order.
        let by_id: HashMap<i64, &ClaimedRow> = rows.iter().map(|r| (r.id(), r)).collect();
        let failures: HashMap<i64, &crate::parking::NewFailure> =
            plan.record.iter().map(|f| (f.id, f)).collect();
        for state in &states {
            let (Some(row), Some(failure)) = (by_id.get(&state.id), failures.get(&state.id)) else {
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

/// Most events a batch sends alone (see [`Batcher::publish`]).
pub const LONE_SENDS_PER_BATCH: usize = 16;

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

/// How many of `more` fit after `head` in one batch of at most `rows` rows and about `bytes`
/// bytes, counted as the claim counts them (a row is taken while the bytes before it are under
/// the bound).
fn fitting(head: &[ClaimedRow], more: &[ClaimedRow], rows: i64, bytes: i64) -> usize {
    let room = usize::try_from(rows)
        .unwrap_or(0)
        .saturating_sub(head.len());
    let mut total: i64 = head.iter().map(|r| r.bytes).sum();
    more.iter()
        .take(room)
        .take_while(|r| {
            let under = total < bytes;
            total += r.bytes;
            under
        })
        .count()
}

/// The rows of a batch as claimed.
struct Claimed {
    rows: Vec<ClaimedRow>,
    /// The attempts so far of the rows that failed before.
    retrying: HashMap<i64, i32>,
    /// The byte bound cut the batch short.
    cut: bool,
}

/// A claimed row before publishing.
enum Prepared {
    /// Goes to this topic.
    Topic(Arc<str>),
    /// Not sent.
    Failed(Outcome),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Undecodable;
    use uuid::Uuid;

    fn row(id: i64, bytes: i64) -> ClaimedRow {
        ClaimedRow {
            attempts: None,
            bytes,
            message: Err(Box::new(Undecodable {
                id,
                event_id: Uuid::new_v4(),
                aggregate_type: "order".into(),
                aggregate_id: "a".into(),
                error: "not needed here".into(),
            })),
        }
    }

    #[test]
    fn prefetched_rows_fill_the_room_the_late_rows_leave() {
        let head = [row(1, 10), row(3, 10)];
        let more: Vec<_> = (0..10).map(|i| row(100 + i, 10)).collect();
        assert_eq!(fitting(&head, &more, 5, 1 << 20), 3);
        assert_eq!(fitting(&[], &more, 5, 1 << 20), 5);
        assert_eq!(fitting(&head, &more, 2, 1 << 20), 0);
        assert_eq!(fitting(&head, &more[..1], 100, 1 << 20), 1);
    }

    #[test]
    fn prefetched_rows_stop_at_the_byte_bound_as_the_claim_does() {
        // 20 bytes of late rows, a bound of 45: rows are taken while the bytes before them are
        // under it (20, 30, 40 → three more, the last one crossing it).
        let head = [row(1, 10), row(3, 10)];
        let more: Vec<_> = (0..10).map(|i| row(100 + i, 10)).collect();
        assert_eq!(fitting(&head, &more, 100, 45), 3);
        // Late rows already over the bound leave no room.
        assert_eq!(fitting(&[row(1, 50)], &more, 100, 45), 0);
        // A batch of prefetched rows alone takes its first row whatever its size.
        assert_eq!(fitting(&[], &[row(9, 1000), row(11, 1)], 100, 45), 1);
    }
}
