//! Refunds: requests against paid orders (`POST /orders/{id}/refunds`) and the provider's
//! outcome notifications (`POST /refunds/callback`).
//!
//! A refund number is the refund's identity: repeating it returns the same refund. The amount
//! is reserved on the order row under a conditional update (`refund_reserved_cents + amount <=
//! paid_cents`, also a CHECK), and released when the provider closes the refund.
//!
//! An order cancelled after payment (for lack of stock, or a marketplace trade first seen
//! closed) has everything reserved, and its flagged payment owes the rest to the buyer
//! (`refund_due_cents`). It still takes refunds (the platform refunds such trades itself): a
//! refund draws its amount from that flag, and gives it back to the flag if it closes without
//! paying out, so money owed is owed to exactly one place ([`reserve`]).
//!
//! A requested refund's amount and kind follow the platform's newest snapshot ([`amend_in`]):
//! the reservation moves by the difference and `RefundRequested` is emitted again with the new
//! terms.
//!
//! Provider notifications are snapshots stamped with `modified` (epoch ms): a snapshot only
//! applies if it is newer than the one applied before, and a refund reaches `SUCCEEDED` or
//! `CLOSED` once. Money that went back cannot come back, so a final state is never left: a
//! newer snapshot that contradicts it is logged and counted for operators, not applied.

use serde::Deserialize;
use sqlx::{PgConnection, PgPool};

use crate::domain::{
    Cents, LifecycleEvent, OrderId, OrderStatus, RefundKind, RefundNo, RefundOutcome, RefundReason,
    RefundStatus, ValidationError,
};
use crate::error::Error;
use crate::events::{self, Cause, EventType};
use crate::lines::{CreateOrderItemBody, OrderLine};
use crate::orders::advance;
use crate::store::{orders, payments, refunds};
use crate::views::{OrderView, RefundView};

/// `POST /orders/{id}/refunds` body as received.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundBody {
    /// The merchant's refund number.
    #[schema(schema_with = RefundNo::schema_object)]
    pub refund_no: String,
    /// Amount to give back.
    #[serde(deserialize_with = "outbox_kit::validate::integer")]
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

/// Reserves `cents` more for the order's refunds (a negative `cents` gives them back). A live
/// order reserves on `refund_reserved_cents`, under the CHECK `orders_refunds_within_paid`. An
/// order cancelled after payment had everything reserved when it was cancelled, the rest owed
/// through its flagged payment: its refunds draw on that flag, and give back to it.
///
/// # Errors
/// [`Error::RefundExceedsPaid`] when not enough is left, database errors.
async fn reserve(
    conn: &mut PgConnection,
    order: &orders::OrderRow,
    cents: i64,
) -> Result<(), Error> {
    let order_id = OrderId::from(order.order_id);
    let done = if order.status == OrderStatus::Cancelled {
        payments::move_due(conn, order_id, -cents).await?
    } else if cents >= 0 {
        orders::reserve_refund(conn, order_id, cents).await?
    } else {
        orders::release_refund(conn, order_id, -cents).await?
    };
    if done {
        return Ok(());
    }
    if cents < 0 {
        return Err(Error::Invariant("a refund gave back more than it reserved"));
    }
    let refundable_cents = if order.status == OrderStatus::Cancelled {
        payments::order_debt(conn, order_id).await?.unwrap_or(0)
    } else {
        order.paid_cents - order.refund_reserved_cents
    };
    Err(Error::RefundExceedsPaid { refundable_cents })
}

/// Brings a requested refund to the platform's newest terms: a snapshot newer than the one
/// applied carries the refund's amount and kind (seed 000: the newest snapshot overwrites
/// status, amount and reason), so a buyer who lowers or raises the amount before it is paid
/// out gets what the platform pays. The reservation moves by the difference (never above what
/// was paid) and `RefundRequested` is emitted again with the new terms, so the WMS holds or
/// releases per the new kind. A refund already final, or with the same terms, is left as it
/// is. Returns whether it changed.
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

