//! Bearer-token authentication for the services' HTTP APIs.
//!
//! Callers send `Authorization: Bearer <JWT>`. The token is verified against the configured
//! key ([`AuthArgs`]: an HS256 secret, or an RS256 / ES256 public key in PEM) and must carry
//! `exp` (not past), `iss` and `aud` (equal to the configured ones) and `sub` (the caller: a
//! customer's user id, or an operator's name). `roles: ["operator"]` grants the operator role.
//!
//! - [`Customer`]: any valid token; `user_id` is `sub`. Customer endpoints act on the
//!   caller's own data only (the service answers 404 for anyone else's, so ids don't leak);
//!   `is_operator` lets a service allow operators on every customer's data.
//! - [`Operator`]: a valid token with the operator role, else 403.
//!
//! Rejections use the shared envelope ([`ApiError`]): 401 `missing_token` / `invalid_token`
//! with `WWW-Authenticate: Bearer ...` (RFC 6750), 403 `forbidden`. Every rejection happens
//! before the handler runs, so nothing is read or written.
//!
//! The [`Authenticator`] travels to the extractors as a request extension: install it with
//! `router.layer(axum::Extension(authenticator))`.
//!
//! [`Minter`] signs tokens: for tests, the demo and the `mint-token` tool.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::service::ApiError;

/// The role claim value that grants operator endpoints.
pub const OPERATOR_ROLE: &str = "operator";

/// The realm named in `WWW-Authenticate`.
const REALM: &str = "outbox";

/// The JWT flags every service with a protected HTTP API takes (flatten into its
/// `clap::Parser`). All are optional at parse time so operator subcommands (`dlq ...`) run
/// without them; [`AuthArgs::authenticator`] refuses to start a server without a key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AuthArgs {
    /// HS256 secret bearer tokens are signed with (at least 32 bytes). Exactly one of this and
    /// `--jwt-public-key-file` is required to serve. Prefer the environment variable: flags
    /// show up in process listings.
    #[arg(long, env = "JWT_HS256_SECRET", hide_env_values = true)]
    pub jwt_hs256_secret: Option<String>,

    /// PEM file with the public key bearer tokens are signed with: an RSA key (RS256) or a
    /// P-256 EC key (ES256).
    #[arg(long, env = "JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,

    /// Required `iss` of bearer tokens.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// Required `aud` of bearer tokens (one of the token's audiences must equal it).
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Clock skew tolerated on `exp`, in seconds.
    #[arg(long, env = "JWT_LEEWAY_SECS", default_value_t = 30)]
    pub jwt_leeway_secs: u64,
}

