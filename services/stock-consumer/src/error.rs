//! The errors of the stock HTTP API, one variant per way a request can fail; the HTTP layer
//! maps each to a status and a stable `code`. (Consumed events fail with
//! [`outbox_consumer::HandlerError`] instead.)

use crate::domain::ValidationError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field is invalid (422).
    #[error("invalid request: {0}")]
    Validation(#[from] ValidationError),
    /// No stock row for this SKU (404).
    #[error("SKU not found")]
    SkuNotFound,
    /// No reservation for this order (404).
    #[error("reservation not found")]
    ReservationNotFound,
    /// Fewer units than are reserved would be on hand (409).
    #[error("on_hand would be below the reserved units")]
    BelowReserved,
    /// The database failed or refused a statement.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

impl Error {
    /// Whether the client may retry unchanged: the database was unreachable or busy.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(e) => outbox_writer::db::is_retryable(e),
            _ => false,
        }
    }
}
