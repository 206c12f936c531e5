//! The order lifecycle as one table: `(state, event) -> (next state, emitted event)`.
//!
//! ```text
//! PENDING_PAYMENT ─Pay─> PAID ─Ship─> SHIPPED ─Deliver─> DELIVERED ─Complete─> COMPLETED
//!       │                 │  │            │                  │
//!    Cancel    StockRejected RefundedInFull  └──ReturnReceived──┴──> RETURNED
//!       v                 v  v
//!   CANCELLED <───────────┘ REFUNDED
//! ```
//! Every legal move is one row of [`TRANSITIONS`]; anything else is illegal (409 with the
//! current state at the HTTP edge, a dead letter for a consumed event). Every move emits exactly
//! the one event of its row, in the transaction that moves the order
//! ([`crate::store::orders::transition`] is the only writer of `orders.status`).
//!
//! A refund moves the order only when it takes all of it back before shipping
//! ([`LifecycleEvent::RefundedInFull`]), and "before shipping" is the warehouse's word: the
//! order moves when the WMS reports the outbound cancelled, not when the refund succeeds, so
//! a parcel that left while the refund was in flight ships the order instead (and comes back
//! as a return). A partial refund, or any refund after shipping, leaves the order where it is. After shipping, the goods coming back ([`LifecycleEvent::ReturnReceived`],
//! the WMS received the return) ends the order in `RETURNED`.

use crate::domain::{EventType, OrderStatus};

/// What can happen to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecycleEvent {
    /// The payment provider (or the marketplace) reported the payment.
    Pay,
    /// The buyer or the marketplace cancelled before payment.
    Cancel,
    /// The stock consumer could not reserve the goods of a paid order.
    StockRejected,
    /// The warehouse shipped the order.
    Ship,
    /// The carrier delivered it (the buyer signed).
    Deliver,
    /// The buyer confirmed receipt (or the confirmation period ended).
    Complete,
    /// Refunds that succeeded add up to everything paid, and the warehouse cancelled the
    /// outbound (`OutboundCancelled`): on the warehouse's word, the goods never left.
    RefundedInFull,
    /// The warehouse received the returned goods and restocked them.
    ReturnReceived,
}

impl LifecycleEvent {
    /// Every event, for exhaustive tests and docs.
    pub const ALL: [Self; 8] = [
        Self::Pay,
        Self::Cancel,
        Self::StockRejected,
        Self::Ship,
        Self::Deliver,
        Self::Complete,
        Self::RefundedInFull,
        Self::ReturnReceived,
    ];

    /// The action's name in errors (`order is PAID; cannot cancel`).
    pub fn action(self) -> &'static str {
        match self {
            Self::Pay => "pay",
            Self::Cancel => "cancel",
            Self::StockRejected => "cancel for lack of stock",
            Self::Ship => "ship",
            Self::Deliver => "deliver",
            Self::Complete => "complete",
            Self::RefundedInFull => "refund in full",
            Self::ReturnReceived => "receive a return",
        }
    }
}

/// One legal move and the event it emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// Where the order is.
    pub from: OrderStatus,
    /// What happened.
    pub on: LifecycleEvent,
    /// Where it goes.
    pub to: OrderStatus,
    /// The one event the move emits.
    pub emits: EventType,
}

const fn t(from: OrderStatus, on: LifecycleEvent, to: OrderStatus, emits: EventType) -> Transition {
    Transition {
        from,
        on,
        to,
        emits,
    }
}

