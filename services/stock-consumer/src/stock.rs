//! The stock rules. Consumed events run in the runtime's transaction ([`reserve`], [`settle`]);
//! warehouse counts have their own ([`put`], [`get`], [`all`], [`reservation`]).
//!
//! The order's reservation row is the business key: a second `OrderPaid` for the same order
//! (under a new event id) finds it and changes nothing. Later events move the reserved lines by
//! line ([`crate::lines`]): each applies only in the reservation state its kind comes from, and
//! moves every line's cumulative amount up to the event's target, so an event that arrives
//! again, or late, changes nothing either. The lines' CHECKs (`released + deducted <=
//! reserved`, `restocked <= deducted`), the movements' partial unique key (reserved once,
//! deducted once) and the stock CHECKs hold the line below all of that.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use outbox_consumer::{Effect, HandlerError};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::{MovementKind, OnHand, ReservationStatus, SkuId};
use crate::error::Error;
use crate::events::{self, LineView, Shortage, StockEvent};
use crate::lines::{self, Instruction, LineAmounts, Move};
use crate::store::{self, Line, StockRow};

/// `OrderPaid`: reserves every line, or nothing if any line lacks stock; publishes
/// `StockReserved` or `StockReservationRejected`. A decided order is left alone.
///
/// # Errors
/// [`HandlerError::Unapplicable`] for an order without lines or with a non-positive quantity,
/// database and outbox errors.
pub async fn reserve(
    conn: &mut PgConnection,
    event_id: Uuid,
    order_id: Uuid,
    items: &[LineView],
) -> Result<Effect, HandlerError> {
    let mut wanted: BTreeMap<&str, i64> = BTreeMap::new();
    for item in items {
        if item.quantity <= 0 {
            return Err(HandlerError::Unapplicable(format!(
                "line {} has quantity {}",
                item.sku_id, item.quantity
            )));
        }
        *wanted.entry(item.sku_id.as_str()).or_default() += item.quantity;
    }
    if wanted.is_empty() {
        return Err(HandlerError::Unapplicable("order without lines".to_owned()));
    }
    let skus: Vec<&str> = wanted.keys().copied().collect();
    let stock: HashMap<String, StockRow> = store::lock_skus(conn, &skus)
        .await?
        .into_iter()
        .map(|s| (s.sku_id.clone(), s))
        .collect();
    let shortages: Vec<Shortage> = wanted
        .iter()
        .filter_map(|(sku, &requested)| {
            let available = stock.get(*sku).map_or(0, |s| s.on_hand - s.reserved);
            (available < requested).then(|| Shortage {
                sku_id: (*sku).to_owned(),
                requested,
                available,
            })
        })
        .collect();
    let status = if shortages.is_empty() {
        ReservationStatus::Reserved
    } else {
        ReservationStatus::Rejected
    };
    if !store::insert_reservation(conn, order_id, status).await? {
        tracing::info!(order.id = %order_id, "Order's stock was decided before; nothing to reserve");
        return Ok(Effect::Unchanged);
    }
    let event = if shortages.is_empty() {
        let lines: Vec<Line> = wanted
            .iter()
            .map(|(sku, &quantity)| Line {
                sku_id: (*sku).to_owned(),
                quantity,
            })
            .collect();
        store::insert_lines(conn, order_id, &lines).await?;
        let moves: Vec<Move> = lines
            .iter()
            .map(|l| Move {
                sku_id: l.sku_id.clone(),
                kind: MovementKind::Reserve,
                quantity: l.quantity,
            })
            .collect();
        store::apply_moves(conn, order_id, event_id, &moves).await?;
        StockEvent::StockReserved {
            order_id,
            lines: lines
                .into_iter()
                .map(|l| LineView {
                    sku_id: l.sku_id,
                    quantity: l.quantity,
                })
                .collect(),
        }
    } else {
        tracing::info!(order.id = %order_id, shortages = shortages.len(), "Not enough stock; reserving nothing");
        StockEvent::StockReservationRejected {
            order_id,
            shortages,
        }
    };
    events::append(conn, &event).await?;
    Ok(Effect::Changed)
}

/// Moves the order's reserved lines as `instruction` says (releases, deductions, restocks), if
/// its reservation is in the state that kind of movement applies in; the status follows the
/// lines ([`lines::summary`]). Arriving again or late, or for an order that was never reserved,
/// changes nothing; a move that contradicts the reservation (shipping released goods,
/// restocking more than was shipped or goods never shipped) is refused for good.
///
/// # Errors
/// [`HandlerError::Unapplicable`] for a contradicting move, database errors.
pub async fn settle(
    conn: &mut PgConnection,
    event_id: Uuid,
    order_id: Uuid,
    instruction: &Instruction,
) -> Result<Effect, HandlerError> {
    let kind = instruction.kind();
    let Some(current) = store::lock_reservation(conn, order_id).await? else {
        return unchanged_or_refused(order_id, kind, None);
    };
    if current != kind.applies_in() {
        return unchanged_or_refused(order_id, kind, Some(current));
    }
    let lines = store::lock_lines(conn, order_id).await?;
    let moves = lines::plan(instruction, &lines).map_err(|c| {
        HandlerError::Unapplicable(format!(
            "{} of order {order_id} contradicts its reservation: {c}",
            kind.as_str()
        ))
    })?;
    if moves.is_empty() {
        tracing::info!(order.id = %order_id, movement = kind.as_str(), reservation = current.as_str(), "Lines are there already; nothing to move");
        return Ok(Effect::Unchanged);
    }
    let shipped = kind == MovementKind::Deduct || current != ReservationStatus::Reserved;
    let to = lines::summary(&lines::after(&lines, &moves), shipped);
    let skus: BTreeSet<&str> = moves.iter().map(|m| m.sku_id.as_str()).collect();
    store::lock_skus(conn, &skus.into_iter().collect::<Vec<_>>()).await?;
    if !store::set_reservation(conn, order_id, current, to).await? {
        return Err(HandlerError::Unapplicable(
            "locked reservation changed status".to_owned(),
        ));
    }
    store::apply_moves(conn, order_id, event_id, &moves).await?;
    tracing::info!(
        order.id = %order_id,
        movement = kind.as_str(),
        moves = moves.len(),
        units = moves.iter().map(|m| m.quantity).sum::<i64>(),
        reservation = to.as_str(),
        "Stock moved"
    );
    Ok(Effect::Changed)
}

