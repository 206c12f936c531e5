//! `PUT /skus/{sku_id}` (operator role).

use axum::extract::State;
use axum::Json;
use outbox_http::auth::Operator;
use outbox_http::service::extract::{Body, Path};
use outbox_http::service::{ApiError, ErrorBody, OperatorOnly};

use super::{AppState, BodyTooLarge};
use crate::catalog::{self, Sku, SkuBody, SkuView};
use crate::domain::SkuId;

/// Creates or replaces a catalog entry; existing orders keep their prices. Operator role.
#[utoipa::path(
    put,
    path = "/skus/{sku_id}",
    tag = "catalog",
    security(("bearerAuth" = [])),
    params(("sku_id" = inline(SkuId), Path, description = "The SKU")),
    request_body(content = SkuBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The stored entry", body = SkuView),
        (status = 400, description = "`malformed_json`, `unreadable_body` or `invalid_path`", body = ErrorBody),
        (status = 409, description = "`conflict` with the current state", body = ErrorBody),
        (status = 422, description = "`validation_failed`: `field` names the invalid one", body = ErrorBody),
        BodyTooLarge,
        OperatorOnly,
    )
)]
pub(super) async fn put_sku(
    _operator: Operator,
    State(state): State<AppState>,
    Path(sku_id): Path<String>,
    body: Body,
) -> Result<Json<SkuView>, ApiError> {
    let body: SkuBody = body.json()?;
    let sku = Sku::parse(sku_id, body)?;
    Ok(Json(catalog::put(&state.pool, &sku).await?))
}
