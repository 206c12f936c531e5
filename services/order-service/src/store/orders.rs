//! Orders and their lines.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{OrderId, OrderStatus, UserId};

const ORDER_COLUMNS: &str = "order_id, user_id, status, amount_cents, paid_cents, \
     refund_reserved_cents, created_at, updated_at, paid_at, cancelled_at";

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
    /// When it became CANCELLED.
    pub cancelled_at: Option<DateTime<Utc>>,
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
         RETURNING sku_id, name, quantity, unit_price_cents, line_total_cents",
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

/// An order's lines in line order.
///
/// # Errors
/// When the query fails.
pub async fn items(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Vec<ItemRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, name, quantity, unit_price_cents, line_total_cents \
         FROM order_items WHERE order_id = $1 ORDER BY line_no",
    )
    .bind(order_id.uuid())
    .fetch_all(conn)
    .await
}

/// Moves an order from `from` to `to` if, and only if, it is in `from` now. Returns the
/// updated row, or `None` when the order was not in `from` (nothing changed). Moving to `PAID`
/// records the order amount as paid.
///
/// This is the one place order statuses change; the fulfilment consumer's `PAID -> SHIPPED`
/// and `SHIPPED -> COMPLETED` will go through it too.
///
/// # Errors
/// When the query fails.
///
/// # Panics
/// When `from -> to` is not a legal transition: that is a bug in the caller.
pub async fn transition(
    conn: &mut PgConnection,
    order_id: OrderId,
    from: OrderStatus,
    to: OrderStatus,
) -> Result<Option<OrderRow>, sqlx::Error> {
    assert!(from.can_become(to), "illegal transition {from} -> {to}");
    sqlx::query_as(&format!(
        "UPDATE orders SET status = $3, updated_at = now(), \
             paid_at = CASE WHEN $3 = 'PAID' THEN now() ELSE paid_at END, \
             paid_cents = CASE WHEN $3 = 'PAID' THEN amount_cents ELSE paid_cents END, \
             cancelled_at = CASE WHEN $3 = 'CANCELLED' THEN now() ELSE cancelled_at END \
         WHERE order_id = $1 AND status = $2 \
         RETURNING {ORDER_COLUMNS}"
    ))
    .bind(order_id.uuid())
    .bind(from.as_str())
    .bind(to.as_str())
    .fetch_optional(conn)
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
         WHERE order_id = $1 AND status IN ('PAID', 'SHIPPED', 'COMPLETED') \
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
