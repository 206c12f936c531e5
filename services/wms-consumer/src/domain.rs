//! The outbound state machine and the validated texts of warehouse requests.
//!
//! ```text
//! CREATED ──ship──> SHIPPED ──hold──> RECALL ──return received──> RETURNED
//!   │  ^                ^               │
//!  hold│ release        └───release─────┘
//!   v  │
//! INTERCEPTED ──permanent hold──> CANCELLED
//! ```
//! A hold is an open refund or a cancellation ([`Holds`]); how an event changes one is a
//! [`HoldChange`], and where the outbound goes when the holds change is
//! [`OutboundStatus::settle`]. A return may bring some units back (a refund by
//! line): the outbound is then `SHIPPED` again with `returned_quantity` on its lines, and
//! `RETURNED` only once every shipped unit is back. A refund by line that succeeds before
//! shipping takes its units out of the outbound (`OutboundLinesCancelled`) and the rest ships.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A status text from the database that this version does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown outbound status `{0}`")]
pub struct UnknownStatus(String);

/// Where an outbound order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundStatus {
    /// Waiting to be picked and shipped.
    Created,
    /// Picking stopped: a refund or cancellation holds the order.
    Intercepted,
    /// Will never ship (the refund succeeded or the order was cancelled before shipping); the
    /// reserved stock goes back. Final.
    Cancelled,
    /// Handed to the carrier.
    Shipped,
    /// Shipped, then refunded: a return is expected.
    Recall,
    /// The return arrived back in the warehouse. Final.
    Returned,
}

/// What holds an order's fulfilment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Holds {
    /// At least one hold is active (an open or succeeded refund, a cancellation).
    pub active: bool,
    /// At least one hold can never be released (a succeeded refund, a cancellation).
    pub permanent: bool,
}

/// How an event changes a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldChange {
    /// A refund was requested.
    Open,
    /// A refund was closed without paying out.
    Release,
    /// A refund of everything paid succeeded before shipping, or the order was cancelled: it
    /// will never ship.
    MakePermanent,
    /// A return-and-refund succeeded without refunding the whole order: if the parcel left, it
    /// must come back (permanent, the outbound stays recalled); if not, nothing comes back and
    /// the rest of the order ships (released).
    PermanentIfShipped,
    /// A return-and-refund by line succeeded without refunding the whole order: if the parcel
    /// left, its units must come back (permanent, recalled); if not, its units are taken out of
    /// the outbound (now, or when the outbound is created) and the rest ships (released).
    CutIfUnshipped,
}

impl OutboundStatus {
    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "CREATED",
            Self::Intercepted => "INTERCEPTED",
            Self::Cancelled => "CANCELLED",
            Self::Shipped => "SHIPPED",
            Self::Recall => "RECALL",
            Self::Returned => "RETURNED",
        }
    }

    /// Where an outbound in this status goes given the order's holds. Shipping and receiving
    /// a return are warehouse actions, not hold changes, so they are not here.
    pub fn settle(self, holds: Holds) -> Self {
        match self {
            Self::Created | Self::Intercepted if holds.permanent => Self::Cancelled,
            Self::Created if holds.active => Self::Intercepted,
            Self::Intercepted if !holds.active => Self::Created,
            Self::Shipped if holds.active => Self::Recall,
            Self::Recall if !holds.active => Self::Shipped,
            other => other,
        }
    }

    /// Whether the outbound left the warehouse.
    pub fn is_shipped(self) -> bool {
        matches!(self, Self::Shipped | Self::Recall | Self::Returned)
    }
}

impl fmt::Display for OutboundStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OutboundStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "CREATED" => Self::Created,
            "INTERCEPTED" => Self::Intercepted,
            "CANCELLED" => Self::Cancelled,
            "SHIPPED" => Self::Shipped,
            "RECALL" => Self::Recall,
            "RETURNED" => Self::Returned,
            other => return Err(UnknownStatus(other.to_owned())),
        })
    }
}

