//! `/healthz`, `/metrics`, `/openapi.json`, and the JSON answers for unknown routes.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;

/// The OpenAPI 3.1 description of the whole API, served at `/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// How long the health check waits for the database.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    let ping = sqlx::query("SELECT 1").execute(&state.pool);
    match tokio::time::timeout(HEALTH_TIMEOUT, ping).await {
        Ok(Ok(_)) => Json(json!({ "status": "ok", "database": "ok" })).into_response(),
        outcome => {
            let reason = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".to_owned(),
            };
            tracing::warn!(error = %reason, "Health check failed: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "unavailable", "database": "unreachable" })),
            )
                .into_response()
        }
    }
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
    (
        status,
        Json(json!({ "error": { "code": code, "message": message } })),
    )
        .into_response()
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
