//! Events from fulfilment that move orders, consumed through the shared consumer runtime
//! (consumer name `order`; topics `<prefix>outbound`, `<prefix>stock`, `<prefix>shipback`):
//!
//! - `OutboundShipped` (WMS): `PAID -> SHIPPED`, emits `OrderShipped` (and, for a channel
//!   order, `ShipBackRequested`);
//! - `ShipBackRequested` (this service, topic `<prefix>shipback`): reports the tracking
//!   number to the platform ([`crate::channel::shipback`]);
//! - `OutboundCancelled` (WMS): `PAID -> REFUNDED`, emits `OrderRefunded`, when refunds gave
//!   back everything paid (the warehouse's word that the goods never left);
//! - `ReturnReceived` (WMS): `SHIPPED | DELIVERED | COMPLETED -> RETURNED`, emits
//!   `OrderReturned`; before its refund is decided, only recorded (`return_received_at`);
//! - `StockReservationRejected` (stock): `PAID -> CANCELLED`, the payment is flagged for
//!   refund (`REFUND_REQUIRED`, reason `stock_rejected`) for what no refund had reserved yet,
//!   emits `OrderCancelled`.
//!
//! Each runs in the runtime's transaction, after the inbox row: the order row is locked first
//! (like every writer of an order), the status moves by a conditional update, so an event that
//! arrives again under a new event id finds the order moved already and changes nothing.

use outbox_consumer::{Effect, Event, Handler, HandlerError};
use serde::Deserialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::channel::{shipback, PlatformClient};
use crate::domain::{LifecycleEvent, OrderId, OrderStatus};
use crate::events::{Cause, EventType, ShipmentView};
use crate::metrics::Metrics;
use crate::orders::advance;
use crate::payments::FlagReason;
use crate::store::{orders, payments};

/// The consumer's subscription, also under this module's name (where callers look for it).
pub use crate::subscription::{versions, CONSUMED_AGGREGATES, CONSUMER_NAME};
use crate::views::{OrderView, PaymentView};

/// The part of `OutboundShipped` the order service reads.
#[derive(Debug, Clone, Deserialize)]
struct OutboundShipped {
    order_id: Uuid,
    outbound_no: String,
    carrier: String,
    tracking_no: String,
}

/// The part of `OutboundCancelled` the order service reads.
#[derive(Debug, Clone, Deserialize)]
struct OutboundOfOrder {
    order_id: Uuid,
}

/// The part of `ReturnReceived` the order service reads: the outbound after the receipt.
#[derive(Debug, Clone, Deserialize)]
pub struct ReturnReceived {
    /// The order.
    pub order_id: Uuid,
    /// `RETURNED` when every shipped unit is back; `SHIPPED` after a partial return (by
    /// line). Absent from older WMS versions, whose returns were always whole.
    #[serde(default)]
    pub status: Option<String>,
    /// The outbound's lines with the units back so far.
    #[serde(default)]
    pub lines: Vec<ReturnedLine>,
}

/// A line of a `ReturnReceived`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReturnedLine {
    /// The SKU.
    pub sku_id: String,
    /// Units the outbound shipped.
    pub quantity: i32,
    /// Units back so far (cumulative); absent from older WMS versions: the whole line.
    #[serde(default)]
    pub returned_quantity: Option<i32>,
}

impl ReturnReceived {
    /// Whether every shipped unit is back.
    pub fn is_complete(&self) -> bool {
        self.status.as_deref().is_none_or(|s| s == "RETURNED")
    }

    /// Units back per SKU so far.
    pub fn returned_units(&self) -> Vec<(String, i32)> {
        self.lines
            .iter()
            .map(|l| (l.sku_id.clone(), l.returned_quantity.unwrap_or(l.quantity)))
            .collect()
    }
}

/// The part of `StockReservationRejected` the order service reads.
#[derive(Debug, Clone, Deserialize)]
struct StockRejected {
    order_id: Uuid,
}

/// Applies fulfilment events to orders, and reports channel shipments to the platform.
#[derive(Debug, Clone)]
pub struct FulfilmentHandler {
    metrics: Metrics,
    platform: Option<PlatformClient>,
}

impl FulfilmentHandler {
    /// A handler counting flagged payments in `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            platform: None,
        }
    }

    /// Reports `ShipBackRequested` to this platform.
    #[must_use]
    pub fn with_platform(mut self, platform: Option<PlatformClient>) -> Self {
        self.platform = platform;
        self
    }
}

