//! What the platform holds and answers: trades and their refunds (latest snapshots), the
//! steps a refund goes through, the ship API's answers and the call log.

use serde::{Deserialize, Serialize};

/// One line of a trade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// The seller's SKU.
    pub sku_id: String,
    /// Units.
    pub quantity: i64,
}

/// A refund on the platform (its latest snapshot).
#[derive(Debug, Clone, Serialize)]
pub struct Refund {
    /// The platform's refund id.
    pub refund_id: String,
    /// `WAIT_SELLER_AGREE`, ..., `SUCCESS`, `CLOSED`.
    pub status: String,
    /// Amount.
    pub refund_cents: i64,
    /// `REFUND_ONLY` or `RETURN_AND_REFUND`.
    pub kind: String,
    /// The lines a return-and-refund takes back; empty: the whole trade.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Item>,
    /// Last change.
    pub modified: i64,
}

/// A trade on the platform (its latest snapshot).
#[derive(Debug, Clone, Serialize)]
pub struct Trade {
    /// The platform's order id.
    pub tid: String,
    /// The buyer.
    pub buyer_id: String,
    /// What was bought.
    pub items: Vec<Item>,
    /// What the buyer pays.
    pub paid_cents: i64,
    /// Whether the buyer paid (snapshots carry `paid_cents` from then on, closed ones too).
    pub paid: bool,
    /// `WAIT_BUYER_PAY`, `WAIT_SELLER_SEND_GOODS`, `WAIT_BUYER_CONFIRM`, `TRADE_FINISHED`,
    /// `TRADE_CLOSED`.
    pub status: String,
    /// Last change.
    pub modified: i64,
    /// The tracking number the seller reported, once shipped.
    pub out_sid: Option<String>,
    /// Its refunds.
    pub refunds: Vec<Refund>,
}

/// One ship API call and what it answered.
#[derive(Debug, Clone, Serialize)]
pub struct ShipCall {
    /// The trade.
    pub tid: String,
    /// The tracking number sent.
    pub out_sid: String,
    /// `shipped`, `already_shipped`, `failed` (503), `refused` (422), `conflict`,
    /// `unknown_trade`.
    pub result: String,
}

/// What the platform did, for tests: `GET /calls`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Calls {
    /// Changes made (each one message).
    pub changes: u64,
    /// HTTP pushes sent (copies and new `msg_id`s included).
    pub pushes_sent: u64,
    /// Of those, answered 2xx.
    pub pushes_accepted: u64,
    /// Of those, answered otherwise (or unreachable).
    pub pushes_failed: u64,
    /// Sent again under a new `msg_id`.
    pub pushes_new_msg_id: u64,
    /// Changes never pushed (dropped).
    pub pushes_dropped: u64,
    /// Query API calls.
    pub queries: u64,
    /// Every ship API call.
    pub ship: Vec<ShipCall>,
}

/// Why a request to the platform failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlatformError {
    /// No such trade.
    UnknownTrade,
    /// The trade cannot do that now.
    Conflict(String),
}

/// The ship API's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShipOutcome {
    /// Recorded as shipped now.
    Shipped,
    /// It was shipped with this tracking number before (a retry): a distinct success.
    AlreadyShipped,
    /// A transient failure (503): try again.
    Failed,
    /// Refused for good (422).
    Refused,
    /// Shipped with another tracking number, or not shippable (409).
    Conflict(String),
    /// No such trade (404).
    UnknownTrade,
}

/// One snapshot of a refund going through its statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundStep {
    /// The platform's status.
    pub status: String,
    /// The amount in that snapshot.
    pub refund_cents: i64,
    /// The lines taken back in that snapshot (empty: the whole trade).
    pub items: Vec<Item>,
}

impl RefundStep {
    /// `statuses`, each at `refund_cents`.
    pub fn each(statuses: &[&str], refund_cents: i64) -> Vec<Self> {
        statuses
            .iter()
            .map(|s| Self {
                status: (*s).to_owned(),
                refund_cents,
                items: vec![],
            })
            .collect()
    }
}
