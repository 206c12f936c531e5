//! Shared library for services that publish and consume domain events through the
//! transactional outbox.
//!
//! - [`outbox`]: write an event inside the caller's database transaction ([`outbox::enqueue`]).
//! - [`envelope`]: how an outbox row maps onto a Kafka message (topic, key, headers); the relay
//!   and the consumers both use it, so the contract lives in one place.
//! - [`schema`]: the outbox migrations, embedded.

pub mod envelope;
pub mod outbox;
pub mod schema;

pub use envelope::{EventEnvelope, DEFAULT_TOPIC_PREFIX};
pub use outbox::{enqueue, notify_relay, EnqueuedEvent, NewEvent, OutboxError};