impl Handler for FulfilmentHandler {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        versions(event_type)
    }

    async fn prepare(&self, pool: &PgPool, event: &Event) -> Result<(), HandlerError> {
        if event.event_type() != shipback::EVENT_TYPE {
            return Ok(());
        }
        let req: shipback::ShipBackRequested = event.payload_as()?;
        let called = shipback::call(pool, self.platform.as_ref(), &req).await;
        if matches!(called, Err(HandlerError::Unapplicable(_))) {
            self.metrics.shipback_failures.inc();
        }
        called
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        match event.event_type() {
            "OutboundShipped" => {
                let shipped: OutboundShipped = event.payload_as()?;
                let shipment = ShipmentView {
                    outbound_no: shipped.outbound_no,
                    carrier: shipped.carrier,
                    tracking_no: shipped.tracking_no,
                };
                ship(conn, OrderId::from(shipped.order_id), &shipment).await
            }
            shipback::EVENT_TYPE => {
                let req: shipback::ShipBackRequested = event.payload_as()?;
                shipback::recorded(conn, &req).await
            }
            "ReturnReceived" => {
                let returned: ReturnReceived = event.payload_as()?;
                receive_return(conn, &returned).await
            }
            "OutboundCancelled" => {
                let cancelled: OutboundOfOrder = event.payload_as()?;
                outbound_cancelled(conn, OrderId::from(cancelled.order_id)).await
            }
            "StockReservationRejected" => {
                let rejected: StockRejected = event.payload_as()?;
                cancel_for_lack_of_stock(conn, OrderId::from(rejected.order_id)).await
            }
            _ => Ok(Effect::Unchanged),
        }
    }

    fn committed(&self, event: &Event, effect: Effect) {
        if event.event_type() == "StockReservationRejected" && effect == Effect::Changed {
            self.metrics
                .payments_flagged_for_refund
                .with_label_values(&[FlagReason::StockRejected.as_str()])
                .inc();
            self.metrics.orders_cancelled.inc();
        }
    }
}

