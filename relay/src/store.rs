//! The relay's SQL: claiming batches, marking published rows, the leader lease and the backlog.
//!
//! Rows are read in `id` order from the head of the outbox on every batch (no `id > cursor`
//! bookmark), so a row whose transaction commits late with a small `id` is still found. A row
//! counts as published when it is deleted; the delete runs only after the broker acknowledged
//! the message and only while this relay still holds the lease epoch it claimed the batch under
//! (fencing), so a relay that lost its lease can never mark anything.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_kit::{EventEnvelope, Payload};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// The retention rule of the `outbox_discarded` audit table.
pub fn discarded_rule(window: Duration) -> outbox_kit::retention::RetentionRule {
    outbox_kit::retention::RetentionRule {
        table: "outbox_discarded",
        time_column: "discarded_at",
        scope: None,
        window,
    }
}

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

/// One claimed outbox row: the message it becomes, or why it cannot be read.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    /// The decoded event, or the row's identity and why it cannot become a message (it is
    /// parked).
    pub message: Result<EventEnvelope, Box<Undecodable>>,
    /// Attempts so far when the row failed before, read with the row (in the claim's own
    /// snapshot, so it never disagrees with what was claimed); `None` with
    /// [`FailureFilter::Off`].
    pub attempts: Option<i32>,
    /// Bytes of payload and headers as rendered, what the claim counts against
    /// [`ClaimLimits::bytes`].
    pub bytes: i64,
}

/// A claimed row that cannot become a message.
#[derive(Debug, Clone)]
pub struct Undecodable {
    /// Outbox sequence number.
    pub id: i64,
    /// The event's id.
    pub event_id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// What is wrong.
    pub error: String,
}

impl ClaimedRow {
    /// Outbox sequence number.
    pub fn id(&self) -> i64 {
        match &self.message {
            Ok(m) => m.id,
            Err(u) => u.id,
        }
    }

    /// The event's id.
    pub fn event_id(&self) -> Uuid {
        match &self.message {
            Ok(m) => m.event_id,
            Err(u) => u.event_id,
        }
    }

    /// The aggregate (type, id): the unit of ordering.
    pub fn aggregate(&self) -> (&str, &str) {
        match &self.message {
            Ok(m) => (&m.aggregate_type, &m.aggregate_id),
            Err(u) => (&u.aggregate_type, &u.aggregate_id),
        }
    }
}

/// Result of [`Store::claim_batch`].
#[derive(Debug)]
pub enum ClaimedBatch {
    /// The lease is held; these rows (possibly none) are the head of the outbox, leaving out
    /// aggregates held back by a failure (`outbox_failure`); `true` when the byte bound cut
    /// the batch short.
    Rows(Vec<ClaimedRow>, bool),
    /// The lease is no longer held under this token: claim nothing.
    LeaseLost,
}

/// `(min, max)` of `ids` when they are many and dense enough that walking the primary key
/// from the first to the last costs less than looking each one up (at most four entries
/// walked per id): the usual batch, a run of the outbox's head.
fn dense_range(ids: &[i64]) -> Option<(i64, i64)> {
    const MIN_IDS: usize = 64;
    if ids.len() < MIN_IDS {
        return None;
    }
    let lo = *ids.iter().min()?;
    let hi = *ids.iter().max()?;
    let span = u64::try_from(hi.checked_sub(lo)?).ok()?;
    (span < 4 * ids.len() as u64).then_some((lo, hi))
}

/// Limits of one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimits {
    /// Most rows.
    pub rows: i64,
    /// Most bytes of payload and headers (the first row is always taken, whatever its size).
    pub bytes: i64,
    /// How aggregates held back by `outbox_failure` are left out.
    pub failures: FailureFilter,
    /// Only rows with an `id` in this range (an index condition of the scan, so the rows
    /// outside it are never read): the relay claims the next batch past the one in flight,
    /// then the rows below that prefetched batch (see [`crate::batch`]).
    pub ids: IdRange,
}

/// Bounds on the `id` of claimed rows, both exclusive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdRange {
    /// Only rows with `id > after`.
    pub after: Option<i64>,
    /// Only rows with `id < before`.
    pub before: Option<i64>,
}

