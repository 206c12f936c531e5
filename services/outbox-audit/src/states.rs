//! The services' states compared with each other: each order's status against its outbound's
//! status and its reservation's status, its money (paid, refunded, still owed to the buyer),
//! and the marketplace's word (a closed trade, a final refund snapshot) against what the order
//! service did with it. Every disagreement is named with its ids.
//!
//! The rules, per order status (settled orders only; a missing outbound or reservation is the
//! business checks' concern):
//!
//! | order | outbound | reservation |
//! |---|---|---|
//! | `PAID` | `CREATED`, `INTERCEPTED` (with a cause: an open refund that holds, a closed trade) | `RESERVED` |
//! | `SHIPPED`, `DELIVERED`, `COMPLETED` | `SHIPPED`, `RECALL` (with a cause: a return-and-refund open or paid out, or refunds of everything paid), `RETURNED` once the goods are back | `DEDUCTED`, `RESTOCKED` once back |
//! | `RETURNED` | `RETURNED` | `RESTOCKED` |
//! | `CANCELLED`, `REFUNDED` | `CANCELLED` | `RELEASED`, `REJECTED` |
//!
//! Money: an order cancelled or refunded after payment owes the buyer what was paid minus what
//! was refunded, and that must be exactly its open refunds plus the due of its flagged payment.
//! Goods back (`RETURNED`, or received before the refund was decided) need a return-and-refund
//! refund open or paid out, or refunds of everything paid.

use std::collections::HashMap;

use crate::report::Violation;

/// One order as these checks need it (`store::order_states`).
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct OrderState {
    /// The order.
    pub order_id: String,
    /// Its status.
    pub status: String,
    /// What was paid.
    pub paid_cents: i64,
    /// Refunds paid out.
    pub refunded_cents: i64,
    /// Refunds requested, not decided.
    pub open_refund_cents: i64,
    /// What its payment flagged for a cancellation after payment still owes the buyer.
    pub owed_cents: i64,
    /// A return-and-refund refund is open.
    pub open_return: bool,
    /// A return-and-refund refund was paid out.
    pub paid_return: bool,
    /// An open refund-only refund leaves nothing paid (it holds like a return).
    pub holding_refund_only: bool,
    /// The warehouse has the goods back (`RETURNED`, or received before the refund's decision).
    pub goods_back: bool,
    /// The marketplace trade's newest status, for a channel order.
    pub trade_status: Option<String>,
    /// Changed within the settle window: left out.
    pub recent: bool,
}

impl OrderState {
    /// Refunds paid out everything paid (of either kind): the goods are owed back too.
    pub fn refunded_in_full(&self) -> bool {
        self.paid_cents > 0 && self.refunded_cents >= self.paid_cents
    }
}

