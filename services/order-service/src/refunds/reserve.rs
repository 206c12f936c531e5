//! The money a refund holds: reserved on a live order, drawn from the flagged payment of an
//! order cancelled after payment. Requests reserve, amendments move the reservation, and a
//! refund closed without paying out gives it back.

use sqlx::PgConnection;

use crate::domain::{OrderId, OrderStatus};
use crate::error::Error;
use crate::store::{orders, payments};

/// Reserves `cents` more for the order's refunds (a negative `cents` gives them back). A live
/// order reserves on `refund_reserved_cents`, under the CHECK `orders_refunds_within_paid`. An
/// order cancelled after payment had everything reserved when it was cancelled, the rest owed
/// through its flagged payment: its refunds draw on that flag, and give back to it.
///
/// # Errors
/// [`Error::RefundExceedsPaid`] when not enough is left, database errors.
pub(super) async fn reserve(
    conn: &mut PgConnection,
    order: &orders::OrderRow,
    cents: i64,
) -> Result<(), Error> {
    let order_id = OrderId::from(order.order_id);
    let done = if order.status == OrderStatus::Cancelled {
        payments::move_due(conn, order_id, -cents).await?
    } else if cents >= 0 {
        orders::reserve_refund(conn, order_id, cents).await?
    } else {
        orders::release_refund(conn, order_id, -cents).await?
    };
    if done {
        return Ok(());
    }
    if cents < 0 {
        return Err(Error::Invariant("a refund gave back more than it reserved"));
    }
    let refundable_cents = if order.status == OrderStatus::Cancelled {
        payments::order_debt(conn, order_id).await?.unwrap_or(0)
    } else {
        order.paid_cents - order.refund_reserved_cents
    };
    Err(Error::RefundExceedsPaid { refundable_cents })
}
