//! The platform's messages on the wire and validated. Unknown types and statuses are refused
//! at the edge, with the field named, before anything is written.

use serde::Deserialize;

use crate::domain::{Cents, RefundKind, ValidationError};
use outbox_http::validate::{Chars, TextRule};

use crate::lines::CreateOrderItemBody;
use crate::orders::NewOrder;
use crate::refunds::{epoch_ms_schema, EPOCH_MS};

/// A pushed message as received. The platform may add fields: unknown ones are ignored.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct PushBody {
    /// The platform's transport id; a re-delivery repeats it.
    #[schema(schema_with = platform_id_schema)]
    pub msg_id: String,
    /// `TradeSync` or `RefundSync`.
    #[serde(rename = "type")]
    #[schema(pattern = "^(TradeSync|RefundSync)$")]
    pub msg_type: String,
    /// When the platform last changed the trade or refund (epoch milliseconds).
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = epoch_ms_schema)]
    pub modified: i64,
    /// The trade snapshot of a `TradeSync`.
    #[serde(default)]
    pub trade: Option<TradeBody>,
    /// The refund snapshot of a `RefundSync`.
    #[serde(default)]
    pub refund: Option<RefundSyncBody>,
}

/// A trade snapshot as received.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct TradeBody {
    /// The platform's order id.
    #[schema(schema_with = platform_id_schema)]
    pub tid: String,
    /// `WAIT_BUYER_PAY`, `WAIT_SELLER_SEND_GOODS`, `WAIT_BUYER_CONFIRM`, `TRADE_FINISHED`,
    /// `TRADE_CLOSED`.
    pub status: String,
    /// The buyer.
    pub buyer_id: String,
    /// What was bought.
    pub items: Vec<TradeItemBody>,
    /// What the buyer paid: required once paid, present on a closed trade that was paid.
    #[serde(default, deserialize_with = "outbox_http::validate::optional_integer")]
    pub paid_cents: Option<i64>,
}

/// One line of a trade as received (unknown fields ignored, unlike `POST /orders`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct TradeItemBody {
    /// Catalog SKU.
    pub sku_id: String,
    /// Units.
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    pub quantity: i64,
}

impl From<TradeItemBody> for CreateOrderItemBody {
    fn from(i: TradeItemBody) -> Self {
        Self {
            sku_id: i.sku_id,
            quantity: i.quantity,
        }
    }
}

/// A refund snapshot as received.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct RefundSyncBody {
    /// The platform's order id.
    pub tid: String,
    /// The platform's refund id.
    pub refund_id: String,
    /// `WAIT_SELLER_AGREE`, `WAIT_BUYER_RETURN_GOODS`, `WAIT_SELLER_CONFIRM_GOODS`, `SUCCESS`,
    /// `CLOSED`, `FAILED`.
    pub status: String,
    /// Amount to give back (the newest snapshot's amount is the refund's amount).
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    pub refund_cents: i64,
    /// `REFUND_ONLY` or `RETURN_AND_REFUND` (default).
    #[serde(default)]
    pub kind: Option<String>,
    /// The lines a `RETURN_AND_REFUND` takes back (the newest snapshot's lines are the
    /// refund's); absent or empty: the whole trade.
    #[serde(default)]
    pub items: Option<Vec<TradeItemBody>>,
}

/// Where the platform says a trade is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TradeStatus {
    /// Created, not paid.
    WaitBuyerPay,
    /// Paid, waiting for us to ship.
    WaitSellerSendGoods,
    /// We shipped (our ship-back reached the platform).
    WaitBuyerConfirm,
    /// The buyer confirmed receipt.
    TradeFinished,
    /// Closed (unpaid, or fully refunded).
    TradeClosed,
}

