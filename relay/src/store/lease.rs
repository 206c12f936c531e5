//! The leader lease: taking, renewing, releasing and reading the one row that says which relay
//! may publish, and under which fencing epoch ([`LeaseToken`]); claims and marks check it in
//! their own statements.

use std::time::Duration;

use sqlx::Row;

use super::pool::Store;
use super::session::Session;

/// Proof of holding the relay lease: the lease name, this instance and the fencing epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    /// Lease name.
    pub name: String,
    /// This instance.
    pub holder: String,
    /// Fencing epoch, grows with every change of holder.
    pub epoch: i64,
    /// The bucket the lease is for, when the outbox has several (`None`: the whole outbox).
    /// Claims made under the token read only this bucket's rows.
    pub bucket: Option<i16>,
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

/// True while the lease `$1` is held by `$2` under epoch `$3` and has not expired: the check a
/// claim makes in its own statement.
pub(super) const LEASE_HELD: &str = "EXISTS (SELECT 1 FROM outbox_relay_lease \
     WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now())";

impl Store {
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
        self.try_acquire(name, (None, None), holder, ttl).await
    }

    /// Takes the lease row `name`, for `bucket` (see [`LeaseToken::bucket`]), if it is free or
    /// expired and, with `layout`, while the outbox's bucket layout is still that one (a
    /// change of the bucket count commits before or after, never around it); returns the
    /// token with the new epoch.
    ///
    /// # Errors
    /// Database errors.
    pub async fn try_acquire(
        &self,
        name: &str,
        (bucket, layout): (Option<i16>, Option<i32>),
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseToken>, sqlx::Error> {
        let mut s = self.lease_session().await?;
        let epoch = take(
            s.conn(),
            Take {
                name,
                holder,
                expires: Expiry::After(ttl),
                layout,
                force: false,
            },
        )
        .await?;
        s.finish().await?;
        Ok(epoch.map(|epoch| LeaseToken {
            name: name.to_owned(),
            holder: holder.to_owned(),
            epoch,
            bucket,
        }))
    }

    /// Extends the lease; `false` when it changed hands. An expired lease nobody else took is
    /// extended under the same epoch. Never moves the expiry backwards: a renewal that waited
    /// behind this relay's own hold of the row ([`Store::hold_lease`]) was sent before the
    /// hold's own, later renewal.
    ///
    /// # Errors
    /// Database errors.
    pub async fn renew_lease(
        &self,
        lease: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, sqlx::Error> {
        let mut s = self.lease_session().await?;
        let held = renew(s.conn(), lease, ttl).await?;
        s.finish().await?;
        Ok(held)
    }

    /// [`Store::renew_lease`], waiting at most `wait` for the lease row's lock, and failing
    /// after `ttl`: `None` when the row stayed locked that long (this relay's own
    /// initialisation holds it: see
    /// [`Store::hold_lease`]), so a renewal never keeps one of the lease pool's connections
    /// while another bucket's renewal needs it.
    ///
    /// # Errors
    /// Database errors.
    pub async fn renew_lease_within(
        &self,
        lease: &LeaseToken,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<bool>, sqlx::Error> {
        // A link stalled under the lease's kept connection fails the renewal instead of hanging
        // it ([`Store::lease_session`]). Bounded by the whole time to live, not less: a renewal
        // slowed by a busy server still counts when it arrives, and one that took longer than
        // the lease lives adds no trust.
        super::within(ttl, self.renew_lease_unbounded(lease, ttl, wait)).await
    }

    async fn renew_lease_unbounded(
        &self,
        lease: &LeaseToken,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<bool>, sqlx::Error> {
        // A link that stalls between the update and the commit must not leave the row locked
        // (a takeover would wait for it for good): PostgreSQL ends the transaction after `wait`.
        let mut s = self
            .lease_transaction_within(wait.max(Duration::from_millis(100)))
            .await?;
        match renew(s.conn(), lease, ttl).await {
            Ok(held) => {
                s.finish().await?;
                Ok(Some(held))
            }
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Renews the lease and keeps its row locked in the returned open transaction: a takeover
    /// (which updates the row) waits until the transaction ends. For what must happen while no
    /// other relay can take the lease over, and be known to have happened before any could:
    /// initialising the Kafka producer ([`crate::batch`], `init`). `hold_for` bounds how long
    /// PostgreSQL keeps the transaction, and the lock, while this relay sends nothing on it (a
    /// relay stopped or cut off mid-hold then loses the lock and the hold, not the lease).
    /// `None` when the lease is no longer held under `lease`. Commit the hold with
    /// [`Session::finish`]: only a successful commit proves the lock was held throughout.
    ///
    /// Also returns the generation of the `transactional.id`s of the lease's producers (the
    /// row's `txn_generation`), first moved on by one when it is `stranded` (that generation's
    /// id cannot be initialised any more: see [`crate::publisher::Publisher::id_stranded`]; a
    /// row already past it is left as it is); a new generation counts only once the hold
    /// committed.
    ///
    /// # Errors
    /// Database errors.
    pub async fn hold_lease(
        &self,
        lease: &LeaseToken,
        ttl: Duration,
        hold_for: Duration,
        stranded: Option<i32>,
    ) -> Result<Option<(Session, i32)>, sqlx::Error> {
        let mut s = self.transaction_within(hold_for).await?;
        let generation = renew_moving(s.conn(), lease, ttl, stranded).await?;
        let Some(generation) = generation else {
            s.finish().await?;
            return Ok(None);
        };
        Ok(Some((s, generation)))
    }

    /// Renews the lease again at the end of a [`Store::hold_lease`], from the statement's own
    /// clock (the transaction's start is `now()`): the relay may trust the lease from when
    /// this statement was sent, however long the hold took. False when the row no longer
    /// carries the token (it cannot change while held: a defect if it does).
    ///
    /// # Errors
    /// Database errors.
    pub async fn renew_in_hold(
        &self,
        hold: &mut Session,
        lease: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, sqlx::Error> {
        renew(hold.conn(), lease, ttl).await
    }

    /// The offset of the last bucket record marked under the lease row of `lease`
    /// ([`Store::mark_published_clearing`]); `None` when none was.
    ///
    /// # Errors
    /// Database errors.
    pub async fn record_offset(&self, lease: &LeaseToken) -> Result<Option<i64>, sqlx::Error> {
        let mut s = self.session().await?;
        let offset: Option<Option<i64>> =
            sqlx::query_scalar("SELECT record_offset FROM outbox_relay_lease WHERE name = $1")
                .bind(&lease.name)
                .fetch_optional(s.conn())
                .await?;
        s.finish().await?;
        Ok(offset.flatten())
    }

    /// Gives the lease up so a standby can take over at once.
    ///
    /// # Errors
    /// Database errors.
    pub async fn release_lease(&self, lease: &LeaseToken) -> Result<(), sqlx::Error> {
        let mut s = self.lease_session().await?;
        sqlx::query(
            "UPDATE outbox_relay_lease SET expires_at = now(), released_at = now() \
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
}

/// Extends the lease row of `lease` from the statement's own clock (`clock_timestamp()`, not
/// the transaction's start: a renewal inside a hold counts from when it was sent); `false`
/// when the row no longer carries the token. Never moves the expiry backwards: a renewal that
/// waited behind this relay's own hold of the row was sent before the hold's own, later one.
async fn renew(
    conn: &mut sqlx::PgConnection,
    lease: &LeaseToken,
    ttl: Duration,
) -> Result<bool, sqlx::Error> {
    Ok(renew_moving(conn, lease, ttl, None).await?.is_some())
}

/// [`renew`], moving the row's `transactional.id` generation on by one when it is `stranded`:
/// the generation after it, `None` when the row no longer carries the token.
async fn renew_moving(
    conn: &mut sqlx::PgConnection,
    lease: &LeaseToken,
    ttl: Duration,
    stranded: Option<i32>,
) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE outbox_relay_lease \
         SET renewed_at = clock_timestamp(), \
             expires_at = greatest(expires_at, clock_timestamp() + make_interval(secs => $4)), \
             txn_generation = txn_generation + coalesce((txn_generation = $5)::int, 0) \
         WHERE name = $1 AND holder = $2 AND epoch = $3 \
         RETURNING txn_generation",
    )
    .bind(&lease.name)
    .bind(&lease.holder)
    .bind(lease.epoch)
    .bind(ttl.as_secs_f64())
    .bind(stranded)
    .fetch_optional(conn)
    .await
}

/// When a lease row taken by [`take`] expires.
pub(super) enum Expiry {
    /// After the time-to-live.
    After(Duration),
    /// Now: the row is free (under a new epoch).
    Now,
    /// Never (a row parked by its holder for good).
    Never,
}

/// A lease row to take: see [`take`].
pub(super) struct Take<'a> {
    pub(super) name: &'a str,
    pub(super) holder: &'a str,
    pub(super) expires: Expiry,
    /// Only while the outbox's bucket layout is this one (its row locked `FOR SHARE`).
    pub(super) layout: Option<i32>,
    /// Take it even if it has not expired (the caller made sure nobody publishes under it).
    pub(super) force: bool,
}

/// Takes (creating it if missing) the lease row `t.name` for `t.holder` under a new epoch;
/// returns the epoch, `None` when it is held (unless `t.force`) or the layout changed.
pub(super) async fn take(
    conn: &mut sqlx::PgConnection,
    t: Take<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    // A row freed at once counts as released (nobody publishes under it).
    let (expires, secs, released) = match t.expires {
        Expiry::After(ttl) => (
            "now() + make_interval(secs => $3)",
            ttl.as_secs_f64(),
            "NULL",
        ),
        Expiry::Now => ("now() + make_interval(secs => $3)", 0.0, "now()"),
        // Far in the future rather than `infinity`: `expires_at - now()` stays finite.
        Expiry::Never => (
            "'9999-12-31'::timestamptz + make_interval(secs => $3)",
            0.0,
            "NULL",
        ),
    };
    let (source, from) = match t.layout {
        Some(_) => (
            "WITH layout AS (SELECT 1 FROM outbox_buckets WHERE layout = $4 FOR SHARE) ",
            "FROM layout",
        ),
        None => ("", "WHERE $4::int4 IS NULL"),
    };
    let only_expired = if t.force {
        ""
    } else {
        "WHERE l.expires_at <= now()"
    };
    sqlx::query_scalar(&format!(
        "{source}INSERT INTO outbox_relay_lease AS l \
             (name, holder, epoch, acquired_at, renewed_at, expires_at, released_at) \
         SELECT $1, $2, 1, now(), now(), {expires}, {released} {from} \
         ON CONFLICT (name) DO UPDATE \
            SET holder = EXCLUDED.holder, epoch = l.epoch + 1, acquired_at = now(), \
                renewed_at = now(), expires_at = EXCLUDED.expires_at, \
                released_at = EXCLUDED.released_at \
          {only_expired} \
         RETURNING epoch"
    ))
    .bind(t.name)
    .bind(t.holder)
    .bind(secs)
    .bind(t.layout)
    .fetch_optional(conn)
    .await
}
