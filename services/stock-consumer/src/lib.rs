#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The stock consumer: reserves stock for paid orders (all lines or nothing, publishing the
//! decision), and releases, deducts or restocks it by line as the warehouse takes refunded
//! lines out of an outbound, cancels, ships or receives returns (whole or partial). Warehouse
//! counts are set over HTTP. Every change commits together with its inbox row and its events
//! in the outbox (`aggregate_type = stock`); the database's constraints hold the invariants
//! (`on_hand >= 0`, `0 <= reserved <= on_hand`, per line `released + deducted <= reserved` and
//! `restocked <= deducted`, a line reserved and deducted once).
//!
//! - [`domain`]: the reservation states and movement kinds; [`lines`]: the per-line rules (pure);
//!   [`stock`]: the rules, on top of [`store`] (SQL) and [`events`] (payloads).
//! - [`handler`]: the consumer runtime's handler; [`http`]: the API.
//! - [`config`] and [`service`]: what the binary needs to run, on the shared skeleton
//!   ([`outbox_consumer_service::ConsumerService`]).

pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod handler;
pub mod http;
pub mod lines;
pub mod stock;
pub mod store;

pub use error::Error;
pub use handler::StockHandler;
pub use http::{router, AppState};

use outbox_consumer_service::ConsumerService;

/// All metrics of this process: HTTP requests (`stock_http_requests_total`) and the
/// consumer runtime's (including inbox duplicates).
pub type Metrics = outbox_consumer_service::ConsumerServiceMetrics;

/// The stock consumer's own migrations (`migrations/stock`). Versions differ from the outbox's and the
/// inbox's; each migrator ignores the others'.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("../../migrations/stock");
    m.set_ignore_missing(true);
    m
}

/// This service on the shared skeleton: its name, migrations, HTTP API and event handler.
pub fn service() -> ConsumerService<StockHandler> {
    ConsumerService::new(
        "stock-consumer",
        "stock",
        handler::CONSUMER_NAME,
        &handler::CONSUMED_AGGREGATES,
        StockHandler,
    )
    .migrator(migrator())
    .router(|pool, metrics| router(AppState { pool, metrics }))
}
