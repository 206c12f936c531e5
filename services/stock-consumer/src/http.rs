//! The stock consumer's HTTP API: warehouse counts per SKU.
//!
//! | endpoint | does |
//! |---|---|
//! | `PUT /stock/{sku_id}` `{"on_hand"}` | sets the units on hand (409 below what is reserved) |
//! | `GET /stock/{sku_id}` | `{sku_id, on_hand, reserved, available, updated_at}` |
//! | `GET /stock` | `{"stock": [...]}` of every SKU |
//! | `GET /healthz`, `GET /metrics` | operations (open: serve them on an internal network) |
//!
//! Every endpoint but the operations ones needs a bearer token with the operator role
//! (`outbox_kit::auth`): 401 without a valid token, 403 without the role.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use outbox_kit::auth::Operator;
use outbox_kit::service::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgPool;

use crate::domain::{OnHand, SkuId};
use crate::error::Error;
use crate::stock;
use crate::store::StockRow;
use crate::Metrics;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The stock database.
    pub pool: PgPool,
    /// Metrics.
    pub metrics: Metrics,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/stock", get(list_stock))
        .route("/stock/{sku_id}", get(get_stock).put(put_stock))
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
            Error::SkuNotFound => error(StatusCode::NOT_FOUND, "sku_not_found", &message),
            Error::BelowReserved => error(StatusCode::CONFLICT, "below_reserved", &message),
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

/// A SKU's stock as answered.
#[derive(Debug, Serialize)]
struct StockView {
    #[serde(flatten)]
    row: StockRow,
    available: i64,
}

impl From<StockRow> for StockView {
    fn from(row: StockRow) -> Self {
        Self {
            available: row.on_hand - row.reserved,
            row,
        }
    }
}

#[derive(Debug, Deserialize)]
struct PutBody {
    on_hand: i64,
}

async fn put_stock(
    _operator: Operator,
    State(state): State<AppState>,
    Path(sku_id): Path<String>,
    body: Bytes,
) -> Result<Response, Error> {
    let sku_id = SkuId::parse(sku_id)?;
    let body: PutBody = serde_json::from_slice(&body).map_err(Error::MalformedJson)?;
    let on_hand = OnHand::parse(body.on_hand)?;
    let row = stock::put(&state.pool, &sku_id, on_hand).await?;
    tracing::info!(sku.id = %row.sku_id, on_hand = row.on_hand, "Stock count set");
    Ok(Json(StockView::from(row)).into_response())
}

async fn get_stock(
    _operator: Operator,
    State(state): State<AppState>,
    Path(sku_id): Path<String>,
) -> Result<Response, Error> {
    let row = stock::get(&state.pool, &sku_id).await?;
    Ok(Json(StockView::from(row)).into_response())
}

async fn list_stock(_operator: Operator, State(state): State<AppState>) -> Result<Response, Error> {
    let rows: Vec<StockView> = stock::all(&state.pool)
        .await?
        .into_iter()
        .map(StockView::from)
        .collect();
    Ok(Json(json!({ "stock": rows })).into_response())
}

async fn healthz(State(state): State<AppState>) -> Response {
    let up = state.metrics.consumer.up.get() == 1;
    outbox_kit::service::healthz(&state.pool, Some(up)).await
}

async fn metrics(State(state): State<AppState>) -> Response {
    outbox_kit::service::metrics_response(&state.metrics.registry)
}