/// Locks an order a consumed event names; an unknown one is a contradiction for operators.
async fn lock_known(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<orders::OrderRow, HandlerError> {
    orders::lock(conn, order_id)
        .await?
        .ok_or_else(|| HandlerError::Unapplicable(format!("order {order_id} does not exist")))
}

/// `PAID -> SHIPPED` and `OrderShipped`: the warehouse's word, also for an order whose refunds
/// gave everything back while the parcel was leaving (the WMS recalls it and its return ends
/// the order `RETURNED`). Such an order is not reported to the platform: the platform closed
/// the trade when the refund succeeded.
///
/// # Errors
/// [`HandlerError::Unapplicable`] for an unknown order or one that cannot ship (not paid,
/// cancelled, refunded after the warehouse cancelled the outbound): a contradiction for
/// operators; database errors.
pub async fn ship(
    conn: &mut PgConnection,
    order_id: OrderId,
    shipment: &ShipmentView,
) -> Result<Effect, HandlerError> {
    let order = lock_known(conn, order_id).await?;
    if order.status.is_shipped() {
        return Ok(Effect::Unchanged);
    }
    let refunded_in_full = order.status == OrderStatus::Paid
        && orders::refunded_cents(conn, order_id).await? >= order.paid_cents;
    advance(
        conn,
        &order,
        LifecycleEvent::Ship,
        Cause::Shipment(shipment),
    )
    .await
    .map_err(order_error)?;
    let ship_back = if refunded_in_full {
        tracing::warn!(
            order.id = %order_id,
            outbound.no = %shipment.outbound_no,
            "Order shipped after its refunds gave everything back: the parcel must come back (the WMS recalls it); not reported to the platform"
        );
        false
    } else {
        shipback::request(conn, order_id, shipment)
            .await
            .map_err(order_error)?
    };
    tracing::info!(
        order.id = %order_id,
        outbound.no = %shipment.outbound_no,
        ship_back,
        "Order shipped"
    );
    Ok(Effect::Changed)
}

/// `PAID -> REFUNDED` and `OrderRefunded` when the warehouse cancelled the outbound of an order
/// whose refunds gave everything back: the goods never left. An outbound cancelled for any
/// other reason (the order cancelled, or not refunded in full) changes nothing here.
///
/// # Errors
/// [`HandlerError::Unapplicable`] for an unknown order; database errors.
pub async fn outbound_cancelled(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Effect, HandlerError> {
    let order = lock_known(conn, order_id).await?;
    if order.status != OrderStatus::Paid
        || order.paid_cents == 0
        || orders::refunded_cents(conn, order_id).await? < order.paid_cents
    {
        tracing::info!(
            order.id = %order_id,
            order.status = %order.status,
            "Outbound cancelled; the order is not refunded in full, nothing to move"
        );
        return Ok(Effect::Unchanged);
    }
    advance(conn, &order, LifecycleEvent::RefundedInFull, Cause::None)
        .await
        .map_err(order_error)?;
    tracing::info!(order.id = %order_id, "Order refunded in full and its outbound cancelled");
    Ok(Effect::Changed)
}

/// `SHIPPED | DELIVERED | COMPLETED -> RETURNED` and `OrderReturned`: the warehouse has every
/// shipped unit back (and the stock consumer restocks them from the same `ReturnReceived`).
/// While a return-and-refund refund is still undecided the order only records
/// `return_received_at` and waits: its success returns the order, its closing leaves it
/// shipped (goods back, money kept, for operators).
///
/// A partial return (some lines or units back, the outbound `SHIPPED` again) records the units
/// per line (`items[].returned_quantity`) and emits `OrderPartlyReturned`; the order keeps its
/// status, since part of it is still with the buyer and paid for.
///
/// # Errors
/// [`HandlerError::Unapplicable`] for an unknown order or one that never shipped; database
/// errors.
pub async fn receive_return(
    conn: &mut PgConnection,
    returned: &ReturnReceived,
) -> Result<Effect, HandlerError> {
    let order_id = OrderId::from(returned.order_id);
    let order = lock_known(conn, order_id).await?;
    if order.status == OrderStatus::Returned {
        return Ok(Effect::Unchanged);
    }
    if !order.status.is_shipped() {
        return Err(HandlerError::Unapplicable(format!(
            "order {order_id} is {}; it cannot take a return",
            order.status
        )));
    }
    let recorded =
        orders::record_returned_units(conn, order_id, &returned.returned_units()).await?;
    if !returned.is_complete() {
        if !recorded {
            return Ok(Effect::Unchanged);
        }
        let order = orders::find(conn, order_id)
            .await?
            .ok_or(HandlerError::Unapplicable(format!(
                "order {order_id} vanished"
            )))?;
        let view = OrderView::load(conn, order).await.map_err(order_error)?;
        crate::events::append(conn, EventType::OrderPartlyReturned, &view, Cause::None)
            .await
            .map_err(order_error)?;
        tracing::info!(order.id = %order_id, "Part of the order returned; it keeps its status");
        return Ok(Effect::Changed);
    }
    if order.status.is_shipped() && orders::has_open_return(conn, order_id).await? {
        // The goods are back but the platform has not decided the refund: RETURNED now would
        // leave the buyer with neither goods nor money if it closes. The refund's success
        // returns the order (crate::refunds::apply_notice_in).
        if order.return_received_at.is_some() {
            return Ok(Effect::Unchanged);
        }
        orders::mark_return_received(conn, order_id).await?;
        tracing::info!(
            order.id = %order_id,
            "Return received before its refund is decided; the order waits for the refund"
        );
        return Ok(Effect::Changed);
    }
    advance(conn, &order, LifecycleEvent::ReturnReceived, Cause::None)
        .await
        .map_err(order_error)?;
    Ok(Effect::Changed)
}

/// `PAID -> CANCELLED` for lack of stock: what no refund has reserved yet is reserved now and
/// the payment is flagged to give exactly that back; `OrderCancelled` carries it. A refund
/// requested earlier keeps its own reservation and outcome, so nothing is refunded twice
/// (`orders_refunds_within_paid` holds the total).
///
/// # Errors
/// [`HandlerError::Unapplicable`] for an unknown order or one past payment (shipped), database
/// errors.
pub async fn cancel_for_lack_of_stock(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> Result<Effect, HandlerError> {
    let order = lock_known(conn, order_id).await?;
    if order.status == OrderStatus::Cancelled {
        return Ok(Effect::Unchanged);
    }
    if order.status != OrderStatus::Paid {
        return Err(HandlerError::Unapplicable(format!(
            "order {order_id} is {}; a stock rejection cannot cancel it",
            order.status
        )));
    }
    let due = orders::reserve_rest(conn, order_id).await?;
    let flagged: PaymentView =
        payments::flag_applied_for_refund(conn, order_id, FlagReason::StockRejected.as_str(), due)
            .await?
            .ok_or_else(|| {
                HandlerError::Unapplicable(format!("paid order {order_id} has no applied payment"))
            })?
            .into();
    advance(
        conn,
        &order,
        LifecycleEvent::StockRejected,
        Cause::Payment(&flagged),
    )
    .await
    .map_err(order_error)?;
    tracing::warn!(
        order.id = %order_id,
        payment.transaction_id = %flagged.transaction_id,
        refund_due_cents = due,
        refund_reserved_before_cents = order.refund_reserved_cents,
        reason = FlagReason::StockRejected.as_str(),
        "Paid order cancelled for lack of stock; payment flagged for refund"
    );
    Ok(Effect::Changed)
}

/// The order core's errors as the runtime's: database and outbox failures keep their
/// retry-or-not classification, anything else cannot be retried into success.
fn order_error(e: crate::Error) -> HandlerError {
    match e {
        crate::Error::Database(e) => HandlerError::Database(e),
        crate::Error::Outbox(e) => HandlerError::Outbox(e),
        other => HandlerError::Unapplicable(other.to_string()),
    }
}
