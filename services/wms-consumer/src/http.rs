//! The WMS's HTTP API: the warehouse's actions and reads. Handlers parse and validate at the
//! edge, call [`crate::fulfilment`], and map its errors to statuses with stable codes.
//!
//! | endpoint | does |
//! |---|---|
//! | `POST /outbounds/{outbound_no}/ship` `{"carrier","tracking_no"}` | `CREATED -> SHIPPED`; repeat with the same tracking number answers 200 |
//! | `POST /outbounds/{outbound_no}/return-received` | `RECALL -> RETURNED` |
//! | `GET /outbounds/{outbound_no}` | the outbound with its lines |
//! | `GET /outbounds?order_id=` | `{"outbounds": [...]}` of an order (none or one) |
//! | `GET /healthz`, `GET /metrics` | operations (open: serve them on an internal network) |
//!
//! Every endpoint but the operations ones needs a bearer token with the operator role
//! (`outbox_kit::auth`): 401 without a valid token, 403 without the role.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use outbox_kit::auth::Operator;
use outbox_kit::service::ApiError;
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Carrier, OutboundStatus, Shipment, TrackingNo, ValidationError};
use crate::error::Error;
use crate::fulfilment::{self, ActionResult};
use crate::Metrics;

/// Response header set to `true` when an action had been done before.
pub const REPLAYED: &str = "idempotent-replayed";

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The WMS database.
    pub pool: PgPool,
    /// Metrics.
    pub metrics: Metrics,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/outbounds", get(list_outbounds))
        .route("/outbounds/{outbound_no}", get(get_outbound))
        .route("/outbounds/{outbound_no}/ship", post(ship))
        .route(
            "/outbounds/{outbound_no}/return-received",
            post(return_received),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(middleware::from_fn_with_state(
            state.metrics.http_requests.clone(),
            outbox_kit::service::track_requests::<prometheus::IntCounterVec>,
        ))
        .with_state(state)
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    ApiError::new(status, code, message).into_response()
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match &self {
            Error::Validation(v) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_failed",
                message,
            )
            .with("field", v.field.clone())
            .into_response(),
            Error::MalformedJson(_) => error(StatusCode::BAD_REQUEST, "malformed_json", &message),
            Error::OutboundNotFound => error(StatusCode::NOT_FOUND, "outbound_not_found", &message),
            Error::NotShippable { status } => {
                let code = if *status == OutboundStatus::Cancelled {
                    "outbound_cancelled"
                } else {
                    "outbound_intercepted"
                };
                error(StatusCode::CONFLICT, code, &message)
            }
            Error::AlreadyShipped { .. } => {
                error(StatusCode::CONFLICT, "already_shipped", &message)
            }
            Error::TrackingNoInUse => error(StatusCode::CONFLICT, "tracking_no_in_use", &message),
            Error::NoReturnExpected { .. } => {
                error(StatusCode::CONFLICT, "no_return_expected", &message)
            }
            _ if self.is_retryable() => {
                tracing::warn!(error = %message, "Database unavailable; request may be retried");
                ApiError::unavailable("temporarily unavailable; retry").into_response()
            }
            _ => {
                tracing::error!(error = ?self, "Request failed");
                ApiError::internal().into_response()
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct ShipBody {
    carrier: String,
    tracking_no: String,
}

impl TryFrom<ShipBody> for Shipment {
    type Error = ValidationError;

    fn try_from(b: ShipBody) -> Result<Self, Self::Error> {
        Ok(Self {
            carrier: Carrier::parse(b.carrier)?,
            tracking_no: TrackingNo::parse(b.tracking_no)?,
        })
    }
}

fn action_response(result: ActionResult) -> Response {
    let mut r = Json(&result.outbound).into_response();
    if result.replayed {
        r.headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    r
}

async fn ship(
    _operator: Operator,
    State(state): State<AppState>,
    Path(outbound_no): Path<String>,
    body: Bytes,
) -> Result<Response, Error> {
    let body: ShipBody = serde_json::from_slice(&body).map_err(Error::MalformedJson)?;
    let shipment = Shipment::try_from(body)?;
    let result = fulfilment::ship(&state.pool, &outbound_no, &shipment).await?;
    Ok(action_response(result))
}

async fn return_received(
    _operator: Operator,
    State(state): State<AppState>,
    Path(outbound_no): Path<String>,
) -> Result<Response, Error> {
    let result = fulfilment::return_received(&state.pool, &outbound_no).await?;
    Ok(action_response(result))
}

async fn get_outbound(
    _operator: Operator,
    State(state): State<AppState>,
    Path(outbound_no): Path<String>,
) -> Result<Response, Error> {
    Ok(Json(fulfilment::get(&state.pool, &outbound_no).await?).into_response())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    order_id: Option<String>,
}

async fn list_outbounds(
    _operator: Operator,
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Response, Error> {
    let text = q
        .order_id
        .ok_or_else(|| ValidationError::new("order_id", "is required"))?;
    let order_id =
        Uuid::parse_str(&text).map_err(|_| ValidationError::new("order_id", "must be a UUID"))?;
    let outbounds = fulfilment::for_order(&state.pool, order_id).await?;
    Ok(Json(json!({ "outbounds": outbounds })).into_response())
}

async fn healthz(State(state): State<AppState>) -> Response {
    let up = state.metrics.consumer.up.get() == 1;
    outbox_kit::service::healthz(&state.pool, Some(up)).await
}

async fn metrics(State(state): State<AppState>) -> Response {
    outbox_kit::service::metrics_response(&state.metrics.registry)
}
