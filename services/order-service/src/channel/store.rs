//! The channel tables' SQL (`migrations/order/20260201000003_channel.sql`). Each function takes
//! the caller's connection: a message's layers and its effect commit together.

use sqlx::PgConnection;
use uuid::Uuid;

/// Records a message's `msg_id` (layer 1). Returns `true` when it is new; a known `msg_id`
/// only has its `duplicates` counted. Blocks while another transaction holds the same id
/// uncommitted, so concurrent deliveries of one message apply once.
///
/// # Errors
/// When the query fails.
pub async fn record_message(
    conn: &mut PgConnection,
    channel: &str,
    msg_id: &str,
    msg_type: &str,
    external_order_id: &str,
    source: &str,
) -> Result<bool, sqlx::Error> {
    // `xmax = 0` only for a freshly inserted row.
    sqlx::query_scalar(
        "INSERT INTO channel_messages (msg_id, channel, msg_type, external_order_id, source, outcome) \
         VALUES ($1, $2, $3, $4, $5, 'applied') \
         ON CONFLICT (msg_id) DO UPDATE \
             SET duplicates = channel_messages.duplicates + 1, last_duplicate_at = now() \
         RETURNING (xmax = 0)",
    )
    .bind(msg_id)
    .bind(channel)
    .bind(msg_type)
    .bind(external_order_id)
    .bind(source)
    .fetch_one(conn)
    .await
}

/// Sets the outcome of a message recorded in this transaction.
///
/// # Errors
/// When the query fails.
pub async fn set_outcome(
    conn: &mut PgConnection,
    msg_id: &str,
    outcome: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE channel_messages SET outcome = $2 WHERE msg_id = $1")
        .bind(msg_id)
        .bind(outcome)
        .execute(conn)
        .await?;
    Ok(())
}

/// The change a message carries, as layer 2 keys it.
#[derive(Debug, Clone, Copy)]
pub struct ChangeKey<'a> {
    /// The channel.
    pub channel: &'a str,
    /// The platform's order id.
    pub external_order_id: &'a str,
    /// `trade` or `refund`.
    pub kind: &'a str,
    /// The platform's refund id (`""` for trades).
    pub external_refund_id: &'a str,
    /// The reported status.
    pub status: &'a str,
    /// The snapshot's `modified`.
    pub modified_ms: i64,
}

/// Records a change (layer 2); `false` when the same change was recorded before, under any
/// `msg_id`.
///
/// # Errors
/// When the query fails.
pub async fn record_change(
    conn: &mut PgConnection,
    key: ChangeKey<'_>,
    msg_id: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO channel_changes \
             (channel, external_order_id, kind, external_refund_id, status, modified_ms, msg_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(key.channel)
    .bind(key.external_order_id)
    .bind(key.kind)
    .bind(key.external_refund_id)
    .bind(key.status)
    .bind(key.modified_ms)
    .bind(msg_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Serializes every channel writer of one platform order until the transaction ends.
///
/// # Errors
/// When the query fails.
pub async fn lock_external_order(
    conn: &mut PgConnection,
    channel: &str,
    external_order_id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('channel:' || $1 || ':' || $2, 0))")
        .bind(channel)
        .bind(external_order_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Our order for a platform order, if we have one.
///
/// # Errors
/// When the query fails.
pub async fn find_order(
    conn: &mut PgConnection,
    channel: &str,
    external_order_id: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT order_id FROM channel_orders WHERE channel = $1 AND external_order_id = $2",
    )
    .bind(channel)
    .bind(external_order_id)
    .fetch_optional(conn)
    .await
}

/// Maps a platform order to ours.
///
/// # Errors
/// When the query fails (a unique violation if it is mapped already).
pub async fn insert_order(
    conn: &mut PgConnection,
    channel: &str,
    external_order_id: &str,
    order_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO channel_orders (channel, external_order_id, order_id) VALUES ($1, $2, $3)",
    )
    .bind(channel)
    .bind(external_order_id)
    .bind(order_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The platform order of one of our orders, if it came from a channel.
///
/// # Errors
/// When the query fails.
pub async fn external_order_of(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<(String, String)>, sqlx::Error> {
    sqlx::query_as("SELECT channel, external_order_id FROM channel_orders WHERE order_id = $1")
        .bind(order_id)
        .fetch_optional(conn)
        .await
}

/// The newest snapshot applied of a platform refund: `(last_status, last_modified_ms)`.
///
/// # Errors
/// When the query fails.
pub async fn find_refund(
    conn: &mut PgConnection,
    channel: &str,
    external_refund_id: &str,
) -> Result<Option<(String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT last_status, last_modified_ms FROM channel_refunds \
         WHERE channel = $1 AND external_refund_id = $2",
    )
    .bind(channel)
    .bind(external_refund_id)
    .fetch_optional(conn)
    .await
}

/// A platform refund's snapshot as `channel_refunds` records it.
#[derive(Debug, Clone, Copy)]
pub struct RefundSnapshot<'a> {
    /// The channel.
    pub channel: &'a str,
    /// The platform's refund id.
    pub external_refund_id: &'a str,
    /// The platform's order id.
    pub external_order_id: &'a str,
    /// Our refund.
    pub refund_no: &'a str,
    /// The platform's status.
    pub status: &'a str,
    /// The snapshot's `modified`.
    pub modified_ms: i64,
    /// The snapshot's amount.
    pub refund_cents: i64,
}

/// Records the newest snapshot applied of a platform refund, its amount included (inserting it
/// the first time). The caller decided that it supersedes the one recorded (a newer
/// `modified`, or the same one with a status further along), so only an older `modified` is
/// refused here.
///
/// # Errors
/// When the query fails.
pub async fn upsert_refund(
    conn: &mut PgConnection,
    snapshot: RefundSnapshot<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO channel_refunds \
             (channel, external_refund_id, external_order_id, refund_no, last_status, last_modified_ms, \
              last_refund_cents) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (channel, external_refund_id) DO UPDATE \
             SET last_status = EXCLUDED.last_status, last_modified_ms = EXCLUDED.last_modified_ms, \
                 last_refund_cents = EXCLUDED.last_refund_cents \
             WHERE channel_refunds.last_modified_ms <= EXCLUDED.last_modified_ms",
    )
    .bind(snapshot.channel)
    .bind(snapshot.external_refund_id)
    .bind(snapshot.external_order_id)
    .bind(snapshot.refund_no)
    .bind(snapshot.status)
    .bind(snapshot.modified_ms)
    .bind(snapshot.refund_cents)
    .execute(conn)
    .await?;
    Ok(())
}

/// Duplicates absorbed so far, per layer: `(layer 1, layer 2, stale snapshots)`.
///
/// # Errors
/// When the query fails.
pub async fn dedupe_counts(conn: &mut PgConnection) -> Result<(i64, i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT COALESCE(sum(duplicates), 0)::bigint, \
                count(*) FILTER (WHERE outcome = 'duplicate_change'), \
                count(*) FILTER (WHERE outcome = 'stale') \
         FROM channel_messages",
    )
    .fetch_one(conn)
    .await
}
