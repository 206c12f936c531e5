#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! - [`outbox`]: write an event inside the caller's database transaction ([`enqueue`]).
//! - [`envelope`]: how an outbox row maps onto a Kafka message (topic, key, headers); the relay
//!   and the consumers both use it, so the contract lives in one place.
//! - [`schema`]: the outbox, inbox and ledger migrations, embedded.
//! - [`db`]: which database errors are transient (the one retryable-SQLSTATE list).
//!
//! The trace context an event carries is [`outbox_trace`]'s, re-exported as [`trace`].

pub mod db;
pub mod envelope;
pub mod outbox;
pub mod schema;

pub use outbox_trace as trace;

pub use envelope::{EventEnvelope, HeaderOptions, Payload, DEFAULT_TOPIC_PREFIX};
pub use outbox::{enqueue, notify_relay, EnqueuedEvent, NewEvent, NewPayload, OutboxError};
