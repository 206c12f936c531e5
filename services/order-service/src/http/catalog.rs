//! `PUT /skus/{sku_id}` (operator role).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use outbox_kit::auth::Operator;

use super::{body_bytes, parse_json, AppState};
use crate::catalog::{self, Sku, SkuBody, SkuView};
use crate::error::Error;

pub(super) async fn put_sku(
    _operator: Operator,
    State(state): State<AppState>,
    Path(sku_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<SkuView>, Error> {
    let body: SkuBody = parse_json(&body_bytes(body)?)?;
    let sku = Sku::parse(sku_id, body)?;
    Ok(Json(catalog::put(&state.pool, &sku).await?))
}
