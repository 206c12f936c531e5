//! The relay's SQL: claiming batches, marking published rows, the leader lease and the backlog.
//!
//! Rows are read in `id` order from the head of the outbox on every batch (no `id > cursor`
//! bookmark), so a row whose transaction commits late with a small `id` is still found. A row
//! counts as published when it is deleted; the delete runs only after the broker acknowledged
//! the message and only while this relay still holds the lease epoch it claimed the batch under
//! (fencing), so a relay that lost its lease can never mark anything.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_kit::EventEnvelope;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// Proof of holding the relay lease: the lease name, this instance and the fencing epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    /// Lease name.
    pub name: String,
    /// This instance.
    pub holder: String,
    /// Fencing epoch, grows with every change of holder.
    pub epoch: i64,
}

/// Result of [`Store::claim_batch`].
#[derive(Debug)]
pub enum Claim {
    /// The lease is held; these rows (possibly none) are the head of the outbox.
    Rows(Vec<EventEnvelope>),
    /// The lease is no longer held under this token: claim nothing.
    LeaseLost,
}

/// Result of [`Store::mark_published`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// The rows were deleted (the count may be lower than asked if they were already gone).
    Deleted(u64),
    /// The lease changed hands: nothing was marked.
    LeaseLost,
}

/// Backlog figures for `status` and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// Unpublished events.
    pub unpublished: i64,
    /// Age of the oldest unpublished event in seconds (0 when there is none).
    pub oldest_age_seconds: f64,
}

/// Current lease row, for `status`.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseInfo {
    /// Holder instance id.
    pub holder: String,
    /// Fencing epoch.
    pub epoch: i64,
    /// Seconds since the last renewal.
    pub renewed_seconds_ago: f64,
    /// Seconds until expiry (negative when expired).
    pub expires_in_seconds: f64,
}

/// Access to the outbox database.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

const LEASE_HELD: &str = "EXISTS (SELECT 1 FROM outbox_relay_lease \
     WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now())";

impl Store {
    /// Connects lazily: the relay starts even while the database is down and retries.
    ///
    /// # Errors
    /// When the URL cannot be parsed.
    pub fn connect_lazy(database_url: &str) -> Result<Self, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy(database_url)?;
        Ok(Self { pool })
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Reads up to `limit` unpublished rows in `id` order, if `lease` is still held.
    ///
    /// # Errors
    /// Database errors.
    pub async fn claim_batch(&self, lease: &LeaseToken, limit: i64) -> Result<Claim, sqlx::Error> {
        self.claim_batch_excluding(lease, limit, &[]).await
    }

    /// [`Store::claim_batch`], leaving out the events of `held_aggregates` (aggregates waiting
    /// after a failure, see `quarantine`), so they neither block nor fill the batch.
    ///
    /// # Errors
    /// Database errors.
    pub async fn claim_batch_excluding(
        &self,
        lease: &LeaseToken,
        limit: i64,
        held_aggregates: &[String],
    ) -> Result<Claim, sqlx::Error> {
        // One round trip: the lateral join yields one all-NULL row when the lease is held and
        // the outbox is empty, and nothing from the outbox when the lease is lost.
        let sql = format!(
            "SELECT l.held, o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, \
                    o.payload::text AS payload, o.headers::text AS headers, o.topic, o.created_at \
             FROM (SELECT {LEASE_HELD} AS held) l \
             LEFT JOIN LATERAL ( \
                 SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, topic, created_at \
                 FROM outbox WHERE l.held AND aggregate_id <> ALL($5) ORDER BY id LIMIT $4 \
             ) o ON true"
        );
        let rows = sqlx::query(&sql)
            .bind(&lease.name)
            .bind(&lease.holder)
            .bind(lease.epoch)
            .bind(limit)
            .bind(held_aggregates)
            .fetch_all(&self.pool)
            .await?;
        // Columns by position (the order of the SELECT list): this loop runs per row.
        let held = rows.first().map(|r| r.get::<bool, _>(0)).unwrap_or(false);
        if !held {
            return Ok(Claim::LeaseLost);
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let Some(id) = r.get::<Option<i64>, _>(1) else {
                continue;
            };
            let headers: &str = r.get(7);
            out.push(EventEnvelope {
                id,
                event_id: r.get::<Uuid, _>(2),
                aggregate_type: r.get(3),
                aggregate_id: r.get(4),
                event_type: r.get(5),
                payload: r.get(6),
                headers: if headers == "{}" {
                    serde_json::Value::Object(Default::default())
                } else {
                    serde_json::from_str(headers).map_err(|e| sqlx::Error::Decode(Box::new(e)))?
                },
                topic: r.get(8),
                created_at: r.get::<DateTime<Utc>, _>(9),
            });
        }
        Ok(Claim::Rows(out))
    }

