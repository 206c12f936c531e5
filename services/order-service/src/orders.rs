//! Orders: idempotent creation, cancellation before payment, and reading.
//!
//! Creation is idempotent per `(user_id, Idempotency-Key)`. The key row is claimed first in
//! the request's transaction (`store::idempotency`), so concurrent duplicates queue behind the
//! first one on the unique index and then replay its stored response; a request that fails
//! rolls back its key with everything else, so the key is never poisoned.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};

use crate::domain::{
    lifecycle, Cents, IdempotencyKey, LifecycleEvent, OrderId, UserId, ValidationError,
};
use crate::error::Error;
use crate::events::{self, Cause, EventType};
use crate::lines::{CreateOrderItemBody, OrderLine, MAX_ITEMS};
use crate::store::{idempotency, orders, payments, refunds, skus};
use crate::views::{OrderDetail, OrderView, PaymentView, RefundView};

/// HTTP status of a created order; stored with the key and replayed.
const CREATED: u16 = 201;

/// `POST /orders` body as received. The buyer is not in it: it is the caller (the bearer
/// token's subject).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"items": [{"sku_id": "S1", "quantity": 2}]}))]
pub struct CreateOrderBody {
    /// What to buy: 1 to [`MAX_ITEMS`] lines, each SKU at most once.
    #[schema(schema_with = items_schema)]
    pub items: Vec<CreateOrderItemBody>,
}

/// `items`: 1 to [`MAX_ITEMS`] lines (the check and the schema share the constant).
fn items_schema() -> utoipa::openapi::schema::Array {
    use utoipa::PartialSchema;
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(CreateOrderItemBody::schema())
        .min_items(Some(1))
        .max_items(Some(MAX_ITEMS))
        .build()
}

/// A validated order request. Prices are not part of it: they come from the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewOrder {
    /// The buyer; scopes the idempotency key.
    pub user_id: UserId,
    /// Lines, each SKU at most once.
    pub items: Vec<OrderLine>,
}

impl NewOrder {
    /// Validates the order `body` of `user_id`.
    ///
    /// # Errors
    /// [`ValidationError`] naming the first bad field.
    pub fn parse(user_id: UserId, body: CreateOrderBody) -> Result<Self, ValidationError> {
        if body.items.is_empty() {
            return Err(ValidationError::new("items", "must not be empty"));
        }
        let items = OrderLine::parse_all("items", body.items)?;
        Ok(Self { user_id, items })
    }
}

impl NewOrder {
    /// SHA-256 of the canonical request (user and lines in the given order, versioned): equal
    /// for the same request whatever the JSON formatting, different for any other request.
    pub fn request_hash(&self) -> Vec<u8> {
        let mut hasher = Sha256::new();
        hasher.update(b"POST /orders v1\n");
        // Serializing plain structs of strings and integers cannot fail.
        hasher.update(serde_json::to_vec(self).unwrap_or_default());
        hasher.finalize().to_vec()
    }
}

/// The response to `POST /orders`, new or replayed.
#[derive(Debug, Clone)]
pub struct Created {
    /// HTTP status of the original response.
    pub status: u16,
    /// Body of the original response.
    pub body: serde_json::Value,
    /// `true` when this is a replay of an earlier request with the same key.
    pub replayed: bool,
}

/// Creates an order, or replays the response of the earlier request with the same user and
/// key. Waits for a concurrent request with the same key to finish instead of failing.
///
/// # Errors
/// [`Error::IdempotencyKeyReused`] when the key was used with another request,
/// [`Error::UnknownSku`] / [`Error::Validation`] for a bad order (nothing is stored and the key
/// stays free), [`Error::KeyBusy`] when the key could not be settled (retry), database errors.
pub async fn create(
    pool: &PgPool,
    key: &IdempotencyKey,
    order: &NewOrder,
) -> Result<Created, Error> {
    let hash = order.request_hash();
    // A second round is only needed if a key row vanished between our failed claim and our
    // read (a retention job deleting it); the claim itself waits for in-flight owners.
    for _ in 0..2 {
        let mut tx = pool.begin().await?;
        if idempotency::claim(&mut tx, &order.user_id, key, &hash).await? {
            let (order_id, body) = insert_order(&mut tx, order).await?;
            idempotency::complete(&mut tx, &order.user_id, key, order_id, CREATED, &body).await?;
            tx.commit().await?;
            tracing::info!(order.id = %order_id, user.id = %order.user_id, "Created order");
            return Ok(Created {
                status: CREATED,
                body,
                replayed: false,
            });
        }
        let stored = idempotency::find(&mut tx, &order.user_id, key).await?;
        tx.rollback().await?;
        let Some(stored) = stored else { continue };
        if stored.request_hash != hash {
            return Err(Error::IdempotencyKeyReused);
        }
        let (Some(status), Some(body)) = (stored.response_status, stored.response_body) else {
            return Err(Error::Invariant(
                "committed idempotency key without a response",
            ));
        };
        tracing::info!(user.id = %order.user_id, "Replayed order creation for a repeated Idempotency-Key");
        return Ok(Created {
            status: u16::try_from(status).unwrap_or(CREATED),
            body,
            replayed: true,
        });
    }
    Err(Error::KeyBusy)
}

