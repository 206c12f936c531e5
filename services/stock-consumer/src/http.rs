//! The stock consumer's HTTP API: warehouse counts per SKU.
//!
//! | endpoint | does |
//! |---|---|
//! | `PUT /stock/{sku_id}` `{"on_hand"}` | sets the units on hand (409 below what is reserved) |
//! | `GET /stock/{sku_id}` | `{sku_id, on_hand, reserved, available, updated_at}` |
//! | `GET /stock` | `{"stock": [...]}` of every SKU |
//! | `GET /reservations/{order_id}` | `{order_id, status, lines: [{sku_id, reserved, released, deducted, restocked}]}` |
//! | `GET /healthz`, `GET /metrics` | operations (open: serve them on an internal network) |
//! | `GET /openapi.json` | the OpenAPI 3.1 document, generated from these handlers |
//!
//! Every endpoint but the operations ones needs a bearer token with the operator role
//! (`outbox_http::auth`): 401 without a valid token, 403 without the role.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use outbox_http::auth::Operator;
use outbox_http::service::extract::{Body, Path};
use outbox_http::service::{ApiError, ErrorBody, JsonBodyRefused, OperatorOnly};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::{OnHand, ReservationStatus, SkuId};
use crate::error::Error;
use crate::lines::LineAmounts;
use crate::stock;
use crate::store::StockRow;

/// What every handler shares: the stock database and the process's metrics.
pub type AppState = outbox_consumer_service::ServiceState;

/// The routes and their OpenAPI document, from the same annotations.
fn api() -> (Router<AppState>, serde_json::Value) {
    let (router, doc) = OpenApiRouter::new()
        .routes(routes!(list_stock))
        .routes(routes!(get_stock, put_stock))
        .routes(routes!(get_reservation))
        .merge(outbox_http::service::operations::routes())
        .split_for_parts();
    outbox_http::service::serve_openapi(
        router,
        doc,
        "stock-consumer",
        "Warehouse stock per SKU: counts set by operators, reservations made by order events.",
    )
}

/// The OpenAPI document `GET /openapi.json` serves.
pub fn openapi() -> serde_json::Value {
    api().1
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    state.into_router(api().0)
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::Validation(v) => v.into(),
            Error::SkuNotFound => ApiError::new(StatusCode::NOT_FOUND, "sku_not_found", message),
            Error::ReservationNotFound => {
                ApiError::new(StatusCode::NOT_FOUND, "reservation_not_found", message)
            }
            Error::BelowReserved => ApiError::new(StatusCode::CONFLICT, "below_reserved", message),
            e => ApiError::unexpected(e.is_retryable(), &e),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

/// A SKU's stock as answered.
#[derive(Debug, Serialize, ToSchema)]
struct StockView {
    /// The SKU.
    sku_id: String,
    /// Units in the warehouse.
    on_hand: i64,
    /// Units held for paid orders not shipped yet.
    reserved: i64,
    /// `on_hand - reserved`.
    available: i64,
    /// Last change.
    updated_at: DateTime<Utc>,
}

impl From<StockRow> for StockView {
    fn from(row: StockRow) -> Self {
        Self {
            available: row.on_hand - row.reserved,
            sku_id: row.sku_id,
            on_hand: row.on_hand,
            reserved: row.reserved,
            updated_at: row.updated_at,
        }
    }
}

/// Every SKU's stock.
#[derive(Debug, Serialize, ToSchema)]
struct StockList {
    /// One entry per SKU, by id.
    stock: Vec<StockView>,
}

fn on_hand_schema() -> utoipa::openapi::schema::Object {
    OnHand::RANGE.schema()
}

/// `PUT /stock/{sku_id}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PutBody {
    /// Units on hand.
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = on_hand_schema)]
    on_hand: i64,
}

