//! The `order_holds` table: per order, what holds its fulfilment (an open or succeeded
//! refund, a cancellation), the units a refund takes back, whether they were taken out of the
//! outbound before shipping (a cut), and whether their return arrived.

use sqlx::PgConnection;
use uuid::Uuid;

use super::outbounds::Units;
use crate::domain::Holds;

/// One hold of an order, as the rules need it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct HoldRow {
    /// `refund:<refund_no>`, `order-cancelled`, `held:<reason>`.
    pub hold: String,
    /// Whether it holds.
    pub active: bool,
    /// The refund's lines; `None`: the whole order.
    pub lines: Option<sqlx::types::Json<Vec<Units>>>,
}

/// Opens a hold on the order, or opens it again if it was released (a refund's terms changed
/// to ones that hold: `RefundRequested` again); a permanent one stays so. Events of one order
/// arrive in order, and a refund's request never follows its close or success, so this never
/// reopens a finished refund; a refund by line whose units were taken out before shipping (a
/// request copied under a new event id after the success) stays released all the same.
///
/// # Errors
/// When the query fails.
pub async fn open_hold(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_holds (order_id, hold, active) VALUES ($1, $2, true) \
         ON CONFLICT (order_id, hold) DO UPDATE SET active = true, updated_at = now() \
         WHERE NOT order_holds.active AND order_holds.cut IS NULL",
    )
    .bind(order_id)
    .bind(hold)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the units a refund's hold takes back (`None`: the whole order), creating the hold
/// released if it does not exist yet; the newest terms replace older ones.
///
/// # Errors
/// When the query fails.
pub async fn set_hold_lines(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
    lines: Option<&[Units]>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_holds (order_id, hold, active, lines) VALUES ($1, $2, false, $3) \
         ON CONFLICT (order_id, hold) DO UPDATE SET lines = $3, updated_at = now()",
    )
    .bind(order_id)
    .bind(hold)
    .bind(lines.map(sqlx::types::Json))
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks a hold's units to be taken out of the outbound (a refund by line succeeded before
/// shipping), once: a hold cut already stays so.
///
/// # Errors
/// When the query fails.
pub async fn mark_cut_pending(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE order_holds SET cut = 'PENDING', updated_at = now() \
         WHERE order_id = $1 AND hold = $2 AND cut IS NULL AND lines IS NOT NULL",
    )
    .bind(order_id)
    .bind(hold)
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether a refund's units were marked to be taken out of the outbound (pending or done): its
/// success was applied before shipping.
///
/// # Errors
/// When the query fails.
pub async fn is_cut(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM order_holds \
         WHERE order_id = $1 AND hold = $2 AND cut IS NOT NULL)",
    )
    .bind(order_id)
    .bind(hold)
    .fetch_one(conn)
    .await
}

/// The holds whose units wait to be taken out of the outbound: `(hold, lines)`.
///
/// # Errors
/// When the query fails.
pub async fn pending_cuts(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Vec<(String, sqlx::types::Json<Vec<Units>>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT hold, lines FROM order_holds \
         WHERE order_id = $1 AND cut = 'PENDING' AND lines IS NOT NULL ORDER BY created_at, hold",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await
}

/// Marks a pending cut done.
///
/// # Errors
/// When the query fails.
pub async fn mark_cut_done(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE order_holds SET cut = 'DONE', updated_at = now() \
         WHERE order_id = $1 AND hold = $2 AND cut = 'PENDING'",
    )
    .bind(order_id)
    .bind(hold)
    .execute(conn)
    .await?;
    Ok(())
}

/// The active holds whose return has not arrived: what a return receipt takes in.
///
/// # Errors
/// When the query fails.
pub async fn holds_expecting_goods(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Vec<HoldRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT hold, active, lines FROM order_holds \
         WHERE order_id = $1 AND active AND received_at IS NULL ORDER BY created_at, hold",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await
}

/// Marks holds received (their return arrived).
///
/// # Errors
/// When the query fails.
pub async fn mark_received(
    conn: &mut PgConnection,
    order_id: Uuid,
    holds: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE order_holds SET received_at = now(), updated_at = now() \
         WHERE order_id = $1 AND hold = ANY($2) AND received_at IS NULL",
    )
    .bind(order_id)
    .bind(holds)
    .execute(conn)
    .await?;
    Ok(())
}

/// Releases a hold unless it became permanent; records it released if it was never opened.
///
/// # Errors
/// When the query fails.
pub async fn release_hold(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_holds (order_id, hold, active) VALUES ($1, $2, false) \
         ON CONFLICT (order_id, hold) DO UPDATE SET active = false, updated_at = now() \
         WHERE NOT order_holds.permanent",
    )
    .bind(order_id)
    .bind(hold)
    .execute(conn)
    .await?;
    Ok(())
}

/// Makes a hold permanent (opening it if needed): the order will never ship from here on.
///
/// # Errors
/// When the query fails.
pub async fn make_hold_permanent(
    conn: &mut PgConnection,
    order_id: Uuid,
    hold: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_holds (order_id, hold, active, permanent) VALUES ($1, $2, true, true) \
         ON CONFLICT (order_id, hold) DO UPDATE SET active = true, permanent = true, updated_at = now()",
    )
    .bind(order_id)
    .bind(hold)
    .execute(conn)
    .await?;
    Ok(())
}

/// The order's holds taken together; a hold whose return arrived no longer counts.
///
/// # Errors
/// When the query fails.
pub async fn holds(conn: &mut PgConnection, order_id: Uuid) -> Result<Holds, sqlx::Error> {
    let (active, permanent): (bool, bool) = sqlx::query_as(
        "SELECT COALESCE(bool_or(active), false), COALESCE(bool_or(permanent), false) \
         FROM order_holds WHERE order_id = $1 AND received_at IS NULL",
    )
    .bind(order_id)
    .fetch_one(conn)
    .await?;
    Ok(Holds { active, permanent })
}
