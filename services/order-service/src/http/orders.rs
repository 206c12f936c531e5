//! `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/cancel`, `.../deliver`,
//! `.../complete`, `POST /orders/{id}/refunds`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{body_bytes, parse_json, AppState, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::domain::{IdempotencyKey, LifecycleEvent};
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

fn replayed(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

pub(super) async fn create_order(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let key = idempotency_key(&headers)?;
    let body: CreateOrderBody = parse_json(&body_bytes(body)?)?;
    let order = NewOrder::try_from(body)?;
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
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let detail = orders::get(&state.pool, parse_order_id(&order_id)?).await?;
    Ok(Json(detail).into_response())
}

/// Applies a lifecycle `event` to the order at `order_id` and answers the order.
async fn move_order(
    state: &AppState,
    order_id: &str,
    event: LifecycleEvent,
) -> Result<orders::Moved, Error> {
    orders::apply_event(&state.pool, parse_order_id(order_id)?, event).await
}

pub(super) async fn cancel_order(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let cancelled = move_order(&state, &order_id, LifecycleEvent::Cancel).await?;
    if cancelled.changed {
        state.metrics.orders_cancelled.inc();
    }
    Ok(Json(cancelled.order).into_response())
}

/// `POST /orders/{id}/deliver`: the carrier reports the parcel signed.
pub(super) async fn deliver_order(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let moved = move_order(&state, &order_id, LifecycleEvent::Deliver).await?;
    Ok(Json(moved.order).into_response())
}

/// `POST /orders/{id}/complete`: the buyer confirmed receipt.
pub(super) async fn complete_order(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, Error> {
    let moved = move_order(&state, &order_id, LifecycleEvent::Complete).await?;
    Ok(Json(moved.order).into_response())
}

pub(super) async fn request_refund(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let order_id = parse_order_id(&order_id)?;
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
