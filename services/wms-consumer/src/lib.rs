#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The WMS outbound consumer: turns reserved orders into outbound orders, stops or recalls them
//! when orders are refunded or cancelled, and takes the warehouse's actions over HTTP. Every
//! change commits together with its inbox row (for consumed events) and its own events in the
//! outbox (`aggregate_type = outbound`), which an `outbox-relay` publishes.
//!
//! - [`domain`]: the outbound state machine, how events change holds, validated request texts.
//! - [`fulfilment`]: the rules, on top of [`store`] (SQL) and [`events`] (payloads).
//! - [`handler`]: the consumer runtime's handler; [`http`]: the API.
//! - [`config`] and [`service`]: what the binary needs to run, on the shared skeleton
//!   ([`outbox_consumer_service::ConsumerService`]).

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

use outbox_consumer_service::ConsumerService;

/// All metrics of this process: HTTP requests (`wms_http_requests_total`) and the
/// consumer runtime's (including inbox duplicates).
pub type Metrics = outbox_consumer_service::ConsumerServiceMetrics;

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
    .state_gauges(|registry| {
        outbox_http::service::StateGauges::new()
            .gauge_by(
                registry,
                "wms_outbounds_waiting",
                "Outbounds waiting on a refund: held before shipping (INTERCEPTED) or recalled after (RECALL)",
                "status",
                WAITING_COUNT,
            )
            .gauge_by(
                registry,
                "wms_outbound_oldest_waiting_age_seconds",
                "Age of the oldest outbound waiting on a refund, by status (since it entered it; 0 without one)",
                "status",
                WAITING_AGE,
            )
    })
}

/// Outbounds held or recalled, both statuses always present.
const WAITING_COUNT: &str = "SELECT s, count(o.outbound_no)::float8 \
     FROM unnest(ARRAY['INTERCEPTED', 'RECALL']) s LEFT JOIN outbounds o ON o.status = s GROUP BY s";

/// The oldest of them per status (`updated_at` is when the outbound entered its status).
const WAITING_AGE: &str = "SELECT s, coalesce(extract(epoch FROM now() - min(o.updated_at)), 0)::float8 \
     FROM unnest(ARRAY['INTERCEPTED', 'RECALL']) s LEFT JOIN outbounds o ON o.status = s GROUP BY s";
