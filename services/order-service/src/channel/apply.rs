//! One message, one transaction: layer 1 (`msg_id`), layer 2 (the change), the refund
//! snapshot's age, then the effect through the order core. See [`super`].

use sqlx::{PgConnection, PgPool};

use super::message::{
    Change, ChannelMessage, RefundChange, RefundSyncStatus, TradeChange, TradeStatus,
};
use super::store::{self, ChangeKey};
use super::MARKETPLACE;
use crate::domain::{
    LifecycleEvent, OrderId, OrderStatus, RefundNo, RefundOutcome, RefundReason, TransactionId,
};
use crate::error::Error;
use crate::events::Cause;
use crate::orders::{advance, hold, insert_order, HoldReason};
use crate::payments::{self, PaymentNotice};
use crate::refunds::{self, RefundNotice, RefundRequest};
use crate::store::orders;

/// How a change reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Pushed by the platform.
    Push,
    /// Fetched by the compensation poller.
    Query,
}

impl Source {
    /// As stored and used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Push => "push",
            Self::Query => "query",
        }
    }
}

/// What a message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its change took effect (or was a no-op for the order, e.g. a trade already further).
    Applied,
    /// Layer 1: this `msg_id` was seen before.
    DuplicateMessage,
    /// Layer 2: the same change was applied before under another `msg_id`.
    DuplicateChange,
    /// A refund snapshot older than the one applied.
    Stale,
}

impl Outcome {
    /// As answered, stored and used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::DuplicateMessage => "duplicate_message",
            Self::DuplicateChange => "duplicate_change",
            Self::Stale => "stale",
        }
    }
}

fn change_key(msg: &ChannelMessage) -> ChangeKey<'_> {
    let (kind, refund_id, status) = match &msg.change {
        Change::Trade(t) => ("trade", "", t.status.as_str()),
        Change::Refund(r) => ("refund", r.refund_id.as_str(), r.status.as_str()),
    };
    ChangeKey {
        channel: MARKETPLACE,
        external_order_id: msg.tid(),
        kind,
        external_refund_id: refund_id,
        status,
        modified_ms: msg.modified_ms,
    }
}

/// Applies a message once, whatever number of times and under whatever `msg_id` it arrives.
///
/// # Errors
/// [`Error::ChannelOrderUnknown`] for a refund of a trade we never saw (the platform sends it
/// again; compensation fetches the trade), the order core's errors (amount mismatch, refund
/// above what was paid, an illegal move), database errors. Nothing is written then.
pub async fn apply(pool: &PgPool, msg: &ChannelMessage, source: Source) -> Result<Outcome, Error> {
    let mut tx = pool.begin().await?;
    let fresh = store::record_message(
        &mut tx,
        MARKETPLACE,
        &msg.msg_id,
        msg.msg_type(),
        msg.tid(),
        source.as_str(),
    )
    .await?;
    if !fresh {
        tx.commit().await?;
        return Ok(Outcome::DuplicateMessage);
    }
    store::lock_external_order(&mut tx, MARKETPLACE, msg.tid()).await?;
    if !store::record_change(&mut tx, change_key(msg), &msg.msg_id).await? {
        store::set_outcome(&mut tx, &msg.msg_id, Outcome::DuplicateChange.as_str()).await?;
        tx.commit().await?;
        return Ok(Outcome::DuplicateChange);
    }
    let outcome = match &msg.change {
        Change::Trade(t) => apply_trade(&mut tx, t).await?,
        Change::Refund(r) => apply_refund(&mut tx, r, msg.modified_ms).await?,
    };
    if outcome != Outcome::Applied {
        store::set_outcome(&mut tx, &msg.msg_id, outcome.as_str()).await?;
    }
    tx.commit().await?;
    tracing::info!(
        channel = MARKETPLACE,
        channel.msg_id = %msg.msg_id,
        channel.tid = %msg.tid(),
        msg_type = msg.msg_type(),
        source = source.as_str(),
        outcome = outcome.as_str(),
        "Applied channel message"
    );
    Ok(outcome)
}

/// Our order for the trade, created (with `OrderCreated`) the first time the trade is seen.
async fn order_for(conn: &mut PgConnection, t: &TradeChange) -> Result<OrderId, Error> {
    if let Some(id) = store::find_order(conn, MARKETPLACE, &t.tid).await? {
        return Ok(OrderId::from(id));
    }
    let (order_id, _) = insert_order(conn, &t.order).await?;
    store::insert_order(conn, MARKETPLACE, &t.tid, order_id.uuid()).await?;
    tracing::info!(order.id = %order_id, channel.tid = %t.tid, "Created order for a marketplace trade");
    Ok(order_id)
}

