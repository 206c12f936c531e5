//! The `outbounds` and `outbound_lines` tables: an order's outbound, its status and its lines
//! (what ships, what a refund took out before shipping, what came back).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{OutboundStatus, Shipment};

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
