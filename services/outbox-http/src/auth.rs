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
//! Rejections use the shared envelope ([`ApiError`](crate::service::ApiError)): 401
//! `missing_token` / `invalid_token` with `WWW-Authenticate: Bearer ...` (RFC 6750), 403
//! `forbidden`. Every rejection happens before the handler runs, so nothing is read or written.
//!
//! The [`Authenticator`] travels to the extractors as a request extension: install it with
//! `router.layer(axum::Extension(authenticator))`.
//!
//! [`Minter`] signs tokens: for tests, the demo and the `mint-token` tool.
//!
//! Files: `config` (the flags and the key they name), `verify` (claims, the verifier, why a
//! token is refused), `extract` (the extractors and their 401/403 answers), `mint` (signing).

mod config;
mod extract;
mod mint;
mod verify;

pub use config::{AuthArgs, AuthConfigError, MIN_SECRET_LEN};
pub use extract::{Customer, Operator};
pub use mint::{BadPrivateKey, Minter};
pub use verify::{AuthError, Authenticator, Claims, Principal, OPERATOR_ROLE};
