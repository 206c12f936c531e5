//! The SQL of the durable failure records and parking (`outbox_failure`, `outbox_discarded`,
//! the types in [`crate::parking`]): recording a failure under the lease, what the next claim
//! needs to know of the failure table, and the operator's commands (`blocked`, `redrive`,
//! `discard`).
//!
//! A failure row makes the claim leave out the event's aggregate until `retry_at`, and for good
//! once `parked_at` is set. Failure rows are written only under the lease epoch (a fenced relay
//! parks nothing). Redrive deletes the row: the event is the aggregate's oldest unpublished
//! one, so the next claim sends it first, then the events behind it, in `id` order.

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::failures::SMALL_FAILURE_TABLE;
use super::lease::LeaseToken;
use super::pool::Store;
use crate::parking::{
    BlockedEvent, Discarded, FailureState, FailureView, NewFailure, ParkPolicy, ParkingStats,
    Recorded, RedriveTarget,
};

impl Store {
    /// Records failures under the lease: inserts a failure row per event or counts another
    /// attempt; parks an event when asked to or when it reached `policy.park_after` attempts,
    /// unless it is a suspect to retry at once (`retry_now`: its record batch was refused, the
    /// culprit may be another event; it is sent alone next, and judged then); sets when it may
    /// be retried.
    ///
    /// # Errors
    /// Database errors.
    pub async fn record_failures(
        &self,
        lease: &LeaseToken,
        failures: &[NewFailure],
        policy: ParkPolicy,
    ) -> Result<Recorded, sqlx::Error> {
        if failures.is_empty() {
            return Ok(Recorded::Written(Vec::new()));
        }
        let col = |f: fn(&NewFailure) -> String| failures.iter().map(f).collect::<Vec<_>>();
        let ids: Vec<i64> = failures.iter().map(|f| f.id).collect();
        let event_ids: Vec<Uuid> = failures.iter().map(|f| f.event_id).collect();
        let parks: Vec<bool> = failures.iter().map(|f| f.park).collect();
        let now: Vec<bool> = failures.iter().map(|f| f.retry_now).collect();
        let mut s = self.session().await?;
        let rows = sqlx::query(
            "WITH l AS ( \
                 SELECT 1 FROM outbox_relay_lease \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 FOR SHARE \
             ), w AS ( \
                 INSERT INTO outbox_failure AS f (outbox_id, event_id, aggregate_type, aggregate_id, \
                        error_class, error_message, attempts, retry_at, parked_at) \
                 SELECT u.id, u.event_id, u.atype, u.aid, u.class, u.msg, 1, \
                        now() + CASE WHEN u.now THEN interval '0' ELSE make_interval(secs => $10) END, \
                        CASE WHEN u.park OR ($9 <= 1 AND NOT u.now) THEN now() END \
                 FROM unnest($4::bigint[], $5::uuid[], $6::text[], $7::text[], $8::text[], $11::text[], \
                             $12::bool[], $13::bool[]) \
                      AS u(id, event_id, atype, aid, class, msg, park, now) \
                 WHERE EXISTS (SELECT 1 FROM l) \
                 ON CONFLICT (outbox_id) DO UPDATE SET \
                     error_class = EXCLUDED.error_class, \
                     error_message = EXCLUDED.error_message, \
                     attempts = f.attempts + 1, \
                     last_failed_at = now(), \
                     retry_at = CASE WHEN EXCLUDED.retry_at <= now() THEN now() \
                                ELSE now() + make_interval(secs => least($14, $10 * power(2, least(f.attempts, 40)))) END, \
                     parked_at = CASE WHEN EXCLUDED.parked_at IS NOT NULL \
                                      OR (f.attempts + 1 >= $9 AND EXCLUDED.retry_at > now()) \
                                 THEN coalesce(f.parked_at, now()) END \
                 RETURNING outbox_id, attempts, parked_at IS NOT NULL AS parked \
             ) \
             SELECT (SELECT count(*) FROM l) AS held, w.outbox_id, w.attempts, w.parked \
             FROM (SELECT 1) one LEFT JOIN w ON true",
        )
        .bind(&lease.name)
        .bind(&lease.holder)
        .bind(lease.epoch)
        .bind(&ids)
        .bind(&event_ids)
        .bind(col(|f| f.aggregate_type.clone()))
        .bind(col(|f| f.aggregate_id.clone()))
        .bind(col(|f| f.class.as_str().to_owned()))
        .bind(policy.park_after)
        .bind(policy.first_delay.as_secs_f64())
        .bind(col(|f| f.message.clone()))
        .bind(&parks)
        .bind(&now)
        .bind(policy.max_delay.as_secs_f64())
        .fetch_all(s.conn())
        .await?;
        s.finish().await?;
        if rows.first().is_none_or(|r| r.get::<i64, _>("held") == 0) {
            return Ok(Recorded::LeaseLost);
        }
        Ok(Recorded::Written(
            rows.iter()
                .filter_map(|r| {
                    Some(FailureState {
                        id: r.get::<Option<i64>, _>("outbox_id")?,
                        attempts: r.get("attempts"),
                        parked: r.get("parked"),
                    })
                })
                .collect(),
        ))
    }

