//! `/healthz` and `/metrics` with their OpenAPI operations, written once for every service:
//! merge [`routes`] into the service's `OpenApiRouter` and say how its state gives the
//! [`Operations`] (`impl FromRef<AppState> for Operations`). Both stay open (no token): serve
//! them on an internal port or network.

use axum::extract::{FromRef, State};
use axum::response::Response;
use prometheus::{IntGauge, Registry};
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[allow(unused_imports)] // Named in the `utoipa::path` annotations.
use super::Health;

/// What the two operations read.
#[derive(Debug, Clone)]
pub struct Operations {
    pool: PgPool,
    registry: Registry,
    consumer_up: Option<IntGauge>,
}

impl Operations {
    /// `/healthz` pings `pool`; `/metrics` renders `registry`.
    pub fn new(pool: PgPool, registry: Registry) -> Self {
        Self {
            pool,
            registry,
            consumer_up: None,
        }
    }

    /// A consuming service: `/healthz` is also 503 while `up` (the runtime's
    /// `consumer_up` gauge) is not 1.
    #[must_use]
    pub fn consuming(mut self, up: IntGauge) -> Self {
        self.consumer_up = Some(up);
        self
    }
}

/// The two routes, for a router whose state gives the [`Operations`].
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Operations: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(metrics))
}

/// Readiness: the database answers (and, in a consuming service, the consumer runs). Belongs
/// on an internal network.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready", body = Health),
    )
)]
async fn healthz(State(ops): State<Operations>) -> Response {
    let up = ops.consumer_up.as_ref().map(|g| g.get() == 1);
    super::healthz(&ops.pool, up).await
}

/// Prometheus metrics. Belongs on an internal network.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String))
)]
async fn metrics(State(ops): State<Operations>) -> Response {
    super::metrics_response(&ops.registry)
}
