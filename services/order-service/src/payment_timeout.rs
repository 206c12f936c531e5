//! Unpaid orders close after a timeout, as the platform closes a `WAIT_PAY` trade after a
//! timeout. Nothing is reserved before payment, so closing is only the lifecycle's `cancel`
//! (`PENDING_PAYMENT -> CANCELLED`, `OrderCancelled`); a payment that arrives afterwards is
//! recorded and flagged for refund like any payment of a cancelled order, never reviving it.
//!
//! Marketplace orders are left alone: the platform owns their payment window and closes them
//! itself (`TRADE_CLOSED`); closing one here would refuse the platform's payment later.
//!
//! A background loop ([`run`]) closes the oldest expired orders first, each in its own short
//! transaction under the order's lock, re-checking the status and the age under the lock, so
//! a payment committing at the same moment wins or loses cleanly.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::{LifecycleEvent, OrderId, OrderStatus};
use crate::error::Error;
use crate::events::Cause;
use crate::metrics::Metrics;
use crate::orders::advance;
use crate::store::orders;

/// Orders looked at per pass.
const BATCH: i64 = 500;

/// The oldest unpaid orders created more than `timeout` ago, not from a channel.
async fn expired(
    conn: &mut PgConnection,
    timeout: Duration,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT o.order_id FROM orders o \
         WHERE o.status = 'PENDING_PAYMENT' AND o.created_at < now() - make_interval(secs => $1) \
           AND NOT EXISTS (SELECT 1 FROM channel_orders c WHERE c.order_id = o.order_id) \
         ORDER BY o.created_at LIMIT $2",
    )
    .bind(timeout.as_secs_f64())
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Whether the locked order is still unpaid and older than `timeout`.
async fn still_expired(
    conn: &mut PgConnection,
    order_id: OrderId,
    timeout: Duration,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT created_at < now() - make_interval(secs => $2) FROM orders WHERE order_id = $1",
    )
    .bind(order_id.uuid())
    .bind(timeout.as_secs_f64())
    .fetch_one(conn)
    .await
}

/// One pass: closes every expired unpaid order found (at most [`BATCH`]), oldest first.
/// Returns how many were closed.
///
/// # Errors
/// Database and outbox errors (orders closed before the error stay closed).
pub async fn close_expired(pool: &PgPool, timeout: Duration) -> Result<u64, Error> {
    let ids = {
        let mut conn = pool.acquire().await?;
        expired(&mut conn, timeout, BATCH).await?
    };
    let mut closed = 0;
    for id in ids {
        let order_id = OrderId::from(id);
        let mut tx = pool.begin().await?;
        let Some(order) = orders::lock(&mut tx, order_id).await? else {
            continue;
        };
        if order.status != OrderStatus::PendingPayment
            || !still_expired(&mut tx, order_id, timeout).await?
        {
            continue;
        }
        advance(&mut tx, &order, LifecycleEvent::Cancel, Cause::None).await?;
        tx.commit().await?;
        closed += 1;
        tracing::info!(
            order.id = %order_id,
            timeout_s = timeout.as_secs(),
            "Unpaid order closed after the payment timeout"
        );
    }
    Ok(closed)
}

/// Runs a pass every `interval` until `shutdown`; each closed order counts in
/// `order_orders_cancelled_total`.
pub async fn run(
    pool: PgPool,
    timeout: Duration,
    interval: Duration,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        match close_expired(&pool, timeout).await {
            Ok(n) => metrics.orders_cancelled.inc_by(n),
            Err(e) => {
                tracing::warn!(error = %e, "Payment timeout pass failed; trying again at the next interval");
            }
        }
    }
}