/// Compares each settled order with its outbound `(order_id, outbound_no, status)` and its
/// reservation `(order_id, status)`.
pub fn check(
    orders: &[OrderState],
    outbounds: &[(String, String, String)],
    reservations: &[(String, String)],
) -> Vec<Violation> {
    let outbound: HashMap<&str, (&str, &str)> = outbounds
        .iter()
        .map(|(o, no, s)| (o.as_str(), (no.as_str(), s.as_str())))
        .collect();
    let reservation: HashMap<&str, &str> = reservations
        .iter()
        .map(|(o, s)| (o.as_str(), s.as_str()))
        .collect();
    let mut out = Vec::new();
    let mut sorted: Vec<&OrderState> = orders.iter().filter(|o| !o.recent).collect();
    sorted.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    for o in sorted {
        let id = o.order_id.as_str();
        let ob = outbound.get(id).copied();
        let res = reservation.get(id).copied();
        if let Some(detail) = status_disagreement(o, ob.map(|(_, s)| s), res) {
            out.push(Violation::StateMismatch {
                order_id: id.to_owned(),
                order_status: o.status.clone(),
                outbound_no: ob.map(|(no, _)| no.to_owned()),
                outbound_status: ob.map(|(_, s)| s.to_owned()),
                reservation_status: res.map(str::to_owned),
                detail: detail.to_owned(),
            });
        }
        let closed = o.trade_status.as_deref() == Some("TRADE_CLOSED");
        if let Some((no, s)) = ob {
            let cause = match s {
                "INTERCEPTED" => o.open_return || o.holding_refund_only || closed,
                // A parcel that left while a full refund went through (of either kind) is
                // recalled: the money went back, the goods must too.
                "RECALL" => {
                    o.open_return || o.paid_return || o.holding_refund_only || o.refunded_in_full()
                }
                _ => true,
            };
            let live = matches!(
                o.status.as_str(),
                "PAID" | "SHIPPED" | "DELIVERED" | "COMPLETED"
            );
            if live && !cause {
                out.push(Violation::HoldWithoutCause {
                    order_id: id.to_owned(),
                    outbound_no: no.to_owned(),
                    outbound_status: s.to_owned(),
                });
            }
            if closed && matches!(s, "CREATED" | "SHIPPED") && o.status == "PAID" {
                out.push(Violation::ClosedTradeFulfilled {
                    order_id: id.to_owned(),
                    outbound_no: no.to_owned(),
                    outbound_status: s.to_owned(),
                });
            }
        }
        if o.goods_back && !o.open_return && !o.paid_return && !o.refunded_in_full() {
            out.push(Violation::ReturnWithoutRefund {
                order_id: id.to_owned(),
                order_status: o.status.clone(),
            });
        }
        let settled_money = matches!(o.status.as_str(), "CANCELLED" | "REFUNDED");
        if settled_money
            && o.paid_cents > 0
            && o.paid_cents - o.refunded_cents != o.open_refund_cents + o.owed_cents
        {
            out.push(Violation::MoneyUnaccounted {
                order_id: id.to_owned(),
                paid_cents: o.paid_cents,
                refunded_cents: o.refunded_cents,
                owed_cents: o.open_refund_cents + o.owed_cents,
            });
        }
    }
    out
}

