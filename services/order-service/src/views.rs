//! What the API answers and what events carry: JSON snapshots of orders, payments and refunds,
//! built from database rows ([`OrderView::load`] and [`RefundView::load`] read the lines that
//! go with a row). A snapshot is complete enough for a consumer (WMS, stock) to act on it
//! alone.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{OrderId, OrderStatus, RefundKind, RefundStatus};
use crate::error::Error;
use crate::store::orders::{self, ItemRow, OrderRow};
use crate::store::payments::PaymentRow;
use crate::store::refunds::{self, RefundLineRow, RefundRow};

/// One order line.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ItemView {
    /// The SKU.
    pub sku_id: String,
    /// Catalog name when ordered.
    pub name: String,
    /// Units.
    pub quantity: i32,
    /// Catalog price when ordered, in cents.
    pub unit_price_cents: i64,
    /// `unit_price_cents × quantity`.
    pub line_total_cents: i64,
    /// Units the warehouse received back (a return by line); `quantity` when the whole line
    /// came back.
    pub returned_quantity: i32,
}

impl From<ItemRow> for ItemView {
    fn from(r: ItemRow) -> Self {
        Self {
            sku_id: r.sku_id,
            name: r.name,
            quantity: r.quantity,
            unit_price_cents: r.unit_price_cents,
            line_total_cents: r.line_total_cents,
            returned_quantity: r.returned_quantity,
        }
    }
}

/// An order with its lines: the body of `POST /orders` and the core of every event.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    /// The order's id.
    pub order_id: Uuid,
    /// The buyer.
    pub user_id: String,
    /// Current state.
    pub status: OrderStatus,
    /// Sum of the lines, in cents.
    pub amount_cents: i64,
    /// What the applied payment brought in (0 before payment).
    pub paid_cents: i64,
    /// What may still be refunded: paid minus refunds requested or succeeded.
    pub refundable_cents: i64,
    /// The lines.
    pub items: Vec<ItemView>,
    /// When the order was created.
    pub created_at: DateTime<Utc>,
    /// When it was paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
    /// When it was cancelled, or refunded in full before shipping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<DateTime<Utc>>,
}

impl OrderView {
    /// Combines an order row with its lines.
    pub fn new(order: OrderRow, items: Vec<ItemRow>) -> Self {
        Self {
            order_id: order.order_id,
            user_id: order.user_id,
            status: order.status,
            amount_cents: order.amount_cents,
            paid_cents: order.paid_cents,
            refundable_cents: order.paid_cents - order.refund_reserved_cents,
            items: items.into_iter().map(ItemView::from).collect(),
            created_at: order.created_at,
            paid_at: order.paid_at,
            cancelled_at: order.cancelled_at,
        }
    }

    /// Loads the view of an order whose row the caller holds: the row with its lines.
    ///
    /// # Errors
    /// Database errors.
    pub async fn load(conn: &mut PgConnection, row: OrderRow) -> Result<Self, Error> {
        let items = orders::items(conn, OrderId::from(row.order_id)).await?;
        Ok(Self::new(row, items))
    }
}

/// A received payment.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PaymentView {
    /// The provider's transaction id.
    pub transaction_id: String,
    /// Amount received, in cents.
    pub amount_cents: i64,
    /// `APPLIED` (it paid the order) or `REFUND_REQUIRED` (the money must go back).
    pub disposition: String,
    /// Why a refund is required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag_reason: Option<String>,
    /// How much of a flagged payment must go back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_due_cents: Option<i64>,
    /// When it was first received.
    pub received_at: DateTime<Utc>,
}

impl From<PaymentRow> for PaymentView {
    fn from(r: PaymentRow) -> Self {
        Self {
            transaction_id: r.transaction_id,
            amount_cents: r.amount_cents,
            disposition: r.disposition,
            flag_reason: r.flag_reason,
            refund_due_cents: r.refund_due_cents,
            received_at: r.received_at,
        }
    }
}

/// A refund.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RefundView {
    /// The merchant's refund number.
    pub refund_no: String,
    /// The refunded order.
    pub order_id: Uuid,
    /// Amount, in cents.
    pub amount_cents: i64,
    /// Why.
    pub reason: String,
    /// `REFUND_ONLY` or `RETURN_AND_REFUND`.
    pub kind: RefundKind,
    /// `REQUESTED`, `SUCCEEDED` or `CLOSED`.
    pub status: RefundStatus,
    /// The lines a return-and-refund takes back; empty: the whole order.
    pub lines: Vec<RefundLineView>,
    /// `modified` of the provider snapshot applied (epoch milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_modified_ms: Option<i64>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A line a refund takes back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RefundLineView {
    /// The SKU, a line of the order.
    pub sku_id: String,
    /// Units.
    pub quantity: i32,
}

impl RefundView {
    /// Combines a refund row with its lines.
    pub fn new(r: RefundRow, lines: Vec<RefundLineRow>) -> Self {
        Self {
            lines: lines
                .into_iter()
                .map(|l| RefundLineView {
                    sku_id: l.sku_id,
                    quantity: l.quantity,
                })
                .collect(),
            refund_no: r.refund_no,
            order_id: r.order_id,
            amount_cents: r.amount_cents,
            reason: r.reason,
            kind: r.kind,
            status: r.status,
            provider_modified_ms: r.provider_modified_ms,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }

    /// Loads a refund's view: the row with its lines.
    ///
    /// # Errors
    /// Database errors.
    pub async fn load(conn: &mut PgConnection, row: RefundRow) -> Result<Self, Error> {
        let lines = refunds::lines(conn, &row.refund_no).await?;
        Ok(Self::new(row, lines))
    }
}

/// `GET /orders/{id}`: the order with its payments and refunds.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OrderDetail {
    /// The order and its lines.
    #[serde(flatten)]
    pub order: OrderView,
    /// Sum of succeeded refunds, in cents.
    pub refunded_cents: i64,
    /// Payments received, including ones flagged for refund.
    pub payments: Vec<PaymentView>,
    /// Refunds, oldest first.
    pub refunds: Vec<RefundView>,
}
