//! The outbox relay: moves committed outbox rows from PostgreSQL to Kafka, at least once, in
//! order per aggregate, surviving crashes and outages of either side.
//!
//! - [`config`]: flags and environment of the binary.
//! - [`store`]: the SQL (claim, fenced mark, lease, backlog).
//! - [`publisher`]: the idempotent Kafka producer and a batch's delivery outcomes.
//! - [`relay`]: the loop that drives both; [`lease`] keeps the leader lease.
//! - [`metrics`], [`status`]: what operators see.

pub mod config;
pub mod kafka_context;
pub mod lease;
pub mod metrics;
pub mod outage;
pub mod publisher;
pub mod quarantine;
pub mod relay;
pub mod status;
pub mod store;
pub mod topics;

pub use relay::{Relay, RelaySettings};
pub use store::Store;
