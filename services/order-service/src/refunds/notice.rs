//! The provider's refund outcomes (`POST /refunds/callback`, and the marketplace's refund
//! snapshots): snapshots stamped with `modified`, applied only when newer than the one applied
//! before, each refund reaching `SUCCEEDED` or `CLOSED` once.

use serde::Deserialize;
use sqlx::{PgConnection, PgPool};

use super::reserve::reserve;
use crate::domain::{
    LifecycleEvent, OrderId, OrderStatus, RefundKind, RefundNo, RefundOutcome, RefundStatus,
    ValidationError,
};
use crate::error::Error;
use crate::events::{self, Cause, EventType};
use crate::orders::advance;
use crate::store::{orders, refunds};
use crate::views::{OrderView, RefundView};

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
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = epoch_ms_schema)]
    pub modified: i64,
}

/// Epoch milliseconds: 0 to 2^53 (the check and the schema).
pub const EPOCH_MS: outbox_http::validate::IntRange =
    outbox_http::validate::IntRange::new(0, outbox_http::validate::MAX_EXACT_INTEGER);

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
