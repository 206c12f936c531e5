//! The rows a drain meets before its healthy backlog: poisoned aggregates (a first event that
//! can never be sent) or suspect aggregates (a first event with a failure due for a retry), so
//! the isolation phase measures the healthy drain behind them.

use serde::Serialize;
use sqlx::PgPool;

use super::{aggregate_lock_off, AGGREGATE_TYPE, EVENT_TYPE};

/// Events inserted in front of a drain's healthy backlog (lower ids, so every batch meets
/// them first), on aggregates of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Front {
    /// Nothing: the healthy backlog alone.
    None,
    /// Poisoned aggregates `p-<k>`: a first event that can never be sent (undecodable
    /// headers for even `k`, an invalid topic for odd `k`), then two events that must wait
    /// behind it. All three rows stay in the outbox.
    Poisoned(u64),
    /// Suspect aggregates `s-<k>`: three sendable events, the first with a `broker_rejected`
    /// failure (attempts 1, due now, not parked), as a refused record batch leaves it. The
    /// relay sends each first event alone, then the two behind it.
    Suspects(u64),
}

impl Front {
    /// Rows it inserts.
    pub fn rows(self) -> u64 {
        match self {
            Self::None => 0,
            Self::Poisoned(n) | Self::Suspects(n) => 3 * n,
        }
    }

    /// Rows that stay in the outbox once the relay is done.
    pub fn rows_left(self) -> u64 {
        match self {
            Self::Poisoned(n) => 3 * n,
            Self::None | Self::Suspects(_) => 0,
        }
    }

    /// Inserts the rows (and the suspects' failure rows) in one transaction, lock off.
    ///
    /// # Errors
    /// Database errors.
    pub async fn insert(self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin().await?;
        aggregate_lock_off(&mut tx).await?;
        match self {
            Self::None => {}
            Self::Poisoned(n) => {
                // The poison storm of tests/it/isolation/parking.rs (`bulk`): g = 1..=n are the first
                // events of the n aggregates.
                sqlx::query(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic) \
                     SELECT $2, 'p-' || (g % $1), $3, jsonb_build_object('n', g), \
                            CASE WHEN g <= $1 AND g % 2 = 0 THEN '{\"x\": 1e400}'::jsonb ELSE '{}' END, \
                            CASE WHEN g <= $1 AND g % 2 = 1 THEN 'bad topic!' END \
                     FROM generate_series(1, 3 * $1) g",
                )
                .bind(n as i64)
                .bind(AGGREGATE_TYPE)
                .bind(EVENT_TYPE)
                .execute(&mut *tx)
                .await?;
            }
            Self::Suspects(n) => {
                sqlx::query(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     SELECT $2, 's-' || (g % $1), $3, jsonb_build_object('n', g) \
                     FROM generate_series(1, 3 * $1) g",
                )
                .bind(n as i64)
                .bind(AGGREGATE_TYPE)
                .bind(EVENT_TYPE)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
                         error_class, error_message, attempts, retry_at, parked_at) \
                     SELECT DISTINCT ON (aggregate_id) id, event_id, aggregate_type, aggregate_id, \
                            'broker_rejected', 'relay-bench: the broker refused a record batch', \
                            1, now(), NULL \
                     FROM outbox WHERE aggregate_id LIKE 's-%' ORDER BY aggregate_id, id",
                )
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_rows_and_what_stays() {
        assert_eq!((Front::None.rows(), Front::None.rows_left()), (0, 0));
        assert_eq!(
            (
                Front::Poisoned(2_000).rows(),
                Front::Poisoned(2_000).rows_left()
            ),
            (6_000, 6_000)
        );
        assert_eq!(
            (
                Front::Suspects(300).rows(),
                Front::Suspects(300).rows_left()
            ),
            (900, 0)
        );
    }
}
