//! A fresh database per test.

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// A database created for one test, with the outbox schema applied.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its URL.
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
}

/// Replaces the database name in a PostgreSQL URL.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// Creates a database with a random name on the server of `admin_url` and migrates it.
pub async fn fresh_database_on(admin_url: &str) -> TestDb {
    let db = empty_database_on(admin_url).await;
    outbox_kit::schema::migrate(&db.pool).await.unwrap();
    db
}

/// A database with a random name on the shared server (`DATABASE_URL`), without any migration.
pub async fn empty_database() -> TestDb {
    let admin = std::env::var("DATABASE_URL").expect("DATABASE_URL is not set");
    empty_database_on(&admin).await
}

/// Creates a database with a random name on the server of `admin_url`, without migrating it.
pub async fn empty_database_on(admin_url: &str) -> TestDb {
    let name = format!("t_{:016x}", rand::random::<u64>());
    let mut admin = PgConnection::connect(admin_url)
        .await
        .expect("connect to DATABASE_URL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = with_database(admin_url, &name);
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(&url)
        .await
        .unwrap();
    TestDb { url, pool }
}

/// A fresh database on the shared server (`DATABASE_URL`).
pub async fn fresh_database() -> TestDb {
    let admin = std::env::var("DATABASE_URL").expect(
        "DATABASE_URL is not set: run the tests with `make test`, or start PostgreSQL with \
         `deploy/local/up.sh` and source its env.sh",
    );
    fresh_database_on(&admin).await
}

/// Unpublished rows left in the outbox.
pub async fn backlog(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await
}

/// Every table's row count and the MD5 of its rows (as text, sorted), by `schema.table`
/// (migration bookkeeping left out): equal fingerprints mean no row was added, removed or
/// changed in between.
pub async fn fingerprint_all(pool: &PgPool) -> std::collections::BTreeMap<String, (i64, String)> {
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT schemaname::text, tablename::text FROM pg_tables \
         WHERE schemaname NOT IN ('pg_catalog', 'information_schema') \
           AND tablename <> '_sqlx_migrations' ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = std::collections::BTreeMap::new();
    for (schema, table) in tables {
        let row: (i64, String) = sqlx::query_as(&format!(
            "SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') \
             FROM \"{schema}\".\"{table}\" t"
        ))
        .fetch_one(pool)
        .await
        .unwrap();
        out.insert(format!("{schema}.{table}"), row);
    }
    out
}

/// Row counts and an md5 of every row of `tables` (the outbox without its delivery columns:
/// the relay marks rows as it publishes them): equal before and after a request means the
/// request changed nothing there.
pub async fn fingerprint(pool: &PgPool, tables: &[&str]) -> Vec<(String, i64, String)> {
    let mut out = Vec::new();
    for table in tables.iter().copied().chain(["outbox"]) {
        let rows = if table == "outbox" {
            "(SELECT id, aggregate_type, aggregate_id, event_type, payload FROM outbox)"
        } else {
            table
        };
        let (count, hash): (i64, Option<String>) = sqlx::query_as(&format!(
            "SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {rows} t"
        ))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("fingerprint of {table}: {e}"));
        out.push((table.to_owned(), count, hash.unwrap_or_default()));
    }
    out
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
