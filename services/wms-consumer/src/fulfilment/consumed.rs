//! What consumed events do to outbounds, in the consumer's transaction: an outbound created
//! from reserved stock, holds opened, released or made permanent by refunds and cancellations,
//! and [`settle`], which every change ends with.

use outbox_consumer::Effect;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{HoldChange, OutboundStatus};
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
