//! The outbox's buckets as the store sees them: the layout (how many buckets, under which
//! layout number), the relays sharing them (`outbox_relay_member`), the bucket leases' rows and
//! the operator's change of the bucket count. What a bucket is and how relays share them:
//! [`crate::buckets`].

use std::time::Duration;

use sqlx::{Executor, Row};

use super::pool::Store;
use crate::buckets::{Layout, MAX_BUCKETS};

/// A bucket's lease row as the relays' acquisition rounds see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRow {
    /// The bucket.
    pub bucket: i16,
    /// The holder, while the lease is unexpired.
    pub holder: Option<String>,
}

/// What one acquisition round sees ([`Store::round_view`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundView {
    /// The outbox's layout.
    pub layout: Layout,
    /// Live members sharing the lease, this relay included.
    pub members: i64,
    /// The lease rows of the layout's buckets, in bucket order.
    pub rows: Vec<BucketRow>,
}

/// The query of the bucket (from 0) and unexpired holder of each lease row named in the
/// `names` parameter, in the order of the names (a name without a row: no holder).
fn bucket_rows_sql(names: &str) -> String {
    format!(
        "SELECT (n.bucket - 1)::int2 AS bucket, l.holder \
         FROM unnest({names}::text[]) WITH ORDINALITY AS n(name, bucket) \
         LEFT JOIN outbox_relay_lease l ON l.name = n.name AND l.expires_at > now()"
    )
}

/// The lease row names of `layout`'s buckets, bucket 0 first.
fn lease_names(lease: &str, layout: Layout) -> Vec<String> {
    (0..layout.buckets)
        .map(|b| layout.lease_name(lease, b))
        .collect()
}

/// The bucket rows of `names` ([`bucket_rows_sql`]) on `conn`, in bucket order.
async fn read_bucket_rows(
    conn: &mut sqlx::PgConnection,
    names: &[String],
) -> Result<Vec<BucketRow>, sqlx::Error> {
    let rows = sqlx::query(&format!("{} ORDER BY bucket", bucket_rows_sql("$1")))
        .bind(names)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| BucketRow {
            bucket: r.get(0),
            holder: r.get(1),
        })
        .collect())
}

/// Why `buckets set` refused.
#[derive(Debug, thiserror::Error)]
pub enum SetBucketsError {
    /// A count outside 1..=[`MAX_BUCKETS`].
    #[error("the bucket count must be between 1 and {MAX_BUCKETS}, not {0}")]
    OutOfRange(i64),
    /// A relay holds a lease of the outbox, or held it until recently without releasing it:
    /// the count changes only while none publishes.
    #[error("relay {holder:?} holds {lease:?}, or held it less than 90 s ago without releasing it (killed or stopped: its Kafka transaction may still commit): stop every relay of the outbox with SIGTERM, or wait, then run the command again")]
    Held {
        /// The lease row.
        lease: String,
        /// Its holder.
        holder: String,
    },
    /// Relays of another lease name use this outbox.
    #[error("relays of another lease name ({0:?}) use this outbox: run the command with that --lease-name, or remove that lease's rows once its relays are gone")]
    OtherLease(String),
    /// The database.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl Store {
    /// The outbox's bucket layout.
    ///
    /// # Errors
    /// Database errors.
    pub async fn layout(&self) -> Result<Layout, sqlx::Error> {
        let mut s = self.lease_session().await?;
        let row = sqlx::query("SELECT buckets, layout FROM outbox_buckets")
            .fetch_one(s.conn())
            .await?;
        s.finish().await?;
        Ok(Layout {
            buckets: row.get::<i32, _>(0) as i16,
            number: row.get(1),
        })
    }

    /// Leaves the relays sharing `lease` (on shutdown, after releasing its buckets): the others
    /// count one member fewer at once instead of after its row expired.
    ///
    /// # Errors
    /// Database errors.
    pub async fn leave_membership(&self, lease: &str, instance: &str) -> Result<(), sqlx::Error> {
        let mut s = self.lease_session().await?;
        sqlx::query("DELETE FROM outbox_relay_member WHERE lease = $1 AND instance = $2")
            .bind(lease)
            .bind(instance)
            .execute(s.conn())
            .await?;
        s.finish().await?;
        Ok(())
    }

