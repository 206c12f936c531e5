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

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, PgPool, Postgres};

/// A pooled connection for one unit of work; call [`Session::finish`] when it succeeded (a
/// session dropped without it closes its connection).
#[derive(Debug)]
pub struct Session {
    conn: PoolConnection<Postgres>,
    /// A transaction was opened.
    tx: bool,
    /// Behind PgBouncer: deallocate the statements before the commit.
    deallocate: bool,
    /// [`Session::finish`] ran: the unit of work succeeded.
    finished: bool,
}

impl Session {
    /// Acquires a connection; with `pinned`, opens a transaction on it.
    ///
    /// # Errors
    /// Database errors.
    pub async fn begin(pool: &PgPool, pinned: bool) -> Result<Self, sqlx::Error> {
        Self::open(pool, pinned, pinned).await
    }

    /// Acquires a connection and opens a transaction on it, whatever the mode (`pgbouncer`:
    /// behind PgBouncer).
    ///
    /// # Errors
    /// Database errors.
    pub async fn transaction(pool: &PgPool, pgbouncer: bool) -> Result<Self, sqlx::Error> {
        Self::open(pool, true, pgbouncer).await
    }

    async fn open(pool: &PgPool, tx: bool, deallocate: bool) -> Result<Self, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        if tx {
            // A simple query: no prepared statement.
            conn.execute("BEGIN").await?;
        }
        Ok(Self {
            conn,
            tx,
            deallocate,
            finished: false,
        })
    }

    /// The connection to run statements on.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
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
            self.conn.execute(end).await?;
        }
        self.finished = true;
        Ok(())
    }
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
        if !self.finished {
            self.conn.close_on_drop();
        }
    }
}
