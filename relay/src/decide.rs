//! The per-row decision of a batch: given what happened to each claimed row, which rows are
//! marked published, which failures are recorded (retry or park), and which rows simply wait.
//!
//! The rule that keeps each aggregate in `id` order: once a row of an aggregate is not
//! published in this batch — it failed, or it was not sent — no later row of that aggregate
//! is marked, even if the broker acknowledged it (it is sent again after the earlier one).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::failure::{FailureClass, Scope};
use crate::parking::NewFailure;
use crate::store::ClaimedRow;

/// What happened to one claimed row in this batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker acknowledged it at this time.
    Acked(DateTime<Utc>),
    /// It failed.
    Failed {
        /// What it holds back.
        scope: Scope,
        /// The error text.
        detail: String,
        /// True when it was the only message in flight (its failure is its own).
        alone: bool,
    },
    /// Not sent: an earlier row of its aggregate is not published.
    BlockedBehindFailure,
}

/// The decision for one batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MarkPlan {
    /// Rows to mark published, in `id` order.
    pub mark: Vec<i64>,
    /// Rows of `mark` that have a failure record to delete.
    pub clear_failures: Vec<i64>,
    /// Failures to record.
    pub record: Vec<NewFailure>,
    /// Rows that failed for a reason of the producer as a whole.
    pub relay_failures: usize,
    /// Acknowledged or unsent rows that wait behind an earlier row of their aggregate.
    pub blocked_behind: usize,
    /// Failed rows by metric label.
    pub failure_counts: BTreeMap<&'static str, u64>,
}

impl MarkPlan {
    /// True when nothing went wrong.
    pub fn is_clean(&self) -> bool {
        self.record.is_empty() && self.relay_failures == 0 && self.blocked_behind == 0
    }
}

/// Decides a batch. `rows` and `outcomes` are in claim (`id`) order; `retrying` has the rows
/// that failed in an earlier batch.
pub fn decide(rows: &[ClaimedRow], outcomes: &[Outcome], retrying: &HashMap<i64, i32>) -> MarkPlan {
    debug_assert_eq!(rows.len(), outcomes.len());
    let mut plan = MarkPlan::default();
    let mut stopped: HashSet<(&str, &str)> = HashSet::new();
    for (row, outcome) in rows.iter().zip(outcomes) {
        let aggregate = row.aggregate();
        if !stopped.is_empty() && stopped.contains(&aggregate) {
            plan.blocked_behind += 1;
            *plan.failure_counts.entry("blocked_behind").or_default() += 1;
            continue;
        }
        match outcome {
            Outcome::Acked(_) => {
                plan.mark.push(row.id());
                if !retrying.is_empty() && retrying.contains_key(&row.id()) {
                    plan.clear_failures.push(row.id());
                }
                continue;
            }
            Outcome::BlockedBehindFailure => {
                plan.blocked_behind += 1;
                *plan.failure_counts.entry("blocked_behind").or_default() += 1;
            }
            Outcome::Failed {
                scope: Scope::Relay,
                ..
            } => {
                plan.relay_failures += 1;
                *plan.failure_counts.entry("producer").or_default() += 1;
            }
            Outcome::Failed {
                scope: Scope::Event(class),
                detail,
                alone,
            } => {
                *plan.failure_counts.entry(class.as_str()).or_default() += 1;
                plan.record.push(failure(row, *class, detail, *alone));
            }
        }
        stopped.insert(aggregate);
    }
    plan
}

