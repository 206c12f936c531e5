//! The catalog.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::domain::{Cents, SkuId, SkuName};

/// One `skus` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SkuRow {
    /// The SKU's id.
    pub sku_id: String,
    /// Display name.
    pub name: String,
    /// Current price.
    pub price_cents: i64,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// Creates or replaces a catalog entry.
///
/// # Errors
/// When the query fails.
pub async fn upsert(
    conn: &mut PgConnection,
    sku_id: &SkuId,
    name: &SkuName,
    price: Cents,
) -> Result<SkuRow, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO skus (sku_id, name, price_cents) VALUES ($1, $2, $3) \
         ON CONFLICT (sku_id) DO UPDATE \
             SET name = EXCLUDED.name, price_cents = EXCLUDED.price_cents, updated_at = now() \
         RETURNING sku_id, name, price_cents, updated_at",
    )
    .bind(sku_id.as_str())
    .bind(name.as_str())
    .bind(price.get())
    .fetch_one(conn)
    .await
}

/// The catalog entries among `sku_ids` that exist (in no particular order).
///
/// # Errors
/// When the query fails.
pub async fn find_many(
    conn: &mut PgConnection,
    sku_ids: &[&str],
) -> Result<Vec<SkuRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, name, price_cents, updated_at FROM skus WHERE sku_id = ANY($1::text[])",
    )
    .bind(sku_ids)
    .fetch_all(conn)
    .await
}