impl TryFrom<String> for OutboundStatus {
    type Error = UnknownStatus;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

pub use outbox_http::validate::ValidationError;
use outbox_http::validate::{Chars, TextRule};

/// Most characters of a carrier name or tracking number.
pub const MAX_SHIPMENT_TEXT: usize = 64;

outbox_http::text_newtype!(
    /// A carrier's name, e.g. `DHL`: 1-64 characters, no control characters.
    Carrier,
    TextRule::new(MAX_SHIPMENT_TEXT, Chars::Text)
);

outbox_http::text_newtype!(
    /// A parcel's tracking number: 1-64 letters, digits and `-_.`.
    TrackingNo,
    TextRule::new(MAX_SHIPMENT_TEXT, Chars::TokenNoColon)
);

outbox_http::text_newtype!(
    /// An outbound's number as a path parameter (`OB0000000001`): 1-32 letters, digits and
    /// `-_.:`, checked before it reaches SQL.
    OutboundNo,
    TextRule::new(32, Chars::Token)
);

/// A validated `POST /outbounds/{outbound_no}/ship` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipment {
    /// The carrier.
    pub carrier: Carrier,
    /// The parcel's tracking number.
    pub tracking_no: TrackingNo,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [OutboundStatus; 6] = [
        OutboundStatus::Created,
        OutboundStatus::Intercepted,
        OutboundStatus::Cancelled,
        OutboundStatus::Shipped,
        OutboundStatus::Recall,
        OutboundStatus::Returned,
    ];

    const FREE: Holds = Holds {
        active: false,
        permanent: false,
    };
    const OPEN: Holds = Holds {
        active: true,
        permanent: false,
    };
    const FINAL: Holds = Holds {
        active: true,
        permanent: true,
    };

    #[test]
    fn holds_intercept_before_shipping_and_recall_after() {
        use OutboundStatus::*;
        let table = [
            (Created, FREE, Created),
            (Created, OPEN, Intercepted),
            (Created, FINAL, Cancelled),
            (Intercepted, OPEN, Intercepted),
            (Intercepted, FREE, Created),
            (Intercepted, FINAL, Cancelled),
            (Shipped, FREE, Shipped),
            (Shipped, OPEN, Recall),
            (Shipped, FINAL, Recall),
            (Recall, FREE, Shipped),
            (Recall, FINAL, Recall),
            (Returned, FREE, Returned),
            (Returned, OPEN, Returned),
            (Cancelled, FREE, Cancelled),
        ];
        for (from, holds, to) in table {
            assert_eq!(from.settle(holds), to, "{from} with {holds:?}");
        }
    }

    #[test]
    fn settling_twice_changes_nothing_more() {
        for s in ALL {
            for h in [FREE, OPEN, FINAL] {
                let once = s.settle(h);
                assert_eq!(once.settle(h), once, "{s} {h:?}");
                assert_eq!(
                    once.is_shipped(),
                    s.is_shipped(),
                    "holds never ship or unship"
                );
            }
        }
    }

    #[test]
    fn statuses_round_trip_and_texts_are_validated() {
        for s in ALL {
            assert_eq!(s.as_str().parse::<OutboundStatus>().unwrap(), s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        let t = |s: &str| TrackingNo::parse("tracking_no", s.to_owned());
        assert!(t("1Z-99.x_").is_ok());
        assert_eq!(t("a b").unwrap_err().field, "tracking_no");
        assert!(t("").is_err());
        assert!(t(&"x".repeat(65)).is_err());
        assert!(Carrier::parse("carrier", "DHL Express".into()).is_ok());
        assert!(Carrier::parse("carrier", "a\nb".into()).is_err());
        assert!(OutboundNo::parse("outbound_no", "OB0000000001".into()).is_ok());
        assert!(OutboundNo::parse("outbound_no", "\0abc".into()).is_err());
    }
}
