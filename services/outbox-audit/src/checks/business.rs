//! The cross-database business checks: one outbound and one reservation per paid order, each
//! stock movement once, the movements of a line adding up to its reservation's status, and
//! the units shipped and back agreeing across the order service, the WMS and stock.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::report::Violation;
use crate::store::{LineRow, MovementRow, OrderRow};

/// What the business checks read.
#[derive(Debug, Default)]
pub struct Business<'a> {
    /// Every order.
    pub orders: &'a [OrderRow],
    /// Every order line.
    pub lines: &'a [LineRow],
    /// Every line of a shipped outbound.
    pub shipped_lines: &'a [LineRow],
    /// Every outbound `(order_id, outbound_no)`.
    pub outbounds: &'a [(String, String)],
    /// Every reservation `(order_id, status)`.
    pub reservations: &'a [(String, String)],
    /// Every stock movement.
    pub movements: &'a [MovementRow],
}

/// What one order line's stock movements must add up to, given its reservation's status:
/// `reserve` is the units reserved (the line's), the rest are sums over the line's movements.
/// A line is reserved and deducted once; released and restocked possibly in several steps (units
/// refunded by line before shipping are released when they leave the outbound, the rest at
/// shipping; a return by line restocks what came back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LineMoves {
    reserve: i64,
    release: i64,
    deduct: i64,
    restock: i64,
}

impl LineMoves {
    /// Why these sums do not fit a line of `quantity` units under a reservation in `status`.
    fn problem(&self, status: &str, quantity: i64) -> Option<String> {
        let Self {
            reserve: r,
            release: l,
            deduct: d,
            restock: s,
        } = *self;
        let fits = match status {
            "REJECTED" => r == 0 && l == 0 && d == 0 && s == 0,
            "RESERVED" => r == quantity && l <= quantity && d == 0 && s == 0,
            "RELEASED" => r == quantity && l == quantity && d == 0 && s == 0,
            "DEDUCTED" => r == quantity && l + d == quantity && s <= d,
            "RESTOCKED" => r == quantity && l + d == quantity && s == d,
            _ => return None,
        };
        (!fits).then(|| {
            format!(
                "reserved {r}, released {l}, deducted {d}, restocked {s} of a line of {quantity} (reservation {status})"
            )
        })
    }
}

/// One outbound and one reservation per paid order (none for unpaid or rejected ones); each
/// line reserved and deducted at most once; movements adding up to the reservation's status
/// and the order's lines; shipped and returned units agreeing across the services. Orders changed recently (`OrderRow::recent`) are left out of all but
/// the duplicate checks.
pub fn business(b: &Business<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    let orders: HashMap<&str, &OrderRow> =
        b.orders.iter().map(|o| (o.order_id.as_str(), o)).collect();
    let mut outbounds: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (o, no) in b.outbounds {
        outbounds.entry(o).or_default().push(no);
    }
    let reservations: HashMap<&str, &str> = b
        .reservations
        .iter()
        .map(|(o, s)| (o.as_str(), s.as_str()))
        .collect();
    let settled = |id: &str| orders.get(id).is_none_or(|o| !o.recent);

    let mut paid: Vec<&OrderRow> = b.orders.iter().filter(|o| o.fulfils && !o.recent).collect();
    paid.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    for o in &paid {
        let id = o.order_id.as_str();
        let reservation = reservations.get(id).copied();
        if reservation.is_none() {
            out.push(Violation::MissingReservation {
                order_id: id.to_owned(),
            });
        }
        let wants_outbound = reservation.is_some_and(|r| r != "REJECTED");
        if wants_outbound && !outbounds.contains_key(id) {
            out.push(Violation::MissingOutbound {
                order_id: id.to_owned(),
            });
        }
    }
    for (order_id, nos) in &outbounds {
        if nos.len() > 1 {
            out.push(Violation::DuplicateOutbound {
                order_id: (*order_id).to_owned(),
                outbound_nos: nos.iter().map(|s| (*s).to_owned()).collect(),
            });
        }
        if !settled(order_id) {
            continue;
        }
        let reason = match (orders.get(order_id), reservations.get(order_id)) {
            (None, _) => Some("the order service does not know the order"),
            (Some(o), _) if !o.fulfils => Some("the order was never paid (or was closed first)"),
            (_, Some(&"REJECTED")) => Some("its stock was rejected"),
            (_, None) => Some("the order has no reservation"),
            _ => None,
        };
        if let Some(reason) = reason {
            for no in nos {
                out.push(Violation::UnexpectedOutbound {
                    order_id: (*order_id).to_owned(),
                    outbound_no: (*no).to_owned(),
                    reason: reason.to_owned(),
                });
            }
        }
    }
    let mut unexpected: Vec<(&str, &str)> = reservations
        .iter()
        .filter(|(id, _)| settled(id) && orders.get(*id).is_none_or(|o| !o.fulfils))
        .map(|(id, s)| (*id, *s))
        .collect();
    unexpected.sort();
    for (id, status) in unexpected {
        out.push(Violation::UnexpectedReservation {
            order_id: id.to_owned(),
            status: status.to_owned(),
        });
    }
    out.extend(movement_checks(b, &reservations, &settled));
    out
}

