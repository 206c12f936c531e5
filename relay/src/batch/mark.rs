//! The mark and record steps, once the broker answered: the published rows deleted (fenced,
//! retried while the database is down), their latency observed, the failures recorded (fenced)
//! and each parked event logged once.

use std::collections::HashMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{BatchEnd, Batcher};
use crate::decide::{MarkPlan, Outcome};
use crate::parking::Recorded;
use crate::store::{ClaimedRow, Marked};

impl Batcher<'_> {
    /// Marks the published rows, retrying database errors until shutdown.
    pub(super) async fn mark(
        &mut self,
        rows: &[ClaimedRow],
        outcomes: &[Outcome],
        plan: &MarkPlan,
        shutdown: &CancellationToken,
    ) -> Result<(), BatchEnd> {
        // With records: every id the bucket's producers committed since the last mark, the
        // offset of their last record stored with them.
        let (main, main_record) = self.publisher.unmarked();
        let (lone, lone_record) = self.lone.unmarked();
        let record = main_record.max(lone_record);
        let mut ids = plan.mark.clone();
        if record.is_some() {
            ids.extend(main);
            ids.extend(lone);
            ids.sort_unstable();
            ids.dedup();
        }
        if ids.is_empty() {
            return Ok(());
        }
        let mut backoff = crate::retry::new_backoff();
        loop {
            match self
                .store
                .mark_published_clearing(self.token, &ids, &plan.clear_failures, record)
                .await
            {
                Ok(Marked::Deleted(n)) => {
                    self.publisher.marked();
                    self.lone.marked();
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
    pub(super) async fn record(
        &mut self,
        rows: &[ClaimedRow],
        plan: &MarkPlan,
    ) -> Result<(), BatchEnd> {
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
}
