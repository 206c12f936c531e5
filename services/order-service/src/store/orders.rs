//! Orders and their lines.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{OrderId, OrderStatus, Transition, UserId};

const ORDER_COLUMNS: &str = "order_id, user_id, status, amount_cents, paid_cents, \
     refund_reserved_cents, created_at, updated_at, paid_at, cancelled_at, return_received_at";

/// One `orders` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderRow {
    /// The order's id.
    pub order_id: Uuid,
    /// The buyer.
    pub user_id: String,
    /// Current state.
    #[sqlx(try_from = "String")]
    pub status: OrderStatus,
    /// Sum of the lines.
    pub amount_cents: i64,
    /// What the applied payment brought in (0 before payment).
    pub paid_cents: i64,
    /// Refunds requested or succeeded.
    pub refund_reserved_cents: i64,
    /// When the order was created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it became PAID.
    pub paid_at: Option<DateTime<Utc>>,
    /// When it became CANCELLED or REFUNDED.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// When the warehouse received its goods back before their refund was decided.
    pub return_received_at: Option<DateTime<Utc>>,
}

/// One `order_items` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ItemRow {
    /// The SKU.
    pub sku_id: String,
    /// Its catalog name when the order was created.
    pub name: String,
    /// Units.
    pub quantity: i32,
    /// Catalog price when the order was created.
    pub unit_price_cents: i64,
    /// `unit_price_cents × quantity`.
    pub line_total_cents: i64,
    /// Units the warehouse received back so far.
    pub returned_quantity: i32,
}

/// An order line priced from the catalog, about to be inserted.
#[derive(Debug, Clone)]
pub struct NewItem<'a> {
    /// The SKU.
    pub sku_id: &'a str,
    /// Its catalog name.
    pub name: &'a str,
    /// Units.
    pub quantity: i32,
    /// Catalog price.
    pub unit_price_cents: i64,
    /// `unit_price_cents × quantity`.
    pub line_total_cents: i64,
}

/// Inserts a new `PENDING_PAYMENT` order.
///
/// # Errors
/// When the database rejects the insert.
pub async fn insert(
    conn: &mut PgConnection,
    user_id: &UserId,
    amount_cents: i64,
) -> Result<OrderRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO orders (user_id, status, amount_cents) VALUES ($1, 'PENDING_PAYMENT', $2) \
         RETURNING {ORDER_COLUMNS}"
    ))
    .bind(user_id.as_str())
    .bind(amount_cents)
    .fetch_one(conn)
    .await
}

/// Inserts an order's lines, numbered in the given order, in one statement.
///
/// # Errors
/// When the database rejects the insert (e.g. unknown SKU, repeated SKU).
pub async fn insert_items(
    conn: &mut PgConnection,
    order_id: OrderId,
    items: &[NewItem<'_>],
) -> Result<Vec<ItemRow>, sqlx::Error> {
    let line_no: Vec<i32> = (1..).take(items.len()).collect();
    let sku_id: Vec<&str> = items.iter().map(|i| i.sku_id).collect();
    let name: Vec<&str> = items.iter().map(|i| i.name).collect();
    let quantity: Vec<i32> = items.iter().map(|i| i.quantity).collect();
    let unit: Vec<i64> = items.iter().map(|i| i.unit_price_cents).collect();
    let total: Vec<i64> = items.iter().map(|i| i.line_total_cents).collect();
    sqlx::query_as(
        "INSERT INTO order_items \
             (order_id, line_no, sku_id, name, quantity, unit_price_cents, line_total_cents) \
         SELECT $1, * FROM UNNEST($2::int[], $3::text[], $4::text[], $5::int[], $6::bigint[], $7::bigint[]) \
         RETURNING sku_id, name, quantity, unit_price_cents, line_total_cents, returned_quantity",
    )
    .bind(order_id.uuid())
    .bind(&line_no)
    .bind(&sku_id)
    .bind(&name)
    .bind(&quantity)
    .bind(&unit)
    .bind(&total)
    .fetch_all(conn)
    .await
}

/// Reads an order and locks its row until the transaction ends (`FOR UPDATE`). Every writer of
/// an order calls this first, so writers of one order serialize and its outbox events get ids
/// in commit order.
///
/// # Errors
/// When the query fails.
pub async fn lock(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Option<OrderRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE order_id = $1 FOR UPDATE"
    ))
    .bind(order_id.uuid())
    .fetch_optional(conn)
    .await
}

/// Reads an order without locking it.
///
/// # Errors
/// When the query fails.
pub async fn find(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Option<OrderRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE order_id = $1"
    ))
    .bind(order_id.uuid())
    .fetch_optional(conn)
    .await
}

/// The user who owns an order, if it exists.
///
/// # Errors
/// When the query fails.
pub async fn owner(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT user_id FROM orders WHERE order_id = $1")
        .bind(order_id.uuid())
        .fetch_optional(conn)
        .await
}

/// An order's lines in line order.
///
/// # Errors
/// When the query fails.
pub async fn items(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Vec<ItemRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, name, quantity, unit_price_cents, line_total_cents, returned_quantity \
         FROM order_items WHERE order_id = $1 ORDER BY line_no",
    )
    .bind(order_id.uuid())
    .fetch_all(conn)
    .await
}