fn movement_checks(
    b: &Business<'_>,
    reservations: &HashMap<&str, &str>,
    settled: &dyn Fn(&str) -> bool,
) -> Vec<Violation> {
    let mut out = Vec::new();
    // A line is reserved once and deducted once (shipping): a second copy is a duplicate.
    let mut once: BTreeMap<(&str, &str, &str), Vec<i64>> = BTreeMap::new();
    let mut sums: BTreeMap<(&str, &str), LineMoves> = BTreeMap::new();
    for m in b.movements {
        let line = sums.entry((&m.order_id, &m.sku_id)).or_default();
        match m.kind.as_str() {
            "RESERVE" => line.reserve += m.quantity,
            "RELEASE" => line.release += m.quantity,
            "DEDUCT" => line.deduct += m.quantity,
            "RESTOCK" => line.restock += m.quantity,
            _ => {}
        }
        if matches!(m.kind.as_str(), "RESERVE" | "DEDUCT") {
            once.entry((&m.order_id, &m.sku_id, &m.kind))
                .or_default()
                .push(m.id);
        }
    }
    for ((order_id, sku_id, kind), ids) in &once {
        if ids.len() > 1 {
            out.push(Violation::DuplicateStockMovement {
                order_id: (*order_id).to_owned(),
                sku_id: (*sku_id).to_owned(),
                movement: (*kind).to_owned(),
                movement_ids: ids.clone(),
            });
        }
    }
    let mut lines: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
    for l in b.lines {
        lines
            .entry(&l.order_id)
            .or_default()
            .push((&l.sku_id, l.quantity));
    }
    let mut ids: Vec<&&str> = reservations.keys().collect();
    ids.sort();
    for id in ids {
        let status = reservations[*id];
        if !settled(id) {
            continue;
        }
        let mut problems = Vec::new();
        let order_lines = lines.get(*id).cloned().unwrap_or_default();
        for (sku, q) in &order_lines {
            let moves = sums.get(&(*id, *sku)).copied().unwrap_or_default();
            if let Some(p) = moves.problem(status, *q) {
                problems.push(format!("{sku}: {p}"));
            }
        }
        let known: HashSet<&str> = order_lines.iter().map(|(s, _)| *s).collect();
        for ((o, sku), _) in sums.range((*id, "")..) {
            if o != id {
                break;
            }
            if !known.contains(sku) {
                problems.push(format!(
                    "{sku}: movements for a SKU the order does not have"
                ));
            }
        }
        if !problems.is_empty() {
            out.push(Violation::MovementMismatch {
                order_id: (*id).to_owned(),
                detail: problems.join("; "),
            });
        }
    }
    out.extend(units_checks(b, &sums, settled));
    out
}

