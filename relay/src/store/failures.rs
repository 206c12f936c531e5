//! Failures as the store sees them: how a claim leaves out the aggregates held back by a failed
//! or parked event (`outbox_failure`), and the retention of the audit table of discarded events
//! (`outbox_discarded`). The failure records themselves are written by
//! [`Store::record_failures`](crate::store::Store::record_failures) (`parking`).

use std::time::Duration;

/// How a claim leaves out the aggregates held back by `outbox_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureFilter {
    /// Not at all. Only a caller that knows the table is empty (the leader, which is the only
    /// writer of failures) may choose it.
    Off,
    /// Hashed subplans over the failure table, built per claim: the cheapest per row while the
    /// failure table is small ([`SMALL_FAILURE_TABLE`] rows or fewer).
    Hashed,
    /// An index probe of `outbox_failure` per outbox row read: cost per row that does not grow
    /// with the failure table.
    /// A hashed `NOT IN` over 100 000 failure rows no longer fits `work_mem`, and PostgreSQL
    /// then scans the failure table once per outbox row (a claim of 2 000 rows took more
    /// than a minute).
    Probed,
}

/// Largest failure table (rows) for which claims use [`FailureFilter::Hashed`].
pub const SMALL_FAILURE_TABLE: i64 = 5_000;

/// The pieces of a claim's SQL that leave out held-back aggregates, for one [`FailureFilter`].
pub(super) struct FailureClauses {
    /// Joins the row's own failure record (for its attempts).
    pub(super) join: &'static str,
    /// The condition that leaves out aggregates held back by a failure.
    pub(super) exclusion: &'static str,
    /// The claimed row's attempts so far.
    pub(super) attempts: &'static str,
}

impl FailureFilter {
    /// This filter's pieces of the claim's SQL.
    pub(super) fn clauses(self) -> FailureClauses {
        match self {
            Self::Off => FailureClauses {
                join: "",
                exclusion: "",
                attempts: "NULL::int4",
            },
            // Two hashed subplans over the (small) failure table, probed per row.
            Self::Hashed => FailureClauses {
                join: "LEFT JOIN outbox_failure f ON f.outbox_id = o.id",
                exclusion: "AND ((o.aggregate_type, o.aggregate_id) NOT IN ( \
                          SELECT x.aggregate_type, x.aggregate_id FROM outbox_failure x) \
                      OR o.id IN (SELECT x.outbox_id FROM outbox_failure x \
                          WHERE x.parked_at IS NULL AND x.retry_at <= now()))",
                attempts: "f.attempts",
            },
            // `OFFSET 0` keeps the EXISTS a per-row subplan on the aggregate index: as a join,
            // PostgreSQL would hash both tables whole, then sort.
            Self::Probed => FailureClauses {
                join: "LEFT JOIN outbox_failure f ON f.outbox_id = o.id",
                exclusion: "AND NOT EXISTS (SELECT 1 FROM outbox_failure x \
                     WHERE x.aggregate_type = o.aggregate_type AND x.aggregate_id = o.aggregate_id \
                       AND (x.parked_at IS NOT NULL OR x.retry_at > now() OR x.outbox_id < o.id) \
                     OFFSET 0)",
                attempts: "f.attempts",
            },
        }
    }
}

/// The retention rule of the `outbox_discarded` audit table.
pub fn discarded_rule(window: Duration) -> outbox_process::retention::RetentionRule {
    outbox_process::retention::RetentionRule {
        table: "outbox_discarded",
        time_column: "discarded_at",
        scope: None,
        window,
    }
}
