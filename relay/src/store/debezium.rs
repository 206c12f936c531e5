//! The statements `outbox-relay debezium-install` ([`crate::debezium`]) runs on its own
//! connection: the checks of the outbox and the Debezium table in the catalog, the installation
//! of the trigger it generated (the generated SQL itself is the debezium module's, beside the
//! configuration it is generated from), and the wait on Debezium's replication slot.

use sqlx::PgConnection;

/// The `outbox` the connection's `search_path` resolves (where the trigger copies to): its
/// schema, and whether it is up to date (it has the `relay_headers` column, and takes the empty
/// `message_key` of a copy without a key, and has `outbox_debezium_expand`) and `standard_conforming_strings` is on (the
/// generated SQL's literals rely on it); none when no `outbox` is on the path. (The schema of
/// the table found, not `current_schema()`: that is the first schema of the path that exists,
/// which need not hold it.)
///
/// # Errors
/// Database errors.
pub(crate) async fn outbox_schema(
    conn: &mut PgConnection,
) -> Result<Option<(String, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT n.nspname::text, \
                EXISTS (SELECT FROM pg_attribute WHERE attrelid = c.oid \
                        AND attname = 'relay_headers' AND NOT attisdropped) \
                AND EXISTS (SELECT FROM pg_constraint WHERE conrelid = c.oid \
                            AND conname = 'outbox_message_key_not_empty' \
                            AND pg_get_constraintdef(oid) LIKE '%relay_headers%') \
                AND current_setting('standard_conforming_strings') = 'on' \
                AND to_regprocedure(format('%I.outbox_debezium_expand(jsonb,boolean)', \
                                           n.nspname)) IS NOT NULL \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = to_regclass('outbox')",
    )
    .fetch_optional(conn)
    .await
}

/// The columns of `schema.table` as the catalog has them: name, type name (`pg_type.typname`)
/// and whether it is `NOT NULL`; none when there is no such table.
///
/// # Errors
/// Database errors.
pub(crate) async fn table_columns(
    conn: &mut PgConnection,
    schema: &str,
    table: &str,
) -> Result<Vec<(String, String, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT a.attname::text, t.typname::text, a.attnotnull \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         WHERE a.attrelid = to_regclass(format('%I.%I', $1::text, $2::text)) \
           AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(&mut *conn)
    .await
}

/// Runs `statements` (the generated trigger and its function) in one transaction: all of them
/// or none.
///
/// # Errors
/// Database errors; nothing is installed then.
pub(crate) async fn install_trigger(
    conn: &mut PgConnection,
    statements: &[String],
) -> Result<(), sqlx::Error> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    for s in statements {
        sqlx::query(s).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// The current WAL position, as text.
///
/// # Errors
/// Database errors.
pub(crate) async fn current_wal_lsn(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut *conn)
        .await
}

/// Whether replication slot `slot` confirmed `lsn`, and the position it confirmed; `None` when
/// there is no such slot.
///
/// # Errors
/// Database errors.
pub(crate) async fn slot_confirmed(
    conn: &mut PgConnection,
    slot: &str,
    lsn: &str,
) -> Result<Option<(bool, Option<String>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT coalesce(confirmed_flush_lsn >= $1::pg_lsn, false), confirmed_flush_lsn::text \
         FROM pg_replication_slots WHERE slot_name = $2",
    )
    .bind(lsn)
    .bind(slot)
    .fetch_optional(conn)
    .await
}
