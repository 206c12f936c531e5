//! The WMS rules: outbounds created from reserved stock, holds from refunds and cancellations,
//! and the warehouse's actions (ship, receive a return). Each function runs in the caller's
//! transaction (consumer) or owns one (HTTP), takes the order's lock first, and appends the
//! events of what it changed to the outbox in the same transaction.
//!
//! Events reach the WMS from two topics (orders, stock) in no particular order between them,
//! so holds are kept per order whether or not its outbound exists yet, and every change ends
//! with [`settle`]: the outbound moves to where its holds say ([`OutboundStatus::settle`]).

use outbox_kit::consumer::Effect;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::{OutboundStatus, Shipment};
use crate::error::Error;
use crate::events::{self, EventType, OutboundView};
use crate::store::{self, LineRow};

/// How an event changes a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldChange {
    /// A refund was requested.
    Open,
    /// A refund was closed without paying out.
    Release,
    /// A refund of everything paid succeeded before shipping, or the order was cancelled: it
    /// will never ship.
    MakePermanent,
    /// A return-and-refund succeeded without refunding the whole order: if the parcel left, it
    /// must come back (permanent, the outbound stays recalled); if not, nothing comes back and
    /// the rest of the order ships (released).
    PermanentIfShipped,
}

/// Creates the order's outbound (once: `order_id` is unique) with `lines`, emits
/// `OutboundCreated`, and settles it against holds that arrived first.
///
/// # Errors
/// Database and outbox errors.
pub async fn create_outbound(
    conn: &mut PgConnection,
    order_id: Uuid,
    lines: &[LineRow],
) -> Result<Effect, Error> {
    store::lock_order(conn, order_id).await?;
    let Some(row) = store::insert_outbound(conn, order_id).await? else {
        tracing::info!(order.id = %order_id, "Order has an outbound already; nothing to create");
        return Ok(Effect::Unchanged);
    };
    store::insert_lines(conn, &row.outbound_no, lines).await?;
    let lines = store::lines(conn, &row.outbound_no).await?;
    events::append(
        conn,
        EventType::OutboundCreated,
        &OutboundView::new(row, lines),
    )
    .await?;
    settle(conn, order_id).await?;
    Ok(Effect::Changed)
}

/// Applies a hold change to the order and settles its outbound, if it has one.
///
/// # Errors
/// Database and outbox errors.
pub async fn change_hold(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
    change: HoldChange,
) -> Result<Effect, Error> {
    store::lock_order(conn, order_id).await?;
    match change {
        HoldChange::Open => store::open_hold(conn, order_id, hold).await?,
        HoldChange::Release => store::release_hold(conn, order_id, hold).await?,
        HoldChange::MakePermanent => store::make_hold_permanent(conn, order_id, hold).await?,
        HoldChange::PermanentIfShipped => {
            let shipped = store::find_by_order(conn, order_id)
                .await?
                .is_some_and(|o| o.status.is_shipped());
            if shipped {
                store::make_hold_permanent(conn, order_id, hold).await?;
            } else {
                store::release_hold(conn, order_id, hold).await?;
            }
        }
    }
    settle(conn, order_id).await?;
    Ok(Effect::Changed)
}

/// Moves the order's outbound to where its holds say, emitting the event of the move. The
/// caller holds the order's lock.
async fn settle(conn: &mut PgConnection, order_id: Uuid) -> Result<(), Error> {
    let Some(outbound) = store::find_by_order(conn, order_id).await? else {
        return Ok(());
    };
    let holds = store::holds(conn, order_id).await?;
    let from = outbound.status;
    let to = from.settle(holds);
    let Some(event) = EventType::for_settlement(from, to) else {
        return Ok(());
    };
    let row = store::set_status(conn, &outbound.outbound_no, from, to)
        .await?
        .ok_or(Error::Invariant("locked outbound changed status"))?;
    let lines = store::lines(conn, &row.outbound_no).await?;
    events::append(conn, event, &OutboundView::new(row, lines)).await?;
    Ok(())
}

/// The answer to a warehouse action.
#[derive(Debug, Clone)]
pub struct ActionResult {
    /// The outbound afterwards.
    pub outbound: OutboundView,
    /// `true` when the action had been done before (same outbound, same tracking number):
    /// nothing changed.
    pub replayed: bool,
}

/// Finds an outbound and takes its order's lock, then reads it again under the lock.
async fn lock_outbound(
    conn: &mut PgConnection,
    outbound_no: &str,
) -> Result<store::OutboundRow, Error> {
    let order_id = store::find(conn, outbound_no)
        .await?
        .ok_or(Error::OutboundNotFound)?
        .order_id;
    store::lock_order(conn, order_id).await?;
    store::find(conn, outbound_no)
        .await?
        .ok_or(Error::Invariant("outbound vanished"))
}

