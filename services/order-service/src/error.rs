//! The errors of the service core, one variant per way a request can fail. The HTTP layer
//! maps each to a status and a stable `code` (`http::error`); every one of them leaves the
//! database unchanged, because the transaction it happened in is rolled back.

use crate::domain::{OrderStatus, ValidationError};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of the request is invalid (422).
    #[error("invalid request: {0}")]
    Validation(#[from] ValidationError),
    /// The `Idempotency-Key` header is missing or not 1–128 printable characters (400).
    #[error("invalid Idempotency-Key header: {0}")]
    InvalidIdempotencyKey(String),
    /// A client-chosen identifier starts with the marketplace channel's prefix
    /// (`marketplace:`), which only the channel may use (400).
    #[error("{field} must not start with `marketplace:`: that prefix is reserved for the marketplace channel")]
    ReservedNamespace {
        /// The request field.
        field: &'static str,
    },
    /// The idempotency key was used before with a different request (422).
    #[error("this Idempotency-Key was already used with a different request")]
    IdempotencyKeyReused,
    /// The order refers to a SKU that is not in the catalog (422).
    #[error("unknown SKU `{0}`")]
    UnknownSku(String),
    /// A callback's `X-Signature` is missing or wrong (401).
    #[error("missing or invalid signature")]
    InvalidSignature,
    /// A callback's timestamped signature was refused: wrong, or its timestamp missing or
    /// outside the replay window (401).
    #[error("{0}")]
    Signature(#[from] outbox_http::signature::SignatureError),
    /// No valid bearer token, or not the role the endpoint needs (401 / 403).
    #[error("{0}")]
    Auth(#[from] outbox_http::auth::AuthError),
    /// No order has this id (404).
    #[error("order not found")]
    OrderNotFound,
    /// No refund has this number (404).
    #[error("refund not found")]
    RefundNotFound,
    /// A payment's amount differs from the order's (400).
    #[error("payment amount {received_cents} does not match the order amount {expected_cents}")]
    AmountMismatch {
        /// The order amount.
        expected_cents: i64,
        /// What the notification says was paid.
        received_cents: i64,
    },
    /// The order's current state does not allow the requested change (409).
    #[error("order is {current}; cannot {action}")]
    IllegalTransition {
        /// The order's state now.
        current: OrderStatus,
        /// What was asked (`cancel`, `refund`).
        action: &'static str,
    },
    /// The payment transaction id is already recorded for another order (409).
    #[error("transaction id already recorded for another order")]
    TransactionIdReused,
    /// The refund number exists with a different order, amount or reason (422).
    #[error("refund_no already used for a different refund")]
    RefundNoReused,
    /// The refund asks for more than was paid minus earlier refunds (422).
    #[error("refund exceeds the refundable amount of {refundable_cents} cents")]
    RefundExceedsPaid {
        /// What may still be refunded.
        refundable_cents: i64,
    },
    /// A refund takes back more units of a line than the order has left to take back (not
    /// ordered, or taken back by its other refunds that were not closed) (422).
    #[error(
        "refund takes back more of `{sku_id}` than the order has left: {refundable_quantity} units"
    )]
    RefundExceedsLine {
        /// The line's SKU.
        sku_id: String,
        /// Units of it no other live refund takes back (0 for a SKU the order does not have).
        refundable_quantity: i32,
    },
    /// A marketplace message's `type` is not one we know (422).
    #[error("unknown message type `{0}`; expected TradeSync or RefundSync")]
    UnknownMessageType(String),
    /// A marketplace refund names a trade we have not seen yet (409; sent again later, or
    /// fetched by compensation, it applies).
    #[error("unknown marketplace order; send its TradeSync first")]
    ChannelOrderUnknown,
    /// The marketplace's API could not be asked (503).
    #[error("the marketplace is unavailable: {0}")]
    PlatformUnavailable(String),
    /// The marketplace channel has no secret configured (404).
    #[error("the marketplace channel is not configured (MARKETPLACE_SECRET)")]
    ChannelDisabled,
    /// Another request with the same idempotency key kept the key busy; retry (503).
    #[error("a request with this Idempotency-Key is still being processed; retry")]
    KeyBusy,
    /// Stored data contradicts an invariant the service keeps; a bug (500).
    #[error("invariant violated: {0}")]
    Invariant(&'static str),
    /// The database failed or refused a statement.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// Writing the outbox event failed.
    #[error("outbox write failed")]
    Outbox(#[from] outbox_writer::OutboxError),
    /// A response or event could not be serialized.
    #[error("serialization failed")]
    Serialize(#[source] serde_json::Error),
}

impl Error {
    /// Whether the client may retry the same request unchanged and expect it to work: the
    /// database was unreachable, busy or chose this transaction as a deadlock victim.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(e) | Self::Outbox(outbox_writer::OutboxError::Database(e)) => {
                outbox_writer::db::is_retryable(e)
            }
            Self::KeyBusy | Self::PlatformUnavailable(_) => true,
            _ => false,
        }
    }

    /// The constraint a database error names, if any (e.g. a unique violation's index).
    pub fn constraint(&self) -> Option<&str> {
        match self {
            Self::Database(sqlx::Error::Database(e))
            | Self::Outbox(outbox_writer::OutboxError::Database(sqlx::Error::Database(e))) => {
                e.constraint()
            }
            _ => None,
        }
    }

    /// Whether the database refused a write because a unique key or check already holds
    /// something else: the request conflicts with the state, it is not a server fault.
    pub fn is_constraint_violation(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Database(e)) => {
                e.is_unique_violation() || e.is_check_violation() || e.is_foreign_key_violation()
            }
            _ => false,
        }
    }
}
