//! The relay's SQL, one file per concern: [`claim`](Store::claim) reads a batch from the head
//! of the outbox, [`mark`](Store::mark_published) deletes what the broker acknowledged, the
//! leader lease fences both, the failure filter keeps held-back aggregates out of a claim,
//! `parking` writes the failure records and runs the operator's commands, the backlog feeds
//! `status` and the metrics, and `debezium` reads the catalog for `debezium-install`. `pool`
//! holds the [`Store`] itself: its two pools and the sessions ([`session`]) every statement
//! runs in.
//!
//! Rows are read in `id` order from the head of the outbox on every batch (no `id > cursor`
//! bookmark), so a row whose transaction commits late with a small `id` is still found. A row
//! counts as published when it is deleted; the delete runs only after the broker acknowledged
//! the message and only while this relay still holds the lease epoch it claimed the batch under
//! (fencing), so a relay that lost its lease can never mark anything.

mod backlog;
mod buckets;
mod claim;
pub(crate) mod debezium;
mod failures;
mod lease;
mod mark;
mod parking;
mod pool;
pub mod session;

pub use backlog::{Backlog, BucketBacklog, TopicBacklog};
pub use buckets::{BucketRow, SetBucketsError};
pub use claim::{
    ClaimLimits, ClaimedBatch, ClaimedRow, FloorQuery, FloorSeen, IdRange, Undecodable,
};
pub use failures::{discarded_rule, FailureFilter, SMALL_FAILURE_TABLE};
pub use lease::{LeaseInfo, LeaseToken};
pub use mark::Marked;
pub use pool::Store;

/// `work`, given up after `limit` as a timed-out I/O error: its session, dropped unfinished,
/// closes its connection (a statement on a stalled link must not hang its caller).
async fn within<T>(
    limit: std::time::Duration,
    work: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} ms", limit.as_millis()),
        )))
    })
}
