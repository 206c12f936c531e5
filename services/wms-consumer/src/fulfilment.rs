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

use crate::domain::{HoldChange, Holds, OutboundStatus, Shipment};
use crate::error::Error;
use crate::events::{self, EventType, OutboundView};
use crate::store::{self, LineRow, Units};

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
        // A refund by line whose units were taken out already (its success again, under a new
        // event id, perhaps after the rest shipped): those units never left, nothing to recall.
        HoldChange::CutIfUnshipped if store::is_cut(conn, order_id, hold).await? => {
            tracing::info!(order.id = %order_id, hold, "A refund by line was taken out of the outbound already; nothing to change");
        }
        HoldChange::PermanentIfShipped | HoldChange::CutIfUnshipped => {
            let shipped = store::find_by_order(conn, order_id)
                .await?
                .is_some_and(|o| o.status.is_shipped());
            if shipped {
                store::make_hold_permanent(conn, order_id, hold).await?;
            } else {
                if change == HoldChange::CutIfUnshipped {
                    store::mark_cut_pending(conn, order_id, hold).await?;
                }
                store::release_hold(conn, order_id, hold).await?;
            }
        }
    }
    settle(conn, order_id).await?;
    Ok(Effect::Changed)
}

/// Records the units a refund takes back (`None`: the whole order); its hold is changed next.
///
/// # Errors
/// Database errors.
pub async fn set_refund_lines(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
    lines: Option<&[Units]>,
) -> Result<(), Error> {
    store::lock_order(conn, order_id).await?;
    store::set_hold_lines(conn, order_id, hold, lines).await?;
    Ok(())
}

