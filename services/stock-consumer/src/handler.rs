//! The stock consumer's part of the consumer runtime. Consumer name `stock`; topics
//! `<prefix>order` (payments, cancellations) and `<prefix>outbound` (the WMS: shipped,
//! cancelled, returned).
//!
//! A refund releases stock only through the WMS: `OutboundCancelled` says the goods will never
//! leave (the refund succeeded, or the order was cancelled, before shipping). Deciding that
//! from `RefundSucceeded` here would race with `OutboundShipped` on another topic.

use outbox_kit::consumer::{Effect, Event, Handler, HandlerError};
use sqlx::PgConnection;

use crate::domain::MovementKind;
use crate::events::{OrderPaid, OrderRef};
use crate::stock;

/// The inbox's consumer name.
pub const CONSUMER_NAME: &str = "stock";

/// Aggregate types (topics `<prefix><aggregate_type>`) the stock consumer reads.
pub const CONSUMED_AGGREGATES: [&str; 2] = ["order", "outbound"];

const V1: &[u32] = &[1];

/// Applies order and outbound events to stock.
#[derive(Debug, Clone, Copy, Default)]
pub struct StockHandler;

impl Handler for StockHandler {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        match event_type {
            "OrderPaid" | "OrderCancelled" | "OutboundShipped" | "OutboundCancelled"
            | "ReturnReceived" => Some(V1),
            _ => None,
        }
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let kind = match event.event_type() {
            "OrderPaid" => {
                let paid: OrderPaid = event.payload_as()?;
                return stock::reserve(conn, event.event_id(), paid.order_id, &paid.items).await;
            }
            "OrderCancelled" | "OutboundCancelled" => MovementKind::Release,
            "OutboundShipped" => MovementKind::Deduct,
            "ReturnReceived" => MovementKind::Restock,
            _ => return Ok(Effect::Unchanged),
        };
        let order: OrderRef = event.payload_as()?;
        stock::settle(conn, event.event_id(), order.order_id, kind).await
    }
}