/// Sets a SKU's units on hand (creating its row).
#[utoipa::path(
    put,
    path = "/stock/{sku_id}",
    tag = "stock",
    security(("bearerAuth" = [])),
    params(("sku_id" = inline(SkuId), Path, description = "The SKU")),
    request_body(content = PutBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The SKU's stock", body = StockView),
        (status = 409, description = "`below_reserved`: fewer units than are reserved", body = ErrorBody),
        JsonBodyRefused,
        OperatorOnly,
    )
)]
async fn put_stock(
    _operator: Operator,
    State(state): State<AppState>,
    Path(sku_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let sku_id = SkuId::parse("sku_id", sku_id)?;
    let body: PutBody = body.json()?;
    let on_hand = OnHand::parse(body.on_hand)?;
    let row = stock::put(&state.pool, &sku_id, on_hand).await?;
    tracing::info!(sku.id = %row.sku_id, on_hand = row.on_hand, "Stock count set");
    Ok(Json(StockView::from(row)).into_response())
}

/// One SKU's stock.
#[utoipa::path(
    get,
    path = "/stock/{sku_id}",
    tag = "stock",
    security(("bearerAuth" = [])),
    params(("sku_id" = inline(SkuId), Path, description = "The SKU")),
    responses(
        (status = 200, description = "The SKU's stock", body = StockView),
        (status = 400, description = "Undecodable path", body = ErrorBody),
        (status = 404, description = "`sku_not_found`", body = ErrorBody),
        (status = 422, description = "`validation_failed`: not a valid SKU id", body = ErrorBody),
        OperatorOnly,
    )
)]
async fn get_stock(
    _operator: Operator,
    State(state): State<AppState>,
    Path(sku_id): Path<String>,
) -> Result<Response, ApiError> {
    let sku_id = SkuId::parse("sku_id", sku_id)?;
    let row = stock::get(&state.pool, &sku_id).await?;
    Ok(Json(StockView::from(row)).into_response())
}

/// Every SKU's stock.
#[utoipa::path(
    get,
    path = "/stock",
    tag = "stock",
    security(("bearerAuth" = [])),
    responses(
        (status = 200, description = "Every SKU's stock", body = StockList),
        OperatorOnly,
    )
)]
async fn list_stock(
    _operator: Operator,
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let stock: Vec<StockView> = stock::all(&state.pool)
        .await?
        .into_iter()
        .map(StockView::from)
        .collect();
    Ok(Json(StockList { stock }).into_response())
}

/// An order's reservation as answered.
#[derive(Debug, Serialize, ToSchema)]
struct ReservationView {
    /// The order.
    order_id: Uuid,
    /// The summary: `RESERVED`, `REJECTED`, `RELEASED`, `DEDUCTED` (shipped, possibly partly
    /// restocked) or `RESTOCKED` (every shipped unit back).
    #[schema(value_type = String)]
    status: ReservationStatus,
    /// Per SKU, by id: units reserved, released, deducted and restocked so far (none when
    /// rejected).
    lines: Vec<LineAmounts>,
}

/// An order's reservation and where its units went, per line.
#[utoipa::path(
    get,
    path = "/reservations/{order_id}",
    tag = "stock",
    security(("bearerAuth" = [])),
    params(("order_id" = Uuid, Path, description = "The order; anything but a UUID names no reservation (404)")),
    responses(
        (status = 200, description = "The reservation", body = ReservationView),
        (status = 400, description = "Undecodable path", body = ErrorBody),
        (status = 404, description = "`reservation_not_found`", body = ErrorBody),
        OperatorOnly,
    )
)]
async fn get_reservation(
    _operator: Operator,
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Response, ApiError> {
    let order_id = Uuid::parse_str(&order_id).map_err(|_| Error::ReservationNotFound)?;
    let (status, lines) = stock::reservation(&state.pool, order_id).await?;
    Ok(Json(ReservationView {
        order_id,
        status,
        lines,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_has_the_servers_constraints() {
        let doc = openapi();
        assert_eq!(
            doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
            "bearer"
        );
        let put = &doc["paths"]["/stock/{sku_id}"]["put"];
        let sku = &put["parameters"][0]["schema"];
        assert_eq!(sku["maxLength"], 64, "{sku}");
        assert_eq!(sku["pattern"], SkuId::RULE.pattern());
        let body = &doc["components"]["schemas"]["PutBody"];
        assert_eq!(body["additionalProperties"], false, "{body}");
        assert_eq!(body["properties"]["on_hand"]["maximum"], OnHand::RANGE.max);
        assert!(put["responses"]["422"].is_object());
        for status in ["401", "403"] {
            assert!(put["responses"][status].is_object(), "no {status} on PUT");
        }
        assert_eq!(put["security"][0]["bearerAuth"], serde_json::json!([]));
        assert!(doc["paths"]["/healthz"]["get"]["security"].is_null());
        assert!(doc["paths"]["/openapi.json"]["get"].is_object());
        let lines = &doc["components"]["schemas"]["LineAmounts"]["properties"];
        for amount in ["reserved", "released", "deducted", "restocked"] {
            assert!(lines[amount].is_object(), "{amount} in {lines}");
        }
        assert!(doc["paths"]["/reservations/{order_id}"]["get"]["responses"]["404"].is_object());
    }
}
