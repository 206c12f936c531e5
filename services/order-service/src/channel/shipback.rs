//! Ship-back: when a channel order ships, its tracking number goes back to the platform once
//! per `(order_id, out_sid)`.
//!
//! [`request`] runs in the transaction that moves the order to `SHIPPED` and emits
//! `ShipBackRequested` (aggregate `shipback`) only for channel orders, and not for an order
//! whose refunds gave everything back before the warehouse's shipment reached us (it ships on
//! the warehouse's word, the WMS recalls the parcel, the platform has closed the trade). The
//! order service's own consumer
//! ([`crate::FulfilmentHandler`]) then calls [`call`] before its transaction: the intent is
//! recorded in `channel_shipbacks` (unique on `(order_id, out_sid)`), the platform's ship API
//! is called with a few quick retries and no transaction open (`already_shipped` counted as
//! success), and the answer is recorded; [`recorded`] checks it in the transaction of the
//! inbox row. A platform that is down is a transient error (the runtime retries with backoff,
//! the offset stays); a refusal is permanent: dead-lettered and counted in
//! `order_shipback_failures_total`, the row left without a result and with the refusal in
//! `last_error`.

use std::time::Duration;

use outbox_consumer::{Effect, HandlerError};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::client::{ClientError, PlatformClient};
use super::store;
use crate::domain::OrderId;
use crate::events::ShipmentView;

/// Aggregate type (topic `<prefix>shipback`) of ship-back requests.
pub use event_contracts::order::SHIPBACK_AGGREGATE_TYPE as AGGREGATE_TYPE;
/// Their event type.
pub use event_contracts::order::SHIPBACK_EVENT_TYPE as EVENT_TYPE;

/// Quick attempts inside one delivery, before the runtime's own backoff takes over.
const ATTEMPTS: u32 = 3;

/// `ShipBackRequested`'s payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShipBackRequested {
    /// Our order.
    pub order_id: Uuid,
    /// The channel.
    pub channel: String,
    /// The platform's order id.
    pub tid: String,
    /// The tracking number.
    pub out_sid: String,
    /// The carrier.
    pub company: String,
}

/// Emits `ShipBackRequested` if `order_id` is a channel order, in the caller's transaction
/// (which holds the order's lock and ships it).
///
/// # Errors
/// Database and outbox errors.
pub async fn request(
    conn: &mut PgConnection,
    order_id: OrderId,
    shipment: &ShipmentView,
) -> Result<bool, crate::Error> {
    let Some((channel, tid)) = store::external_order_of(conn, order_id.uuid()).await? else {
        return Ok(false);
    };
    let payload = serde_json::to_value(ShipBackRequested {
        order_id: order_id.uuid(),
        channel,
        tid,
        out_sid: shipment.tracking_no.clone(),
        company: shipment.carrier.clone(),
    })
    .map_err(crate::Error::Serialize)?;
    let aggregate_id = order_id.to_string();
    let event = outbox_writer::NewEvent::new(AGGREGATE_TYPE, &aggregate_id, EVENT_TYPE, &payload);
    outbox_writer::enqueue(&mut *conn, &event).await?;
    Ok(true)
}

/// Reports a shipment to the platform, once, outside any transaction (the consumer's
/// [`Handler::prepare`](outbox_consumer::Handler::prepare)): records the intent (a
/// `channel_shipbacks` row without a result), returns at once if an answer is recorded
/// already (a redelivery, a retry after a crash), calls the platform with a few quick retries
/// and no connection held, then records the answer. A crash between the call and the record
/// calls again on the next attempt; the platform answers `already_shipped`, so the shipment
/// is still reported once.
///
/// # Errors
/// [`HandlerError::Transient`] while the platform is unavailable (retried),
/// [`HandlerError::Unapplicable`] when it refuses (dead-lettered), database errors.
pub async fn call(
    pool: &PgPool,
    client: Option<&PlatformClient>,
    req: &ShipBackRequested,
) -> Result<(), HandlerError> {
    let answered: Option<String> = sqlx::query_scalar::<_, Option<String>>(
        "WITH intent AS ( \
             INSERT INTO channel_shipbacks (order_id, out_sid, channel, external_order_id, attempts) \
             VALUES ($1, $2, $3, $4, 0) ON CONFLICT (order_id, out_sid) DO NOTHING RETURNING result) \
         SELECT result FROM intent \
         UNION ALL SELECT result FROM channel_shipbacks WHERE order_id = $1 AND out_sid = $2",
    )
    .bind(req.order_id)
    .bind(&req.out_sid)
    .bind(&req.channel)
    .bind(&req.tid)
    .fetch_all(pool)
    .await?
    .into_iter()
    .flatten()
    .next();
    if answered.is_some() {
        return Ok(());
    }
    let client = client.ok_or_else(|| {
        HandlerError::Unapplicable("MARKETPLACE_URL is not configured; cannot ship back".to_owned())
    })?;
    let mut delay = Duration::from_millis(50);
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        match client.ship(&req.tid, &req.out_sid, &req.company).await {
            Ok(answer) => break Ok(answer),
            Err(ClientError::Unavailable(e)) if attempt < ATTEMPTS => {
                tracing::info!(order.id = %req.order_id, attempt, error = %e, "Ship-back failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            Err(ClientError::Unavailable(e)) => break Err(HandlerError::Transient(e)),
            Err(e) => {
                break Err(HandlerError::Unapplicable(format!(
                    "platform refused the ship-back of {} ({}): {e}",
                    req.tid, req.out_sid
                )))
            }
        }
    };
    let i_attempts = i32::try_from(attempt).unwrap_or(i32::MAX);
    let (result, error) = match &outcome {
        Ok(answer) => (Some(answer.as_str()), None),
        Err(e) => (None, Some(e.describe())),
    };
    sqlx::query(
        "UPDATE channel_shipbacks \
         SET result = coalesce(result, $3), reported_at = coalesce(reported_at, CASE WHEN $3 IS NULL THEN NULL ELSE now() END), \
             attempts = attempts + $4, last_error = $5 \
         WHERE order_id = $1 AND out_sid = $2",
    )
    .bind(req.order_id)
    .bind(&req.out_sid)
    .bind(result)
    .bind(i_attempts)
    .bind(error)
    .execute(pool)
    .await?;
    let answer = outcome?;
    tracing::info!(
        order.id = %req.order_id,
        channel.tid = %req.tid,
        out_sid = %req.out_sid,
        result = answer.as_str(),
        attempts = attempt,
        "Shipment reported to the platform"
    );
    Ok(())
}

/// In the consumer's transaction, after [`call`]: the shipment's answer is recorded, or the
/// event cannot be consumed yet.
///
/// # Errors
/// [`HandlerError::Inconsistent`] without a recorded answer (retried, then dead-lettered),
/// database errors.
pub async fn recorded(
    conn: &mut PgConnection,
    req: &ShipBackRequested,
) -> Result<Effect, HandlerError> {
    let result: Option<Option<String>> = sqlx::query_scalar(
        "SELECT result FROM channel_shipbacks WHERE order_id = $1 AND out_sid = $2",
    )
    .bind(req.order_id)
    .bind(&req.out_sid)
    .fetch_optional(&mut *conn)
    .await?;
    match result.flatten() {
        Some(_) => Ok(Effect::Changed),
        None => Err(HandlerError::Inconsistent(format!(
            "no recorded answer for the ship-back of {} ({})",
            req.tid, req.out_sid
        ))),
    }
}
