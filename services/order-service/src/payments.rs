//! Payment notifications from the provider (`POST /payments/callback`).
//!
//! The provider repeats a notification until it gets a success answer, so a duplicate is
//! normal and answered as success. The order moves `PENDING_PAYMENT -> PAID` exactly once: the
//! order row is locked, the transaction id is stored under a unique key, and the status change
//! is a conditional update. Money that arrives for an order that cannot take it (cancelled, or
//! already paid by another transaction) is recorded and flagged for a refund, never used to
//! revive the order.

use serde::Deserialize;
use sqlx::{PgConnection, PgPool};

use crate::domain::{Cents, LifecycleEvent, OrderId, OrderStatus, TransactionId, ValidationError};
use crate::error::Error;
use crate::events::Cause;
use crate::orders::{advance, parse_order_id};
use crate::store::orders;
use crate::store::payments::{self, Disposition};
use crate::views::PaymentView;

/// `POST /payments/callback` body as received (after its signature was checked).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct PaymentCallbackBody {
    /// The order paid for.
    #[schema(format = Uuid)]
    pub order_id: String,
    /// The provider's transaction id.
    #[schema(schema_with = TransactionId::schema_object)]
    pub transaction_id: String,
    /// Amount paid.
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = Cents::schema_object)]
    pub amount_cents: i64,
    /// Only `SUCCESS` is sent by the provider.
    #[schema(pattern = "^SUCCESS$")]
    pub status: String,
}

/// A validated payment notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentNotice {
    /// The order paid for.
    pub order_id: OrderId,
    /// The provider's transaction id.
    pub transaction_id: TransactionId,
    /// Amount paid.
    pub amount: Cents,
}

impl TryFrom<PaymentCallbackBody> for PaymentNotice {
    type Error = Error;

    fn try_from(body: PaymentCallbackBody) -> Result<Self, Error> {
        let transaction_id = TransactionId::parse("transaction_id", body.transaction_id)?;
        let amount = Cents::parse("amount_cents", body.amount_cents)?;
        if body.status != "SUCCESS" {
            return Err(
                ValidationError::new("status", "only SUCCESS notifications are accepted").into(),
            );
        }
        let order_id = parse_order_id(&body.order_id)?;
        Ok(Self {
            order_id,
            transaction_id,
            amount,
        })
    }
}

/// Why a received payment must be refunded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagReason {
    /// The order was cancelled before the money arrived.
    OrderCancelled,
    /// The order was already paid by another transaction.
    AlreadyPaid,
    /// The paid order was cancelled because its stock could not be reserved.
    StockRejected,
    /// The marketplace trade was first seen closed, with the money it took: the order is
    /// cancelled and the money owed until the platform's refund takes it.
    TradeClosed,
}

impl FlagReason {
    /// As stored and used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrderCancelled => "order_cancelled",
            Self::AlreadyPaid => "already_paid",
            Self::StockRejected => "stock_rejected",
            Self::TradeClosed => "trade_closed",
        }
    }
}

/// What a payment notification did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentOutcome {
    /// It paid the order: `PAID` and `OrderPaid`.
    Applied,
    /// The transaction was already recorded: nothing changed.
    Duplicate,
    /// Recorded, but the order could not take it: flagged for a refund.
    FlaggedForRefund(FlagReason),
}

impl PaymentOutcome {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::FlaggedForRefund(_) => "flagged_for_refund",
        }
    }
}

