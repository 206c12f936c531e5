//! The WMS outbound consumer: turns reserved orders into outbound orders, stops or recalls them
//! when orders are refunded or cancelled, and takes the warehouse's actions over HTTP. Every
//! change commits together with its inbox row (for consumed events) and its own events in the
//! outbox (`aggregate_type = outbound`), which an `outbox-relay` publishes.
//!
//! - [`domain`]: the outbound state machine, validated request texts.
//! - [`fulfilment`]: the rules, on top of [`store`] (SQL) and [`events`] (payloads).
//! - [`handler`]: the consumer runtime's handler; [`http`]: the API.
//! - [`config`], [`metrics`], [`server`]: what the binary needs to run.

pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod fulfilment;
pub mod handler;
pub mod http;
pub mod metrics;
pub mod server;
pub mod store;

pub use error::Error;
pub use handler::WmsHandler;
pub use http::{router, AppState};
pub use metrics::Metrics;
