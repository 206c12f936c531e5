//! `POST /payments/callback` and `POST /refunds/callback`: the provider's signed
//! notifications. The timestamped signature (`X-Signature-Timestamp`, and `X-Signature` over
//! `"<timestamp>.<body>"`) is checked before anything else, and the timestamp must be within
//! the replay window (401 otherwise, nothing read); a recognised notification is always
//! answered `200 {"result": "success"}`, duplicates included, so the provider stops repeating
//! it.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use outbox_http::service::extract::{parse_json, Body};
use outbox_http::service::{ApiError, ErrorBody};

use super::{AppState, CallbackAck, BODY_TOO_LARGE, SIGNATURE, SIGNATURE_TIMESTAMP};
use crate::error::Error;
use crate::payments::{self, PaymentCallbackBody, PaymentNotice, PaymentOutcome};
use crate::refunds::{self, RefundCallbackBody, RefundNotice};
use crate::signature::CallbackSecret;

/// The body, once its timestamped signature is verified and its timestamp is inside the
/// replay window.
fn verified_callback(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Error> {
    let body = body.0;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let now = chrono::Utc::now().timestamp();
    state.secret.verify_at(
        &body,
        header(SIGNATURE_TIMESTAMP),
        header(SIGNATURE),
        now,
        state.replay_window,
    )?;
    Ok(body)
}

/// The body, once its body-only signature is verified (marketplace pushes).
pub(super) fn verified(
    secret: &CallbackSecret,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, Error> {
    let body = body.0;
    let signature = headers
        .get(SIGNATURE)
        .and_then(|v| v.to_str().ok())
        .ok_or(Error::InvalidSignature)?;
    if !secret.verify(&body, signature) {
        return Err(Error::InvalidSignature);
    }
    Ok(body)
}

fn success() -> Json<CallbackAck> {
    Json(CallbackAck {
        result: "success".to_owned(),
    })
}

outbox_http::error_answers!(
    /// The answers of a signed callback to a signature it refuses, a body over the limit, or a
    /// field that is not valid.
    CallbackRefused {
        401 => "`invalid_signature`, `invalid_signature_timestamp` or `stale_signature` (outside the replay window)",
        413 => BODY_TOO_LARGE,
        422 => "`validation_failed`",
    }
);

/// The payment provider's notification that an order was paid. Without a valid timestamped
/// signature it answers 401 and reads nothing.
#[utoipa::path(
    post,
    path = "/payments/callback",
    tag = "callbacks",
    params(("X-Signature" = String, Header, description = "Hex HMAC-SHA256 of `<timestamp>.<raw body>` with the callback secret"), ("X-Signature-Timestamp" = i64, Header, description = "Signing time, Unix seconds; must be within the replay window")),
    request_body(content = PaymentCallbackBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Recognised (duplicates included)", body = CallbackAck),
        (status = 400, description = "`malformed_json`, `unreadable_body` or `amount_mismatch`", body = ErrorBody),
        (status = 404, description = "`order_not_found`", body = ErrorBody),
        (status = 409, description = "`transaction_id_reused` or `conflict`", body = ErrorBody),
        CallbackRefused,
    )
)]
pub(super) async fn payment_callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CallbackAck>, ApiError> {
    let body = verified_callback(&state, &headers, body)?;
    let body: PaymentCallbackBody = parse_json(&body)?;
    let notice = PaymentNotice::try_from(body)?;
    let outcome = payments::apply(&state.pool, &notice).await?;
    state
        .metrics
        .payment_callbacks
        .with_label_values(&[outcome.as_str()])
        .inc();
    if let PaymentOutcome::FlaggedForRefund(reason) = outcome {
        state
            .metrics
            .payments_flagged_for_refund
            .with_label_values(&[reason.as_str()])
            .inc();
    }
    Ok(success())
}

/// The payment provider's notification that a refund succeeded or closed. Without a valid
/// timestamped signature it answers 401 and reads nothing.
#[utoipa::path(
    post,
    path = "/refunds/callback",
    tag = "callbacks",
    params(("X-Signature" = String, Header, description = "Hex HMAC-SHA256 of `<timestamp>.<raw body>` with the callback secret"), ("X-Signature-Timestamp" = i64, Header, description = "Signing time, Unix seconds; must be within the replay window")),
    request_body(content = RefundCallbackBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Recognised (duplicates and stale snapshots included)", body = CallbackAck),
        (status = 400, description = "`malformed_json` or `unreadable_body`", body = ErrorBody),
        (status = 404, description = "`refund_not_found`", body = ErrorBody),
        (status = 409, description = "`illegal_transition` or `conflict`", body = ErrorBody),
        CallbackRefused,
    )
)]
pub(super) async fn refund_callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CallbackAck>, ApiError> {
    let body = verified_callback(&state, &headers, body)?;
    let body: RefundCallbackBody = parse_json(&body)?;
    let notice = RefundNotice::try_from(body)?;
    let outcome = refunds::apply_notice(&state.pool, &notice).await?;
    state
        .metrics
        .refund_callbacks
        .with_label_values(&[outcome.as_str()])
        .inc();
    Ok(success())
}