/// The whole state machine. Not listed means illegal.
pub const TRANSITIONS: [Transition; 11] = {
    use EventType as E;
    use LifecycleEvent as L;
    use OrderStatus as S;
    [
        t(S::PendingPayment, L::Pay, S::Paid, E::OrderPaid),
        t(
            S::PendingPayment,
            L::Cancel,
            S::Cancelled,
            E::OrderCancelled,
        ),
        t(S::Paid, L::StockRejected, S::Cancelled, E::OrderCancelled),
        t(S::Paid, L::Ship, S::Shipped, E::OrderShipped),
        t(S::Paid, L::RefundedInFull, S::Refunded, E::OrderRefunded),
        t(S::Shipped, L::Deliver, S::Delivered, E::OrderDelivered),
        t(S::Shipped, L::ReturnReceived, S::Returned, E::OrderReturned),
        t(S::Delivered, L::Complete, S::Completed, E::OrderCompleted),
        t(
            S::Delivered,
            L::ReturnReceived,
            S::Returned,
            E::OrderReturned,
        ),
        // A return can arrive after the buyer confirmed (after-sales return).
        t(
            S::Completed,
            L::ReturnReceived,
            S::Returned,
            E::OrderReturned,
        ),
        // The marketplace may report the parcel signed before our own consumer saw it
        // delivered: completing a shipped order delivers it on the way.
        t(S::Shipped, L::Complete, S::Completed, E::OrderCompleted),
    ]
};

/// The move `event` makes from `state`, if it is legal.
pub fn next(state: OrderStatus, event: LifecycleEvent) -> Option<Transition> {
    TRANSITIONS
        .iter()
        .copied()
        .find(|t| t.from == state && t.on == event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventType as E;
    use LifecycleEvent as L;
    use OrderStatus as S;

    /// The expected answer for every (state, event) pair, written out independently of the
    /// table: `None` is illegal.
    fn expected(state: S, event: L) -> Option<(S, E)> {
        match (state, event) {
            (S::PendingPayment, L::Pay) => Some((S::Paid, E::OrderPaid)),
            (S::PendingPayment, L::Cancel) => Some((S::Cancelled, E::OrderCancelled)),
            (S::PendingPayment, _) => None,
            (S::Paid, L::StockRejected) => Some((S::Cancelled, E::OrderCancelled)),
            (S::Paid, L::Ship) => Some((S::Shipped, E::OrderShipped)),
            (S::Paid, L::RefundedInFull) => Some((S::Refunded, E::OrderRefunded)),
            (S::Paid, _) => None,
            (S::Shipped, L::Deliver) => Some((S::Delivered, E::OrderDelivered)),
            (S::Shipped, L::Complete) => Some((S::Completed, E::OrderCompleted)),
            (S::Shipped, L::ReturnReceived) => Some((S::Returned, E::OrderReturned)),
            (S::Shipped, _) => None,
            (S::Delivered, L::Complete) => Some((S::Completed, E::OrderCompleted)),
            (S::Delivered, L::ReturnReceived) => Some((S::Returned, E::OrderReturned)),
            (S::Delivered, _) => None,
            (S::Completed, L::ReturnReceived) => Some((S::Returned, E::OrderReturned)),
            (S::Completed, _) => None,
            (S::Cancelled | S::Refunded | S::Returned, _) => None,
        }
    }

    #[test]
    fn every_state_event_pair_has_the_expected_answer() {
        let mut legal = 0;
        for state in OrderStatus::ALL {
            for event in LifecycleEvent::ALL {
                let got = next(state, event).map(|t| (t.to, t.emits));
                assert_eq!(got, expected(state, event), "{state} on {event:?}");
                legal += usize::from(got.is_some());
            }
        }
        assert_eq!(legal, TRANSITIONS.len(), "no duplicate rows in the table");
        assert_eq!(
            OrderStatus::ALL.len() * LifecycleEvent::ALL.len(),
            64,
            "8 states x 8 events checked"
        );
    }

    #[test]
    fn final_states_have_no_way_out() {
        for state in [S::Cancelled, S::Refunded, S::Returned] {
            assert!(state.is_final());
            assert!(LifecycleEvent::ALL
                .iter()
                .all(|e| next(state, *e).is_none()));
        }
    }

    #[test]
    fn every_state_is_reachable_from_pending_payment() {
        let mut seen = vec![S::PendingPayment];
        let mut i = 0;
        while i < seen.len() {
            let from = seen[i];
            for t in TRANSITIONS.iter().filter(|t| t.from == from) {
                if !seen.contains(&t.to) {
                    seen.push(t.to);
                }
            }
            i += 1;
        }
        for s in OrderStatus::ALL {
            assert!(seen.contains(&s), "{s} unreachable");
        }
    }
}
