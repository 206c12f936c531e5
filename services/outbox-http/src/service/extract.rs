//! Extractors whose rejections are the shared [`ApiError`] envelope instead of axum's plain-text
//! answers, and the JSON answers for unknown routes (404) and wrong methods (405). Every
//! service's handlers take [`Path`], [`Query`] and [`Body`] from here and install
//! [`with_fallbacks`], so no request is answered outside the envelope.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde::de::DeserializeOwned;

use super::ApiError;
use crate::validate::ValidationError;

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            format!("invalid request: {e}"),
        )
        .with("field", e.field)
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        // The only client-caused path failure is a segment that does not decode (invalid
        // percent-encoding or UTF-8); a missing parameter is a routing bug.
        if e.status().is_server_error() {
            tracing::error!(error = %e.body_text(), "Path parameters missing for a route");
            return Self::internal();
        }
        Self::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                e.body_text(),
            )
        } else {
            Self::new(StatusCode::BAD_REQUEST, "unreadable_body", e.body_text())
        }
    }
}

/// The JSON body did not parse into the expected shape (400 `malformed_json`).
pub fn malformed_json(e: &serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "malformed_json",
        format!("malformed JSON body: {e}"),
    )
}

/// Path parameters, deserialized like `axum::extract::Path`; rejected with the envelope.
#[derive(Debug, Clone)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Self(p.0))
            .map_err(ApiError::from)
    }
}

/// The query string, deserialized like `axum::extract::Query`; a query that does not fit `T` is a 400 `invalid_query` naming the problem.
#[derive(Debug, Clone)]
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| Self(q.0))
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))
    }
}

/// The raw body (signed callbacks need the exact bytes); an unreadable or too large body is
/// the envelope's 400 / 413.
#[derive(Debug, Clone)]
pub struct Body(pub Bytes);

impl Body {
    /// The body as JSON of shape `T`, whatever the content type says.
    ///
    /// # Errors
    /// 400 `malformed_json` when it is not JSON of that shape.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse_json(&self.0)
    }
}

/// `body` as JSON of shape `T`.
///
/// # Errors
/// 400 `malformed_json` when it is not JSON of that shape.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| malformed_json(&e))
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    /// Reads the body within the request's [`BodyLimits`](super::server::BodyLimits) (set by
    /// the server; defaults without): a declared `Content-Length` over the limit is refused
    /// before reading, any other body as soon as it passes the limit, and a body that takes
    /// longer than the read timeout is 408 `body_timeout`.
    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let limits = req
            .extensions()
            .get::<super::server::BodyLimits>()
            .copied()
            .unwrap_or_default();
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limits.max_bytes as u64) {
            return Err(too_large(limits.max_bytes));
        }
        let read = axum::body::to_bytes(req.into_body(), limits.max_bytes);
        match tokio::time::timeout(limits.read_timeout, read).await {
            Err(_) => Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body was not received within {} ms",
                    limits.read_timeout.as_millis()
                ),
            )),
            Ok(Ok(bytes)) => Ok(Self(bytes)),
            Ok(Err(e)) => {
                let over = std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                    || e.to_string().contains("length limit exceeded");
                if over {
                    Err(too_large(limits.max_bytes))
                } else {
                    Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "unreadable_body",
                        format!("failed to read the request body: {e}"),
                    ))
                }
            }
        }
    }
}

/// 413 `body_too_large` naming the limit.
fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is larger than {limit} bytes"),
    )
    .with("limit_bytes", limit)
}

/// 404 `not_found` for a path no route matches.
pub async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response()
}

/// 405 `method_not_allowed` for a known path with another method (axum adds `Allow`).
pub async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
    .into_response()
}

/// `router` answering unknown routes and wrong methods with the envelope.
pub fn with_fallbacks<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}
