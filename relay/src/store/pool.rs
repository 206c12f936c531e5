//! The [`Store`] itself: its two pools (the batches' and the lease's own) and the sessions every
//! statement of the other files of `store` runs in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

use super::session::{Held, Session};

/// Access to the outbox database.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    /// The lease's own connection: acquiring, renewing and releasing the lease never wait
    /// for the pool the batches, the backlog gauges and the retention purge share (a backlog
    /// query over millions of rows must not cost the lease).
    lease_pool: PgPool,
    /// Behind PgBouncer's transaction pooling: see [`super::session`].
    pgbouncer: bool,
    /// The lease pool's connection the lease's statements keep between them (the acquisition
    /// rounds, every bucket's renewals): see [`Store::lease_session`].
    /// `None` when the lease shares the batches' pool ([`Store::from_pool`]): a connection
    /// kept for the lease would be one the batches' small pool lacks.
    lease_held: Option<Held>,
    /// The connection this store's statements keep between them ([`Store::holding`]).
    held: Option<Arc<HeldSlot>>,
    /// How many holding stores exist, of at most [`MAX_HELD`].
    holders: Arc<AtomicUsize>,
}

/// A holding store's connection; counted among the holders while it exists.
#[derive(Debug)]
struct HeldSlot {
    conn: Held,
    holders: Arc<AtomicUsize>,
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.holders.fetch_sub(1, Ordering::Relaxed);
    }
}

