//! Idempotency keys of `POST /orders`, scoped per user.
//!
//! [`claim`] inserts the key row first thing in the request's transaction; [`complete`] fills
//! in the response at its end. Because both happen in one transaction, other transactions only
//! ever see a completed row: a concurrent duplicate's [`claim`] blocks on the uncommitted row
//! (unique index) until the first transaction ends, then either finds the committed response
//! or, if the first one rolled back, claims the key itself.

use serde_json::Value;
use sqlx::PgConnection;

use crate::domain::{IdempotencyKey, OrderId, UserId};

/// A committed key row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredKey {
    /// SHA-256 of the canonical request that claimed the key.
    pub request_hash: Vec<u8>,
    /// HTTP status of the original response (`None` only inside the claiming transaction).
    pub response_status: Option<i16>,
    /// Body of the original response.
    pub response_body: Option<Value>,
}

/// Inserts the key row; `false` when the key already exists. Blocks while another transaction
/// holds an uncommitted row for the same key.
///
/// # Errors
/// When the query fails.
pub async fn claim(
    conn: &mut PgConnection,
    user_id: &UserId,
    key: &IdempotencyKey,
    request_hash: &[u8],
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO idempotency_keys (user_id, idempotency_key, request_hash) VALUES ($1, $2, $3) \
         ON CONFLICT (user_id, idempotency_key) DO NOTHING",
    )
    .bind(user_id.as_str())
    .bind(key.as_str())
    .bind(request_hash)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Reads a key row.
///
/// # Errors
/// When the query fails.
pub async fn find(
    conn: &mut PgConnection,
    user_id: &UserId,
    key: &IdempotencyKey,
) -> Result<Option<StoredKey>, sqlx::Error> {
    sqlx::query_as(
        "SELECT request_hash, response_status, response_body FROM idempotency_keys \
         WHERE user_id = $1 AND idempotency_key = $2",
    )
    .bind(user_id.as_str())
    .bind(key.as_str())
    .fetch_optional(conn)
    .await
}

/// Stores the response of the request that claimed the key.
///
/// # Errors
/// When the query fails.
pub async fn complete(
    conn: &mut PgConnection,
    user_id: &UserId,
    key: &IdempotencyKey,
    order_id: OrderId,
    status: u16,
    body: &Value,
) -> Result<(), sqlx::Error> {
    // HTTP statuses fit an i16 (100..=999).
    let status = i16::try_from(status).unwrap_or(i16::MAX);
    sqlx::query(
        "UPDATE idempotency_keys SET order_id = $3, response_status = $4, response_body = $5 \
         WHERE user_id = $1 AND idempotency_key = $2",
    )
    .bind(user_id.as_str())
    .bind(key.as_str())
    .bind(order_id.uuid())
    .bind(status)
    .bind(body)
    .execute(conn)
    .await?;
    Ok(())
}
