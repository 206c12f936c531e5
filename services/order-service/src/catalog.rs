//! The catalog (`PUT /skus/{sku_id}`): the only source of prices.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::domain::{Cents, SkuId, SkuName, ValidationError};
use crate::error::Error;
use crate::store::skus;

/// `PUT /skus/{sku_id}` body as received.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "Mug", "price_cents": 1299}))]
pub struct SkuBody {
    /// Display name.
    #[schema(schema_with = SkuName::schema_object)]
    pub name: String,
    /// Price in cents.
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = Cents::schema_object)]
    pub price_cents: i64,
}

/// A validated catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sku {
    /// Its id (from the path).
    pub sku_id: SkuId,
    /// Display name.
    pub name: SkuName,
    /// Price.
    pub price: Cents,
}

impl Sku {
    /// Validates the path id and the body.
    ///
    /// # Errors
    /// When a field is invalid.
    pub fn parse(sku_id: String, body: SkuBody) -> Result<Self, ValidationError> {
        Ok(Self {
            sku_id: SkuId::parse("sku_id", sku_id)?,
            name: SkuName::parse("name", body.name)?,
            price: Cents::parse("price_cents", body.price_cents)?,
        })
    }
}

/// A catalog entry as answered.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SkuView {
    /// Its id.
    pub sku_id: String,
    /// Display name.
    pub name: String,
    /// Price in cents.
    pub price_cents: i64,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// Creates or replaces a catalog entry. Existing orders keep the prices they were made with.
///
/// # Errors
/// Database errors.
pub async fn put(pool: &PgPool, sku: &Sku) -> Result<SkuView, Error> {
    let mut conn = pool.acquire().await?;
    let row = skus::upsert(&mut conn, &sku.sku_id, &sku.name, sku.price).await?;
    tracing::info!(sku.id = %sku.sku_id, price_cents = sku.price.get(), "Stored catalog entry");
    Ok(SkuView {
        sku_id: row.sku_id,
        name: row.name,
        price_cents: row.price_cents,
        updated_at: row.updated_at,
    })
}
