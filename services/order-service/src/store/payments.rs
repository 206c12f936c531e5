//! Payment notifications, one row per provider transaction id.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{Cents, OrderId, TransactionId};

/// What a received payment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// It paid the order.
    Applied,
    /// The order could not take it (cancelled, or paid by another transaction): the money
    /// must go back (`refund_due_cents` of it).
    RefundRequired,
    /// Flagged like [`Disposition::RefundRequired`], but refunds cover all of it: nothing is
    /// left for an operator to give back.
    RefundCovered,
}

impl Disposition {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "APPLIED",
            Self::RefundRequired => "REFUND_REQUIRED",
            Self::RefundCovered => "REFUND_COVERED",
        }
    }
}

/// One `payments` row.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct PaymentRow {
    /// The provider's transaction id.
    pub transaction_id: String,
    /// The order it was for.
    pub order_id: Uuid,
    /// Amount received.
    pub amount_cents: i64,
    /// `APPLIED`, `REFUND_REQUIRED` or `REFUND_COVERED`.
    pub disposition: String,
    /// Why a refund is required (`order_cancelled`, `already_paid`).
    pub flag_reason: Option<String>,
    /// How much of a `REFUND_REQUIRED` payment must go back.
    pub refund_due_cents: Option<i64>,
    /// When the notification was first received.
    pub received_at: DateTime<Utc>,
}

/// Records a payment; `false` when the transaction id is already recorded (nothing written).
/// Blocks while another transaction holds an uncommitted row for the same transaction id.
///
/// # Errors
/// When the query fails.
pub async fn insert(
    conn: &mut PgConnection,
    transaction_id: &TransactionId,
    order_id: OrderId,
    amount: Cents,
    disposition: Disposition,
    flag_reason: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO payments (transaction_id, order_id, amount_cents, disposition, flag_reason, \
             refund_due_cents) \
         VALUES ($1, $2, $3, $4, $5, CASE WHEN $4 = 'REFUND_REQUIRED' THEN $3 END) \
         ON CONFLICT (transaction_id) DO NOTHING",
    )
    .bind(transaction_id.as_str())
    .bind(order_id.uuid())
    .bind(amount.get())
    .bind(disposition.as_str())
    .bind(flag_reason)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Reads a payment by transaction id.
///
/// # Errors
/// When the query fails.
pub async fn find(
    conn: &mut PgConnection,
    transaction_id: &TransactionId,
) -> Result<Option<PaymentRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT transaction_id, order_id, amount_cents, disposition, flag_reason, refund_due_cents, received_at \
         FROM payments WHERE transaction_id = $1",
    )
    .bind(transaction_id.as_str())
    .fetch_optional(conn)
    .await
}

/// An order's payments, oldest first.
///
/// # Errors
/// When the query fails.
pub async fn for_order(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Vec<PaymentRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT transaction_id, order_id, amount_cents, disposition, flag_reason, refund_due_cents, received_at \
         FROM payments WHERE order_id = $1 ORDER BY received_at, transaction_id",
    )
    .bind(order_id.uuid())
    .fetch_all(conn)
    .await
}

/// Flags the payment that paid the order for refund (`APPLIED -> REFUND_REQUIRED` with
/// `reason`), `refund_due_cents` of it to give back (`REFUND_COVERED` when that is 0: refunds
/// requested earlier cover it all); `None` when the order has no applied payment.
///
/// # Errors
/// When the query fails.
pub async fn flag_applied_for_refund(
    conn: &mut PgConnection,
    order_id: OrderId,
    reason: &str,
    refund_due_cents: i64,
) -> Result<Option<PaymentRow>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE payments SET flag_reason = $2, refund_due_cents = $3, \
             disposition = CASE WHEN $3 > 0 THEN 'REFUND_REQUIRED' ELSE 'REFUND_COVERED' END \
         WHERE order_id = $1 AND disposition = 'APPLIED' \
         RETURNING transaction_id, order_id, amount_cents, disposition, flag_reason, refund_due_cents, received_at",
    )
    .bind(order_id.uuid())
    .bind(reason)
    .bind(refund_due_cents)
    .fetch_optional(conn)
    .await
}

/// Flag reasons whose payment stays with a cancelled order as what it owes the buyer: refunds
/// of that order draw on it ([`move_due`]).
pub const ORDER_DEBT_REASONS: [&str; 2] = ["stock_rejected", "trade_closed"];

/// Moves `cents` between the refund due of the order's payment flagged for a cancellation
/// after payment ([`ORDER_DEBT_REASONS`]) and its refunds: a positive `cents` adds to what is
/// due (a refund closed without paying out), a negative one takes from it (a refund that will
/// pay it out). The disposition follows: `REFUND_COVERED` at 0, `REFUND_REQUIRED` above.
/// Returns `false` when there is no such payment or it has less due than asked for.
///
/// # Errors
/// When the query fails.
pub async fn move_due(
    conn: &mut PgConnection,
    order_id: OrderId,
    cents: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE payments SET refund_due_cents = refund_due_cents + $2, \
             disposition = CASE WHEN refund_due_cents + $2 > 0 THEN 'REFUND_REQUIRED' \
                                ELSE 'REFUND_COVERED' END \
         WHERE order_id = $1 AND flag_reason = ANY($3) AND refund_due_cents + $2 >= 0",
    )
    .bind(order_id.uuid())
    .bind(cents)
    .bind(&ORDER_DEBT_REASONS[..])
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What the order's payment flagged for a cancellation after payment still owes the buyer
/// (`refund_due_cents`), if it has one.
///
/// # Errors
/// When the query fails.
pub async fn order_debt(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT refund_due_cents FROM payments WHERE order_id = $1 AND flag_reason = ANY($2)",
    )
    .bind(order_id.uuid())
    .bind(&ORDER_DEBT_REASONS[..])
    .fetch_optional(conn)
    .await
    .map(Option::flatten)
}