impl IdRange {
    /// Every row.
    pub const ALL: Self = Self {
        after: None,
        before: None,
    };
}

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
    /// The lease's own connection: acquiring, renewing and releasing the lease never wait
    /// for the pool the batches, the backlog gauges and the retention purge share (a backlog
    /// query over millions of rows must not cost the lease).
    lease_pool: PgPool,
    /// Behind PgBouncer's transaction pooling: see [`crate::session`].
    pgbouncer: bool,
}

pub(crate) const LEASE_HELD: &str = "EXISTS (SELECT 1 FROM outbox_relay_lease \
     WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now())";

impl Store {
    /// Connects lazily: the relay starts even while the database is down and retries.
    ///
    /// # Errors
    /// When the URL cannot be parsed.
    pub fn connect_lazy(database_url: &str) -> Result<Self, sqlx::Error> {
        Self::connect_lazy_with(database_url, false)
    }

    /// [`Store::connect_lazy`]; with `pgbouncer`, for a server behind PgBouncer's transaction
    /// pooling: no `extra_float_digits` startup parameter (PgBouncer refuses it unless told
    /// to ignore it), no statement cache, and every statement in its own transaction that
    /// deallocates what it prepared ([`crate::session`]).
    ///
    /// # Errors
    /// When the URL cannot be parsed.
    pub fn connect_lazy_with(database_url: &str, pgbouncer: bool) -> Result<Self, sqlx::Error> {
        let mut options = outbox_kit::pg::connect_options(database_url)?;
        if pgbouncer {
            options = options.statement_cache_capacity(0).extra_float_digits(None);
        }
        let lease_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options.clone());
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            lease_pool,
            pgbouncer,
        })
    }

    /// Wraps an existing pool (directly on PostgreSQL).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            lease_pool: pool.clone(),
            pool,
            pgbouncer: false,
        }
    }

    /// True when the store talks to PostgreSQL through PgBouncer's transaction pooling.
    pub fn behind_pgbouncer(&self) -> bool {
        self.pgbouncer
    }

    /// A connection for one statement (behind PgBouncer: in its own transaction).
    ///
    /// # Errors
    /// Database errors.
    pub(crate) async fn session(&self) -> Result<crate::session::Session, sqlx::Error> {
        crate::session::Session::begin(&self.pool, self.pgbouncer).await
    }

    /// A connection of the lease's own pool for one statement.
    ///
    /// # Errors
    /// Database errors.
    async fn lease_session(&self) -> Result<crate::session::Session, sqlx::Error> {
        crate::session::Session::begin(&self.lease_pool, self.pgbouncer).await
    }

    /// A transaction, in either mode.
    ///
    /// # Errors
    /// Database errors.
    pub(crate) async fn transaction(&self) -> Result<crate::session::Session, sqlx::Error> {
        crate::session::Session::transaction(&self.pool, self.pgbouncer).await
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Reads up to `limit` unpublished rows in `id` order, if `lease` is still held, with
    /// no byte limit beyond 1 GiB.
    ///
    /// # Errors
    /// Database errors.
    pub async fn claim_batch(
        &self,
        lease: &LeaseToken,
        limit: i64,
    ) -> Result<ClaimedBatch, sqlx::Error> {
        self.claim(
            lease,
            ClaimLimits {
                rows: limit,
                bytes: 1 << 30,
                failures: FailureFilter::Hashed,
                ids: IdRange::ALL,
            },
        )
        .await
    }

    /// Reads the head of the outbox in `id` order, if `lease` is still held: at most
    /// `limits.rows` rows and about `limits.bytes` bytes, leaving out the events that wait
    /// behind a failed or parked event of their aggregate (`outbox_failure`), so they neither
    /// block nor fill the batch; a failed event due for a retry is claimed (alone of its
    /// aggregate).
    ///
    /// The byte bound is applied here, on the rendered text, as rows stream in: rows past it
    /// are read and dropped (they come first in the next batch), so the relay never holds much
    /// more than `limits.bytes` of a batch. [`ClaimedBatch::Rows`] says whether it cut, so the
    /// caller can ask for fewer rows next time (PostgreSQL then renders fewer rows it drops);
    /// a bound in SQL (a running sum) cost PostgreSQL about 0.7 µs per event on every batch.
    ///
    /// # Errors
    /// Database errors. A row that cannot be decoded is returned with its error, not failed.
    pub async fn claim(
        &self,
        lease: &LeaseToken,
        limits: ClaimLimits,
    ) -> Result<ClaimedBatch, sqlx::Error> {
        use futures::TryStreamExt;
        // One round trip: the lateral join yields one all-NULL row when the lease is held and
        // the outbox is empty, and nothing from the outbox when the lease is lost.
        // An aggregate with a failure row is left out, but for the failed rows that are due
        // for a retry: the rows behind a failed event are not claimed until it is published
        // (they would only fill the batch; they cannot be sent before it).
        let (join, exclusion, attempts) = match limits.failures {
            FailureFilter::Off => ("", String::new(), "NULL::int4"),
            // Two hashed subplans over the (small) failure table, probed per row.
            FailureFilter::Hashed => (
                "LEFT JOIN outbox_failure f ON f.outbox_id = o.id",
                "AND ((o.aggregate_type, o.aggregate_id) NOT IN ( \
                          SELECT x.aggregate_type, x.aggregate_id FROM outbox_failure x) \
                      OR o.id IN (SELECT x.outbox_id FROM outbox_failure x \
                          WHERE x.parked_at IS NULL AND x.retry_at <= now()))"
                    .to_owned(),
                "f.attempts",
            ),
            // `OFFSET 0` keeps the EXISTS a per-row subplan on the aggregate index: as a join,
            // PostgreSQL would hash both tables whole, then sort.
            FailureFilter::Probed => (
                "LEFT JOIN outbox_failure f ON f.outbox_id = o.id",
                "AND NOT EXISTS (SELECT 1 FROM outbox_failure x \
                     WHERE x.aggregate_type = o.aggregate_type AND x.aggregate_id = o.aggregate_id \
                       AND (x.parked_at IS NOT NULL OR x.retry_at > now() OR x.outbox_id < o.id) \
                     OFFSET 0)"
                    .to_owned(),
                "f.attempts",
            ),
        };
        // Literal bounds (integers, not parameters): the range is then an index condition in
        // every plan, never a filter over the rows of the batch in flight.
        let range = match (limits.ids.after, limits.ids.before) {
            (None, None) => String::new(),
            (Some(a), None) => format!("AND o.id > {a}"),
            (None, Some(b)) => format!("AND o.id < {b}"),
            (Some(a), Some(b)) => format!("AND o.id > {a} AND o.id < {b}"),
        };
        let sql = format!(
            "SELECT l.held, o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, \
                    o.payload::text AS payload, o.headers::text AS headers, o.topic, o.created_at, \
                    o.attempts, o.payload_bytes, o.content_type, o.message_key \
             FROM (SELECT {LEASE_HELD} AS held) l \
             LEFT JOIN LATERAL ( \
                 SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, \
                        o.headers, o.topic, o.created_at, {attempts} AS attempts, \
                        o.payload_bytes, o.content_type, o.message_key \
                 FROM outbox o {join} \
                 WHERE l.held {range} {exclusion} \
                 ORDER BY o.id LIMIT $4 \
             ) o ON true"
        );
        let mut session = self.session().await?;
        let mut rows = sqlx::query(&sql)
            .bind(&lease.name)
            .bind(&lease.holder)
            .bind(lease.epoch)
            .bind(limits.rows)
            .fetch(session.conn());
        let mut out = Vec::new();
        let mut held = false;
        let mut bytes = 0i64;
        let mut cut = false;
        // Columns by position (the order of the SELECT list): this loop runs per row. Their
        // types are checked once, on the statement's first row (every row has the same
        // columns); sqlx's per-value check cost about a tenth of the relay's CPU per event.
        let mut checked = false;
        while let Some(r) = rows.try_next().await? {
            if !checked {
                check_claim_types(&r)?;
                checked = true;
            }
            held = r.try_get_unchecked::<bool, _>(0)?;
            let Some(id) = r.try_get_unchecked::<Option<i64>, _>(1)? else {
                continue;
            };
            if bytes >= limits.bytes {
                // Over the bound once rendered: read on (the statement must finish) but keep
                // nothing; these rows come first in the next batch.
                cut = true;
                continue;
            }
            let payload = match (
                r.try_get_unchecked::<Option<String>, _>(6)?,
                r.try_get_unchecked::<Option<Vec<u8>>, _>(11)?,
            ) {
                (Some(json), _) => Payload::Json(json),
                (None, Some(bytes)) => Payload::Binary {
                    bytes,
                    content_type: r
                        .try_get_unchecked::<Option<String>, _>(12)?
                        .unwrap_or_else(|| {
                            outbox_kit::envelope::DEFAULT_BINARY_CONTENT_TYPE.to_owned()
                        }),
                },
                (None, None) => Payload::Tombstone,
            };
            let headers: &str = r.try_get_unchecked(7)?;
            let row_bytes = (payload.len() + headers.len()) as i64;
            bytes += row_bytes;
            let event_id = r.try_get_unchecked::<Uuid, _>(2)?;
            let aggregate_type: String = r.try_get_unchecked(3)?;
            let aggregate_id: String = r.try_get_unchecked(4)?;
            let message = decode_headers(headers);
            out.push(ClaimedRow {
                attempts: r.try_get_unchecked(10)?,
                bytes: row_bytes,
                message: match message {
                    Ok(headers) => Ok(EventEnvelope {
                        id,
                        event_id,
                        aggregate_type,
                        aggregate_id,
                        event_type: r.try_get_unchecked(5)?,
                        payload,
                        key: r.try_get_unchecked(13)?,
                        headers,
                        topic: r.try_get_unchecked(8)?,
                        created_at: r.try_get_unchecked::<DateTime<Utc>, _>(9)?,
                    }),
                    Err(e) => Err(Box::new(Undecodable {
                        id,
                        event_id,
                        aggregate_type,
                        aggregate_id,
                        error: format!("headers are not decodable: {e}"),
                    })),
                },
            });
        }
        drop(rows);
        session.finish().await?;
        if !held {
            return Ok(ClaimedBatch::LeaseLost);
        }
        Ok(ClaimedBatch::Rows(out, cut))
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
        self.mark_published_clearing(lease, ids, &[]).await
    }

    /// [`Store::mark_published`], also deleting the failure records of `had_failures` (rows
    /// of `ids` that failed before and were now published), in the same statement.
    ///
    /// # Errors
    /// Database errors; retrying is safe.
    pub async fn mark_published_clearing(
        &self,
        lease: &LeaseToken,
        ids: &[i64],
        had_failures: &[i64],
    ) -> Result<Marked, sqlx::Error> {
        let mut s = self.session().await?;
        let dense = dense_range(ids);
        let delete = match dense {
            // One descent of the primary key and a walk along its leaves, the ids checked
            // against a hash of `$4` (PostgreSQL hashes a constant array: the statement is not
            // prepared, so every execution is planned with its values), instead of one descent
            // per id: half the buffer reads and about half the time for a batch of 10 000.
            Some((lo, hi)) => format!(
                "DELETE FROM outbox WHERE id >= {lo} AND id <= {hi} AND (id + 0) = ANY($4) \
                 AND EXISTS (SELECT 1 FROM l) RETURNING 1"
            ),
            None => {
                "DELETE FROM outbox WHERE id = ANY($4) AND EXISTS (SELECT 1 FROM l) RETURNING 1"
                    .to_owned()
            }
        };
        let sql = format!(
            "WITH l AS ( \
                 SELECT 1 FROM outbox_relay_lease \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 FOR SHARE \
             ), d AS ({delete}), f AS ( \
                 DELETE FROM outbox_failure WHERE outbox_id = ANY($5) AND EXISTS (SELECT 1 FROM l) \
             ) \
             SELECT (SELECT count(*) FROM l) AS held, (SELECT count(*) FROM d) AS deleted"
        );
        let row = sqlx::query(&sql)
            .persistent(dense.is_none())
            .bind(&lease.name)
            .bind(&lease.holder)
            .bind(lease.epoch)
            .bind(ids)
            .bind(had_failures)
            .fetch_one(s.conn())
            .await?;
        s.finish().await?;
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
        let mut s = self.lease_session().await?;
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
        .fetch_optional(s.conn())
        .await?;
        s.finish().await?;
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
        let mut s = self.lease_session().await?;
        let n = sqlx::query(
            "UPDATE outbox_relay_lease \
             SET renewed_at = now(), expires_at = now() + make_interval(secs => $4) \
             WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(&lease.name)
        .bind(&lease.holder)
        .bind(lease.epoch)
        .bind(ttl.as_secs_f64())
        .execute(s.conn())
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(n == 1)
    }

    /// Gives the lease up so a standby can take over at once.
    ///
    /// # Errors
    /// Database errors.
    pub async fn release_lease(&self, lease: &LeaseToken) -> Result<(), sqlx::Error> {
        let mut s = self.lease_session().await?;
        sqlx::query(
            "UPDATE outbox_relay_lease SET expires_at = now() \
             WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(&lease.name)
        .bind(&lease.holder)
        .bind(lease.epoch)
        .execute(s.conn())
        .await?;
        s.finish().await?;
        Ok(())
    }

    /// The lease row, if any.
    ///
    /// # Errors
    /// Database errors.
    pub async fn lease_info(&self, name: &str) -> Result<Option<LeaseInfo>, sqlx::Error> {
        let mut s = self.session().await?;
        let row = sqlx::query(
            "SELECT holder, epoch, \
                    extract(epoch FROM now() - renewed_at)::float8 AS renewed_ago, \
                    extract(epoch FROM expires_at - now())::float8 AS expires_in \
             FROM outbox_relay_lease WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(s.conn())
        .await?;
        s.finish().await?;
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

/// Checks the claim's columns (by position, as its SELECT lists them) against the types the
/// relay decodes them as, so the rows can be decoded without sqlx's per-value check: a schema
/// that differs from the migrations' is an error naming the column, never a misread value. (A
/// statement a connection prepared before such a change is refused by PostgreSQL itself,
/// "cached plan must not change result type", and the connection is closed: see
/// [`crate::session::Session`].)
fn check_claim_types(row: &sqlx::postgres::PgRow) -> Result<(), sqlx::Error> {
    use sqlx::postgres::Postgres;
    use sqlx::{Column, Type, TypeInfo};
    fn is<T: Type<Postgres>>(row: &sqlx::postgres::PgRow, i: usize) -> Result<(), sqlx::Error> {
        let column = row.column(i);
        let ty = column.type_info();
        if T::compatible(ty) {
            return Ok(());
        }
        Err(sqlx::Error::ColumnDecode {
            index: format!("{i} ({})", column.name()),
            source: format!(
                "the claim reads it as {}, the database has {}",
                T::type_info().name(),
                ty.name()
            )
            .into(),
        })
    }
    is::<bool>(row, 0)?;
    is::<i64>(row, 1)?;
    is::<Uuid>(row, 2)?;
    for text in [3, 4, 5, 6, 7, 8, 12, 13] {
        is::<String>(row, text)?;
    }
    is::<DateTime<Utc>>(row, 9)?;
    is::<i32>(row, 10)?;
    is::<Vec<u8>>(row, 11)?;
    Ok(())
}

/// A row's `headers` column (its `jsonb` text) as JSON; `{}`, the common case, without a parse.
/// Text PostgreSQL accepted but JSON readers refuse (e.g. numbers beyond `f64`) is an error:
/// the row is parked as undecodable instead of stopping the batch.
fn decode_headers(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    if text == "{}" {
        Ok(serde_json::Value::Object(Default::default()))
    } else {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::decode_headers;

    proptest! {
        /// Any column text decodes or is an error (the row is parked), never a panic; what
        /// decodes round-trips, and the `{}` shortcut agrees with a full parse.
        #[test]
        fn any_headers_text_decodes_or_errs(text in prop_oneof![
            ".{0,40}",
            r#"\{("[a-z]{1,3}": ("[^"\\]{0,5}"|[0-9e.+-]{1,8}|null|true|\[\])(, )?){0,3}\}"#,
        ]) {
            if let Ok(v) = decode_headers(&text) {
                prop_assert_eq!(decode_headers(&v.to_string()).unwrap(), v);
            }
            prop_assert_eq!(
                decode_headers("{}").unwrap(),
                serde_json::from_str::<serde_json::Value>("{}").unwrap()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dense_range;

    #[test]
    fn a_dense_run_of_ids_is_deleted_by_range() {
        let ids: Vec<i64> = (0..100).map(|i| 1_000 + 2 * i).collect();
        assert_eq!(dense_range(&ids), Some((1_000, 1_198)));
        let mut shuffled = ids.clone();
        shuffled.reverse();
        assert_eq!(dense_range(&shuffled), Some((1_000, 1_198)));
    }

    #[test]
    fn few_or_scattered_ids_are_looked_up_one_by_one() {
        let few: Vec<i64> = (0..63).collect();
        assert_eq!(dense_range(&few), None);
        // 100 ids spread over 400 or more: the walk would read more than four per id.
        let sparse: Vec<i64> = (0..100).map(|i| i * 5).collect();
        assert_eq!(dense_range(&sparse), None);
        let far = [vec![i64::MIN], (0..100).collect(), vec![i64::MAX]].concat();
        assert_eq!(dense_range(&far), None);
    }
}
