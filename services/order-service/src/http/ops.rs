//! `/healthz`, `/metrics`, `/openapi.json`, and the JSON answers for unknown routes.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The OpenAPI 3.1 description of the whole API, served at `/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// 200 when the database answers in time, else 503 (the shared answer; the fulfilment
/// consumer's state is in its metrics, not here).
pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    outbox_kit::service::healthz(&state.pool, None).await
}

pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    outbox_kit::service::ApiError::new(status, code, message).into_response()
}

pub(super) async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such route")
}

pub(super) async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
