//! The WMS rules: outbounds created from reserved stock, holds from refunds and cancellations,
//! and the warehouse's actions (ship, receive a return). Each function runs in the caller's
//! transaction (consumer) or owns one (HTTP), takes the order's lock first, and appends the
//! events of what it changed to the outbox in the same transaction.
//!
//! Events reach the WMS from two topics (orders, stock) in no particular order between them,
//! so holds are kept per order whether or not its outbound exists yet, and every change ends
//! by settling: the outbound moves to where its holds say
//! ([`crate::domain::OutboundStatus::settle`]).
//!
//! `consumed.rs` holds what consumed events do (in the consumer's transaction), `actions.rs`
//! the warehouse's actions over HTTP.

mod actions;
mod consumed;
#[cfg(test)]
mod tests;

pub use actions::{
    after_return, expected_back, for_order, get, return_received, ship, ActionResult,
};
pub use consumed::{change_hold, create_outbound, set_refund_lines, take};
