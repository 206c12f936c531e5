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
//! | `GET /openapi.json` | the OpenAPI 3.1 document, generated from these handlers |
//!
//! Every endpoint but the operations ones needs a bearer token with the operator role
//! (`outbox_http::auth`): 401 without a valid token, 403 without the role.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use outbox_http::auth::Operator;
use outbox_http::service::extract::{Body, Path, Query};
use outbox_http::service::{ApiError, ErrorBody, JsonBodyRefused, OperatorOnly};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::{Carrier, OutboundNo, OutboundStatus, Shipment, TrackingNo, ValidationError};
use crate::error::Error;
use crate::events::OutboundView;
use crate::fulfilment::{self, ActionResult};

/// Response header set to `true` when an action had been done before.
pub const REPLAYED: &str = "idempotent-replayed";

/// What every handler shares: the WMS database and the process's metrics.
pub type AppState = outbox_consumer_service::ServiceState;

/// The routes and their OpenAPI document, from the same annotations.
fn api() -> (Router<AppState>, serde_json::Value) {
    let (router, doc) = OpenApiRouter::new()
        .routes(routes!(list_outbounds))
        .routes(routes!(get_outbound))
        .routes(routes!(ship))
        .routes(routes!(return_received))
        .merge(outbox_http::service::operations::routes())
        .split_for_parts();
    outbox_http::service::serve_openapi(
        router,
        doc,
        "wms-consumer",
        "The warehouse: outbounds created from paid orders, shipped and returned by operators.",
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
        let conflict = |code| ApiError::new(StatusCode::CONFLICT, code, message.clone());
        match e {
            Error::Validation(v) => v.into(),
            Error::OutboundNotFound => {
                ApiError::new(StatusCode::NOT_FOUND, "outbound_not_found", message)
            }
            Error::NotShippable { status } => conflict(if status == OutboundStatus::Cancelled {
                "outbound_cancelled"
            } else {
                "outbound_intercepted"
            }),
            Error::AlreadyShipped { .. } => conflict("already_shipped"),
            Error::TrackingNoInUse => conflict("tracking_no_in_use"),
            Error::NoReturnExpected { .. } => conflict("no_return_expected"),
            e => ApiError::unexpected(e.is_retryable(), &e),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

/// `POST /outbounds/{outbound_no}/ship` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ShipBody {
    /// The carrier's name.
    #[schema(schema_with = Carrier::schema_object)]
    carrier: String,
    /// The parcel's tracking number; unique across outbounds.
    #[schema(schema_with = TrackingNo::schema_object)]
    tracking_no: String,
}

impl TryFrom<ShipBody> for Shipment {
    type Error = ValidationError;

    fn try_from(b: ShipBody) -> Result<Self, Self::Error> {
        Ok(Self {
            carrier: Carrier::parse("carrier", b.carrier)?,
            tracking_no: TrackingNo::parse("tracking_no", b.tracking_no)?,
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

outbox_http::error_answers!(
    /// The answers of an operation on the outbound its path names to a path it cannot decode,
    /// one that names no outbound, or one that is no outbound number.
    OutboundPath {
        400 => "Undecodable path",
        404 => "`outbound_not_found`",
        422 => "`validation_failed`: not a valid outbound number",
    }
);

/// Ships an outbound (`CREATED -> SHIPPED`); the same carrier and tracking number again
/// answers 200 with `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/outbounds/{outbound_no}/ship",
    tag = "warehouse",
    security(("bearerAuth" = [])),
    params(("outbound_no" = inline(OutboundNo), Path, description = "The outbound")),
    request_body(content = ShipBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Shipped (or shipped before with the same parcel)", body = OutboundView),
        (status = 404, description = "`outbound_not_found`", body = ErrorBody),
        (status = 409, description = "`outbound_cancelled`, `outbound_intercepted`, `already_shipped` or `tracking_no_in_use`", body = ErrorBody),
        JsonBodyRefused,
        OperatorOnly,
    )
)]
async fn ship(
    _operator: Operator,
    State(state): State<AppState>,
    Path(outbound_no): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let outbound_no = OutboundNo::parse("outbound_no", outbound_no)?;
    let body: ShipBody = body.json()?;
    let shipment = Shipment::try_from(body)?;
    let result = fulfilment::ship(&state.pool, outbound_no.as_str(), &shipment).await?;
    Ok(action_response(result))
}

/// Marks the return of a recalled outbound received (`RECALL -> RETURNED`).
#[utoipa::path(
    post,
    path = "/outbounds/{outbound_no}/return-received",
    tag = "warehouse",
    security(("bearerAuth" = [])),
    params(("outbound_no" = inline(OutboundNo), Path, description = "The outbound")),
    responses(
        (status = 200, description = "Returned (or returned before)", body = OutboundView),
        (status = 409, description = "`no_return_expected`", body = ErrorBody),
        OutboundPath,
        OperatorOnly,
    )
)]
async fn return_received(
    _operator: Operator,
    State(state): State<AppState>,
    Path(outbound_no): Path<String>,
) -> Result<Response, ApiError> {
    let outbound_no = OutboundNo::parse("outbound_no", outbound_no)?;
    let result = fulfilment::return_received(&state.pool, outbound_no.as_str()).await?;
    Ok(action_response(result))
}

/// One outbound with its lines.
#[utoipa::path(
    get,
    path = "/outbounds/{outbound_no}",
    tag = "warehouse",
    security(("bearerAuth" = [])),
    params(("outbound_no" = inline(OutboundNo), Path, description = "The outbound")),
    responses(
        (status = 200, description = "The outbound", body = OutboundView),
        OutboundPath,
        OperatorOnly,
    )
)]
async fn get_outbound(
    _operator: Operator,
    State(state): State<AppState>,
    Path(outbound_no): Path<String>,
) -> Result<Response, ApiError> {
    let outbound_no = OutboundNo::parse("outbound_no", outbound_no)?;
    Ok(Json(fulfilment::get(&state.pool, outbound_no.as_str()).await?).into_response())
}

