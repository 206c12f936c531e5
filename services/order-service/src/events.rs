//! The order events this service publishes through the outbox (aggregate type `order`,
//! aggregate id = order id). Each payload is a full snapshot of the order after the change,
//! plus the payment or refund that caused it, so a consumer can act on one message alone.

use serde::Serialize;
use sqlx::PgConnection;

use crate::error::Error;
use crate::views::{OrderView, PaymentView, RefundView};

/// The kinds of order events: part of the domain (each lifecycle move names the one it emits),
/// and here too because [`append`] takes one.
pub use crate::domain::EventType;

/// Aggregate type of every event here: routes to topic `outbox.event.order`.
pub const AGGREGATE_TYPE: &str = "order";

#[derive(Serialize)]
struct Payload<'a> {
    event_type: &'static str,
    #[serde(flatten)]
    order: &'a OrderView,
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<&'a PaymentView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refund: Option<&'a RefundView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shipment: Option<&'a ShipmentView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold: Option<HoldView>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    refunded_in_full: bool,
}

/// Why fulfilment waits, in `OrderHeld`.
#[derive(Debug, Clone, Copy, Serialize)]
struct HoldView {
    reason: &'static str,
}

/// The warehouse's shipment of an order, as `OutboundShipped` reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ShipmentView {
    /// The WMS's outbound number.
    pub outbound_no: String,
    /// The carrier.
    pub carrier: String,
    /// The parcel's tracking number.
    pub tracking_no: String,
}

/// What caused an event besides the order itself.
#[derive(Debug, Clone, Copy)]
pub enum Cause<'a> {
    /// Nothing else (created, cancelled).
    None,
    /// The payment that paid the order.
    Payment(&'a PaymentView),
    /// The refund that was requested or finished.
    Refund(&'a RefundView),
    /// The refund whose success gives back everything paid of an unshipped order
    /// (`refunded_in_full: true` in `RefundSucceeded`).
    RefundInFull(&'a RefundView),
    /// The shipment that shipped the order.
    Shipment(&'a ShipmentView),
    /// Why fulfilment waits (`OrderHeld`).
    Hold(&'static str),
}

/// Appends an event to the outbox in the caller's transaction. The caller must hold the
/// order's row lock (or have inserted the order in this transaction), so that the events of
/// one order get outbox ids in commit order.
///
/// # Errors
/// When the payload cannot be serialized or the insert fails.
pub async fn append(
    conn: &mut PgConnection,
    event_type: EventType,
    order: &OrderView,
    cause: Cause<'_>,
) -> Result<outbox_writer::EnqueuedEvent, Error> {
    let (mut payment, mut refund, mut shipment, mut hold) = (None, None, None, None);
    let mut refunded_in_full = false;
    match cause {
        Cause::None => {}
        Cause::Payment(p) => payment = Some(p),
        Cause::Refund(r) => refund = Some(r),
        Cause::RefundInFull(r) => {
            refund = Some(r);
            refunded_in_full = true;
        }
        Cause::Shipment(s) => shipment = Some(s),
        Cause::Hold(reason) => hold = Some(HoldView { reason }),
    }
    let payload = serde_json::to_value(Payload {
        event_type: event_type.as_str(),
        order,
        payment,
        refund,
        shipment,
        hold,
        refunded_in_full,
    })
    .map_err(Error::Serialize)?;
    let aggregate_id = order.order_id.to_string();
    let event =
        outbox_writer::NewEvent::new(AGGREGATE_TYPE, &aggregate_id, event_type.as_str(), &payload);
    let enqueued = outbox_writer::enqueue(&mut *conn, &event).await?;
    tracing::debug!(
        order.id = %order.order_id,
        event.id = %enqueued.event_id,
        event.name = event_type.as_str(),
        "Appended order event to the outbox"
    );
    Ok(enqueued)
}
