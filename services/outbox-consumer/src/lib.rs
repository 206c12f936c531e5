#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! The Kafka consumer runtime every consuming service shares.
//!
//! A service implements [`Handler`] (which event types and versions it applies, and how, inside
//! a transaction it is given) and calls [`run`]. The runtime is a consumer-group member with
//! manual offsets:
//!
//! - each message is applied in one PostgreSQL transaction that first inserts its
//!   `(consumer_name, event_id)` row into the inbox ([`crate::inbox`]); a conflict means
//!   "already applied": the effect is skipped, the duplicate counted, the offset moves on;
//! - the offset is stored only after that transaction committed; librdkafka commits stored
//!   offsets only, so no commit (periodic, on rebalance, on shutdown) passes an unapplied
//!   message;
//! - an infrastructure failure (database unreachable, pool timeout, deadlock, serialization
//!   failure, ...) is retried with backoff on the same message for as long as it takes; the
//!   offset stays;
//! - a failure that comes back the same on every attempt (a row not found, a value that does
//!   not decode) and a handler panic are retried a bounded number of times
//!   (`--max-attempts-deterministic`, default 5), then dead-lettered; a panic is contained: the
//!   attempt's transaction rolls back and the partition goes on;
//! - a message that can never be applied (missing or broken contract headers, unknown event
//!   version, undecodable payload, an effect the database's constraints refuse) goes to
//!   `<topic>.dlq` at once with the error in its `dlq.error` header, and consumption continues;
//! - partitions are applied concurrently, each by its own worker in offset order, so the
//!   events of one key (one aggregate) are applied in order; a partition whose worker retries
//!   is paused, so it holds back only itself; a worker that dies of a panic outside the
//!   handler is restarted from the first message it did not finish (`supervisor`);
//! - `dlq list` / `dlq redrive` ([`dlq_cli`], [`redrive`]) show a consumer's dead letters and
//!   send them back to that consumer alone, through its redrive topic
//!   (`<topic>.<consumer>.redrive`, which it subscribes to besides `<topic>`); the inbox makes
//!   a redrive of an event that was applied meanwhile a duplicate.
//!
//! Files: [`config`] (flags, librdkafka settings), [`event`] (decoding), [`handler`] (the
//! service's part, error dispositions), [`apply`] (one attempt, backoff), `worker` (a
//! partition's loop), `runtime` (the fetch loop, rebalances, shutdown), `registry` (the
//! workers of a runtime), `supervisor` (starting workers, restarting dead ones), `flow` (hand-off, pause and resume), [`dlq`], [`dlq_cli`], [`redrive`], [`topics`], [`metrics`], [`lag`] (lag per partition).

pub mod apply;
pub mod config;
pub mod dlq;
pub mod dlq_cli;
pub mod event;
mod flow;
pub mod handler;
pub mod inbox;
pub mod lag;
pub mod metrics;
pub mod redrive;
mod registry;
mod runtime;
mod supervisor;
pub mod topics;
mod worker;

pub use apply::{apply, Applied, RetryPolicy};
pub use config::{dead_letter_topic, redrive_topic, ConsumerArgs, RuntimeConfig, TopicSpec};
pub use event::{Envelope, Event, MessageValue, RawMessage, Rejection, EVENT_VERSION_HEADER};
pub use handler::{Disposition, Effect, Handler, HandlerError};
pub use metrics::ConsumerMetrics;
pub use runtime::{run, ConsumerError};
