//! `/healthz` and `/metrics`. (`/openapi.json` and the JSON 404 / 405 answers come from
//! `outbox_kit::service::serve_openapi`.) Both belong on an internal port or network.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use outbox_kit::service::Health;

use super::AppState;

/// Readiness: 200 when the database answers in time, else 503 (the fulfilment consumer's state
/// is in its metrics, not here).
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready", body = Health),
    )
)]
pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    outbox_kit::service::healthz(&state.pool, None).await
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String))
)]
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}
