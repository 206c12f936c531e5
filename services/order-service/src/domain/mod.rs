//! The order domain's vocabulary: validated newtypes for identifiers and money, and the order
//! and refund state machines. Requests are parsed into these types at the edge (`TryFrom` of
//! the wire bodies); the core never re-checks them.

mod event_type;
mod ids;
pub mod lifecycle;
mod money;
mod status;

pub use event_type::EventType;
pub use ids::{
    IdempotencyKey, OrderId, RefundNo, RefundReason, SkuId, SkuName, TransactionId, UserId,
};
pub use lifecycle::{LifecycleEvent, Transition};
pub use money::{Cents, Quantity};
pub use status::{OrderStatus, RefundKind, RefundOutcome, RefundStatus, UnknownStatus};

/// A field of a request failed validation (the one shared type: `field` is a JSON path such as
/// `items[2].quantity`).
pub use outbox_http::validate::ValidationError;
