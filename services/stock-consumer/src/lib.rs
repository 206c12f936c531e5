//! The stock consumer: reserves stock for paid orders (all lines or nothing, publishing the
//! decision), and releases, deducts or restocks it as the warehouse cancels, ships or receives
//! returns. Warehouse counts are set over HTTP. Every change commits together with its inbox
//! row and its events in the outbox (`aggregate_type = stock`); the database's constraints
//! hold the invariants (`on_hand >= 0`, `0 <= reserved <= on_hand`, one movement of a kind per
//! order line).
//!
//! - [`domain`]: the reservation states and movement kinds; [`stock`]: the rules, on top of
//!   [`store`] (SQL) and [`events`] (payloads).
//! - [`handler`]: the consumer runtime's handler; [`http`]: the API.
//! - [`config`], [`metrics`], [`server`]: what the binary needs to run.

pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod handler;
pub mod http;
pub mod metrics;
pub mod server;
pub mod stock;
pub mod store;

pub use error::Error;
pub use handler::StockHandler;
pub use http::{router, AppState};
pub use metrics::Metrics;
