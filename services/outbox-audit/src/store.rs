//! The audit's SQL: what it reads from the three databases. Every connection is opened with
//! `default_transaction_read_only = on`, so the audit cannot change a row even by mistake.
//! Checks that one database can answer alone (stock and refund arithmetic) are single
//! statements, so they see one snapshot.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::report::Violation;

/// A read-only pool on `url`.
///
/// # Errors
/// When the URL does not parse or the database is unreachable.
pub async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    // Three databases, so no one DATABASE_PASSWORD_FILE: passwords come with each URL (or
    // PGPASSWORD / ~/.pgpass, which sqlx reads).
    let opts = outbox_process::pg::connect_options_with(url, None)?
        .options([("default_transaction_read_only", "on")])
        .application_name("outbox-audit");
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await
}

/// One order as the cross-database checks need it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OrderRow {
    /// The order.
    pub order_id: String,
    /// Its status.
    pub status: String,
    /// What its applied payment brought in (0 until paid).
    pub paid_cents: i64,
    /// Its payment starts fulfilment (a reservation, an outbound): paid, and not a marketplace
    /// trade first seen closed (cancelled with the money it took, never fulfilled).
    pub fulfils: bool,
    /// Changed within the settle window: left out of the cross-database checks.
    pub recent: bool,
}

/// Every order, with whether it changed within the last `settle`.
///
/// # Errors
/// When the query fails.
pub async fn orders(pool: &PgPool, settle: Duration) -> Result<Vec<OrderRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT order_id::text AS order_id, status, paid_cents, \
                (paid_cents > 0 AND NOT EXISTS (SELECT 1 FROM payments p \
                    WHERE p.order_id = o.order_id AND p.flag_reason = 'trade_closed')) AS fulfils, \
                (updated_at > now() - make_interval(secs => $1)) AS recent \
         FROM orders o",
    )
    .bind(settle.as_secs_f64())
    .fetch_all(pool)
    .await
}

/// One order line, or one outbound line, with the units back so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct LineRow {
    /// The order.
    pub order_id: String,
    /// The SKU.
    pub sku_id: String,
    /// Units ordered (an order line) or to ship / shipped (an outbound line).
    pub quantity: i64,
    /// Units received back (`returned_quantity`).
    pub returned: i64,
}

/// Every order line.
///
/// # Errors
/// When the query fails.
pub async fn order_lines(pool: &PgPool) -> Result<Vec<LineRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT order_id::text AS order_id, sku_id, quantity::bigint AS quantity, \
                returned_quantity::bigint AS returned \
         FROM order_items",
    )
    .fetch_all(pool)
    .await
}

/// Every line of a shipped outbound (`SHIPPED`, `RECALL`, `RETURNED`): what left the
/// warehouse and what came back.
///
/// # Errors
/// When the query fails.
pub async fn shipped_lines(pool: &PgPool) -> Result<Vec<LineRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT o.order_id::text AS order_id, l.sku_id, l.quantity::bigint AS quantity, \
                l.returned_quantity::bigint AS returned \
         FROM outbound_lines l JOIN outbounds o USING (outbound_no) \
         WHERE o.status IN ('SHIPPED', 'RECALL', 'RETURNED')",
    )
    .fetch_all(pool)
    .await
}

/// Orders whose `refund_reserved_cents` is not what their open and succeeded refunds plus the
/// part of a payment flagged by a stock rejection add up to.
///
/// # Errors
/// When the query fails.
pub async fn refund_arithmetic(pool: &PgPool) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT o.order_id::text, o.refund_reserved_cents, \
                (COALESCE(r.cents, 0) + COALESCE(p.cents, 0))::bigint AS expected \
         FROM orders o \
         LEFT JOIN (SELECT order_id, sum(amount_cents) AS cents FROM refunds \
                    WHERE status IN ('REQUESTED', 'SUCCEEDED') GROUP BY order_id) r USING (order_id) \
         LEFT JOIN (SELECT order_id, sum(refund_due_cents) AS cents FROM payments \
                    WHERE flag_reason IN ('stock_rejected', 'trade_closed') GROUP BY order_id) p USING (order_id) \
         WHERE o.refund_reserved_cents <> COALESCE(r.cents, 0) + COALESCE(p.cents, 0) \
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(order_id, refund_reserved_cents, expected_cents)| Violation::RefundArithmetic {
                order_id,
                refund_reserved_cents,
                expected_cents,
            },
        )
        .collect())
}

