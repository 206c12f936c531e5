#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The outbox relay: moves committed outbox rows from PostgreSQL to Kafka, at least once, in
//! order per aggregate, surviving crashes and outages of either side.
//!
//! - [`config`]: flags and environment of the binary.
//! - [`store`]: all of the relay's SQL (claim, fenced mark, lease, failure filter, failure
//!   records and parking, backlog, the catalog reads of `debezium-install`), a file each;
//!   [`store::session`] runs it safely behind PgBouncer's transaction pooling.
//! - [`publisher`]: the idempotent Kafka producer and a batch's delivery outcomes.
//! - [`relay`]: the loop that drives both; [`batch`] is one batch as its steps, [`decide`] the
//!   per-row decision; [`lease`] keeps the leader lease; [`retry`] the waits between attempts.
//! - [`failure`], [`parking`], [`topics`]: failure isolation — what a failure holds back, the
//!   durable retry/park records and the operator's commands, topic checks.
//! - [`metrics`], [`backlog_gauges`], [`status`], [`ops`]: what operators see and do.
//! - [`debezium`]: a Debezium-shaped outbox table, published as Debezium's router would (the
//!   trigger's SQL it generates lives there, not in [`store`]).

pub mod backlog_gauges;
pub mod batch;
pub mod buckets;
pub mod config;
pub mod debezium;
pub mod decide;
pub mod failure;
pub mod kafka_context;
pub mod lease;
pub mod metrics;
pub mod ops;
pub mod outage;
pub mod parking;
pub mod partitions;
pub mod publisher;
pub mod records;
pub mod relay;
pub mod retry;
pub mod status;
pub mod store;
pub mod topics;

pub use relay::{Relay, RelaySettings};
pub use store::Store;
