//! The stock consumer's part of the consumer runtime. Consumer name `stock`; topics
//! `<prefix>order` (payments, cancellations) and `<prefix>outbound` (the WMS: lines taken out,
//! shipped, cancelled, returned).
//!
//! A refund releases stock only through the WMS: `OutboundCancelled` says the goods will never
//! leave (the refund succeeded, or the order was cancelled, before shipping), and
//! `OutboundLinesCancelled` that some lines or units will not (a refund by line succeeded before
//! shipping). Deciding that from `RefundSucceeded` here would race with `OutboundShipped` on
//! another topic. Outbound events carry the whole outbound view, so each move reads the lines'
//! cumulative amounts ([`crate::lines`]) rather than the change alone.

use outbox_consumer::{Effect, Event, Handler, HandlerError};
use sqlx::PgConnection;

use crate::events::{OrderPaid, OrderRef, OutboundRef};
use crate::lines::Instruction;
use crate::stock;

/// The inbox's consumer name and the aggregate types (topics `<prefix><aggregate_type>`) it
/// reads, from the system's contracts (`outbox-audit` reads them too).
pub use event_contracts::stock::{CONSUMED_AGGREGATES, CONSUMER_NAME};

/// Applies order and outbound events to stock.
#[derive(Debug, Clone, Copy, Default)]
pub struct StockHandler;

impl Handler for StockHandler {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        event_contracts::stock::versions(event_type)
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let event_id = event.event_id();
        let (order_id, instruction) = match event.event_type() {
            "OrderPaid" => {
                let paid: OrderPaid = event.payload_as()?;
                return stock::reserve(conn, event_id, paid.order_id, &paid.items).await;
            }
            "OrderCancelled" | "OutboundCancelled" => {
                let order: OrderRef = event.payload_as()?;
                (order.order_id, Instruction::ReleaseAll)
            }
            "OutboundLinesCancelled" => {
                let outbound: OutboundRef = event.payload_as()?;
                let left = outbound.units(false).map_err(HandlerError::Unapplicable)?;
                (outbound.order_id, Instruction::KeepOnly(left))
            }
            "OutboundShipped" => {
                let outbound: OutboundRef = event.payload_as()?;
                let shipped = outbound.units(false).map_err(HandlerError::Unapplicable)?;
                (outbound.order_id, Instruction::Ship(shipped))
            }
            "ReturnReceived" => {
                let outbound: OutboundRef = event.payload_as()?;
                let back = outbound.units(true).map_err(HandlerError::Unapplicable)?;
                (outbound.order_id, Instruction::Returned(back))
            }
            _ => return Ok(Effect::Unchanged),
        };
        stock::settle(conn, event_id, order_id, &instruction).await
    }
}