    /// One acquisition round, in one statement (a relay runs a round every second, idle too):
    /// renews this relay's membership of the relays sharing `lease` (joining if new), counts
    /// the live members (itself included), reads the layout and the lease rows of the buckets
    /// of `expected` (the layout of the last round); when the layout is not `expected` (the
    /// first round, or the count changed), its rows are read again in the same session. Rows
    /// of members gone for an hour are deleted on the way.
    ///
    /// Bounded to `ttl` (a link stalled under the lease's kept connection fails the round
    /// instead of hanging it: [`Store::lease_session`]; a busy server only slows it).
    ///
    /// # Errors
    /// Database errors; a timed-out I/O error past the bound.
    pub async fn round_view(
        &self,
        lease: &str,
        instance: &str,
        ttl: Duration,
        expected: Option<Layout>,
    ) -> Result<RoundView, sqlx::Error> {
        super::within(
            ttl,
            self.round_view_unbounded(lease, instance, ttl, expected),
        )
        .await
    }

    async fn round_view_unbounded(
        &self,
        lease: &str,
        instance: &str,
        ttl: Duration,
        expected: Option<Layout>,
    ) -> Result<RoundView, sqlx::Error> {
        let names = expected.map_or_else(Vec::new, |l| lease_names(lease, l));
        let mut s = self.lease_session().await?;
        let row = sqlx::query(&format!(
            "WITH me AS ( \
                 INSERT INTO outbox_relay_member AS m (lease, instance, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3)) \
                 ON CONFLICT (lease, instance) DO UPDATE SET expires_at = EXCLUDED.expires_at), \
             gone AS ( \
                 DELETE FROM outbox_relay_member \
                 WHERE lease = $1 AND expires_at < now() - interval '1 hour'), \
             b AS ({}) \
             SELECT o.buckets, o.layout, \
                 (SELECT 1 + count(*) FROM outbox_relay_member \
                  WHERE lease = $1 AND instance <> $2 AND expires_at > now()) AS members, \
                 ARRAY(SELECT bucket FROM b ORDER BY bucket) AS buckets_of, \
                 ARRAY(SELECT holder FROM b ORDER BY bucket) AS holders \
             FROM outbox_buckets o",
            bucket_rows_sql("$4")
        ))
        .bind(lease)
        .bind(instance)
        .bind(ttl.as_secs_f64())
        .bind(&names)
        .fetch_one(s.conn())
        .await?;
        let layout = Layout {
            buckets: row.get::<i32, _>("buckets") as i16,
            number: row.get("layout"),
        };
        let rows = if expected == Some(layout) {
            let buckets: Vec<i16> = row.get("buckets_of");
            let holders: Vec<Option<String>> = row.get("holders");
            buckets
                .into_iter()
                .zip(holders)
                .map(|(bucket, holder)| BucketRow { bucket, holder })
                .collect()
        } else {
            read_bucket_rows(s.conn(), &lease_names(lease, layout)).await?
        };
        s.finish().await?;
        Ok(RoundView {
            layout,
            members: row.get("members"),
            rows,
        })
    }

    /// The lease rows of `layout`'s buckets (a bucket whose row does not exist yet is free).
    ///
    /// # Errors
    /// Database errors.
    pub async fn bucket_rows(
        &self,
        lease: &str,
        layout: Layout,
    ) -> Result<Vec<BucketRow>, sqlx::Error> {
        let mut s = self.lease_session().await?;
        let rows = read_bucket_rows(s.conn(), &lease_names(lease, layout)).await?;
        s.finish().await?;
        Ok(rows)
    }

