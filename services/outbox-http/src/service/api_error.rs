//! The JSON error envelope every service answers with:
//! `{"error": {"code": "...", "message": "...", ...details}}`. A 503 also carries
//! `Retry-After: 1`, telling clients that the same request may be sent again.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

/// An error answer: status, stable machine-readable `code`, human-readable `message` and
/// optional details (`field`, `current_status`, ...) next to them.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    detail: Map<String, Value>,
    /// Extra response headers (few, so a list keeps the error small).
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl ApiError {
    /// An answer with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        let mut detail = Map::new();
        detail.insert("code".to_owned(), Value::from(code));
        detail.insert("message".to_owned(), Value::from(message.into()));
        Self {
            status,
            detail,
            headers: Vec::new(),
        }
    }

    /// Adds response header `name` (e.g. `WWW-Authenticate` on a 401).
    #[must_use]
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Adds the detail `key` (next to `code` and `message`).
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.detail.insert(key.to_owned(), value.into());
        self
    }

    /// The 503 of a transient failure: the client may send the same request again.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// The 500 of a server fault; the client learns no internals.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }

    /// The answer to an error no rule of the service maps: a retryable one (the database
    /// unavailable) is a logged 503, anything else a logged 500 that shows the client nothing.
    pub fn unexpected(retryable: bool, error: &(impl std::fmt::Debug + std::fmt::Display)) -> Self {
        if retryable {
            // Debug, not Display: a service error's Display ("database error") hides whether
            // the pool timed out, the connection broke or a deadlock was chosen.
            tracing::warn!(error = ?error, "Database unavailable; request may be retried");
            Self::unavailable("temporarily unavailable; retry")
        } else {
            tracing::error!(error = ?error, "Request failed");
            Self::internal()
        }
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("error".to_owned(), Value::Object(self.detail));
        let mut response = (self.status, Json(Value::Object(body))).into_response();
        for (name, value) in self.headers {
            response.headers_mut().insert(name, value);
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_holds_code_message_and_details() {
        let e = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "bad")
            .with("field", "sku_id");
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            Value::Object(e.detail),
            serde_json::json!({"code": "validation_failed", "message": "bad", "field": "sku_id"})
        );
        let r = ApiError::unavailable("retry").into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert!(ApiError::internal()
            .into_response()
            .headers()
            .get(header::RETRY_AFTER)
            .is_none());
    }
}