/// Every order's state for the cross-service comparison ([`crate::states`]).
///
/// # Errors
/// When the query fails.
pub async fn order_states(
    pool: &PgPool,
    settle: Duration,
) -> Result<Vec<crate::states::OrderState>, sqlx::Error> {
    sqlx::query_as(
        "SELECT o.order_id::text AS order_id, o.status, o.paid_cents, \
            COALESCE(r.refunded, 0)::bigint AS refunded_cents, \
            COALESCE(r.open, 0)::bigint AS open_refund_cents, \
            COALESCE((SELECT sum(refund_due_cents) FROM payments p WHERE p.order_id = o.order_id \
                AND p.flag_reason IN ('stock_rejected', 'trade_closed')), 0)::bigint AS owed_cents, \
            COALESCE(r.open_return, false) AS open_return, \
            COALESCE(r.paid_return, false) AS paid_return, \
            (COALESCE(r.open_refund_only, false) AND o.paid_cents = o.refund_reserved_cents) \
                AS holding_refund_only, \
            (o.status = 'RETURNED' OR o.return_received_at IS NOT NULL) AS goods_back, \
            (SELECT ch.status FROM channel_orders co JOIN channel_changes ch \
                ON ch.channel = co.channel AND ch.external_order_id = co.external_order_id \
                AND ch.kind = 'trade' \
             WHERE co.order_id = o.order_id ORDER BY ch.modified_ms DESC LIMIT 1) AS trade_status, \
            (o.updated_at > now() - make_interval(secs => $1)) AS recent \
         FROM orders o \
         LEFT JOIN (SELECT order_id, \
                sum(amount_cents) FILTER (WHERE status = 'SUCCEEDED') AS refunded, \
                sum(amount_cents) FILTER (WHERE status = 'REQUESTED') AS open, \
                bool_or(status = 'REQUESTED' AND kind = 'RETURN_AND_REFUND') AS open_return, \
                bool_or(status = 'SUCCEEDED' AND kind = 'RETURN_AND_REFUND') AS paid_return, \
                bool_or(status = 'REQUESTED' AND kind = 'REFUND_ONLY') AS open_refund_only \
             FROM refunds GROUP BY order_id) r USING (order_id)",
    )
    .bind(settle.as_secs_f64())
    .fetch_all(pool)
    .await
}

/// Every outbound with its status: `(order_id, outbound_no, status)`.
///
/// # Errors
/// When the query fails.
pub async fn outbound_states(pool: &PgPool) -> Result<Vec<(String, String, String)>, sqlx::Error> {
    sqlx::query_as("SELECT order_id::text, outbound_no, status FROM outbounds ORDER BY outbound_no")
        .fetch_all(pool)
        .await
}

/// Channel refunds whose newest snapshot recorded (layer 2, `channel_changes`) is final while
/// our refund is still `REQUESTED`: a final snapshot absorbed or dropped.
///
/// # Errors
/// When the query fails.
pub async fn channel_refunds_unfinished(pool: &PgPool) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT r.order_id::text, r.refund_no, c.status \
         FROM channel_refunds cr JOIN refunds r USING (refund_no) \
         JOIN LATERAL (SELECT ch.status FROM channel_changes ch \
             WHERE ch.channel = cr.channel AND ch.kind = 'refund' \
               AND ch.external_refund_id = cr.external_refund_id \
             ORDER BY ch.modified_ms DESC, (ch.status IN ('SUCCESS', 'CLOSED', 'FAILED')) DESC \
             LIMIT 1) c ON true \
         WHERE r.status = 'REQUESTED' AND c.status IN ('SUCCESS', 'CLOSED', 'FAILED') \
         ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(order_id, refund_no, platform_status)| Violation::ChannelRefundUnfinished {
                order_id,
                refund_no,
                platform_status,
            },
        )
        .collect())
}

/// Channel refunds, open or paid out, whose amount differs from the platform's newest snapshot
/// applied (`channel_refunds.last_refund_cents`): money booked that the platform did not pay,
/// or the other way round.
///
/// # Errors
/// When the query fails.
pub async fn channel_refund_amounts(pool: &PgPool) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
        "SELECT r.order_id::text, r.refund_no, r.status, r.amount_cents, cr.last_refund_cents \
         FROM channel_refunds cr JOIN refunds r USING (refund_no) \
         WHERE r.status IN ('REQUESTED', 'SUCCEEDED') AND cr.last_refund_cents IS NOT NULL \
           AND cr.last_refund_cents <> r.amount_cents \
         ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(order_id, refund_no, status, amount_cents, platform_cents)| {
                Violation::RefundAmountMismatch {
                    order_id,
                    refund_no,
                    status,
                    amount_cents,
                    platform_cents,
                }
            },
        )
        .collect())
}

/// Every outbound: `(order_id, outbound_no)`.
///
/// # Errors
/// When the query fails.
pub async fn outbounds(pool: &PgPool) -> Result<Vec<(String, String)>, sqlx::Error> {
    sqlx::query_as("SELECT order_id::text, outbound_no FROM outbounds ORDER BY outbound_no")
        .fetch_all(pool)
        .await
}

