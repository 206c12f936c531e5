//! `POST /channels/marketplace/push`: the platform's signed `TradeSync` / `RefundSync`
//! messages. The signature over the raw body is checked first (401, nothing read); a message
//! that was handled (applied, or absorbed by a dedupe layer) is answered `200` with its
//! outcome so the platform stops sending it; anything refused is a 4xx and wrote nothing.
//!
//! The push signature covers the body only, as the marketplace signs it (no timestamp): the
//! platform redelivers an unacknowledged message, signed as before, for days, and a replayed
//! message is absorbed by the channel's dedupe (same or older `modified`), so a replay window
//! would refuse the platform's own retries and protect nothing.
//!
//! `POST /channels/marketplace/compensate` (operator role) runs one compensation pass now and
//! answers what it did.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use outbox_kit::auth::Operator;
use serde_json::{json, Value};

use super::callbacks::verified;
use super::{parse_json, AppState};
use crate::channel::{self, ChannelMessage, PushBody, Source};
use crate::error::Error;

pub(super) async fn push(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Error> {
    let secret = state
        .marketplace_secret
        .as_ref()
        .ok_or(Error::ChannelDisabled)?;
    let body = verified(secret, &headers, body)?;
    let body: PushBody = parse_json(&body)?;
    let msg = ChannelMessage::try_from(body)?;
    let outcome = channel::apply(&state.pool, &msg, Source::Push).await?;
    state
        .metrics
        .channel_messages
        .with_label_values(&[Source::Push.as_str(), outcome.as_str()])
        .inc();
    Ok(Json(
        json!({ "result": "success", "outcome": outcome.as_str() }),
    ))
}

pub(super) async fn compensate(
    _operator: Operator,
    State(state): State<AppState>,
) -> Result<Json<Value>, Error> {
    let client = state.marketplace.as_ref().ok_or(Error::ChannelDisabled)?;
    let pass = channel::compensation::run_once(&state.pool, client, &state.metrics)
        .await
        .map_err(|e| match e {
            channel::compensation::CompensationError::Database(e) => Error::Database(e),
            channel::compensation::CompensationError::Platform(e) => {
                Error::PlatformUnavailable(e.to_string())
            }
        })?;
    Ok(Json(serde_json::to_value(pass).map_err(Error::Serialize)?))
}
