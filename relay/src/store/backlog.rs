//! The backlog as `status` and the metrics read it: how many events are unpublished and how old
//! the oldest is. (The per-topic view for the metrics is [`crate::backlog`].)

use sqlx::Row;

use super::Store;

/// Backlog figures for `status` and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// Unpublished events.
    pub unpublished: i64,
    /// Age of the oldest unpublished event in seconds (0 when there is none).
    pub oldest_age_seconds: f64,
}

impl Store {
    ///
    /// # Errors
    /// Database errors.
    pub async fn backlog(&self) -> Result<Backlog, sqlx::Error> {
        let mut s = self.session().await?;
        let row = sqlx::query(
            "SELECT count(*) AS n, \
                    COALESCE(extract(epoch FROM now() - min(created_at))::float8, 0) AS age \
             FROM outbox",
        )
        .fetch_one(s.conn())
        .await?;
        s.finish().await?;
        Ok(Backlog {
            unpublished: row.get("n"),
            oldest_age_seconds: row.get::<f64, _>("age").max(0.0),
        })
    }
}
