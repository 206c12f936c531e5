//! `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/cancel`, `.../deliver`,
//! `.../complete`, `POST /orders/{id}/refunds`.
//!
//! The caller is the bearer token's `sub` ([`Customer`]): orders are created for it, and an
//! order of someone else answers 404 as if it did not exist, so order ids don't leak. Operators
//! (`roles: ["operator"]`) may read and act on every order; `deliver` (the carrier's report,
//! relayed by operations) is operator-only.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use outbox_kit::auth::{AuthError, Customer, Operator};

use super::{body_bytes, parse_json, AppState, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::domain::{IdempotencyKey, LifecycleEvent, OrderId, UserId};
use crate::error::Error;
use crate::orders::{self, parse_order_id, CreateOrderBody, NewOrder};
use crate::refunds::{self, RefundBody, RefundRequest};

/// The `Idempotency-Key` header, validated.
fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, Error> {
    let raw = headers
        .get(IDEMPOTENCY_KEY)
        .ok_or_else(|| Error::InvalidIdempotencyKey("the header is required".to_owned()))?;
    let text = raw.to_str().map_err(|_| {
        Error::InvalidIdempotencyKey("must be printable ASCII characters".to_owned())
    })?;
    IdempotencyKey::parse("Idempotency-Key", text.to_owned())
        .map_err(|e| Error::InvalidIdempotencyKey(e.reason))
}

/// The caller's user id, validated like any user id.
fn user_of(caller: &Customer) -> Result<UserId, Error> {
    UserId::parse("sub", caller.user_id.clone()).map_err(|_| {
        Error::Auth(AuthError::InvalidToken(
            "the token's `sub` is not a valid user id",
        ))
    })
}

/// The order id of the path, if the caller may see that order: its owner, or an operator.
/// Anyone else's order is [`Error::OrderNotFound`], like a missing one.
async fn visible_order(
    state: &AppState,
    caller: &Customer,
    order_id: &str,
) -> Result<OrderId, Error> {
    let order_id = parse_order_id(order_id)?;
    if !caller.is_operator {
        orders::check_owner(&state.pool, order_id, &caller.user_id).await?;
    }
    Ok(order_id)
}

fn replayed(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

pub(super) async fn create_order(
    caller: Customer,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let user_id = user_of(&caller)?;
    let key = idempotency_key(&headers)?;
    let body: CreateOrderBody = parse_json(&body_bytes(body)?)?;
    let order = NewOrder::parse(user_id, body)?;
    let created = orders::create(&state.pool, &key, &order).await?;
    let status = StatusCode::from_u16(created.status).unwrap_or(StatusCode::CREATED);
    let response = (status, Json(created.body)).into_response();
    if created.replayed {
        state.metrics.idempotent_replays.inc();
        Ok(replayed(response))
    } else {
        state.metrics.orders_created.inc();
        Ok(response)
    }
}

pub(super) async fn get_order(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let detail = orders::get(&state.pool, order_id).await?;
    Ok(Json(detail).into_response())
}

/// Applies a lifecycle `event` to the order at `order_id` and answers the order.
async fn move_order(
    state: &AppState,
    order_id: OrderId,
    event: LifecycleEvent,
) -> Result<orders::Moved, Error> {
    orders::apply_event(&state.pool, order_id, event).await
}

pub(super) async fn cancel_order(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let cancelled = move_order(&state, order_id, LifecycleEvent::Cancel).await?;
    if cancelled.changed {
        state.metrics.orders_cancelled.inc();
    }
    Ok(Json(cancelled.order).into_response())
}

/// `POST /orders/{id}/deliver`: the carrier reports the parcel signed (operator role: the
/// carrier's report reaches us through operations, never from the buyer).
pub(super) async fn deliver_order(
    _operator: Operator,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let moved = move_order(&state, parse_order_id(&order_id)?, LifecycleEvent::Deliver).await?;
    Ok(Json(moved.order).into_response())
}

/// `POST /orders/{id}/complete`: the buyer confirmed receipt (the owner, or an operator).
pub(super) async fn complete_order(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let moved = move_order(&state, order_id, LifecycleEvent::Complete).await?;
    Ok(Json(moved.order).into_response())
}

pub(super) async fn request_refund(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let body: RefundBody = parse_json(&body_bytes(body)?)?;
    let request = RefundRequest::try_from(body)?;
    let created = refunds::request(&state.pool, order_id, &request).await?;
    let response = (StatusCode::CREATED, Json(created.refund)).into_response();
    if created.replayed {
        Ok(replayed(response))
    } else {
        state.metrics.refunds_requested.inc();
        Ok(response)
    }
}
