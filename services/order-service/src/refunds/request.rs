//! Refund requests: `POST /orders/{id}/refunds` as received and validated, the request itself
//! (a refund number is the refund's identity, so repeating it returns the same refund), and a
//! requested refund brought to the platform's newest terms ([`amend_in`]).

use serde::Deserialize;
use sqlx::{PgConnection, PgPool};

use super::reserve::reserve;
use crate::domain::{
    Cents, OrderId, OrderStatus, RefundKind, RefundNo, RefundReason, ValidationError,
};
use crate::error::Error;
use crate::events::{self, Cause, EventType};
use crate::lines::{CreateOrderItemBody, OrderLine};
use crate::store::{orders, refunds};
use crate::views::{OrderView, RefundView};

/// `POST /orders/{id}/refunds` body as received.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundBody {
    /// The merchant's refund number.
    #[schema(schema_with = RefundNo::schema_object)]
    pub refund_no: String,
    /// Amount to give back.
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = Cents::schema_object)]
    pub amount_cents: i64,
    /// Why.
    #[schema(schema_with = RefundReason::schema_object)]
    pub reason: String,
    /// `REFUND_ONLY` or `RETURN_AND_REFUND` (the default: what refunds did before kinds).
    #[serde(default)]
    #[schema(value_type = Option<RefundKind>)]
    pub kind: Option<String>,
    /// The lines a `RETURN_AND_REFUND` takes back (sku, quantity); absent or empty: the whole
    /// order. Before shipping those units are taken out of the outbound and the rest ships;
    /// after shipping only those units are expected back.
    #[serde(default)]
    #[schema(max_items = 100)]
    pub lines: Option<Vec<CreateOrderItemBody>>,
}

/// A validated refund request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    /// The merchant's refund number.
    pub refund_no: RefundNo,
    /// Amount to give back.
    pub amount: Cents,
    /// Why.
    pub reason: RefundReason,
    /// Money only, or money against the goods.
    pub kind: RefundKind,
    /// The lines taken back, by SKU (empty: the whole order).
    pub lines: Vec<OrderLine>,
}

impl TryFrom<RefundBody> for RefundRequest {
    type Error = ValidationError;

    fn try_from(body: RefundBody) -> Result<Self, Self::Error> {
        let kind = match body.kind {
            None => RefundKind::default(),
            Some(k) => RefundKind::try_from(k).map_err(|_| {
                ValidationError::new("kind", "must be REFUND_ONLY or RETURN_AND_REFUND")
            })?,
        };
        Ok(Self {
            refund_no: RefundNo::parse("refund_no", body.refund_no)?,
            amount: Cents::parse("amount_cents", body.amount_cents)?,
            reason: RefundReason::parse("reason", body.reason)?,
            lines: parse_lines(kind, body.lines.unwrap_or_default())?,
            kind,
        })
    }
}

/// Validates a refund's lines: only a `RETURN_AND_REFUND` names goods (a refund-only moves
/// no goods), at most [`crate::lines::MAX_ITEMS`] lines, each SKU once, quantities in range.
///
/// # Errors
/// [`ValidationError`] naming the first bad field (`lines[1].quantity`).
pub fn parse_lines(
    kind: RefundKind,
    lines: Vec<CreateOrderItemBody>,
) -> Result<Vec<OrderLine>, ValidationError> {
    if lines.is_empty() {
        return Ok(vec![]);
    }
    if kind == RefundKind::RefundOnly {
        return Err(ValidationError::new(
            "lines",
            "a REFUND_ONLY refund moves no goods; lines need kind RETURN_AND_REFUND",
        ));
    }
    let mut parsed = OrderLine::parse_all("lines", lines)?;
    parsed.sort_by(|a, b| a.sku_id.cmp(&b.sku_id));
    Ok(parsed)
}

/// The answer to a refund request.
#[derive(Debug, Clone)]
pub struct RefundCreated {
    /// The refund.
    pub refund: RefundView,
    /// `true` when the refund number existed already (same refund returned, nothing changed).
    pub replayed: bool,
}

