//! The WMS tables' SQL. Every function takes the caller's connection, so the caller decides
//! the transaction; every writer of an order calls [`lock_order`] first. `outbounds.rs` holds
//! the outbounds and their lines, `holds.rs` what holds an order's fulfilment.

mod holds;
mod outbounds;

use sqlx::PgConnection;
use uuid::Uuid;

pub use holds::{
    holds, holds_expecting_goods, is_cut, make_hold_permanent, mark_cut_done, mark_cut_pending,
    mark_received, open_hold, pending_cuts, release_hold, set_hold_lines, HoldRow,
};
pub use outbounds::{
    add_returned, find, find_by_order, insert_lines, insert_outbound, lines, set_status, ship,
    take_out, LineRow, OutboundRow, Units,
};

/// Serializes the writers of one order until the transaction ends (a transaction-scoped
/// advisory lock, so it works behind transaction-pooling proxies too). Events from different
/// topics and warehouse requests about one order then see each other's effects.
///
/// # Errors
/// When the query fails.
pub async fn lock_order(conn: &mut PgConnection, order_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('wms-order:' || $1::text, 0))")
        .bind(order_id)
        .execute(conn)
        .await?;
    Ok(())
}