    /// What the next claim needs to know of the failure table: whether any failure row
    /// exists, and whether the table is past [`SMALL_FAILURE_TABLE`] rows (then the claim
    /// probes it per row instead of hashing it). Reads at most that many rows, whatever the
    /// table holds; the failed rows' attempts come with the claim itself.
    ///
    /// # Errors
    /// Database errors.
    pub async fn failure_view(&self) -> Result<FailureView, sqlx::Error> {
        let mut s = self.session().await?;
        let total: i64 =
            sqlx::query_scalar("SELECT count(*) FROM (SELECT 1 FROM outbox_failure LIMIT $1) c")
                .bind(SMALL_FAILURE_TABLE + 1)
                .fetch_one(s.conn())
                .await?;
        s.finish().await?;
        Ok(FailureView {
            any: total > 0,
            large: total > SMALL_FAILURE_TABLE,
        })
    }

    /// Deletes failure rows whose event is no longer in the outbox (published by an older
    /// relay, or deleted by hand). Returns how many.
    ///
    /// # Errors
    /// Database errors.
    pub async fn forget_orphan_failures(&self) -> Result<u64, sqlx::Error> {
        let mut s = self.session().await?;
        let n = sqlx::query(
            "DELETE FROM outbox_failure f \
             WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = f.outbox_id)",
        )
        .execute(s.conn())
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(n)
    }

    /// Every failed event still in the outbox, oldest first, with how many events of its
    /// aggregate wait behind it.
    ///
    /// # Errors
    /// Database errors.
    pub async fn blocked_events(&self) -> Result<Vec<BlockedEvent>, sqlx::Error> {
        let mut s = self.session().await?;
        let rows = sqlx::query(
            "SELECT f.outbox_id, f.event_id, f.aggregate_type, f.aggregate_id, \
                    CASE WHEN f.parked_at IS NULL THEN 'retrying' ELSE 'parked' END AS state, \
                    f.error_class, f.error_message, f.attempts, f.first_failed_at, f.last_failed_at, \
                    f.parked_at, extract(epoch FROM now() - o.created_at)::float8 AS age, \
                    (SELECT count(*) FROM outbox b WHERE b.aggregate_type = f.aggregate_type \
                        AND b.aggregate_id = f.aggregate_id AND b.id > f.outbox_id) AS behind \
             FROM outbox_failure f JOIN outbox o ON o.id = f.outbox_id \
             ORDER BY f.outbox_id",
        )
        .fetch_all(s.conn())
        .await?;
        s.finish().await?;
        Ok(rows
            .iter()
            .map(|r| BlockedEvent {
                outbox_id: r.get("outbox_id"),
                event_id: r.get("event_id"),
                aggregate_type: r.get("aggregate_type"),
                aggregate_id: r.get("aggregate_id"),
                state: r.get("state"),
                error_class: r.get("error_class"),
                error_message: r.get("error_message"),
                attempts: r.get("attempts"),
                first_failed_at: r.get("first_failed_at"),
                last_failed_at: r.get("last_failed_at"),
                parked_at: r.get("parked_at"),
                age_seconds: r.get("age"),
                waiting_behind: r.get("behind"),
            })
            .collect())
    }

    /// Parked and retrying counts, blocked aggregates and the events waiting behind them.
    ///
    /// # Errors
    /// Database errors.
    pub async fn parking_stats(&self) -> Result<ParkingStats, sqlx::Error> {
        let mut stats = ParkingStats::default();
        let mut s = self.session().await?;
        let rows: Vec<(String, bool, i64)> = sqlx::query_as(
            "SELECT f.error_class, f.parked_at IS NOT NULL, count(*) \
             FROM outbox_failure f JOIN outbox o ON o.id = f.outbox_id GROUP BY 1, 2",
        )
        .fetch_all(s.conn())
        .await?;
        for (class, parked, n) in rows {
            if parked {
                stats.parked_by_class.insert(class, n);
            } else {
                stats.retrying += n;
            }
        }
        if stats.parked() > 0 {
            let (aggregates, behind): (i64, i64) = sqlx::query_as(
                "WITH p AS ( \
                     SELECT f.aggregate_type, f.aggregate_id, min(f.outbox_id) AS first_id \
                     FROM outbox_failure f JOIN outbox o ON o.id = f.outbox_id \
                     WHERE f.parked_at IS NOT NULL GROUP BY 1, 2) \
                 SELECT (SELECT count(*) FROM p), \
                        (SELECT count(*) FROM outbox b JOIN p ON b.aggregate_type = p.aggregate_type \
                            AND b.aggregate_id = p.aggregate_id AND b.id > p.first_id)",
            )
            .fetch_one(s.conn())
            .await?;
            stats.blocked_aggregates = aggregates;
            stats.waiting_behind = behind;
        }
        s.finish().await?;
        Ok(stats)
    }

