//! Publishing a batch of outbox rows to Kafka with an idempotent producer.
//!
//! All messages of a batch are handed to librdkafka at once (pipelined), in `id` order, keyed
//! by the row's `message_key` or else its aggregate id; the idempotent producer keeps their
//! order per partition. Each row's outcome comes from its own delivery report: only a report
//! that says "persisted" counts.
//!
//! The publisher and its producer session are `session`, a batch's sends and their outcomes
//! `sends`; the producer's configuration, and which of its settings a user may not change, live
//! in `settings`; the Kafka transactions of `--transactions`, in `transaction`; the trace span
//! of each message sent, in `span`.

mod record;
mod sends;
mod session;
mod settings;
mod span;
mod transaction;

pub use sends::Send;
pub use session::{Publisher, WireSettings};
pub use settings::{
    check_overrides, producer_config, transactional_producer_config, FORCED_SETTINGS,
    PRODUCER_DEFAULTS, PROTECTED_SETTINGS, TRANSACTION_TIMEOUT_MS,
};