impl TradeStatus {
    /// As on the wire and in `channel_changes.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WaitBuyerPay => "WAIT_BUYER_PAY",
            Self::WaitSellerSendGoods => "WAIT_SELLER_SEND_GOODS",
            Self::WaitBuyerConfirm => "WAIT_BUYER_CONFIRM",
            Self::TradeFinished => "TRADE_FINISHED",
            Self::TradeClosed => "TRADE_CLOSED",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "WAIT_BUYER_PAY" => Self::WaitBuyerPay,
            "WAIT_SELLER_SEND_GOODS" => Self::WaitSellerSendGoods,
            "WAIT_BUYER_CONFIRM" => Self::WaitBuyerConfirm,
            "TRADE_FINISHED" => Self::TradeFinished,
            "TRADE_CLOSED" => Self::TradeClosed,
            _ => return None,
        })
    }

    /// Whether the buyer has paid by this status.
    pub fn is_paid(self) -> bool {
        matches!(
            self,
            Self::WaitSellerSendGoods | Self::WaitBuyerConfirm | Self::TradeFinished
        )
    }
}

/// Where the platform says a refund is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundSyncStatus {
    /// Asked for (any of the platform's open states).
    Open(&'static str),
    /// Paid out.
    Success,
    /// Closed without paying out.
    Closed,
    /// Failed on the platform (e.g. its checks refused it): final, nothing paid out, like
    /// `CLOSED` for us (the platform lists it among the terminal states).
    Failed,
}

impl RefundSyncStatus {
    /// As on the wire and in `channel_changes.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open(s) => s,
            Self::Success => "SUCCESS",
            Self::Closed => "CLOSED",
            Self::Failed => "FAILED",
        }
    }

    /// The status of a wire (or stored) text; `None` for one this version does not know.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "WAIT_SELLER_AGREE" => Self::Open("WAIT_SELLER_AGREE"),
            "WAIT_BUYER_RETURN_GOODS" => Self::Open("WAIT_BUYER_RETURN_GOODS"),
            "WAIT_SELLER_CONFIRM_GOODS" => Self::Open("WAIT_SELLER_CONFIRM_GOODS"),
            "SUCCESS" => Self::Success,
            "CLOSED" => Self::Closed,
            "FAILED" => Self::Failed,
            _ => return None,
        })
    }

    /// How far along the refund is: the platform's open states in their order, then the final
    /// ones. Two snapshots with the same `modified` are ordered by it (platforms that stamp in
    /// seconds send a request and its success within one `modified`).
    pub fn progress(self) -> u8 {
        match self {
            Self::Open("WAIT_SELLER_AGREE") => 1,
            Self::Open("WAIT_BUYER_RETURN_GOODS") => 2,
            Self::Open(_) => 3,
            Self::Success | Self::Closed | Self::Failed => 4,
        }
    }

    /// Whether a snapshot in this status at `modified_ms` supersedes the newest one applied,
    /// `(last_status, last_modified_ms)`: a newer `modified`, or the same `modified` with a
    /// status that moves forward (the platform's rule, `modified` `>=` the last one's, holds
    /// for forward moves only; a repeat or a move back at the same `modified` is stale).
    pub fn supersedes(self, modified_ms: i64, last_status: &str, last_modified_ms: i64) -> bool {
        modified_ms > last_modified_ms
            || (modified_ms == last_modified_ms
                && Self::parse(last_status).is_none_or(|last| self.progress() > last.progress()))
    }
}

/// A validated trade change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TradeChange {
    /// The platform's order id.
    pub tid: String,
    /// Its status.
    pub status: TradeStatus,
    /// The order to create if we have none for `tid` yet.
    pub order: NewOrder,
    /// What the buyer paid, for paid statuses.
    pub paid: Option<Cents>,
}

/// A validated refund snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundChange {
    /// The platform's order id.
    pub tid: String,
    /// The platform's refund id.
    pub refund_id: String,
    /// Its status.
    pub status: RefundSyncStatus,
    /// Amount to give back.
    pub amount: Cents,
    /// Money only, or money against the goods.
    pub kind: RefundKind,
    /// The lines taken back (empty: the whole trade).
    pub lines: Vec<crate::lines::OrderLine>,
}

/// What a message says changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `TradeSync`.
    Trade(TradeChange),
    /// `RefundSync`.
    Refund(RefundChange),
}

/// A validated message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelMessage {
    /// The transport id.
    pub msg_id: String,
    /// Snapshot time (epoch milliseconds).
    pub modified_ms: i64,
    /// The change.
    pub change: Change,
}

