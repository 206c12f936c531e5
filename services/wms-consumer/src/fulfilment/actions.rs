//! The warehouse's actions over HTTP, each in a transaction of its own: ship an outbound,
//! receive a return, read outbounds.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::consumed::take;
use crate::domain::{Holds, OutboundStatus, Shipment};
use crate::error::Error;
use crate::events::{self, EventType, OutboundView};
use crate::store::{self, LineRow, Units};

/// What a return brings back to an outbound with `lines`, given the holds expecting goods: a
/// hold on the whole order (no lines: a refund without lines, a cancellation, `held:`) every
/// unit not back yet; otherwise the units of the refunds by line together, capped per line by
/// what is not back yet ([`take`]).
pub fn expected_back(lines: &[LineRow], expecting: &[store::HoldRow]) -> Vec<Units> {
    let wanted: Vec<Units> = if expecting.iter().any(|h| h.lines.is_none()) {
        lines
            .iter()
            .map(|l| Units {
                sku_id: l.sku_id.clone(),
                quantity: l.quantity,
            })
            .collect()
    } else {
        expecting
            .iter()
            .filter_map(|h| h.lines.as_ref())
            .flat_map(|l| l.0.iter().cloned())
            .collect()
    };
    take(lines, &wanted)
}

/// Where a recalled outbound goes once a return arrived, given its lines afterwards and the
/// holds still counting (those not received): `RETURNED` when every shipped unit is back,
/// else where the holds say from `RECALL` (`SHIPPED` when none expects goods any more).
pub fn after_return(lines: &[LineRow], holds: Holds) -> OutboundStatus {
    if lines.iter().all(|l| l.returned_quantity >= l.quantity) {
        OutboundStatus::Returned
    } else {
        OutboundStatus::Recall.settle(holds)
    }
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

/// `POST /outbounds/{outbound_no}/return-received`: the parcel's return arrived. It brings
/// what the order's holds expect back (a refund by line its units, any other hold every unit
/// not back yet), emits `ReturnReceived` with `received_lines`, and the outbound goes
/// `RECALL -> RETURNED` when every shipped unit is back, `RECALL -> SHIPPED` when some are
/// still with the buyer. Repeating it answers the outbound as it is (replayed) when it is
/// `RETURNED`, or `SHIPPED` with units back and no hold expecting more.
///
/// # Errors
/// [`Error::OutboundNotFound`], [`Error::NoReturnExpected`] unless recalled, database errors.
pub async fn return_received(pool: &PgPool, outbound_no: &str) -> Result<ActionResult, Error> {
    let mut tx = pool.begin().await?;
    let outbound = lock_outbound(&mut tx, outbound_no).await?;
    let lines = store::lines(&mut tx, outbound_no).await?;
    let some_back = lines.iter().any(|l| l.returned_quantity > 0);
    match outbound.status {
        OutboundStatus::Recall => {}
        OutboundStatus::Returned | OutboundStatus::Shipped
            if outbound.status == OutboundStatus::Returned || some_back =>
        {
            tx.rollback().await?;
            return Ok(ActionResult {
                outbound: OutboundView::new(outbound, lines),
                replayed: true,
            });
        }
        status => return Err(Error::NoReturnExpected { status }),
    }
    let expecting = store::holds_expecting_goods(&mut tx, outbound.order_id).await?;
    let received = expected_back(&lines, &expecting);
    let held: Vec<String> = expecting.into_iter().map(|h| h.hold).collect();
    store::mark_received(&mut tx, outbound.order_id, &held).await?;
    store::add_returned(&mut tx, outbound_no, &received).await?;
    let lines = store::lines(&mut tx, outbound_no).await?;
    // The holds just received no longer count (`store::holds`).
    let to = after_return(&lines, store::holds(&mut tx, outbound.order_id).await?);
    let row = if to == OutboundStatus::Recall {
        outbound
    } else {
        store::set_status(&mut tx, outbound_no, OutboundStatus::Recall, to)
            .await?
            .ok_or(Error::Invariant("locked outbound changed status"))?
    };
    let view = OutboundView::new(row, lines);
    events::append_with(
        &mut tx,
        EventType::ReturnReceived,
        &view,
        &events::Detail {
            received_lines: Some(&received),
            ..events::Detail::default()
        },
    )
    .await?;
    tx.commit().await?;
    tracing::info!(
        outbound.no = %outbound_no,
        outbound.status = %view.status,
        received = received.len(),
        "Return received"
    );
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