/// Per line of a settled order whose outbound shipped: the units the warehouse shipped are the
/// units the stock consumer deducted, and the units back are the same in the order service,
/// the warehouse and the stock consumer (restocked). Lines the outbound no longer has (taken
/// out by a refund before shipping) count as shipped 0.
fn units_checks(
    b: &Business<'_>,
    sums: &BTreeMap<(&str, &str), LineMoves>,
    settled: &dyn Fn(&str) -> bool,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let shipped: HashMap<(&str, &str), &LineRow> = b
        .shipped_lines
        .iter()
        .map(|l| ((l.order_id.as_str(), l.sku_id.as_str()), l))
        .collect();
    let shipped_orders: HashSet<&str> = b
        .shipped_lines
        .iter()
        .map(|l| l.order_id.as_str())
        .collect();
    let mut lines: Vec<&LineRow> = b
        .lines
        .iter()
        .filter(|l| shipped_orders.contains(l.order_id.as_str()) && settled(&l.order_id))
        .collect();
    lines.sort_by(|a, b| (&a.order_id, &a.sku_id).cmp(&(&b.order_id, &b.sku_id)));
    for l in lines {
        let key = (l.order_id.as_str(), l.sku_id.as_str());
        let (out_units, back_wms) = shipped
            .get(&key)
            .map_or((0, 0), |s| (s.quantity, s.returned));
        let moves = sums.get(&key).copied().unwrap_or_default();
        let mut problems = Vec::new();
        if out_units != moves.deduct {
            problems.push(format!(
                "the warehouse shipped {out_units}, the stock consumer deducted {}",
                moves.deduct
            ));
        }
        if !(l.returned == back_wms && back_wms == moves.restock) {
            problems.push(format!(
                "units back: {} for the order service, {back_wms} for the warehouse, {} restocked",
                l.returned, moves.restock
            ));
        }
        if !problems.is_empty() {
            out.push(Violation::UnitsMismatch {
                order_id: l.order_id.clone(),
                sku_id: l.sku_id.clone(),
                detail: problems.join("; "),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: &str, paid: i64) -> OrderRow {
        OrderRow {
            order_id: id.into(),
            status: "PAID".into(),
            paid_cents: paid,
            fulfils: paid > 0,
            recent: false,
        }
    }

    fn line(o: &str, quantity: i64, returned: i64) -> LineRow {
        LineRow {
            order_id: o.into(),
            sku_id: "s".into(),
            quantity,
            returned,
        }
    }

    fn mv(id: i64, o: &str, kind: &str, q: i64) -> MovementRow {
        MovementRow {
            id,
            order_id: o.into(),
            sku_id: "s".into(),
            kind: kind.into(),
            quantity: q,
        }
    }

    #[test]
    fn paid_orders_need_one_outbound_and_one_reservation_and_movements_once() {
        let orders = [
            order("a", 10),
            order("b", 10),
            order("c", 0),
            order("d", 10),
        ];
        let lines = [line("a", 2, 0), line("b", 1, 0), line("d", 1, 0)];
        let outbounds = [
            ("b".to_owned(), "OB1".to_owned()),
            ("c".to_owned(), "OB2".to_owned()),
        ];
        let reservations = [
            ("a".to_owned(), "RESERVED".to_owned()),
            ("b".to_owned(), "DEDUCTED".to_owned()),
        ];
        let movements = [
            mv(1, "a", "RESERVE", 2),
            mv(2, "a", "RESERVE", 2),
            mv(3, "b", "RESERVE", 1),
        ];
        let v = business(&Business {
            orders: &orders,
            lines: &lines,
            shipped_lines: &[],
            outbounds: &outbounds,
            reservations: &reservations,
            movements: &movements,
        });
        let kinds: Vec<&str> = v.iter().map(Violation::kind).collect();
        assert_eq!(
            kinds,
            [
                "missing_outbound",    // a: reserved, no outbound
                "missing_reservation", // d
                "unexpected_outbound", // c: never paid
                "duplicate_stock_movement",
                "movement_mismatch", // a: reserved twice (4 units of a line of 2)
                "movement_mismatch", // b: deducted without DEDUCT
            ],
            "{v:?}"
        );
        assert!(
            matches!(&v[3], Violation::DuplicateStockMovement { movement_ids, .. } if movement_ids == &[1, 2])
        );
    }

    #[test]
    fn lines_moved_in_steps_fit_and_units_that_disagree_are_named() {
        let orders = [order("a", 10), order("b", 10), order("c", 10)];
        // a: 3 units, one refunded by line before shipping (released), two shipped, one
        // returned and restocked; the three services agree.
        // b: the same, but restocked twice (a return applied again).
        // c: 2 shipped, the warehouse has 1 back, the order service 0.
        let lines = [line("a", 3, 1), line("b", 3, 1), line("c", 2, 0)];
        let shipped = [line("a", 2, 1), line("b", 2, 1), line("c", 2, 1)];
        let outbounds = [
            ("a".to_owned(), "OB1".to_owned()),
            ("b".to_owned(), "OB2".to_owned()),
            ("c".to_owned(), "OB3".to_owned()),
        ];
        let reservations = [
            ("a".to_owned(), "DEDUCTED".to_owned()),
            ("b".to_owned(), "DEDUCTED".to_owned()),
            ("c".to_owned(), "DEDUCTED".to_owned()),
        ];
        let movements = [
            mv(1, "a", "RESERVE", 3),
            mv(2, "a", "RELEASE", 1),
            mv(3, "a", "DEDUCT", 2),
            mv(4, "a", "RESTOCK", 1),
            mv(5, "b", "RESERVE", 3),
            mv(6, "b", "RELEASE", 1),
            mv(7, "b", "DEDUCT", 2),
            mv(8, "b", "RESTOCK", 1),
            mv(9, "b", "RESTOCK", 1),
            mv(10, "c", "RESERVE", 2),
            mv(11, "c", "DEDUCT", 2),
            mv(12, "c", "RESTOCK", 1),
        ];
        let v = business(&Business {
            orders: &orders,
            lines: &lines,
            shipped_lines: &shipped,
            outbounds: &outbounds,
            reservations: &reservations,
            movements: &movements,
        });
        let named: Vec<(&str, String)> = v
            .iter()
            .map(|v| {
                let id = match v {
                    Violation::MovementMismatch { order_id, .. }
                    | Violation::UnitsMismatch { order_id, .. } => order_id.clone(),
                    _ => String::new(),
                };
                (v.kind(), id)
            })
            .collect();
        assert_eq!(
            named,
            [
                // b: 2 restocked, 1 back (the movements alone fit: 2 deducted).
                ("units_mismatch", "b".to_owned()),
                // c: the order service missed the return the warehouse and stock saw.
                ("units_mismatch", "c".to_owned()),
            ],
            "{v:?}"
        );
    }
}
