#![doc = include_str!("../README.md")]

/// Version 1, the only version of every event type applied today.
const V1: &[u32] = &[1];

/// The order service's fulfilment consumer: outbound, stock and ship-back events.
pub mod order {
    use super::V1;

    /// The inbox's consumer name.
    pub const CONSUMER_NAME: &str = "order";

    /// Aggregate type (topic `<prefix>shipback`) of ship-back requests, which the order service
    /// both writes and consumes.
    pub const SHIPBACK_AGGREGATE_TYPE: &str = "shipback";
    /// The ship-back request's event type.
    pub const SHIPBACK_EVENT_TYPE: &str = "ShipBackRequested";

    /// Aggregate types (topics `<prefix><aggregate_type>`) the order service consumes.
    pub const CONSUMED_AGGREGATES: [&str; 3] = ["outbound", "stock", SHIPBACK_AGGREGATE_TYPE];

    /// The versions of `event_type` the fulfilment consumer applies, `None` for event types it
    /// ignores.
    pub fn versions(event_type: &str) -> Option<&'static [u32]> {
        match event_type {
            "OutboundShipped"
            | "OutboundCancelled"
            | "ReturnReceived"
            | "StockReservationRejected"
            | SHIPBACK_EVENT_TYPE => Some(V1),
            _ => None,
        }
    }
}

/// The WMS consumer: order events (refunds, cancellations, holds) and stock reservations.
pub mod wms {
    use super::V1;

    /// The inbox's consumer name.
    pub const CONSUMER_NAME: &str = "wms";

    /// Aggregate types (topics `<prefix><aggregate_type>`) the WMS consumes.
    pub const CONSUMED_AGGREGATES: [&str; 2] = ["order", "stock"];

    /// The versions of `event_type` the WMS applies, `None` for event types it ignores.
    pub fn versions(event_type: &str) -> Option<&'static [u32]> {
        match event_type {
            "StockReserved" | "RefundRequested" | "RefundClosed" | "RefundSucceeded"
            | "OrderCancelled" | "OrderHeld" => Some(V1),
            _ => None,
        }
    }
}

/// The stock consumer: payments and cancellations of orders, the WMS's outbound moves.
pub mod stock {
    use super::V1;

    /// The inbox's consumer name.
    pub const CONSUMER_NAME: &str = "stock";

    /// Aggregate types (topics `<prefix><aggregate_type>`) the stock consumer reads.
    pub const CONSUMED_AGGREGATES: [&str; 2] = ["order", "outbound"];

    /// The versions of `event_type` the stock consumer applies, `None` for event types it
    /// ignores.
    pub fn versions(event_type: &str) -> Option<&'static [u32]> {
        match event_type {
            "OrderPaid"
            | "OrderCancelled"
            | "OutboundLinesCancelled"
            | "OutboundShipped"
            | "OutboundCancelled"
            | "ReturnReceived" => Some(V1),
            _ => None,
        }
    }
}