/// `POST /refunds/callback` body as received (after its signature was checked).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct RefundCallbackBody {
    /// The merchant's refund number.
    #[schema(schema_with = RefundNo::schema_object)]
    pub refund_no: String,
    /// `SUCCESS` or `CLOSED`.
    #[schema(pattern = "^(SUCCESS|CLOSED)$")]
    pub status: String,
    /// When the provider last changed the refund (epoch milliseconds).
    #[serde(deserialize_with = "outbox_kit::validate::integer")]
    #[schema(schema_with = epoch_ms_schema)]
    pub modified: i64,
}

/// Epoch milliseconds: 0 to 2^53 (the check and the schema).
pub const EPOCH_MS: outbox_kit::validate::IntRange =
    outbox_kit::validate::IntRange::new(0, outbox_kit::validate::MAX_EXACT_INTEGER);

/// [`EPOCH_MS`] as an inline JSON Schema.
pub fn epoch_ms_schema() -> utoipa::openapi::schema::Object {
    EPOCH_MS.schema()
}

/// A validated refund notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundNotice {
    /// The merchant's refund number.
    pub refund_no: RefundNo,
    /// What the provider reports.
    pub outcome: RefundOutcome,
    /// Snapshot time (epoch milliseconds); larger wins.
    pub modified_ms: i64,
}

impl TryFrom<RefundCallbackBody> for RefundNotice {
    type Error = ValidationError;

    fn try_from(body: RefundCallbackBody) -> Result<Self, Self::Error> {
        let outcome = match body.status.as_str() {
            "SUCCESS" => RefundOutcome::Success,
            "CLOSED" => RefundOutcome::Closed,
            _ => return Err(ValidationError::new("status", "must be SUCCESS or CLOSED")),
        };
        EPOCH_MS.check("modified", body.modified)?;
        Ok(Self {
            refund_no: RefundNo::parse("refund_no", body.refund_no)?,
            outcome,
            modified_ms: body.modified,
        })
    }
}

/// What a refund notification did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundNoticeOutcome {
    /// The refund reached this final state; its event was emitted.
    Applied(RefundStatus),
    /// The refund is already in the reported state.
    Duplicate,
    /// The snapshot is older than (or as old as) the one applied: nothing changed.
    Stale,
    /// A newer snapshot contradicts the final state reached: nothing changed, operators look.
    Conflicting,
}

impl RefundNoticeOutcome {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied(_) => "applied",
            Self::Duplicate => "duplicate",
            Self::Stale => "stale",
            Self::Conflicting => "conflicting",
        }
    }
}

