//! The per-line rules: what an order or outbound event moves on each reserved line, as pure
//! functions of the line's running amounts (`reservation_lines`) and the event's units per SKU.
//!
//! Every amount is cumulative and only moves up to the event's target, so an event delivered
//! again (under the same or a new event id) or late plans nothing:
//!
//! | event | instruction | per line |
//! |---|---|---|
//! | `OutboundLinesCancelled` | [`Instruction::KeepOnly`] | `released` up to `reserved - deducted - left to ship` |
//! | `OutboundShipped` | [`Instruction::Ship`] | `deducted` up to the units shipped, the rest of `reserved` released |
//! | `OutboundCancelled`, `OrderCancelled` | [`Instruction::ReleaseAll`] | everything not released or deducted, released |
//! | `ReturnReceived` | [`Instruction::Returned`] | `restocked` up to the units back so far, never above `deducted` |
//!
//! A SKU the event names but the order never reserved is ignored when it only releases, and a
//! [`Contradiction`] when units of it shipped or came back; so is shipping more than is held or
//! restocking more than was shipped.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::domain::{MovementKind, ReservationStatus};

/// A reserved line's running amounts: one `reservation_lines` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, Serialize, utoipa::ToSchema)]
pub struct LineAmounts {
    /// The SKU.
    pub sku_id: String,
    /// Units reserved when the order was paid.
    pub reserved: i64,
    /// Units given back before shipping (refunded lines, a cancellation, what did not ship).
    pub released: i64,
    /// Units that left the warehouse.
    pub deducted: i64,
    /// Deducted units returned and put back on hand.
    pub restocked: i64,
}

impl LineAmounts {
    /// A freshly reserved line.
    pub fn reserved(sku_id: &str, reserved: i64) -> Self {
        Self {
            sku_id: sku_id.to_owned(),
            reserved,
            released: 0,
            deducted: 0,
            restocked: 0,
        }
    }

    /// Units still held for shipping.
    pub fn held(&self) -> i64 {
        self.reserved - self.released - self.deducted
    }
}

/// What an event says about the order's lines: units per SKU (summed over the event's lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    /// The goods will never ship: release everything still held.
    ReleaseAll,
    /// Only these units are left to ship (a SKU absent: none); release the rest.
    KeepOnly(BTreeMap<String, i64>),
    /// These units left the warehouse; release what did not ship.
    Ship(BTreeMap<String, i64>),
    /// So many units came back so far (cumulative).
    Returned(BTreeMap<String, i64>),
}

impl Instruction {
    /// The kind of movement it stands for: the reservation status it applies in
    /// ([`MovementKind::applies_in`]) and the log's wording.
    pub fn kind(&self) -> MovementKind {
        match self {
            Self::ReleaseAll | Self::KeepOnly(_) => MovementKind::Release,
            Self::Ship(_) => MovementKind::Deduct,
            Self::Returned(_) => MovementKind::Restock,
        }
    }
}

/// One step of one line: a `stock_movements` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The SKU.
    pub sku_id: String,
    /// What happens to the units.
    pub kind: MovementKind,
    /// Units, always positive.
    pub quantity: i64,
}

/// Why an event cannot apply to the reservation's lines; no retry changes that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Contradiction {
    /// More units shipped than the line still holds (some were released).
    #[error("{sku_id}: {shipped} units shipped, but only {held} are held")]
    ShippedMoreThanHeld {
        /// The SKU.
        sku_id: String,
        /// Units the event says shipped.
        shipped: i64,
        /// Units the line holds.
        held: i64,
    },
    /// More units back than ever shipped.
    #[error("{sku_id}: {returned} units returned, but only {deducted} were shipped")]
    ReturnedMoreThanDeducted {
        /// The SKU.
        sku_id: String,
        /// Units the event says are back.
        returned: i64,
        /// Units the line deducted.
        deducted: i64,
    },
    /// Units of a SKU the order never reserved shipped or came back.
    #[error("{sku_id}: {units} units moved, but the order never reserved this SKU")]
    NotReserved {
        /// The SKU.
        sku_id: String,
        /// Units the event names.
        units: i64,
    },
}

