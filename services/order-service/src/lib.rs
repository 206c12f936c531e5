#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The order service: orders, payments and refunds, each state change committed together with
//! its event in the transactional outbox (`outbox-writer`).
//!
//! - [`domain`]: validated newtypes, the state machines and the kinds of events.
//! - [`lines`]: order lines as received and validated (orders, refunds and marketplace trades
//!   share them).
//! - [`orders`], [`payments`], [`refunds`], [`catalog`]: the rules, each owning its
//!   transactions; [`store`] holds their SQL, [`views`] the snapshots built from its rows and
//!   [`events`] the outbox payloads.
//! - [`http`]: the API (parsing at the edge, errors as JSON); [`signature`] checks callbacks.
//! - [`channel`]: the marketplace channel (signed pushes, layered dedupe).
//! - [`fulfilment`]: consumed events that move orders (shipped, stock rejected);
//!   [`subscription`]: what that consumer reads (its name, topics, event versions).
//! - [`config`], [`server`], [`metrics`]: what the binary needs to run.

pub mod catalog;
pub mod channel;
pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod fulfilment;
pub mod http;
pub mod lines;
pub mod metrics;
pub mod orders;
pub mod payment_timeout;
pub mod payments;
pub mod refunds;
pub mod server;
pub mod signature;
pub mod store;
pub mod subscription;
pub mod views;

pub use error::Error;
pub use fulfilment::FulfilmentHandler;
pub use http::{router, AppState};
pub use metrics::Metrics;
pub use server::{migrate, serve, serve_with_limits};
pub use signature::CallbackSecret;