/// A trade snapshot moves our order forward to where the platform is, never back: creating,
/// paying (the platform's payment under transaction id `marketplace:<tid>`), cancelling an
/// unpaid order, completing a shipped one. Shipping is ours to do (the WMS), not the
/// platform's to tell.
///
/// A closed trade never starts fulfilment (the platform's flow for closing a trade): first seen
/// closed with the money it took, the order is cancelled and that money owed to the buyer until
/// the platform's refund takes it ([`payments::close_paid_in`]); closed while paid and not
/// shipped, the order holds its fulfilment (`OrderHeld`) until its refund is known.
async fn apply_trade(conn: &mut PgConnection, t: &TradeChange) -> Result<Outcome, Error> {
    let order_id = order_for(conn, t).await?;
    if let Some(amount) = t.paid {
        let notice = PaymentNotice {
            order_id,
            transaction_id: TransactionId::parse(
                "transaction_id",
                format!("{MARKETPLACE}:{}", t.tid),
            )?,
            amount,
        };
        if t.status == TradeStatus::TradeClosed {
            payments::close_paid_in(conn, &notice).await?;
        } else {
            payments::apply_in(conn, &notice).await?;
        }
    }
    let order = orders::lock(conn, order_id)
        .await?
        .ok_or(Error::Invariant("channel order vanished"))?;
    let event = match (t.status, order.status) {
        (TradeStatus::TradeClosed, OrderStatus::PendingPayment) => Some(LifecycleEvent::Cancel),
        (TradeStatus::TradeClosed, OrderStatus::Paid) => {
            hold(conn, order.clone(), HoldReason::TradeClosed).await?;
            None
        }
        (TradeStatus::TradeFinished, OrderStatus::Shipped | OrderStatus::Delivered) => {
            Some(LifecycleEvent::Complete)
        }
        // Not shipped here yet: refuse, the platform (or compensation) brings it again later.
        (TradeStatus::TradeFinished, OrderStatus::Paid) => {
            return Err(Error::IllegalTransition {
                current: order.status,
                action: "complete",
            })
        }
        _ => None,
    };
    if let Some(event) = event {
        advance(conn, &order, event, Cause::None).await?;
    }
    Ok(Outcome::Applied)
}

/// A refund snapshot: the first one requests the refund (`marketplace:<refund_id>`), a later
/// one brings its amount, kind and lines to the newest terms, a final one (`SUCCESS`; `CLOSED` or
/// `FAILED`, nothing paid out) finishes it. A snapshot that does not supersede the newest
/// applied (an older `modified`, or the same one without moving forward) is stale.
async fn apply_refund(
    conn: &mut PgConnection,
    r: &RefundChange,
    modified_ms: i64,
) -> Result<Outcome, Error> {
    let order_id = store::find_order(conn, MARKETPLACE, &r.tid)
        .await?
        .map(OrderId::from)
        .ok_or(Error::ChannelOrderUnknown)?;
    let refund_no = RefundNo::parse("refund_no", format!("{MARKETPLACE}:{}", r.refund_id))?;
    match store::find_refund(conn, MARKETPLACE, &r.refund_id).await? {
        Some((last_status, last_ms))
            if !r.status.supersedes(modified_ms, &last_status, last_ms) =>
        {
            return Ok(Outcome::Stale)
        }
        Some(_) => {
            refunds::amend_in(conn, &refund_no, r.amount, r.kind, &r.lines).await?;
        }
        None => {
            let request = RefundRequest {
                refund_no: refund_no.clone(),
                amount: r.amount,
                reason: RefundReason::parse("reason", "marketplace refund".to_owned())?,
                kind: r.kind,
                lines: r.lines.clone(),
            };
            refunds::request_in(conn, order_id, &request).await?;
        }
    }
    store::upsert_refund(
        conn,
        store::RefundSnapshot {
            channel: MARKETPLACE,
            external_refund_id: &r.refund_id,
            external_order_id: &r.tid,
            refund_no: refund_no.as_str(),
            status: r.status.as_str(),
            modified_ms,
            refund_cents: r.amount.get(),
        },
    )
    .await?;
    let outcome = match r.status {
        RefundSyncStatus::Open(_) => return Ok(Outcome::Applied),
        RefundSyncStatus::Success => RefundOutcome::Success,
        RefundSyncStatus::Closed | RefundSyncStatus::Failed => RefundOutcome::Closed,
    };
    let notice = RefundNotice {
        refund_no,
        outcome,
        modified_ms,
    };
    refunds::apply_notice_in(conn, &notice).await?;
    Ok(Outcome::Applied)
}