/// Moves the order's outbound to where its holds say, emitting the event of the move, after
/// taking out the units of refunds by line that succeeded before shipping. The caller holds
/// the order's lock.
async fn settle(conn: &mut PgConnection, order_id: Uuid) -> Result<(), Error> {
    let Some(outbound) = store::find_by_order(conn, order_id).await? else {
        return Ok(());
    };
    if !outbound.status.is_shipped() && outbound.status != OutboundStatus::Cancelled {
        for (hold, lines) in store::pending_cuts(conn, order_id).await? {
            cut(conn, &outbound, &hold, &lines.0).await?;
        }
    }
    let outbound = store::find_by_order(conn, order_id)
        .await?
        .ok_or(Error::Invariant("locked outbound vanished"))?;
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

/// Takes a refund's units out of an unshipped outbound and emits `OutboundLinesCancelled` (the
/// stock consumer releases them); what the outbound does not have is not taken. When nothing
/// would be left to ship, the hold becomes permanent instead and [`settle`] cancels the
/// outbound. The caller holds the order's lock.
async fn cut(
    conn: &mut PgConnection,
    outbound: &store::OutboundRow,
    hold: &str,
    units: &[Units],
) -> Result<(), Error> {
    let lines = store::lines(conn, &outbound.outbound_no).await?;
    let taken = take(&lines, units);
    let left: i32 = lines.iter().map(|l| l.quantity).sum::<i32>()
        - taken.iter().map(|u| u.quantity).sum::<i32>();
    store::mark_cut_done(conn, outbound.order_id, hold).await?;
    if left <= 0 {
        tracing::info!(outbound.no = %outbound.outbound_no, hold, "A refund by line takes every unit; the outbound will be cancelled");
        store::make_hold_permanent(conn, outbound.order_id, hold).await?;
        return Ok(());
    }
    if taken.is_empty() {
        return Ok(());
    }
    for u in &taken {
        store::take_out(conn, &outbound.outbound_no, &u.sku_id, u.quantity).await?;
    }
    let row = store::find(conn, &outbound.outbound_no)
        .await?
        .ok_or(Error::Invariant("locked outbound vanished"))?;
    let lines = store::lines(conn, &outbound.outbound_no).await?;
    let refund_no = hold.strip_prefix("refund:");
    events::append_with(
        conn,
        EventType::OutboundLinesCancelled,
        &OutboundView::new(row, lines),
        &events::Detail {
            cancelled_lines: Some(&taken),
            refund_no,
            ..events::Detail::default()
        },
    )
    .await?;
    Ok(())
}

/// The units of `wanted` an outbound with `lines` can give: per SKU, at most what the line
/// has left (to ship, or not yet back); SKUs it does not have are left out.
pub fn take(lines: &[LineRow], wanted: &[Units]) -> Vec<Units> {
    let mut taken: Vec<Units> = Vec::new();
    for w in wanted {
        let have = lines
            .iter()
            .find(|l| l.sku_id == w.sku_id)
            .map_or(0, |l| l.quantity - l.returned_quantity);
        let already = taken
            .iter()
            .find(|t| t.sku_id == w.sku_id)
            .map_or(0, |t| t.quantity);
        let units = w.quantity.min(have - already);
        if units <= 0 {
            continue;
        }
        match taken.iter_mut().find(|t| t.sku_id == w.sku_id) {
            Some(t) => t.quantity += units,
            None => taken.push(Units {
                sku_id: w.sku_id.clone(),
                quantity: units,
            }),
        }
    }
    taken.sort_by(|a, b| a.sku_id.cmp(&b.sku_id));
    taken
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sku: &str, quantity: i32, returned_quantity: i32) -> LineRow {
        LineRow {
            sku_id: sku.into(),
            quantity,
            returned_quantity,
        }
    }

    fn units(sku: &str, quantity: i32) -> Units {
        Units {
            sku_id: sku.into(),
            quantity,
        }
    }

    #[test]
    fn a_refund_takes_at_most_what_each_line_has_left() {
        let lines = [line("A", 2, 0), line("B", 3, 1)];
        assert_eq!(take(&lines, &[units("A", 1)]), [units("A", 1)]);
        assert_eq!(
            take(&lines, &[units("B", 5), units("A", 3)]),
            [units("A", 2), units("B", 2)],
            "capped per line, by what is not back yet, sorted by SKU"
        );
        assert_eq!(
            take(&lines, &[units("A", 1), units("A", 2)]),
            [units("A", 2)],
            "two refunds of one SKU never take more than the line has"
        );
        assert!(
            take(&lines, &[units("C", 1)]).is_empty(),
            "a SKU not in the outbound"
        );
        assert!(
            take(&[line("A", 1, 1)], &[units("A", 1)]).is_empty(),
            "all back already"
        );
    }

    fn hold(lines: Option<&[Units]>) -> store::HoldRow {
        store::HoldRow {
            hold: "refund:R".into(),
            active: true,
            lines: lines.map(|l| sqlx::types::Json(l.to_vec())),
        }
    }

    #[test]
    fn a_return_brings_what_the_holds_expect_and_nothing_already_back() {
        let lines = [line("A", 3, 1), line("B", 2, 0)];
        assert_eq!(
            expected_back(&lines, &[hold(Some(&[units("A", 1)]))]),
            [units("A", 1)],
            "a refund by line: its units only"
        );
        assert_eq!(
            expected_back(
                &lines,
                &[
                    hold(Some(&[units("B", 1)])),
                    hold(Some(&[units("A", 5), units("B", 2)]))
                ]
            ),
            [units("A", 2), units("B", 2)],
            "refunds by line together, capped by what is not back yet"
        );
        assert_eq!(
            expected_back(&lines, &[hold(Some(&[units("B", 1)])), hold(None)]),
            [units("A", 2), units("B", 2)],
            "a hold on the whole order: every unit not back yet"
        );
        assert!(expected_back(&[line("A", 1, 1)], &[hold(None)]).is_empty());
    }

    #[test]
    fn a_return_ends_the_outbound_only_when_every_shipped_unit_is_back() {
        let free = Holds::default();
        let open = Holds {
            active: true,
            permanent: false,
        };
        let all_back = [line("A", 3, 3), line("B", 1, 1)];
        let some_back = [line("A", 3, 1), line("B", 1, 0)];
        assert_eq!(after_return(&all_back, free), OutboundStatus::Returned);
        assert_eq!(
            after_return(&all_back, open),
            OutboundStatus::Returned,
            "nothing left to expect"
        );
        assert_eq!(
            after_return(&some_back, free),
            OutboundStatus::Shipped,
            "the received holds no longer recall it; the rest is with the buyer"
        );
        assert_eq!(
            after_return(&some_back, open),
            OutboundStatus::Recall,
            "a hold still counting keeps it recalled"
        );
    }
}
