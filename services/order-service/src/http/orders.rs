//! `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/cancel`, `.../deliver`,
//! `.../complete`, `POST /orders/{id}/refunds`.
//!
//! The caller is the bearer token's `sub` ([`Customer`]): orders are created for it, and an
//! order of someone else answers 404 as if it did not exist, so order ids don't leak. Operators
//! (`roles: ["operator"]`) may read and act on every order; `deliver` (the carrier's report,
//! relayed by operations) is operator-only.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use outbox_http::auth::{AuthError, Customer, Operator};
use outbox_http::service::extract::{Body, Path};
use outbox_http::service::{ApiError, ErrorBody, OperatorOnly};

use super::{AppState, BodyTooLarge, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::domain::{IdempotencyKey, LifecycleEvent, OrderId, UserId};
use crate::error::Error;
use crate::orders::{self, parse_order_id, CreateOrderBody, NewOrder};
use crate::refunds::{self, RefundBody, RefundRequest};
use crate::views::{OrderDetail, OrderView, RefundView};

outbox_http::error_answers!(
    /// The answers of an operation on the order its path names to a path it cannot decode, or
    /// one that names no order the caller may see.
    OrderPath {
        400 => "`invalid_path`",
        404 => "`order_not_found` (also another customer's order)",
    }
);

outbox_http::error_answers!(
    /// The answer of an operation that moves an order to a change its state does not allow.
    IllegalTransition {
        409 => "`illegal_transition` (`current_status` says where it is) or `conflict`",
    }
);

/// The `Idempotency-Key` header, validated.
fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, Error> {
    let raw = headers
        .get(IDEMPOTENCY_KEY)
        .ok_or_else(|| Error::InvalidIdempotencyKey("the header is required".to_owned()))?;
    let text = raw.to_str().map_err(|_| {
        Error::InvalidIdempotencyKey("must be printable ASCII characters".to_owned())
    })?;
    IdempotencyKey::parse("Idempotency-Key", text.to_owned())
        .map_err(|e| Error::InvalidIdempotencyKey(e.message))
}

/// The caller's user id, validated like any user id. A `sub` in the marketplace's namespace
/// (`marketplace:...`, the user ids of platform buyers) is refused: no token makes its bearer
/// a platform buyer.
fn user_of(caller: &Customer) -> Result<UserId, Error> {
    if crate::channel::in_namespace(&caller.user_id) {
        return Err(Error::Auth(AuthError::InvalidToken(
            "the token's `sub` is in the marketplace's reserved namespace",
        )));
    }
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
        let user = user_of(caller)?;
        orders::check_owner(&state.pool, order_id, user.as_str()).await?;
    }
    Ok(order_id)
}

fn replayed(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Creates an order of the caller (the token's `sub`; prices from the catalog). The same
/// `Idempotency-Key` with the same request answers the original response again, with
/// `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/orders",
    tag = "orders",
    security(("bearerAuth" = [])),
    params(("Idempotency-Key" = inline(IdempotencyKey), Header, description = "The client's key for this request; scoped to the caller")),
    request_body(content = CreateOrderBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Created, or replayed", body = OrderView,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer")),
            links(
                ("GetOrder" = (operation_id = "get_order", parameters(("order_id" = "$response.body#/order_id")))),
                ("CancelOrder" = (operation_id = "cancel_order", parameters(("order_id" = "$response.body#/order_id")))),
                ("DeliverOrder" = (operation_id = "deliver_order", parameters(("order_id" = "$response.body#/order_id")))),
                ("CompleteOrder" = (operation_id = "complete_order", parameters(("order_id" = "$response.body#/order_id")))),
                ("RequestRefund" = (operation_id = "request_refund", parameters(("order_id" = "$response.body#/order_id")))),
            )),
        (status = 400, description = "`invalid_idempotency_key`, `malformed_json` or `unreadable_body`", body = ErrorBody),
        (status = 409, description = "`conflict` with the current state", body = ErrorBody),
        (status = 422, description = "`validation_failed`, `unknown_sku` or `idempotency_key_reused`", body = ErrorBody),
        BodyTooLarge,
    )
)]
pub(super) async fn create_order(
    caller: Customer,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let user_id = user_of(&caller)?;
    let key = idempotency_key(&headers)?;
    let body: CreateOrderBody = body.json()?;
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

/// The order with its payments and refunds: the caller's own, or any for an operator.
#[utoipa::path(
    get,
    path = "/orders/{order_id}",
    tag = "orders",
    security(("bearerAuth" = [])),
    params(("order_id" = Uuid, Path, description = "The order; anything but a UUID names no order (404)")),
    responses(
        (status = 200, description = "The order", body = OrderDetail),
        OrderPath,
    )
)]
pub(super) async fn get_order(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, ApiError> {
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

/// Cancels an order before shipping (a paid one is refunded in full).
#[utoipa::path(
    post,
    path = "/orders/{order_id}/cancel",
    tag = "orders",
    security(("bearerAuth" = [])),
    params(("order_id" = Uuid, Path, description = "The order; anything but a UUID names no order (404)")),
    responses(
        (status = 200, description = "The order (cancelled, or already cancelled)", body = OrderView),
        OrderPath,
        IllegalTransition,
    )
)]
pub(super) async fn cancel_order(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, ApiError> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let cancelled = move_order(&state, order_id, LifecycleEvent::Cancel).await?;
    if cancelled.changed {
        state.metrics.orders_cancelled.inc();
    }
    Ok(Json(cancelled.order).into_response())
}