/// Why the order, its outbound and its reservation disagree, if they do.
fn status_disagreement(
    o: &OrderState,
    outbound: Option<&str>,
    reservation: Option<&str>,
) -> Option<&'static str> {
    let (outbounds, reservations): (&[&str], &[&str]) = match o.status.as_str() {
        "PAID" => (&["CREATED", "INTERCEPTED"], &["RESERVED"]),
        "SHIPPED" | "DELIVERED" | "COMPLETED" if o.goods_back => (&["RETURNED"], &["RESTOCKED"]),
        "SHIPPED" | "DELIVERED" | "COMPLETED" => (&["SHIPPED", "RECALL"], &["DEDUCTED"]),
        "RETURNED" => (&["RETURNED"], &["RESTOCKED"]),
        "CANCELLED" | "REFUNDED" => (&["CANCELLED"], &["RELEASED", "REJECTED"]),
        _ => return None,
    };
    if outbound.is_some_and(|s| !outbounds.contains(&s)) {
        return Some(match o.status.as_str() {
            "PAID" => "the warehouse shipped or cancelled an order still paid and unshipped",
            "CANCELLED" | "REFUNDED" => {
                "the order will never ship, but its outbound is not cancelled"
            }
            "RETURNED" => "the order is returned, but its goods are not back in the warehouse",
            _ if o.goods_back => "the goods are back, but the outbound does not say so",
            _ => "the order shipped, but its outbound did not",
        });
    }
    if reservation.is_some_and(|s| !reservations.contains(&s)) {
        return Some("the stock reservation does not match the order");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: &str, status: &str) -> OrderState {
        OrderState {
            order_id: id.into(),
            status: status.into(),
            paid_cents: 1_000,
            ..OrderState::default()
        }
    }

    fn kinds(v: &[Violation]) -> Vec<(&'static str, String)> {
        v.iter()
            .map(|v| {
                let id = match v {
                    Violation::StateMismatch { order_id, .. }
                    | Violation::HoldWithoutCause { order_id, .. }
                    | Violation::ClosedTradeFulfilled { order_id, .. }
                    | Violation::ReturnWithoutRefund { order_id, .. }
                    | Violation::MoneyUnaccounted { order_id, .. } => order_id.clone(),
                    _ => String::new(),
                };
                (v.kind(), id)
            })
            .collect()
    }

    #[test]
    fn the_sequences_of_issue_19_before_their_fixes_are_each_named() {
        let ob = |o: &str, s: &str| (o.to_owned(), format!("OB-{o}"), s.to_owned());
        let res = |o: &str, s: &str| (o.to_owned(), s.to_owned());
        // A refunded order whose parcel left (a refund racing a shipment).
        let raced = order("a", "REFUNDED");
        let raced = OrderState {
            refunded_cents: 1_000,
            ..raced
        };
        // A paid trade first seen closed, fulfilled.
        let closed = OrderState {
            trade_status: Some("TRADE_CLOSED".into()),
            ..order("b", "PAID")
        };
        // A refund-only price adjustment that intercepted.
        let adjusted = OrderState {
            open_refund_cents: 100,
            ..order("c", "PAID")
        };
        // Returned while the refund was open, then the refund closed.
        let returned = OrderState {
            goods_back: true,
            ..order("d", "RETURNED")
        };
        // Stock-rejected with a refund open, then the refund closed: owed to nobody.
        let lost = order("e", "CANCELLED");
        // A clean stock rejection: everything owed through the flag.
        let owed = OrderState {
            owed_cents: 1_000,
            ..order("f", "CANCELLED")
        };
        let v = check(
            &[raced, closed, adjusted, returned, lost, owed],
            &[
                ob("a", "RECALL"),
                ob("b", "CREATED"),
                ob("c", "INTERCEPTED"),
                ob("d", "RETURNED"),
            ],
            &[
                res("a", "DEDUCTED"),
                res("b", "RESERVED"),
                res("c", "RESERVED"),
                res("d", "RESTOCKED"),
                res("e", "REJECTED"),
                res("f", "REJECTED"),
            ],
        );
        assert_eq!(
            kinds(&v),
            [
                ("state_mismatch", "a".to_owned()),
                ("closed_trade_fulfilled", "b".to_owned()),
                ("hold_without_cause", "c".to_owned()),
                ("return_without_refund", "d".to_owned()),
                ("money_unaccounted", "e".to_owned()),
            ]
        );
    }

    #[test]
    fn agreeing_states_and_recent_orders_are_not_reported() {
        let ob = |o: &str, s: &str| (o.to_owned(), format!("OB-{o}"), s.to_owned());
        let res = |o: &str, s: &str| (o.to_owned(), s.to_owned());
        let orders = [
            order("a", "PAID"),
            OrderState {
                open_return: true,
                ..order("b", "PAID")
            },
            OrderState {
                paid_return: true,
                ..order("c", "SHIPPED")
            },
            OrderState {
                goods_back: true,
                paid_return: true,
                ..order("d", "RETURNED")
            },
            OrderState {
                refunded_cents: 1_000,
                ..order("e", "REFUNDED")
            },
            OrderState {
                recent: true,
                ..order("f", "REFUNDED")
            },
            OrderState {
                trade_status: Some("TRADE_CLOSED".into()),
                ..order("g", "PAID")
            },
            // A full refund-only that raced the shipment: recalled, money all back.
            OrderState {
                refunded_cents: 1_000,
                ..order("h", "SHIPPED")
            },
        ];
        let v = check(
            &orders,
            &[
                ob("a", "CREATED"),
                ob("b", "INTERCEPTED"),
                ob("c", "RECALL"),
                ob("d", "RETURNED"),
                ob("e", "CANCELLED"),
                ob("f", "SHIPPED"),
                ob("g", "INTERCEPTED"),
                ob("h", "RECALL"),
            ],
            &[
                res("a", "RESERVED"),
                res("b", "RESERVED"),
                res("c", "DEDUCTED"),
                res("d", "RESTOCKED"),
                res("e", "RELEASED"),
                res("g", "RESERVED"),
                res("h", "DEDUCTED"),
            ],
        );
        assert!(v.is_empty(), "{v:?}");
    }
}