/// Requests a refund and emits `RefundRequested`, or returns the existing refund with the
/// same number and content.
///
/// # Errors
/// [`Error::OrderNotFound`], [`Error::RefundNoReused`] when the number exists with other
/// content, [`Error::IllegalTransition`] when the order is not paid,
/// [`Error::RefundExceedsPaid`], database errors.
pub async fn request(
    pool: &PgPool,
    order_id: OrderId,
    req: &RefundRequest,
) -> Result<RefundCreated, Error> {
    let mut tx = pool.begin().await?;
    let created = request_in(&mut tx, order_id, req).await?;
    if created.replayed {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(created)
}

/// [`request`] in the caller's transaction (the marketplace channel's refunds go so). A
/// replayed answer changed nothing.
///
/// # Errors
/// As [`request`]; on an error the caller must roll back.
pub async fn request_in(
    conn: &mut PgConnection,
    order_id: OrderId,
    req: &RefundRequest,
) -> Result<RefundCreated, Error> {
    let order = orders::lock(conn, order_id)
        .await?
        .ok_or(Error::OrderNotFound)?;
    if let Some(existing) = refunds::find(conn, &req.refund_no).await? {
        return replay(conn, existing, order_id, req).await;
    }
    if !takes_refunds(&order) {
        return Err(Error::IllegalTransition {
            current: order.status,
            action: "refund",
        });
    }
    check_lines(conn, order_id, &req.refund_no, &req.lines).await?;
    reserve(conn, &order, req.amount.get()).await?;
    let inserted = refunds::insert(
        conn,
        &req.refund_no,
        order_id,
        req.amount,
        &req.reason,
        req.kind,
    )
    .await?;
    let Some(row) = inserted else {
        // The same number was just committed for another order (this order's writers are
        // serialized by the lock, and the insert waited for that one). Undo the reservation
        // and answer from that refund, which this statement can now see.
        reserve(conn, &order, -req.amount.get()).await?;
        let existing = refunds::find(conn, &req.refund_no)
            .await?
            .ok_or(Error::Invariant("conflicting refund row vanished"))?;
        return replay(conn, existing, order_id, req).await;
    };
    refunds::set_lines(conn, &req.refund_no, order_id, &req.lines).await?;
    let refund = RefundView::load(conn, row).await?;
    let order = orders::find(conn, order_id)
        .await?
        .ok_or(Error::Invariant("locked order vanished"))?;
    let view = OrderView::load(conn, order).await?;
    events::append(
        conn,
        EventType::RefundRequested,
        &view,
        Cause::Refund(&refund),
    )
    .await?;
    tracing::info!(
        order.id = %order_id,
        refund.no = %req.refund_no,
        refund.kind = req.kind.as_str(),
        amount_cents = req.amount.get(),
        "Refund requested"
    );
    Ok(RefundCreated {
        refund,
        replayed: false,
    })
}

/// Checks that `lines` fit what the order has left to take back: each SKU a line of the
/// order, and no more units than ordered minus what its other refunds not closed take back
/// (`except` is the refund being requested or amended). The caller holds the order's lock.
///
/// # Errors
/// [`Error::RefundExceedsLine`] naming the first line that does not fit, database errors.
async fn check_lines(
    conn: &mut PgConnection,
    order_id: OrderId,
    except: &RefundNo,
    lines: &[OrderLine],
) -> Result<(), Error> {
    if lines.is_empty() {
        return Ok(());
    }
    let ordered = orders::items(conn, order_id).await?;
    let taken = refunds::units_taken_back(conn, order_id, except).await?;
    for line in lines {
        let sku = line.sku_id.as_str();
        let ordered = ordered
            .iter()
            .find(|i| i.sku_id == sku)
            .map_or(0, |i| i.quantity);
        let taken = taken
            .iter()
            .find(|t| t.sku_id == sku)
            .map_or(0, |t| t.quantity);
        let refundable_quantity = (ordered - taken).max(0);
        if line.quantity.get() > refundable_quantity {
            return Err(Error::RefundExceedsLine {
                sku_id: sku.to_owned(),
                refundable_quantity,
            });
        }
    }
    Ok(())
}

/// Whether `lines` are the refund's stored lines.
fn same_lines(stored: &[refunds::RefundLineRow], lines: &[OrderLine]) -> bool {
    stored.len() == lines.len()
        && stored
            .iter()
            .zip(lines)
            .all(|(s, l)| s.sku_id == l.sku_id.as_str() && s.quantity == l.quantity.get())
}

/// Whether the order can take a refund: it is paid, or it was cancelled after payment (what it
/// took is owed to the buyer through its flagged payment).
fn takes_refunds(order: &orders::OrderRow) -> bool {
    order.status.is_paid() || (order.status == OrderStatus::Cancelled && order.paid_cents > 0)
}

/// Brings a requested refund to the platform's newest terms: a snapshot newer than the one
/// applied carries the refund's amount and kind (the platform's rule: the newest snapshot
/// overwrites status, amount and reason), so a buyer who lowers or raises the amount before it
/// is paid out gets what the platform pays. The reservation moves by the difference (never
/// above what was paid) and `RefundRequested` is emitted again with the new terms, so the WMS
/// holds or releases per the new kind. A refund already final, or with the same terms, is left
/// as it is. Returns whether it changed.
///
/// # Errors
/// [`Error::RefundNotFound`], [`Error::RefundExceedsPaid`] when the new amount does not fit
/// (`refundable_cents`: the most this refund may be), [`Error::RefundExceedsLine`] when the new
/// lines do not, database errors; on an error the caller must roll back.
pub async fn amend_in(
    conn: &mut PgConnection,
    refund_no: &RefundNo,
    amount: Cents,
    kind: RefundKind,
    lines: &[OrderLine],
) -> Result<bool, Error> {
    let order_id = refunds::find(conn, refund_no)
        .await?
        .map(|r| OrderId::from(r.order_id))
        .ok_or(Error::RefundNotFound)?;
    let order = orders::lock(conn, order_id)
        .await?
        .ok_or(Error::Invariant("refund without order"))?;
    let refund = refunds::find(conn, refund_no)
        .await?
        .ok_or(Error::Invariant("refund vanished"))?;
    let stored_lines = refunds::lines(conn, refund_no.as_str()).await?;
    if refund.status.is_terminal()
        || (refund.amount_cents == amount.get()
            && refund.kind == kind
            && same_lines(&stored_lines, lines))
    {
        return Ok(false);
    }
    check_lines(conn, order_id, refund_no, lines).await?;
    // What the refund may be raised to: its own amount and what is left besides.
    reserve(conn, &order, amount.get() - refund.amount_cents)
        .await
        .map_err(|e| match e {
            Error::RefundExceedsPaid { refundable_cents } => Error::RefundExceedsPaid {
                refundable_cents: refundable_cents + refund.amount_cents,
            },
            other => other,
        })?;
    let row = refunds::set_terms(conn, refund_no, amount, kind)
        .await?
        .ok_or(Error::Invariant("locked refund left REQUESTED"))?;
    refunds::set_lines(conn, refund_no, order_id, lines).await?;
    let view = RefundView::load(conn, row).await?;
    let order = orders::find(conn, order_id)
        .await?
        .ok_or(Error::Invariant("locked order vanished"))?;
    let order_view = OrderView::load(conn, order).await?;
    events::append(
        conn,
        EventType::RefundRequested,
        &order_view,
        Cause::Refund(&view),
    )
    .await?;
    tracing::info!(
        order.id = %order_id,
        refund.no = %refund_no,
        refund.kind = kind.as_str(),
        amount_cents = amount.get(),
        previous_amount_cents = refund.amount_cents,
        previous_kind = refund.kind.as_str(),
        "Refund terms changed"
    );
    Ok(true)
}

async fn replay(
    conn: &mut PgConnection,
    existing: refunds::RefundRow,
    order_id: OrderId,
    req: &RefundRequest,
) -> Result<RefundCreated, Error> {
    let lines = refunds::lines(conn, &existing.refund_no).await?;
    let same = existing.order_id == order_id.uuid()
        && existing.amount_cents == req.amount.get()
        && existing.reason == req.reason.as_str()
        && existing.kind == req.kind
        && same_lines(&lines, &req.lines);
    if !same {
        return Err(Error::RefundNoReused);
    }
    Ok(RefundCreated {
        refund: RefundView::new(existing, lines),
        replayed: true,
    })
}
