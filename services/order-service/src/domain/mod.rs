//! The order domain's vocabulary: validated newtypes for identifiers and money, and the order
//! and refund state machines. Requests are parsed into these types at the edge (`TryFrom` of
//! the wire bodies); the core never re-checks them.

mod ids;
pub mod lifecycle;
mod money;
mod status;

pub use ids::{
    IdempotencyKey, OrderId, RefundNo, RefundReason, SkuId, SkuName, TransactionId, UserId,
};
pub use lifecycle::{LifecycleEvent, Transition};
pub use money::{Cents, Quantity};
pub use status::{OrderStatus, RefundKind, RefundOutcome, RefundStatus, UnknownStatus};

/// A field of a request failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ValidationError {
    /// Where the problem is, as a JSON path (`items[2].quantity`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ValidationError {
    /// A validation error for `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
