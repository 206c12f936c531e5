//! The WMS tables' SQL. Every function takes the caller's connection, so the caller decides
//! the transaction; every writer of an order calls [`lock_order`] first.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{Holds, OutboundStatus, Shipment};

const OUTBOUND_COLUMNS: &str = "outbound_no, order_id, status, carrier, tracking_no, created_at, \
     updated_at, shipped_at, returned_at";

/// One `outbounds` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboundRow {
    /// The warehouse's number.
    pub outbound_no: String,
    /// The order it fulfils.
    pub order_id: Uuid,
    /// Where it is.
    #[sqlx(try_from = "String")]
    pub status: OutboundStatus,
    /// Carrier, once shipped.
    pub carrier: Option<String>,
    /// Tracking number, once shipped.
    pub tracking_no: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it was shipped.
    pub shipped_at: Option<DateTime<Utc>>,
    /// When the return arrived.
    pub returned_at: Option<DateTime<Utc>>,
}

/// One line of an outbound.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    sqlx::FromRow,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
pub struct LineRow {
    /// The SKU.
    pub sku_id: String,
    /// Units to ship (fewer once a refund by line took some out before shipping), or shipped.
    pub quantity: i32,
    /// Units received back so far (a return may be partial: by line, or some units of one).
    #[serde(default)]
    pub returned_quantity: i32,
}

/// Units of one SKU: what a refund takes back, or what one return brought.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    sqlx::FromRow,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
pub struct Units {
    /// The SKU.
    pub sku_id: String,
    /// Units.
    pub quantity: i32,
}

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

/// Creates the order's outbound in `CREATED`; `None` when the order has one already (nothing
/// written).
///
/// # Errors
/// When the query fails.
pub async fn insert_outbound(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<OutboundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO outbounds (order_id, status) VALUES ($1, 'CREATED') \
         ON CONFLICT ON CONSTRAINT outbounds_one_per_order DO NOTHING \
         RETURNING {OUTBOUND_COLUMNS}"
    ))
    .bind(order_id)
    .fetch_optional(conn)
    .await
}

/// Inserts an outbound's lines in one statement.
///
/// # Errors
/// When the database rejects them (e.g. a non-positive quantity, a repeated SKU).
pub async fn insert_lines(
    conn: &mut PgConnection,
    outbound_no: &str,
    lines: &[LineRow],
) -> Result<(), sqlx::Error> {
    let skus: Vec<&str> = lines.iter().map(|l| l.sku_id.as_str()).collect();
    let quantities: Vec<i32> = lines.iter().map(|l| l.quantity).collect();
    sqlx::query(
        "INSERT INTO outbound_lines (outbound_no, sku_id, quantity) \
         SELECT $1, * FROM UNNEST($2::text[], $3::int[])",
    )
    .bind(outbound_no)
    .bind(&skus)
    .bind(&quantities)
    .execute(conn)
    .await?;
    Ok(())
}

/// An outbound by number.
///
/// # Errors
/// When the query fails.
pub async fn find(
    conn: &mut PgConnection,
    outbound_no: &str,
) -> Result<Option<OutboundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {OUTBOUND_COLUMNS} FROM outbounds WHERE outbound_no = $1"
    ))
    .bind(outbound_no)
    .fetch_optional(conn)
    .await
}

/// The outbound of an order, if it has one.
///
/// # Errors
/// When the query fails.
pub async fn find_by_order(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<OutboundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {OUTBOUND_COLUMNS} FROM outbounds WHERE order_id = $1"
    ))
    .bind(order_id)
    .fetch_optional(conn)
    .await
}

/// An outbound's lines by SKU.
///
/// # Errors
/// When the query fails.
pub async fn lines(
    conn: &mut PgConnection,
    outbound_no: &str,
) -> Result<Vec<LineRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT sku_id, quantity, returned_quantity FROM outbound_lines \
         WHERE outbound_no = $1 ORDER BY sku_id",
    )
    .bind(outbound_no)
    .fetch_all(conn)
    .await
}

/// Moves an outbound from `from` to `to` (a hold change or a received return) if it is in
/// `from` now; `None` when it was not (nothing changed).
///
/// # Errors
/// When the query fails or a CHECK refuses the result.
pub async fn set_status(
    conn: &mut PgConnection,
    outbound_no: &str,
    from: OutboundStatus,
    to: OutboundStatus,
) -> Result<Option<OutboundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE outbounds SET status = $3, updated_at = now(), \
             returned_at = CASE WHEN $3 = 'RETURNED' THEN now() ELSE returned_at END \
         WHERE outbound_no = $1 AND status = $2 \
         RETURNING {OUTBOUND_COLUMNS}"
    ))
    .bind(outbound_no)
    .bind(from.as_str())
    .bind(to.as_str())
    .fetch_optional(conn)
    .await
}

/// Ships a `CREATED` outbound; `None` when it is not `CREATED` (nothing changed).
///
/// # Errors
/// When the query fails; a unique violation of `outbounds_tracking_no_once` when the tracking
/// number is on another outbound already.
pub async fn ship(
    conn: &mut PgConnection,
    outbound_no: &str,
    shipment: &Shipment,
) -> Result<Option<OutboundRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE outbounds SET status = 'SHIPPED', carrier = $2, tracking_no = $3, \
             shipped_at = now(), updated_at = now() \
         WHERE outbound_no = $1 AND status = 'CREATED' \
         RETURNING {OUTBOUND_COLUMNS}"
    ))
    .bind(outbound_no)
    .bind(shipment.carrier.as_str())
    .bind(shipment.tracking_no.as_str())
    .fetch_optional(conn)
    .await
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

/// Takes `units` of `sku_id` out of an unshipped outbound's line (a line left with none is
/// deleted).
///
/// # Errors
/// When the query fails.
pub async fn take_out(
    conn: &mut PgConnection,
    outbound_no: &str,
    sku_id: &str,
    units: i32,
) -> Result<(), sqlx::Error> {
    // Delete first: a line the update would leave with no more than `units` must stay.
    let deleted = sqlx::query(
        "DELETE FROM outbound_lines WHERE outbound_no = $1 AND sku_id = $2 AND quantity <= $3",
    )
    .bind(outbound_no)
    .bind(sku_id)
    .bind(units)
    .execute(&mut *conn)
    .await?;
    if deleted.rows_affected() == 0 {
        sqlx::query(
            "UPDATE outbound_lines SET quantity = quantity - $3 \
             WHERE outbound_no = $1 AND sku_id = $2",
        )
        .bind(outbound_no)
        .bind(sku_id)
        .bind(units)
        .execute(conn)
        .await?;
    }
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

/// Adds units received back to an outbound's lines.
///
/// # Errors
/// When the query fails (`outbound_lines_returned_within_quantity` past what shipped).
pub async fn add_returned(
    conn: &mut PgConnection,
    outbound_no: &str,
    received: &[Units],
) -> Result<(), sqlx::Error> {
    let skus: Vec<&str> = received.iter().map(|u| u.sku_id.as_str()).collect();
    let units: Vec<i32> = received.iter().map(|u| u.quantity).collect();
    sqlx::query(
        "UPDATE outbound_lines l SET returned_quantity = l.returned_quantity + r.units \
         FROM UNNEST($2::text[], $3::int[]) AS r (sku_id, units) \
         WHERE l.outbound_no = $1 AND l.sku_id = r.sku_id",
    )
    .bind(outbound_no)
    .bind(&skus)
    .bind(&units)
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
