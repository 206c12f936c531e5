//! Events the WMS publishes through its outbox (aggregate type `outbound`, aggregate id =
//! `outbound_no`, topic `outbox.event.outbound`), and the payloads it consumes.
//!
//! Every published payload is a full snapshot of the outbound after the change ([`OutboundView`])
//! plus `event_type`, so a consumer can act on one message alone.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{HoldChange, OutboundStatus};
use crate::store::{LineRow, OutboundRow, Units};

/// Aggregate type of the WMS's events: routes to topic `outbox.event.outbound`.
pub const AGGREGATE_TYPE: &str = "outbound";

/// The WMS's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// An outbound was created for a paid order whose stock is reserved.
    OutboundCreated,
    /// Picking stopped: a refund or cancellation holds the order.
    OutboundIntercepted,
    /// The holds were released: an intercepted outbound is `CREATED` again, a recalled one
    /// `SHIPPED` again.
    OutboundResumed,
    /// The outbound will never ship; its reserved stock can be released.
    OutboundCancelled,
    /// A refund by line succeeded before shipping: its units were taken out of the outbound
    /// (`cancelled_lines`), the rest ships; their reserved stock can be released.
    OutboundLinesCancelled,
    /// The parcel left with the carrier.
    OutboundShipped,
    /// A shipped outbound's order was refunded: a return is expected.
    OutboundRecalled,
    /// A return arrived back in the warehouse (`received_lines`; every shipped unit when the
    /// outbound is `RETURNED`, some when it is `SHIPPED` again); its stock can be put back.
    ReturnReceived,
}

impl EventType {
    /// The `event_type` column and header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutboundCreated => "OutboundCreated",
            Self::OutboundIntercepted => "OutboundIntercepted",
            Self::OutboundResumed => "OutboundResumed",
            Self::OutboundCancelled => "OutboundCancelled",
            Self::OutboundLinesCancelled => "OutboundLinesCancelled",
            Self::OutboundShipped => "OutboundShipped",
            Self::OutboundRecalled => "OutboundRecalled",
            Self::ReturnReceived => "ReturnReceived",
        }
    }

    /// The event announcing a hold-driven move `from -> to` ([`OutboundStatus::settle`]).
    pub fn for_settlement(from: OutboundStatus, to: OutboundStatus) -> Option<Self> {
        use OutboundStatus::*;
        match (from, to) {
            (Created, Intercepted) => Some(Self::OutboundIntercepted),
            (Created | Intercepted, Cancelled) => Some(Self::OutboundCancelled),
            (Intercepted, Created) | (Recall, Shipped) => Some(Self::OutboundResumed),
            (Shipped, Recall) => Some(Self::OutboundRecalled),
            _ => None,
        }
    }
}

/// An outbound with its lines: the HTTP answer and the core of every event.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OutboundView {
    /// The warehouse's number.
    pub outbound_no: String,
    /// The order it fulfils.
    pub order_id: Uuid,
    /// Where it is.
    pub status: OutboundStatus,
    /// What to pick.
    pub lines: Vec<LineRow>,
    /// Carrier, once shipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<String>,
    /// Tracking number, once shipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracking_no: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it was shipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shipped_at: Option<DateTime<Utc>>,
    /// When the return arrived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returned_at: Option<DateTime<Utc>>,
}

impl OutboundView {
    /// Combines a row with its lines.
    pub fn new(row: OutboundRow, lines: Vec<LineRow>) -> Self {
        Self {
            outbound_no: row.outbound_no,
            order_id: row.order_id,
            status: row.status,
            lines,
            carrier: row.carrier,
            tracking_no: row.tracking_no,
            created_at: row.created_at,
            updated_at: row.updated_at,
            shipped_at: row.shipped_at,
            returned_at: row.returned_at,
        }
    }
}

#[derive(Serialize)]
struct Payload<'a> {
    event_type: &'static str,
    #[serde(flatten)]
    outbound: &'a OutboundView,
    #[serde(flatten)]
    detail: &'a Detail<'a>,
}

/// What an event carries besides the outbound.
#[derive(Debug, Default, Serialize)]
pub struct Detail<'a> {
    /// `OutboundLinesCancelled`: the units taken out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_lines: Option<&'a [Units]>,
    /// `OutboundLinesCancelled`: the refund whose success took them out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_no: Option<&'a str>,
    /// `ReturnReceived`: the units this return brought back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received_lines: Option<&'a [Units]>,
}

/// Appends an event to the outbox in the caller's transaction, which holds the order's lock.
///
/// # Errors
/// When the insert fails.
pub async fn append(
    conn: &mut PgConnection,
    event_type: EventType,
    outbound: &OutboundView,
) -> Result<outbox_writer::EnqueuedEvent, outbox_writer::OutboxError> {
    append_with(conn, event_type, outbound, &Detail::default()).await
}