/// Applies a payment notification.
///
/// # Errors
/// [`Error::OrderNotFound`], [`Error::AmountMismatch`] (nothing changes),
/// [`Error::TransactionIdReused`] when the transaction id was recorded for another order,
/// database errors.
pub async fn apply(pool: &PgPool, notice: &PaymentNotice) -> Result<PaymentOutcome, Error> {
    let mut tx = pool.begin().await?;
    let outcome = apply_in(&mut tx, notice).await?;
    if outcome == PaymentOutcome::Duplicate {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// [`apply`] in the caller's transaction (the marketplace channel pays its orders so).
///
/// # Errors
/// As [`apply`]; on an error the caller must roll back.
pub async fn apply_in(
    conn: &mut PgConnection,
    notice: &PaymentNotice,
) -> Result<PaymentOutcome, Error> {
    let order_id = notice.order_id;
    // Serializes every writer of this order, duplicates of this notification included.
    let order = orders::lock(conn, order_id)
        .await?
        .ok_or(Error::OrderNotFound)?;
    if notice.amount.get() != order.amount_cents {
        return Err(Error::AmountMismatch {
            expected_cents: order.amount_cents,
            received_cents: notice.amount.get(),
        });
    }
    let (disposition, flag) = match order.status {
        OrderStatus::PendingPayment => (Disposition::Applied, None),
        OrderStatus::Cancelled | OrderStatus::Refunded => (
            Disposition::RefundRequired,
            Some(FlagReason::OrderCancelled),
        ),
        OrderStatus::Paid
        | OrderStatus::Shipped
        | OrderStatus::Delivered
        | OrderStatus::Completed
        | OrderStatus::Returned => (Disposition::RefundRequired, Some(FlagReason::AlreadyPaid)),
    };
    let inserted = payments::insert(
        conn,
        &notice.transaction_id,
        order_id,
        notice.amount,
        disposition,
        flag.map(FlagReason::as_str),
    )
    .await?;
    if !inserted {
        let existing = payments::find(conn, &notice.transaction_id)
            .await?
            .ok_or(Error::Invariant("conflicting payment row vanished"))?;
        if existing.order_id != order_id.uuid() {
            return Err(Error::TransactionIdReused);
        }
        tracing::info!(
            order.id = %order_id,
            payment.transaction_id = %notice.transaction_id,
            "Ignored duplicate payment notification"
        );
        return Ok(PaymentOutcome::Duplicate);
    }
    if let Some(reason) = flag {
        tracing::warn!(
            order.id = %order_id,
            order.status = %order.status,
            payment.transaction_id = %notice.transaction_id,
            amount_cents = notice.amount.get(),
            reason = reason.as_str(),
            "Payment received for an order that cannot take it; flagged for refund"
        );
        return Ok(PaymentOutcome::FlaggedForRefund(reason));
    }
    let payment: PaymentView = payments::find(conn, &notice.transaction_id)
        .await?
        .ok_or(Error::Invariant("payment row vanished"))?
        .into();
    advance(conn, &order, LifecycleEvent::Pay, Cause::Payment(&payment)).await?;
    tracing::info!(
        order.id = %order_id,
        payment.transaction_id = %notice.transaction_id,
        amount_cents = notice.amount.get(),
        "Order paid"
    );
    Ok(PaymentOutcome::Applied)
}

/// A marketplace trade first seen closed (`TRADE_CLOSED`) with the money it took: the paid
/// push was lost and the platform closed the trade (a refund in full). Such an order must never
/// start fulfilment, so it is not paid (no `OrderPaid`): the payment is recorded flagged
/// (`trade_closed`, all of it due), the order records what it took with all of it reserved for
/// refunds, like a paid order cancelled for lack of stock, and is cancelled (`OrderCancelled`
/// with the flagged payment). The platform's refund then draws on the flag, so the money is
/// owed once. On an order that is not `PENDING_PAYMENT` this is [`apply_in`] (a duplicate of
/// the payment that paid it, or money flagged for a cancelled order).
///
/// # Errors
/// As [`apply_in`]; on an error the caller must roll back.
pub async fn close_paid_in(
    conn: &mut PgConnection,
    notice: &PaymentNotice,
) -> Result<PaymentOutcome, Error> {
    let order_id = notice.order_id;
    let order = orders::lock(conn, order_id)
        .await?
        .ok_or(Error::OrderNotFound)?;
    if order.status != OrderStatus::PendingPayment {
        return apply_in(conn, notice).await;
    }
    if notice.amount.get() != order.amount_cents {
        return Err(Error::AmountMismatch {
            expected_cents: order.amount_cents,
            received_cents: notice.amount.get(),
        });
    }
    let reason = FlagReason::TradeClosed;
    if !payments::insert(
        conn,
        &notice.transaction_id,
        order_id,
        notice.amount,
        Disposition::RefundRequired,
        Some(reason.as_str()),
    )
    .await?
    {
        // The transaction id is known but the order is unpaid: it belongs to another order.
        return Err(Error::TransactionIdReused);
    }
    if !orders::record_paid_for_refund(conn, order_id, notice.amount.get()).await? {
        return Err(Error::Invariant("locked order left PENDING_PAYMENT"));
    }
    let payment: PaymentView = payments::find(conn, &notice.transaction_id)
        .await?
        .ok_or(Error::Invariant("payment row vanished"))?
        .into();
    advance(
        conn,
        &order,
        LifecycleEvent::Cancel,
        Cause::Payment(&payment),
    )
    .await?;
    tracing::warn!(
        order.id = %order_id,
        payment.transaction_id = %notice.transaction_id,
        amount_cents = notice.amount.get(),
        reason = reason.as_str(),
        "Trade first seen closed after payment; order cancelled, payment flagged for refund"
    );
    Ok(PaymentOutcome::FlaggedForRefund(reason))
}
