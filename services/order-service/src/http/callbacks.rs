//! `POST /payments/callback` and `POST /refunds/callback`: the provider's signed
//! notifications. The timestamped signature (`X-Signature-Timestamp`, and `X-Signature` over
//! `"<timestamp>.<body>"`) is checked before anything else, and the timestamp must be within
//! the replay window (401 otherwise, nothing read); a recognised notification is always
//! answered `200 {"result": "success"}`, duplicates included, so the provider stops repeating
//! it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::{body_bytes, parse_json, AppState, SIGNATURE, SIGNATURE_TIMESTAMP};
use crate::error::Error;
use crate::payments::{self, PaymentCallbackBody, PaymentNotice, PaymentOutcome};
use crate::refunds::{self, RefundCallbackBody, RefundNotice};
use crate::signature::CallbackSecret;

/// The body, once its timestamped signature is verified and its timestamp is inside the
/// replay window.
fn verified_callback(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, Error> {
    let body = body_bytes(body)?;
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
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, Error> {
    let body = body_bytes(body)?;
    let signature = headers
        .get(SIGNATURE)
        .and_then(|v| v.to_str().ok())
        .ok_or(Error::InvalidSignature)?;
    if !secret.verify(&body, signature) {
        return Err(Error::InvalidSignature);
    }
    Ok(body)
}

fn success() -> Json<Value> {
    Json(json!({ "result": "success" }))
}

pub(super) async fn payment_callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Error> {
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

pub(super) async fn refund_callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Error> {
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