/// What a movement that does not fit the reservation means: nothing to do (already done, or
/// nothing was reserved), or a contradiction no retry fixes.
fn unchanged_or_refused(
    order_id: Uuid,
    kind: MovementKind,
    current: Option<ReservationStatus>,
) -> Result<Effect, HandlerError> {
    use MovementKind::*;
    use ReservationStatus::*;
    let nothing_to_do = match (kind, current) {
        // Cancelled or refunded without (or after) a reservation, or after shipping (which
        // released what did not ship): nothing is held.
        (Release, None | Some(Rejected | Released | Deducted | Restocked)) => true,
        (Deduct, Some(Deducted | Restocked)) => true,
        // Every shipped unit is back already.
        (Restock, Some(Restocked)) => true,
        _ => false,
    };
    let status = current.map_or("none", ReservationStatus::as_str);
    if nothing_to_do {
        tracing::info!(order.id = %order_id, movement = kind.as_str(), reservation = status, "Nothing to move");
        return Ok(Effect::Unchanged);
    }
    Err(HandlerError::Unapplicable(format!(
        "{} of order {order_id} contradicts its reservation ({status})",
        kind.as_str()
    )))
}

/// `PUT /stock/{sku_id}`: sets the units on hand.
///
/// # Errors
/// [`Error::BelowReserved`] when fewer units than are reserved would be on hand, database
/// errors.
pub async fn put(pool: &PgPool, sku_id: &SkuId, on_hand: OnHand) -> Result<StockRow, Error> {
    let mut conn = pool.acquire().await?;
    match store::put(&mut conn, sku_id.as_str(), on_hand.get()).await {
        Err(sqlx::Error::Database(e))
            if e.constraint() == Some("stock_reserved_within_on_hand") =>
        {
            Err(Error::BelowReserved)
        }
        other => Ok(other?),
    }
}

/// `GET /stock/{sku_id}`.
///
/// # Errors
/// [`Error::SkuNotFound`], database errors.
pub async fn get(pool: &PgPool, sku_id: &SkuId) -> Result<StockRow, Error> {
    let mut conn = pool.acquire().await?;
    store::find(&mut conn, sku_id.as_str())
        .await?
        .ok_or(Error::SkuNotFound)
}

/// `GET /reservations/{order_id}`: the order's reservation status and its lines' amounts.
///
/// # Errors
/// [`Error::ReservationNotFound`], database errors.
pub async fn reservation(
    pool: &PgPool,
    order_id: Uuid,
) -> Result<(ReservationStatus, Vec<LineAmounts>), Error> {
    let mut conn = pool.acquire().await?;
    let status = store::reservation(&mut conn, order_id)
        .await?
        .ok_or(Error::ReservationNotFound)?;
    Ok((status, store::lines(&mut conn, order_id).await?))
}

/// `GET /stock`: every SKU.
///
/// # Errors
/// Database errors.
pub async fn all(pool: &PgPool) -> Result<Vec<StockRow>, Error> {
    let mut conn = pool.acquire().await?;
    Ok(store::all(&mut conn).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_or_late_moves_change_nothing_and_contradictions_are_refused() {
        use MovementKind::*;
        use ReservationStatus::*;
        let id = Uuid::nil();
        let ok = |k, s| matches!(unchanged_or_refused(id, k, s), Ok(Effect::Unchanged));
        assert!(ok(Release, None));
        assert!(ok(Release, Some(Rejected)));
        assert!(ok(Release, Some(Deducted)));
        assert!(ok(Deduct, Some(Deducted)));
        assert!(ok(Restock, Some(Restocked)));
        assert!(!ok(Deduct, Some(Released)), "shipping released goods");
        assert!(!ok(Deduct, None), "shipping what was never reserved");
        assert!(ok(Release, Some(Restocked)));
        assert!(
            !ok(Restock, Some(Reserved)),
            "a return of goods never shipped"
        );
        assert!(
            !ok(Restock, Some(Released)),
            "a return of goods released before shipping"
        );
        assert!(!ok(Restock, None), "a return for an order never reserved");
        assert!(!ok(Deduct, Some(Rejected)), "shipping a rejected order");
    }
}