/// Prices the lines from the catalog and inserts the order, its lines and `OrderCreated`.
///
/// # Errors
/// [`Error::UnknownSku`], [`Error::Validation`] for a total too large, database errors.
pub(crate) async fn insert_order(
    conn: &mut PgConnection,
    order: &NewOrder,
) -> Result<(OrderId, serde_json::Value), Error> {
    let ids: Vec<&str> = order.items.iter().map(|l| l.sku_id.as_str()).collect();
    let catalog: HashMap<String, skus::SkuRow> = skus::find_many(conn, &ids)
        .await?
        .into_iter()
        .map(|s| (s.sku_id.clone(), s))
        .collect();
    let mut lines = Vec::with_capacity(order.items.len());
    let mut total: Option<Cents> = None;
    for (i, line) in order.items.iter().enumerate() {
        let sku = catalog
            .get(line.sku_id.as_str())
            .ok_or_else(|| Error::UnknownSku(line.sku_id.to_string()))?;
        let price = Cents::parse("price_cents", sku.price_cents)?;
        let too_large = || ValidationError::new(format!("items[{i}]"), "order total is too large");
        let line_total = price.times(line.quantity).ok_or_else(too_large)?;
        total = Some(match total {
            None => line_total,
            Some(t) => t.plus(line_total).ok_or_else(too_large)?,
        });
        lines.push(orders::NewItem {
            sku_id: line.sku_id.as_str(),
            name: &sku.name,
            quantity: line.quantity.get(),
            unit_price_cents: price.get(),
            line_total_cents: line_total.get(),
        });
    }
    let total = total.ok_or_else(|| ValidationError::new("items", "must not be empty"))?;
    // The new row is invisible to everyone else until commit: no lock needed for its event.
    let row = orders::insert(conn, &order.user_id, total.get()).await?;
    let order_id = OrderId::from(row.order_id);
    let items = orders::insert_items(conn, order_id, &lines).await?;
    let view = OrderView::new(row, items);
    events::append(conn, EventType::OrderCreated, &view, Cause::None).await?;
    let body = serde_json::to_value(&view).map_err(Error::Serialize)?;
    Ok((order_id, body))
}

/// Result of a lifecycle request (cancel, deliver, complete).
#[derive(Debug, Clone)]
pub struct Moved {
    /// The order after the request.
    pub order: OrderView,
    /// `false` when the order was there already (nothing changed, no event).
    pub changed: bool,
}

/// Applies `event` to an order (`POST /orders/{id}/cancel`, `/deliver`, `/complete`) and
/// emits the move's event; asking again once the order is where the event leads returns it
/// unchanged.
///
/// # Errors
/// [`Error::OrderNotFound`], [`Error::IllegalTransition`] when the lifecycle has no such move
/// from the current state, database errors.
pub async fn apply_event(
    pool: &PgPool,
    order_id: OrderId,
    event: LifecycleEvent,
) -> Result<Moved, Error> {
    let mut tx = pool.begin().await?;
    let row = orders::lock(&mut tx, order_id)
        .await?
        .ok_or(Error::OrderNotFound)?;
    if lifecycle::TRANSITIONS
        .iter()
        .any(|t| t.on == event && t.to == row.status)
    {
        let order = OrderView::load(&mut tx, row).await?;
        tx.rollback().await?;
        return Ok(Moved {
            order,
            changed: false,
        });
    }
    let order = advance(&mut tx, &row, event, Cause::None).await?;
    tx.commit().await?;
    Ok(Moved {
        order,
        changed: true,
    })
}

/// Moves a locked order by `event` ([`lifecycle::next`]) and appends that move's one event,
/// in the caller's transaction.
///
/// # Errors
/// [`Error::IllegalTransition`] (with the current state) when the move is not in the table,
/// database and outbox errors.
pub(crate) async fn advance(
    conn: &mut PgConnection,
    row: &orders::OrderRow,
    event: LifecycleEvent,
    cause: Cause<'_>,
) -> Result<OrderView, Error> {
    let order_id = OrderId::from(row.order_id);
    let t = lifecycle::next(row.status, event).ok_or(Error::IllegalTransition {
        current: row.status,
        action: event.action(),
    })?;
    let moved = orders::transition(conn, order_id, &t)
        .await?
        .ok_or(Error::Invariant("locked order changed status"))?;
    let view = OrderView::load(conn, moved).await?;
    events::append(conn, t.emits, &view, cause).await?;
    tracing::info!(
        order.id = %order_id,
        order.from = %t.from,
        order.status = %t.to,
        event.name = t.emits.as_str(),
        "Order moved"
    );
    Ok(view)
}

/// Why an order's fulfilment must wait without the order moving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// The marketplace closed the paid trade; its refund is not known yet.
    TradeClosed,
}

impl HoldReason {
    /// As in `OrderHeld`'s `hold.reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TradeClosed => "trade_closed",
        }
    }
}

