//! What the audit found: counts, then each violation with the ids needed to look it up; as text
//! for people and as JSON for tools.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// One thing that must never happen, with what identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Violation {
    /// A paid order whose stock was not rejected has no outbound.
    MissingOutbound {
        /// The order.
        order_id: String,
    },
    /// An order has more than one outbound.
    DuplicateOutbound {
        /// The order.
        order_id: String,
        /// Its outbounds.
        outbound_nos: Vec<String>,
    },
    /// An outbound exists for an order that was never paid, or whose stock was rejected.
    UnexpectedOutbound {
        /// The order (unknown to the order service, unpaid, or rejected).
        order_id: String,
        /// The outbound.
        outbound_no: String,
        /// Why it should not exist.
        reason: String,
    },
    /// A paid order has no reservation decision in the stock database.
    MissingReservation {
        /// The order.
        order_id: String,
    },
    /// A reservation exists for an order that was never paid.
    UnexpectedReservation {
        /// The order.
        order_id: String,
        /// The reservation's status.
        status: String,
    },
    /// A stock movement of one order line and kind happened more than once.
    DuplicateStockMovement {
        /// The order.
        order_id: String,
        /// The SKU.
        sku_id: String,
        /// `RESERVE`, `RELEASE`, `DEDUCT` or `RESTOCK`.
        movement: String,
        /// The `stock_movements.id` of each copy.
        movement_ids: Vec<i64>,
    },
    /// A SKU's `reserved` differs from what its movements add up to
    /// (`RESERVE - RELEASE - DEDUCT`).
    StockArithmetic {
        /// The SKU.
        sku_id: String,
        /// `stock.reserved`.
        reserved: i64,
        /// The sum of its movements.
        movements_sum: i64,
    },
    /// One line's units disagree between the services: what the warehouse shipped against what
    /// the stock consumer deducted, or the units back as the order service, the warehouse and
    /// the stock consumer (restocked) count them (returns by line).
    UnitsMismatch {
        /// The order.
        order_id: String,
        /// The line's SKU.
        sku_id: String,
        /// What disagrees, with the counts.
        detail: String,
    },
    /// An order's movements do not match its reservation status or its order lines.
    MovementMismatch {
        /// The order.
        order_id: String,
        /// What does not match.
        detail: String,
    },
    /// An order's `refund_reserved_cents` is not the sum of its open and succeeded refunds and
    /// of what a stock rejection gave back: some refund was applied twice, or lost.
    RefundArithmetic {
        /// The order.
        order_id: String,
        /// `orders.refund_reserved_cents`.
        refund_reserved_cents: i64,
        /// What the refunds and flagged payments add up to.
        expected_cents: i64,
    },
    /// An order, its outbound and its reservation disagree (e.g. refunded with a parcel that
    /// left, shipped with a cancelled outbound, returned with goods not restocked).
    StateMismatch {
        /// The order.
        order_id: String,
        /// Its status in the order service.
        order_status: String,
        /// Its outbound, if it has one.
        outbound_no: Option<String>,
        /// The outbound's status in the WMS.
        outbound_status: Option<String>,
        /// Its reservation's status in the stock service.
        reservation_status: Option<String>,
        /// What disagrees.
        detail: String,
    },
    /// A live order's outbound is intercepted or recalled with no refund or closed trade
    /// that holds it.
    HoldWithoutCause {
        /// The order.
        order_id: String,
        /// The outbound.
        outbound_no: String,
        /// `INTERCEPTED` or `RECALL`.
        outbound_status: String,
    },
    /// The marketplace closed the trade, yet its paid order is being fulfilled.
    ClosedTradeFulfilled {
        /// The order.
        order_id: String,
        /// The outbound.
        outbound_no: String,
        /// Its status.
        outbound_status: String,
    },
    /// The goods came back without a return-and-refund refund open or paid out: the buyer has
    /// neither goods nor money.
    ReturnWithoutRefund {
        /// The order.
        order_id: String,
        /// Its status.
        order_status: String,
    },
    /// An order cancelled or refunded after payment: what was paid minus what was refunded is
    /// not what is still owed to the buyer (open refunds plus the flagged payment's due).
    MoneyUnaccounted {
        /// The order.
        order_id: String,
        /// What was paid.
        paid_cents: i64,
        /// Refunds paid out.
        refunded_cents: i64,
        /// Open refunds plus what the flagged payment owes.
        owed_cents: i64,
    },
    /// The platform's newest snapshot of a refund is final, ours is still open.
    ChannelRefundUnfinished {
        /// The order.
        order_id: String,
        /// Our refund.
        refund_no: String,
        /// The platform's final status.
        platform_status: String,
    },
    /// A channel refund's amount differs from the platform's newest snapshot.
    RefundAmountMismatch {
        /// The order.
        order_id: String,
        /// Our refund.
        refund_no: String,
        /// Its status (`REQUESTED` or `SUCCEEDED`).
        status: String,
        /// Our amount.
        amount_cents: i64,
        /// The platform's.
        platform_cents: i64,
    },
    /// An event behind a consumer's committed offset is neither in its inbox nor in its dead
    /// letters: the consumer moved past it without applying it.
    EventNotApplied {
        /// The inbox's `consumer_name`.
        consumer: String,
        /// Its consumer group.
        group: String,
        /// Where the message is.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset (below the group's committed offset).
        offset: i64,
        /// The group's committed offset of that partition.
        committed: i64,
        /// The event.
        event_id: String,
    },
    /// An event the ledger says was committed and is no longer in the outbox (published) is on
    /// no topic.
    EventNotPublished {
        /// Which database's outbox.
        database: String,
        /// The outbox row id.
        outbox_id: i64,
        /// The event.
        event_id: String,
        /// Where it should be.
        topic: String,
    },
    /// The first occurrence of an aggregate's event came on the broker after the first
    /// occurrence of a later event (by outbox `id`) of the same aggregate.
    OrderViolation {
        /// The topic.
        topic: String,
        /// The key (aggregate id).
        aggregate_id: String,
        /// The event that came too late.
        event_id: String,
        /// Its outbox id.
        outbox_id: i64,
        /// The largest outbox id seen before it for this aggregate.
        after_outbox_id: i64,
        /// Where the late event is.
        partition: i32,
        /// Its offset.
        offset: i64,
    },
    /// An outbox row has waited longer than the threshold.
    StaleUnpublished {
        /// Which database's outbox.
        database: String,
        /// The outbox row id.
        outbox_id: i64,
        /// The event.
        event_id: String,
        /// Its age in seconds.
        age_s: i64,
    },
}

