//! Durable failure records and parking (`outbox_failure`, `outbox_discarded`): what the relay
//! records to hold an aggregate back behind a failed event, how failures turn into retries and
//! parking, and what the operator's commands (`blocked`, `redrive`, `discard`) select and
//! report. The SQL that reads and writes them, and how a failure row holds its aggregate back,
//! are the [`Store`](crate::store::Store)'s (`store/parking.rs`).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::failure::FailureClass;

/// The failure table as the next claim needs it
/// ([`Store::failure_view`](crate::store::Store::failure_view)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureView {
    /// Any failure row exists (parked or retrying).
    pub any: bool,
    /// More than [`SMALL_FAILURE_TABLE`](crate::store::SMALL_FAILURE_TABLE) rows.
    pub large: bool,
}

/// A failure to record for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFailure {
    /// Outbox id.
    pub id: i64,
    /// Event id.
    pub event_id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// What went wrong.
    pub class: FailureClass,
    /// The error text.
    pub message: String,
    /// Park now, whatever the attempt count (the event can never be sent as it is).
    pub park: bool,
    /// Retry at once (alone) instead of after the backoff delay.
    pub retry_now: bool,
}

/// How failures turn into retries and parking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkPolicy {
    /// Attempts after which a retried event is parked.
    pub park_after: i32,
    /// Delay after the first failure; doubles per attempt.
    pub first_delay: Duration,
    /// Longest delay between attempts.
    pub max_delay: Duration,
}

impl Default for ParkPolicy {
    fn default() -> Self {
        Self {
            park_after: 10,
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
        }
    }
}

/// The state of one event after recording a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureState {
    /// Outbox id.
    pub id: i64,
    /// Attempts so far.
    pub attempts: i32,
    /// True when the event is now parked.
    pub parked: bool,
}

/// Result of [`Store::record_failures`](crate::store::Store::record_failures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Written; the state of each event.
    Written(Vec<FailureState>),
    /// The lease changed hands: nothing was written.
    LeaseLost,
}

/// One row of `outbox-relay blocked`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BlockedEvent {
    /// Outbox id.
    pub outbox_id: i64,
    /// Event id.
    pub event_id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// `parked` (waits for an operator) or `retrying` (retried automatically).
    pub state: String,
    /// Error class.
    pub error_class: String,
    /// Error text.
    pub error_message: String,
    /// Attempts so far.
    pub attempts: i32,
    /// First failure.
    pub first_failed_at: DateTime<Utc>,
    /// Last failure.
    pub last_failed_at: DateTime<Utc>,
    /// When it was parked.
    pub parked_at: Option<DateTime<Utc>>,
    /// Seconds since the event was written.
    pub age_seconds: f64,
    /// Events of the same aggregate waiting behind it.
    pub waiting_behind: i64,
}

/// Parking figures for metrics and `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ParkingStats {
    /// Parked events by error class.
    pub parked_by_class: HashMap<String, i64>,
    /// Events being retried after a failure (not parked).
    pub retrying: i64,
    /// Aggregates held back by a parked event.
    pub blocked_aggregates: i64,
    /// Events waiting behind parked events.
    pub waiting_behind: i64,
}

impl ParkingStats {
    /// All parked events.
    pub fn parked(&self) -> i64 {
        self.parked_by_class.values().sum()
    }
}

/// What `redrive` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveTarget {
    /// One event.
    Event(Uuid),
    /// Every failed event of one aggregate.
    Aggregate {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
    },
    /// Everything parked or retrying.
    All,
}

/// Result of `discard`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discarded {
    /// Moved into `outbox_discarded`.
    Done {
        /// Its outbox id.
        outbox_id: i64,
    },
    /// No unpublished event has this id.
    NotFound,
    /// The event exists but is not parked: the relay may be sending it; refuse.
    NotParked,
}
