#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! Each module is one of the `outbox-*` crates, or a module of one, under the path it had
//! when this was one crate:
//!
//! - `outbox-writer`: [`outbox`], [`envelope`], [`schema`], [`db`], [`enqueue`].
//! - `outbox-trace`: [`trace`].
//! - `outbox-process`: [`process`], and its [`pg`], [`secret_file`], [`secrets`],
//!   [`retention`], [`poll`] under their old paths.
//! - `outbox-kafka` (feature `kafka`): `kafka`.
//! - `outbox-consumer` (feature `consumer`): `consumer` and `inbox`.
//! - `outbox-http` (feature `service`): `service`, `auth`, `validate`, `signature`,
//!   `text_newtype!`.

pub use outbox_process as process;
pub use outbox_process::{pg, poll, retention, secret_file, secrets};
pub use outbox_trace as trace;
pub use outbox_writer::{db, envelope, outbox, schema};

#[cfg(feature = "consumer")]
pub use outbox_consumer as consumer;
#[cfg(feature = "consumer")]
pub use outbox_consumer::inbox;
#[cfg(feature = "service")]
pub use outbox_http::{auth, service, signature, text_newtype, validate};
#[cfg(feature = "kafka")]
pub use outbox_kafka as kafka;

pub use outbox_writer::{
    enqueue, notify_relay, EnqueuedEvent, EventEnvelope, HeaderOptions, NewEvent, NewPayload,
    OutboxError, Payload, DEFAULT_TOPIC_PREFIX,
};
