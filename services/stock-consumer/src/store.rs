//! The stock tables' SQL. Every function takes the caller's connection, so the caller decides
//! the transaction. Stock rows are locked in SKU order ([`lock_skus`]) before they change, so
//! concurrent orders sharing SKUs never deadlock.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{MovementKind, ReservationStatus};

/// One `stock` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct StockRow {
    /// The SKU.
    pub sku_id: String,
    /// Units in the warehouse.
    pub on_hand: i64,
    /// Units held for paid orders not shipped yet.
    pub reserved: i64,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// An order line's quantity.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Line {
    /// The SKU.
    pub sku_id: String,
    /// Units.
    pub quantity: i64,
}

/// Sets a SKU's units on hand, creating it if needed.
///
/// # Errors
/// When the query fails; a check violation of `stock_reserved_within_on_hand` when fewer units
/// than are reserved would be on hand.
pub async fn put(
    conn: &mut PgConnection,
    sku_id: &str,
    on_hand: i64,
) -> Result<StockRow, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO stock (sku_id, on_hand) VALUES ($1, $2) \
         ON CONFLICT (sku_id) DO UPDATE SET on_hand = EXCLUDED.on_hand, updated_at = now() \
         RETURNING sku_id, on_hand, reserved, updated_at",
    )
    .bind(sku_id)
    .bind(on_hand)
    .fetch_one(conn)
    .await
}

/// A SKU's stock.
///
/// # Errors
/// When the query fails.
pub async fn find(conn: &mut PgConnection, sku_id: &str) -> Result<Option<StockRow>, sqlx::Error> {
    sqlx::query_as("SELECT sku_id, on_hand, reserved, updated_at FROM stock WHERE sku_id = $1")
        .bind(sku_id)
        .fetch_optional(conn)
        .await
}

/// Every SKU's stock, by SKU.
///
/// # Errors
/// When the query fails.
pub async fn all(conn: &mut PgConnection) -> Result<Vec<StockRow>, sqlx::Error> {
    sqlx::query_as("SELECT sku_id, on_hand, reserved, updated_at FROM stock ORDER BY sku_id")
        .fetch_all(conn)
        .await
}

/// Locks the stock rows of `sku_ids` in SKU order and returns them (missing SKUs are absent).
///
/// # Errors
/// When the query fails.
pub async fn lock_skus(
    conn: &mut PgConnection,
    sku_ids: &[&str],
) -> Result<Vec<StockRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, on_hand, reserved, updated_at FROM stock WHERE sku_id = ANY($1) \
         ORDER BY sku_id FOR UPDATE",
    )
    .bind(sku_ids)
    .fetch_all(conn)
    .await
}

/// Records the order's reservation decision; `false` when the order has one already (nothing
/// written). Waits for a concurrent transaction deciding the same order.
///
/// # Errors
/// When the query fails.
pub async fn insert_reservation(
    conn: &mut PgConnection,
    order_id: Uuid,
    status: ReservationStatus,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO reservations (order_id, status) VALUES ($1, $2) \
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(order_id)
    .bind(status.as_str())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The order's reservation status, locking the row.
///
/// # Errors
/// When the query fails.
pub async fn lock_reservation(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<ReservationStatus>, sqlx::Error> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM reservations WHERE order_id = $1 FOR UPDATE")
            .bind(order_id)
            .fetch_optional(conn)
            .await?;
    status
        .map(|s| s.parse().map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .transpose()
}

/// Moves the reservation `from -> to`; `false` when it was not in `from`.
///
/// # Errors
/// When the query fails.
pub async fn set_reservation(
    conn: &mut PgConnection,
    order_id: Uuid,
    from: ReservationStatus,
    to: ReservationStatus,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE reservations SET status = $3, updated_at = now() \
         WHERE order_id = $1 AND status = $2",
    )
    .bind(order_id)
    .bind(from.as_str())
    .bind(to.as_str())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The lines the order reserved.
///
/// # Errors
/// When the query fails.
pub async fn reserved_lines(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Vec<Line>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, quantity FROM stock_movements \
         WHERE order_id = $1 AND kind = 'RESERVE' ORDER BY sku_id",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await
}

/// Records one movement per line and applies it to the stock rows (which the caller locked).
/// The unique key `(order_id, sku_id, kind)` and the stock CHECKs refuse what must never
/// happen; the caller's transaction then rolls back.
///
/// # Errors
/// When the query fails or a constraint refuses the change.
pub async fn move_stock(
    conn: &mut PgConnection,
    order_id: Uuid,
    event_id: Uuid,
    kind: MovementKind,
    lines: &[Line],
) -> Result<(), sqlx::Error> {
    let skus: Vec<&str> = lines.iter().map(|l| l.sku_id.as_str()).collect();
    let quantities: Vec<i64> = lines.iter().map(|l| l.quantity).collect();
    sqlx::query(
        "INSERT INTO stock_movements (order_id, sku_id, kind, quantity, event_id) \
         SELECT $1, l.sku_id, $2, l.quantity, $3 FROM UNNEST($4::text[], $5::bigint[]) AS l (sku_id, quantity)",
    )
    .bind(order_id)
    .bind(kind.as_str())
    .bind(event_id)
    .bind(&skus)
    .bind(&quantities)
    .execute(&mut *conn)
    .await?;
    let (on_hand_sign, reserved_sign) = kind.deltas(1);
    let updated = sqlx::query(
        "UPDATE stock s SET on_hand = s.on_hand + $1 * l.quantity, \
             reserved = s.reserved + $2 * l.quantity, updated_at = now() \
         FROM UNNEST($3::text[], $4::bigint[]) AS l (sku_id, quantity) \
         WHERE s.sku_id = l.sku_id",
    )
    .bind(on_hand_sign)
    .bind(reserved_sign)
    .bind(&skus)
    .bind(&quantities)
    .execute(conn)
    .await?;
    if updated.rows_affected() != lines.len() as u64 {
        // Movements reference stock rows (a foreign key), so this cannot happen.
        return Err(sqlx::Error::RowNotFound);
    }
    Ok(())
}