/// Applies a refund notification.
///
/// # Errors
/// [`Error::RefundNotFound`], database errors.
pub async fn apply_notice(
    pool: &PgPool,
    notice: &RefundNotice,
) -> Result<RefundNoticeOutcome, Error> {
    let mut tx = pool.begin().await?;
    let outcome = apply_notice_in(&mut tx, notice).await?;
    if matches!(outcome, RefundNoticeOutcome::Applied(_)) {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(outcome)
}

/// [`apply_notice`] in the caller's transaction. Only [`RefundNoticeOutcome::Applied`] changed
/// something.
///
/// A refund that succeeds never moves the order by itself. When it completes a full refund of
/// a paid, unshipped order, its `RefundSucceeded` says `refunded_in_full` and the warehouse
/// decides: the outbound cancelled moves the order to `REFUNDED`, a parcel that had left ships
/// it ([`crate::fulfilment`]). Otherwise the order stays where it is: a partial refund does not stop fulfilment, a refund after shipping waits
/// for the return (if any), and a cancelled order stays cancelled (its stock-rejection flag
/// covers only what no refund had reserved, so this money goes back once; a refund closed on
/// it gives its amount back to that flag, so it is still owed to the buyer).
///
/// # Errors
/// As [`apply_notice`]; on an error the caller must roll back.
pub async fn apply_notice_in(
    conn: &mut PgConnection,
    notice: &RefundNotice,
) -> Result<RefundNoticeOutcome, Error> {
    let order_id = refunds::find(conn, &notice.refund_no)
        .await?
        .map(|r| OrderId::from(r.order_id))
        .ok_or(Error::RefundNotFound)?;
    let locked = orders::lock(conn, order_id)
        .await?
        .ok_or(Error::Invariant("refund without order"))?;
    // Read again under the order lock: another notification may have applied meanwhile.
    let refund = refunds::find(conn, &notice.refund_no)
        .await?
        .ok_or(Error::Invariant("refund vanished"))?;
    let target = notice.outcome.status();
    if refund.status.is_terminal() {
        let applied_ms = refund.provider_modified_ms.unwrap_or(i64::MIN);
        let outcome = if refund.status == target {
            RefundNoticeOutcome::Duplicate
        } else if notice.modified_ms <= applied_ms {
            RefundNoticeOutcome::Stale
        } else {
            RefundNoticeOutcome::Conflicting
        };
        if outcome == RefundNoticeOutcome::Conflicting {
            tracing::warn!(
                order.id = %order_id,
                refund.no = %notice.refund_no,
                refund.status = %refund.status,
                reported = target.as_str(),
                modified_ms = notice.modified_ms,
                applied_modified_ms = applied_ms,
                "Newer refund notification contradicts the final state; not applied, needs a look"
            );
        } else {
            tracing::info!(
                order.id = %order_id,
                refund.no = %notice.refund_no,
                outcome = outcome.as_str(),
                "Ignored refund notification"
            );
        }
        return Ok(outcome);
    }
    let Some(row) =
        refunds::apply_snapshot(conn, &notice.refund_no, target, notice.modified_ms).await?
    else {
        return Ok(RefundNoticeOutcome::Stale);
    };
    if target == RefundStatus::Closed {
        // On an order cancelled after payment the amount is owed to the buyer again.
        reserve(conn, &locked, -row.amount_cents).await?;
    }
    let refund = RefundView::load(conn, row).await?;
    let order = orders::find(conn, order_id)
        .await?
        .ok_or(Error::Invariant("locked order vanished"))?;
    let refunded_in_full = target == RefundStatus::Succeeded
        && order.status == OrderStatus::Paid
        && orders::refunded_cents(conn, order_id).await? >= order.paid_cents;
    // The order does not move here even when refunded in full: the warehouse decides whether
    // the goods left (crate::fulfilment::outbound_cancelled moves it to REFUNDED).
    let view = OrderView::load(conn, order).await?;
    let (event, cause) = match target {
        RefundStatus::Succeeded if refunded_in_full => {
            (EventType::RefundSucceeded, Cause::RefundInFull(&refund))
        }
        RefundStatus::Succeeded => (EventType::RefundSucceeded, Cause::Refund(&refund)),
        _ => (EventType::RefundClosed, Cause::Refund(&refund)),
    };
    events::append(conn, event, &view, cause).await?;
    let returned = target == RefundStatus::Succeeded
        && refund.kind == RefundKind::ReturnAndRefund
        && locked.return_received_at.is_some()
        && locked.status.is_shipped()
        && locked.status != OrderStatus::Returned
        && !orders::has_open_return(conn, order_id).await?;
    if returned {
        // The goods came back before this refund was decided: now the order is returned.
        let order = orders::find(conn, order_id)
            .await?
            .ok_or(Error::Invariant("locked order vanished"))?;
        advance(
            conn,
            &order,
            LifecycleEvent::ReturnReceived,
            Cause::Refund(&refund),
        )
        .await?;
    }
    tracing::info!(
        order.id = %order_id,
        refund.no = %notice.refund_no,
        refund.status = %target,
        refunded_in_full,
        returned,
        "Refund finished"
    );
    Ok(RefundNoticeOutcome::Applied(target))
}
