//! The WMS outbound consumer: turns reserved orders into outbound orders, stops or recalls them
//! when orders are refunded or cancelled, and takes the warehouse's actions over HTTP. Every
//! change commits together with its inbox row (for consumed events) and its own events in the
//! outbox (`aggregate_type = outbound`), which an `outbox-relay` publishes.
//!
//! - [`domain`]: the outbound state machine, validated request texts.
//! - [`fulfilment`]: the rules, on top of [`store`] (SQL) and [`events`] (payloads).
//! - [`handler`]: the consumer runtime's handler; [`http`]: the API.
//! - [`config`] and [`service`]: what the binary needs to run, on the shared skeleton
//!   ([`outbox_kit::service::ConsumerService`]).

pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod fulfilment;
pub mod handler;
pub mod http;
pub mod store;

pub use error::Error;
pub use handler::WmsHandler;
pub use http::{router, AppState};

use outbox_kit::service::ConsumerService;

/// All metrics of this process: HTTP requests (`wms_http_requests_total`) and the
/// consumer runtime's (including inbox duplicates).
pub type Metrics = outbox_kit::service::ConsumerServiceMetrics;

/// The WMS's own migrations (`migrations/wms`). Versions differ from the outbox's and the
/// inbox's; each migrator ignores the others'.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/wms");
    m.set_ignore_missing(true);
    m
}

/// This service on the shared skeleton: its name, migrations, HTTP API and event handler.
pub fn service() -> ConsumerService<WmsHandler> {
    ConsumerService::new(
        "wms-consumer",
        "wms",
        handler::CONSUMER_NAME,
        &handler::CONSUMED_AGGREGATES,
        WmsHandler,
    )
    .migrator(migrator())
    .router(|pool, metrics| router(AppState { pool, metrics }))
}
