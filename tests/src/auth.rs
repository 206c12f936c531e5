//! Bearer tokens for the services the tests start: every service process gets the same JWT
//! settings ([`ENV`]), and the tests mint tokens with [`minter`] as a real identity provider
//! would (an operator's for the catalog, warehouse and stock; a customer's for its orders).

use outbox_http::auth::Minter;

/// The HS256 secret of the test services' tokens.
pub const JWT_SECRET: &str = "e2e-jwt-secret-at-least-32-bytes-long";
/// `iss` the services require.
pub const JWT_ISSUER: &str = "e2e-identity";
/// `aud` the services require (one audience for the whole shop).
pub const JWT_AUDIENCE: &str = "outbox-shop";

/// The JWT environment of every service process, with the development switch that lets the
/// tests' published secrets (these constants, the callback secrets) through the start-up check
/// (`outbox_process::secrets`); `tests/it/security/secrets.rs` starts the services without it.
pub const ENV: [(&str, &str); 4] = [
    ("JWT_HS256_SECRET", JWT_SECRET),
    ("JWT_ISSUER", JWT_ISSUER),
    ("JWT_AUDIENCE", JWT_AUDIENCE),
    ("ALLOW_WEAK_SECRETS", "true"),
];

/// Mints tokens the test services accept.
pub fn minter() -> Minter {
    Minter::hs256(JWT_SECRET.as_bytes(), JWT_ISSUER, JWT_AUDIENCE)
}

/// A one-hour operator token.
pub fn operator() -> String {
    minter().operator("e2e-operator")
}

/// A one-hour customer token of `user`.
pub fn customer(user: &str) -> String {
    minter().customer(user)
}
