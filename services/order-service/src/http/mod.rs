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

use axum::middleware;
use axum::Router;
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::metrics::Metrics;
use crate::signature::CallbackSecret;

/// Header with the client's idempotency key on `POST /orders`.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response header set to `true` on answers replayed from an earlier request.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Header with a callback's signature.
pub const SIGNATURE: &str = "x-signature";
/// Header with a callback's signing time (Unix seconds), covered by its signature.
pub use outbox_http::signature::TIMESTAMP_HEADER as SIGNATURE_TIMESTAMP;

/// The routes without a bearer token (signed by the payment provider or the marketplace):
/// they get the server's small body limit and their own concurrency bound
/// ([`outbox_http::service::HttpLimits`]).
pub const UNAUTHENTICATED_ROUTES: &[&str] = &[
    "/payments/callback",
    "/refunds/callback",
    "/channels/marketplace/push",
];

outbox_http::error_answers!(
    /// The answer of an operation that reads a JSON body to one over the server's limit.
    BodyTooLarge {
        413 => BODY_TOO_LARGE,
    }
);

/// The description of the 413 answer.
const BODY_TOO_LARGE: &str = "`body_too_large`";

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
    pub auth: outbox_http::auth::Authenticator,
}

/// The answer to a recognised callback.
#[derive(Debug, Serialize, ToSchema)]
struct CallbackAck {
    /// Always `success`.
    #[schema(pattern = "^success$")]
    result: String,
}

/// The routes and their OpenAPI document, from the same annotations: a route is registered
/// by its handler's `#[utoipa::path]`, so it cannot exist undocumented.
fn api() -> (Router<AppState>, serde_json::Value) {
    let (router, doc) = OpenApiRouter::new()
        .routes(routes!(catalog::put_sku))
        .routes(routes!(orders::create_order))
        .routes(routes!(orders::get_order))
        .routes(routes!(orders::cancel_order))
        .routes(routes!(orders::deliver_order))
        .routes(routes!(orders::complete_order))
        .routes(routes!(orders::request_refund))
        .routes(routes!(callbacks::payment_callback))
        .routes(routes!(callbacks::refund_callback))
        .routes(routes!(channel::push))
        .routes(routes!(channel::compensate))
        .merge(outbox_http::service::operations::routes())
        .split_for_parts();
    outbox_http::service::serve_openapi(
        router,
        doc,
        "order-service",
        "Orders with idempotent creation, signed payment and refund callbacks, the marketplace \
         channel, and the catalog. Callbacks and pushes are HMAC-signed (`X-Signature`); \
         without a valid signature they answer 401 and read nothing.",
    )
}

/// The OpenAPI document `GET /openapi.json` serves.
pub fn openapi() -> serde_json::Value {
    api().1
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    api()
        .0
        .layer(axum::Extension(state.auth.clone()))
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            outbox_http::service::track_requests::<Metrics>,
        ))
        .with_state(state)
}
