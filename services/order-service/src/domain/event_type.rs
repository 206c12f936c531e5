//! The kinds of order events the service publishes: every move of the lifecycle
//! ([`super::lifecycle`]) names the one it emits, and the refund and hold events that leave
//! the order where it is are here too. The `events` module builds their payloads.

/// The kinds of order events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A new order waits for payment.
    OrderCreated,
    /// The order was paid (once).
    OrderPaid,
    /// The order was cancelled: before payment, or after it when its stock could not be
    /// reserved (the payment is then flagged for refund).
    OrderCancelled,
    /// A refund was asked for, or its terms (amount, kind) changed: the payload carries the
    /// current ones.
    RefundRequested,
    /// A refund was paid out. When refunds now give back everything paid of an order not
    /// shipped, `refunded_in_full` is `true`: the warehouse stops the outbound for good, and
    /// its word decides where the order goes (`OrderRefunded` once it cancelled the outbound,
    /// `OrderShipped` if the parcel had left already).
    RefundSucceeded,
    /// A refund was closed without paying out.
    RefundClosed,
    /// Refunded in full, and the warehouse cancelled the outbound: `PAID -> REFUNDED`, final.
    OrderRefunded,
    /// The warehouse shipped the order.
    OrderShipped,
    /// The carrier delivered the order (signed).
    OrderDelivered,
    /// The buyer confirmed receipt.
    OrderCompleted,
    /// The warehouse received every shipped unit back: `RETURNED`, final.
    OrderReturned,
    /// The warehouse received some of the goods back (a return by line): `items[]
    /// .returned_quantity` says how many units of each line; the order's status does not
    /// change.
    OrderPartlyReturned,
    /// Fulfilment must wait (`hold.reason`, e.g. `trade_closed`: the platform closed the paid
    /// trade and its refund is not known yet); the order's status does not change.
    OrderHeld,
}

impl EventType {
    /// The `event_type` column and header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrderCreated => "OrderCreated",
            Self::OrderPaid => "OrderPaid",
            Self::OrderCancelled => "OrderCancelled",
            Self::RefundRequested => "RefundRequested",
            Self::RefundSucceeded => "RefundSucceeded",
            Self::RefundClosed => "RefundClosed",
            Self::OrderRefunded => "OrderRefunded",
            Self::OrderShipped => "OrderShipped",
            Self::OrderDelivered => "OrderDelivered",
            Self::OrderCompleted => "OrderCompleted",
            Self::OrderReturned => "OrderReturned",
            Self::OrderPartlyReturned => "OrderPartlyReturned",
            Self::OrderHeld => "OrderHeld",
        }
    }
}