/// At most this many holding stores keep a connection of the pool's 20 each (a relay holding
/// more buckets than that hands the rest's connections back after each statement, as before).
const MAX_HELD: usize = 10;

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
    /// deallocates what it prepared ([`super::session`]).
    ///
    /// # Errors
    /// When the URL cannot be parsed.
    pub fn connect_lazy_with(database_url: &str, pgbouncer: bool) -> Result<Self, sqlx::Error> {
        let mut options = outbox_process::pg::connect_options(database_url)?;
        if pgbouncer {
            options = options.statement_cache_capacity(0).extra_float_digits(None);
        }
        // Renewals of several buckets' leases and the acquisition rounds share the lease's
        // pool, through one kept connection when they do not overlap ([`Store::lease_session`]).
        let lease_pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy_with(options.clone());
        // Connections open as needed: a relay publishing one bucket uses two or three; one
        // holding several buckets claims, marks and initialises producers for each.
        let pool = pool_options(20).connect_lazy_with(options);
        Ok(Self {
            pool,
            lease_pool,
            lease_held: Some(Held::default()),
            pgbouncer,
            held: None,
            holders: Arc::default(),
        })
    }

    /// Wraps an existing pool (directly on PostgreSQL).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            lease_pool: pool.clone(),
            lease_held: None,
            pool,
            pgbouncer: false,
            held: None,
            holders: Arc::default(),
        }
    }

    /// This store, keeping the connection of its statements ([`Store::session`]) between them
    /// instead of handing it back to the pool after each: for one loop's statements (a
    /// bucket's claims and marks, the gauges' refresh), which otherwise cost a round trip more
    /// each (sqlx tests a connection as it goes back to the pool) and, every second or so, a
    /// test before use. A connection kept
    /// idle for [`TEST_IDLE_AFTER`] is tested before it is used again; one whose statement
    /// failed is closed, and the next statement takes a new one from the pool. Past
    /// [`MAX_HELD`] holding stores, a plain clone.
    pub fn holding(&self) -> Self {
        let holding = self.holders.fetch_add(1, Ordering::Relaxed);
        if holding >= MAX_HELD {
            self.holders.fetch_sub(1, Ordering::Relaxed);
            return self.clone();
        }
        Self {
            held: Some(Arc::new(HeldSlot {
                conn: Held::default(),
                holders: self.holders.clone(),
            })),
            ..self.clone()
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
    pub(super) async fn session(&self) -> Result<Session, sqlx::Error> {
        let held = self.held.as_ref().map(|h| &h.conn);
        let begin = self.pgbouncer.then_some("BEGIN");
        kept(&self.pool, held, TEST_IDLE_AFTER, begin, self.pgbouncer).await
    }

    /// A connection of the lease's own pool for one statement (behind PgBouncer: in its own
    /// transaction), kept between them as [`Store::holding`] keeps one: the relay's
    /// acquisition round runs every second and each bucket's renewal every third of the lease's
    /// time to live, idle too; through the pool each cost two round trips more (sqlx's tests).
    /// Tested before use only after [`LEASE_TEST_IDLE_AFTER`]: the lease survives one failed
    /// renewal (it is renewed three times per time to live and trusted for four fifths of it),
    /// so a connection the server closed while idle costs one failed statement, after which a
    /// new one is taken. One on a link that stalls is given up after the lease's time to live
    /// (the round and the renewal are bounded by it), where before nothing bounded a statement
    /// once the pool's test had passed.
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn lease_session(&self) -> Result<Session, sqlx::Error> {
        let begin = self.pgbouncer.then_some("BEGIN");
        let held = self.lease_held.as_ref();
        kept(
            &self.lease_pool,
            held,
            LEASE_TEST_IDLE_AFTER,
            begin,
            self.pgbouncer,
        )
        .await
    }

    /// A transaction on the lease's own pool, bounded as [`Session::bounded_transaction`].
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn lease_transaction_within(
        &self,
        limit: Duration,
    ) -> Result<Session, sqlx::Error> {
        let begin = super::session::begin_bounded(limit);
        let held = self.lease_held.as_ref();
        kept(
            &self.lease_pool,
            held,
            LEASE_TEST_IDLE_AFTER,
            Some(&begin),
            self.pgbouncer,
        )
        .await
    }

    /// [`Store::transaction`] bounded as [`Session::bounded_transaction`].
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn transaction_within(&self, limit: Duration) -> Result<Session, sqlx::Error> {
        Session::bounded_transaction(&self.pool, self.pgbouncer, limit).await
    }

    /// A transaction, in either mode.
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn transaction(&self) -> Result<Session, sqlx::Error> {
        Session::transaction(&self.pool, self.pgbouncer).await
    }

    /// What is wrong with the outbox's id sequence, if anything
    /// ([`outbox_writer::schema::id_sequence_problem`]), in a session safe behind PgBouncer.
    ///
    /// # Errors
    /// Database errors.
    pub async fn id_sequence_problem(&self) -> Result<Option<String>, sqlx::Error> {
        let mut session = self.session().await?;
        let problem = outbox_writer::schema::id_sequence_problem(session.conn()).await?;
        session.finish().await?;
        Ok(problem)
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// A session on the connection kept in `held` (tested first when idle for `test_after`), else
/// on one of `pool`'s; its connection goes back to `held` when its work succeeded (to the pool
/// without `held`). `begin` opens a transaction (see [`Session::on`]).
async fn kept(
    pool: &PgPool,
    held: Option<&Held>,
    test_after: Duration,
    begin: Option<&str>,
    pgbouncer: bool,
) -> Result<Session, sqlx::Error> {
    let kept = held.and_then(|h| h.lock().expect("the held connection's lock").take());
    if let Some((mut conn, used)) = kept {
        // Bounded as the pool bounds its own test (a stalled link fails it, not hangs it).
        let alive = used.elapsed() < test_after
            || matches!(
                tokio::time::timeout(ACQUIRE_TIMEOUT, conn.ping()).await,
                Ok(Ok(()))
            );
        if alive {
            return Session::on(conn, begin, pgbouncer, held.cloned()).await;
        }
        // Broken or stalled while idle (a server restart, a cut link): closed, and a new one
        // from the pool.
        conn.close_on_drop();
    }
    let conn = pool.acquire().await?;
    Session::on(conn, begin, pgbouncer, held.cloned()).await
}

/// How long the relay waits for a pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection idle this long is tested (a round trip) before it is handed out; one used more
/// recently is handed out as it is.
const TEST_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The lease's kept connection idle this long is tested before use (see
/// [`Store::lease_session`]): longer than the round's period, so a relay renewing its leases
/// and running its rounds never tests it.
const LEASE_TEST_IDLE_AFTER: Duration = Duration::from_secs(5);

/// The options of the relay's pool for claims, marks and the rest: at most `max` connections.
///
/// sqlx tests a connection with a round trip when it goes back to the pool and again before
/// handing it out; under a steady load the relay claims and marks hundreds of times a second,
/// so those were two round trips of every claim's and every mark's three or four. The test
/// before use is kept only for a connection idle for [`TEST_IDLE_AFTER`] (a server restarted
/// while the relay was quiet is found before a claim). One that broke within that second
/// fails its statement: a database error, which the relay retries as any other, on a new
/// connection (a session that failed closes its own).
fn pool_options(max: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= TEST_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}