    /// Unparks: deletes the failure rows `target` selects, so the events are sent again on the
    /// next batch, before the events behind them. Returns the outbox ids released.
    ///
    /// # Errors
    /// Database errors.
    pub async fn redrive(&self, target: &RedriveTarget) -> Result<Vec<i64>, sqlx::Error> {
        let q = match target {
            RedriveTarget::Event(id) => sqlx::query_scalar(
                "DELETE FROM outbox_failure WHERE event_id = $1 RETURNING outbox_id",
            )
            .bind(*id),
            RedriveTarget::Aggregate {
                aggregate_type,
                aggregate_id,
            } => sqlx::query_scalar(
                "DELETE FROM outbox_failure WHERE aggregate_type = $1 AND aggregate_id = $2 \
                 RETURNING outbox_id",
            )
            .bind(aggregate_type.clone())
            .bind(aggregate_id.clone()),
            RedriveTarget::All => {
                sqlx::query_scalar("DELETE FROM outbox_failure RETURNING outbox_id")
            }
        };
        let mut s = self.session().await?;
        let mut ids: Vec<i64> = q.fetch_all(s.conn()).await?;
        s.finish().await?;
        ids.sort_unstable();
        // Wake a relay that is idle (optional for it: it polls anyway).
        if let Ok(mut s) = self.session().await {
            let notified = sqlx::query("SELECT pg_notify($1, '')")
                .bind(outbox_writer::outbox::NOTIFY_CHANNEL)
                .execute(s.conn())
                .await;
            if notified.is_ok() {
                let _ = s.finish().await;
            }
        }
        Ok(ids)
    }

    /// Moves a parked event out of the outbox into `outbox_discarded` with `reason` and
    /// `by`, in one transaction; the aggregate's later events then flow. Only parked events
    /// can be discarded (any other may be in flight).
    ///
    /// Safe against a concurrent `redrive` and the running relay: the event's outbox row and
    /// its failure row are both locked before the parked state is read, so a `redrive`
    /// (which deletes the failure row) either committed before, and the event is no longer
    /// parked (nothing is discarded, the relay sends it), or waits until this transaction
    /// committed and then finds nothing to redrive. The copy into the audit table must copy
    /// exactly the event, or the transaction is rolled back.
    ///
    /// # Errors
    /// Database errors; [`sqlx::Error::Protocol`] when the audit copy did not write exactly
    /// one row (nothing is changed then).
    pub async fn discard(
        &self,
        event_id: Uuid,
        reason: &str,
        by: &str,
    ) -> Result<Discarded, sqlx::Error> {
        let mut tx = self.transaction().await?;
        let id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM outbox WHERE event_id = $1 FOR UPDATE")
                .bind(event_id)
                .fetch_optional(tx.conn())
                .await?;
        let Some(id) = id else {
            return Ok(Discarded::NotFound);
        };
        // Locked, then read: a redrive that deleted the row meanwhile is seen as deleted
        // (READ COMMITTED re-reads a row it waited for), never as still parked.
        let parked: Option<Option<DateTime<Utc>>> = sqlx::query_scalar(
            "SELECT parked_at FROM outbox_failure WHERE outbox_id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(tx.conn())
        .await?;
        if !matches!(parked, Some(Some(_))) {
            return Ok(Discarded::NotParked);
        }
        let copied = sqlx::query(
            "INSERT INTO outbox_discarded (event_id, outbox_id, aggregate_type, aggregate_id, \
                 event_type, payload, payload_bytes, content_type, message_key, headers, topic, \
                 created_at, error_class, error_message, attempts, reason, discarded_by, \
                 relay_headers) \
             SELECT o.event_id, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, \
                    o.payload_bytes, o.content_type, o.message_key, o.headers, o.topic, \
                    o.created_at, f.error_class, f.error_message, f.attempts, $2, $3, \
                    o.relay_headers \
             FROM outbox o JOIN outbox_failure f ON f.outbox_id = o.id \
             WHERE o.id = $1 AND f.parked_at IS NOT NULL",
        )
        .bind(id)
        .bind(reason)
        .bind(by)
        .execute(tx.conn())
        .await?
        .rows_affected();
        if copied != 1 {
            // Dropping the transaction rolls it back: nothing deleted, nothing recorded.
            return Err(sqlx::Error::Protocol(format!(
                "discard of outbox id {id}: the audit copy wrote {copied} rows instead of 1; nothing was changed"
            )));
        }
        let deleted = sqlx::query(
            "WITH f AS (DELETE FROM outbox_failure WHERE outbox_id = $1) \
             DELETE FROM outbox WHERE id = $1",
        )
        .bind(id)
        .execute(tx.conn())
        .await?
        .rows_affected();
        if deleted != 1 {
            return Err(sqlx::Error::Protocol(format!(
                "discard of outbox id {id}: the event was deleted {deleted} times; nothing was changed"
            )));
        }
        tx.finish().await?;
        Ok(Discarded::Done { outbox_id: id })
    }
}