    /// Deletes published rows, fenced by the lease epoch.
    ///
    /// The lease row is locked `FOR SHARE` in the same statement: a takeover (which updates
    /// the lease row) either committed before, and then nothing is deleted, or waits for this
    /// statement to finish.
    ///
    /// # Errors
    /// Database errors; retrying is safe (deleting twice deletes nothing).
    pub async fn mark_published(
        &self,
        lease: &LeaseToken,
        ids: &[i64],
    ) -> Result<Marked, sqlx::Error> {
        let row = sqlx::query(
            "WITH l AS ( \
                 SELECT 1 FROM outbox_relay_lease \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 FOR SHARE \
             ), d AS ( \
                 DELETE FROM outbox WHERE id = ANY($4) AND EXISTS (SELECT 1 FROM l) RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM l) AS held, (SELECT count(*) FROM d) AS deleted",
        )
        .bind(&lease.name)
        .bind(&lease.holder)
        .bind(lease.epoch)
        .bind(ids)
        .fetch_one(&self.pool)
        .await?;
        if row.get::<i64, _>("held") == 0 {
            return Ok(Marked::LeaseLost);
        }
        Ok(Marked::Deleted(row.get::<i64, _>("deleted") as u64))
    }

    /// Takes the lease if it is free or expired; returns the token with the new epoch.
    ///
    /// # Errors
    /// Database errors.
    pub async fn try_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseToken>, sqlx::Error> {
        let epoch: Option<i64> = sqlx::query_scalar(
            "INSERT INTO outbox_relay_lease AS l (name, holder, epoch, acquired_at, renewed_at, expires_at) \
             VALUES ($1, $2, 1, now(), now(), now() + make_interval(secs => $3)) \
             ON CONFLICT (name) DO UPDATE \
                SET holder = EXCLUDED.holder, epoch = l.epoch + 1, acquired_at = now(), \
                    renewed_at = now(), expires_at = EXCLUDED.expires_at \
              WHERE l.expires_at <= now() \
             RETURNING epoch",
        )
        .bind(name)
        .bind(holder)
        .bind(ttl.as_secs_f64())
        .fetch_optional(&self.pool)
        .await?;
        Ok(epoch.map(|epoch| LeaseToken {
            name: name.to_owned(),
            holder: holder.to_owned(),
            epoch,
        }))
    }

    /// Extends the lease; `false` when it changed hands. An expired lease nobody else took is
    /// extended under the same epoch.
    ///
    /// # Errors
    /// Database errors.
    pub async fn renew_lease(
        &self,
        lease: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, sqlx::Error> {
        let n = sqlx::query(
            "UPDATE outbox_relay_lease \
             SET renewed_at = now(), expires_at = now() + make_interval(secs => $4) \
             WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(&lease.name)
        .bind(&lease.holder)
        .bind(lease.epoch)
        .bind(ttl.as_secs_f64())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Gives the lease up so a standby can take over at once.
    ///
    /// # Errors
    /// Database errors.
    pub async fn release_lease(&self, lease: &LeaseToken) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE outbox_relay_lease SET expires_at = now() \
             WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(&lease.name)
        .bind(&lease.holder)
        .bind(lease.epoch)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The lease row, if any.
    ///
    /// # Errors
    /// Database errors.
    pub async fn lease_info(&self, name: &str) -> Result<Option<LeaseInfo>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT holder, epoch, \
                    extract(epoch FROM now() - renewed_at)::float8 AS renewed_ago, \
                    extract(epoch FROM expires_at - now())::float8 AS expires_in \
             FROM outbox_relay_lease WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| LeaseInfo {
            holder: r.get("holder"),
            epoch: r.get("epoch"),
            renewed_seconds_ago: r.get("renewed_ago"),
            expires_in_seconds: r.get("expires_in"),
        }))
    }

    /// Unpublished count and age of the oldest unpublished event.
    ///
    /// # Errors
    /// Database errors.
    pub async fn backlog(&self) -> Result<Backlog, sqlx::Error> {
        let row = sqlx::query(
            "SELECT count(*) AS n, \
                    COALESCE(extract(epoch FROM now() - min(created_at))::float8, 0) AS age \
             FROM outbox",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            unpublished: row.get("n"),
            oldest_age_seconds: row.get::<f64, _>("age").max(0.0),
        })
    }
}
