//! What the fulfilment consumer subscribes to: its inbox name, the topics it reads and the
//! event versions it applies. The handler (the `fulfilment` module), the binary's
//! configuration, the metrics and `outbox-audit` all need these, so they stand in this leaf.

use crate::channel::shipback;

/// The inbox's consumer name.
pub const CONSUMER_NAME: &str = "order";

/// Aggregate types (topics `<prefix><aggregate_type>`) the order service consumes.
pub const CONSUMED_AGGREGATES: [&str; 3] = ["outbound", "stock", shipback::AGGREGATE_TYPE];

const V1: &[u32] = &[1];

/// The versions of `event_type` the fulfilment consumer applies, `None` for event types it
/// ignores (they get no inbox row): the fulfilment handler's `Handler::versions`, also for
/// `outbox-audit`.
pub fn versions(event_type: &str) -> Option<&'static [u32]> {
    match event_type {
        "OutboundShipped" | "OutboundCancelled" | "ReturnReceived" | "StockReservationRejected" => {
            Some(V1)
        }
        shipback::EVENT_TYPE => Some(V1),
        _ => None,
    }
}
