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

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use outbox_http::auth::Operator;
use outbox_http::service::extract::{parse_json, Body};
use outbox_http::service::{ApiError, ErrorBody, OperatorOnly};
use serde::Serialize;
use utoipa::ToSchema;

use super::callbacks::verified;
use super::{AppState, BodyTooLarge};
use crate::channel::compensation::Pass;
use crate::channel::{self, ChannelMessage, PushBody, Source};
use crate::error::Error;

/// The answer to a handled push.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PushAck {
    /// Always `success`.
    #[schema(pattern = "^success$")]
    result: String,
    /// `applied`, `duplicate_message`, `duplicate_change` or `stale`.
    #[schema(pattern = "^(applied|duplicate_message|duplicate_change|stale)$")]
    outcome: String,
}

/// A signed `TradeSync` / `RefundSync` message from the marketplace. Without a valid
/// `X-Signature` it answers 401 and reads nothing; 404 while the channel is not configured.
#[utoipa::path(
    post,
    path = "/channels/marketplace/push",
    tag = "channel",
    params(("X-Signature" = String, Header, description = "Hex HMAC-SHA256 of the raw body with the marketplace secret")),
    request_body(content = PushBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Handled: applied or absorbed as a duplicate", body = PushAck),
        (status = 400, description = "`malformed_json` or `unreadable_body`", body = ErrorBody),
        (status = 401, description = "`invalid_signature`: missing or wrong `X-Signature`", body = ErrorBody),
        (status = 404, description = "`channel_disabled`", body = ErrorBody),
        (status = 409, description = "`unknown_channel_order`, `illegal_transition` or `conflict`", body = ErrorBody),
        (status = 422, description = "`validation_failed` or `unknown_message_type`", body = ErrorBody),
        BodyTooLarge,
    )
)]
pub(super) async fn push(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PushAck>, ApiError> {
    let secret = state
        .marketplace_secret
        .as_ref()
        .ok_or(Error::ChannelDisabled)?;
    let body = verified(secret, &headers, body)?;
    let body: PushBody = parse_json(&body)?;
    let msg = ChannelMessage::try_from(body).map_err(Error::from)?;
    let outcome = channel::apply(&state.pool, &msg, Source::Push).await?;
    state
        .metrics
        .channel_messages
        .with_label_values(&[Source::Push.as_str(), outcome.as_str()])
        .inc();
    Ok(Json(PushAck {
        result: "success".to_owned(),
        outcome: outcome.as_str().to_owned(),
    }))
}

/// Runs one compensation pass now: asks the marketplace what changed and applies what no push
/// brought. Operator role.
#[utoipa::path(
    post,
    path = "/channels/marketplace/compensate",
    tag = "channel",
    security(("bearerAuth" = [])),
    responses(
        (status = 200, description = "What the pass did", body = Pass),
        (status = 404, description = "`channel_disabled`: no marketplace URL configured", body = ErrorBody),
        OperatorOnly,
    )
)]
pub(super) async fn compensate(
    _operator: Operator,
    State(state): State<AppState>,
) -> Result<Json<Pass>, ApiError> {
    let client = state.marketplace.as_ref().ok_or(Error::ChannelDisabled)?;
    let pass = channel::compensation::run_once(&state.pool, client, &state.metrics)
        .await
        .map_err(|e| match e {
            channel::compensation::CompensationError::Database(e) => Error::Database(e),
            channel::compensation::CompensationError::Platform(e) => {
                Error::PlatformUnavailable(e.to_string())
            }
        })?;
    Ok(Json(pass))
}
