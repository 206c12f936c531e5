//! The extractors of a protected endpoint's caller ([`Customer`], [`Operator`]) and the answers
//! of a refused request: 401 with a `WWW-Authenticate: Bearer` challenge (RFC 6750), 403, in
//! the shared envelope ([`ApiError`]).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::verify::{AuthError, Authenticator, Principal, OPERATOR_ROLE};
use crate::service::ApiError;

/// The realm named in `WWW-Authenticate`.
const REALM: &str = "outbox";

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        let message = e.to_string();
        let (error, challenge) = match e {
            AuthError::MissingToken => (
                ApiError::new(StatusCode::UNAUTHORIZED, "missing_token", message),
                format!("Bearer realm=\"{REALM}\""),
            ),
            AuthError::InvalidToken(reason) => (
                ApiError::new(StatusCode::UNAUTHORIZED, "invalid_token", message),
                format!(
                    "Bearer realm=\"{REALM}\", error=\"invalid_token\", error_description=\"{reason}\""
                ),
            ),
            AuthError::Forbidden => {
                return ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
                    .with("required_role", OPERATOR_ROLE);
            }
            AuthError::NotConfigured => {
                tracing::error!("No Authenticator extension on the router");
                return ApiError::internal();
            }
        };
        match HeaderValue::from_str(&challenge) {
            Ok(v) => error.with_header(header::WWW_AUTHENTICATE, v),
            Err(_) => error,
        }
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

fn principal(parts: &Parts) -> Result<Principal, AuthError> {
    let auth = parts
        .extensions
        .get::<Authenticator>()
        .ok_or(AuthError::NotConfigured)?;
    auth.authenticate(&parts.headers)
}

/// The caller of a customer endpoint: any valid token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer {
    /// The token's `sub`.
    pub user_id: String,
    /// Whether the token also has the operator role (services may let operators act on
    /// every customer's data).
    pub is_operator: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for Customer {
    type Rejection = AuthError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let p = principal(parts)?;
        Ok(Self {
            is_operator: p.is_operator(),
            user_id: p.subject,
        })
    }
}

/// The caller of an operator endpoint: a valid token with the operator role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The token's `sub` (for logs).
    pub name: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Operator {
    type Rejection = AuthError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let p = principal(parts)?;
        if !p.is_operator() {
            return Err(AuthError::Forbidden);
        }
        Ok(Self { name: p.subject })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_enveloped_with_a_bearer_challenge() {
        let r = AuthError::InvalidToken("the token has expired").into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let challenge = r.headers()[header::WWW_AUTHENTICATE].to_str().unwrap();
        assert!(challenge.starts_with("Bearer ") && challenge.contains("invalid_token"));
        let r = AuthError::MissingToken.into_response();
        assert_eq!(
            r.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"outbox\""
        );
        let r = AuthError::Forbidden.into_response();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(r.headers().get(header::WWW_AUTHENTICATE).is_none());
    }
}