/// Why the JWT configuration cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// Neither key is set: the API would be open.
    #[error(
        "no bearer-token key configured: set JWT_HS256_SECRET (--jwt-hs256-secret) or \
         JWT_PUBLIC_KEY_FILE (--jwt-public-key-file); the API does not run unauthenticated"
    )]
    NoKey,
    /// Both keys are set.
    #[error("set only one of JWT_HS256_SECRET and JWT_PUBLIC_KEY_FILE")]
    TwoKeys,
    /// The HS256 secret is too short to resist guessing.
    #[error("JWT_HS256_SECRET must be at least {MIN_SECRET_LEN} bytes")]
    ShortSecret,
    /// `--jwt-issuer` or `--jwt-audience` is missing.
    #[error("{0} must be set: tokens are only accepted for a configured issuer and audience")]
    Missing(&'static str),
    /// The key file cannot be read.
    #[error("reading JWT_PUBLIC_KEY_FILE {path}")]
    ReadKey {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The key file holds no RSA or EC public key in PEM.
    #[error("JWT_PUBLIC_KEY_FILE {0} is not an RSA or EC public key in PEM")]
    BadKey(PathBuf),
}

/// Shortest accepted HS256 secret (RFC 7518 §3.2: at least the hash size).
pub const MIN_SECRET_LEN: usize = 32;

impl AuthArgs {
    /// The secret among these settings, for the weak-secret check ([`outbox_process::secrets`]).
    pub fn secrets(&self) -> [outbox_process::secrets::Secret<'_>; 1] {
        [outbox_process::secrets::Secret::signing_key(
            "JWT_HS256_SECRET (--jwt-hs256-secret)",
            self.jwt_hs256_secret.as_deref().filter(|s| !s.is_empty()),
        )]
    }

    /// The verifier these flags describe.
    ///
    /// # Errors
    /// [`AuthConfigError`]: no key (the service must not start open), two keys, a short
    /// secret, no issuer or audience, an unreadable or unparsable key file.
    pub fn authenticator(&self) -> Result<Authenticator, AuthConfigError> {
        let issuer = self
            .jwt_issuer
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(AuthConfigError::Missing("JWT_ISSUER (--jwt-issuer)"))?;
        let audience = self
            .jwt_audience
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(AuthConfigError::Missing("JWT_AUDIENCE (--jwt-audience)"))?;
        let secret = self.jwt_hs256_secret.as_deref().filter(|s| !s.is_empty());
        let (key, algorithm) = match (secret, &self.jwt_public_key_file) {
            (None, None) => return Err(AuthConfigError::NoKey),
            (Some(_), Some(_)) => return Err(AuthConfigError::TwoKeys),
            (Some(secret), None) => {
                if secret.len() < MIN_SECRET_LEN {
                    return Err(AuthConfigError::ShortSecret);
                }
                (
                    DecodingKey::from_secret(secret.as_bytes()),
                    Algorithm::HS256,
                )
            }
            (None, Some(path)) => {
                let pem = std::fs::read(path).map_err(|source| AuthConfigError::ReadKey {
                    path: path.clone(),
                    source,
                })?;
                public_key(&pem).ok_or_else(|| AuthConfigError::BadKey(path.clone()))?
            }
        };
        Ok(Authenticator::new(
            key,
            algorithm,
            issuer,
            audience,
            Duration::from_secs(self.jwt_leeway_secs),
        ))
    }
}

/// An RSA (RS256) or EC (ES256) public key from PEM.
fn public_key(pem: &[u8]) -> Option<(DecodingKey, Algorithm)> {
    if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
        return Some((k, Algorithm::RS256));
    }
    DecodingKey::from_ec_pem(pem)
        .ok()
        .map(|k| (k, Algorithm::ES256))
}

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

    /// An HS256 verifier (tests; services use [`AuthArgs::authenticator`]).
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

/// Signs tokens (tests, the demo, the `mint-token` tool).
#[derive(Clone)]
pub struct Minter {
    key: EncodingKey,
    algorithm: Algorithm,
    issuer: String,
    audience: String,
}

impl fmt::Debug for Minter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Minter")
            .field("algorithm", &self.algorithm)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// The private key cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("not an RSA or EC private key in PEM (PKCS#8 for EC)")]
pub struct BadPrivateKey;

impl Minter {
    /// Signs HS256 tokens with `secret` for `issuer` and `audience`.
    pub fn hs256(secret: &[u8], issuer: &str, audience: &str) -> Self {
        Self {
            key: EncodingKey::from_secret(secret),
            algorithm: Algorithm::HS256,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
        }
    }

    /// Signs RS256 (RSA key) or ES256 (EC key) tokens with a private key in PEM.
    ///
    /// # Errors
    /// [`BadPrivateKey`].
    pub fn from_private_pem(
        pem: &[u8],
        issuer: &str,
        audience: &str,
    ) -> Result<Self, BadPrivateKey> {
        let (key, algorithm) = if let Ok(k) = EncodingKey::from_rsa_pem(pem) {
            (k, Algorithm::RS256)
        } else if let Ok(k) = EncodingKey::from_ec_pem(pem) {
            (k, Algorithm::ES256)
        } else {
            return Err(BadPrivateKey);
        };
        Ok(Self {
            key,
            algorithm,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
        })
    }

