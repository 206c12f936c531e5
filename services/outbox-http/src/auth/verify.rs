//! Verifying bearer tokens: the claims this system reads, the [`Authenticator`] that checks a
//! token's signature, expiry, issuer and audience, the verified caller ([`Principal`]), and
//! why a token or request is refused ([`AuthError`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};

/// The role claim value that grants operator endpoints.
pub const OPERATOR_ROLE: &str = "operator";

/// The claims this system reads and mints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The caller: a customer's user id or an operator's name.
    pub sub: String,
    /// Roles; [`OPERATOR_ROLE`] grants operator endpoints.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
}

/// Verifies bearer tokens. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator(Arc<Inner>);

struct Inner {
    key: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("algorithms", &self.0.validation.algorithms)
            .field("iss", &self.0.validation.iss)
            .field("aud", &self.0.validation.aud)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Accepts tokens signed by `key` with `algorithm`, for `issuer` and `audience`, not
    /// expired by more than `leeway`.
    pub fn new(
        key: DecodingKey,
        algorithm: Algorithm,
        issuer: &str,
        audience: &str,
        leeway: Duration,
    ) -> Self {
        let mut validation = Validation::new(algorithm);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = leeway.as_secs();
        Self(Arc::new(Inner { key, validation }))
    }

    /// An HS256 verifier (tests; services use
    /// [`AuthArgs::authenticator`](crate::auth::AuthArgs::authenticator)).
    pub fn hs256(secret: &[u8], issuer: &str, audience: &str) -> Self {
        Self::new(
            DecodingKey::from_secret(secret),
            Algorithm::HS256,
            issuer,
            audience,
            Duration::from_secs(30),
        )
    }

    /// The verified caller of `token`.
    ///
    /// # Errors
    /// [`AuthError::InvalidToken`] naming why (expired, bad signature, wrong audience, ...).
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.0.key, &self.0.validation)
            .map_err(|e| AuthError::InvalidToken(reason(e.kind())))?;
        let claims = data.claims;
        if claims.sub.is_empty() {
            return Err(AuthError::InvalidToken("the token's `sub` is empty"));
        }
        Ok(Principal {
            subject: claims.sub,
            roles: claims.roles,
        })
    }

    /// The verified caller of a request's `Authorization: Bearer` header.
    ///
    /// # Errors
    /// [`AuthError::MissingToken`] without a bearer header, else as [`Self::verify`].
    pub fn authenticate(&self, headers: &axum::http::HeaderMap) -> Result<Principal, AuthError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or(AuthError::MissingToken)?;
        let value = value
            .to_str()
            .map_err(|_| AuthError::InvalidToken("the Authorization header is not ASCII"))?;
        let (scheme, token) = value.split_once(' ').ok_or(AuthError::InvalidToken(
            "expected `Authorization: Bearer <token>`",
        ))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::InvalidToken(
                "expected `Authorization: Bearer <token>`",
            ));
        }
        self.verify(token.trim())
    }
}

/// What a rejected token's message says.
fn reason(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired",
        ErrorKind::InvalidSignature => "the token's signature is invalid",
        ErrorKind::InvalidAudience => "the token is not for this audience",
        ErrorKind::InvalidIssuer => "the token is from an unknown issuer",
        ErrorKind::InvalidAlgorithm => "the token is signed with an unexpected algorithm",
        ErrorKind::MissingRequiredClaim(_) => {
            "the token lacks a required claim (exp, iss, aud, sub)"
        }
        ErrorKind::ImmatureSignature => "the token is not valid yet",
        _ => "the token is malformed",
    }
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `sub`.
    pub subject: String,
    /// `roles`.
    pub roles: Vec<String>,
}

impl Principal {
    /// Whether the caller has the operator role.
    pub fn is_operator(&self) -> bool {
        self.roles.iter().any(|r| r == OPERATOR_ROLE)
    }
}

/// Why a request was not let through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header (401).
    #[error("a bearer token is required (Authorization: Bearer <token>)")]
    MissingToken,
    /// The token was refused (401), with the reason.
    #[error("invalid bearer token: {0}")]
    InvalidToken(&'static str),
    /// The token is valid but lacks the operator role (403).
    #[error("this endpoint needs the operator role")]
    Forbidden,
    /// The router has no [`Authenticator`] extension: a wiring bug (500).
    #[error("authentication is not configured")]
    NotConfigured,
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use jsonwebtoken::{EncodingKey, Header};

    use super::*;
    use crate::auth::Minter;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn hs() -> (Minter, Authenticator) {
        (
            Minter::hs256(SECRET, "iss", "aud"),
            Authenticator::hs256(SECRET, "iss", "aud"),
        )
    }

    #[test]
    fn valid_tokens_give_subject_and_roles() {
        let (m, a) = hs();
        let p = a.verify(&m.customer("alice")).unwrap();
        assert_eq!(p.subject, "alice");
        assert!(!p.is_operator());
        assert!(a.verify(&m.operator("ops")).unwrap().is_operator());
    }

    #[test]
    fn expired_forged_foreign_and_garbage_tokens_are_refused() {
        let (m, a) = hs();
        let cases = [
            (m.token("alice", &[], -120), "the token has expired"),
            (
                Minter::hs256(b"another-secret-another-secret-xx", "iss", "aud").customer("a"),
                "the token's signature is invalid",
            ),
            (
                m.for_audience("other").customer("a"),
                "the token is not for this audience",
            ),
            (
                Minter::hs256(SECRET, "evil", "aud").customer("a"),
                "the token is from an unknown issuer",
            ),
            ("not.a.jwt".to_owned(), "the token is malformed"),
            (m.token("", &[], 60), "the token's `sub` is empty"),
        ];
        for (token, why) in cases {
            assert_eq!(a.verify(&token), Err(AuthError::InvalidToken(why)), "{why}");
        }
    }

    #[test]
    fn a_token_without_exp_is_refused() {
        #[derive(Serialize)]
        struct NoExp<'a> {
            sub: &'a str,
            iss: &'a str,
            aud: &'a str,
        }
        let (_, a) = hs();
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &NoExp {
                sub: "a",
                iss: "iss",
                aud: "aud",
            },
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert!(matches!(a.verify(&token), Err(AuthError::InvalidToken(_))));
    }

    #[test]
    fn bearer_header_parsing() {
        let (m, a) = hs();
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(a.authenticate(&h), Err(AuthError::MissingToken));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert!(matches!(
            a.authenticate(&h),
            Err(AuthError::InvalidToken(_))
        ));
        let t = format!("bearer {}", m.customer("c"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(&t).unwrap());
        assert_eq!(a.authenticate(&h).unwrap().subject, "c");
    }
}
