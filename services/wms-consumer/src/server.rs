//! Start-up: the migrations (outbox, inbox, then the WMS's own).

use sqlx::PgPool;

/// The WMS's own migrations (`migrations/wms`). Versions differ from the outbox's and the
/// inbox's; each migrator ignores the others'.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/wms");
    m.set_ignore_missing(true);
    m
}

/// Applies the outbox, inbox and WMS migrations.
///
/// # Errors
/// When the database is unreachable or a migration fails.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    outbox_kit::schema::migrate(pool).await?;
    outbox_kit::schema::migrate_inbox(pool).await?;
    migrator().run(pool).await
}
