//! One statement's connection, safe behind PgBouncer's transaction pooling.
//!
//! sqlx runs a statement with parameters as Parse + Describe + Sync, then Bind + Execute +
//! Sync. Between the two Syncs the connection is idle, and a transaction-pooling PgBouncer may
//! hand the server connection to another client: the Bind then finds no statement, or worse,
//! another client's unnamed statement. And sqlx names its statements (`sqlx_s_1`, ...) even
//! with the statement cache off (`statement_cache_capacity(0)`; the name is only not reused),
//! so two clients collide on one server connection ("prepared statement already exists").
//!
//! So behind PgBouncer ([`Store::connect_lazy_with`](crate::store::Store::connect_lazy_with)
//! with `pgbouncer`), every statement runs in its own explicit transaction — PgBouncer keeps
//! the server connection for the whole transaction — and the transaction ends with
//! `DEALLOCATE ALL; COMMIT` in one round trip, so no named statement outlives it on the
//! server. Directly on PostgreSQL a session is just a pooled connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, PgPool, Postgres};

/// A connection kept between the units of work of one loop (a bucket's claims and marks), with
/// when it was last used: see [`Store::holding`](crate::store::Store::holding).
pub(crate) type Held = Arc<Mutex<Option<(PoolConnection<Postgres>, Instant)>>>;

/// A pooled connection for one unit of work; call [`Session::finish`] when it succeeded (a
/// session dropped without it closes its connection).
#[derive(Debug)]
pub struct Session {
    /// Always `Some` until [`Session::finish`] hands it back to `home`.
    conn: Option<PoolConnection<Postgres>>,
    /// Where the connection goes when the work succeeded, instead of back to the pool.
    home: Option<Held>,
    /// A transaction was opened.
    tx: bool,
    /// Behind PgBouncer: deallocate the statements before the commit.
    deallocate: bool,
    /// [`Session::finish`] ran: the unit of work succeeded.
    finished: bool,
}

impl Session {
    /// Acquires a connection and opens a transaction on it, whatever the mode (`pgbouncer`:
    /// behind PgBouncer).
    ///
    /// # Errors
    /// Database errors.
    pub async fn transaction(pool: &PgPool, pgbouncer: bool) -> Result<Self, sqlx::Error> {
        Self::open(pool, true, pgbouncer).await
    }

    /// [`Session::transaction`], whose lock waits and idle time PostgreSQL bounds to `limit`
    /// (it ends the transaction past it), opened in one round trip.
    ///
    /// # Errors
    /// Database errors.
    pub async fn bounded_transaction(
        pool: &PgPool,
        pgbouncer: bool,
        limit: Duration,
    ) -> Result<Self, sqlx::Error> {
        let conn = pool.acquire().await?;
        Self::on(conn, Some(&begin_bounded(limit)), pgbouncer, None).await
    }

    async fn open(pool: &PgPool, tx: bool, deallocate: bool) -> Result<Self, sqlx::Error> {
        let conn = pool.acquire().await?;
        Self::on(conn, tx.then_some("BEGIN"), deallocate, None).await
    }

    /// A session on `conn`, which goes to `home` when the work succeeded; a transaction opened
    /// by `begin` (a simple query: no prepared statement) when given.
    pub(super) async fn on(
        mut conn: PoolConnection<Postgres>,
        begin: Option<&str>,
        deallocate: bool,
        home: Option<Held>,
    ) -> Result<Self, sqlx::Error> {
        let mut session = Self {
            conn: None,
            home,
            tx: begin.is_some(),
            deallocate,
            finished: false,
        };
        if let Some(begin) = begin {
            if let Err(e) = conn.execute(begin).await {
                conn.close_on_drop();
                return Err(e);
            }
        }
        session.conn = Some(conn);
        Ok(session)
    }

    /// The connection to run statements on.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a session has its connection until it finishes")
    }

    /// Ends the unit of work: commits it (behind PgBouncer, after deallocating the statements
    /// it prepared).
    ///
    /// # Errors
    /// Database errors; the work is then rolled back.
    pub async fn finish(mut self) -> Result<(), sqlx::Error> {
        if self.tx {
            // Directly on PostgreSQL, sqlx's cached statements must stay.
            let end = if self.deallocate {
                "DEALLOCATE ALL; COMMIT"
            } else {
                "COMMIT"
            };
            self.conn().execute(end).await?;
        }
        self.finished = true;
        if let Some(home) = self.home.take() {
            let mut slot = home.lock().expect("the held connection's lock");
            if slot.is_none() {
                *slot = self.conn.take().map(|c| (c, Instant::now()));
            }
        }
        Ok(())
    }
}

/// The statement that opens a transaction in which PostgreSQL waits at most `limit` for a lock
/// and ends the transaction when it sits idle that long (a link that stalls between two
/// statements must not leave a row locked); `SET LOCAL` ends with the transaction, also behind
/// PgBouncer's transaction pooling.
pub(super) fn begin_bounded(limit: Duration) -> String {
    let ms = limit.as_millis().clamp(1, i32::MAX as u128);
    format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {ms}; \
         SET LOCAL lock_timeout = {ms}"
    )
}

impl Drop for Session {
    fn drop(&mut self) {
        // A unit of work that failed or was given up does not hand its connection on: a
        // transaction left open is rolled back by the server as the connection closes, and the
        // connection's cached statements go with it. After a migration changed the type of a
        // column a cached statement returns, PostgreSQL refuses that statement on that
        // connection every time ("cached plan must not change result type"); kept, the
        // connection would fail the relay's claims whenever the pool handed it out, until it
        // retired (30 min); a new connection prepares the statement afresh.
        if let (false, Some(conn)) = (self.finished, self.conn.as_mut()) {
            conn.close_on_drop();
        }
    }
}