/// [`append`] with what the event carries besides the outbound.
///
/// # Errors
/// When the insert fails.
pub async fn append_with(
    conn: &mut PgConnection,
    event_type: EventType,
    outbound: &OutboundView,
    detail: &Detail<'_>,
) -> Result<outbox_writer::EnqueuedEvent, outbox_writer::OutboxError> {
    // Plain structs of strings, numbers and timestamps always serialize.
    let payload = serde_json::to_value(Payload {
        event_type: event_type.as_str(),
        outbound,
        detail,
    })
    .unwrap_or_default();
    let event = outbox_writer::NewEvent::new(
        AGGREGATE_TYPE,
        &outbound.outbound_no,
        event_type.as_str(),
        &payload,
    );
    let enqueued = outbox_writer::enqueue(&mut *conn, &event).await?;
    tracing::info!(
        outbound.no = %outbound.outbound_no,
        order.id = %outbound.order_id,
        outbound.status = %outbound.status,
        event.id = %enqueued.event_id,
        event.name = event_type.as_str(),
        "Outbound changed"
    );
    Ok(enqueued)
}

/// `StockReserved` (stock consumer, topic `outbox.event.stock`): every line of a paid order
/// is reserved, so the order can be fulfilled.
#[derive(Debug, Clone, Deserialize)]
pub struct StockReserved {
    /// The order.
    pub order_id: Uuid,
    /// What was reserved.
    pub lines: Vec<LineRow>,
}

/// The part of an order event (order service, topic `outbox.event.order`) the WMS reads.
#[derive(Debug, Clone, Deserialize)]
pub struct OrderEvent {
    /// The order.
    pub order_id: Uuid,
    /// The order's status after the change (older producers sent `REFUNDED` in the
    /// `RefundSucceeded` that took everything back before shipping).
    #[serde(default)]
    pub status: Option<String>,
    /// What may still be refunded after the change (paid minus refunds requested or
    /// succeeded; absent from older producers).
    #[serde(default)]
    pub refundable_cents: Option<i64>,
    /// The refund of `Refund*` events.
    #[serde(default)]
    pub refund: Option<RefundRef>,
    /// In `RefundSucceeded`: refunds now give back everything paid of an order not shipped.
    #[serde(default)]
    pub refunded_in_full: bool,
    /// Why fulfilment waits, in `OrderHeld`.
    #[serde(default)]
    pub hold: Option<HoldRef>,
}

/// The reason inside an `OrderHeld`.
#[derive(Debug, Clone, Deserialize)]
pub struct HoldRef {
    /// E.g. `trade_closed`.
    pub reason: String,
}

/// A refund inside an order event.
#[derive(Debug, Clone, Deserialize)]
pub struct RefundRef {
    /// The merchant's refund number.
    pub refund_no: String,
    /// `REFUND_ONLY` or `RETURN_AND_REFUND` (absent from older producers: return and refund).
    #[serde(default)]
    pub kind: Option<String>,
    /// The units a return-and-refund takes back; empty (or absent, from older producers): the
    /// whole order.
    #[serde(default)]
    pub lines: Vec<Units>,
}

impl OrderEvent {
    fn refund_only(&self) -> bool {
        self.refund
            .as_ref()
            .and_then(|r| r.kind.as_deref())
            .is_some_and(|k| k == "REFUND_ONLY")
    }

    /// How a refund's request (or a change of its terms) changes its hold. A return-and-refund
    /// holds fulfilment: the goods must not leave, or must come back. A refund-only (a price
    /// adjustment, or goods the buyer keeps) does not, unless it leaves nothing of the order
    /// paid (`refundable_cents` 0): shipping that would send the goods for nothing.
    pub fn refund_request_hold(&self) -> HoldChange {
        if self.refund_only() && self.refundable_cents.is_some_and(|c| c > 0) {
            HoldChange::Release
        } else {
            HoldChange::Open
        }
    }

    /// The units the event's refund takes back; `None`: the whole order. Only a
    /// return-and-refund names units: lines on a refund-only (which the order service refuses)
    /// are ignored, so such a refund that holds fulfilment holds all of it.
    pub fn refund_lines(&self) -> Option<&[Units]> {
        if self.refund_only() {
            return None;
        }
        self.refund
            .as_ref()
            .map(|r| r.lines.as_slice())
            .filter(|l| !l.is_empty())
    }

    /// How a refund's success changes its hold: an order refunded in full will never ship (a
    /// parcel that left is recalled); a return-and-refund keeps a shipped parcel recalled, and
    /// one by line takes its units out of a parcel that has not left; a refund-only (a price
    /// adjustment, or goods the buyer keeps) releases the hold and fulfilment goes on.
    /// `refunded_in_full` says "in full" (the order stays `PAID` until this WMS reports the
    /// outbound cancelled); `REFUNDED` is what older producers sent.
    pub fn refund_success_hold(&self) -> HoldChange {
        if self.refunded_in_full || self.status.as_deref() == Some("REFUNDED") {
            HoldChange::MakePermanent
        } else if self.refund_only() {
            HoldChange::Release
        } else if self.refund_lines().is_some() {
            HoldChange::CutIfUnshipped
        } else {
            HoldChange::PermanentIfShipped
        }
    }
}

