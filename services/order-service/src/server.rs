//! Start-up and shutdown: migrations and the HTTP server with a drain deadline (the pool is
//! [`outbox_http::service::connect_lazy`]).

use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use outbox_http::service::HttpLimits;

use crate::http::{router, AppState, UNAUTHENTICATED_ROUTES};

/// The order service's own migrations (`migrations/order`). Their versions differ from the
/// outbox's, and both sets share sqlx's bookkeeping table, so each migrator ignores the
/// other's versions.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/order");
    m.set_ignore_missing(true);
    m
}

/// Applies the outbox and inbox migrations, then the order service's.
///
/// # Errors
/// When the database is unreachable or a migration fails.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    outbox_consumer_service::migrate(pool, Some(&migrator())).await
}

/// Serves the API on `listener` with the default limits until `shutdown` is cancelled, then
/// lets requests in flight finish for at most `drain_timeout`.
///
/// # Errors
/// When accepting connections fails.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
    drain_timeout: Duration,
) -> std::io::Result<()> {
    let limits = HttpLimits {
        unauthenticated_routes: UNAUTHENTICATED_ROUTES,
        ..HttpLimits::default()
    };
    serve_with_limits(listener, state, shutdown, drain_timeout, &limits).await
}

/// [`serve`] within `limits` (their `unauthenticated_routes` should be
/// [`UNAUTHENTICATED_ROUTES`]).
///
/// # Errors
/// When accepting connections fails.
pub async fn serve_with_limits(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    limits: &HttpLimits,
) -> std::io::Result<()> {
    outbox_http::service::serve_with_limits(
        listener,
        router(state),
        shutdown,
        drain_timeout,
        limits,
    )
    .await
}
