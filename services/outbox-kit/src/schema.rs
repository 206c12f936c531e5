//! The outbox schema (`migrations/outbox`), embedded so the relay and every service apply the
//! same migrations.

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
