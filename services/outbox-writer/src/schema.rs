//! The shared schemas, embedded so the relay and every service apply the same migrations:
//! the outbox (`migrations/outbox`) in every database that publishes events, the inbox
//! (`migrations/inbox`) in every database that consumes them, and the optional producer-side
//! ledger (`migrations/ledger`) that `outbox-audit` reconciles the broker against.

/// Migrations that create the outbox table and the relay's lease table.
///
/// Missing versions are ignored so a service can keep its own migrations (with distinct
/// versions) in the same database.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/outbox");
    m.set_ignore_missing(true);
    m
}

/// Applies the outbox migrations.
///
/// # Errors
/// Fails when the database is unreachable or a migration fails.
pub async fn migrate(pool: &sqlx::PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    migrator().run(pool).await
}

/// Migrations that create the consumers' `inbox` table. Like [`migrator`], they ignore the
/// versions of the other migration sets sharing the database.
pub fn inbox_migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/inbox");
    m.set_ignore_missing(true);
    m
}

/// Applies the inbox migrations.
///
/// # Errors
/// Fails when the database is unreachable or a migration fails.
pub async fn migrate_inbox(pool: &sqlx::PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    inbox_migrator().run(pool).await
}

/// Migrations of the optional outbox ledger (`outbox_ledger` and the trigger that fills it
/// from every committed outbox row), for databases that `outbox-audit` reconciles. Apply after
/// [`migrate`]; like it, they ignore the versions of the other migration sets.
pub fn ledger_migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/ledger");
    m.set_ignore_missing(true);
    m
}

/// Applies the ledger migrations (the outbox table must exist).
///
/// # Errors
/// Fails when the database is unreachable or a migration fails.
pub async fn migrate_ledger(pool: &sqlx::PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    ledger_migrator().run(pool).await
}

/// What is wrong with the outbox's id sequence for the insert lock, if anything: a cache above
/// 1 hands each session a block of ids, so ids stop following commit order and an aggregate's
/// events could be published out of order (migration `20260101000006`). `None` when the
/// sequence is fine or there is no outbox yet.
///
/// # Errors
/// Database errors.
pub async fn id_sequence_problem<'e>(
    db: impl sqlx::PgExecutor<'e>,
) -> Result<Option<String>, sqlx::Error> {
    let row: Option<(String, i64)> = sqlx::query_as(
        "SELECT s.seqrelid::regclass::text, s.seqcache FROM pg_sequence s \
         WHERE s.seqrelid = to_regclass(pg_get_serial_sequence('outbox', 'id'))",
    )
    .fetch_optional(db)
    .await?;
    Ok(row.and_then(|(name, cache)| {
        (cache > 1).then(|| {
            format!(
                "the outbox's id sequence {name} has CACHE {cache}: each session takes ids in \
                 blocks of {cache}, so ids stop following commit order and an aggregate's \
                 events could be published out of order. Fix: ALTER SEQUENCE {name} CACHE 1"
            )
        })
    }))
}