/// The moves that bring `lines` (the reservation's, by SKU) up to what `instruction` says;
/// empty when they are there already.
///
/// # Errors
/// A [`Contradiction`] when the instruction cannot apply to these lines.
pub fn plan(instruction: &Instruction, lines: &[LineAmounts]) -> Result<Vec<Move>, Contradiction> {
    let step = |l: &LineAmounts, kind, quantity| Move {
        sku_id: l.sku_id.clone(),
        kind,
        quantity,
    };
    let units = |m: &BTreeMap<String, i64>, l: &LineAmounts| m.get(&l.sku_id).copied().unwrap_or(0);
    let mut moves = Vec::new();
    match instruction {
        Instruction::ReleaseAll => {
            for l in lines.iter().filter(|l| l.held() > 0) {
                moves.push(step(l, MovementKind::Release, l.held()));
            }
        }
        Instruction::KeepOnly(left) => {
            for l in lines {
                let target = l.reserved - l.deducted - units(left, l).max(0);
                if target > l.released {
                    moves.push(step(l, MovementKind::Release, target - l.released));
                }
            }
        }
        Instruction::Ship(shipped) => {
            not_reserved(shipped, lines)?;
            for l in lines {
                let deduct = (units(shipped, l) - l.deducted).max(0);
                if deduct > l.held() {
                    return Err(Contradiction::ShippedMoreThanHeld {
                        sku_id: l.sku_id.clone(),
                        shipped: units(shipped, l),
                        held: l.held(),
                    });
                }
                if deduct > 0 {
                    moves.push(step(l, MovementKind::Deduct, deduct));
                }
                if l.held() > deduct {
                    moves.push(step(l, MovementKind::Release, l.held() - deduct));
                }
            }
        }
        Instruction::Returned(back) => {
            not_reserved(back, lines)?;
            for l in lines {
                let returned = units(back, l);
                if returned > l.deducted {
                    return Err(Contradiction::ReturnedMoreThanDeducted {
                        sku_id: l.sku_id.clone(),
                        returned,
                        deducted: l.deducted,
                    });
                }
                if returned > l.restocked {
                    moves.push(step(l, MovementKind::Restock, returned - l.restocked));
                }
            }
        }
    }
    Ok(moves)
}

/// Positive units of a SKU none of `lines` has.
fn not_reserved(units: &BTreeMap<String, i64>, lines: &[LineAmounts]) -> Result<(), Contradiction> {
    match units
        .iter()
        .find(|(sku, &n)| n > 0 && !lines.iter().any(|l| &l.sku_id == *sku))
    {
        Some((sku, &n)) => Err(Contradiction::NotReserved {
            sku_id: sku.clone(),
            units: n,
        }),
        None => Ok(()),
    }
}

/// `lines` after `moves`.
pub fn after(lines: &[LineAmounts], moves: &[Move]) -> Vec<LineAmounts> {
    let mut lines = lines.to_vec();
    for m in moves {
        if let Some(l) = lines.iter_mut().find(|l| l.sku_id == m.sku_id) {
            match m.kind {
                MovementKind::Reserve => l.reserved += m.quantity,
                MovementKind::Release => l.released += m.quantity,
                MovementKind::Deduct => l.deducted += m.quantity,
                MovementKind::Restock => l.restocked += m.quantity,
            }
        }
    }
    lines
}