/// Every reservation decision: `(order_id, status)`.
///
/// # Errors
/// When the query fails.
pub async fn reservations(pool: &PgPool) -> Result<Vec<(String, String)>, sqlx::Error> {
    sqlx::query_as("SELECT order_id::text, status FROM reservations")
        .fetch_all(pool)
        .await
}

/// One stock movement.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct MovementRow {
    /// `stock_movements.id`.
    pub id: i64,
    /// The order.
    pub order_id: String,
    /// The SKU.
    pub sku_id: String,
    /// `RESERVE`, `RELEASE`, `DEDUCT`, `RESTOCK`.
    pub kind: String,
    /// Units.
    pub quantity: i64,
}

/// Every stock movement, in id order.
///
/// # Errors
/// When the query fails.
pub async fn movements(pool: &PgPool) -> Result<Vec<MovementRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, order_id::text AS order_id, sku_id, kind, quantity FROM stock_movements ORDER BY id",
    )
    .fetch_all(pool)
    .await
}

/// SKUs whose `reserved` is not `RESERVE - RELEASE - DEDUCT` of their movements.
///
/// # Errors
/// When the query fails.
pub async fn stock_arithmetic(pool: &PgPool) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT s.sku_id, s.reserved, \
                COALESCE(sum(CASE m.kind WHEN 'RESERVE' THEN m.quantity \
                                         WHEN 'RELEASE' THEN -m.quantity \
                                         WHEN 'DEDUCT' THEN -m.quantity ELSE 0 END), 0)::bigint \
         FROM stock s LEFT JOIN stock_movements m USING (sku_id) \
         GROUP BY s.sku_id, s.reserved \
         HAVING s.reserved <> COALESCE(sum(CASE m.kind WHEN 'RESERVE' THEN m.quantity \
                                         WHEN 'RELEASE' THEN -m.quantity \
                                         WHEN 'DEDUCT' THEN -m.quantity ELSE 0 END), 0) \
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(sku_id, reserved, movements_sum)| Violation::StockArithmetic {
                sku_id,
                reserved,
                movements_sum,
            },
        )
        .collect())
}

/// The event ids in `consumer`'s inbox (lower-case text) and the duplicates it absorbed.
///
/// # Errors
/// When the query fails.
pub async fn inbox(pool: &PgPool, consumer: &str) -> Result<(HashSet<String>, i64), sqlx::Error> {
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT event_id::text, duplicates FROM inbox WHERE consumer_name = $1")
            .bind(consumer)
            .fetch_all(pool)
            .await?;
    let dups = rows.iter().map(|(_, d)| i64::from(*d)).sum();
    Ok((rows.into_iter().map(|(e, _)| e).collect(), dups))
}

/// One ledger row with where its event stands now.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LedgerRow {
    /// The outbox row id (relay order within the aggregate).
    pub outbox_id: i64,
    /// The event.
    pub event_id: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The row's explicit topic.
    pub topic: Option<String>,
    /// Still in the outbox.
    pub unpublished: bool,
    /// Discarded by an operator (`outbox_discarded`).
    pub discarded: bool,
}

/// The ledger with each event's state, in one statement (one snapshot); `None` when the
/// database has no ledger.
///
/// # Errors
/// When the query fails.
pub async fn ledger(pool: &PgPool) -> Result<Option<Vec<LedgerRow>>, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('outbox_ledger') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(None);
    }
    let rows = sqlx::query_as(
        "SELECT l.outbox_id, l.event_id::text AS event_id, l.aggregate_type, l.aggregate_id, l.topic, \
                (o.id IS NOT NULL) AS unpublished, (d.event_id IS NOT NULL) AS discarded \
         FROM outbox_ledger l \
         LEFT JOIN outbox o ON o.id = l.outbox_id \
         LEFT JOIN outbox_discarded d ON d.event_id = l.event_id \
         ORDER BY l.outbox_id",
    )
    .fetch_all(pool)
    .await?;
    Ok(Some(rows))
}

/// Unpublished rows, and those older than `max_age` as violations of `database`.
///
/// # Errors
/// When the query fails.
pub async fn unpublished(
    pool: &PgPool,
    database: &str,
    max_age: Duration,
) -> Result<(i64, Vec<Violation>), sqlx::Error> {
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await?;
    let stale: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, event_id::text, extract(epoch FROM now() - created_at)::bigint \
         FROM outbox WHERE created_at < now() - make_interval(secs => $1) ORDER BY id",
    )
    .bind(max_age.as_secs_f64())
    .fetch_all(pool)
    .await?;
    Ok((
        total,
        stale
            .into_iter()
            .map(|(outbox_id, event_id, age_s)| Violation::StaleUnpublished {
                database: database.to_owned(),
                outbox_id,
                event_id,
                age_s,
            })
            .collect(),
    ))
}
