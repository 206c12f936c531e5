//! Events the stock consumer publishes through its outbox (aggregate type `stock`, aggregate id
//! = order id, topic `outbox.event.stock`), and the payloads it consumes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

/// Aggregate type of the stock events: routes to topic `outbox.event.stock`.
pub const AGGREGATE_TYPE: &str = "stock";

/// A reserved line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineView {
    /// The SKU.
    pub sku_id: String,
    /// Units.
    pub quantity: i64,
}

/// A line that could not be reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shortage {
    /// The SKU.
    pub sku_id: String,
    /// Units the order asked for.
    pub requested: i64,
    /// Units available (on hand minus reserved) when it was decided.
    pub available: i64,
}

/// The events of the stock consumer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event_type")]
pub enum StockEvent {
    /// Every line of a paid order is reserved; the WMS creates its outbound from this.
    StockReserved {
        /// The order.
        order_id: Uuid,
        /// What was reserved.
        lines: Vec<LineView>,
    },
    /// Some line lacked stock: nothing was reserved; the order service cancels the order.
    StockReservationRejected {
        /// The order.
        order_id: Uuid,
        /// The lines that lacked stock.
        shortages: Vec<Shortage>,
    },
}

impl StockEvent {
    /// The `event_type` column and header.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::StockReserved { .. } => "StockReserved",
            Self::StockReservationRejected { .. } => "StockReservationRejected",
        }
    }

    fn order_id(&self) -> Uuid {
        match self {
            Self::StockReserved { order_id, .. }
            | Self::StockReservationRejected { order_id, .. } => *order_id,
        }
    }
}

/// Appends an event to the outbox in the caller's transaction.
///
/// # Errors
/// When the insert fails.
pub async fn append(
    conn: &mut PgConnection,
    event: &StockEvent,
) -> Result<outbox_writer::EnqueuedEvent, outbox_writer::OutboxError> {
    // Plain structs of strings, numbers and ids always serialize.
    let payload = serde_json::to_value(event).unwrap_or_default();
    let order_id = event.order_id().to_string();
    let new = outbox_writer::NewEvent::new(AGGREGATE_TYPE, &order_id, event.event_type(), &payload);
    let enqueued = outbox_writer::enqueue(&mut *conn, &new).await?;
    tracing::info!(
        order.id = %order_id,
        event.id = %enqueued.event_id,
        event.name = event.event_type(),
        "Stock decision published"
    );
    Ok(enqueued)
}

/// The part of `OrderPaid` (order service) the stock consumer reads.
#[derive(Debug, Clone, Deserialize)]
pub struct OrderPaid {
    /// The order.
    pub order_id: Uuid,
    /// Its lines.
    pub items: Vec<LineView>,
}

/// The part of any order or outbound event that names the order.
#[derive(Debug, Clone, Deserialize)]
pub struct OrderRef {
    /// The order.
    pub order_id: Uuid,
}

/// The part of an outbound event (the WMS's full outbound view plus `event_type`) the stock
/// consumer reads: the order and the outbound's lines. `OutboundLinesCancelled`'s
/// `cancelled_lines` and `ReturnReceived`'s `received_lines` are informational: the view's
/// lines carry the cumulative amounts, which make every move repeatable.
#[derive(Debug, Clone, Deserialize)]
pub struct OutboundRef {
    /// The order.
    pub order_id: Uuid,
    /// What the outbound ships (or shipped), per line.
    pub lines: Vec<OutboundLine>,
}

/// A line of an outbound view.
#[derive(Debug, Clone, Deserialize)]
pub struct OutboundLine {
    /// The SKU.
    pub sku_id: String,
    /// Units this outbound ships: fewer than ordered once lines were refunded before shipping.
    pub quantity: i64,
    /// Units received back so far (cumulative). Absent from older WMS versions, whose returns
    /// were always whole: then the whole line came back.
    #[serde(default)]
    pub returned_quantity: Option<i64>,
}

impl OutboundRef {
    /// Units per SKU (summed over lines of the same SKU): `quantity`, or with `returned`,
    /// `returned_quantity` (the whole `quantity` where absent).
    ///
    /// # Errors
    /// Names the first line with a negative amount.
    pub fn units(&self, returned: bool) -> Result<BTreeMap<String, i64>, String> {
        let mut units: BTreeMap<String, i64> = BTreeMap::new();
        for l in &self.lines {
            let n = if returned {
                l.returned_quantity.unwrap_or(l.quantity)
            } else {
                l.quantity
            };
            if n < 0 || l.quantity < 0 {
                return Err(format!("line {} has a negative quantity", l.sku_id));
            }
            *units.entry(l.sku_id.clone()).or_default() += n;
        }
        Ok(units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_their_type_and_order() {
        let id = Uuid::nil();
        let e = StockEvent::StockReservationRejected {
            order_id: id,
            shortages: vec![Shortage {
                sku_id: "A".into(),
                requested: 3,
                available: 1,
            }],
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["event_type"], "StockReservationRejected");
        assert_eq!(v["order_id"], id.to_string());
        assert_eq!(v["shortages"][0]["available"], 1);
        let paid: OrderPaid = serde_json::from_value(serde_json::json!({
            "event_type": "OrderPaid", "order_id": id, "status": "PAID",
            "items": [{"sku_id": "A", "name": "x", "quantity": 2, "unit_price_cents": 5, "line_total_cents": 10}]
        }))
        .unwrap();
        assert_eq!(paid.items[0].quantity, 2);
        let returned: OutboundRef = serde_json::from_value(serde_json::json!({
            "event_type": "ReturnReceived", "outbound_no": "OB-1", "order_id": id, "status": "SHIPPED",
            "lines": [{"sku_id": "A", "quantity": 2, "returned_quantity": 1}, {"sku_id": "B", "quantity": 3}],
            "received_lines": [{"sku_id": "A", "quantity": 1}]
        }))
        .unwrap();
        let expected = |pairs: &[(&str, i64)]| {
            pairs
                .iter()
                .map(|(s, n)| ((*s).to_owned(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        // An older WMS leaves `returned_quantity` out: the whole line came back.
        assert_eq!(
            returned.units(true).unwrap(),
            expected(&[("A", 1), ("B", 3)])
        );
        assert_eq!(
            returned.units(false).unwrap(),
            expected(&[("A", 2), ("B", 3)])
        );
        let negative: OutboundRef = serde_json::from_value(serde_json::json!({
            "order_id": id, "lines": [{"sku_id": "A", "quantity": -1}]
        }))
        .unwrap();
        assert!(negative.units(false).is_err());
    }
}
