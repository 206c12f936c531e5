//! What `dlq redrive` sent back already: one `dlq_redriven` row per dead letter (its
//! dead-letter topic, partition and offset), written once the broker acknowledged the redriven
//! message ([`record`]); `dlq redrive --all` leaves out the letters listed ([`redriven`]).
//!
//! The inbox alone cannot tell: its row of a redriven event is purged after the retention
//! window, while the dead-letter topic usually keeps the letter longer, and `--all` would apply
//! it again after every newer event of its aggregate. This table is not purged.
//!
//! The row is written after the acknowledgement, not before: a crash in between sends the
//! letter again on the next `--all`, which the inbox absorbs (its row is days from being
//! purged then). Written before, a crash would leave a letter marked that was never sent.

use std::collections::HashSet;

use sqlx::PgPool;

use uuid::Uuid;

use super::read::DeadLetter;

/// Where a dead letter is: dead-letter topic, partition, offset.
pub type LetterId = (String, i32, i64);

/// Where a redriven message landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// The event.
    pub event_id: Option<Uuid>,
    /// The consumer's redrive topic it was sent to.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// The letters `consumer` redrove already.
///
/// # Errors
/// When the database cannot be read (or the inbox migrations were not applied).
pub async fn redriven(pool: &PgPool, consumer: &str) -> Result<HashSet<LetterId>, sqlx::Error> {
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT dlq_topic, dlq_partition, dlq_offset FROM dlq_redriven WHERE consumer_name = $1",
    )
    .bind(consumer)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Records that `letter` of `consumer` was redriven, landing where `sent` says (a letter
/// redriven again by `--event-id` keeps one row, with its newest landing place).
///
/// # Errors
/// When the row cannot be written.
pub async fn record(
    pool: &PgPool,
    consumer: &str,
    letter: &DeadLetter,
    sent: &Redriven,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO dlq_redriven (consumer_name, dlq_topic, dlq_partition, dlq_offset, event_id, \
           redrive_topic, redrive_partition, redrive_offset) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (consumer_name, dlq_topic, dlq_partition, dlq_offset) DO UPDATE SET \
           redrive_topic = EXCLUDED.redrive_topic, redrive_partition = EXCLUDED.redrive_partition, \
           redrive_offset = EXCLUDED.redrive_offset, redriven_at = now()",
    )
    .bind(consumer)
    .bind(&letter.topic)
    .bind(letter.partition)
    .bind(letter.offset)
    .bind(letter.event_id)
    .bind(&sent.topic)
    .bind(sent.partition)
    .bind(sent.offset)
    .execute(pool)
    .await?;
    Ok(())
}
