//! What the fulfilment consumer subscribes to: its inbox name, the topics it reads and the
//! event versions it applies, from the system's contracts (`event-contracts`, which
//! `outbox-audit` reads too).

pub use event_contracts::order::{versions, CONSUMED_AGGREGATES, CONSUMER_NAME};

use outbox_consumer_service::ServiceIdentity;

/// The service as a consumer: its default consumer group, the prefix of its metrics, the
/// fulfilment consumer's name and topics.
pub const IDENTITY: ServiceIdentity = ServiceIdentity {
    name: "order-service",
    metrics_prefix: "order",
    consumer_name: CONSUMER_NAME,
    aggregate_types: &CONSUMED_AGGREGATES,
};
