//! The consumer inbox (shared DESIGN.md, "Inbox"): `(consumer_name, event_id)` rows inserted
//! in the same transaction as an event's business effect.
//!
//! [`claim`] is the first statement of that transaction. It either inserts the row (the event
//! is new: apply its effect, then commit both together) or finds it (the event was applied
//! before: skip the effect, commit, move the offset on). A concurrent transaction holding an
//! uncommitted row for the same event makes `claim` wait for its outcome, so two deliveries
//! of one event never both apply it.

use sqlx::PgConnection;
use uuid::Uuid;

/// What [`claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// First delivery: the row was inserted; apply the effect in the same transaction.
    New,
    /// Already applied: the row existed (its duplicate count was bumped); skip the effect.
    Duplicate,
}

/// Inserts the inbox row of `event_id` for `consumer_name`, or counts a duplicate.
///
/// # Errors
/// When a statement fails; roll the transaction back.
pub async fn claim(
    conn: &mut PgConnection,
    consumer_name: &str,
    event_id: Uuid,
) -> Result<Claim, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO inbox (consumer_name, event_id) VALUES ($1, $2) \
         ON CONFLICT (consumer_name, event_id) DO NOTHING",
    )
    .bind(consumer_name)
    .bind(event_id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if inserted {
        return Ok(Claim::New);
    }
    sqlx::query(
        "UPDATE inbox SET duplicates = duplicates + 1, last_duplicate_at = now() \
         WHERE consumer_name = $1 AND event_id = $2",
    )
    .bind(consumer_name)
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(Claim::Duplicate)
}