/// The hold a refund puts on its order.
pub fn refund_hold(refund_no: &str) -> String {
    format!("refund:{refund_no}")
}

/// The hold an `OrderHeld` puts on its order.
pub fn order_hold(reason: &str) -> String {
    format!("held:{reason}")
}

/// The hold a cancellation puts on its order.
pub const CANCELLED_HOLD: &str = "order-cancelled";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hold_move_is_announced() {
        use crate::domain::{Holds, OutboundStatus::*};
        for from in [Created, Intercepted, Cancelled, Shipped, Recall, Returned] {
            for (active, permanent) in [(false, false), (true, false), (true, true)] {
                let to = from.settle(Holds { active, permanent });
                assert_eq!(
                    EventType::for_settlement(from, to).is_some(),
                    from != to,
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn order_events_parse_from_the_order_service_payload() {
        let e: OrderEvent = serde_json::from_value(serde_json::json!({
            "event_type": "RefundRequested",
            "order_id": "7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90",
            "status": "PAID",
            "items": [],
            "refund": {"refund_no": "R-1", "amount_cents": 100}
        }))
        .unwrap();
        assert_eq!(e.refund.as_ref().unwrap().refund_no, "R-1");
    }

    #[test]
    fn a_refund_only_request_holds_fulfilment_only_when_it_leaves_nothing_paid() {
        let event = |kind: Option<&str>, refundable: Option<i64>| -> OrderEvent {
            serde_json::from_value(serde_json::json!({
                "order_id": "7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90",
                "status": "PAID",
                "refundable_cents": refundable,
                "refund": {"refund_no": "R-1", "kind": kind}
            }))
            .unwrap()
        };
        let table = [
            (Some("REFUND_ONLY"), Some(900), HoldChange::Release),
            (Some("REFUND_ONLY"), Some(0), HoldChange::Open),
            (Some("REFUND_ONLY"), None, HoldChange::Open),
            (Some("RETURN_AND_REFUND"), Some(900), HoldChange::Open),
            (None, Some(900), HoldChange::Open),
        ];
        for (kind, refundable, change) in table {
            assert_eq!(
                event(kind, refundable).refund_request_hold(),
                change,
                "{kind:?} {refundable:?}"
            );
        }
    }

    #[test]
    fn a_refund_names_units_only_as_a_return_with_lines() {
        let event = |kind: Option<&str>, lines: serde_json::Value, in_full: bool| -> OrderEvent {
            serde_json::from_value(serde_json::json!({
                "order_id": "7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90",
                "status": "PAID",
                "refunded_in_full": in_full,
                "refund": {"refund_no": "R-1", "kind": kind, "lines": lines}
            }))
            .unwrap()
        };
        let one = serde_json::json!([{"sku_id": "A", "quantity": 1}]);
        let e = event(Some("RETURN_AND_REFUND"), one.clone(), false);
        assert_eq!(
            e.refund_lines(),
            Some(
                &[Units {
                    sku_id: "A".into(),
                    quantity: 1
                }][..]
            )
        );
        assert_eq!(e.refund_success_hold(), HoldChange::CutIfUnshipped);
        assert_eq!(
            event(Some("RETURN_AND_REFUND"), one.clone(), true).refund_success_hold(),
            HoldChange::MakePermanent,
            "in full keeps its meaning, lines or not"
        );
        let whole = event(Some("RETURN_AND_REFUND"), serde_json::json!([]), false);
        assert_eq!(whole.refund_lines(), None, "empty: the whole order");
        assert_eq!(whole.refund_success_hold(), HoldChange::PermanentIfShipped);
        assert_eq!(
            event(None, one.clone(), false)
                .refund_lines()
                .map(<[_]>::len),
            Some(1),
            "no kind: a return and refund"
        );
        assert_eq!(
            event(Some("REFUND_ONLY"), one, false).refund_lines(),
            None,
            "a refund-only names no units"
        );
    }

    #[test]
    fn only_a_full_refund_or_a_return_holds_fulfilment_for_good() {
        let event = |status: &str, kind: Option<&str>| -> OrderEvent {
            serde_json::from_value(serde_json::json!({
                "order_id": "7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90",
                "status": status,
                "refund": {"refund_no": "R-1", "kind": kind}
            }))
            .unwrap()
        };
        let table = [
            ("REFUNDED", Some("REFUND_ONLY"), HoldChange::MakePermanent),
            (
                "REFUNDED",
                Some("RETURN_AND_REFUND"),
                HoldChange::MakePermanent,
            ),
            ("PAID", Some("REFUND_ONLY"), HoldChange::Release),
            ("SHIPPED", Some("REFUND_ONLY"), HoldChange::Release),
            (
                "PAID",
                Some("RETURN_AND_REFUND"),
                HoldChange::PermanentIfShipped,
            ),
            ("SHIPPED", None, HoldChange::PermanentIfShipped),
        ];
        for (status, kind, change) in table {
            assert_eq!(
                event(status, kind).refund_success_hold(),
                change,
                "{status} {kind:?}"
            );
        }
    }
}
