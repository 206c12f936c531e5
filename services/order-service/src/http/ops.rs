//! `/healthz` and `/metrics` (`outbox_http::service::operations`; `/openapi.json` and the JSON
//! 404 / 405 answers come from `outbox_http::service::serve_openapi`). Both belong on an
//! internal port or network.

use axum::extract::FromRef;
use outbox_http::service::Operations;

use super::AppState;

/// Readiness is the database answering in time; the fulfilment consumer's state is in its
/// metrics, not in `/healthz` (orders are taken while it catches up).
impl FromRef<AppState> for Operations {
    fn from_ref(state: &AppState) -> Self {
        Operations::new(state.pool.clone(), state.metrics.registry().clone())
    }
}
