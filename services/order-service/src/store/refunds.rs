//! Refunds of paid orders.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{Cents, OrderId, RefundKind, RefundNo, RefundReason, RefundStatus};
use crate::lines::OrderLine;

const REFUND_COLUMNS: &str =
    "refund_no, order_id, amount_cents, reason, kind, status, provider_modified_ms, created_at, updated_at";

/// One `refunds` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RefundRow {
    /// The merchant's refund number.
    pub refund_no: String,
    /// The refunded order.
    pub order_id: Uuid,
    /// Amount to give back.
    pub amount_cents: i64,
    /// Why.
    pub reason: String,
    /// What it gives back.
    #[sqlx(try_from = "String")]
    pub kind: RefundKind,
    /// Current state.
    #[sqlx(try_from = "String")]
    pub status: RefundStatus,
    /// `modified` of the provider snapshot that was applied (epoch milliseconds).
    pub provider_modified_ms: Option<i64>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// Inserts a `REQUESTED` refund; `None` when the refund number already exists (nothing
/// written). Blocks while another transaction holds an uncommitted row for the same number.
///
/// # Errors
/// When the query fails.
pub async fn insert(
    conn: &mut PgConnection,
    refund_no: &RefundNo,
    order_id: OrderId,
    amount: Cents,
    reason: &RefundReason,
    kind: RefundKind,
) -> Result<Option<RefundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO refunds (refund_no, order_id, amount_cents, reason, kind, status) \
         VALUES ($1, $2, $3, $4, $5, 'REQUESTED') ON CONFLICT (refund_no) DO NOTHING \
         RETURNING {REFUND_COLUMNS}"
    ))
    .bind(refund_no.as_str())
    .bind(order_id.uuid())
    .bind(amount.get())
    .bind(reason.as_str())
    .bind(kind.as_str())
    .fetch_optional(conn)
    .await
}

/// One line a refund takes back (`refund_lines`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RefundLineRow {
    /// The SKU, a line of the refund's order.
    pub sku_id: String,
    /// Units.
    pub quantity: i32,
}

/// Replaces the lines of a refund (none: the whole order).
///
/// # Errors
/// When the query fails (`refund_lines_of_the_order` for a SKU the order does not have).
pub async fn set_lines(
    conn: &mut PgConnection,
    refund_no: &RefundNo,
    order_id: OrderId,
    lines: &[OrderLine],
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM refund_lines WHERE refund_no = $1")
        .bind(refund_no.as_str())
        .execute(&mut *conn)
        .await?;
    if lines.is_empty() {
        return Ok(());
    }
    let skus: Vec<&str> = lines.iter().map(|l| l.sku_id.as_str()).collect();
    let units: Vec<i32> = lines.iter().map(|l| l.quantity.get()).collect();
    sqlx::query(
        "INSERT INTO refund_lines (refund_no, order_id, sku_id, quantity) \
         SELECT $1, $2, * FROM UNNEST($3::text[], $4::int[])",
    )
    .bind(refund_no.as_str())
    .bind(order_id.uuid())
    .bind(&skus)
    .bind(&units)
    .execute(conn)
    .await?;
    Ok(())
}

/// The lines of a refund, by SKU (empty: the whole order).
///
/// # Errors
/// When the query fails.
pub async fn lines(
    conn: &mut PgConnection,
    refund_no: &str,
) -> Result<Vec<RefundLineRow>, sqlx::Error> {
    sqlx::query_as("SELECT sku_id, quantity FROM refund_lines WHERE refund_no = $1 ORDER BY sku_id")
        .bind(refund_no)
        .fetch_all(conn)
        .await
}

/// Units of each SKU that the order's refunds not closed (requested or succeeded) take back by
/// line, leaving out `except` (a refund whose lines are being replaced).
///
/// # Errors
/// When the query fails.
pub async fn units_taken_back(
    conn: &mut PgConnection,
    order_id: OrderId,
    except: &RefundNo,
) -> Result<Vec<RefundLineRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT l.sku_id, SUM(l.quantity)::int AS quantity \
         FROM refund_lines l JOIN refunds r USING (refund_no) \
         WHERE l.order_id = $1 AND r.status <> 'CLOSED' AND r.refund_no <> $2 \
         GROUP BY l.sku_id ORDER BY l.sku_id",
    )
    .bind(order_id.uuid())
    .bind(except.as_str())
    .fetch_all(conn)
    .await
}

/// Reads a refund by number.
///
/// # Errors
/// When the query fails.
pub async fn find(
    conn: &mut PgConnection,
    refund_no: &RefundNo,
) -> Result<Option<RefundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {REFUND_COLUMNS} FROM refunds WHERE refund_no = $1"
    ))
    .bind(refund_no.as_str())
    .fetch_optional(conn)
    .await
}

/// An order's refunds, oldest first.
///
/// # Errors
/// When the query fails.
pub async fn for_order(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Vec<RefundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {REFUND_COLUMNS} FROM refunds WHERE order_id = $1 ORDER BY created_at, refund_no"
    ))
    .bind(order_id.uuid())
    .fetch_all(conn)
    .await
}

/// Applies a provider snapshot: moves a `REQUESTED` refund to `to` if the snapshot is newer
/// than the one applied before (if any). Returns the updated row, or `None` when nothing
/// changed.
///
/// # Errors
/// When the query fails.
pub async fn apply_snapshot(
    conn: &mut PgConnection,
    refund_no: &RefundNo,
    to: RefundStatus,
    modified_ms: i64,
) -> Result<Option<RefundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE refunds SET status = $2, provider_modified_ms = $3, updated_at = now() \
         WHERE refund_no = $1 AND status = 'REQUESTED' \
           AND (provider_modified_ms IS NULL OR provider_modified_ms < $3) \
         RETURNING {REFUND_COLUMNS}"
    ))
    .bind(refund_no.as_str())
    .bind(to.as_str())
    .bind(modified_ms)
    .fetch_optional(conn)
    .await
}

/// Sets a `REQUESTED` refund's amount and kind (the platform's newest snapshot changed them).
/// Returns the updated row, or `None` when the refund is not `REQUESTED` (nothing changed).
///
/// # Errors
/// When the query fails.
pub async fn set_terms(
    conn: &mut PgConnection,
    refund_no: &RefundNo,
    amount: Cents,
    kind: RefundKind,
) -> Result<Option<RefundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE refunds SET amount_cents = $2, kind = $3, updated_at = now() \
         WHERE refund_no = $1 AND status = 'REQUESTED' \
         RETURNING {REFUND_COLUMNS}"
    ))
    .bind(refund_no.as_str())
    .bind(amount.get())
    .bind(kind.as_str())
    .fetch_optional(conn)
    .await
}