/// Makes the move `t` if, and only if, the order is in `t.from` now. Returns the updated row,
/// or `None` when the order was not in `t.from` (nothing changed). Moving to `PAID` records the
/// order amount as paid.
///
/// This is the one place order statuses change; `t` comes from the lifecycle table
/// ([`crate::domain::lifecycle::next`]), so only legal moves reach the database.
///
/// # Errors
/// When the query fails.
pub async fn transition(
    conn: &mut PgConnection,
    order_id: OrderId,
    t: &Transition,
) -> Result<Option<OrderRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE orders SET status = $3, updated_at = now(), \
             paid_at = CASE WHEN $3 = 'PAID' THEN now() ELSE paid_at END, \
             paid_cents = CASE WHEN $3 = 'PAID' THEN amount_cents ELSE paid_cents END, \
             cancelled_at = CASE WHEN $3 IN ('CANCELLED', 'REFUNDED') THEN now() ELSE cancelled_at END \
         WHERE order_id = $1 AND status = $2 \
         RETURNING {ORDER_COLUMNS}"
    ))
    .bind(order_id.uuid())
    .bind(t.from.as_str())
    .bind(t.to.as_str())
    .fetch_optional(conn)
    .await
}

/// Reserves everything still refundable of the order (`refund_reserved_cents = paid_cents`)
/// and returns how much that was: the part of the payment an operator must give back when a
/// paid order is cancelled for lack of stock. Refunds requested earlier keep their own
/// reservations, so the payment is never refunded twice.
///
/// # Errors
/// When the query fails.
pub async fn reserve_rest(conn: &mut PgConnection, order_id: OrderId) -> Result<i64, sqlx::Error> {
    let rest: Option<i64> = sqlx::query_scalar(
        "UPDATE orders o SET refund_reserved_cents = o.paid_cents, updated_at = now() \
         FROM (SELECT paid_cents - refund_reserved_cents AS rest FROM orders WHERE order_id = $1) r \
         WHERE o.order_id = $1 RETURNING r.rest",
    )
    .bind(order_id.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(rest.unwrap_or(0))
}

/// Sum of the order's succeeded refunds.
///
/// # Errors
/// When the query fails.
pub async fn refunded_cents(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(amount_cents), 0)::bigint FROM refunds \
         WHERE order_id = $1 AND status = 'SUCCEEDED'",
    )
    .bind(order_id.uuid())
    .fetch_one(conn)
    .await
}

/// Reserves `amount_cents` of the paid amount for a refund, if the order is paid and enough
/// is left. Returns whether it was reserved.
///
/// # Errors
/// When the query fails.
pub async fn reserve_refund(
    conn: &mut PgConnection,
    order_id: OrderId,
    amount_cents: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE orders SET refund_reserved_cents = refund_reserved_cents + $2, updated_at = now() \
         WHERE order_id = $1 AND status IN ('PAID', 'SHIPPED', 'DELIVERED', 'COMPLETED', 'RETURNED') \
           AND refund_reserved_cents + $2 <= paid_cents",
    )
    .bind(order_id.uuid())
    .bind(amount_cents)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives back the reservation of a refund that was closed without paying out. Returns whether
/// it was released.
///
/// # Errors
/// When the query fails.
pub async fn release_refund(
    conn: &mut PgConnection,
    order_id: OrderId,
    amount_cents: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE orders SET refund_reserved_cents = refund_reserved_cents - $2, updated_at = now() \
         WHERE order_id = $1 AND refund_reserved_cents >= $2",
    )
    .bind(order_id.uuid())
    .bind(amount_cents)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records the payment of an order that is cancelled in the same transaction without ever
/// being `PAID` (a marketplace trade first seen closed with the money it took): `paid_cents`
/// and `paid_at` as for a payment, and all of it reserved for refunds, as for a paid order
/// cancelled for lack of stock. Returns whether the order was `PENDING_PAYMENT`.
///
/// # Errors
/// When the query fails.
pub async fn record_paid_for_refund(
    conn: &mut PgConnection,
    order_id: OrderId,
    paid_cents: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE orders SET paid_cents = $2, refund_reserved_cents = $2, paid_at = now(), \
             updated_at = now() \
         WHERE order_id = $1 AND status = 'PENDING_PAYMENT'",
    )
    .bind(order_id.uuid())
    .bind(paid_cents)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that the warehouse received the order's goods back (the first time only).
///
/// # Errors
/// When the query fails.
pub async fn mark_return_received(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE orders SET return_received_at = now(), updated_at = now() \
         WHERE order_id = $1 AND return_received_at IS NULL",
    )
    .bind(order_id.uuid())
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether the order has a return-and-refund refund not decided yet (`REQUESTED`).
///
/// # Errors
/// When the query fails.
pub async fn has_open_return(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM refunds WHERE order_id = $1 \
             AND status = 'REQUESTED' AND kind = 'RETURN_AND_REFUND')",
    )
    .bind(order_id.uuid())
    .fetch_one(conn)
    .await
}

/// Raises the units received back per line to `returned` (cumulative counts from the
/// warehouse's `ReturnReceived`; never lowered, never above the line's quantity, so a late or
/// repeated event changes nothing). Returns whether any line changed.
///
/// # Errors
/// When the query fails.
pub async fn record_returned_units(
    conn: &mut PgConnection,
    order_id: OrderId,
    returned: &[(String, i32)],
) -> Result<bool, sqlx::Error> {
    let skus: Vec<&str> = returned.iter().map(|(s, _)| s.as_str()).collect();
    let units: Vec<i32> = returned.iter().map(|(_, q)| *q).collect();
    let done = sqlx::query(
        "UPDATE order_items i SET returned_quantity = LEAST(r.units, i.quantity) \
         FROM UNNEST($2::text[], $3::int[]) AS r (sku_id, units) \
         WHERE i.order_id = $1 AND i.sku_id = r.sku_id \
           AND LEAST(r.units, i.quantity) > i.returned_quantity",
    )
    .bind(order_id.uuid())
    .bind(&skus)
    .bind(&units)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}
