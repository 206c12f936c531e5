//! The claim step: how the claim leaves out held-back aggregates, the claim itself, and the
//! next batch claimed ahead while this one is in flight ([`Prefetched`]), with the rows that
//! committed below it.

use std::collections::HashMap;

use super::{BatchEnd, Batcher};
use crate::store::{ClaimLimits, ClaimedBatch, ClaimedRow, FailureFilter, IdRange};

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
    pub(super) rows: Vec<ClaimedRow>,
    pub(super) cut: bool,
}

/// The rows of a batch as claimed.
pub(super) struct Claimed {
    pub(super) rows: Vec<ClaimedRow>,
    /// The attempts so far of the rows that failed before.
    pub(super) retrying: HashMap<i64, i32>,
    /// The byte bound cut the batch short.
    pub(super) cut: bool,
}

impl Batcher<'_> {
    /// The rows below a prefetched batch, then the batch (see [`Prefetched`]).
    pub(super) async fn below(&mut self, prefetched: Prefetched) -> Result<Claimed, BatchEnd> {
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

    /// Counts a batch claimed ahead by what became of it (`sent` or `dropped`).
    pub(super) fn ahead(&self, outcome: &str) {
        self.metrics
            .claimed_ahead
            .with_label_values(&[outcome])
            .inc();
    }

    /// How the claim leaves out the events held back by a failure.
    pub(super) async fn failure_filter(&mut self) -> Result<FailureFilter, BatchEnd> {
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

    /// Claims from the outbox's head: above the term's floor while failures hold events back
    /// and the failure table is small (see [`super::floor`]), else as [`Batcher::claim`].
    pub(super) async fn claim_from_head(
        &mut self,
        filter: FailureFilter,
    ) -> Result<Claimed, BatchEnd> {
        if filter != FailureFilter::Hashed {
            self.floor.reset();
            return self.claim(filter, IdRange::ALL).await;
        }
        let asked = self.row_limit;
        let claimed = self
            .store
            .claim_above(self.token, asked, self.limits.bytes, self.floor.query())
            .await;
        let (rows, cut, seen) = match claimed {
            Ok((ClaimedBatch::Rows(rows, cut), seen)) => (rows, cut, seen),
            Ok((ClaimedBatch::LeaseLost, _)) => return Err(BatchEnd::LeaseLost),
            Err(e) => return Err(self.db_failed(&e)),
        };
        let full = cut || rows.len() as i64 >= asked;
        let last = rows.iter().map(ClaimedRow::id).max();
        if let Some(upto) = self.floor.claimed(&seen, last, full) {
            // Taken after the claim's snapshot: later than every transaction that could still
            // commit a row at or below `upto`. Without it there is no candidate this time.
            if let Ok(xid) = self.store.new_transaction_id().await {
                self.floor.noted(upto, xid);
            }
        }
        self.claimed(rows, cut)
    }

    /// Claims the next rows; with them, the attempts so far of those that failed before.
    pub(super) async fn claim(
        &mut self,
        filter: FailureFilter,
        ids: IdRange,
    ) -> Result<Claimed, BatchEnd> {
        let limits = ClaimLimits {
            failures: filter,
            rows: self.row_limit,
            ids,
            ..self.limits
        };
        match self.store.claim(self.token, limits).await {
            Ok(ClaimedBatch::Rows(rows, cut)) => self.claimed(rows, cut),
            Ok(ClaimedBatch::LeaseLost) => Err(BatchEnd::LeaseLost),
            Err(e) => Err(self.db_failed(&e)),
        }
    }

    /// The claimed rows, with the attempts so far of those that failed before.
    fn claimed(&mut self, rows: Vec<ClaimedRow>, cut: bool) -> Result<Claimed, BatchEnd> {
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

    /// Large events: ask for about twice what fit next time, so PostgreSQL renders few rows
    /// the byte bound drops; back to the full batch once it fits.
    pub(super) fn set_row_limit(&mut self, claimed: usize, cut: bool) {
        self.row_limit = if cut {
            (claimed as i64 * 2).clamp(1, self.limits.rows)
        } else {
            self.limits.rows
        };
    }
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