/// `POST /orders/{id}/deliver`: the carrier reports the parcel signed (operator role: the
/// carrier's report reaches us through operations, never from the buyer).
#[utoipa::path(
    post,
    path = "/orders/{order_id}/deliver",
    tag = "orders",
    security(("bearerAuth" = [])),
    params(("order_id" = Uuid, Path, description = "The order; anything but a UUID names no order (404)")),
    responses(
        (status = 200, description = "The order", body = OrderView),
        (status = 400, description = "`invalid_path`", body = ErrorBody),
        (status = 404, description = "`order_not_found`", body = ErrorBody),
        IllegalTransition,
        OperatorOnly,
    )
)]
pub(super) async fn deliver_order(
    _operator: Operator,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, ApiError> {
    let moved = move_order(&state, parse_order_id(&order_id)?, LifecycleEvent::Deliver).await?;
    Ok(Json(moved.order).into_response())
}

/// `POST /orders/{id}/complete`: the buyer confirmed receipt (the owner, or an operator).
#[utoipa::path(
    post,
    path = "/orders/{order_id}/complete",
    tag = "orders",
    security(("bearerAuth" = [])),
    params(("order_id" = Uuid, Path, description = "The order; anything but a UUID names no order (404)")),
    responses(
        (status = 200, description = "The order", body = OrderView),
        OrderPath,
        IllegalTransition,
    )
)]
pub(super) async fn complete_order(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, ApiError> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let moved = move_order(&state, order_id, LifecycleEvent::Complete).await?;
    Ok(Json(moved.order).into_response())
}

/// Asks for a refund of (part of) what was paid; the same `refund_no` with the same request
/// answers the refund again with `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/orders/{order_id}/refunds",
    tag = "orders",
    security(("bearerAuth" = [])),
    params(("order_id" = Uuid, Path, description = "The order; anything but a UUID names no order (404)")),
    request_body(content = RefundBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Requested, or replayed", body = RefundView,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`malformed_json`, `unreadable_body`, `invalid_path` or `reserved_namespace` (a `refund_no` starting with `marketplace:`, the channel's)", body = ErrorBody),
        (status = 404, description = "`order_not_found` (also another customer's order)", body = ErrorBody),
        (status = 409, description = "`illegal_transition` or `conflict`", body = ErrorBody),
        (status = 422, description = "`validation_failed`, `refund_exceeds_paid` or `refund_no_reused`", body = ErrorBody),
        BodyTooLarge,
    )
)]
pub(super) async fn request_refund(
    caller: Customer,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let order_id = visible_order(&state, &caller, &order_id).await?;
    let body: RefundBody = body.json()?;
    if crate::channel::in_namespace(&body.refund_no) {
        return Err(Error::ReservedNamespace { field: "refund_no" }.into());
    }
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