impl Violation {
    /// The kind's name, as in the JSON's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MissingOutbound { .. } => "missing_outbound",
            Self::DuplicateOutbound { .. } => "duplicate_outbound",
            Self::UnexpectedOutbound { .. } => "unexpected_outbound",
            Self::MissingReservation { .. } => "missing_reservation",
            Self::UnexpectedReservation { .. } => "unexpected_reservation",
            Self::DuplicateStockMovement { .. } => "duplicate_stock_movement",
            Self::StockArithmetic { .. } => "stock_arithmetic",
            Self::MovementMismatch { .. } => "movement_mismatch",
            Self::UnitsMismatch { .. } => "units_mismatch",
            Self::RefundArithmetic { .. } => "refund_arithmetic",
            Self::StateMismatch { .. } => "state_mismatch",
            Self::HoldWithoutCause { .. } => "hold_without_cause",
            Self::ClosedTradeFulfilled { .. } => "closed_trade_fulfilled",
            Self::ReturnWithoutRefund { .. } => "return_without_refund",
            Self::MoneyUnaccounted { .. } => "money_unaccounted",
            Self::ChannelRefundUnfinished { .. } => "channel_refund_unfinished",
            Self::RefundAmountMismatch { .. } => "refund_amount_mismatch",
            Self::EventNotApplied { .. } => "event_not_applied",
            Self::EventNotPublished { .. } => "event_not_published",
            Self::OrderViolation { .. } => "order_violation",
            Self::StaleUnpublished { .. } => "stale_unpublished",
        }
    }

    /// One line for the text report.
    pub fn describe(&self) -> String {
        match self {
            Self::MissingOutbound { order_id } => {
                format!("paid order {order_id} has no outbound")
            }
            Self::DuplicateOutbound {
                order_id,
                outbound_nos,
            } => format!("order {order_id} has {} outbounds: {}", outbound_nos.len(), outbound_nos.join(", ")),
            Self::UnexpectedOutbound {
                order_id,
                outbound_no,
                reason,
            } => format!("outbound {outbound_no} of order {order_id}: {reason}"),
            Self::MissingReservation { order_id } => {
                format!("paid order {order_id} has no reservation")
            }
            Self::UnexpectedReservation { order_id, status } => {
                format!("reservation ({status}) of order {order_id}, which was never paid")
            }
            Self::DuplicateStockMovement {
                order_id,
                sku_id,
                movement,
                movement_ids,
            } => format!(
                "stock movement {movement} of order {order_id} sku {sku_id} happened {} times (stock_movements.id {:?})",
                movement_ids.len(),
                movement_ids
            ),
            Self::StockArithmetic {
                sku_id,
                reserved,
                movements_sum,
            } => format!("sku {sku_id}: reserved {reserved}, its movements add up to {movements_sum}"),
            Self::MovementMismatch { order_id, detail } => {
                format!("order {order_id}: {detail}")
            }
            Self::UnitsMismatch {
                order_id,
                sku_id,
                detail,
            } => format!("order {order_id} sku {sku_id}: {detail}"),
            Self::RefundArithmetic {
                order_id,
                refund_reserved_cents,
                expected_cents,
            } => format!(
                "order {order_id}: refund_reserved_cents {refund_reserved_cents}, its refunds add up to {expected_cents}"
            ),
            Self::StateMismatch {
                order_id,
                order_status,
                outbound_no,
                outbound_status,
                reservation_status,
                detail,
            } => format!(
                "order {order_id} ({order_status}), outbound {} ({}), reservation {}: {detail}",
                outbound_no.as_deref().unwrap_or("none"),
                outbound_status.as_deref().unwrap_or("-"),
                reservation_status.as_deref().unwrap_or("none")
            ),
            Self::HoldWithoutCause {
                order_id,
                outbound_no,
                outbound_status,
            } => format!(
                "outbound {outbound_no} of order {order_id} is {outbound_status} with no refund or closed trade holding it"
            ),
            Self::ClosedTradeFulfilled {
                order_id,
                outbound_no,
                outbound_status,
            } => format!(
                "order {order_id}: the marketplace closed its trade, yet outbound {outbound_no} is {outbound_status}"
            ),
            Self::ReturnWithoutRefund {
                order_id,
                order_status,
            } => format!(
                "order {order_id} ({order_status}): its goods came back, but no return-and-refund refund is open or paid out"
            ),
            Self::MoneyUnaccounted {
                order_id,
                paid_cents,
                refunded_cents,
                owed_cents,
            } => format!(
                "order {order_id}: paid {paid_cents}, refunded {refunded_cents}, but {owed_cents} is owed to the buyer"
            ),
            Self::ChannelRefundUnfinished {
                order_id,
                refund_no,
                platform_status,
            } => format!(
                "refund {refund_no} of order {order_id}: the platform says {platform_status}, ours is still requested"
            ),
            Self::RefundAmountMismatch {
                order_id,
                refund_no,
                status,
                amount_cents,
                platform_cents,
            } => format!(
                "refund {refund_no} of order {order_id} ({status}): {amount_cents} booked, the platform says {platform_cents}"
            ),
            Self::EventNotApplied {
                consumer,
                group,
                topic,
                partition,
                offset,
                committed,
                event_id,
            } => format!(
                "event {event_id} ({topic}[{partition}]@{offset}) is behind {consumer}'s committed offset {committed} (group {group}) but not in its inbox nor its dead letters"
            ),
            Self::EventNotPublished {
                database,
                outbox_id,
                event_id,
                topic,
            } => format!(
                "event {event_id} (outbox id {outbox_id} of {database}) left the outbox but is not on {topic}"
            ),
            Self::OrderViolation {
                topic,
                aggregate_id,
                event_id,
                outbox_id,
                after_outbox_id,
                partition,
                offset,
            } => format!(
                "aggregate {aggregate_id} on {topic}: event {event_id} (outbox id {outbox_id}, [{partition}]@{offset}) first appears after outbox id {after_outbox_id}"
            ),
            Self::StaleUnpublished {
                database,
                outbox_id,
                event_id,
                age_s,
            } => format!(
                "event {event_id} (outbox id {outbox_id} of {database}) unpublished for {age_s} s"
            ),
        }
    }
}