/// A batch-wide broker refusal is judged only when the event was sent alone: before that, it
/// may be another message's fault, so it is retried at once (alone) without parking.
fn failure(row: &ClaimedRow, class: FailureClass, detail: &str, alone: bool) -> NewFailure {
    let suspect = class.is_batch_wide() && !alone;
    let (aggregate_type, aggregate_id) = row.aggregate();
    NewFailure {
        id: row.id(),
        event_id: row.event_id(),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        class,
        message: detail.to_owned(),
        park: class.is_permanent() || (class.is_batch_wide() && alone),
        retry_now: suspect,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn row(id: i64, agg: &str) -> ClaimedRow {
        ClaimedRow {
            attempts: None,
            bytes: 0,
            message: Err(Box::new(crate::store::Undecodable {
                id,
                event_id: Uuid::new_v4(),
                aggregate_type: "order".into(),
                aggregate_id: agg.into(),
                error: "not needed here".into(),
            })),
        }
    }

    fn acked() -> Outcome {
        Outcome::Acked(Utc::now())
    }

    fn failed(class: FailureClass, alone: bool) -> Outcome {
        Outcome::Failed {
            scope: Scope::Event(class),
            detail: "boom".into(),
            alone,
        }
    }

    #[test]
    fn a_failure_stops_later_rows_of_its_aggregate_only() {
        let rows = [
            row(1, "a"),
            row(2, "b"),
            row(3, "a"),
            row(4, "b"),
            row(5, "c"),
        ];
        let outcomes = [
            acked(),
            failed(FailureClass::Delivery, false),
            acked(),
            acked(),
            acked(),
        ];
        let plan = decide(&rows, &outcomes, &HashMap::new());
        assert_eq!(plan.mark, vec![1, 3, 5]);
        assert_eq!(plan.record.len(), 1);
        assert_eq!(plan.record[0].id, 2);
        assert!(!plan.record[0].park, "delivery errors are retried first");
        assert_eq!(plan.blocked_behind, 1, "b's 4 waits although acknowledged");
        assert_eq!(
            plan.failure_counts.into_iter().collect::<Vec<_>>(),
            vec![("blocked_behind", 1), ("delivery", 1)]
        );
    }

    #[test]
    fn hopeless_events_park_at_once() {
        let rows = [row(1, "a"), row(2, "b"), row(3, "c")];
        let outcomes = [
            failed(FailureClass::Undecodable, false),
            failed(FailureClass::InvalidTopic, false),
            failed(FailureClass::Refused, false),
        ];
        let plan = decide(&rows, &outcomes, &HashMap::new());
        assert!(plan.record.iter().all(|f| f.park && !f.retry_now));
        assert!(plan.mark.is_empty());
    }

    #[test]
    fn a_batch_wide_refusal_is_retried_alone_before_parking() {
        let rows = [row(1, "a"), row(2, "b")];
        let plan = decide(
            &rows,
            &[failed(FailureClass::BrokerRejected, false), acked()],
            &HashMap::new(),
        );
        assert!(!plan.record[0].park && plan.record[0].retry_now, "suspect");
        let plan = decide(
            &rows,
            &[failed(FailureClass::BrokerRejected, true), acked()],
            &HashMap::new(),
        );
        assert!(plan.record[0].park, "refused alone: its own fault");
    }

    #[test]
    fn producer_failures_record_nothing_but_stop_the_aggregate() {
        let rows = [row(1, "a"), row(2, "a"), row(3, "b")];
        let outcomes = [
            Outcome::Failed {
                scope: Scope::Relay,
                detail: "fatal".into(),
                alone: false,
            },
            acked(),
            acked(),
        ];
        let plan = decide(&rows, &outcomes, &HashMap::new());
        assert!(plan.record.is_empty());
        assert_eq!(plan.relay_failures, 1);
        assert_eq!(plan.mark, vec![3]);
        assert!(!plan.is_clean());
    }

    #[test]
    fn a_retried_event_that_succeeds_clears_its_failure_record() {
        let rows = [row(7, "a"), row(8, "a")];
        let retrying = HashMap::from([(7, 3)]);
        let plan = decide(&rows, &[acked(), acked()], &retrying);
        assert_eq!(plan.mark, vec![7, 8]);
        assert_eq!(plan.clear_failures, vec![7]);
        assert!(plan.is_clean());
    }

    #[test]
    fn unsent_rows_wait_and_stop_their_aggregate() {
        let rows = [row(1, "a"), row(2, "a")];
        let plan = decide(
            &rows,
            &[Outcome::BlockedBehindFailure, acked()],
            &HashMap::new(),
        );
        assert!(plan.mark.is_empty());
        assert_eq!(plan.blocked_behind, 2);
    }
}
