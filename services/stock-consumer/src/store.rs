//! The stock tables' SQL. Every function takes the caller's connection, so the caller decides
//! the transaction. Stock rows are locked in SKU order ([`lock_skus`]) before they change, so
//! concurrent orders sharing SKUs never deadlock.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{MovementKind, ReservationStatus};
use crate::lines::{LineAmounts, Move};

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
    reservation_status(conn, order_id, true).await
}

/// The order's reservation status, the row locked or not.
async fn reservation_status(
    conn: &mut PgConnection,
    order_id: Uuid,
    lock: bool,
) -> Result<Option<ReservationStatus>, sqlx::Error> {
    let sql = if lock {
        "SELECT status FROM reservations WHERE order_id = $1 FOR UPDATE"
    } else {
        "SELECT status FROM reservations WHERE order_id = $1"
    };
    let status: Option<String> = sqlx::query_scalar(sql)
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

/// Records the reserved lines of a reservation just inserted (nothing released, deducted or
/// restocked yet).
///
/// # Errors
/// When the query fails.
pub async fn insert_lines(
    conn: &mut PgConnection,
    order_id: Uuid,
    lines: &[Line],
) -> Result<(), sqlx::Error> {
    let skus: Vec<&str> = lines.iter().map(|l| l.sku_id.as_str()).collect();
    let quantities: Vec<i64> = lines.iter().map(|l| l.quantity).collect();
    sqlx::query(
        "INSERT INTO reservation_lines (order_id, sku_id, reserved) \
         SELECT $1, l.sku_id, l.quantity FROM UNNEST($2::text[], $3::bigint[]) AS l (sku_id, quantity)",
    )
    .bind(order_id)
    .bind(&skus)
    .bind(&quantities)
    .execute(conn)
    .await?;
    Ok(())
}

/// The order's reserved lines with their running amounts, by SKU (none for a rejected order),
/// locked.
///
/// # Errors
/// When the query fails.
pub async fn lock_lines(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Vec<LineAmounts>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, reserved, released, deducted, restocked FROM reservation_lines \
         WHERE order_id = $1 ORDER BY sku_id FOR UPDATE",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await
}

/// Every line of the order, by SKU, unlocked.
///
/// # Errors
/// When the query fails.
pub async fn lines(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Vec<LineAmounts>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, reserved, released, deducted, restocked FROM reservation_lines \
         WHERE order_id = $1 ORDER BY sku_id",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await
}

/// The order's reservation status, unlocked.
///
/// # Errors
/// When the query fails or the status is unknown to this version.
pub async fn reservation(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<ReservationStatus>, sqlx::Error> {
    reservation_status(conn, order_id, false).await
}

/// Applies `moves` of the order's lines: one movement row each (with the event that caused
/// it), the lines' running amounts (except for `Reserve`, whose line [`insert_lines`] wrote) and
/// the stock rows (which the caller locked). The partial unique key on movements (a line is
/// reserved and deducted once), the lines' CHECKs (`released + deducted <= reserved`,
/// `restocked <= deducted`) and the stock CHECKs refuse what must never happen; the caller's
/// transaction then rolls back.
///
/// # Errors
/// When the query fails or a constraint refuses the change.
pub async fn apply_moves(
    conn: &mut PgConnection,
    order_id: Uuid,
    event_id: Uuid,
    moves: &[Move],
) -> Result<(), sqlx::Error> {
    let skus: Vec<&str> = moves.iter().map(|m| m.sku_id.as_str()).collect();
    let kinds: Vec<&str> = moves.iter().map(|m| m.kind.as_str()).collect();
    let quantities: Vec<i64> = moves.iter().map(|m| m.quantity).collect();
    let (on_hand, reserved): (Vec<i64>, Vec<i64>) =
        moves.iter().map(|m| m.kind.deltas(m.quantity)).unzip();
    sqlx::query(
        "INSERT INTO stock_movements (order_id, sku_id, kind, quantity, event_id) \
         SELECT $1, m.sku_id, m.kind, m.quantity, $2 \
         FROM UNNEST($3::text[], $4::text[], $5::bigint[]) WITH ORDINALITY AS m (sku_id, kind, quantity, n) \
         ORDER BY m.n",
    )
    .bind(order_id)
    .bind(event_id)
    .bind(&skus)
    .bind(&kinds)
    .bind(&quantities)
    .execute(&mut *conn)
    .await?;
    // Several moves of one SKU (deducted and the rest released) add up into one update per row.
    let lines = sqlx::query(
        "UPDATE reservation_lines r SET \
             released = r.released + m.released, deducted = r.deducted + m.deducted, \
             restocked = r.restocked + m.restocked, updated_at = now() \
         FROM (SELECT sku_id, \
                      COALESCE(sum(quantity) FILTER (WHERE kind = 'RELEASE'), 0)::bigint AS released, \
                      COALESCE(sum(quantity) FILTER (WHERE kind = 'DEDUCT'), 0)::bigint AS deducted, \
                      COALESCE(sum(quantity) FILTER (WHERE kind = 'RESTOCK'), 0)::bigint AS restocked \
               FROM UNNEST($2::text[], $3::text[], $4::bigint[]) AS m (sku_id, kind, quantity) \
               WHERE kind <> 'RESERVE' GROUP BY sku_id) m \
         WHERE r.order_id = $1 AND r.sku_id = m.sku_id",
    )
    .bind(order_id)
    .bind(&skus)
    .bind(&kinds)
    .bind(&quantities)
    .execute(&mut *conn)
    .await?;
    let stock = sqlx::query(
        "UPDATE stock s SET on_hand = s.on_hand + d.on_hand, reserved = s.reserved + d.reserved, \
             updated_at = now() \
         FROM (SELECT sku_id, sum(on_hand)::bigint AS on_hand, sum(reserved)::bigint AS reserved \
               FROM UNNEST($1::text[], $2::bigint[], $3::bigint[]) AS m (sku_id, on_hand, reserved) \
               GROUP BY sku_id) d \
         WHERE s.sku_id = d.sku_id",
    )
    .bind(&skus)
    .bind(&on_hand)
    .bind(&reserved)
    .execute(conn)
    .await?;
    let distinct = |reserve: bool| {
        moves
            .iter()
            .filter(|m| reserve || m.kind != MovementKind::Reserve)
            .map(|m| m.sku_id.as_str())
            .collect::<BTreeSet<_>>()
            .len() as u64
    };
    if stock.rows_affected() != distinct(true) || lines.rows_affected() != distinct(false) {
        // Movements reference reserved lines and stock rows (foreign keys): cannot happen.
        return Err(sqlx::Error::RowNotFound);
    }
    Ok(())
}
