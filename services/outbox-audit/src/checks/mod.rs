//! The reconciliation itself, as pure functions over what was read: the cross-database business
//! checks (outbounds, reservations, stock movements) and the event checks (broker against the
//! ledgers, the inboxes and the committed offsets).
//!
//! `business.rs` holds the business checks, `events.rs` the event checks.

mod business;
mod events;

pub use business::{business, Business};
pub use events::{events, ledger_topic, ConsumerView, EventCounts, LedgerView};
