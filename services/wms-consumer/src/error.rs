//! The errors of the WMS core, one variant per way a request or an event can fail. The HTTP
//! layer maps each to a status and a stable `code`; the consumer maps them to retry or
//! dead-letter ([`outbox_consumer::HandlerError`]). Every one leaves the database
//! unchanged: the transaction it happened in is rolled back.

use outbox_consumer::HandlerError;

use crate::domain::{OutboundStatus, ValidationError};

/// Why a request or an event failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field is invalid (422).
    #[error("invalid request: {0}")]
    Validation(#[from] ValidationError),
    /// No outbound has this number (404).
    #[error("outbound not found")]
    OutboundNotFound,
    /// The outbound is intercepted or cancelled: it must not ship (409).
    #[error("outbound is {status}; it must not ship")]
    NotShippable {
        /// Its status.
        status: OutboundStatus,
    },
    /// The outbound shipped already with another carrier or tracking number (409).
    #[error("outbound already shipped with tracking number {tracking_no}")]
    AlreadyShipped {
        /// The tracking number it shipped with.
        tracking_no: String,
    },
    /// The tracking number belongs to another outbound (409).
    #[error("tracking number already used for another outbound")]
    TrackingNoInUse,
    /// No return is expected for the outbound (409).
    #[error("outbound is {status}; no return is expected")]
    NoReturnExpected {
        /// Its status.
        status: OutboundStatus,
    },
    /// Stored data contradicts an invariant the service keeps; a bug (500).
    #[error("invariant violated: {0}")]
    Invariant(&'static str),
    /// The database failed or refused a statement.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// Writing the outbox event failed.
    #[error("outbox write failed")]
    Outbox(#[from] outbox_writer::OutboxError),
}

impl Error {
    /// Whether the client may retry unchanged: the database was unreachable or busy.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(e) | Self::Outbox(outbox_writer::OutboxError::Database(e)) => {
                outbox_writer::db::is_retryable(e)
            }
            _ => false,
        }
    }
}

impl From<Error> for HandlerError {
    fn from(e: Error) -> Self {
        match e {
            Error::Database(e) => HandlerError::Database(e),
            Error::Outbox(e) => HandlerError::Outbox(e),
            other => HandlerError::Unapplicable(other.to_string()),
        }
    }
}