/// The reservation's status that sums `lines` up: once `shipped`, `RESTOCKED` when every
/// deducted unit is back, else `DEDUCTED`; before, `RELEASED` when nothing is held any more,
/// else `RESERVED`.
pub fn summary(lines: &[LineAmounts], shipped: bool) -> ReservationStatus {
    if shipped {
        let any_shipped = lines.iter().any(|l| l.deducted > 0);
        if any_shipped && lines.iter().all(|l| l.restocked == l.deducted) {
            ReservationStatus::Restocked
        } else {
            ReservationStatus::Deducted
        }
    } else if lines.iter().all(|l| l.held() == 0) {
        ReservationStatus::Released
    } else {
        ReservationStatus::Reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MovementKind::*;

    fn units(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect()
    }

    fn mv(sku: &str, kind: MovementKind, quantity: i64) -> Move {
        Move {
            sku_id: sku.to_owned(),
            kind,
            quantity,
        }
    }

    /// Applies `i` to `lines`, checking that the same instruction again plans nothing.
    fn step(lines: &[LineAmounts], i: &Instruction) -> (Vec<Move>, Vec<LineAmounts>) {
        let moves = plan(i, lines).unwrap();
        let next = after(lines, &moves);
        assert_eq!(plan(i, &next).unwrap(), vec![], "{i:?} again moves nothing");
        (moves, next)
    }

    fn order() -> Vec<LineAmounts> {
        vec![LineAmounts::reserved("A", 2), LineAmounts::reserved("B", 3)]
    }

    #[test]
    fn lines_refunded_before_shipping_are_released_and_the_rest_ships() {
        // One unit of A and all of B refunded before shipping: 1 A left to ship.
        let cut = Instruction::KeepOnly(units(&[("A", 1)]));
        let (moves, lines) = step(&order(), &cut);
        assert_eq!(moves, [mv("A", Release, 1), mv("B", Release, 3)]);
        assert_eq!(summary(&lines, false), ReservationStatus::Reserved);
        // A stale view (both lines still whole) releases nothing back.
        let stale = Instruction::KeepOnly(units(&[("A", 2), ("B", 3)]));
        assert_eq!(plan(&stale, &lines).unwrap(), vec![]);
        // Shipping what is left deducts it; nothing else is held.
        let ship = Instruction::Ship(units(&[("A", 1)]));
        let (moves, lines) = step(&lines, &ship);
        assert_eq!(moves, [mv("A", Deduct, 1)]);
        assert_eq!(summary(&lines, true), ReservationStatus::Deducted);
        assert_eq!(
            lines[1],
            LineAmounts {
                released: 3,
                ..LineAmounts::reserved("B", 3)
            }
        );
        // Cancelling now (late) releases nothing.
        assert_eq!(plan(&Instruction::ReleaseAll, &lines).unwrap(), vec![]);
    }

    #[test]
    fn shipping_releases_what_did_not_ship_and_refuses_released_units() {
        let (moves, lines) = step(&order(), &Instruction::Ship(units(&[("A", 2), ("B", 1)])));
        assert_eq!(
            moves,
            [mv("A", Deduct, 2), mv("B", Deduct, 1), mv("B", Release, 2)]
        );
        assert_eq!(summary(&lines, true), ReservationStatus::Deducted);
        // Shipping units released before is a contradiction.
        let cut = after(&order(), &[mv("B", Release, 3)]);
        assert_eq!(
            plan(&Instruction::Ship(units(&[("A", 2), ("B", 1)])), &cut),
            Err(Contradiction::ShippedMoreThanHeld {
                sku_id: "B".into(),
                shipped: 1,
                held: 0
            })
        );
        assert!(matches!(
            plan(&Instruction::Ship(units(&[("C", 1)])), &order()),
            Err(Contradiction::NotReserved { .. })
        ));
    }

    #[test]
    fn returns_restock_only_the_units_back_so_far() {
        let ship = Instruction::Ship(units(&[("A", 2), ("B", 3)]));
        let (_, shipped) = step(&order(), &ship);
        // One of two A back: one restocked, the reservation stays DEDUCTED.
        let (moves, lines) = step(&shipped, &Instruction::Returned(units(&[("A", 1)])));
        assert_eq!(moves, [mv("A", Restock, 1)]);
        assert_eq!(summary(&lines, true), ReservationStatus::Deducted);
        // The older view (nothing back) changes nothing; the next receipt adds the rest.
        assert_eq!(
            plan(&Instruction::Returned(units(&[])), &lines).unwrap(),
            vec![]
        );
        let all = Instruction::Returned(units(&[("A", 2), ("B", 3)]));
        let (moves, lines) = step(&lines, &all);
        assert_eq!(moves, [mv("A", Restock, 1), mv("B", Restock, 3)]);
        assert_eq!(summary(&lines, true), ReservationStatus::Restocked);
        // More back than shipped is refused.
        assert_eq!(
            plan(&Instruction::Returned(units(&[("A", 3)])), &shipped),
            Err(Contradiction::ReturnedMoreThanDeducted {
                sku_id: "A".into(),
                returned: 3,
                deducted: 2
            })
        );
        assert!(plan(&Instruction::Returned(units(&[("C", 1)])), &shipped).is_err());
    }

    #[test]
    fn cancelling_releases_everything_still_held() {
        let partly = after(&order(), &[mv("A", Release, 1)]);
        let (moves, lines) = step(&partly, &Instruction::ReleaseAll);
        assert_eq!(moves, [mv("A", Release, 1), mv("B", Release, 3)]);
        assert_eq!(summary(&lines, false), ReservationStatus::Released);
        // Every line refunded before shipping: released as well.
        let (_, lines) = step(&order(), &Instruction::KeepOnly(units(&[])));
        assert_eq!(summary(&lines, false), ReservationStatus::Released);
    }
}
