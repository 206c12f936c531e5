//! The HTTP API: routes, request parsing at the edge, and the mapping of outcomes and errors to
//! responses. Handlers parse and validate, call the core ([`crate::orders`],
//! [`crate::payments`], [`crate::refunds`], [`crate::catalog`]) and count outcomes once the
//! core's transaction committed.

mod callbacks;
mod catalog;
mod channel;
mod error;
mod ops;
mod orders;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::middleware;
use axum::routing::{get, post, put};
use axum::Router;
use serde::de::DeserializeOwned;
use sqlx::PgPool;

use crate::error::Error;
use crate::metrics::Metrics;
use crate::signature::CallbackSecret;

pub use ops::OPENAPI_JSON;

/// Header with the client's idempotency key on `POST /orders`.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response header set to `true` on answers replayed from an earlier request.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Header with a callback's signature.
pub const SIGNATURE: &str = "x-signature";
/// Header with a callback's signing time (Unix seconds), covered by its signature.
pub use outbox_kit::signature::TIMESTAMP_HEADER as SIGNATURE_TIMESTAMP;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The service's database (business tables and outbox).
    pub pool: PgPool,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Secret that signs payment and refund callbacks.
    pub secret: CallbackSecret,
    /// How far a callback's signed timestamp may be from now.
    pub replay_window: std::time::Duration,
    /// Secret that signs marketplace pushes; `None` turns the channel off (404).
    pub marketplace_secret: Option<CallbackSecret>,
    /// The marketplace's API, for `POST /channels/marketplace/compensate`.
    pub marketplace: Option<crate::channel::PlatformClient>,
    /// Verifies bearer tokens.
    pub auth: outbox_kit::auth::Authenticator,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/skus/{sku_id}", put(catalog::put_sku))
        .route("/orders", post(orders::create_order))
        .route("/orders/{order_id}", get(orders::get_order))
        .route("/orders/{order_id}/cancel", post(orders::cancel_order))
        .route("/orders/{order_id}/deliver", post(orders::deliver_order))
        .route("/orders/{order_id}/complete", post(orders::complete_order))
        .route("/orders/{order_id}/refunds", post(orders::request_refund))
        .route("/payments/callback", post(callbacks::payment_callback))
        .route("/refunds/callback", post(callbacks::refund_callback))
        .route("/channels/marketplace/push", post(channel::push))
        .route(
            "/channels/marketplace/compensate",
            post(channel::compensate),
        )
        .route("/healthz", get(ops::healthz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(axum::Extension(state.auth.clone()))
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            outbox_kit::service::track_requests::<Metrics>,
        ))
        .with_state(state)
}

/// The body bytes, or the reason they could not be read.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Error> {
    body.map_err(Error::UnreadableBody)
}

/// Parses a JSON body whatever its content type.
fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(body).map_err(Error::MalformedJson)
}
