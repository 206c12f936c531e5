//! What the fulfilment consumer subscribes to: its inbox name, the topics it reads and the
//! event versions it applies, from the system's contracts (`event-contracts`, which
//! `outbox-audit` reads too).

pub use event_contracts::order::{versions, CONSUMED_AGGREGATES, CONSUMER_NAME};