impl ChannelMessage {
    /// `TradeSync` or `RefundSync`.
    pub fn msg_type(&self) -> &'static str {
        match self.change {
            Change::Trade(_) => "TradeSync",
            Change::Refund(_) => "RefundSync",
        }
    }

    /// The platform's order id.
    pub fn tid(&self) -> &str {
        match &self.change {
            Change::Trade(t) => &t.tid,
            Change::Refund(r) => &r.tid,
        }
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// `type` is neither `TradeSync` nor `RefundSync`.
    #[error("unknown message type `{0}`; expected TradeSync or RefundSync")]
    UnknownType(String),
    /// A field is missing or invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

/// A refused message answers as the service's own errors do (an unknown type, a bad field).
impl From<MessageError> for crate::Error {
    fn from(e: MessageError) -> Self {
        match e {
            MessageError::UnknownType(t) => Self::UnknownMessageType(t),
            MessageError::Invalid(v) => Self::Validation(v),
        }
    }
}

/// A platform id: 1-128 characters, no control characters.
const PLATFORM_ID: TextRule = TextRule::new(128, Chars::Text);

fn platform_id(field: &str, value: String) -> Result<String, ValidationError> {
    PLATFORM_ID.check(field, &value)?;
    Ok(value)
}

fn platform_id_schema() -> utoipa::openapi::schema::Object {
    PLATFORM_ID.schema()
}

/// The user id of a platform buyer: `marketplace:<buyer_id>`, in the channel's own namespace
/// ([`super::NAMESPACE`]), so it never equals a local customer's.
fn buyer_user_id(buyer_id: String) -> Result<crate::domain::UserId, ValidationError> {
    let max = crate::domain::UserId::RULE.max_chars - super::NAMESPACE.len();
    if buyer_id.chars().count() > max {
        return Err(ValidationError::new(
            "buyer_id",
            format!("must be at most {max} characters"),
        ));
    }
    crate::domain::UserId::parse("buyer_id", format!("{}{buyer_id}", super::NAMESPACE))
}

impl TryFrom<PushBody> for ChannelMessage {
    type Error = MessageError;

    fn try_from(body: PushBody) -> Result<Self, Self::Error> {
        let msg_id = platform_id("msg_id", body.msg_id)?;
        EPOCH_MS.check("modified", body.modified)?;
        let change = match body.msg_type.as_str() {
            "TradeSync" => {
                let t = body
                    .trade
                    .ok_or_else(|| ValidationError::new("trade", "is required for TradeSync"))?;
                let status = TradeStatus::parse(&t.status)
                    .ok_or_else(|| ValidationError::new("trade.status", "unknown trade status"))?;
                let order = buyer_user_id(t.buyer_id)
                    .and_then(|user_id| {
                        NewOrder::parse(
                            user_id,
                            crate::orders::CreateOrderBody {
                                items: t.items.into_iter().map(Into::into).collect(),
                            },
                        )
                    })
                    .map_err(|e| ValidationError::new(format!("trade.{}", e.field), e.message))?;
                // A closed trade carries `paid_cents` when it was paid before it closed.
                let paid = match (status, t.paid_cents) {
                    (_, Some(c)) if status.is_paid() || status == TradeStatus::TradeClosed => {
                        Some(Cents::parse("trade.paid_cents", c)?)
                    }
                    (_, None) if status.is_paid() => {
                        return Err(ValidationError::new(
                            "trade.paid_cents",
                            "is required once the trade is paid",
                        )
                        .into())
                    }
                    _ => None,
                };
                Change::Trade(TradeChange {
                    tid: platform_id("trade.tid", t.tid)?,
                    status,
                    order,
                    paid,
                })
            }
            "RefundSync" => {
                let r = body
                    .refund
                    .ok_or_else(|| ValidationError::new("refund", "is required for RefundSync"))?;
                let status = RefundSyncStatus::parse(&r.status).ok_or_else(|| {
                    ValidationError::new("refund.status", "unknown refund status")
                })?;
                let kind = match r.kind {
                    None => RefundKind::default(),
                    Some(k) => RefundKind::try_from(k).map_err(|_| {
                        ValidationError::new(
                            "refund.kind",
                            "must be REFUND_ONLY or RETURN_AND_REFUND",
                        )
                    })?,
                };
                let items = r.items.unwrap_or_default();
                let lines =
                    crate::refunds::parse_lines(kind, items.into_iter().map(Into::into).collect())
                        .map_err(|e| {
                            let field = e.field.replacen("lines", "refund.items", 1);
                            ValidationError::new(field, e.message)
                        })?;
                Change::Refund(RefundChange {
                    tid: platform_id("refund.tid", r.tid)?,
                    refund_id: platform_id("refund.refund_id", r.refund_id)?,
                    status,
                    amount: Cents::parse("refund.refund_cents", r.refund_cents)?,
                    kind,
                    lines,
                })
            }
            other => return Err(MessageError::UnknownType(other.to_owned())),
        };
        Ok(Self {
            msg_id,
            modified_ms: body.modified,
            change,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<ChannelMessage, MessageError> {
        ChannelMessage::try_from(serde_json::from_value::<PushBody>(json).unwrap())
    }

    #[test]
    fn a_snapshot_supersedes_an_older_one_or_a_less_advanced_one_of_the_same_modified() {
        let s = |text: &str| RefundSyncStatus::parse(text).unwrap();
        let table = [
            // (status, modified, last status, last modified, supersedes)
            ("WAIT_SELLER_AGREE", 2, "SUCCESS", 1, true),
            ("SUCCESS", 1, "WAIT_SELLER_AGREE", 2, false),
            ("SUCCESS", 5, "WAIT_SELLER_AGREE", 5, true),
            ("FAILED", 5, "WAIT_BUYER_RETURN_GOODS", 5, true),
            (
                "WAIT_SELLER_CONFIRM_GOODS",
                5,
                "WAIT_BUYER_RETURN_GOODS",
                5,
                true,
            ),
            ("WAIT_SELLER_AGREE", 5, "SUCCESS", 5, false),
            ("WAIT_SELLER_AGREE", 5, "WAIT_SELLER_AGREE", 5, false),
            ("CLOSED", 5, "SUCCESS", 5, false),
        ];
        for (status, m, last, last_m, expected) in table {
            assert_eq!(
                s(status).supersedes(m, last, last_m),
                expected,
                "{status}@{m} over {last}@{last_m}"
            );
        }
    }

    #[test]
    fn messages_are_validated_at_the_edge() {
        let trade = serde_json::json!({"tid": "T1", "status": "WAIT_SELLER_SEND_GOODS",
            "buyer_id": "b", "items": [{"sku_id": "A", "quantity": 1}], "paid_cents": 100});
        let ok = parse(
            serde_json::json!({"msg_id": "m", "type": "TradeSync", "modified": 1, "trade": trade}),
        );
        assert_eq!(ok.unwrap().tid(), "T1");
        assert_eq!(
            parse(serde_json::json!({"msg_id": "m", "type": "ItemSync", "modified": 1})),
            Err(MessageError::UnknownType("ItemSync".into()))
        );
        let mut unpaid = trade.clone();
        unpaid["paid_cents"] = serde_json::Value::Null;
        let cases = [
            (
                serde_json::json!({"msg_id": "", "type": "TradeSync", "modified": 1, "trade": trade}),
                "msg_id",
            ),
            (
                serde_json::json!({"msg_id": "m", "type": "TradeSync", "modified": -1, "trade": trade}),
                "modified",
            ),
            (
                serde_json::json!({"msg_id": "m", "type": "TradeSync", "modified": 1}),
                "trade",
            ),
            (
                serde_json::json!({"msg_id": "m", "type": "TradeSync", "modified": 1, "trade": unpaid}),
                "trade.paid_cents",
            ),
            (
                serde_json::json!({"msg_id": "m", "type": "RefundSync", "modified": 1, "refund":
                {"tid": "T1", "refund_id": "R", "status": "MAYBE", "refund_cents": 1}}),
                "refund.status",
            ),
            (
                serde_json::json!({"msg_id": "m", "type": "RefundSync", "modified": 1, "refund":
                {"tid": "T1", "refund_id": "R", "status": "SUCCESS", "refund_cents": 0}}),
                "refund.refund_cents",
            ),
        ];
        for (json, field) in cases {
            match parse(json) {
                Err(MessageError::Invalid(e)) => assert_eq!(e.field, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
