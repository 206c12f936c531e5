//! The marketplace channel: the platform pushes signed `TradeSync` (order changes) and
//! `RefundSync` (refund snapshots) messages to `POST /channels/marketplace/push`; the same
//! changes can also be fetched by the compensation poller. Both go through [`apply::apply`]:
//!
//! 1. **transport dedupe**: `channel_messages.msg_id` is unique; a message seen before only
//!    counts `duplicates` on its row (layer 1);
//! 2. **business dedupe**: `channel_changes` is unique on the change itself (external order
//!    id, kind, status, refund id, `modified`), so the same change under a new `msg_id` has no
//!    second effect (layer 2, outcome `duplicate_change`);
//! 3. refund snapshots apply only when newer than the last one applied
//!    (`channel_refunds.last_modified_ms`, outcome `stale`);
//! 4. the effect goes through the same order, payment and refund code as direct callers
//!    ([`crate::orders`], [`crate::payments`], [`crate::refunds`]), so stock and WMS work
//!    unchanged through the outbox.
//!
//! Lost pushes are recovered by [`compensation`] (the platform's query API, through the same
//! path); a shipped channel order's tracking number goes back by [`shipback`].
//!
//! Everything, layers included, is one transaction: a message that fails (unknown order,
//! amount mismatch, refund above what was paid) writes nothing and the platform sends it again.

pub mod apply;
pub mod client;
pub mod compensation;
pub mod message;
pub mod shipback;
pub mod store;

pub use apply::{apply, Outcome, Source};
pub use client::PlatformClient;
pub use message::{ChannelMessage, PushBody, RefundChange, TradeChange};

/// The channel's name in the channel tables.
pub const MARKETPLACE: &str = "marketplace";

/// The channel's namespace: its buyers' user ids (`marketplace:<buyer_id>`), its payments'
/// transaction ids and its refunds' numbers start with it. Customer tokens whose `sub`
/// starts with it are refused, and so are customer refund numbers, so no local customer owns
/// a buyer's orders or takes a platform refund's number.
pub const NAMESPACE: &str = "marketplace:";

/// Whether `id` (a user id, refund number, ...) is in the channel's namespace.
pub fn in_namespace(id: &str) -> bool {
    id.starts_with(NAMESPACE)
}
