#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! Shared library for services that publish and consume domain events through the
//! transactional outbox.
//!
//! - [`outbox`]: write an event inside the caller's database transaction ([`outbox::enqueue`]).
//! - [`db`]: which database errors are transient (the one retryable-SQLSTATE list).
//! - [`pg`]: the PostgreSQL connection options every binary builds (TLS from the URL, the
//!   password from `DATABASE_PASSWORD_FILE`); [`secret_file`]: secrets read from files.
//! - [`envelope`]: how an outbox row maps onto a Kafka message (topic, key, headers); the relay
//!   and the consumers both use it, so the contract lives in one place.
//! - [`schema`]: the outbox and inbox migrations, embedded.
//! - [`inbox`]: the consumers' dedupe table, written in the business transaction.
//! - `consumer` (feature `consumer`): the Kafka consumer runtime (inbox, manual offsets,
//!   retries, dead letters).
//! - `kafka` (feature `kafka`, part of `consumer`): the Kafka security flags (TLS, SASL) every
//!   binary takes, the librdkafka settings made from them, and the start-up connection check.
//! - `retention` (feature `retention`): the bounded-batch purge of rows past a retention
//!   window, shared by every service.
//! - `service` (feature `service`): logging, SIGTERM, HTTP serving, `/healthz` / `/metrics`
//!   and the JSON error envelope for service binaries; with `consumer` also the builder of a
//!   consuming service.
//! - `auth` (feature `auth`): bearer-token (JWT) verification, the `Customer` / `Operator`
//!   extractors and their 401/403 answers, token minting for tests and tools.
//! - `secrets` (feature `secrets`, part of `service`): the start-up refusal of weak or
//!   published secrets and its development switch `--allow-weak-secrets`.
//! - `signature` (feature `signature`): HMAC-SHA256 signatures of pushed request bodies.
//! - [`poll`]: waiting on a condition with a deadline (the tests' waits).
//! - [`trace`]: W3C trace context carried from requests through the outbox and Kafka into the
//!   consumers and the events they emit; with feature `otlp` (part of `service`) optional span
//!   export over OTLP/HTTP.
//! - [`validate`]: the one validator of client text and integers (and, with `service`, the
//!   OpenAPI schemas built from the same rules).

#[cfg(feature = "auth")]
pub mod auth;
#[cfg(feature = "consumer")]
pub mod consumer;
pub mod db;
pub mod envelope;
pub mod inbox;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod outbox;
pub mod pg;
pub mod poll;
#[cfg(feature = "retention")]
pub mod retention;
pub mod schema;
pub mod secret_file;
#[cfg(feature = "secrets")]
pub mod secrets;
#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "signature")]
pub mod signature;
pub mod trace;
pub mod validate;

/// For [`text_newtype!`]'s expansion in other crates.
#[cfg(feature = "service")]
#[doc(hidden)]
pub use utoipa as __utoipa;

pub use envelope::{EventEnvelope, HeaderOptions, Payload, DEFAULT_TOPIC_PREFIX};
pub use outbox::{enqueue, notify_relay, EnqueuedEvent, NewEvent, NewPayload, OutboxError};
