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
//!
//! [`Batcher::run`] is the batch as those steps; the steps live beside it: `claim` (the
//! failure filter, the claim and the prefetch of the next batch), `publish` (prepare and
//! publish, the lone sends) and `mark` (mark, record).

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::decide::{decide, MarkPlan};
use crate::lease::LeaseGuard;
use crate::metrics::{BatchStage, Metrics};
use crate::outage::Outage;
use crate::parking::ParkPolicy;
use crate::publisher::Publisher;
use crate::store::{
    ClaimLimits, ClaimedBatch, ClaimedRow, FailureFilter, IdRange, LeaseToken, Store,
};
use crate::topics::TopicCatalog;

mod claim;
mod floor;
mod init;
mod mark;
mod publish;
mod settle;

pub use claim::Prefetched;
pub use floor::{ClaimFloor, CANDIDATE_EVERY};
pub use publish::LONE_SENDS_PER_BATCH;
pub use settle::Settle;

use claim::Claimed;

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
    /// The lease this term holds, renewed in the background (a producer's initialisation
    /// renews it too, under its lock: see `init`).
    pub guard: &'a LeaseGuard,
    /// The producer (replaced after fatal errors).
    pub publisher: &'a mut Publisher,
    /// The producer of lone sends (see `Batcher::publish`); replaced on its own.
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
    /// Batches run in this term (the current one's number, in the producer replacement's log
    /// line).
    pub batches: u64,
    /// The current batch has started a new producer session already: a batch replaces its
    /// producer once, whichever step saw the failure.
    pub replaced: bool,
    /// Where claims start while failures hold events back (see [`ClaimFloor`]).
    pub floor: ClaimFloor,
    /// With transactions: where the bucket's records are ([`crate::records`]).
    pub records: Option<Settle>,
    /// The bucket must be settled from its records before the next claim (at the start of a
    /// term, and after a transaction ended without the relay knowing whether it committed).
    pub unsettled: bool,
    /// The last batch was full (as many rows as asked, or cut by the byte bound): more is
    /// waiting, and the next batch starts at once whatever `--min-batch-interval-ms` says.
    pub full: bool,
    /// When the lone producer was last needed (see [`Batcher::retire_idle_lone`]).
    pub lone_used: Instant,
}

/// How long the lone producer's session outlives its last use, at least: see
/// [`Batcher::retire_idle_lone`].
pub const LONE_IDLE: Duration = Duration::from_secs(30);

impl Batcher<'_> {
    /// Runs one batch.
    pub async fn run(&mut self, shutdown: &CancellationToken) -> BatchEnd {
        let started = Instant::now();
        self.batches += 1;
        self.replaced = false;
        self.full = false;
        if let Err(end) = self.settle_if_needed().await {
            return end;
        }
        let prefetched = self.prefetched.take();
        let asked = self.row_limit;
        let filter = match self.failure_filter().await {
            Ok(r) => r,
            Err(end) => return end,
        };
        let claimed = match prefetched {
            Some(p) if filter == FailureFilter::Off => {
                self.floor.reset();
                self.below(p).await
            }
            Some(_) => {
                self.ahead("dropped");
                self.claim_from_head(filter).await
            }
            None => self.claim_from_head(filter).await,
        };
        let Claimed {
            rows,
            retrying,
            cut,
        } = match claimed {
            Ok(c) if c.rows.is_empty() => {
                self.floor.batch_ended(None);
                return BatchEnd::Empty;
            }
            Ok(c) => c,
            Err(end) => return end,
        };
        // A full batch (or one the byte bound cut) means more is waiting: claimed while this
        // one is in flight, and not paced, however this one ends.
        let full = cut || rows.len() as i64 >= asked;
        self.full = full;
        self.metrics.batch_size.observe(rows.len() as f64);
        self.metrics
            .observe_stage(BatchStage::Claim, started.elapsed());
        let publishing = Instant::now();
        let prepared = match self.prepare(&rows).await {
            Ok(p) => p,
            Err(end) => return end,
        };
        // A new producer session (the first, or one replaced after a failure) is initialised
        // here, under the lease, never by the send itself.
        if let Err(end) = self.initialise(!retrying.is_empty()).await {
            return end;
        }
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
        if let Some(why) = self.unwritable_cluster(&rows, &prepared, &outcomes) {
            // The rows stay as they are: sent again once the cluster takes writes.
            self.metrics.set_healthy(false);
            self.kafka.failed(&why);
            if let Some(Ok(ClaimedBatch::Rows(rows, _))) = &next {
                if !rows.is_empty() {
                    self.ahead("dropped");
                }
            }
            return BatchEnd::Backoff;
        }
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
        let marked: std::collections::HashSet<i64> = plan.mark.iter().copied().collect();
        self.floor.batch_ended(
            rows.iter()
                .map(ClaimedRow::id)
                .filter(|id| !marked.contains(id))
                .min(),
        );
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

    /// Ends the lone producer's session once it went unused for twice the longest delay
    /// between two retries of an event (and at least [`LONE_IDLE`]): most of the time no event
    /// is being retried alone, and an idle session still costs its librdkafka threads'
    /// wake-ups (each at least once a second) and its connections, while an event being
    /// retried keeps it (a new session is initialised before its batch sends anything). The
    /// next retry starts a new session, initialised under the lease like any (`init`); the
    /// relay that takes a bucket over initialises the lone id at once all the same, fencing
    /// the previous holder's lone producer.
    pub fn retire_idle_lone(&mut self) {
        let idle = LONE_IDLE.max(self.policy.max_delay.saturating_mul(2));
        if self.lone.has_session() && self.lone_used.elapsed() >= idle {
            tracing::debug!("Retiring the lone Kafka producer's session, unused for a while");
            self.lone.retire_session();
        }
    }

    fn db_failed(&mut self, e: &sqlx::Error) -> BatchEnd {
        self.metrics.db_errors.inc();
        self.metrics.set_healthy(false);
        self.db.failed(e);
        BatchEnd::Backoff
    }

    fn react(&mut self, rows: &[ClaimedRow], plan: &MarkPlan) -> BatchEnd {
        for (reason, n) in &plan.failure_counts {
            self.metrics
                .publish_failures
                .with_label_values(&[reason])
                .inc_by(*n);
        }
        // Producer-scope failures end the session, unless the publish step started a new one
        // already (a fatal error seen there).
        if self.publisher.must_replace() || (plan.relay_failures > 0 && !self.replaced) {
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