    /// Changes the outbox's bucket count to `buckets` (the operator's `buckets set`), in one
    /// transaction that locks the outbox against writers: refused while any relay holds a
    /// lease of `lease` (the whole-outbox row or a bucket's). Every row of the outbox moves to
    /// its bucket under the new count; with more than one bucket, the insert trigger that sets
    /// it and the index claims scan are created (dropped again for one bucket). The
    /// whole-outbox row is parked as held forever by `<buckets>` while the outbox has several
    /// buckets, so a relay of a version without buckets stands by instead of publishing
    /// beside the bucketed ones. Returns the new layout (unchanged when the count is).
    ///
    /// # Errors
    /// [`SetBucketsError`].
    pub async fn set_buckets(&self, lease: &str, buckets: i64) -> Result<Layout, SetBucketsError> {
        if !(1..=i64::from(MAX_BUCKETS)).contains(&buckets) {
            return Err(SetBucketsError::OutOfRange(buckets));
        }
        let buckets = buckets as i16;
        let mut tx = self.transaction().await?;
        tx.conn()
            .execute(
                "SET LOCAL lock_timeout = '30s'; LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE",
            )
            .await?;
        let row = sqlx::query("SELECT buckets, layout FROM outbox_buckets FOR UPDATE")
            .fetch_one(tx.conn())
            .await?;
        let old = Layout {
            buckets: row.get::<i32, _>(0) as i16,
            number: row.get(1),
        };
        if old.buckets == buckets {
            tx.finish().await?;
            return Ok(old);
        }
        // Relays of another lease name on this outbox: the count is the outbox's, and they
        // would not see their whole-outbox lease parked.
        let other: Option<String> = sqlx::query_scalar(
            "SELECT name FROM outbox_relay_lease WHERE name <> $1 AND name NOT LIKE $2 LIMIT 1",
        )
        .bind(lease)
        .bind(format!("{}/%", like_escape(lease)))
        .fetch_optional(tx.conn())
        .await?;
        if let Some(other) = other {
            return Err(SetBucketsError::OtherLease(other));
        }
        // Every lease row of the relays, locked: none may be held, nor have expired without
        // being released (SIGKILL, SIGSTOP) so recently that its holder's Kafka transaction
        // could still commit (`transaction.timeout.ms` is 60 s).
        let rows: Vec<(String, String, bool)> = sqlx::query_as(
            "SELECT name, holder, \
                    expires_at > now() OR (released_at IS NULL \
                        AND renewed_at > now() - interval '90 seconds') \
             FROM outbox_relay_lease \
             WHERE (name = $1 OR name LIKE $2) AND holder <> $3 \
             ORDER BY name FOR UPDATE",
        )
        .bind(lease)
        .bind(format!("{}/%", like_escape(lease)))
        .bind(crate::buckets::BUCKETED_HOLDER)
        .fetch_all(tx.conn())
        .await?;
        if let Some((lease, holder, _)) = rows.into_iter().find(|(_, _, busy)| *busy) {
            return Err(SetBucketsError::Held { lease, holder });
        }
        let new = Layout {
            buckets,
            number: old.number + 1,
        };
        // The old layout's bucket rows go; the whole-outbox row stays (its epoch keeps growing).
        sqlx::query("DELETE FROM outbox_relay_lease WHERE name LIKE $1")
            .bind(format!("{}/%", like_escape(lease)))
            .execute(tx.conn())
            .await?;
        tx.conn()
            .execute(crate::buckets::bucket_ddl(buckets).as_str())
            .await?;
        sqlx::query(
            "UPDATE outbox SET bucket = CASE WHEN $1 = 1 THEN 0 \
                 ELSE outbox_bucket_of(aggregate_type, aggregate_id) END \
             WHERE bucket IS DISTINCT FROM (CASE WHEN $1 = 1 THEN 0 \
                 ELSE outbox_bucket_of(aggregate_type, aggregate_id) END)",
        )
        .bind(i32::from(buckets))
        .execute(tx.conn())
        .await?;
        // Several buckets: the whole-outbox row is held for good by `<buckets>` (a relay
        // without buckets never sees it expire); one bucket: it is free again, under a new
        // epoch.
        super::lease::take(
            tx.conn(),
            super::lease::Take {
                name: lease,
                holder: if buckets > 1 {
                    crate::buckets::BUCKETED_HOLDER
                } else {
                    ""
                },
                expires: if buckets > 1 {
                    super::lease::Expiry::Never
                } else {
                    super::lease::Expiry::Now
                },
                layout: None,
                force: true,
            },
        )
        .await?;
        sqlx::query("UPDATE outbox_buckets SET buckets = $1, layout = $2, changed_at = now()")
            .bind(i32::from(new.buckets))
            .bind(new.number)
            .execute(tx.conn())
            .await?;
        tx.finish().await?;
        Ok(new)
    }
}

/// `s` with `LIKE`'s special characters escaped (the default escape, backslash).
fn like_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}
