//! The platform's messages on the wire and validated. Unknown types and statuses are refused
//! at the edge, with the field named, before anything is written.

use serde::Deserialize;

use crate::domain::{Cents, RefundKind, ValidationError};
use crate::orders::{CreateOrderItemBody, NewOrder};

/// A pushed message as received.
#[derive(Debug, Clone, Deserialize)]
pub struct PushBody {
    /// The platform's transport id; a re-delivery repeats it.
    pub msg_id: String,
    /// `TradeSync` or `RefundSync`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// When the platform last changed the trade or refund (epoch milliseconds).
    pub modified: i64,
    /// The trade snapshot of a `TradeSync`.
    #[serde(default)]
    pub trade: Option<TradeBody>,
    /// The refund snapshot of a `RefundSync`.
    #[serde(default)]
    pub refund: Option<RefundSyncBody>,
}

/// A trade snapshot as received.
#[derive(Debug, Clone, Deserialize)]
pub struct TradeBody {
    /// The platform's order id.
    pub tid: String,
    /// `WAIT_BUYER_PAY`, `WAIT_SELLER_SEND_GOODS`, `WAIT_BUYER_CONFIRM`, `TRADE_FINISHED`,
    /// `TRADE_CLOSED`.
    pub status: String,
    /// The buyer.
    pub buyer_id: String,
    /// What was bought.
    pub items: Vec<CreateOrderItemBody>,
    /// What the buyer paid: required once paid, present on a closed trade that was paid.
    #[serde(default)]
    pub paid_cents: Option<i64>,
}

/// A refund snapshot as received.
#[derive(Debug, Clone, Deserialize)]
pub struct RefundSyncBody {
    /// The platform's order id.
    pub tid: String,
    /// The platform's refund id.
    pub refund_id: String,
    /// `WAIT_SELLER_AGREE`, `WAIT_BUYER_RETURN_GOODS`, `WAIT_SELLER_CONFIRM_GOODS`, `SUCCESS`,
    /// `CLOSED`.
    pub status: String,
    /// Amount to give back.
    pub refund_cents: i64,
    /// `REFUND_ONLY` or `RETURN_AND_REFUND` (default).
    #[serde(default)]
    pub kind: Option<String>,
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
}

impl RefundSyncStatus {
    /// As on the wire and in `channel_changes.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open(s) => s,
            Self::Success => "SUCCESS",
            Self::Closed => "CLOSED",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "WAIT_SELLER_AGREE" => Self::Open("WAIT_SELLER_AGREE"),
            "WAIT_BUYER_RETURN_GOODS" => Self::Open("WAIT_BUYER_RETURN_GOODS"),
            "WAIT_SELLER_CONFIRM_GOODS" => Self::Open("WAIT_SELLER_CONFIRM_GOODS"),
            "SUCCESS" => Self::Success,
            "CLOSED" => Self::Closed,
            _ => return None,
        })
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

/// Most characters of a platform id.
const MAX_ID: usize = 128;

fn platform_id(field: &str, value: String) -> Result<String, ValidationError> {
    let len = value.chars().count();
    if len == 0 || len > MAX_ID || value.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            format!("must be 1-{MAX_ID} printable characters"),
        ));
    }
    Ok(value)
}

impl TryFrom<PushBody> for ChannelMessage {
    type Error = MessageError;

    fn try_from(body: PushBody) -> Result<Self, Self::Error> {
        let msg_id = platform_id("msg_id", body.msg_id)?;
        if body.modified < 0 {
            return Err(
                ValidationError::new("modified", "must be epoch milliseconds (>= 0)").into(),
            );
        }
        let change = match body.msg_type.as_str() {
            "TradeSync" => {
                let t = body
                    .trade
                    .ok_or_else(|| ValidationError::new("trade", "is required for TradeSync"))?;
                let status = TradeStatus::parse(&t.status)
                    .ok_or_else(|| ValidationError::new("trade.status", "unknown trade status"))?;
                let order = crate::domain::UserId::parse("buyer_id", t.buyer_id)
                    .and_then(|user_id| {
                        NewOrder::parse(user_id, crate::orders::CreateOrderBody { items: t.items })
                    })
                    .map_err(|e| ValidationError::new(format!("trade.{}", e.field), e.reason))?;
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
                Change::Refund(RefundChange {
                    tid: platform_id("refund.tid", r.tid)?,
                    refund_id: platform_id("refund.refund_id", r.refund_id)?,
                    status,
                    amount: Cents::parse("refund.refund_cents", r.refund_cents)?,
                    kind,
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
