//! A fresh database per test (or benchmark phase): created with a unique name on the server of
//! an admin URL, so tests sharing a server never see each other's rows.

use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, Connection, PgPool};

/// A database created for one test, with a pool on it.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its URL.
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
}

/// `DATABASE_URL`: the admin URL of the shared server, on which each test creates its own
/// database.
///
/// # Panics
/// When it is not set.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL").expect(
        "DATABASE_URL is not set: run the tests with `make test`, or start PostgreSQL with \
         `deploy/local/up.sh` and source its env.sh",
    )
}

/// A database name no other test uses: `prefix` and 16 random hex digits.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}{:016x}", rand::random::<u64>())
}

/// Replaces the database name in a PostgreSQL URL.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// Creates database `name` on the server of `admin_url` and opens `pool` on it, connecting as
/// the relay and the services do (TLS from the URL, `DATABASE_PASSWORD_FILE`); nothing is
/// migrated.
///
/// # Errors
/// An invalid URL or setting, an unreachable server, a refused `CREATE DATABASE`.
pub async fn create(
    admin_url: &str,
    name: &str,
    pool: PgPoolOptions,
) -> Result<TestDb, sqlx::Error> {
    let admin = outbox_process::pg::connect_options(admin_url)?;
    let mut conn = admin.connect().await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let pool = pool.connect_with(admin.database(name)).await?;
    Ok(TestDb {
        url: with_database(admin_url, name),
        pool,
    })
}

/// Creates a database with a random name on the server of `admin_url`, without migrating it.
///
/// # Panics
/// When it cannot be created.
pub async fn empty_database_on(admin_url: &str) -> TestDb {
    let name = unique_name("t_");
    create(admin_url, &name, PgPoolOptions::new().max_connections(20))
        .await
        .unwrap_or_else(|e| panic!("creating database {name} on DATABASE_URL: {e}"))
}

/// Creates a database with a random name on the server of `admin_url` and applies the outbox
/// schema.
///
/// # Panics
/// When it cannot be created or migrated.
pub async fn fresh_database_on(admin_url: &str) -> TestDb {
    let db = empty_database_on(admin_url).await;
    outbox_writer::schema::migrate(&db.pool).await.unwrap();
    db
}

/// A database with a random name on the shared server (`DATABASE_URL`), without any migration.
pub async fn empty_database() -> TestDb {
    empty_database_on(&admin_url()).await
}

/// A fresh database on the shared server (`DATABASE_URL`), with the outbox schema.
pub async fn fresh_database() -> TestDb {
    fresh_database_on(&admin_url()).await
}

/// Waits, checking every 2 ms (a latency of a few milliseconds must not be rounded up to a
/// coarser poll), until outbox row `id` is gone: the relay deletes a row once the broker
/// acknowledged its message. `false` when `timeout` passed first.
pub async fn await_published(pool: &PgPool, id: i64, timeout: std::time::Duration) -> bool {
    let gone =
        outbox_process::poll::poll_every(std::time::Duration::from_millis(2), timeout, || async {
            let left: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1)")
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .unwrap_or(true);
            (!left).then_some(())
        })
        .await;
    gone.is_some()
}

/// Commits one event of aggregate (`order`, `aggregate_id`) with the NOTIFY the writers'
/// library sends, and waits until it is published ([`await_published`]): the time from its
/// commit, `None` when `timeout` passed first.
///
/// # Errors
/// Database errors of the insert.
pub async fn commit_to_published(
    pool: &PgPool,
    aggregate_id: &str,
    timeout: std::time::Duration,
) -> Result<Option<std::time::Duration>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', $1, 'E', '{}') RETURNING id",
    )
    .bind(aggregate_id)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(outbox_writer::outbox::NOTIFY_CHANNEL)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    let committed = std::time::Instant::now();
    Ok(await_published(pool, id, timeout)
        .await
        .then(|| committed.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn swaps_the_database_name() {
        assert_eq!(
            with_database("postgres://u@h:5/outbox", "x"),
            "postgres://u@h:5/x"
        );
        assert_eq!(with_database("postgres://u@h:5", "x"), "postgres://u@h:5/x");
        assert_eq!(
            with_database("postgres://u@h:5/a?sslmode=disable", "x"),
            "postgres://u@h:5/x?sslmode=disable"
        );
    }
}