/// Emits `OrderHeld` for a locked order: the WMS holds (intercepts) its fulfilment until the
/// order is final. The order's status does not change.
///
/// # Errors
/// Database and outbox errors.
pub(crate) async fn hold(
    conn: &mut PgConnection,
    row: orders::OrderRow,
    reason: HoldReason,
) -> Result<OrderView, Error> {
    let order_id = OrderId::from(row.order_id);
    let view = OrderView::load(conn, row).await?;
    events::append(
        conn,
        EventType::OrderHeld,
        &view,
        Cause::Hold(reason.as_str()),
    )
    .await?;
    tracing::warn!(
        order.id = %order_id,
        hold.reason = reason.as_str(),
        "Order fulfilment held"
    );
    Ok(view)
}

/// Whether `user_id` owns the order: `Ok` if so, [`Error::OrderNotFound`] if the order is
/// missing or someone else's (the same answer, so ids don't leak). An order's owner never
/// changes, so the check holds for the request's later transaction too.
///
/// # Errors
/// [`Error::OrderNotFound`], database errors.
pub async fn check_owner(pool: &PgPool, order_id: OrderId, user_id: &str) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    match orders::owner(&mut conn, order_id).await? {
        Some(owner) if owner == user_id => Ok(()),
        _ => Err(Error::OrderNotFound),
    }
}

/// Reads an order with its lines, payments and refunds.
///
/// # Errors
/// [`Error::OrderNotFound`], database errors.
pub async fn get(pool: &PgPool, order_id: OrderId) -> Result<OrderDetail, Error> {
    // One snapshot for all four reads.
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let row = orders::find(&mut tx, order_id)
        .await?
        .ok_or(Error::OrderNotFound)?;
    let items = orders::items(&mut tx, order_id).await?;
    let payments = payments::for_order(&mut tx, order_id).await?;
    let mut refunds = Vec::new();
    for row in refunds::for_order(&mut tx, order_id).await? {
        refunds.push(RefundView::load(&mut tx, row).await?);
    }
    tx.commit().await?;
    let refunded_cents = refunds
        .iter()
        .filter(|r| r.status == crate::domain::RefundStatus::Succeeded)
        .map(|r| r.amount_cents)
        .sum();
    Ok(OrderDetail {
        order: OrderView::new(row, items),
        refunded_cents,
        payments: payments.into_iter().map(PaymentView::from).collect(),
        refunds,
    })
}

/// An order id from its text form (path or body).
///
/// # Errors
/// [`Error::OrderNotFound`] when it is not a UUID: no order has such an id.
pub fn parse_order_id(text: &str) -> Result<OrderId, Error> {
    OrderId::parse(text).ok_or(Error::OrderNotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `json`'s `user_id` stands for the token's `sub`; the rest is the body (which refuses a
    /// `user_id` of its own).
    fn order(mut json: serde_json::Value) -> Result<NewOrder, ValidationError> {
        let user = json["user_id"].as_str().unwrap().to_owned();
        json.as_object_mut().unwrap().remove("user_id");
        let user = UserId::parse("sub", user)?;
        NewOrder::parse(user, serde_json::from_value(json).unwrap())
    }

    #[test]
    fn request_hash_ignores_formatting_but_not_content() {
        let a = order(serde_json::json!({
            "user_id": "u1", "items": [{"sku_id": "A", "quantity": 2}]
        }))
        .unwrap();
        let b: CreateOrderBody =
            serde_json::from_str(r#"{ "items" : [ {"quantity":2, "sku_id":"A"} ] }"#).unwrap();
        let b = NewOrder::parse(UserId::parse("sub", "u1".to_owned()).unwrap(), b).unwrap();
        assert_eq!(a.request_hash(), b.request_hash());
        let c = order(serde_json::json!({
            "user_id": "u1", "items": [{"sku_id": "A", "quantity": 3}]
        }))
        .unwrap();
        let d = order(serde_json::json!({
            "user_id": "u2", "items": [{"sku_id": "A", "quantity": 2}]
        }))
        .unwrap();
        assert_ne!(
            a.request_hash(),
            d.request_hash(),
            "the user is part of the request"
        );
        assert_ne!(a.request_hash(), c.request_hash());
    }

    #[test]
    fn orders_are_validated_at_the_edge() {
        let bad = [
            (serde_json::json!({"user_id": "u", "items": []}), "items"),
            (
                serde_json::json!({"user_id": "u", "items": [{"sku_id": "A", "quantity": 0}]}),
                "items[0].quantity",
            ),
            (
                serde_json::json!({"user_id": "", "items": [{"sku_id": "A", "quantity": 1}]}),
                "sub",
            ),
            (
                serde_json::json!({"user_id": "u", "items": [
                    {"sku_id": "A", "quantity": 1}, {"sku_id": "A", "quantity": 2}]}),
                "items[1].sku_id",
            ),
        ];
        for (json, field) in bad {
            let err = order(json).unwrap_err();
            assert_eq!(err.field, field);
        }
    }
}
