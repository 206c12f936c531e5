//! A fresh database per test (`test_support::db`, re-exported), and what the tests read from
//! one: the backlog, fingerprints of its rows.

use sqlx::PgPool;

pub use test_support::db::{
    empty_database, empty_database_on, fresh_database, fresh_database_on, with_database, TestDb,
};

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