/// `POST /outbounds/{outbound_no}/ship`: `CREATED -> SHIPPED` and `OutboundShipped`. Shipping
/// again with the same carrier and tracking number answers the shipped outbound.
///
/// # Errors
/// [`Error::OutboundNotFound`], [`Error::NotShippable`] when intercepted or cancelled,
/// [`Error::AlreadyShipped`] with another tracking number, [`Error::TrackingNoInUse`],
/// database errors.
pub async fn ship(
    pool: &PgPool,
    outbound_no: &str,
    shipment: &Shipment,
) -> Result<ActionResult, Error> {
    let mut tx = pool.begin().await?;
    let outbound = lock_outbound(&mut tx, outbound_no).await?;
    match outbound.status {
        OutboundStatus::Created => {}
        s if s.is_shipped() => {
            let same = outbound.carrier.as_deref() == Some(shipment.carrier.as_str())
                && outbound.tracking_no.as_deref() == Some(shipment.tracking_no.as_str());
            if !same {
                return Err(Error::AlreadyShipped {
                    tracking_no: outbound.tracking_no.unwrap_or_default(),
                });
            }
            let lines = store::lines(&mut tx, outbound_no).await?;
            tx.rollback().await?;
            return Ok(ActionResult {
                outbound: OutboundView::new(outbound, lines),
                replayed: true,
            });
        }
        status => return Err(Error::NotShippable { status }),
    }
    let row = match store::ship(&mut tx, outbound_no, shipment).await {
        Ok(Some(row)) => row,
        Ok(None) => return Err(Error::Invariant("locked outbound changed status")),
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("outbounds_tracking_no_once") => {
            return Err(Error::TrackingNoInUse)
        }
        Err(e) => return Err(e.into()),
    };
    let lines = store::lines(&mut tx, outbound_no).await?;
    let view = OutboundView::new(row, lines);
    events::append(&mut tx, EventType::OutboundShipped, &view).await?;
    tx.commit().await?;
    Ok(ActionResult {
        outbound: view,
        replayed: false,
    })
}

/// `POST /outbounds/{outbound_no}/return-received`: `RECALL -> RETURNED` and `ReturnReceived`.
/// Repeating it answers the returned outbound.
///
/// # Errors
/// [`Error::OutboundNotFound`], [`Error::NoReturnExpected`] unless recalled, database errors.
pub async fn return_received(pool: &PgPool, outbound_no: &str) -> Result<ActionResult, Error> {
    let mut tx = pool.begin().await?;
    let outbound = lock_outbound(&mut tx, outbound_no).await?;
    match outbound.status {
        OutboundStatus::Recall => {}
        OutboundStatus::Returned => {
            let lines = store::lines(&mut tx, outbound_no).await?;
            tx.rollback().await?;
            return Ok(ActionResult {
                outbound: OutboundView::new(outbound, lines),
                replayed: true,
            });
        }
        status => return Err(Error::NoReturnExpected { status }),
    }
    let row = store::set_status(
        &mut tx,
        outbound_no,
        OutboundStatus::Recall,
        OutboundStatus::Returned,
    )
    .await?
    .ok_or(Error::Invariant("locked outbound changed status"))?;
    let lines = store::lines(&mut tx, outbound_no).await?;
    let view = OutboundView::new(row, lines);
    events::append(&mut tx, EventType::ReturnReceived, &view).await?;
    tx.commit().await?;
    Ok(ActionResult {
        outbound: view,
        replayed: false,
    })
}

/// An outbound with its lines.
///
/// # Errors
/// [`Error::OutboundNotFound`], database errors.
pub async fn get(pool: &PgPool, outbound_no: &str) -> Result<OutboundView, Error> {
    let mut conn = pool.acquire().await?;
    let row = store::find(&mut conn, outbound_no)
        .await?
        .ok_or(Error::OutboundNotFound)?;
    let lines = store::lines(&mut conn, outbound_no).await?;
    Ok(OutboundView::new(row, lines))
}

/// The outbounds of an order (none or one).
///
/// # Errors
/// Database errors.
pub async fn for_order(pool: &PgPool, order_id: Uuid) -> Result<Vec<OutboundView>, Error> {
    let mut conn = pool.acquire().await?;
    let Some(row) = store::find_by_order(&mut conn, order_id).await? else {
        return Ok(vec![]);
    };
    let lines = store::lines(&mut conn, &row.outbound_no).await?;
    Ok(vec![OutboundView::new(row, lines)])
}