/// `GET /outbounds` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// The order whose outbounds to list.
    #[param(required = true)]
    order_id: Option<Uuid>,
}

/// The outbounds of an order.
#[derive(Debug, Serialize, ToSchema)]
struct OutboundList {
    /// None or one.
    outbounds: Vec<OutboundView>,
}

/// The outbounds of an order (none or one).
#[utoipa::path(
    get,
    path = "/outbounds",
    tag = "warehouse",
    security(("bearerAuth" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "The order's outbounds", body = OutboundList),
        (status = 400, description = "`invalid_query`: `order_id` is not a UUID", body = ErrorBody),
        (status = 422, description = "`validation_failed`: `order_id` is missing", body = ErrorBody),
        OperatorOnly,
    )
)]
async fn list_outbounds(
    _operator: Operator,
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let order_id = q
        .order_id
        .ok_or_else(|| ValidationError::new("order_id", "is required"))?;
    let outbounds = fulfilment::for_order(&state.pool, order_id).await?;
    Ok(Json(OutboundList { outbounds }).into_response())
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
        let ship = &doc["paths"]["/outbounds/{outbound_no}/ship"]["post"];
        let no = &ship["parameters"][0]["schema"];
        assert_eq!(no["pattern"], OutboundNo::RULE.pattern(), "{no}");
        let body = &doc["components"]["schemas"]["ShipBody"];
        assert_eq!(body["additionalProperties"], false, "{body}");
        assert_eq!(
            body["properties"]["tracking_no"]["maxLength"],
            TrackingNo::RULE.max_chars
        );
        let list = &doc["paths"]["/outbounds"]["get"]["parameters"][0];
        assert_eq!(list["required"], true, "{list}");
    }
}
