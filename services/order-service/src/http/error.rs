//! Errors as responses: the shared envelope ([`ApiError`], `{"error": {"code", "message",
//! ...}}`) with a fitting status. Server
//! faults are logged here, once, with their source chain; clients get no internals.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use outbox_http::service::ApiError;
use outbox_http::signature::SignatureError;

use crate::error::Error;

impl Error {
    /// Status and stable machine-readable code.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            Self::InvalidIdempotencyKey(_) => (StatusCode::BAD_REQUEST, "invalid_idempotency_key"),
            Self::ReservedNamespace { .. } => (StatusCode::BAD_REQUEST, "reserved_namespace"),
            Self::IdempotencyKeyReused => {
                (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
            }
            Self::UnknownSku(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_sku"),
            Self::InvalidSignature | Self::Signature(SignatureError::Invalid) => {
                (StatusCode::UNAUTHORIZED, "invalid_signature")
            }
            Self::Signature(SignatureError::BadTimestamp) => {
                (StatusCode::UNAUTHORIZED, "invalid_signature_timestamp")
            }
            Self::Signature(SignatureError::Stale { .. }) => {
                (StatusCode::UNAUTHORIZED, "stale_signature")
            }
            // Answered by `AuthError`'s own response (with `WWW-Authenticate`).
            Self::Auth(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::OrderNotFound => (StatusCode::NOT_FOUND, "order_not_found"),
            Self::RefundNotFound => (StatusCode::NOT_FOUND, "refund_not_found"),
            Self::AmountMismatch { .. } => (StatusCode::BAD_REQUEST, "amount_mismatch"),
            Self::IllegalTransition { .. } => (StatusCode::CONFLICT, "illegal_transition"),
            Self::TransactionIdReused => (StatusCode::CONFLICT, "transaction_id_reused"),
            Self::RefundNoReused => (StatusCode::UNPROCESSABLE_ENTITY, "refund_no_reused"),
            Self::RefundExceedsPaid { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "refund_exceeds_paid")
            }
            Self::RefundExceedsLine { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "refund_exceeds_line")
            }
            Self::UnknownMessageType(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "unknown_message_type")
            }
            Self::ChannelOrderUnknown => (StatusCode::CONFLICT, "unknown_channel_order"),
            Self::ChannelDisabled => (StatusCode::NOT_FOUND, "channel_disabled"),
            Self::PlatformUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            e if e.is_retryable() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            e if e.is_constraint_violation() => (StatusCode::CONFLICT, "conflict"),
            Self::KeyBusy
            | Self::Invariant(_)
            | Self::Database(_)
            | Self::Outbox(_)
            | Self::Serialize(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// `error` and its sources, joined: what a log line needs to be read on its own.
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        e.into_api_error()
    }
}

impl Error {
    fn into_api_error(self) -> ApiError {
        if let Self::Auth(e) = self {
            // With its own code and `WWW-Authenticate`.
            return e.into();
        }
        let (status, code) = self.status_and_code();
        let message = if status.is_server_error() {
            if status == StatusCode::SERVICE_UNAVAILABLE {
                tracing::warn!(error = %chain(&self), "Request failed on a transient error; client may retry");
                "temporarily unavailable; retry the same request".to_owned()
            } else {
                tracing::error!(error = %chain(&self), "Request failed");
                "internal error".to_owned()
            }
        } else if code == "conflict" {
            tracing::info!(
                error = %chain(&self),
                constraint = self.constraint().unwrap_or(""),
                "Request refused by a database constraint"
            );
            "the request conflicts with the current state".to_owned()
        } else {
            self.to_string()
        };
        let mut error = ApiError::new(status, code, message);
        match &self {
            Self::Validation(v) => error = error.with("field", v.field.clone()),
            Self::ReservedNamespace { field } => error = error.with("field", *field),
            Self::IllegalTransition { current, .. } => {
                error = error.with("current_status", current.as_str());
            }
            Self::AmountMismatch {
                expected_cents,
                received_cents,
            } => {
                error = error
                    .with("expected_cents", *expected_cents)
                    .with("received_cents", *received_cents);
            }
            Self::RefundExceedsPaid { refundable_cents } => {
                error = error.with("refundable_cents", *refundable_cents);
            }
            Self::RefundExceedsLine {
                sku_id,
                refundable_quantity,
            } => {
                error = error
                    .with("sku_id", sku_id.clone())
                    .with("refundable_quantity", *refundable_quantity);
            }
            _ => {}
        }
        error
    }
}
