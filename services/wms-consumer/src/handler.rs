//! The WMS's part of the consumer runtime: which events it applies and how. Consumer name
//! `wms`; topics `<prefix>order` (refunds, cancellations) and `<prefix>stock` (reservations).
//!
//! The outbound is created from `StockReserved`, not from `OrderPaid`: an order whose stock
//! cannot be reserved is cancelled and must never reach the warehouse floor, and only the
//! stock consumer knows whether it can be. `StockReserved` carries the paid order's lines.

use outbox_consumer::{Effect, Event, Handler, HandlerError};
use sqlx::PgConnection;

use crate::domain::HoldChange;
use crate::events::{order_hold, refund_hold, OrderEvent, StockReserved, CANCELLED_HOLD};
use crate::fulfilment;

/// The inbox's consumer name and the aggregate types (topics `<prefix><aggregate_type>`) it
/// reads, from the system's contracts (`outbox-audit` reads them too).
pub use event_contracts::wms::{CONSUMED_AGGREGATES, CONSUMER_NAME};

/// Applies order and stock events to outbounds.
#[derive(Debug, Clone, Copy, Default)]
pub struct WmsHandler;

impl Handler for WmsHandler {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        event_contracts::wms::versions(event_type)
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let effect = match event.event_type() {
            "StockReserved" => {
                let reserved: StockReserved = event.payload_as()?;
                if reserved.lines.is_empty() {
                    return Err(HandlerError::Unapplicable(
                        "StockReserved without lines".to_owned(),
                    ));
                }
                fulfilment::create_outbound(conn, reserved.order_id, &reserved.lines).await?
            }
            "OrderCancelled" => {
                let order: OrderEvent = event.payload_as()?;
                fulfilment::change_hold(
                    conn,
                    order.order_id,
                    CANCELLED_HOLD,
                    HoldChange::MakePermanent,
                )
                .await?
            }
            "OrderHeld" => {
                let order: OrderEvent = event.payload_as()?;
                let reason = order.hold.as_ref().ok_or_else(|| {
                    HandlerError::Unapplicable("OrderHeld without a hold".to_owned())
                })?;
                fulfilment::change_hold(
                    conn,
                    order.order_id,
                    &order_hold(&reason.reason),
                    HoldChange::Open,
                )
                .await?
            }
            refund_event @ ("RefundRequested" | "RefundClosed" | "RefundSucceeded") => {
                let order: OrderEvent = event.payload_as()?;
                let refund = order.refund.as_ref().ok_or_else(|| {
                    HandlerError::Unapplicable(format!("{refund_event} without a refund"))
                })?;
                let change = match refund_event {
                    "RefundRequested" => order.refund_request_hold(),
                    "RefundClosed" => HoldChange::Release,
                    _ => order.refund_success_hold(),
                };
                let hold = refund_hold(&refund.refund_no);
                if refund_event != "RefundClosed" {
                    fulfilment::set_refund_lines(conn, order.order_id, &hold, order.refund_lines())
                        .await?;
                }
                fulfilment::change_hold(conn, order.order_id, &hold, change).await?
            }
            _ => Effect::Unchanged,
        };
        Ok(effect)
    }
}
