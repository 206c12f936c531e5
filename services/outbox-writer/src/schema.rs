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