    /// The same key and issuer for another audience (tests of a wrong audience).
    #[must_use]
    pub fn for_audience(&self, audience: &str) -> Self {
        Self {
            audience: audience.to_owned(),
            ..self.clone()
        }
    }

    /// The claims of a token for `sub` with `roles`, valid for `ttl` from now (a negative
    /// `ttl_secs` gives an already expired token).
    pub fn claims(&self, sub: &str, roles: &[&str], ttl_secs: i64) -> Claims {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let exp = now.saturating_add_signed(ttl_secs);
        Claims {
            sub: sub.to_owned(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            exp,
            iat: now,
        }
    }

    /// Signs `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        // Serializing a struct of strings and integers with a valid key cannot fail.
        jsonwebtoken::encode(&Header::new(self.algorithm), claims, &self.key).unwrap_or_default()
    }

    /// A token for `sub` with `roles`, valid for `ttl_secs` seconds.
    pub fn token(&self, sub: &str, roles: &[&str], ttl_secs: i64) -> String {
        self.sign(&self.claims(sub, roles, ttl_secs))
    }

    /// A one-hour customer token for `user_id`.
    pub fn customer(&self, user_id: &str) -> String {
        self.token(user_id, &[], 3_600)
    }

    /// A one-hour operator token.
    pub fn operator(&self, name: &str) -> String {
        self.token(name, &[OPERATOR_ROLE], 3_600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn rs256_and_es256_public_keys_verify_their_tokens_only() {
        let dir = std::env::temp_dir().join(format!("outbox-kit-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = [
            (
                include_str!("auth/test-rsa.pem"),
                include_str!("auth/test-rsa.pub"),
            ),
            (
                include_str!("auth/test-ec.pem"),
                include_str!("auth/test-ec.pub"),
            ),
        ];
        for (i, (private, public)) in keys.iter().enumerate() {
            let path = dir.join(format!("key-{i}.pub"));
            std::fs::write(&path, public).unwrap();
            let args = AuthArgs {
                jwt_public_key_file: Some(path),
                jwt_issuer: Some("iss".into()),
                jwt_audience: Some("aud".into()),
                ..AuthArgs::default()
            };
            let a = args.authenticator().unwrap();
            let m = Minter::from_private_pem(private.as_bytes(), "iss", "aud").unwrap();
            assert_eq!(a.verify(&m.customer("bob")).unwrap().subject, "bob");
            // An HS256 token must not pass as the other algorithm (algorithm confusion).
            let hs = Minter::hs256(public.as_bytes(), "iss", "aud").customer("bob");
            assert!(a.verify(&hs).is_err());
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn configuration_refuses_to_run_open_or_ambiguous() {
        let base = AuthArgs {
            jwt_issuer: Some("iss".into()),
            jwt_audience: Some("aud".into()),
            ..AuthArgs::default()
        };
        assert!(matches!(base.authenticator(), Err(AuthConfigError::NoKey)));
        let short = AuthArgs {
            jwt_hs256_secret: Some("short".into()),
            ..base.clone()
        };
        assert!(matches!(
            short.authenticator(),
            Err(AuthConfigError::ShortSecret)
        ));
        let both = AuthArgs {
            jwt_hs256_secret: Some(String::from_utf8(SECRET.to_vec()).unwrap()),
            jwt_public_key_file: Some("/nonexistent".into()),
            ..base.clone()
        };
        assert!(matches!(
            both.authenticator(),
            Err(AuthConfigError::TwoKeys)
        ));
        let no_aud = AuthArgs {
            jwt_hs256_secret: Some(String::from_utf8(SECRET.to_vec()).unwrap()),
            jwt_audience: None,
            ..base.clone()
        };
        assert!(matches!(
            no_aud.authenticator(),
            Err(AuthConfigError::Missing(_))
        ));
        let ok = AuthArgs {
            jwt_hs256_secret: Some(String::from_utf8(SECRET.to_vec()).unwrap()),
            ..base
        };
        assert!(ok.authenticator().is_ok());
        assert!(!format!("{:?}", ok.authenticator().unwrap()).contains("0123456789"));
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