/// The audit's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Named counts (orders, messages, inbox rows, duplicates absorbed, ...), in name order.
    pub counts: BTreeMap<String, i64>,
    /// Checks that could not run, and why (e.g. a database without a ledger).
    pub skipped: Vec<String>,
    /// Every violation found.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Sets a count.
    pub fn count(&mut self, name: impl Into<String>, value: i64) {
        self.counts.insert(name.into(), value);
    }

    /// True when nothing was found.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Violations per kind.
    pub fn violations_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.kind()).or_default() += 1;
        }
        m
    }

    /// The text report: counts, skipped checks, then each violation.
    pub fn to_text(&self) -> String {
        let mut out = String::from("outbox-audit\n\ncounts:\n");
        let width = self.counts.keys().map(String::len).max().unwrap_or(0);
        for (k, v) in &self.counts {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        for s in &self.skipped {
            let _ = writeln!(out, "skipped: {s}");
        }
        if self.violations.is_empty() {
            out.push_str("\nviolations: 0\n");
            return out;
        }
        let _ = writeln!(out, "\nviolations: {}", self.violations.len());
        for (kind, n) in self.violations_by_kind() {
            let _ = writeln!(out, "  {kind}: {n}");
        }
        out.push('\n');
        for v in &self.violations {
            let _ = writeln!(out, "{}: {}", v.kind(), v.describe());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_the_kind_and_the_ids() {
        let v = Violation::MissingOutbound {
            order_id: "o-1".into(),
        };
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["kind"], "missing_outbound");
        assert_eq!(j["order_id"], "o-1");
        assert_eq!(v.kind(), "missing_outbound");
        let mut r = Report::default();
        r.count("orders", 3);
        assert!(r.is_clean());
        assert!(r.to_text().contains("violations: 0"));
        r.violations.push(v);
        assert!(r.to_text().contains("paid order o-1 has no outbound"));
        assert_eq!(r.violations_by_kind()["missing_outbound"], 1);
    }
}
